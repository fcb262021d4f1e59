#!/usr/bin/env python3
"""PyTorch DCP through AWS's s3torchconnector (S3StorageWriter /
S3StorageReader, its own CRT-based S3 client) and dcp on the same server,
both ways, bit-exact.

Run by s3_env.py (moto on loopback; not radosgw, whose answer to its writer s3torchconnector 1.5 refuses):
  test_s3tc_interop.py DCPTOOL S3TC_DIR
S3TC_DIR holds s3torchconnector, s3torchconnectorclient and tenacity
(scripts/deps.sh: pip --target --no-deps, so that pip does not pull a
second torch). The connector's writer and reader take no endpoint: their
file system is replaced by one whose S3Client points at AWS_ENDPOINT_URL,
path style. Exit 77 (skip) when the connector is not there.
"""
import os
import subprocess
import sys
import tempfile

tool, tc_dir = sys.argv[1], sys.argv[2]
sys.path.insert(0, tc_dir)
try:
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client
    from s3torchconnector.dcp import S3FileSystem, S3StorageReader, S3StorageWriter
except ImportError as e:
    print(f"SKIP: {e} (scripts/deps.sh installs s3torchconnector into {tc_dir})")
    sys.exit(77)
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

bucket = os.environ["DCP_S3_BUCKET"]
region = os.environ.get("AWS_REGION", "us-east-1")


def fs():
    return S3FileSystem(region, s3_client=S3Client(
        region, endpoint=os.environ["AWS_ENDPOINT_URL"],
        s3client_config=S3ClientConfig(force_path_style=True)))


def state(seed):
    g = torch.Generator().manual_seed(seed)
    return {"model.big": torch.randn(3 * 1024, 1024, generator=g),
            "model.half": torch.randn(33, 7, generator=g).to(torch.bfloat16),
            "model.idx": torch.arange(1000, dtype=torch.int64)}


def same(a, b, what):
    assert set(a) == set(b), f"{what}: keys {sorted(a)} != {sorted(b)}"
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, f"{what}: {k}"
        assert torch.equal(a[k].view(-1).view(torch.uint8),
                           b[k].view(-1).view(torch.uint8)), f"{what}: {k} differs"


def run(*args):
    p = subprocess.run([tool, *args], capture_output=True, text=True)
    assert p.returncode == 0, f"dcptool {args}: {p.stderr}"
    return p.stdout


tmp = tempfile.mkdtemp(prefix="dcp-s3tc-")
# dcp writes -> the connector's reader reads
want = state(1)
torch.save(want, os.path.join(tmp, "in.pt"))
url = f"s3://{bucket}/s3tc/by-dcp"
run("import", os.path.join(tmp, "in.pt"), url, "--quiet")
got = {k: torch.empty_like(v) for k, v in want.items()}
r = S3StorageReader(region, url)
r.fs = fs()
dcp.load(got, storage_reader=r)
same(want, got, "s3torchconnector reading dcp's")
print("S3StorageReader read dcp's checkpoint bit-exact")
# the connector's writer writes -> dcp reads
want2 = state(2)
url2 = f"s3://{bucket}/s3tc/by-torch"
w = S3StorageWriter(region, url2)
w.fs = fs()
dcp.save(want2, storage_writer=w)
run("verify", url2)
out = os.path.join(tmp, "out.safetensors")
run("export", url2, out, "--quiet")
same(want2, load_file(out), "dcp reading s3torchconnector's")
print("dcp read S3StorageWriter's checkpoint bit-exact")
print("ok")
