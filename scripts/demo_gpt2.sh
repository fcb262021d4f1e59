#!/usr/bin/env bash
# The MPI part of `make demo`: a GPT-2-small-sized training state saved by
# 4 ranks and loaded back, resharded, by 3 (examples/gpt2_demo.c).
#
#   scripts/demo_gpt2.sh BUILD_DIR CKPT_DIR [gpt2_demo options]
#
# Runs BUILD_DIR/gpt2_demo under the mpiexec CMake found. With Open MPI it
# adds --oversubscribe (4 ranks on fewer cores) and allows running as root.
# CKPT_DIR (about 1.5 GB) is removed first and again at the end, also on
# failure, unless DEMO_KEEP=1.
set -euo pipefail

if [ $# -lt 2 ]; then
    echo "usage: $0 BUILD_DIR CKPT_DIR [gpt2_demo options]" >&2
    exit 2
fi
build=$1
dir=$2
shift 2
prog=$build/gpt2_demo

if [ ! -x "$prog" ]; then
    echo "demo_gpt2: $prog was not built (it needs MPI: libopenmpi-dev)" >&2
    exit 1
fi
mpiexec=$(sed -n 's/^MPIEXEC_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt")
mpiexec=${mpiexec:-$(command -v mpiexec || true)}
if [ -z "$mpiexec" ]; then
    echo "demo_gpt2: no mpiexec found" >&2
    exit 1
fi
flags=()
if "$mpiexec" --version 2>/dev/null | grep -q -e 'Open MPI' -e OpenRTE; then
    flags+=(--oversubscribe)
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

cleanup() {
    if [ "${DEMO_KEEP:-0}" = 1 ]; then
        echo "demo_gpt2: kept $dir (DEMO_KEEP=1)"
    else
        rm -rf "$dir"
    fi
}
rm -rf "$dir"
trap cleanup EXIT
"$mpiexec" "${flags[@]}" -n 4 "$prog" save "$dir" "$@"
"$mpiexec" "${flags[@]}" -n 3 "$prog" load "$dir" "$@"
