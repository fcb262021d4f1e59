"""Shared helpers of dcp_torch's tests: real torch process groups (gloo
ranks on loopback) started with torch.multiprocessing. The ranks meet
through a file (torch's FileStore) in a fresh directory, not a TCP port:
a port found free and then bound by the store races with every other
process on the machine (ctest runs suites side by side; gloo's own
connections take ephemeral ports), which failed a tutorial run with
EADDRINUSE."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, store: str, fn, args, errq) -> None:
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
        fn(rank, world, *args)
        dist.barrier()
    except BaseException:
        errq.put((rank, traceback.format_exc()))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(world: int, fn, *args, timeout: float = 300) -> None:
    """Runs fn(rank, world, *args) on world gloo ranks; fails with every
    failing rank's traceback."""
    ctx = mp.get_context("spawn")
    errq = ctx.SimpleQueue()
    rdzv = tempfile.mkdtemp(prefix="dcp_torch_rdzv_")
    store = os.path.join(rdzv, "store")
    procs = [ctx.Process(target=_entry, args=(r, world, store, fn, args, errq))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
    shutil.rmtree(rdzv, ignore_errors=True)
    errs = []
    while not errq.empty():
        errs.append(errq.get())
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if errs or bad:
        msg = "\n".join(f"rank {r}:\n{tb}" for r, tb in sorted(errs))
        pytest.fail(f"ranks failed (exit codes {[p.exitcode for p in procs]}):\n{msg}")


@pytest.fixture
def ckpt(tmp_path):
    return str(tmp_path / "ckpt")
