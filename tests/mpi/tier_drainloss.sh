#!/usr/bin/env bash
# A node lost at every phase of the drain (label tier, fault): 4 ranks as
# nodes n0 (ranks 0, 1) and n1 (ranks 2, 3), replicas R (0 or 1): step 1
# saved and drained, then step 2 saved and killed (SIGKILL from inside
# rank V at phase P; mpiexec ends the job), in its save:
#   spread    step 2 committed in tier 0, its .metadata in n0 only
#   replicate (replicas 1) .metadata in both nodes, no replica sent
# or in its drain:
#   start     step 2 committed in tier 0, its replication begun (replicas
#             land at the next collective call), drain not started
#   data0     before the victim's first chunk to tier 1
#   data1     mid-copy: before its second chunk
#   prune0    the node's files copied, before the tier-0 retention
#   metadata  rank 0: every data file in tier 1, before .metadata
#   committed rank 0: tier 1's .metadata published, before lock release
#   prune1    rank 0: before tier 1's retention drops step 1
# Each killed state is copied, nodes lost (none, one: the victim's, all:
# n0 and n1, their directories deleted) and restarted on 4, 3 or 2 ranks
# (`mpi_tier dcheck`): step 2 from tier 0 when every node survived or one
# replica covers the lost node (killed in the save: step 1, replicated),
# else tier 1's newest complete step (2 only after its commit), bit-exact,
# never a mix; then step 2 saves again and a step 3 saves, drains and
# restores. One row per restart.
#   tier_drainloss.sh          the quick matrix (ctest: every phase once)
#   tier_drainloss.sh --full   every phase x victim x replicas x loss x
#                              world size (make reliability)
# Environment: MPIEXEC (the launcher and its -n flag), MPI_TIER.
set -u
export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-0}
: "${MPIEXEC:?}" "${MPI_TIER:?}"
full=0
[ "${1:-}" = --full ] && full=1
top=$(mktemp -d /tmp/dcp-mpi-tierdl-XXXXXX)
kills=0
rows=0
failed=0
bad=0

# kill R P V: the killed state of replicas R, phase P, victim V in
# $top/base; 0 when the victim died there.
kill_at() {
    rm -rf "$top/base"
    timeout -k 5 60 $MPIEXEC 4 "$MPI_TIER" dkill "$top/base" "$1" "$2" "$3" \
        </dev/null >"$top/kill.log" 2>&1
    if [ $? = 0 ]; then
        echo "FAIL replicas $1 phase $2 victim $3: phase never reached"
        cat "$top/kill.log"
        failed=$((failed + 1))
        return 1
    fi
    kills=$((kills + 1))
    return 0
}

# check R P V LOST N: one restart of the killed state, one row.
check() {
    rm -rf "$top/c"
    cp -a "$top/base" "$top/c"
    rows=$((rows + 1))
    local row="phase=$2 victim=$3 replicas=$1 lost=$4 ranks=$5"
    if timeout -k 5 60 $MPIEXEC "$5" "$MPI_TIER" dcheck "$top/c" "$1" "$2" \
        "$3" "$4" </dev/null >"$top/check.log" 2>&1; then
        echo "$row: $(grep -m1 '^restored' "$top/check.log"), ok"
    else
        echo "$row: FAIL"
        bad=$((bad + 1))
        cat "$top/check.log"
        failed=$((failed + 1))
    fi
}

if [ $full = 1 ]; then
    for rep in 0 1; do
        for pv in spread:0 spread:2 replicate:0 replicate:3 start:0 \
            start:3 data0:0 data0:3 data1:0 data1:1 data1:2 data1:3 \
            prune0:0 prune0:2 metadata:0 committed:0 prune1:0; do
            p=${pv%:*}
            v=${pv#*:}
            [ "$p" = replicate ] && [ $rep = 0 ] && continue
            kill_at $rep "$p" "$v" || continue
            for lost in none one all; do
                for n in 4 3 2; do
                    check $rep "$p" "$v" $lost $n
                done
            done
        done
    done
else
    # Every phase once, each loss pattern and world size at least once.
    while read -r rep p v lost n; do
        kill_at "$rep" "$p" "$v" && check "$rep" "$p" "$v" "$lost" "$n"
    done <<'EOF'
0 spread 0 none 3
1 replicate 3 one 2
1 start 3 one 4
0 data0 1 one 3
1 data1 3 one 3
1 prune0 2 all 4
0 metadata 0 one 4
0 committed 0 one 2
1 prune1 0 all 3
EOF
fi
rm -rf "$top"
echo "tier drain node-loss: $kills kill points, $rows restarts," \
    "$((rows - bad)) passed, $failed failed"
[ $failed = 0 ] && [ $rows -ge 9 ]
