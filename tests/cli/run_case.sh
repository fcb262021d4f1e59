#!/bin/sh
# Runs one golden CLI case and compares it with its expectations.
#
#   run_case.sh [--set-exact-output] [--exec-prefix "PREFIX"] CASE.sh
#
# The case script runs under sh in a fresh, empty temporary directory (its
# cwd), with DCPTOOL (path of dcptool), DCP_TEST_DATA (tests/data) and
# DCPTOOL_PREFIX (the --exec-prefix, e.g. "valgrind -q --error-exitcode=99";
# empty by default) in its environment. Cases run the tool as
#     $DCPTOOL_PREFIX "$DCPTOOL" ARGS...
# Its stdout, stderr and exit status are compared with, next to CASE.sh:
#   CASE.stdout.exact  byte-exact stdout
#   CASE.stderr.glob   a shell glob (case pattern) matched against the whole
#                      stderr, trailing newlines removed: 'dcptool: *key*'
#   CASE.exit          the exit status, a number
# A missing expectation file is not checked.
#
# --set-exact-output rewrites CASE.stdout.exact and CASE.exit from this run
# (creating them) and prints the stderr, for writing CASE.stderr.glob by
# hand. Exit status: 0 when every expectation holds, 1 otherwise, 2 on bad
# usage. Set DCP_KEEP_TMP=1 to keep the case's directory.

set -u

me=run_case.sh
set_exact=0
prefix=""

usage() {
    echo "usage: $me [--set-exact-output] [--exec-prefix PREFIX] CASE.sh" >&2
    exit 2
}

while [ $# -gt 0 ]; do
    case "$1" in
    --set-exact-output) set_exact=1; shift ;;
    --exec-prefix)
        [ $# -ge 2 ] || usage
        prefix=$2; shift 2 ;;
    --exec-prefix=*) prefix=${1#--exec-prefix=}; shift ;;
    -h | --help) usage ;;
    --) shift; break ;;
    -*) echo "$me: unknown option '$1'" >&2; usage ;;
    *) break ;;
    esac
done
[ $# -eq 1 ] || usage

case_path=$1
[ -f "$case_path" ] || { echo "$me: no such case '$case_path'" >&2; exit 2; }
case_dir=$(cd "$(dirname "$case_path")" && pwd) || exit 2
case_base=${case_path##*/}
name=${case_base%.sh}
exp=$case_dir/$name

if [ -z "${DCPTOOL:-}" ]; then
    echo "$me: DCPTOOL is not set (the path of dcptool)" >&2
    exit 2
fi
if [ -z "${DCP_TEST_DATA:-}" ]; then
    echo "$me: DCP_TEST_DATA is not set (the path of tests/data)" >&2
    exit 2
fi
# Absolute paths: the case runs in another directory.
case $DCPTOOL in /*) ;; *) DCPTOOL=$(pwd)/$DCPTOOL ;; esac
case $DCP_TEST_DATA in /*) ;; *) DCP_TEST_DATA=$(pwd)/$DCP_TEST_DATA ;; esac

top=$(mktemp -d "${TMPDIR:-/tmp}/dcpcli.$name.XXXXXX") || exit 2
if [ -z "${DCP_KEEP_TMP:-}" ]; then
    trap 'rm -rf "$top"' EXIT
    trap 'rm -rf "$top"; exit 1' HUP INT TERM
fi
mkdir "$top/cwd" || exit 2

(
    cd "$top/cwd" || exit 125
    DCPTOOL=$DCPTOOL DCP_TEST_DATA=$DCP_TEST_DATA DCPTOOL_PREFIX=$prefix
    export DCPTOOL DCP_TEST_DATA DCPTOOL_PREFIX
    exec sh "$case_dir/$case_base"
) >"$top/stdout" 2>"$top/stderr" </dev/null
rc=$?

if [ "$set_exact" = 1 ]; then
    cp "$top/stdout" "$exp.stdout.exact" || exit 1
    echo "$rc" >"$exp.exit" || exit 1
    echo "$me: $name: wrote $name.stdout.exact and $name.exit (exit $rc)"
    echo "$me: $name: stderr was:"
    sed 's/^/    /' "$top/stderr"
    exit 0
fi

fail=0
checked=0

if [ -f "$exp.stdout.exact" ]; then
    checked=$((checked + 1))
    if ! cmp -s "$exp.stdout.exact" "$top/stdout"; then
        echo "FAIL $name: stdout differs from $name.stdout.exact" \
            "(--- expected, +++ actual):"
        diff -u "$exp.stdout.exact" "$top/stdout" | sed 's/^/    /'
        fail=1
    fi
fi

if [ -f "$exp.stderr.glob" ]; then
    checked=$((checked + 1))
    pattern=$(cat "$exp.stderr.glob")
    actual=$(cat "$top/stderr")
    # shellcheck disable=SC2254 # the pattern is meant to glob
    case $actual in
    $pattern) ;;
    *)
        echo "FAIL $name: stderr does not match $name.stderr.glob"
        echo "    pattern: $pattern"
        echo "    stderr:"
        sed 's/^/      /' "$top/stderr"
        fail=1
        ;;
    esac
fi

if [ -f "$exp.exit" ]; then
    checked=$((checked + 1))
    want=$(tr -d ' \t\r\n' <"$exp.exit")
    if [ "$rc" != "$want" ]; then
        echo "FAIL $name: exit status $rc, expected $want"
        fail=1
    fi
fi

if [ "$fail" = 1 ]; then
    # Show the whole run when anything failed.
    echo "    --- stderr of the case:"
    sed 's/^/    /' "$top/stderr"
    [ -n "${DCP_KEEP_TMP:-}" ] && echo "    (kept $top)"
    exit 1
fi
if [ "$checked" = 0 ]; then
    echo "warning: $name has no expectation files; nothing was checked"
fi
echo "ok $name (exit $rc, $checked expectations)"
exit 0
