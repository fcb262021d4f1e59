#!/usr/bin/env bash
# A cluster on one machine (issue 30): nodes as namespaces, storage behind
# capped links. Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN), iproute2,
# util-linux (unshare, nsenter); Open MPI for `mpirun`; Debian's ceph-mon,
# ceph-osd, radosgw for the storage node (scripts/deps.sh). docs/CLUSTER.md.
#
#   cluster.sh [--name NAME] up N [--node-rate R] [--store-rate R]
#              [--net A.B.C] [--tier0-size SIZE] [--no-store]
#              [--node-timeout S] [--store-timeout S] [--memstore BYTES]
#              [--queue MS]
#   cluster.sh [--name NAME] down          everything removed, then checked
#   cluster.sh [--name NAME] check         exit 1 naming what is left
#   cluster.sh [--name NAME] exec NODE CMD...   CMD inside NODE
#   cluster.sh [--name NAME] mpirun [--nodes n0,n1,..] [--per-node K] -- PROG ARGS...
#   cluster.sh [--name NAME] kill NODE     destroy NODE: processes, tmpfs, namespaces
#   cluster.sh [--name NAME] cut NODE      link down, its processes frozen (SIGSTOP)
#   cluster.sh [--name NAME] rate NODE R   change NODE's link cap (st: the store's)
#   cluster.sh [--name NAME] nodes | env   live compute nodes | the nodes' environment
#   cluster.sh agent HOST CMD              Open MPI's launch agent (agent.sh)
#
# NAME: [a-z][a-z0-9]{0,7} (default dcpc, or $DCP_CLUSTER_NAME). Nodes n0..n<N-1>
# (2..8) and st (storage). Each node: a network namespace NAME-nI holding eth0
# (address A.B.C.(10+I)/24) joined by a veth pair to the bridge of the switch
# namespace NAME-sw; a mount + UTS namespace (hostname nI, /etc/hosts naming
# the nodes) held by one process, with a tmpfs of its own mounted on
# $STATE/t0 (the node's tier 0: no other node, nor the host, sees it). The
# storage node NAME-st (A.B.C.2) runs radosgw (tests/s3/rgw_server.py)
# serving the bucket dcp-cluster. Rates R are tc rates (1gbit, 200mbit, ...,
# or none): a tbf on both ends of each node's link (egress of the node's
# eth0 and of its switch port); --node-rate for the compute nodes,
# --store-rate for the storage node; --queue MS (50) the tbf's queue, in
# time at the rate (a tail-drop queue). A.B.C defaults to $DCP_CLUSTER_NET, else
# 198.18.30 (RFC 2544's benchmarking range, 198.18.0.0/15); no namespace has
# a route beyond its
# /24, and nothing is ever addressed in the host's own namespace.
#
# State: /run/dcp-cluster/NAME/ (pids, env, store), and a ledger
# /run/dcp-cluster/NAME.ledger of the namespaces' inodes and the run's
# token, kept until `down` verified that nothing is left. `up` first removes
# whatever a killed run left under NAME. Every step is bounded: a node that
# does not come up within --node-timeout (10 s), a store within
# --store-timeout (150 s), fail the bring-up with a message naming it, and
# everything made so far is removed (exit 1). Exit 2: usage; 77: no
# privileges or software (callers skip).
set -u
set -o pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")
HERE=$(dirname "$SELF")
ROOT=$(readlink -f "$HERE/../..")
RUNDIR=/run/dcp-cluster
NAME=${DCP_CLUSTER_NAME:-dcpc}
T=timeout
KILL_WAIT=10

die() { echo "cluster: $*" >&2; exit 1; }
usage() { sed -n '2,20p' "$SELF" >&2; exit 2; }
say() { [ -n "${DCP_CLUSTER_QUIET:-}" ] || echo "cluster: $*" >&2; }

