#!/usr/bin/env bash
# Fuzzing of the GGUF reader and the model loader with libFuzzer (native/fuzz; docs/RELIABILITY.md).
#
#   tools/fuzz.sh SECONDS [gguf] [model]
#
# Builds the targets with clang (-fsanitize=fuzzer,address,undefined) into build/fuzz, writes the
# seed corpus (native/fuzz/make_seeds.c and tools/fuzz_seeds.py: tiny models and a trimmed copy
# of the bundled model; nothing is committed), then runs each target named (default: both) for an
# equal share of SECONDS, one after the other. The corpus each run grows is kept in
# build/fuzz/corpus/TARGET and reused by the next run; delete it to start from the seeds alone.
# Prints each target's executions and coverage (libFuzzer's cov and ft); exits non-zero on any
# crash, leak, timeout, out-of-memory or sanitizer report, whose input is saved in
# build/fuzz/artifacts/ (replay it with build/fuzz/fuzz_TARGET FILE; RM_FUZZ_VERBOSE=1 prints the
# library's status and message for each input).
#
# Environment: CC (default clang), PYTHON (for the gguf-package seeds; default .venv/bin/python,
# else python3; without the gguf package those seeds are skipped), RM_FUZZ_DIR (default
# build/fuzz), RM_JOBS (build jobs, default 2), RM_FUZZ_ARGS (more libFuzzer options).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-}
case "$secs" in
    ''|*[!0-9]*) echo "usage: tools/fuzz.sh SECONDS [gguf] [model]" >&2; exit 2 ;;
esac
shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf model)
for t in "${targets[@]}"; do
    [ -f "native/fuzz/fuzz_$t.c" ] || { echo "fuzz.sh: no target '$t' (native/fuzz/fuzz_$t.c)" >&2; exit 2; }
done
cc=${CC:-clang}
dir=${RM_FUZZ_DIR:-build/fuzz}
py=${PYTHON:-}
if [ -z "$py" ]; then
    if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
command -v "$cc" >/dev/null || { echo "fuzz.sh: $cc not found (Debian: apt-get install clang)" >&2; exit 2; }
if ! echo 'int LLVMFuzzerTestOneInput(const char * d, unsigned long n) { return 0; }' |
        "$cc" -fsanitize=fuzzer -x c - -o /dev/null 2>/dev/null; then
    echo "fuzz.sh: $cc cannot link a libFuzzer program (Debian: apt-get install clang libclang-rt-14-dev)" >&2
    exit 2
fi

echo "== build ($cc, $dir)"
cmake -S . -B "$dir" -G Ninja -DCMAKE_C_COMPILER="$cc" -DRM_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$dir" -j "${RM_JOBS:-2}" --target make_seeds "${targets[@]/#/fuzz_}" >/dev/null

echo "== seeds"
rm -rf "$dir/seeds"
mkdir -p "$dir/seeds/gguf" "$dir/seeds/model" "$dir/artifacts"
"$dir/make_seeds" "$dir/seeds/gguf" "$dir/seeds/model"
if "$py" -c "import gguf, numpy" 2>/dev/null; then
    # the package of the source tree when it holds a built library (tools/dev_build.sh), else the installed one
    pp=${PYTHONPATH:-}
    [ -f rapidmoe_gguf/librapidmoe.so ] && pp=$(pwd)${pp:+:$pp}
    PYTHONPATH=$pp "$py" tools/fuzz_seeds.py "$dir/seeds/gguf" "$dir/seeds/model" rapidmoe_gguf/models/tiny-moe.gguf
else
    echo "fuzz.sh: $py lacks the gguf package: only the seeds of make_seeds are used" >&2
fi
for t in gguf model; do
    echo "   $t: $(ls "$dir/seeds/$t" | wc -l) seed files"
done

# Leaks count as failures; UBSan stops at the first report (the objects are also built with
# -fno-sanitize-recover=undefined).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
per=$(( secs / ${#targets[@]} ))
[ "$per" -ge 1 ] || per=1
failed=0
for t in "${targets[@]}"; do
    mkdir -p "$dir/corpus/$t"
    log=$dir/fuzz_$t.log
    echo "== fuzz_$t for $per s (log: $log)"
    rc=0
    touch "$dir/artifacts/.start-$t"
    # shellcheck disable=SC2086
    "$dir/fuzz_$t" -max_total_time="$per" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$dir/artifacts/$t-" ${RM_FUZZ_ARGS:-} "$dir/corpus/$t" "$dir/seeds/$t" >"$log" 2>&1 || rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1 || true)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9]*[A-Za-z]*\).*/\1/p' <<<"$last")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    echo "   fuzz_$t: ${execs:-?} executions (${rate:-?}/s), cov ${cov:-?}, ft ${ft:-?}, corpus ${corp:-?} (inputs/bytes)"
    if [ "$rc" -ne 0 ] || grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|deadly signal' "$log"; then
        echo "fuzz.sh: fuzz_$t failed (exit $rc); the report:" >&2
        grep -E -A40 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|deadly signal' "$log" | head -60 >&2 || tail -40 "$log" >&2
        find "$dir/artifacts" -name "$t-*" -newer "$dir/artifacts/.start-$t" | sed 's|^|   the input: |' >&2
        failed=1
    fi
done
[ "$failed" -eq 0 ] && echo "fuzz.sh: ok (no crash, leak or sanitizer report)"
exit "$failed"
