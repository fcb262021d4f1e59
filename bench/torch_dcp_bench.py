"""PyTorch DCP on the benchmark state, for comparison with dcp.

The same tensors as bench/gpt2_state.h: GPT-2 small with AdamW state, fp32,
every tensor a DTensor sharded by rows (Shard(0)) over the processes, the
AdamW step a replicated 0-d tensor, three hyper-parameters as values.
torch.distributed.checkpoint.save / load with their defaults
(FileSystemWriter: one file per rank, one thread, fsync), gloo.

Started once per process by bench/run_bench.py with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set:

    torch_dcp_bench.py save|load|replicated DIR [--runs R] [--scale small|medium]

replicated: every process loads every tensor whole (plain tensors of the
global shape, as a model replicated for inference or a DDP restart reads
them) from a checkpoint saved by `save` on 4 processes; the first run is
checked element by element against what those 4 processes wrote.

save writes a fresh DIR for each run (the previous one removed first, not
timed); load evicts DIR's files from the page cache before each run and
checks every element once. DIR may be s3://bucket/prefix (bench/s3_bench.py):
torch's FsspecWriter/FsspecReader over s3fs (from DCP_S3FS_DIR), against
AWS_ENDPOINT_URL. Rank 0 prints one JSON object per run, in the
shape io_bench prints.
"""

import json
import os
import resource
import shutil
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard


def gpt2_params(layers=12, vocab=50257, dim=768, ctx=1024):
    p = [("transformer.wte.weight", (vocab, dim)),
         ("transformer.wpe.weight", (ctx, dim))]
    for i in range(layers):
        h = f"transformer.h.{i}."
        p += [(h + "ln_1.weight", (dim,)), (h + "ln_1.bias", (dim,)),
              (h + "attn.c_attn.weight", (dim, 3 * dim)),
              (h + "attn.c_attn.bias", (3 * dim,)),
              (h + "attn.c_proj.weight", (dim, dim)),
              (h + "attn.c_proj.bias", (dim,)),
              (h + "ln_2.weight", (dim,)), (h + "ln_2.bias", (dim,)),
              (h + "mlp.c_fc.weight", (dim, 4 * dim)),
              (h + "mlp.c_fc.bias", (4 * dim,)),
              (h + "mlp.c_proj.weight", (4 * dim, dim)),
              (h + "mlp.c_proj.bias", (dim,))]
    p += [("transformer.ln_f.weight", (dim,)),
          ("transformer.ln_f.bias", (dim,))]
    return p


def local_rows(rows, rank, world):
    chunk = (rows + world - 1) // world
    start = min(chunk * rank, rows)
    return start, min(chunk, rows - start)


def build(params, mesh, rank, world, fill):
    """The nested state dict, and the local shards to check a load with."""
    model, ostate, total = {}, {}, 0
    for k, (name, shape) in enumerate(params):
        _, n = local_rows(shape[0], rank, world)
        lshape = (n,) + tuple(shape[1:])
        stride = tuple(int(torch.tensor(shape[i + 1:]).prod().item())
                       for i in range(len(shape)))
        dts = []
        for m in range(3):
            if fill:
                g = torch.Generator().manual_seed(k * 16 + m * 4 + rank)
                t = torch.rand(lshape, generator=g)
            else:
                t = torch.zeros(lshape)
            dts.append(DTensor.from_local(t, mesh, [Shard(0)],
                                          run_check=False,
                                          shape=torch.Size(shape),
                                          stride=stride))
            total += 4 * int(torch.tensor(shape).prod().item())
        model[name] = dts[0]
        ostate[name] = {"exp_avg": dts[1], "exp_avg_sq": dts[2],
                        "step": torch.tensor(1000.0 if fill else 0.0)}
    groups = [{"lr": 6e-4, "eps": 1e-8, "weight_decay": 0.1}]
    return {"model": model,
            "optim": {"state": ostate, "param_groups": groups}}, total


def build_full(params):
    """Every tensor whole (zeros), to load a replicated copy into."""
    model, ostate, total = {}, {}, 0
    for name, shape in params:
        ts = [torch.zeros(shape) for _ in range(3)]
        total += 3 * 4 * int(torch.tensor(shape).prod().item())
        model[name] = ts[0]
        ostate[name] = {"exp_avg": ts[1], "exp_avg_sq": ts[2],
                        "step": torch.tensor(0.0)}
    groups = [{"lr": 6e-4, "eps": 1e-8, "weight_decay": 0.1}]
    return {"model": model,
            "optim": {"state": ostate, "param_groups": groups}}, total


