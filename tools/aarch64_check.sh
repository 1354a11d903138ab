#!/usr/bin/env bash
# The portable path on 64-bit ARM: cross-compiles the library and the C tests for aarch64 and
# runs the tests under qemu's user-mode emulation. This build has no ARM SIMD kernels (no NEON
# set yet): the scalar reference kernels run, and this check keeps them building and correct there.
#
# Needs Debian's gcc-aarch64-linux-gnu and qemu-user (CI installs them). Debian 12's cross gcc
# (12.2) stops with an internal compiler error in its loop vectorizer on test_backend_ops.c, so
# the check builds with -fno-tree-vectorize; the native builds are unaffected.
#
#   tools/aarch64_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in aarch64-linux-gnu-gcc qemu-aarch64; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "aarch64_check: $tool not found (apt-get install gcc-aarch64-linux-gnu qemu-user)" >&2
        exit 1
    fi
done
dir=build/aarch64
mkdir -p "$dir"
cat > "$dir/toolchain.cmake" <<'TOOLCHAIN'
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;/usr/aarch64-linux-gnu)
TOOLCHAIN
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B "$dir" "${gen[@]}" -DCMAKE_TOOLCHAIN_FILE="$(pwd)/$dir/toolchain.cmake" -DRM_BUILD_TESTS=ON \
    -DCMAKE_C_FLAGS=-fno-tree-vectorize >/dev/null
cmake --build "$dir" -j "${RM_JOBS:-2}"
aarch64-linux-gnu-readelf -h "$dir/librapidmoe.so" | grep -q "AArch64" || { echo "aarch64_check: not an aarch64 library" >&2; exit 1; }
(cd "$dir" && ctest --output-on-failure -E '_(scalar|avx2)$')
echo "aarch64_check: ok"
