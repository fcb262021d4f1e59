#!/usr/bin/env bash
# A replication killed at its points (label tier): on 2 ranks as 2 nodes
# with one replica each, step 1 is saved, replicated and drained, then
# rank V is killed (SIGKILL from inside, at its K-th replica hook call:
# before pieces it receives, K = 1, 4, 7, ..., and before the rename that
# follows the agreement); mpiexec ends the job. After each kill, node V is
# lost too and `mpi_tier rkillcheck` checks that the restore loads step 2
# from tier 0 when the survivor holds V's file of step 2 under its name,
# else step 1 — whole, never a mix — and that new steps save and drain:
# the killed replication's temporaries in the survivor's step 2 are
# leftovers, removed by the next save (step 2 kept), and retention keeping
# 1 then removes the older steps (at least one point must have left
# temporaries).
# Environment: MPIEXEC (the launcher and its -n flag), MPI_TIER.
set -u
export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-0}
: "${MPIEXEC:?}" "${MPI_TIER:?}"
dir=$(mktemp -d /tmp/dcp-mpi-tierpkill-XXXXXX)/t
points=0
failed=0
withtmp=0
for victim in 0 1; do
    for k in 1 4 7 10 13 16 19 22 25; do
        timeout -k 5 60 $MPIEXEC 2 "$MPI_TIER" rkill "$dir" "$victim" "$k" \
            >/dev/null 2>&1
        st=$?
        if [ $st = 0 ]; then
            break # fewer than k hook calls: every point done
        fi
        points=$((points + 1))
        if ! timeout -k 5 60 $MPIEXEC 2 "$MPI_TIER" rkillcheck "$dir" \
            "$victim" >"$dir.log" 2>&1; then
            echo "FAIL victim $victim point $k:"
            cat "$dir.log"
            failed=$((failed + 1))
        fi
        if grep -q "^temporaries before: [1-9]" "$dir.log"; then
            withtmp=$((withtmp + 1))
        fi
    done
done
rm -rf "$(dirname "$dir")"
echo "kill points: $points, with temporaries left: $withtmp"
if [ $withtmp -lt 1 ]; then
    echo "no kill point left a temporary"
    failed=$((failed + 1))
fi
if [ $points -lt 4 ]; then
    echo "too few kill points ($points)"
    failed=$((failed + 1))
fi
echo "$((points - failed)) passed, $failed failed"
[ $failed = 0 ]
