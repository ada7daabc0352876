# CMake toolchain for an AArch64 Linux cross build (Debian's gcc-aarch64-linux-gnu, arm64 multiarch
# libraries) whose tests run under qemu-aarch64: `make test-arm64`.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /usr/lib/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")
# ctest runs each test binary through the emulator; -L /: the arm64 multiarch C library (libc6:arm64,
# which the arm64 -dev packages bring), not the cross one, so ld.so and libc come from one package version
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;/)