if [ "${1:-}" = --name ]; then
    [ $# -ge 2 ] || usage
    NAME=$2
    shift 2
fi
[[ $NAME =~ ^[a-z][a-z0-9]{0,7}$ ]] || { echo "cluster: bad name '$NAME' ([a-z][a-z0-9]{0,7})" >&2; exit 2; }
STATE=$RUNDIR/$NAME
LEDGER=$RUNDIR/$NAME.ledger

# ---- helpers -------------------------------------------------------------

need_tools() {
    local t
    for t in ip tc nsenter unshare timeout; do
        command -v $t >/dev/null 2>&1 || { echo "cluster: SKIP, no $t (scripts/deps.sh installs it)" >&2; exit 77; }
    done
    if [ "$(id -u)" != 0 ]; then
        echo "cluster: SKIP, needs root (network and mount namespaces)" >&2
        exit 77
    fi
}

# ns_list: this cluster's network namespaces.
ns_list() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$NAME-(sw|st|n[0-9]+)\$" || true; }

# rate_bytes R: bytes per second of a tc rate (bit, kbit, mbit, gbit, bps...).
rate_bytes() {
    awk -v r="$1" 'BEGIN {
        n = r + 0; u = tolower(substr(r, length(n "") + 1));
        m["bit"]=1/8; m["kbit"]=1e3/8; m["mbit"]=1e6/8; m["gbit"]=1e9/8;
        m["bps"]=1; m["kbps"]=1e3; m["mbps"]=1e6; m["gbps"]=1e9;
        if (n <= 0 || !(u in m)) { print 0; exit }
        printf "%.0f\n", n * m[u] }'
}

# shape NS DEV RATE: a tbf on DEV's egress (RATE none: no qdisc).
shape() {
    local ns=$1 dev=$2 rate=$3 b burst
    if [ "$rate" = none ]; then
        $T 5 tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null || true
        return 0
    fi
    b=$(rate_bytes "$rate")
    [ "$b" -gt 0 ] || die "bad rate '$rate' (e.g. 1gbit, 200mbit, none)"
    burst=$((b / 200))            # 5 ms at the rate
    [ $burst -ge 131072 ] || burst=131072
    local q
    q=$(cat "$STATE/queue" 2>/dev/null) || q=50
    $T 5 tc -n "$ns" qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency "${q}ms" \
        || die "tc on $ns/$dev failed"
}

node_index() { [[ $1 =~ ^n([0-9])$ ]] && echo "${BASH_REMATCH[1]}"; }

# holder_pid NODE: the pid holding NODE's mount and UTS namespaces, checked.
holder_pid() {
    local p
    p=$(cat "$STATE/$1.pid" 2>/dev/null) || return 1
    [ -n "$p" ] && [ -d "/proc/$p" ] || return 1
    [ "$(readlink "/proc/$p/ns/net")" = "$(grep "^$1 net " "$LEDGER" 2>/dev/null | awk '{print $3}')" ] || return 1
    echo "$p"
}

live_nodes() {
    local n out=()
    for n in $(cat "$STATE/nodes" 2>/dev/null); do
        holder_pid "$n" >/dev/null && out+=("$n")
    done
    echo "${out[*]}"
}

# pids_of_run: every process of this cluster: in its network namespaces (by
# name, or by the ledger's inodes once a name is gone) or carrying the run's
# token in its environment. Never this script or its parents.
pids_of_run() {
    local tok inodes
    tok=$(awk '$1 == "token" {print $2}' "$LEDGER" 2>/dev/null)
    inodes=$(awk '$2 ~ /^(net|mnt|uts)$/ {print $3}' "$LEDGER" 2>/dev/null | tr '\n' ' ')
    {
        if [ -n "$inodes" ]; then
            find /proc/[0-9]*/ns/net /proc/[0-9]*/ns/mnt /proc/[0-9]*/ns/uts -maxdepth 0 \
                -printf '%p %l\n' 2>/dev/null |
                awk -v l="$inodes" 'BEGIN { n = split(l, a, " "); for (i = 1; i <= n; i++) w[a[i]] = 1 }
                                    ($2 in w) { split($1, p, "/"); print p[3] }'
        fi
        if [ -n "$tok" ]; then
            grep -lzx "DCP_CLUSTER_ID=$tok" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3
        fi
    } | sort -un | grep -vx -e "$$" -e "$PPID" -e "${BASHPID:-$$}" || true
}

kill_run() {
    local pids i
    for i in $(seq 1 $((KILL_WAIT * 5))); do
        pids=$( { for ns in $(ns_list); do ip netns pids "$ns" 2>/dev/null; done; pids_of_run; } | sort -u)
        [ -n "$pids" ] || return 0
        # SIGKILL ends stopped (cut) processes too.
        kill -KILL $pids 2>/dev/null || true
        sleep 0.2
    done
    echo "cluster: processes still alive after ${KILL_WAIT} s: $pids" >&2
    return 1
}

