#!/usr/bin/env bash
# Crash injection under mpiexec: for 3 ranks, each scenario (new directory,
# overwrite, overwrite of tagged files) and each victim (rank 0, rank 1),
# kill the victim (SIGKILL from inside, before its K-th storage operation)
# for every K; mpiexec then ends the job. After each crash,
# `test_crash check` verifies invariant (I): the previous checkpoint loads
# bit-exact (the new one exactly when the crash came after the commit
# rename), a new directory without a commit is refused with DCP_ENOENT,
# and a new save over the debris succeeds.
#   mpi_crash.sh [--quick]     --quick: every third crash point
# Environment: MPIEXEC (the launcher and its -n flag, e.g. "mpiexec
# --oversubscribe -n"), MPI_FAULT and TEST_CRASH (the two programs).
set -u
# Open MPI waits 1 s per killed job before its own SIGKILL by default.
export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-0}
quick=0
[ "${1:-}" = --quick ] && quick=1
: "${MPIEXEC:?}" "${MPI_FAULT:?}" "${TEST_CRASH:?}"
np=3
dir=$(mktemp -d /tmp/dcp-mpi-crash-XXXXXX)/ckpt
points=0
failed=0
stuck=0
limit=30 # seconds a job may take
for kind in 0 1 2; do
    for victim in 0 1; do
        "$TEST_CRASH" prepare "$dir" "$kind" || { echo "prepare failed"; exit 1; }
        line=$(timeout -k 5 60 $MPIEXEC $np "$MPI_FAULT" count "$dir" \
            "$victim" | grep '^ops ')
        ops=$(echo "$line" | awk '{print $2}')
        before=$(echo "$line" | awk '{print $4}')
        if [ -z "$ops" ] || [ "$ops" -lt 3 ]; then
            echo "kind $kind victim $victim: cannot count operations ($line)"
            exit 1
        fi
        for k in $(seq 1 "$ops"); do
            if [ $quick = 1 ] && [ $((k % 3)) != 1 ] && [ "$k" != "$ops" ]; then
                continue
            fi
            "$TEST_CRASH" prepare "$dir" "$kind" || exit 1
            rm -f "$dir".done.*
            t0=$SECONDS
            timeout -k 5 $limit $MPIEXEC $np "$MPI_FAULT" crash "$dir" \
                "$victim" "$k" >/dev/null 2>&1
            st=$?
            if [ -e "$dir.done.$victim" ]; then
                echo "FAIL kind $kind victim $victim op $k: victim not killed"
                failed=$((failed + 1))
                continue
            fi
            if [ $((SECONDS - t0)) -ge $limit ]; then
                # The job outlived the limit. A rank that never returned
                # from its save hung: (c) fails. If every other rank did
                # (each writes DIR.done.RANK), mpiexec missed the victim's
                # death: Open MPI 4.1.4's mpiexec can deadlock when the
                # victim dies after the others have finished (seen at the
                # last operation of rank 1); counted, not a dcp failure.
                ndone=$(ls "$dir".done.* 2>/dev/null | wc -l)
                if [ "$ndone" -lt $((np - 1)) ]; then
                    echo "FAIL kind $kind victim $victim op $k: a rank hung"
                    failed=$((failed + 1))
                    continue
                fi
                stuck=$((stuck + 1))
                echo "kind $kind victim $victim op $k: every survivor returned; mpiexec did not end the job (timeout)"
            fi
            committed=0
            [ "$k" -gt "$before" ] && committed=1
            points=$((points + 1))
            if [ $st = 0 ]; then
                echo "FAIL kind $kind victim $victim op $k: job did not die"
                failed=$((failed + 1))
                continue
            fi
            if ! "$TEST_CRASH" check "$dir" "$kind" "$committed"; then
                echo "FAIL kind $kind victim $victim op $k/$ops (committed after op $before)"
                failed=$((failed + 1))
            fi
        done
        echo "kind $kind victim $victim: $ops operations, committed after op $before"
    done
done
rm -rf "$(dirname "$dir")"
echo "MPI crash points: $points run, $failed failed ($np ranks; mpiexec missed the victim's death $stuck times)"
[ $failed = 0 ] && echo "$points passed, 0 failed" || echo "$((points - failed)) passed, $failed failed"
[ $failed = 0 ]
