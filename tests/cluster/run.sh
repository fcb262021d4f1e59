#!/usr/bin/env bash
# Checkpoints on a cluster on one machine (scripts/cluster/cluster.sh).
#
#   run.sh --smoke PROG            ctest cluster.smoke (make check)
#   run.sh --full PROG [CASE...]   make reliability; cases: reshard readonce
#                                  tier cutsave cutload cutrepl (default: all)
#   run.sh --bench PROG OUT        make bench-cluster: the cluster_* figures
#                                  merged into OUT (bench/results.json)
#   run.sh --points PROG OUT N...  docs/SCALING.md's measured points (N nodes)
#
# PROG is tests/cluster/cluster_ckpt. Every case brings its own cluster up
# and down, and checks that nothing is left (cluster.sh check); a trap
# tears down on any exit. Its name and /24 come from PROG's path (t<hash>,
# 198.19.<hash>.0/24; u<hash> for the second cluster of the address test),
# so that build trees run side by side while a run killed in one tree is
# cleaned up by the next run there. Exit 0: passed; 1: failed (the first failure's line says why); 77:
# skipped (no root, iproute2, Open MPI or radosgw: cluster.sh says which).
set -u
set -o pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
C=$ROOT/scripts/cluster/cluster.sh
export DCP_CLUSTER_QUIET=1
mode=${1:-}
PROG=${2:-}
[ -n "$mode" ] && [ -x "$PROG" ] || { echo "usage: run.sh --smoke|--full|--bench PROG ..." >&2; exit 2; }
shift 2
LOG=$(mktemp -d /tmp/dcp-cluster-test-XXXXXX)
h=$(readlink -f "$PROG" | cksum | awk '{print $1}')
NM=t$(printf %x $((h % 0xfffffff)))
NM2=u${NM#t}
NET=198.19.$((h % 250 + 1))
export DCP_CLUSTER_NET=$NET
T0=/run/dcp-cluster/$NM/t0
S3=s3://dcp-cluster
failed=0

cleanup() {
    "$C" --name "$NM2" down >/dev/null 2>&1
    "$C" --name "$NM" down >/dev/null 2>&1
    rm -rf "$LOG"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

fail() { echo "FAIL: $*" >&2; failed=1; }
ok() { echo "ok: $*"; }
# must DESC CMD...: runs, fails the run (and returns 1) when CMD fails.
must() {
    local d=$1
    shift
    if "$@" > "$LOG/out" 2>&1; then
        return 0
    fi
    fail "$d: exit $? ($(grep -v '^\[' "$LOG/out" | grep 'FAIL\|WRONG\|^ok' | head -5 | tr '\n' ' ') $(tail -5 "$LOG/out" | tr '\n' ' '))"
    return 1
}
# mpi [cluster.sh mpirun options --] PROG ARGS: bounded, output in $LOG/out.
mpi() { timeout -k 5 "${MPI_TIMEOUT:-180}" "$C" --name "$NM" mpirun "$@"; }

up() {
    local rc
    "$C" --name "$NM" up "$@" > "$LOG/up" 2>&1
    rc=$?
    if [ $rc = 77 ]; then
        cat "$LOG/up" >&2
        exit 77
    fi
    [ $rc = 0 ] || { fail "up $*: $(tail -5 "$LOG/up" | tr '\n' ' ')"; return 1; }
}

down_checked() {
    "$C" --name "$NM" down > "$LOG/down" 2>&1 || fail "down: $(cat "$LOG/down" | tr '\n' ' ')"
    "$C" --name "$NM" check > "$LOG/check" 2>&1 || fail "left behind: $(cat "$LOG/check" | tr '\n' ' ')"
}

secs() { awk '{for (i = 1; i <= NF; i++) if ($i ~ /^s=/) print substr($i, 3)}' "$1" | tail -1; }
# mins FILE: min= of the last ok line (runs 2..n), else its s=
mins() { awk '{m = ""; for (i = 1; i <= NF; i++) { if ($i ~ /^s=/) s = substr($i, 3); if ($i ~ /^min=/) m = substr($i, 5) } } END { print (m != "" ? m : s) }' "$1"; }

# ---- bad input -------------------------------------------------------------

case_badinput() {
    local t rc pid
    "$C" --name "$NM" up 1 > "$LOG/b" 2>&1
    rc=$?
    [ $rc = 77 ] && { cat "$LOG/b" >&2; exit 77; }
    [ $rc = 2 ] || fail "up 1: exit $rc, wants 2 (usage)"
    "$C" --name "$NM" up 2 --net 8.8.8 > "$LOG/b" 2>&1
    [ $? = 2 ] && grep -q 'private or test range' "$LOG/b" || fail "a public --net not refused"
    "$C" --name "$NM" up 2 --node-rate fast > "$LOG/b" 2>&1
    [ $? = 2 ] || fail "a bad rate not refused"
    "$C" --name "$NM" up 2 --queue 0 > "$LOG/b" 2>&1
    [ $? = 2 ] || fail "a bad --queue not refused"
    # a node that never comes up: error naming it, everything removed
    t=$SECONDS
    DCP_CLUSTER_FAULT=hang:n1 "$C" --name "$NM" up 3 --no-store --node-timeout 2 > "$LOG/b" 2>&1
    rc=$?
    [ $rc = 1 ] && grep -q 'node n1 did not come up within 2 s' "$LOG/b" ||
        fail "a node that never comes up: exit $rc, $(cat "$LOG/b" | tr '\n' ' ')"
    [ $((SECONDS - t)) -le 20 ] || fail "a node that never comes up took $((SECONDS - t)) s"
    "$C" --name "$NM" check > "$LOG/c" 2>&1 || fail "after a failed bring-up: $(cat "$LOG/c" | tr '\n' ' ')"
    # a storage node that does not come up in time
    "$C" --name "$NM" up 2 --store-timeout 1 > "$LOG/b" 2>&1
    rc=$?
    [ $rc = 77 ] && { cat "$LOG/b" >&2; exit 77; }
    [ $rc = 1 ] && grep -q 'radosgw did not come up within 1 s' "$LOG/b" ||
        fail "a store that never comes up: exit $rc, $(cat "$LOG/b" | tr '\n' ' ')"
    "$C" --name "$NM" check > "$LOG/c" 2>&1 || fail "after a failed store: $(cat "$LOG/c" | tr '\n' ' ')"
    ok "bad input: N out of range, a public range, a bad rate, a node and a store that never come up ($((SECONDS - t)) s, nothing left)"
    # leftovers of a killed run: kill -9 a bring-up half way, then up again
    DCP_CLUSTER_FAULT=hang:n1 "$C" --name "$NM" up 3 --no-store --node-timeout 60 > "$LOG/b" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do [ -f /run/dcp-cluster/$NM/n0.pid ] && break; sleep 0.1; done
    sleep 0.3
    kill -KILL $pid
    wait $pid 2>/dev/null
    "$C" --name "$NM" check > "$LOG/c" 2>&1 && fail "a killed bring-up left nothing (the test did not kill it half way)"
    DCP_CLUSTER_QUIET= "$C" --name "$NM" up 2 --no-store > "$LOG/b" 2>&1 ||
        fail "up after a killed run: $(cat "$LOG/b" | tr '\n' ' ')"
    grep -q "removing what an earlier run of $NM left" "$LOG/b" ||
        fail "up after a killed run did not say it removed leftovers"
    [ "$("$C" --name "$NM" nodes)" = "n0 n1" ] || fail "after leftovers: nodes '$("$C" --name "$NM" nodes)'"
    # addresses taken: a second cluster on the same range is refused, the
    # first one untouched
    "$C" --name "$NM2" up 2 --no-store > "$LOG/b" 2>&1
    rc=$?
    [ $rc = 1 ] && grep -q "addresses of $NET.0/24 already taken" "$LOG/b" ||
        fail "addresses taken: exit $rc, $(cat "$LOG/b" | tr '\n' ' ')"
    "$C" --name "$NM2" check > "$LOG/c" 2>&1 || fail "refused cluster left: $(cat "$LOG/c" | tr '\n' ' ')"
    [ "$("$C" --name "$NM" nodes)" = "n0 n1" ] || fail "the first cluster was disturbed"
    # a launch agent failing: mpirun fails, bounded
    t=$SECONDS
    DCP_CLUSTER_FAULT=agent:n1 MPI_TIMEOUT=60 mpi -- "$PROG" save /tmp/none 1 1 > "$LOG/b" 2>&1
    rc=$?
    [ $rc != 0 ] && [ $rc != 124 ] && [ $rc != 137 ] || fail "a failing launch agent: exit $rc"
    ok "leftovers of a killed run removed, addresses taken refused, a failing launch agent fails mpirun (exit $rc, $((SECONDS - t)) s)"
    down_checked
}

# ---- smoke -----------------------------------------------------------------

case_smoke() {
    up 2 --node-rate 1gbit --store-rate 500mbit || return 1
    # isolation: each node its own network namespace, hostname and tmpfs
    "$C" --name "$NM" exec n0 sh -c "echo x > $T0/only-n0" || fail "write into n0's tier 0"
    [ ! -e "$T0/only-n0" ] || fail "n0's tier 0 is visible on the host"
    "$C" --name "$NM" exec n1 test ! -e "$T0/only-n0" || fail "n0's tier 0 is visible on n1"
    local a b
    a=$("$C" --name "$NM" exec n0 sh -c 'echo $(hostname) $(readlink /proc/self/ns/net)')
    b=$("$C" --name "$NM" exec n1 sh -c 'echo $(hostname) $(readlink /proc/self/ns/net)')
    [ "${a%% *}" = n0 ] && [ "${b%% *}" = n1 ] && [ "${a#* }" != "${b#* }" ] &&
        [ "${a#* }" != "$(readlink /proc/self/ns/net)" ] || fail "namespaces: '$a' '$b'"
    ok "nodes isolated (hostnames, network namespaces, tier 0 private)"
    must "save 2 ranks on 2 nodes to S3" mpi -- "$PROG" save $S3/smoke 16 1 60 &&
        ok "$(cat "$LOG/out")"
    must "load on 1 rank (n1)" mpi --nodes n1 -- "$PROG" load $S3/smoke 16 1 shard 60 &&
        ok "$(cat "$LOG/out")"
    must "replicated load, read once, 2x2 ranks" mpi --per-node 2 -- "$PROG" load $S3/smoke 16 1 readonce 60 &&
        ok "$(cat "$LOG/out")"
    must "tier-0 save, replicas 1" mpi -- "$PROG" tier-save $T0 $S3/smoke-t1 16 3 1 &&
        ok "$(cat "$LOG/out")"
    "$C" --name "$NM" kill n1 > /dev/null 2>&1 || fail "kill n1"
    must "tier-0 restore on n0 after n1 destroyed" mpi -- "$PROG" tier-restore $T0 $S3/smoke-t1 16 3 0 &&
        ok "$(cat "$LOG/out")"
    down_checked
}

# ---- full ------------------------------------------------------------------

case_reshard() {
    up 4 --node-rate 1gbit --store-rate 500mbit || return 1
    must "save 4 nodes x 1 to S3" mpi -- "$PROG" save $S3/rs 128 7 120 && ok "4 -> S3: $(cat "$LOG/out")"
    must "load on 3 nodes x 1" mpi --nodes n0,n1,n2 -- "$PROG" load $S3/rs 128 7 shard 120 &&
        ok "S3 -> 3: $(cat "$LOG/out")"
    must "load on 4 nodes x 2" mpi --per-node 2 -- "$PROG" load $S3/rs 128 7 shard 120 &&
        ok "S3 -> 8: $(cat "$LOG/out")"
    must "load on 2 nodes (n1, n3)" mpi --nodes n1,n3 -- "$PROG" load $S3/rs 128 7 shard 120 &&
        ok "S3 -> 2: $(cat "$LOG/out")"
    must "save 2 nodes x 2" mpi --nodes n2,n3 --per-node 2 -- "$PROG" save $S3/rs2 64 8 120 &&
        must "load 4 nodes x 1" mpi -- "$PROG" load $S3/rs2 64 8 shard 120 && ok "2x2 -> 4x1: $(cat "$LOG/out")"
    down_checked
}

case_readonce() {
    up 4 --node-rate 1gbit --store-rate 400mbit || return 1
    must "save" mpi -- "$PROG" save $S3/ro 64 4 120 || return 1
    must "replicated load, read once" mpi -- "$PROG" load $S3/ro 64 4 readonce 120 || return 1
    local t1 t2
    t1=$(secs "$LOG/out")
    must "replicated load, per rank" mpi -- "$PROG" load $S3/ro 64 4 perrank 120 || return 1
    t2=$(secs "$LOG/out")
    ok "replicated load of 64 MiB on 4 nodes x 1, store link 400mbit: read once ${t1} s, per rank ${t2} s (x$(awk -v a="$t1" -v b="$t2" 'BEGIN{printf "%.2f", b/a}'))"
    down_checked
}

case_tier() {
    up 4 --node-rate 1gbit --store-rate 400mbit || return 1
    must "tier save step 1" mpi -- "$PROG" tier-save $T0 $S3/tier 64 1 1 || return 1
    must "tier save step 2" mpi -- "$PROG" tier-save $T0 $S3/tier 64 2 1 || return 1
    local n f
    for n in n0 n1 n2 n3; do
        f=$("$C" --name "$NM" exec $n sh -c "ls $T0/$n/step-2 | grep -c distcp")
        [ "$f" = 2 ] || fail "$n holds $f data files of step 2, wants 2 (own + a partner's)"
    done
    "$C" --name "$NM" kill n2 > /dev/null 2>&1 || fail "kill n2"
    must "restore on n0, n1, n3 (3 ranks) from tier 0" mpi --nodes n0,n1,n3 -- \
        "$PROG" tier-restore $T0 $S3/tier 64 2 0 && ok "node n2 destroyed, $(cat "$LOG/out")"
    # n2's file came to the nodes that read it, over the network
    f=$("$C" --name "$NM" exec n1 sh -c "ls $T0/n1/step-2 | grep -c distcp")
    [ "${f:-0}" -ge 3 ] && ok "n1 received the lost node's file ($f data files now)" ||
        fail "n1 holds $f data files after the restore"
    must "restore on 2 ranks (n1, n3)" mpi --nodes n1,n3 -- "$PROG" tier-restore $T0 $S3/tier 64 2 0 &&
        ok "$(cat "$LOG/out")"
    must "tier 1 (S3) holds step 2" mpi --nodes n0,n1,n3 -- "$PROG" load $S3/tier/step-2 64 2 shard 120 &&
        ok "tier 1: $(cat "$LOG/out")"
    down_checked
}

# After n1 was cut: waits (up to the timeout + 30 s) for the 3 survivors'
# FAIL lines in $LOG/cut (or an ok line), ends the run ($1: its pid) and
# n1; sets the caller's t (seconds from the cut) and n (FAIL lines).
survivors_after_cut() {
    local pid=$1 tmo=$2 tcut=$SECONDS
    while [ "$(grep -c ': FAIL ' "$LOG/cut")" -lt 3 ] && [ $((SECONDS - tcut)) -lt $((tmo + 30)) ]; do
        grep -q '^ok ' "$LOG/cut" && break
        sleep 0.2
    done
    t=$((SECONDS - tcut))
    kill -TERM "$pid" 2>/dev/null
    "$C" --name "$NM" kill n1 > /dev/null 2>&1
    wait "$pid" 2>/dev/null
    n=$(grep -c ': FAIL ' "$LOG/cut")
}

# cut_case save|load: a node cut off (link down, frozen) mid-operation; every
# survivor fails with the same error within the timeout, nothing committed,
# the previous checkpoint loads.
cut_case() {
    local what=$1 tmo=10 mib=96 t n
    up 4 --node-rate 1gbit --store-rate 200mbit || return 1
    must "save step 1" mpi -- "$PROG" save $S3/cut 48 1 60 || return 1
    if [ "$what" = load ]; then
        must "save step 2" mpi -- "$PROG" save $S3/cut $mib 2 60 || return 1
        set -- "$PROG" load $S3/cut $mib 2 shard $tmo
    else
        set -- "$PROG" save $S3/cut $mib 2 $tmo
    fi
    timeout -k 5 120 "$C" --name "$NM" mpirun -- --mca orte_abort_on_non_zero_status 0 "$@" \
        > "$LOG/cut" 2>&1 &
    local pid=$!
    sleep 1.5
    "$C" --name "$NM" cut n1 > /dev/null 2>&1 || fail "cut n1"
    survivors_after_cut "$pid" "$tmo"
    local errs msgs
    errs=$(grep ': FAIL ' "$LOG/cut" | awk '{print $5}' | tr -d : | sort -u | tr '\n' ' ')
    msgs=$(grep ': FAIL ' "$LOG/cut" | sed 's/^rank [0-9]*: //' | sort -u | wc -l)
    grep -q '^ok ' "$LOG/cut" && fail "$what finished before the cut (too fast to test)"
    if [ "$n" = 3 ] && [ "$msgs" = 1 ] && [ $t -le $((tmo + 15)) ]; then
        ok "$what: n1 cut off 1.5 s in; the 3 survivors failed with the same error (${errs% }, same message) $t s after the cut (timeout $tmo s)"
        grep ': FAIL ' "$LOG/cut" | sed 's/^/    /' | cut -c1-200
    else
        fail "$what cut off: $n survivors failed ($errs; $msgs distinct messages) in $t s: $(grep -v '^\[' "$LOG/cut" | head -8 | tr '\n' ' ')"
    fi
    # nothing committed: the previous checkpoint loads on the survivors
    local want=1
    [ "$what" = load ] && want=2
    must "the checkpoint loads on the survivors" mpi --nodes n0,n2,n3 -- \
        "$PROG" load $S3/cut $([ $want = 1 ] && echo 48 || echo $mib) $want shard 60 &&
        ok "survivors load step $want: $(cat "$LOG/out")"
    down_checked
}
# cutrepl: a partner node cut off (link down, frozen) while the replicas of
# a tier-0 step stream to it: every survivor fails with the same error
# within the timeout, the step is not counted replicated
# (dcp_tier_replicated stays at the previous step), and after the node is
# gone the previous replicated step restores from tier 0 on the survivors
# (the lost node's files from its partner's replicas).
case_cutrepl() {
    local tmo=10 mib=96 t n pid tmp=""
    # node links 100mbit: the 24 MiB replica of each node's file (and its
    # drain to S3, over the same link) take seconds, so the cut lands
    # while they stream
    up 4 --node-rate 100mbit --store-rate 200mbit || return 1
    # steps 1 and 2 in one process (dcp_tier_replicated is the stack's):
    # step 1 saved, replicated and drained, then step 2
    timeout -k 5 120 "$C" --name "$NM" mpirun -- --mca orte_abort_on_non_zero_status 0 \
        "$PROG" tier-save $T0 $S3/cr $mib 1-2 1 $tmo > "$LOG/cut" 2>&1 &
    pid=$!
    # n1 is n0's partner: cut it once a replica of step 2 is being written
    # into its tier 0 (a temporary in its step-2)
    t=$SECONDS
    while [ $((SECONDS - t)) -lt 60 ] && ! grep -q '^ok \|: FAIL ' "$LOG/cut"; do
        tmp=$("$C" --name "$NM" exec n1 sh -c "ls -a $T0/n1/step-2 2>/dev/null | grep '\.tmp\$'" 2>/dev/null | head -1)
        [ -n "$tmp" ] && break
        sleep 0.05
    done
    [ -n "$tmp" ] || fail "no replica of step 2 streaming into n1 seen ($(head -3 "$LOG/cut" | tr '\n' ' '))"
    "$C" --name "$NM" cut n1 > /dev/null 2>&1 || fail "cut n1"
    survivors_after_cut "$pid" "$tmo"
    local errs reps
    errs=$(grep ': FAIL ' "$LOG/cut" | awk '{print $5}' | tr -d : | sort -u | tr '\n' ' ')
    reps=$(grep ': FAIL ' "$LOG/cut" | grep -o 'replicated=[-0-9]*' | sort -u | tr '\n' ' ')
    grep -q '^ok ' "$LOG/cut" && fail "the replication ended before the cut (too fast to test)"
    if [ "$n" = 3 ] && [ "${errs% }" = DCP_ETIMEOUT ] && [ "${reps% }" = replicated=1 ] &&
        [ $t -le $((tmo + 15)) ]; then
        ok "n1 cut off while '$tmp' streamed into it: the 3 survivors failed with ${errs% } $t s after the cut (timeout $tmo s), step 2 not counted replicated (${reps% }: step 1's)"
        grep ': FAIL ' "$LOG/cut" | sed 's/^/    /' | cut -c1-220
    else
        fail "replication cut off: $n survivors failed ($errs; $reps) in $t s: $(grep -v '^\[' "$LOG/cut" | head -8 | tr '\n' ' ')"
    fi
    # n1 gone: step 2 lacks n1's file on every survivor (its replica never
    # landed on n2), so the restore takes step 1, n1's file from n2's replica
    must "the previous replicated step restores on the survivors" mpi --nodes n0,n2,n3 -- \
        "$PROG" tier-restore $T0 $S3/cr $mib 1 0 &&
        ok "survivors restore step 1 from tier 0: $(cat "$LOG/out")"
    down_checked
}
case_cutsave() { cut_case save; }
case_cutload() { cut_case load; }

# ---- bench -----------------------------------------------------------------

# warm DESC MODE ARGS...: 4 runs in one process (4 nodes x 1): the median
# seconds of runs 2..4 (the first pays the process's cold start).
warm() {
    local d=$1
    shift
    CLUSTER_CKPT_RUNS=4 must "$d" mpi -- -x CLUSTER_CKPT_RUNS "$PROG" "$@" 120 || return 1
    secs "$LOG/out"
    echo "$d: $(cat "$LOG/out")" >&2
}

bench() {
    # save/load: 256 MiB on 4 nodes x 1 rank, 4 times in one process, the
    # median of runs 2..4 (the first pays connections and the plan); read
    # once: 64 MiB replicated, likewise; tier restore: 128 MiB, replicas 1,
    # one of 4 nodes destroyed, one run each way; then the saves again on a
    # cluster whose tbf queues hold 200 ms instead of 50.
    local out=$1 nrate=1gbit srate=400mbit mib=256 ro=64 tmib=128
    local sb
    sb=$(awk -v r="${srate%mbit}" 'BEGIN{print r * 1e6 / 8}')
    up 4 --node-rate $nrate --store-rate $srate || return 1
    local s l r p t0r t1r
    must "bench save" mpi -- "$PROG" save $S3/b 16 0 120 || return 1   # warm-up
    local sm lm
    s=$(warm "bench save" save $S3/b $mib 1) || return 1
    sm=$(mins "$LOG/out")
    # packets the store link's queue dropped (its switch port: the data
    # into the store), the warm-up and the 4 saves
    local sdrop
    sdrop=$(tc -n "$NM-sw" -s qdisc show dev pst | grep -o 'dropped [0-9]*' | head -1 | awk '{print $2}')
    l=$(warm "bench load" load $S3/b $mib 1 shard) || return 1
    lm=$(mins "$LOG/out")
    must "bench save ro" mpi -- "$PROG" save $S3/ro $ro 1 120 || return 1
    r=$(warm "bench readonce" load $S3/ro $ro 1 readonce) || return 1
    p=$(warm "bench perrank" load $S3/ro $ro 1 perrank) || return 1
    must "bench tier save" mpi -- "$PROG" tier-save $T0 $S3/bt $tmib 1 1 || return 1
    "$C" --name "$NM" kill n3 > /dev/null 2>&1 || fail "kill n3"
    must "bench tier restore" mpi --nodes n0,n1,n2 -- "$PROG" tier-restore $T0 $S3/bt $tmib 1 0 || return 1
    t0r=$(secs "$LOG/out")
    must "bench s3 restore" mpi --nodes n0,n1,n2 -- "$PROG" load $S3/bt/step-1 $tmib 1 shard 120 || return 1
    t1r=$(secs "$LOG/out")
    down_checked
    # the same saves with the links' tbf queue at 200 ms instead of 50: the
    # store link's drops (and the part uploads waiting in TCP retransmission
    # timeouts) gone, what the save reaches (bench/RESULTS.md)
    local s2 sm2 sdrop2
    up 4 --node-rate $nrate --store-rate $srate --queue 200 || return 1
    must "bench save, queue 200 ms" mpi -- "$PROG" save $S3/b 16 0 120 || return 1
    s2=$(warm "bench save, queue 200 ms" save $S3/b $mib 1) || return 1
    sm2=$(mins "$LOG/out")
    sdrop2=$(tc -n "$NM-sw" -s qdisc show dev pst | grep -o 'dropped [0-9]*' | head -1 | awk '{print $2}')
    down_checked
    local bytes=$((mib << 20))
    awk -v s="$s" -v l="$l" -v r="$r" -v p="$p" -v a="$t0r" -v b="$t1r" -v by=$bytes \
        -v s2="$s2" -v sm2="$sm2" -v d1="${sdrop:-0}" -v d2="${sdrop2:-0}" \
        -v sm="$sm" -v lm="$lm" -v lb="$sb" -v mib=$mib -v ro=$ro -v tmib=$tmib -v nr=$nrate -v sr=$srate 'BEGIN {
        printf "  \"cluster_readonce_speedup\": {\"value\": %.3f, \"unit\": \"x per-rank reads\", \"readonce_s\": %.3f, \"perrank_s\": %.3f, \"mib\": %d, \"nodes\": 4, \"ranks_per_node\": 1, \"node_rate\": \"%s\", \"store_rate\": \"%s\"},\n", p / r, r, p, ro, nr, sr
        printf "  \"cluster_tier_restore_vs_s3\": {\"value\": %.3f, \"unit\": \"x S3 load\", \"tier0_s\": %.3f, \"s3_s\": %.3f, \"mib\": %d, \"nodes\": \"4 saved, 3 restore\", \"replicas\": 1, \"node_rate\": \"%s\", \"store_rate\": \"%s\"},\n", b / a, a, b, tmib, nr, sr
        printf "  \"cluster_save_vs_link\": {\"value\": %.3f, \"unit\": \"x store link\", \"save_s\": %.3f, \"best\": %.3f, \"mbps\": %.1f, \"link_mbps\": %.1f, \"mib\": %d, \"nodes\": 4, \"store_rate\": \"%s\", \"queue_ms\": 50, \"drops\": %d, \"queue200_value\": %.3f, \"queue200_save_s\": %.3f, \"queue200_best\": %.3f, \"queue200_drops\": %d},\n", by / s / lb, s, by / sm / lb, by / s / 1e6, lb / 1e6, mib, sr, d1, by / s2 / lb, s2, by / sm2 / lb, d2
        printf "  \"cluster_load_vs_link\": {\"value\": %.3f, \"unit\": \"x store link\", \"load_s\": %.3f, \"best\": %.3f, \"mbps\": %.1f, \"link_mbps\": %.1f, \"mib\": %d, \"nodes\": 4, \"store_rate\": \"%s\"}\n", by / l / lb, l, by / lm / lb, by / l / 1e6, lb / 1e6, mib, sr
    }' > "$LOG/entries"
    cat "$LOG/entries"
    # merged into OUT (bench/results.json): these keys replaced or added
    python3 - "$out" "$LOG/entries" <<'PY' || fail "cannot merge into $out"
import json, os, sys
out, frag = sys.argv[1], sys.argv[2]
d = json.load(open(out)) if os.path.exists(out) else {}
d.update(json.loads("{" + open(frag).read() + "}"))
tmp = out + ".tmp"
with open(tmp, "w") as f:  # the file's own layout: one entry a line
    f.write("{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}"
                                for k, v in d.items()) + "\n}\n")
os.replace(tmp, out)
PY
}