def check_full(params, sd, saved_world=4):
    """Elements that differ from what `save` on saved_world processes
    wrote (each tensor regenerated from the savers' shards)."""
    bad = 0
    for k, (name, shape) in enumerate(params):
        s = sd["optim"]["state"][name]
        got = [sd["model"][name], s["exp_avg"], s["exp_avg_sq"]]
        for m in range(3):
            parts = []
            for r in range(saved_world):
                _, n = local_rows(shape[0], r, saved_world)
                if n:
                    g = torch.Generator().manual_seed(k * 16 + m * 4 + r)
                    parts.append(torch.rand((n,) + tuple(shape[1:]),
                                            generator=g))
            bad += int((got[m] != torch.cat(parts)).sum().item())
        bad += int(s["step"].item() != 1000.0)
    return bad


def check(params, sd, rank, world):
    """Elements that differ from what the save wrote, regenerated one
    tensor at a time (no second copy of the state: the peak RSS stays
    the load's own)."""
    bad = 0
    for k, (name, shape) in enumerate(params):
        _, n = local_rows(shape[0], rank, world)
        lshape = (n,) + tuple(shape[1:])
        s = sd["optim"]["state"][name]
        got = [sd["model"][name], s["exp_avg"], s["exp_avg_sq"]]
        for m in range(3):
            g = torch.Generator().manual_seed(k * 16 + m * 4 + rank)
            want = torch.rand(lshape, generator=g)
            bad += int((got[m].to_local() != want).sum().item())
        bad += int(s["step"].item() != 1000.0)
    return bad


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def evict(d):
    for name in os.listdir(d):
        p = os.path.join(d, name)
        if os.path.isfile(p):
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def main():
    mode, path = sys.argv[1], sys.argv[2]
    runs, scale = 3, "full"
    args = sys.argv[3:]
    for i in range(0, len(args) - 1, 2):
        if args[i] == "--runs":
            runs = int(args[i + 1])
        elif args[i] == "--scale":
            scale = args[i + 1]
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    # the same configurations as io_bench's --scale (bench/io_bench.c)
    params = {"small": lambda: gpt2_params(2, 1000, 128, 256),
              "medium": lambda: gpt2_params(4, 4096, 384, 1024)}.get(
                  scale, gpt2_params)()
    save = mode == "save"
    if mode == "replicated":
        sd, total = build_full(params)
        total *= world  # every process reads every byte
    else:
        sd, total = build(params, mesh, rank, world, fill=save)
    s3 = path.startswith("s3://")
    if s3:
        sys.path.insert(0, os.environ["DCP_S3FS_DIR"])
        import s3fs
        from torch.distributed.checkpoint._fsspec_filesystem import (
            FsspecReader, FsspecWriter)
        opts = dict(endpoint_url=os.environ["AWS_ENDPOINT_URL"])
        fs = s3fs.S3FileSystem(**opts)
    for run in range(runs):
        if save and rank == 0:
            if s3:
                if fs.exists(path):
                    fs.rm(path, recursive=True)
            else:
                shutil.rmtree(path, ignore_errors=True)
                os.sync()
        if not save and rank == 0 and not s3:
            evict(path)
        dist.barrier()
        t0 = time.perf_counter()
        c0 = cpu_seconds()
        if save:
            if s3:
                dcp.save(sd, storage_writer=FsspecWriter(path, **opts))
            else:
                dcp.save(sd, checkpoint_id=path)
        elif s3:
            dcp.load(sd, storage_reader=FsspecReader(path, **opts))
        else:
            dcp.load(sd, checkpoint_id=path)
        c1 = cpu_seconds()
        dist.barrier()
        t1 = time.perf_counter()
        t = torch.tensor([t1 - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        c = torch.tensor([c1 - c0], dtype=torch.float64)
        dist.all_reduce(c, op=dist.ReduceOp.SUM)
        bad = 0
        if mode == "replicated" and run == 0:
            bad = check_full(params, sd)
        elif not save and run == 0:
            bad = check(params, sd, rank, world)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        info = [None] * world
        dist.all_gather_object(info, (peak, bad))
        if rank == 0:
            sec = float(t.item())
            print(json.dumps({
                "op": mode, "ranks": world, "run": run, "seconds": sec,
                "cpu_seconds": float(c.item()),
                "bytes": total, "gbps": total / sec / 1e9,
                "bad_elements": sum(x[1] for x in info),
                "peak_rss_mib": [round(x[0], 1) for x in info]}),
                flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
