#!/usr/bin/env bash
# In-tree developer build: compiles the native library and the cffi extension into build/dev and
# copies both next to the Python sources, so `PYTHONPATH=. python -m pytest` runs from the tree.
# Extra arguments go to CMake (e.g. -DRM_SANITIZE=ON, -DRM_CUDA=ON). RM_BUILD_DIR picks the build
# folder, RM_PKG_DIR where the two .so files are copied (default: rapidmoe_gguf/).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
dir=${RM_BUILD_DIR:-build/dev}
cmake -S . -B "$dir" -G Ninja -DSKBUILD=ON -DPython_EXECUTABLE="$(command -v "$py")" "$@" >/dev/null
cmake --build "$dir" -j "${RM_JOBS:-2}"
pkg=${RM_PKG_DIR:-rapidmoe_gguf}
mkdir -p "$pkg"
# Copy, then rename over the old file: a process still running the old library keeps its inode
# (copying onto a mapped library in place would crash it).
for so in "$dir"/librapidmoe.so "$dir"/_rm_cffi*.so; do
    cp -f "$so" "$pkg/.$(basename "$so").new"
    mv -f "$pkg/.$(basename "$so").new" "$pkg/$(basename "$so")"
done
