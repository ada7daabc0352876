# lily — the two commands a new user needs: `make run` and `make test`.
#   make run  [MODEL=DIR] [PROMPT="..."]   build, then continue PROMPT with `lily run --raw` on the bundled
#                                           model models/lily-tiny (or MODEL), printing text and tok/s
#   make test                               build, then run the whole test suite (CTest)
#   make test-asan                          the suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   make test-arm64                         the CPU kernels' tests and the fast-mode fixture logits, cross
#                                           built for AArch64 (NEON kernels) and run under qemu-aarch64
#   make deps                               install the build dependencies (Debian/Ubuntu, as root)
#   make install [PREFIX=DIR]               build, then copy the binary to PREFIX/bin/lily (default /usr/local)
# CUDA=1 builds the CUDA backend, CUDA=0 does not; by default it is built when nvcc and a GPU are present
# (CMake's -DLILY_CUDA=AUTO; the configure step prints one line saying which). It compiles machine code for
# sm_80/86/89/90a/120 + compute_80 PTX (CMakeLists.txt); CUDA_ARCH="89-real" (CMake's list) builds only those,
# several times faster.

BUILD      ?= build
BUILD_ASAN ?= build-asan
BUILD_ARM64 ?= build-arm64
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
# cmake's generated makefiles run make recursively: without this each step prints Entering/Leaving lines
MAKEFLAGS  += --no-print-directory
MODEL      ?=
PROMPT     ?= The Python interpreter
TOKENS     ?= 96
PREFIX     ?= /usr/local
CUDA       ?=
CUDA_FLAG   = $(if $(filter 1 ON on yes,$(CUDA)),-DLILY_CUDA=ON,$(if $(filter 0 OFF off no,$(CUDA)),-DLILY_CUDA=OFF))
CUDA_ARCH  ?=
CUDA_FLAG  += $(if $(CUDA_ARCH),"-DCMAKE_CUDA_ARCHITECTURES=$(CUDA_ARCH)")

DEB_PACKAGES = build-essential cmake pkg-config libjansson-dev libpcre2-dev libutf8proc-dev \
               libmicrohttpd-dev libcmocka-dev libedit-dev gnuplot-nox python3 python3-venv python3-numpy curl
# what only `make test` needs: chromium for the web page test (~90 s to install; the test skips without it)
TEST_DEB_PACKAGES = chromium
# test-arm64: a cross compiler, qemu's user-mode emulator, and the libraries for arm64 (multiarch)
ARM64_PACKAGES = gcc-aarch64-linux-gnu qemu-user libjansson-dev:arm64 libpcre2-dev:arm64 \
                 libutf8proc-dev:arm64 libcmocka-dev:arm64

.PHONY: all build run test test-asan test-arm64 deps deps-arm64 test-deps install-debs install clean

all: build

deps:
	@$(MAKE) --no-print-directory install-debs PACKAGES="$(DEB_PACKAGES)"

test-deps: deps
	@$(MAKE) --no-print-directory install-debs PACKAGES="$(TEST_DEB_PACKAGES)" OPTIONAL=1

# whether Debian package $$p is installed; `dpkg -s P` alone fails ("ambiguous package name") once P is also
# installed for another architecture (make deps-arm64 adds the :arm64 libraries), so the native one is asked too
DEB_INSTALLED = { dpkg -s $$p || dpkg -s $$p:$$(dpkg --print-architecture); } >/dev/null 2>&1

install-debs:
	@missing=""; for p in $(PACKAGES); do $(DEB_INSTALLED) || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
	  echo "lily: missing build dependencies. On macOS: brew install cmake pkg-config jansson pcre2 utf8proc libmicrohttpd cmocka libedit gnuplot"; \
	  exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then \
	  echo "lily: installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else \
	  echo "lily: missing packages; run:  sudo apt-get install -y$$missing"; [ -n "$(OPTIONAL)" ]; fi

build: deps
	@if [ ! -f $(BUILD)/CMakeCache.txt ] || [ -n "$(strip $(CUDA_FLAG))" ]; then \
	  mkdir -p $(BUILD); \
	  cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CUDA_FLAG) > $(BUILD)/configure.log 2>&1 \
	    || { cat $(BUILD)/configure.log; exit 1; }; \
	  sed -n 's/^-- \(lily: \)/\1/p' $(BUILD)/configure.log; fi
	cmake --build $(BUILD) -j $(JOBS) $(TARGETS)

run: TARGETS = --target lily
run: build
	./$(BUILD)/lily run $(if $(MODEL),-m "$(MODEL)") --raw -n $(TOKENS) -p '$(subst ','\'',$(value PROMPT))'

test: build test-deps
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

install: TARGETS = --target lily
install: build
	cmake --install $(BUILD) --prefix "$(PREFIX)"

test-asan: test-deps
	@[ -f $(BUILD_ASAN)/CMakeCache.txt ] || cmake -S . -B $(BUILD_ASAN) -DCMAKE_BUILD_TYPE=Debug -DLILY_SANITIZE=ON -DLILY_CUDA=OFF
	cmake --build $(BUILD_ASAN) -j $(JOBS)
	cd $(BUILD_ASAN) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS)

deps-arm64: deps
	@missing=""; for p in $(ARM64_PACKAGES); do $(DEB_INSTALLED) || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then \
	  echo "lily: installing$$missing"; dpkg --add-architecture arm64; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	else \
	  echo "lily: missing packages; run:  sudo dpkg --add-architecture arm64 && sudo apt-get update &&" \
	       "sudo apt-get install -y$$missing"; exit 1; fi

# Only the kernels' tests and the fast-mode fixture logits (cases up to 65 tokens, every mode): the rest is
# the same C on every CPU.
test-arm64: deps-arm64
	@[ -f $(BUILD_ARM64)/CMakeCache.txt ] || cmake -S . -B $(BUILD_ARM64) -DCMAKE_BUILD_TYPE=Release -DLILY_CUDA=OFF \
	  -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
	cmake --build $(BUILD_ARM64) -j $(JOBS) --target test_cpu_kernels test_forward_fixtures
	cd $(BUILD_ARM64) && LILY_TEST_FILTER='test_fast_mode_*' LILY_TEST_MAX_TOKENS=65 ctest --output-on-failure -R 'test_cpu_kernels|test_forward_fixtures'

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_ARM64)
