#!/usr/bin/env python3
"""PyTorch DCP on S3 (torch's FsspecReader/FsspecWriter over s3fs) and dcp
on the same server, both ways, bit-exact; boto3 lists the objects.

Run by s3_env.py (moto or radosgw on loopback):
  test_torch_s3_interop.py DCPTOOL S3FS_DIR
S3FS_DIR holds s3fs and its aiobotocore (scripts/deps.sh installs them
there with pip --target: aiobotocore pins a botocore older than the
venv's boto3 needs, so they cannot share the venv's site-packages).
Exit 77 (skip) when s3fs is not there.
"""
import os
import subprocess
import sys
import tempfile

tool, s3fs_dir = sys.argv[1], sys.argv[2]
sys.path.insert(0, s3fs_dir)
try:
    import s3fs  # noqa: F401
except ImportError as e:
    print(f"SKIP: {e} (scripts/deps.sh installs s3fs into {s3fs_dir})")
    sys.exit(77)
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from safetensors.torch import load_file

bucket = os.environ["DCP_S3_BUCKET"]
opts = dict(endpoint_url=os.environ["AWS_ENDPOINT_URL"],
            key=os.environ["AWS_ACCESS_KEY_ID"],
            secret=os.environ["AWS_SECRET_ACCESS_KEY"])


def state(seed):
    g = torch.Generator().manual_seed(seed)
    return {
        # 20 MiB: a multipart object of dcp's (parts of 8 MiB)
        "model.big": torch.randn(5 * 1024, 1024, generator=g),
        "model.half": torch.randn(33, 7, generator=g).to(torch.bfloat16),
        "model.idx": torch.arange(1000, dtype=torch.int64),
        "optim.step": torch.tensor(12.0),
    }


def same(a, b, what):
    assert set(a) == set(b), f"{what}: keys {sorted(a)} != {sorted(b)}"
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, f"{what}: {k}"
        assert torch.equal(a[k].view(-1).view(torch.uint8) if a[k].numel() else a[k],
                           b[k].view(-1).view(torch.uint8) if b[k].numel() else b[k]), \
            f"{what}: {k} differs"


def run(*args):
    p = subprocess.run([tool, *args], capture_output=True, text=True)
    assert p.returncode == 0, f"dcptool {args}: {p.stderr}"
    return p.stdout


tmp = tempfile.mkdtemp(prefix="dcp-s3-torch-")
# 1. dcp writes (dcptool import of a torch.save file) -> torch reads
want = state(1)
torch.save(want, os.path.join(tmp, "in.pt"))
url_dcp = f"s3://{bucket}/interop/by-dcp"
run("import", os.path.join(tmp, "in.pt"), url_dcp, "--quiet")
got = {k: torch.empty_like(v) for k, v in want.items()}
dcp.load(got, storage_reader=FsspecReader(url_dcp, **opts))
same(want, got, "torch reading dcp's")
print("torch FsspecReader read dcp's checkpoint bit-exact")

# 2. torch writes -> dcp reads (verify, export to safetensors, compare)
want2 = state(2)
url_t = f"s3://{bucket}/interop/by-torch"
dcp.save(want2, storage_writer=FsspecWriter(url_t, **opts))
run("verify", url_t)
out = os.path.join(tmp, "out.safetensors")
run("export", url_t, out, "--quiet")
same(want2, load_file(out), "dcp reading torch's")
print("dcp read torch's FsspecWriter checkpoint bit-exact")

# 3. boto3 (the venv's, without s3fs's older botocore) lists dcp's objects
code = f"""
import boto3, os
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
r = s3.list_objects_v2(Bucket="{bucket}", Prefix="interop/by-dcp/")
print(" ".join(sorted(o["Key"] + ":" + str(o["Size"]) for o in r["Contents"])))
"""
env = dict(os.environ)
env.pop("PYTHONPATH", None)
p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
assert p.returncode == 0, p.stderr
keys = dict(kv.rsplit(":", 1) for kv in p.stdout.split())
assert set(keys) == {"interop/by-dcp/.metadata", "interop/by-dcp/__0_0.distcp"}, keys
assert int(keys["interop/by-dcp/__0_0.distcp"]) > 20 << 20, keys
print("boto3 lists dcp's objects:", p.stdout.strip())
print("ok")
