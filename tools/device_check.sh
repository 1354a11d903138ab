#!/usr/bin/env bash
# The checks of the CUDA backend that need a GPU, in one run of a few minutes (docs/SPLIT.md).
#
#   1. build the library and the C tests with -DRM_CUDA=ON for this machine's GPU
#   2. test_cuda_dequant: the kernels' dequantizers against the C reference (host side)
#   3. test_backend_ops: every op of the CUDA backend and the CPU backend against double
#      references on random inputs, with the error budgets stated in that file
#   4. test_backend_model: tiny models (written by the test) end to end, GPU vs CPU logits, every
#      residual policy, experts kept in host memory, residuals copied for prefill; no weight byte
#      may cross the bus in decode
#   5. bench: prefill and decode tokens/s on the CPU, the GPU and the split (RM_BENCH_MODEL=BASE.gguf
#      for a real model with its .residual.gguf beside it; otherwise a generated mid-size one)
#   6. Python (when python3 can import cffi, gguf, numpy, torch and transformers, or installs
#      cffi/pycparser/gguf from wheels in .whl/): tests/test_gpu_device.py and test_gpu_fallback.py
#      (on a machine without network, bring wheels of cffi, pycparser and gguf for its Python in
#      .whl/; without them the C checks above still run and this step is reported as skipped)
#
# Needs cmake, a C compiler and nvcc; nothing from the network. Every figure goes to
# $OUT/device_check.json (steps, exit codes, seconds, the tests' own JSON), the whole output to
# $OUT/device_check.log. OUT defaults to build/device_check. Exit status: 0 when every step passed.
#
#   OUT=/somewhere tools/device_check.sh          RM_BENCH_MODEL=/models/x.gguf tools/device_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
OUT=${OUT:-$root/build/device_check}
mkdir -p "$OUT"
exec > >(tee "$OUT/device_check.log") 2>&1
steps=$OUT/steps.tsv
: > "$steps"
jobs=$(nproc 2>/dev/null || echo 4)
export PATH=$PATH:/usr/local/cuda/bin

# step NAME TIMEOUT COMMAND...: runs it, logs it, records "name rc seconds"
step() {
    local name=$1 limit=$2
    shift 2
    echo "=== $name: $*"
    local t0=$SECONDS
    timeout "$limit" "$@"
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - t0)) s"
    printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >> "$steps"
    return $rc
}

echo "device_check: $(date -u +%FT%TZ) in $root"
nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
nvcc --version 2>&1 | tail -1
cmake --version | head -1

cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
arch=${RM_CUDA_ARCH:-${cap:-90}}
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
build=build/device

step configure 120 cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DRM_CUDA=ON -DRM_BUILD_TESTS=ON \
    -DRM_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER="$(command -v nvcc)"
step build 400 cmake --build "$build" -j "$jobs"

if [ -x "$build/test_backend_ops" ]; then
    step cuda_dequant 60 "$build/test_cuda_dequant"
    step backend_ops 180 "$build/test_backend_ops" --json "$OUT/ops.json"
    step backend_model 240 "$build/test_backend_model" --threads "$jobs" --json "$OUT/model.json"
    bench=(--bench --threads "$jobs" --json "$OUT/bench.json")
    [ -n "${RM_BENCH_MODEL:-}" ] && bench+=(--model "$RM_BENCH_MODEL")
    step bench 300 "$build/test_backend_model" "${bench[@]}"
fi

# Python: the repo's .venv when it works here, else python3 (plus wheels from .whl/ if needed)
py=python3
[ -x .venv/bin/python ] && .venv/bin/python -c "import cffi, gguf, numpy" 2>/dev/null && py=.venv/bin/python
if ! "$py" -c "import cffi, gguf, numpy" 2>/dev/null && [ -d .whl ]; then
    "$py" -m pip install -q --no-index --no-deps --target /tmp/rm_site .whl/*.whl && export PYTHONPATH=/tmp/rm_site
fi
if "$py" -c "import cffi, gguf, numpy, torch, transformers, tokenizers, safetensors, pytest" 2>/dev/null; then
    if step python_build 300 env PYTHON="$(command -v "$py")" RM_BUILD_DIR=build/device-py RM_JOBS="$jobs" \
            tools/dev_build.sh -DRM_CUDA=ON -DRM_CUDA_ARCHITECTURES="$arch"; then
        step python_tests 300 "$py" -m pytest -q -p no:cacheprovider tests/test_gpu_device.py tests/test_gpu_fallback.py \
            tests/test_planner.py tests/test_auto_budget.py
    fi
else
    echo "=== python: skipped ($py lacks cffi/gguf/numpy/torch/transformers/pytest; put wheels in .whl/)"
    printf 'python\tskipped\t0\n' >> "$steps"
fi

python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
doc = {"steps": []}
for line in open(os.path.join(out, "steps.tsv")):
    name, rc, secs = line.rstrip("\n").split("\t")
    doc["steps"].append({"name": name, "rc": rc if rc == "skipped" else int(rc), "seconds": int(secs)})
for key in ("ops", "model", "bench"):
    path = os.path.join(out, key + ".json")
    if os.path.exists(path):
        try:
            doc[key] = json.load(open(path))
        except ValueError as exc:
            doc[key] = {"unreadable": str(exc)}
doc["passed"] = all(s["rc"] in (0, "skipped") for s in doc["steps"])
json.dump(doc, open(os.path.join(out, "device_check.json"), "w"), indent=1)
print("device_check:", "PASSED" if doc["passed"] else "FAILED",
      "; ".join(f"{s['name']}={s['rc']}" for s in doc["steps"]))
sys.exit(0 if doc["passed"] else 1)
EOF