# leftovers: one line per thing this cluster left behind (empty: clean).
leftovers() {
    local ns p m
    for ns in $(ns_list); do echo "network namespace $ns"; done
    for p in $(pids_of_run); do
        echo "process $p ($({ tr '\0' ' ' < /proc/$p/cmdline; } 2>/dev/null | cut -c1-60))"
    done
    # a node's tmpfs in any mount namespace still alive
    m=$(grep -l " dcp-t0-$NAME-" /proc/[0-9]*/mountinfo 2>/dev/null | head -3)
    [ -z "$m" ] || echo "tier-0 tmpfs still mounted (seen in $(echo $m | tr '\n' ' '))"
    grep -q " $STATE" /proc/self/mountinfo && echo "mount under $STATE"
    [ ! -e "$STATE" ] || echo "state directory $STATE"
    if [ -f "$LEDGER" ]; then
        local net
        net=$(awk '$1 == "net" {print $2}' "$LEDGER")
        if [ -n "$net" ] && ip -o -4 addr show 2>/dev/null | grep -q " inet $net\."; then
            echo "address of $net.0/24 in the host's namespace"
        fi
    fi
}

do_down() {
    local bad=0 ns
    [ -e "$STATE" ] || [ -e "$LEDGER" ] || [ -n "$(ns_list)" ] || return 0
    say "down $NAME"
    # the store first, gently (its daemons die with it), then everything
    if [ -f "$STATE/store.pid" ]; then
        kill -TERM "$(cat "$STATE/store.pid")" 2>/dev/null || true
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            kill -0 "$(cat "$STATE/store.pid")" 2>/dev/null || break
            sleep 0.2
        done
    fi
    kill_run || bad=1
    for ns in $(ns_list); do
        $T 10 ip netns del "$ns" 2>/dev/null || { echo "cluster: ip netns del $ns failed" >&2; bad=1; }
    done
    kill_run || bad=1           # anything that outlived its namespace's name
    rm -rf "$STATE" 2>/dev/null || { echo "cluster: cannot remove $STATE" >&2; bad=1; }
    local left
    left=$(leftovers)
    if [ -n "$left" ]; then
        echo "cluster: $NAME not clean after down:" >&2
        echo "$left" | sed 's/^/  /' >&2
        return 1
    fi
    rm -f "$LEDGER"
    return $bad
}

# ---- up ------------------------------------------------------------------

