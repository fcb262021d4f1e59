"""Shared helpers of dcp_torch's tests: real torch process groups (gloo
ranks on loopback) started with torch.multiprocessing."""

from __future__ import annotations

import os
import socket
import sys
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, fn, args, errq) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
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
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, fn, args, errq))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
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
