#!/usr/bin/env bash
# The training part of `make demo` (examples/train_mlp.c): a C trainer with
# AdamW sharded across MPI ranks checkpoints asynchronously every 20 steps,
# then resumes (a) on the same number of ranks and (b) on another one; both
# must continue bit-identically. Ends with a short report.
#
#   scripts/demo_train.sh BUILD_DIR WORK_DIR
#
# WORK_DIR (a few MB: checkpoints and loss logs) is emptied first and kept.
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 BUILD_DIR WORK_DIR" >&2
    exit 2
fi
build=$1
dir=$2
prog=$build/train_mlp

if [ ! -x "$prog" ]; then
    echo "demo_train: $prog was not built (it needs MPI: libopenmpi-dev)" >&2
    exit 1
fi
mpiexec=$(sed -n 's/^MPIEXEC_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt")
mpiexec=${mpiexec:-$(command -v mpiexec || true)}
if [ -z "$mpiexec" ]; then
    echo "demo_train: no mpiexec found" >&2
    exit 1
fi
flags=()
if "$mpiexec" --version 2>/dev/null | grep -q -e 'Open MPI' -e OpenRTE; then
    flags+=(--oversubscribe)
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

rm -rf "$dir"
mkdir -p "$dir"
run() {
    local np=$1
    shift
    "$mpiexec" "${flags[@]}" -n "$np" "$prog" "$@"
}

# Steps of log $1 whose loss bits equal those in the reference log $2, out
# of those $1 has; and whether the final parameters' digests are equal.
same() {
    awk 'NR == FNR { if ($1 == "step") ref[$2] = $4; else if ($1 == "params") p[$2] = $3; next }
         $1 == "step" { n++; if (ref[$2] == $4) k++ }
         $1 == "params" { d = (p[$2] == $3) ? "identical" : "DIFFERENT" }
         END { printf "%d/%d losses bit-identical, final parameters %s\n", k, n, d }' \
        "$2" "$1"
}

start=$(date +%s.%N)
echo "==> 60 steps on 2 ranks, an asynchronous checkpoint every 20 steps"
run 2 --steps 60 --every 20 --dir "$dir/run" --log "$dir/run.log"
echo
echo "==> (a) resume at step 20 on 2 ranks, the same number"
run 2 --steps 60 --resume "$dir/run/step-000020" --dir "$dir/a" \
    --log "$dir/a.log" --expect "$dir/run.log"
echo
echo "==> (b) resume at step 40 on 3 ranks, another number"
run 3 --steps 60 --resume "$dir/run/step-000040" --dir "$dir/b" \
    --log "$dir/b.log" --expect "$dir/run.log"
end=$(date +%s.%N)

echo
echo "train_mlp report (checkpoints in $dir, in PyTorch's get_state_dict layout)"
echo "  (a) 2 ranks -> 2 ranks at step 20: $(same "$dir/a.log" "$dir/run.log")"
echo "  (b) 2 ranks -> 3 ranks at step 40: $(same "$dir/b.log" "$dir/run.log")"
awk -v s="$start" -v e="$end" 'BEGIN { printf "  three runs in %.1f s, MPI start-up included\n", e - s }'
echo "  PyTorch resumes the same checkpoints and the C trainer resumes PyTorch's:"
echo "  tests/interop/test_train_torch_mpi.py (ctest -R train_torch)"