# ---- points: the measured points of docs/SCALING.md ---------------------

# points OUT N...: for each N, N nodes x 1 rank (node links 1gbit, store
# 400mbit): save and load of 128 MiB and of 8 MiB (the fixed costs), the
# replicated load of 32 MiB read once and per rank (warm: median of runs
# 2..4), tier-0 saves of 64 and 8 MiB with replicas 1 (3 of each, and 3
# of each more for the uncapped restores), node n<N-1> destroyed and the
# restores on the N-1 others (each a fresh process, as a restart: median
# of 3 of each size), then the same with the node links uncapped (the
# copies' limit when the links are not: the machine's cores). One JSON
# object a line into OUT.
points() {
    local out=$1 n
    shift
    : > "$out"
    for n in "$@"; do
        local sv ld ss ls ro pr tr
        up $n --node-rate 1gbit --store-rate 400mbit || return 1
        must "points save warm-up" mpi -- "$PROG" save $S3/p 8 0 120 || return 1
        local mn=""
        sv=$(warm "save 128, $n nodes" save $S3/p 128 1) || return 1
        mn+=", \"save_128_min\": $(mins "$LOG/out")"
        ld=$(warm "load 128, $n nodes" load $S3/p 128 1 shard) || return 1
        mn+=", \"load_128_min\": $(mins "$LOG/out")"
        ss=$(warm "save 8, $n nodes" save $S3/q 8 1) || return 1
        mn+=", \"save_8_min\": $(mins "$LOG/out")"
        ls=$(warm "load 8, $n nodes" load $S3/q 8 1 shard) || return 1
        mn+=", \"load_8_min\": $(mins "$LOG/out")"
        must "save 32" mpi -- "$PROG" save $S3/r 32 1 120 || return 1
        ro=$(warm "read once 32, $n nodes" load $S3/r 32 1 readonce) || return 1
        mn+=", \"readonce_32_min\": $(mins "$LOG/out")"
        pr=$(warm "per rank 32, $n nodes" load $S3/r 32 1 perrank) || return 1
        mn+=", \"perrank_32_min\": $(mins "$LOG/out")"
        # tier-0 steps of 64 and 8 MiB, each in its own roots (a restore
        # copies the files a node lacks into it: each restore needs its own)
        local k m
        for k in 1 2 3 u1 u2 u3; do
            for m in 64 8; do
                must "tier save $m ($k)" mpi -- "$PROG" tier-save $T0/t$m$k $S3/t$m$k $m 1 1 || return 1
            done
        done
        "$C" --name "$NM" kill n$((n - 1)) > /dev/null 2>&1 || fail "kill n$((n - 1))"
        local live i r
        live=$(seq -s, -f 'n%g' 0 $((n - 2)))
        declare -A tt=()
        for k in 1 2 3 u1 u2 u3; do
            if [ $k = u1 ]; then  # the node links uncapped from here on
                for ((i = 0; i < n - 1; i++)); do
                    "$C" --name "$NM" rate n$i none > /dev/null 2>&1 || fail "rate n$i none"
                done
            fi
            for m in 8 64; do
                must "tier restore $m ($k)" mpi --nodes "$live" -- "$PROG" tier-restore $T0/t$m$k $S3/t$m$k $m 1 0 || return 1
                r=${k%[0-9]}
                tt[$r$m]+="${tt[$r$m]:+,}$(secs "$LOG/out")"
            done
        done
        down_checked
        med() { echo "$1" | tr , '\n' | sort -g | sed -n 2p; }
        local tj="\"tier_restore_64_s\": $(med "${tt[64]}"), \"tier_restore_8_s\": $(med "${tt[8]}"), \"tier_restore_64_runs\": [${tt[64]}], \"tier_restore_8_runs\": [${tt[8]}], \"tier_uncapped_64_s\": $(med "${tt[u64]}"), \"tier_uncapped_8_s\": $(med "${tt[u8]}"), \"tier_uncapped_64_runs\": [${tt[u64]}], \"tier_uncapped_8_runs\": [${tt[u8]}]"
        echo "{\"nodes\": $n, \"save_128_s\": $sv, \"load_128_s\": $ld, \"save_8_s\": $ss, \"load_8_s\": $ls, \"readonce_32_s\": $ro, \"perrank_32_s\": $pr, $tj$mn, \"node_rate\": \"1gbit\", \"store_rate\": \"400mbit\"}" | tee -a "$out"
    done
}

case "$mode" in
--smoke)
    t=$SECONDS
    case_badinput
    case_smoke
    echo "cluster smoke: $([ $failed = 0 ] && echo passed || echo FAILED) in $((SECONDS - t)) s" ;;
--full)
    cases=${*:-reshard readonce tier cutsave cutload cutrepl}
    for c in $cases; do
        t=$SECONDS
        echo "== $c"
        before=$failed
        failed=0
        "case_$c"
        echo "== $c: $([ $failed = 0 ] && echo passed || echo FAILED) ($((SECONDS - t)) s)"
        [ $failed = 0 ] && failed=$before
    done ;;
--bench) bench "${1:?run.sh --bench PROG OUT}" ;;
--points) points "${1:?run.sh --points PROG OUT N...}" "${@:2}" ;;
*) echo "run.sh: unknown mode $mode" >&2; exit 2 ;;
esac
[ $failed = 0 ]