do_up() {
    local n="" node_rate=none store_rate=none net=${DCP_CLUSTER_NET:-198.18.30} size=512m store=1 queue=50
    local node_to=10 store_to=150 memstore=$((6 << 30))
    while [ $# -gt 0 ]; do
        case "$1" in
        --node-rate) node_rate=$2; shift 2 ;;
        --store-rate) store_rate=$2; shift 2 ;;
        --net) net=$2; shift 2 ;;
        --tier0-size) size=$2; shift 2 ;;
        --queue) queue=$2; shift 2 ;;
        --no-store) store=0; shift ;;
        --node-timeout) node_to=$2; shift 2 ;;
        --store-timeout) store_to=$2; shift 2 ;;
        --memstore) memstore=$2; shift 2 ;;
        -*) echo "cluster: unknown option $1" >&2; usage ;;
        *) [ -z "$n" ] || usage; n=$1; shift ;;
        esac
    done
    [[ $n =~ ^[2-8]$ ]] || { echo "cluster: up N: N is 2..8 nodes" >&2; exit 2; }
    [[ $net =~ ^(10|172\.(1[6-9]|2[0-9]|3[01])|192\.168|198\.1[89])\.[0-9]{1,3}(\.[0-9]{1,3})?$ ]] &&
        [ "$(echo "$net" | tr -cd . | wc -c)" = 2 ] ||
        { echo "cluster: --net A.B.C must be a /24 of a private or test range (10/8, 172.16/12, 192.168/16, 198.18/15)" >&2; exit 2; }
    [[ $queue =~ ^[0-9]{1,4}$ ]] && [ "$queue" -ge 1 ] ||
        { echo "cluster: --queue MS: the links' tbf queue, 1..9999 ms" >&2; exit 2; }
    for r in "$node_rate" "$store_rate"; do
        [ "$r" = none ] || [ "$(rate_bytes "$r")" -gt 0 ] || { echo "cluster: bad rate '$r'" >&2; exit 2; }
    done
    need_tools
    if [ $store = 1 ]; then
        for b in ceph-mon ceph-osd radosgw radosgw-admin; do
            command -v $b >/dev/null 2>&1 || { echo "cluster: SKIP, no $b for the storage node (scripts/deps.sh installs it)" >&2; exit 77; }
        done
    fi
    mkdir -p "$RUNDIR"
    # leftovers of a killed run under this name
    if [ -e "$STATE" ] || [ -e "$LEDGER" ] || [ -n "$(ns_list)" ]; then
        say "removing what an earlier run of $NAME left: $(ns_list | tr '\n' ' ')"
        do_down || die "could not remove the leftovers of an earlier run of $NAME"
    fi
    # addresses taken: in the host's namespace or any network namespace
    local taken ns
    taken=$( { ip -o -4 addr show | sed 's/^/host: /'
               for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
                   ip -n "$ns" -o -4 addr show 2>/dev/null | sed "s/^/netns $ns: /"
               done; } | grep -F " inet $net." | awk '{print $1, $2, $3, $5, $6}' | head -3)
    [ -z "$taken" ] || die "addresses of $net.0/24 already taken ($taken); choose another --net"

    trap 'echo "cluster: interrupted; removing $NAME" >&2; do_down; exit 1' INT TERM
    mkdir -p "$STATE/t0"
    echo "$queue" > "$STATE/queue"
    local tok
    tok=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
    { echo "token $tok"; echo "net $net"; } > "$LEDGER"
    local nodes=() i
    for ((i = 0; i < n; i++)); do nodes+=("n$i"); done
    echo "${nodes[*]}" > "$STATE/nodes"
    {
        echo "127.0.0.1 localhost"
        echo "$net.2 st"
        for ((i = 0; i < n; i++)); do echo "$net.$((10 + i)) n$i"; done
    } > "$STATE/hosts"

    fail() { echo "cluster: $*" >&2; do_down; exit 1; }
    # switch
    $T 5 ip netns add "$NAME-sw" || fail "ip netns add $NAME-sw failed"
    $T 5 ip -n "$NAME-sw" link add br0 type bridge || fail "bridge in $NAME-sw failed"
    $T 5 ip -n "$NAME-sw" link set br0 up && $T 5 ip -n "$NAME-sw" link set lo up || fail "switch up failed"
    local all=("${nodes[@]}")
    [ $store = 0 ] || all+=(st)
    local node addr port rate
    for node in "${all[@]}"; do
        if [ "$node" = st ]; then addr=$net.2; port=pst; rate=$store_rate
        else i=$(node_index "$node"); addr=$net.$((10 + i)); port=p$i; rate=$node_rate; fi
        ns=$NAME-$node
        $T 5 ip netns add "$ns" || fail "ip netns add $ns failed"
        $T 5 ip link add eth0 netns "$ns" type veth peer name "$port" netns "$NAME-sw" ||
            fail "veth for $node failed"
        $T 5 ip -n "$NAME-sw" link set "$port" master br0 up || fail "switch port $port failed"
        $T 5 ip -n "$ns" link set lo up || fail "lo of $node failed"
        $T 5 ip -n "$ns" addr add "$addr/24" dev eth0 || fail "address $addr on $node failed"
        $T 5 ip -n "$ns" link set eth0 up || fail "eth0 of $node failed"
        ( shape "$ns" eth0 "$rate" && shape "$NAME-sw" "$port" "$rate" ) || fail "rate $rate on $node failed"
        echo "$node rate $rate" >> "$STATE/rates"
        # the holder: mount + UTS namespaces, the node's tmpfs, hostname, hosts
        local hang=""
        [ "${DCP_CLUSTER_FAULT:-}" = "hang:$node" ] && hang=1
        DCP_CLUSTER_ID=$tok setsid ip netns exec "$ns" unshare --mount --uts --propagation private -- \
            sh -c 'set -e
                   [ -z "$5" ] || exec sleep 1000000
                   hostname "$1"
                   mount -t tmpfs -o "size=$2,mode=0755" "dcp-t0-$4-$1" "$3/t0"
                   mount --bind "$3/hosts" /etc/hosts
                   echo $$ > "$3/$1.pid.tmp"; mv "$3/$1.pid.tmp" "$3/$1.pid"
                   exec sleep 1000000000' holder "$node" "$size" "$STATE" "$NAME" "$hang" \
            </dev/null >"$STATE/$node.log" 2>&1 &
        disown $!     # no job notice when down kills it
        local t0=$SECONDS p=""
        while :; do
            p=$(cat "$STATE/$node.pid" 2>/dev/null) && [ -n "$p" ] && break
            [ $((SECONDS - t0)) -lt "$node_to" ] ||
                fail "node $node did not come up within $node_to s ($(head -c 300 "$STATE/$node.log"))"
            sleep 0.1
        done
        echo "$node net $(readlink /proc/$p/ns/net)" >> "$LEDGER"
        echo "$node mnt $(readlink /proc/$p/ns/mnt)" >> "$LEDGER"
        echo "$node uts $(readlink /proc/$p/ns/uts)" >> "$LEDGER"
        [ "$(readlink /proc/$p/ns/net)" != "$(readlink /proc/self/ns/net)" ] ||
            fail "node $node's holder is in the host's network namespace"
    done
    {
        echo "DCP_CLUSTER_NAME=$NAME"
        echo "DCP_CLUSTER_ID=$tok"
        echo "DCP_CLUSTER_STATE=$STATE"
        echo "DCP_CLUSTER_TIER0=$STATE/t0"
        echo "DCP_CLUSTER_NET=$net"
        echo "OMPI_ALLOW_RUN_AS_ROOT=1"
        echo "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
    } > "$STATE/env"
    if [ $store = 1 ]; then
        local py=$ROOT/.venv/bin/python
        [ -x "$py" ] || py=python3
        DCP_CLUSTER_ID=$tok setsid nsenter -t "$(holder_pid st)" -n -m -u -- \
            "$py" "$HERE/store.py" "$STATE" "$net.2" "$memstore" \
            </dev/null >"$STATE/store.log" 2>&1 &
        echo $! > "$STATE/store.pid"
        disown $!
        local t0=$SECONDS
        while [ ! -f "$STATE/store.url" ]; do
            if ! kill -0 "$(cat "$STATE/store.pid")" 2>/dev/null; then
                fail "storage node: $(cat "$STATE/store.err" 2>/dev/null | head -20)$(tail -5 "$STATE/store.log")"
            fi
            [ $((SECONDS - t0)) -lt "$store_to" ] || fail "storage node: radosgw did not come up within $store_to s"
            sleep 0.3
        done
        {
            echo "AWS_ENDPOINT_URL=$(cat "$STATE/store.url")"
            echo "AWS_ACCESS_KEY_ID=dcpclusterkey"
            echo "AWS_SECRET_ACCESS_KEY=dcpclustersecret"
            echo "AWS_REGION=us-east-1"
            echo "AWS_DEFAULT_REGION=us-east-1"
            echo "DCP_S3_BUCKET=dcp-cluster"
        } >> "$STATE/env"
    fi
    trap - INT TERM
    say "up: $NAME, nodes ${nodes[*]} ($net.10-$((10 + n - 1)), rate $node_rate)$([ $store = 1 ] && echo ", store st at $(cat "$STATE/store.url") (rate $store_rate)")"
}

