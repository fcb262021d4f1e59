#!/usr/bin/env bash
# A drain killed at every point (label tier): on 2 ranks as 2 nodes, step 1
# is drained, then step 2's drain is killed (SIGKILL from inside rank V at
# its K-th drain hook call: before each chunk of its data file, and on
# rank 0 before tier 1's .metadata is published); mpiexec ends the job.
# After each kill, `mpi_tier killcheck` checks that tier 1 holds step 1
# only, that restore loads step 2 from tier 0 and, with tier 0 gone, step
# 1 from tier 1 (never a mix), and that a new drain of step 2 commits.
# Environment: MPIEXEC (the launcher and its -n flag), MPI_TIER.
set -u
export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-0}
: "${MPIEXEC:?}" "${MPI_TIER:?}"
dir=$(mktemp -d /tmp/dcp-mpi-tierkill-XXXXXX)/t
points=0
failed=0
for victim in 0 1; do
    for k in 1 2 3 4 5 6 7 8; do
        timeout -k 5 60 $MPIEXEC 2 "$MPI_TIER" kill "$dir" "$victim" "$k" \
            >/dev/null 2>&1
        st=$?
        if [ $st = 0 ]; then
            break # fewer than k hook calls: every point done
        fi
        points=$((points + 1))
        if ! timeout -k 5 60 $MPIEXEC 2 "$MPI_TIER" killcheck "$dir" \
            >"$dir.log" 2>&1; then
            echo "FAIL victim $victim point $k:"
            cat "$dir.log"
            failed=$((failed + 1))
        fi
    done
done
rm -rf "$(dirname "$dir")"
echo "kill points: $points"
if [ $points -lt 4 ]; then
    echo "too few kill points ($points)"
    failed=$((failed + 1))
fi
echo "$((points - failed)) passed, $failed failed"
[ $failed = 0 ]
