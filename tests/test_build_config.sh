#!/usr/bin/env bash
# test_build_config.sh — how the build picks the CUDA backend and the test suite picks its Python:
#   - CMake's default (-DLILY_CUDA=AUTO) builds the CUDA backend only where a GPU is present (nvidia-smi -L
#     lists one, or /dev/nvidia0 exists) and says which in one line; -DLILY_CUDA=OFF says OFF;
#   - `make CUDA=1` / `CUDA=0` pass -DLILY_CUDA=ON / OFF to CMake;
#   - lily_python (tests/lib/common.sh) gives a Python with numpy even when the first python3 on PATH is
#     one without numpy (a pyenv shim, here a fake python3 that fails every import);
#   - make's Debian dependency check counts a package installed for two architectures as installed.
# usage: bash test_build_config.sh <path-to-lily> <tests/data dir>
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"
lily_test_init "$@"
ROOT=$(cd "$DATA/../.." && pwd)

gpu=no
if { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "GPU "; } || [ -e /dev/nvidia0 ]; then
    gpu=yes
fi
cmake -S "$ROOT" -B "$TMP/auto" -DCMAKE_BUILD_TYPE=Release > "$TMP/auto.log" 2>&1 || cat "$TMP/auto.log"
line=$(grep -c '^-- lily: CUDA backend' "$TMP/auto.log" || true)
expect "AUTO prints exactly one line about the CUDA backend" [ "$line" = 1 ]
if [ "$gpu" = yes ]; then
    if command -v nvcc >/dev/null 2>&1; then
        expect "AUTO with a GPU and nvcc builds the CUDA backend" grep -q '^-- lily: CUDA backend ON' "$TMP/auto.log"
    fi
else
    expect "AUTO without a GPU builds CPU-only and says why" \
        grep -q '^-- lily: CUDA backend OFF (no GPU found; make CUDA=1 or -DLILY_CUDA=ON builds it anyway): CPU-only build' "$TMP/auto.log"
fi
cmake -S "$ROOT" -B "$TMP/off" -DLILY_CUDA=OFF > "$TMP/off.log" 2>&1 || cat "$TMP/off.log"
expect "-DLILY_CUDA=OFF says OFF" grep -q '^-- lily: CUDA backend OFF (-DLILY_CUDA=OFF)' "$TMP/off.log"

make -n -C "$ROOT" build BUILD="$TMP/mk" CUDA=1 > "$TMP/mk1.log" 2>&1 || true
expect "make CUDA=1 configures with -DLILY_CUDA=ON" grep -q -- '-DLILY_CUDA=ON' "$TMP/mk1.log"
make -n -C "$ROOT" build BUILD="$TMP/mk" CUDA=0 > "$TMP/mk0.log" 2>&1 || true
expect "make CUDA=0 configures with -DLILY_CUDA=OFF" grep -q -- '-DLILY_CUDA=OFF' "$TMP/mk0.log"
make -n -C "$ROOT" build BUILD="$TMP/mk" > "$TMP/mk.log" 2>&1 || true
expect "plain make leaves the choice to CMake (no -DLILY_CUDA)" bash -c "! grep -q -- -DLILY_CUDA '$TMP/mk.log'"
# a configured build directory is not configured again by a plain make (CUDA_FLAG, empty, held one blank:
# every `make run` ran cmake's configure step); CUDA=0 configures it again. A fake cmake records the calls
# (-o deps: the dependency check is not run)
mkdir -p "$TMP/fakecmake" "$TMP/mkc"
printf '#!/bin/sh\necho "cmake $*" >> "%s/cmake.log"\n' "$TMP" > "$TMP/fakecmake/cmake"
chmod +x "$TMP/fakecmake/cmake"
touch "$TMP/mkc/CMakeCache.txt"
PATH="$TMP/fakecmake:$PATH" make -s -C "$ROOT" -o deps build BUILD="$TMP/mkc" > "$TMP/mkc.log" 2>&1 || cat "$TMP/mkc.log"
expect "plain make on a configured build directory only builds (cmake calls: $(tr '\n' ';' < "$TMP/cmake.log"))" \
    bash -c "! grep -q -- ' -S ' '$TMP/cmake.log' && grep -q -- '--build $TMP/mkc' '$TMP/cmake.log'"
PATH="$TMP/fakecmake:$PATH" make -s -C "$ROOT" -o deps build BUILD="$TMP/mkc" CUDA=0 > "$TMP/mkc0.log" 2>&1 || cat "$TMP/mkc0.log"
expect "make CUDA=0 on a configured build directory configures it again" grep -q -- '-DLILY_CUDA=OFF' "$TMP/cmake.log"

# make's dependency check: a package installed for two architectures (the :arm64 libraries of make
# deps-arm64) is installed, although `dpkg -s NAME` calls it ambiguous (every make ran apt-get update and
# install again); a fake dpkg / apt-get stand in for Debian's
mkdir -p "$TMP/fakedeb"
cat > "$TMP/fakedeb/dpkg" <<'SH'
#!/bin/sh
case "$1 $2" in
    "--print-architecture ") echo amd64 ;;
    "-s libtwoarch-dev") echo "dpkg-query: error: ambiguous package name 'libtwoarch-dev'" >&2; exit 2 ;;
    "-s libtwoarch-dev:amd64") echo "Status: install ok installed" ;;
    *) exit 1 ;;
esac
SH
printf '#!/bin/sh
echo "apt-get $*" >> "%s/apt.log"
' "$TMP" > "$TMP/fakedeb/apt-get"
chmod +x "$TMP/fakedeb/dpkg" "$TMP/fakedeb/apt-get"
PATH="$TMP/fakedeb:$PATH" make -s -C "$ROOT" install-debs PACKAGES=libtwoarch-dev OPTIONAL=1 > "$TMP/deb.log" 2>&1 || true
expect "make deps: a package installed for two architectures is not installed again" \
    bash -c "[ ! -e '$TMP/apt.log' ] && ! grep -q 'missing\|installing' '$TMP/deb.log'"
PATH="$TMP/fakedeb:$PATH" make -s -C "$ROOT" install-debs PACKAGES=libabsent-dev OPTIONAL=1 > "$TMP/deb2.log" 2>&1 || true
expect "make deps: a missing package is still found missing" grep -q 'libabsent-dev' "$TMP/deb2.log"

# a python3 without numpy first on PATH (a fresh venv next to a copy of the binary: lily_python makes it)
mkdir -p "$TMP/fakebin" "$TMP/b"
printf '#!/bin/sh\necho "fake python3: no modules" >&2\nexit 1\n' > "$TMP/fakebin/python3"
chmod +x "$TMP/fakebin/python3"
ln -s "$LILY" "$TMP/b/lily"
PATH="$TMP/fakebin:$PATH" lily_python "$TMP/b/lily"
expect "lily_python made the venv next to the binary" [ "$PY" = "$TMP/b/venv/bin/python" ]
expect "the suite's Python has numpy although python3 on PATH has not" \
    env PATH="$TMP/fakebin:$PATH" "$PY" -c "import numpy"
expect "nothing required is missing" [ -z "$PY_MISSING" ]
bare=$(grep -nE '^[^#]*(^|[;&|(]|exec|if|then|do|!)[[:space:]]*python3?[[:space:]]' "$ROOT"/tests/*.sh || true)
expect "no test script runs the python3 on PATH (they use \"\$PY\" from lily_python)${bare:+: $bare}" [ -z "$bare" ]
finish