# ---- inside the cluster ---------------------------------------------------

# node_env: the environment of every command run in a node (the host's,
# without proxies, plus the cluster's).
node_env() {
    local l
    echo -u http_proxy -u https_proxy -u HTTP_PROXY -u HTTPS_PROXY -u all_proxy -u ALL_PROXY -u no_proxy -u NO_PROXY
    while IFS= read -r l; do echo "$l"; done < "$STATE/env"
}

do_exec() {
    [ $# -ge 2 ] || usage
    local node=$1 p wd=/
    shift
    p=$(holder_pid "$node") || die "node $node of $NAME is not up"
    if [ "${DCP_CLUSTER_FAULT:-}" = "agent:$node" ]; then
        die "launch into $node failed (DCP_CLUSTER_FAULT)"
    fi
    [ -d "$PWD" ] && wd=$PWD
    # shellcheck disable=SC2046
    exec nsenter -t "$p" -n -m -u --wd="$wd" -- env $(node_env) "$@"
}

do_mpirun() {
    local list="" per=1
    while [ $# -gt 0 ]; do
        case "$1" in
        --nodes) list=$(echo "$2" | tr , ' '); shift 2 ;;
        --per-node) per=$2; shift 2 ;;
        --) shift; break ;;
        *) break ;;
        esac
    done
    [ $# -ge 1 ] || usage
    [ -n "$list" ] || list=$(live_nodes)
    [ -n "$list" ] || die "no live node in $NAME"
    local hosts="" cnt=0 n
    for n in $list; do
        holder_pid "$n" >/dev/null || die "node $n of $NAME is not up"
        hosts+="${hosts:+,}$n:$per"
        cnt=$((cnt + per))
    done
    local first=${list%% *}
    local net
    net=$(awk -F= '$1 == "DCP_CLUSTER_NET" {print $2}' "$STATE/env")
    do_exec "$first" mpirun --host "$hosts" -n $cnt \
        --mca plm_rsh_agent "$HERE/agent.sh" --mca plm_rsh_no_tree_spawn 1 \
        --mca pml ob1 --mca btl tcp,self --mca osc pt2pt \
        --mca btl_tcp_if_include "$net.0/24" --mca oob_tcp_if_include "$net.0/24" \
        --mca odls_base_sigkill_timeout 0 --mca mpi_yield_when_idle 1 "$@"
}

