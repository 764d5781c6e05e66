# Cross build for 64-bit ARM Linux with the Debian/Ubuntu cross toolchain
# (apt: gcc-aarch64-linux-gnu). Binaries run here under qemu-aarch64-static,
# which ctest uses as the emulator. Used by scripts/test_arm.sh:
#   cmake -S . -B build-arm -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DNM_QUANT_ONLY=ON
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(NM_CROSS_PREFIX aarch64-linux-gnu- CACHE STRING "cross compiler prefix")
set(CMAKE_C_COMPILER ${NM_CROSS_PREFIX}gcc)

# Static executables: qemu needs no ARM sysroot to run them.
set(CMAKE_EXE_LINKER_FLAGS_INIT "-static")
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static)

set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# -O2, not CMake's -O3: the loop vectorizer of aarch64-linux-gnu-gcc 12.2
# (Debian 12) dies with an internal compiler error on tests/unit/test_quant.c
# at -O3 (vect_transform_reduction).
set(CMAKE_C_FLAGS_RELEASE "-O2 -DNDEBUG" CACHE STRING "")
