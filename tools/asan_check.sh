#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer check of the native code.
#
# Builds the library, the cffi extension and the C tests (native/tests/test_*.c) with
# -DRM_SANITIZE=ON into build/asan, runs the C tests (leak checking on), then runs the
# native-facing Python tests (tests/test_gguf*.py, tests/test_quants*.py, tests/test_kernels*.py) against a private copy
# of the package, build/asan/pkg/rapidmoe_gguf, so the in-tree build is left alone. Python is not
# instrumented, so libasan is preloaded and leak checking is off for it (CPython keeps memory
# until exit by design). Any test failure or sanitizer report makes the script exit non-zero.
#
#   PYTHON=/path/to/venv/bin/python tools/asan_check.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
py=${PYTHON:-python3}
case "$py" in */*) py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py") ;; esac   # absolute: the script changes folder
dir=build/asan
pkg=$dir/pkg/rapidmoe_gguf

# The package copy: the Python sources now, the sanitized .so files from the build.
rm -rf "$dir/pkg"
mkdir -p "$pkg"
cp rapidmoe_gguf/*.py "$pkg"/
cp -r rapidmoe_gguf/convert "$pkg"/
ln -s "$root/rapidmoe_gguf/models" "$pkg/models"   # the bundled model, read only (tests/test_quants_iq.py)
RM_BUILD_DIR=$dir RM_PKG_DIR=$pkg PYTHON=$py tools/dev_build.sh \
    -DRM_SANITIZE=ON -DRM_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo

# halt_on_error/abort_on_error: the first report ends the process with a non-zero status.
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

echo "== C tests (ctest, leak checking on)"
(cd "$dir" && ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=1" ctest --output-on-failure)

echo "== Python tests against $pkg"
shopt -s nullglob
tests=(tests/test_gguf*.py tests/test_quants*.py tests/test_kernels*.py)
shopt -u nullglob
if [ ${#tests[@]} -eq 0 ]; then
    echo "asan_check: no native-facing Python tests found" >&2
    exit 1
fi
# The sanitizer runtimes of the compiler that built the library (gcc's file names).
cc=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$dir/CMakeCache.txt")
preload=$("${cc:-gcc}" -print-file-name=libasan.so)
if [ ! -f "$preload" ]; then
    echo "asan_check: cannot find libasan.so for ${cc:-gcc} (got '$preload')" >&2
    exit 1
fi
ubsan=$("${cc:-gcc}" -print-file-name=libubsan.so)
[ -f "$ubsan" ] && preload="$preload $ubsan"
abs_tests=()
for t in "${tests[@]}"; do abs_tests+=("$root/$t"); done
# Run from the package copy's parent: `python -m pytest` puts the working directory first on
# sys.path, so `import rapidmoe_gguf` finds the sanitized copy, never the in-tree one.
cd "$dir/pkg"
export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"
LD_PRELOAD="$preload" "$py" -c "
import rapidmoe_gguf, sys
where = rapidmoe_gguf.__file__
sys.exit(0 if where.startswith('$root/$pkg/') else 'asan_check: imported the wrong package: ' + where)
"
# --capture=sys leaves fd 2 alone, so a sanitizer report that aborts the run is still shown.
LD_PRELOAD="$preload" "$py" -m pytest -q --capture=sys -p no:cacheprovider --rootdir="$root" "${abs_tests[@]}" "$@"
echo "asan_check: ok"
