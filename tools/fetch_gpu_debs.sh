#!/usr/bin/env bash
# Download (on a Debian machine with registry access) the .debs the GPU machine needs to build lily;
# libmicrohttpd included so `lily serve` builds there, libedit for `lily chat` line editing; carry .deb/ to the GPU machine and `source tools/gpu_env.sh` there.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deb && cd .deb
apt-get download libjansson-dev libjansson4 libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 \
  libpcre2-posix3 libutf8proc-dev libutf8proc2 libcmocka-dev libcmocka0 libmicrohttpd-dev libmicrohttpd12 libedit-dev libedit2 libbsd0 libmd0 pkgconf pkgconf-bin libpkgconf3 pkg-config
