"""dcp_torch on 2-4 gloo ranks: DTensors (Shard, Replicate, 2-D meshes,
uneven), plain replicated tensors, values and Stateful objects through
torch's save/load/async_save; every writer/reader combination with torch's
classes, resharded N -> M, bit-exact; a killed save."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as tdcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import dcp_torch
from conftest import run_ranks

warnings.filterwarnings("ignore")


def full(seed, shape, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def global_state():
    return {
        "w_rows": full(1, (13, 6)),          # uneven over 2, 3, 4 ranks
        "w_cols": full(2, (4, 10), torch.bfloat16),
        "w_2d": full(3, (9, 7)),
        "rep": full(4, (5,)),
        "plain": torch.arange(17, dtype=torch.int64),
        "step": 42,
        "cfg": {"lr": 0.5, "betas": [0.9, 0.99], "name": "adamw"},
    }


def sharded(world):
    """This rank's state: DTensors on 1-D and (world 4) 2-D meshes."""
    g = global_state()
    mesh = init_device_mesh("cpu", (world,))
    sd = {
        "w_rows": distribute_tensor(g["w_rows"], mesh, [Shard(0)]),
        "w_cols": distribute_tensor(g["w_cols"], mesh, [Shard(1)]),
        "rep": distribute_tensor(g["rep"], mesh, [Replicate()]),
        "plain": g["plain"].clone(),
        "step": g["step"],
        "cfg": g["cfg"],
    }
    if world == 4:
        mesh2 = init_device_mesh("cpu", (2, 2))
        sd["w_2d"] = distribute_tensor(g["w_2d"], mesh2, [Shard(0), Shard(1)])
    else:
        sd["w_2d"] = distribute_tensor(g["w_2d"], mesh, [Shard(1)])
    return sd


def zeroed(sd):
    out = {}
    for k, v in sd.items():
        if isinstance(v, DTensor):
            out[k] = DTensor.from_local(torch.zeros_like(v.to_local()), v.device_mesh, v.placements,
                                        shape=v.shape, stride=v.stride())
        elif isinstance(v, torch.Tensor):
            out[k] = torch.zeros_like(v)
        elif isinstance(v, dict):
            out[k] = {"lr": 0.0, "betas": [0.0, 0.0], "name": ""}
        else:
            out[k] = 0
    return out


def check(out):
    g = global_state()
    for k in ("w_rows", "w_cols", "w_2d", "rep"):
        got = out[k].full_tensor()
        assert got.dtype == g[k].dtype and got.view(-1).view(torch.uint8).equal(
            g[k].reshape(-1).view(torch.uint8)), k
    assert torch.equal(out["plain"], g["plain"])
    assert out["step"] == 42 and out["cfg"] == g["cfg"]


def _save(rank, world, path, writer):
    w = dcp_torch.FileSystemWriter(path) if writer == "dcp" else tdcp.FileSystemWriter(path)
    tdcp.save(sharded(world), storage_writer=w)


def _load(rank, world, path, reader):
    r = dcp_torch.FileSystemReader(path) if reader == "dcp" else tdcp.FileSystemReader(path)
    out = zeroed(sharded(world))
    tdcp.load(out, storage_reader=r)
    check(out)


@pytest.mark.parametrize("writer,reader,n,m", [
    ("dcp", "dcp", 4, 2), ("dcp", "torch", 2, 3), ("torch", "dcp", 3, 4), ("dcp", "dcp", 2, 2)])
def test_reshard_every_combination(tmp_path, writer, reader, n, m):
    path = str(tmp_path / "ck")
    run_ranks(n, _save, path, writer)
    if writer == "dcp":
        dcp_torch.verify(path)
        assert sorted(os.listdir(path)) == [".metadata"] + [f"__{r}_0.distcp" for r in range(n)]
    run_ranks(m, _load, path, reader)


def _async(rank, world, path):
    sd = sharded(world)
    w = dcp_torch.FileSystemWriter(path)
    for step in range(3):
        sd["step"] = 40 + step
        fut = tdcp.async_save(sd, storage_writer=w)
        # the training step overlaps the save
        with torch.no_grad():
            sd["rep"].to_local().add_(0)
        fut.result()
    out = zeroed(sharded(world))
    tdcp.load(out, storage_reader=dcp_torch.FileSystemReader(path))
    check(out)


def test_async_save_ranks(tmp_path):
    run_ranks(2, _async, str(tmp_path / "ck"))


def _raising(rank, world, path):
    sd = sharded(world)
    w = dcp_torch.FileSystemWriter(path)
    tdcp.save(sd, storage_writer=w)
    before = open(os.path.join(path, ".metadata"), "rb").read()

    class Planner(tdcp.DefaultSavePlanner):
        def resolve_data(self, item):
            if rank == 1 and item.index.fqn == "plain":
                raise RuntimeError("rank 1 fails mid-write")
            return super().resolve_data(item)

    try:
        tdcp.save(sd, storage_writer=w, planner=Planner())
    except BaseException as e:
        assert "rank 1 fails mid-write" in str(e)
    else:
        raise AssertionError("the save did not fail")
    dist.barrier()
    assert open(os.path.join(path, ".metadata"), "rb").read() == before
    out = zeroed(sharded(world))
    tdcp.load(out, storage_reader=dcp_torch.FileSystemReader(path))
    check(out)
    tdcp.save(sd, storage_writer=w)  # the lock was released: it works


def test_rank_failure_no_commit(tmp_path):
    run_ranks(2, _raising, str(tmp_path / "ck"))


KILLED = r'''
import sys, torch, torch.distributed.checkpoint as tdcp, dcp_torch
sd = {f"k{i}": torch.full((4 << 20,), float(i)) for i in range(64)}  # 1 GiB
print("saving", flush=True)
tdcp.save(sd, storage_writer=dcp_torch.FileSystemWriter(sys.argv[1]), no_dist=True)
'''


def test_killed_save_previous_loadable(tmp_path):
    path = str(tmp_path / "ck")
    prev = {"a": torch.arange(1000, dtype=torch.float32)}
    tdcp.save(prev, storage_writer=dcp_torch.FileSystemWriter(path), no_dist=True)
    env = dict(os.environ)
    p = subprocess.Popen([sys.executable, "-c", KILLED, path], stdout=subprocess.PIPE, env=env)
    assert p.stdout.readline().strip() == b"saving"
    # kill once its data file is growing
    deadline = time.time() + 60
    while time.time() < deadline:
        if any(n.endswith(".distcp") and n != "__0_0.distcp" for n in os.listdir(path)):
            break
        time.sleep(0.01)
    time.sleep(0.2)
    p.send_signal(signal.SIGKILL)
    p.wait()
    out = {"a": torch.zeros(1000)}
    tdcp.load(out, storage_reader=dcp_torch.FileSystemReader(path), no_dist=True)
    assert torch.equal(out["a"], prev["a"])
    tdcp.load(out, storage_reader=tdcp.FileSystemReader(path), no_dist=True)
    assert torch.equal(out["a"], prev["a"])
    # the next save takes the dead writer's lock over and removes its leftovers
    tdcp.save(prev, storage_writer=dcp_torch.FileSystemWriter(path), no_dist=True)
    assert len(os.listdir(path)) == 2
