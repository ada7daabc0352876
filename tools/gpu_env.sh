#!/usr/bin/env bash
# Source this on the GPU machine (which reaches no package registry) before building lily there:
# it unpacks the Debian packages carried in .deb/ (see tools/fetch_gpu_debs.sh) into /tmp/debroot,
# never into /, and points pkg-config, the compiler and the loader at them.
root=/tmp/debroot
mkdir -p "$root"
for f in .deb/*.deb; do dpkg -x "$f" "$root"; done
# libmicrohttpd.pc names gnutls as Requires.private, whose .pc is not carried; the machine's libgnutls.so.30
# serves at run time, so drop the line or pkg-config finds no libmicrohttpd (and lily builds without `serve`).
sed -i '/^Requires.private/d' "$root/usr/lib/x86_64-linux-gnu/pkgconfig/libmicrohttpd.pc" 2>/dev/null || true
export PATH="$root/usr/bin:$PATH"
export PKG_CONFIG_SYSROOT_DIR="$root"
export PKG_CONFIG_LIBDIR="$root/usr/lib/x86_64-linux-gnu/pkgconfig:$root/usr/share/pkgconfig"
export LD_LIBRARY_PATH="$root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export LIBRARY_PATH="$root/usr/lib/x86_64-linux-gnu:${LIBRARY_PATH:-}"