do_kill() {
    local node=$1 ns pids
    ns=$NAME-$node
    [ -n "$(ns_list | grep -x "$ns")" ] || die "no node $node in $NAME"
    for _ in $(seq 1 $((KILL_WAIT * 5))); do
        pids=$(ip netns pids "$ns" 2>/dev/null)
        [ -n "$pids" ] || break
        kill -KILL $pids 2>/dev/null || true
        sleep 0.2
    done
    [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] || die "processes of $node still alive"
    $T 10 ip netns del "$ns" || die "ip netns del $ns failed"
    rm -f "$STATE/$node.pid"
    say "node $node destroyed (processes, tmpfs, namespaces)"
}

do_cut() {
    local node=$1 port pids
    if [ "$node" = st ]; then port=pst; else port=p$(node_index "$node"); fi
    [ "$port" != p ] || die "no node $node"
    $T 5 ip -n "$NAME-sw" link set "$port" down || die "cannot take $node's link down"
    pids=$(ip netns pids "$NAME-$node" 2>/dev/null)
    [ -z "$pids" ] || kill -STOP $pids
    say "node $node cut off (link down, $(echo $pids | wc -w) processes frozen)"
}

do_rate() {
    local node=$1 rate=$2 port
    if [ "$node" = st ]; then port=pst; else port=p$(node_index "$node"); fi
    shape "$NAME-$node" eth0 "$rate" && shape "$NAME-sw" "$port" "$rate"
}

# ---- main ------------------------------------------------------------------

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
up) do_up "$@" ;;
down)
    need_tools
    do_down || exit 1
    say "down: $NAME clean" ;;
check)
    left=$(leftovers)
    if [ -n "$left" ]; then echo "cluster: $NAME left behind:" >&2; echo "$left" | sed 's/^/  /' >&2; exit 1; fi
    say "check: nothing of $NAME left" ;;
exec) do_exec "$@" ;;
agent)
    # Open MPI runs AGENT HOST COMMAND-LINE (plm_rsh_agent)
    [ $# -ge 2 ] || usage
    host=$1
    shift
    NAME=${DCP_CLUSTER_NAME:-$NAME}; STATE=$RUNDIR/$NAME; LEDGER=$RUNDIR/$NAME.ledger
    do_exec "$host" /bin/sh -c "$*" ;;
mpirun) do_mpirun "$@" ;;
kill) [ $# = 1 ] || usage; do_kill "$1" ;;
cut) [ $# = 1 ] || usage; do_cut "$1" ;;
rate) [ $# = 2 ] || usage; do_rate "$1" "$2" ;;
nodes) live_nodes ;;
env) cat "$STATE/env" ;;
*) usage ;;
esac
