#!/usr/bin/env bash
# Runs each libFuzzer target for a time box and reports its figures.
#   tests/fuzz/run_fuzz.sh BUILD_DIR SECONDS [--merge] [TARGET...]
# BUILD_DIR was configured with -DDCP_BUILD_FUZZERS=ON (make fuzz does it:
# clang-14, ASan+UBSan). Each target starts from its committed corpus
# (tests/fuzz/corpus/<t>/, read only) plus BUILD_DIR/fuzz-runs/<t>-corpus/
# (new finds, kept between runs), with the plan's limits: 2 s per input,
# 512 MB RSS, 256 MB per allocation (so "allocate what the header says"
# shows up as a finding). A crash, leak, timeout or OOM fails the run and
# leaves the input in BUILD_DIR/fuzz-runs/<t>-artifacts/; add it to
# tests/fuzz/corpus/<t>/ once fixed, so every ctest run replays it.
# --merge: afterwards, add the finds that reach new coverage to the
# committed corpus (libFuzzer -merge=1), to grow it deliberately.
set -u
build=${1:?build dir}
secs=${2:?seconds}
shift 2
merge=0
if [ "${1:-}" = --merge ]; then
    merge=1
    shift
fi
targets=${*:-pickle torchzip metadata safetensors srcfile}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=$build/fuzz-runs
mkdir -p "$out"
status=0
total_execs=0
summary=$out/summary.txt
: > "$summary"
for t in $targets; do
    bin=$build/tests/fuzz/fuzz_$t
    if [ ! -x "$bin" ]; then
        echo "run_fuzz: $bin not built" >&2
        exit 2
    fi
    work=$out/$t-corpus
    art=$out/$t-artifacts
    mkdir -p "$work" "$art"
    dict=()
    [ -f "$here/$t.dict" ] && dict=(-dict="$here/$t.dict")
    log=$out/$t.log
    ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        "$bin" -max_total_time="$secs" -timeout=2 -rss_limit_mb=512 \
        -malloc_limit_mb=256 -print_final_stats=1 "${dict[@]}" \
        -artifact_prefix="$art/" "$work" "$here/corpus/$t" >"$log" 2>&1
    rc=$?
    execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log")
    rate=$(awk '/stat::average_exec_per_sec/ {print $2}' "$log")
    newu=$(awk '/stat::new_units_added/ {print $2}' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | awk '{print $2}')
    result=ok
    if [ $rc != 0 ]; then
        result="FAILED (exit $rc, see $log and $art/)"
        grep -E '^==[0-9]+==ERROR|SUMMARY|deadly signal|out-of-memory|timeout' \
            "$log" | head -5
        status=1
    fi
    line=$(printf 'fuzz %-11s %10s execs in %4ss, %7s exec/s, %4s edges, %5s new inputs: %s' \
        "$t" "${execs:-0}" "$secs" "${rate:-0}" "${cov:-?}" "${newu:-0}" "$result")
    echo "$line"
    echo "$line" >> "$summary"
    total_execs=$((total_execs + ${execs:-0}))
    if [ $merge = 1 ] && [ $rc = 0 ]; then
        "$bin" -merge=1 "$here/corpus/$t" "$work" >/dev/null 2>&1 ||
            echo "run_fuzz: merge of $t failed" >&2
    fi
done
echo "fuzz total: $total_execs execs, $secs s per target" | tee -a "$summary"
exit $status
