#!/bin/sh
# Run by s3_env.py: every dcptool command that takes a checkpoint, on
# s3:// paths, compared with the same commands on a local directory.
#   test_dcptool_s3.sh DCPTOOL PYTHON
set -eu
tool=$1
py=$2
b="s3://$DCP_S3_BUCKET/tool"
tmp=$(mktemp -d /tmp/dcp-s3-tool-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
"$py" - "$tmp/in.pt" <<'PY'
import sys, torch
g = torch.Generator().manual_seed(5)
torch.save({"w": torch.randn(300, 70, generator=g), "b": torch.arange(12),
            "h": torch.randn(9, generator=g).to(torch.bfloat16), "step": 7},
           sys.argv[1])
PY
"$tool" import "$tmp/in.pt" "$b/odd dir+1" --quiet
"$tool" import "$tmp/in.pt" "$tmp/local" --quiet
# a second import onto a checkpoint is refused
if "$tool" import "$tmp/in.pt" "$b/odd dir+1" --quiet 2>"$tmp/err"; then
    fail "import over a checkpoint"
fi
for cmd in info ls; do
    "$tool" $cmd "$b/odd dir+1" --json | sed 's#s3://[^"]*#X#' >"$tmp/s3.$cmd"
    "$tool" $cmd "$tmp/local" --json | sed 's#"checkpoint": *"[^"]*"#"checkpoint": "X"#; s#/tmp/[^"]*#X#' >"$tmp/l.$cmd"
    "$tool" $cmd "$b/odd dir+1" >/dev/null
done
cmp "$tmp/s3.ls" "$tmp/l.ls" || fail "ls differs"
grep -q '"tensors": *3' "$tmp/s3.info" || fail "info: $(cat "$tmp/s3.info")"
"$tool" verify "$b/odd dir+1" >/dev/null
"$tool" cat "$b/odd dir+1" w >"$tmp/s3.w"
"$tool" cat "$tmp/local" w >"$tmp/l.w"
cmp "$tmp/s3.w" "$tmp/l.w" || fail "cat differs"
"$tool" cat "$b/odd dir+1" step | grep -q 7 || fail "cat step"
"$tool" diff "$b/odd dir+1" "$tmp/local" >/dev/null || fail "diff s3 local"
"$tool" export "$b/odd dir+1" "$tmp/out.safetensors" --quiet
"$tool" import "$tmp/out.safetensors" "$b/second" --quiet
"$tool" import "$tmp/out.safetensors" "$tmp/local2" --quiet
"$tool" diff "$b/second" "$tmp/local2" >/dev/null || fail "diff s3 local"
# diff of two s3:// checkpoints: the value left out of the export differs
if "$tool" diff "$b/odd dir+1" "$b/second" >"$tmp/diff"; then
    fail "diff s3 s3 found no difference"
fi
grep -q step "$tmp/diff" || fail "diff: $(cat "$tmp/diff")"
# a missing bucket and a missing checkpoint: a clear error, exit non-zero
if "$tool" info "s3://dcp-no-such-bucket/x" 2>"$tmp/err"; then
    fail "info on a missing bucket"
fi
grep -q "dcp-no-such-bucket" "$tmp/err" || fail "message: $(cat "$tmp/err")"
if "$tool" ls "$b/none" 2>"$tmp/err"; then fail "ls of nothing"; fi
grep -q ".metadata" "$tmp/err" || fail "message: $(cat "$tmp/err")"
# rm: .metadata first, then the data objects; then it is no checkpoint
"$tool" rm "$b/second" >/dev/null
if "$tool" info "$b/second" 2>/dev/null; then fail "info after rm"; fi
"$tool" info "$b/odd dir+1" >/dev/null || fail "rm touched another"
# the manager's step roots on s3://: list, latest, prune, rm give what they
# give on a local root
for n in 1 2 3 12; do
    "$tool" import "$tmp/in.pt" "$b/mgr/step-$n" --quiet >/dev/null
    "$tool" import "$tmp/in.pt" "$tmp/mgr/step-$n" --quiet >/dev/null
done
"$tool" import "$tmp/in.pt" "$b/mgr/other" --quiet >/dev/null
mgr_same() {
    for cmd in list latest; do
        "$tool" $cmd "$b/mgr" --json >"$tmp/s3.$cmd" || fail "$cmd on s3"
        "$tool" $cmd "$tmp/mgr" --json >"$tmp/l.$cmd"
        cmp "$tmp/s3.$cmd" "$tmp/l.$cmd" ||
            fail "$cmd differs: $(cat "$tmp/s3.$cmd") vs $(cat "$tmp/l.$cmd")"
        "$tool" $cmd "$b/mgr" >"$tmp/s3.$cmd"
        "$tool" $cmd "$tmp/mgr" >"$tmp/l.$cmd"
        cmp "$tmp/s3.$cmd" "$tmp/l.$cmd" || fail "$cmd (text) differs"
    done
}
mgr_same
# a root given with trailing slashes: the same steps, the same statuses
"$tool" list "$b/mgr//" >"$tmp/s3.slash"
"$tool" list "$b/mgr" | cmp - "$tmp/s3.slash" || fail "list ROOT// differs"
grep -q '"step": 12' "$tmp/s3.latest" || grep -q '^12' "$tmp/s3.latest" ||
    fail "latest: $(cat "$tmp/s3.latest")"
"$tool" prune "$b/mgr" --keep 2 --json >"$tmp/s3.prune"
"$tool" prune "$tmp/mgr" --keep 2 --json >"$tmp/l.prune"
cmp "$tmp/s3.prune" "$tmp/l.prune" || fail "prune differs"
grep -q '"removed": 2' "$tmp/s3.prune" || fail "prune: $(cat "$tmp/s3.prune")"
mgr_same
# a listing answer cut short before its first entry (200, through the
# fault proxy): list, latest and prune fail naming the listing -- never "no
# checkpoints", never an empty list -- and nothing is pruned
for cmd in list latest prune; do
    extra=""
    [ "$cmd" = prune ] && extra="--keep 1"
    echo "list_cut 100000" >"$DCP_S3_FAULTS"
    if AWS_ENDPOINT_URL="$DCP_S3_PROXY" "$tool" $cmd "$b/mgr" $extra \
        >"$tmp/out" 2>"$tmp/err"; then
        : >"$DCP_S3_FAULTS"
        fail "$cmd on a cut listing: exit 0, $(cat "$tmp/out")"
    fi
    : >"$DCP_S3_FAULTS"
    grep -q "listing page 1 refused" "$tmp/err" || fail "$cmd: $(cat "$tmp/err")"
done
"$tool" list "$b/mgr" | cut -f1 | tr '\n' ' ' | grep -qx "3 12 " ||
    fail "after the cut listings: $("$tool" list "$b/mgr")"
# a body trickling above the stall limit, with the retry budget from the
# environment: cat fails within the budget, "timed out", naming the object
echo "trickle 100000 2" >"$DCP_S3_FAULTS"
start=$(date +%s)
if AWS_ENDPOINT_URL="$DCP_S3_PROXY" DCP_S3_RETRY_BUDGET_MS=1500 \
    DCP_S3_MAX_ATTEMPTS=2 DCP_S3_STALL_TIMEOUT_MS=1000 \
    timeout 60 "$tool" cat "$b/mgr/step-3" w >/dev/null 2>"$tmp/err"; then
    : >"$DCP_S3_FAULTS"
    fail "cat of a trickling body succeeded"
fi
: >"$DCP_S3_FAULTS"
took=$(($(date +%s) - start))
grep -q "timed out" "$tmp/err" && grep -q "step-3/" "$tmp/err" ||
    fail "trickle: $(cat "$tmp/err")"
[ "$took" -lt 15 ] || fail "trickle: $took s with a budget of 1.5 s"
"$tool" rm "$b/mgr/step-12" >/dev/null
"$tool" rm "$tmp/mgr/step-12" >/dev/null
mgr_same
grep -q '^3' "$tmp/s3.latest" || fail "latest after rm: $(cat "$tmp/s3.latest")"
"$tool" info "$b/mgr/other" >/dev/null || fail "prune touched another name"
if "$tool" info "$b/mgr/step-1" 2>/dev/null; then fail "pruned step-1 loads"; fi
echo "dcptool on s3: ok"
