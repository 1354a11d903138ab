#!/usr/bin/env bash
# The CUDA build without a GPU: what CI can check of it on a CPU-only machine.
#
# Compiles the library with the CUDA backend (-DRM_CUDA=ON, the default architectures
# sm_80;sm_86;sm_89;sm_90 unless RM_CUDA_ARCHITECTURES is set) and the C tests into build/cuda,
# runs the C tests (test_cuda_dequant checks the kernels' dequantizers on the host against the C
# reference) and the check that no units, the CUDA ones included, call each other in a cycle
# (tools/check_cycles.py), then runs the Python tests of the split that need no device against a
# private copy of the package, build/cuda/pkg/rapidmoe_gguf: a GPU request must fall back to the
# CPU with a clear note, and the CPU stand-in device must split as in tests/test_split_standin.py.
# Needs nvcc; any failure makes the script exit non-zero.
#
#   PYTHON=/path/to/venv/bin/python tools/cuda_check.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
py=${PYTHON:-python3}
case "$py" in */*) py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py") ;; esac   # absolute: the script changes folder
if ! command -v nvcc >/dev/null 2>&1; then
    echo "cuda_check: nvcc not found: install the CUDA toolkit (or put its bin/ on PATH)" >&2
    exit 1
fi
dir=build/cuda
pkg=$dir/pkg/rapidmoe_gguf
archs=()
[ -n "${RM_CUDA_ARCHITECTURES:-}" ] && archs=(-DRM_CUDA_ARCHITECTURES="$RM_CUDA_ARCHITECTURES")

rm -rf "$dir/pkg"
mkdir -p "$pkg"
cp rapidmoe_gguf/*.py rapidmoe_gguf/*.html "$pkg"/
cp -r rapidmoe_gguf/models rapidmoe_gguf/convert "$pkg"/
echo "== compiling with RM_CUDA=ON ($(nvcc --version | tail -1))"
RM_BUILD_DIR=$dir RM_PKG_DIR=$pkg PYTHON=$py tools/dev_build.sh -DRM_CUDA=ON -DRM_BUILD_TESTS=ON "${archs[@]}"

echo "== C tests"
(cd "$dir" && ctest --output-on-failure)

echo "== call cycles among the units, CUDA's included"
"$py" tools/check_cycles.py "$dir"

echo "== Python tests against $pkg"
cd "$dir/pkg"
"$py" -c "
import rapidmoe_gguf, sys
from rapidmoe_gguf import _native
where = rapidmoe_gguf.__file__
if not where.startswith('$root/$pkg/'):
    sys.exit('cuda_check: imported the wrong package: ' + where)
if 'cuda on' not in _native.build_info():
    sys.exit('cuda_check: the library was not built with CUDA: ' + _native.build_info())
"
"$py" -m pytest -q -p no:cacheprovider --rootdir="$root" "$root/tests/test_gpu_fallback.py" \
    "$root/tests/test_split_standin.py" "$root/tests/test_gpu_device.py" "$@"
echo "cuda_check: ok"
