"""dcp_torch's own save / load / async_save against torch.distributed.checkpoint's
and against dcp's C engine (issue 31, item 6).

In one run, on the state of bench/py_dropin_bench.py (GPT-2 small + AdamW,
fp32, the tensors of bench/torch_dcp_bench.py and bench/gpt2_state.h: every
tensor a DTensor Shard(0) over a 1-D CPU mesh, the step a replicated 0-d
tensor, three values), 4 gloo ranks (torch.multiprocessing spawn):

1. save, on tmpfs and on the disk, in turn run by run (the order rotated
   every run): torch's `torch.distributed.checkpoint.save(sd,
   checkpoint_id=)`, `dcp_torch.save(sd, checkpoint_id=)`, and dcp's C
   engine on the same state: `mpirun -n 4 build/io_bench save DIR --runs 2`
   (the program behind results.json's save_gbps_4rank / tmpfs_save_gbps:
   dcp_save over MPI, C state from bench/gpt2_state.h, the same bytes),
   started by rank 0 between the Python calls while the Python ranks wait
   in a barrier; its second run is taken (a warm context, as dcp_torch's
   after the warm-up save every rank makes first). On tmpfs also the
   extension's engine call alone (`ctx.save` on entries built beforehand:
   dcp's engine over the TorchComm communicator, without the Python
   flattening): where the Python API's time goes.
2. load, the same way (each implementation reads what it wrote, into a
   zeroed state; the first load of each checked element by element; before
   every disk load the page cache dropped).
3. async_save, tmpfs: the time `dcp_torch.async_save` blocks (slowest
   rank) against a memcpy of the same rank state (`copy_` of every local
   tensor into tensors allocated and faulted in beforehand), and torch's
   `async_save` (given a dedicated gloo group, `dist.new_group(backend=
   "gloo")`, as its docs recommend) blocking time; after a warm-up save of
   each; every future waited for before the next save.

Time: the whole collective call, between barriers, slowest rank. Peak RSS:
VmHWM of each rank over the call (reset just before through
/proc/self/clear_refs), worst rank, state included (io_bench: its own
VmHWM the same way). Ratios: median of one / median of the other, range
from the extremes.

    PYTHONPATH=build/python .venv/bin/python bench/py_api_bench.py \
        [--build build] [--runs 3] [--no-disk] [--profile]
    ... bench/py_api_bench.py --smoke      # 2 ranks, tiny state, 1 run

--profile: after the timed runs, one cProfile'd dcp_torch save, load and
async_save on rank 0 (tmpfs), the top functions written to
BUILD/py_api_profile.txt. --smoke writes nothing unless --out is given.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import py_dropin_bench as drop  # noqa: E402  (memory, page cache, figures, markers)

BEGIN = "<!-- py-api-bench: begin (bench/py_api_bench.py writes this section) -->"
END = "<!-- py-api-bench: end -->"
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def log(msg):
    print(f"[py_api_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def io_bench(cfg, op, path, runs):
    """dcp's C engine: mpirun -n WORLD io_bench op path; its JSON runs."""
    exe = shutil.which("mpirun") or shutil.which("mpiexec")
    cmd = [exe] + (["--oversubscribe"] if "mpirun" in exe else []) + [
        "-n", str(cfg["world"]), os.path.join(cfg["build"], "io_bench"), op, path,
        "--runs", str(runs)] + cfg["scale"]
    p = subprocess.run(cmd, env=dict(os.environ, **MPI_ENV), stdout=subprocess.PIPE,
                       text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"io_bench {op} failed ({p.returncode})")
    return [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]


# ---------------------------------------------------------------- the ranks

def rank_main(rank, cfg):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as tdcp
    from torch.distributed.device_mesh import init_device_mesh

    import torch_dcp_bench as tdb
    import dcp_torch
    from dcp_torch import api as dapi

    torch.set_num_threads(1)
    world = cfg["world"]
    # a rendezvous file, not a port (a free port races with other processes)
    dist.init_process_group("gloo", init_method="file://" + cfg["store"], rank=rank,
                            world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    params = tdb.gpt2_params(*cfg["gpt2"]) if cfg["gpt2"] else tdb.gpt2_params()
    sd, total = tdb.build(params, mesh, rank, world, fill=True)
    runs, out = cfg["runs"], []
    async_group = dist.new_group(backend="gloo")  # torch's async_save's, as its docs say

    # Phases of dcp_torch.save / load, slowest rank: wrappers around the
    # module's helpers (the engine's own call is the rest).
    ph = {}

    def wrap(mod, name, key):
        f = getattr(mod, name, None)
        if f is None:  # another version of the package
            return

        def w(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                ph[key] = ph.get(key, 0.0) + time.perf_counter() - t
        setattr(mod, name, w)

    import dcp_torch._metadata as dmeta
    wrap(dapi, "_context", "context")
    wrap(dapi, "_entries_save", "entries")      # Stateful, flatten, chunk lists, host tensors
    wrap(dapi, "_agree", "agree")               # every rank's pre-collective check (gathered)
    wrap(dmeta, "read_metadata", "metadata")    # save's return value, read back
    wrap(dapi, "_flatten", "flatten")           # load: flatten_state_dict
    wrap(dapi, "_boxes", "boxes")               # load: chunk lists (also inside entries)

    def allmax(x):
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def timed(fn):
        """fn() on every rank: (slowest rank's seconds, peaks, phases)."""
        gc.collect()
        ph.clear()
        ok = drop.reset_peak()
        base = drop.vm("VmRSS")
        dist.barrier()
        t0 = time.perf_counter()
        r = fn()
        dt = time.perf_counter() - t0
        dist.barrier()
        t1 = time.perf_counter() - t0
        peaks = [None] * world
        dist.all_gather_object(peaks, (drop.vm("VmHWM"), base) if ok else None)
        extra.clear()
        extra.extend(None if p is None else round(p[0] - p[1], 1) for p in peaks)
        peaks = [None if p is None else p[0] for p in peaks]
        phases = {k: allmax(ph.get(k, 0.0)) for k in ("context", "entries", "agree",
                                                      "metadata", "flatten", "boxes")}
        return allmax(t1), allmax(dt), peaks, phases, r

    def zero():
        for name, _ in params:
            s = sd["optim"]["state"][name]
            for t in (sd["model"][name], s["exp_avg"], s["exp_avg_sq"]):
                t.to_local().zero_()
            s["step"].zero_()

    def refill():
        """The saved values back (the async phase saves after the loads)."""
        for k, (name, shape) in enumerate(params):
            _, n = tdb.local_rows(shape[0], rank, world)
            s = sd["optim"]["state"][name]
            for m, t in enumerate((sd["model"][name], s["exp_avg"], s["exp_avg_sq"])):
                g = torch.Generator().manual_seed(k * 16 + m * 4 + rank)
                t.to_local().copy_(torch.rand((n,) + tuple(shape[1:]), generator=g))
            s["step"].fill_(1000.0)

    def fresh(path):
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
            os.sync()
        dist.barrier()

    def c_run(op, path):
        """io_bench on rank 0 while the others wait; its figures to all."""
        res = [None]
        if rank == 0:
            try:
                res = [io_bench(cfg, op, path, 2)]
            except Exception as e:  # noqa: BLE001 - every rank fails
                res = [repr(e)]
        dist.broadcast_object_list(res, src=0)
        if isinstance(res[0], str):
            raise RuntimeError(res[0])
        return res[0]

    extra = []  # the last timed call's peak above the RSS before it, per rank

    def record(**kw):
        if "peak_rss_mib" in kw and kw.get("impl") != "c" and "extra_rss_mib" not in kw:
            kw["extra_rss_mib"] = list(extra)
        out.append(kw)
        if rank == 0:
            more = "".join(f", {k} {v:.3f} s" for k, v in kw.get("phases", {}).items() if v)
            log(f"{kw['op']} {kw['fs']} {kw['impl']} run {kw['run']}: {kw['seconds']:.3f} s"
                + (f", peak RSS {max(p or 0 for p in kw['peak_rss_mib']):.0f} MiB"
                   if kw.get("peak_rss_mib") else "") + more
                + (f", {kw['bad_elements']} bad elements" if kw.get("bad_elements") else ""))

    tmpfs = [b for f, b in cfg["dirs"] if f == "tmpfs"][0]

    # Warm-up: one save of each Python implementation (the first call
    # makes dcp_torch's context and gloo group, imports torch's planners).
    for impl in ("torch", "dcp_torch"):
        p = os.path.join(tmpfs, "warm_" + impl)
        fresh(p)
        sec, _, _, _, _ = timed(lambda: (tdcp if impl == "torch" else dcp_torch).save(
            sd, checkpoint_id=p))
        record(op="save", fs="tmpfs", impl=impl, run=-1, seconds=sec, warmup=True)
        fresh(p)

    # The engine's call alone (diagnostic): entries built once, untimed.
    ectx = dapi._context(None, False, io_depth=0, direct=True)
    entries, keep = dapi._entries_save(sd)

    for fs, base in cfg["dirs"]:
        impls = ["torch", "dcp_torch", "c"] + (["engine"] if fs == "tmpfs" else [])
        for run in range(runs):
            order = impls[run % len(impls):] + impls[:run % len(impls)]
            for impl in order:
                path = os.path.join(base, "save_" + impl)
                fresh(path)
                if impl == "c":
                    rs = c_run("save", path)
                    for r in rs:
                        record(op="save", fs=fs, impl="c", run=run, seconds=r["seconds"],
                               c_run=r["run"], peak_rss_mib=r["peak_rss_mib"],
                               c_phases=r.get("phase_max_seconds"), bytes=r["bytes"],
                               extra_rss_mib=r.get("extra_rss_mib"),
                               warmup=r["run"] == 0)
                    continue
                if impl == "torch":
                    fn = lambda: tdcp.save(sd, checkpoint_id=path)  # noqa: E731
                elif impl == "dcp_torch":
                    fn = lambda: dcp_torch.save(sd, checkpoint_id=path)  # noqa: E731
                else:
                    fn = lambda: ectx.save(entries, path, 0, False, False)  # noqa: E731
                sec, own, peaks, phases, _ = timed(fn)
                record(op="save", fs=fs, impl=impl, run=run, seconds=sec, call_seconds=own,
                       peak_rss_mib=peaks, bytes=total,
                       phases={k: v for k, v in phases.items()
                               if k in ("context", "entries", "agree", "metadata")}
                       if impl == "dcp_torch" else {})
    del entries, keep
    # The load's engine call alone (diagnostic): entries as dcp_torch.load
    # makes them (the state's own tensors), built once.
    from dcp_torch._engine import tensor_code
    lctx = dapi._context(None, False)
    lentries, lkeep = [], []
    flat, mappings = dapi._flatten(dapi._resolve_stateful(sd))
    for key, v in flat.items():
        path_t = tuple(mappings.get(key, (key,)))
        if isinstance(v, torch.Tensor):
            shape, boxes = dapi._boxes(v, key)
            for off, size, loc in boxes:
                t = loc.detach()
                lkeep.append(t)
                lentries.append((0, path_t, tensor_code(t, key), shape, off, size, t.data_ptr()))
        else:
            lentries.append((1, path_t, v))
    del flat, mappings
    for fs, base in cfg["dirs"]:
        impls = ["torch", "dcp_torch", "c"] + (["engine", "per_rank"] if fs == "tmpfs" else [])
        for run in range(runs):
            order = impls[run % len(impls):] + impls[:run % len(impls)]
            for impl in order:
                path = os.path.join(base, "save_" + ("dcp_torch" if impl in ("engine", "per_rank")
                                                     else impl))
                if impl == "c":
                    rs = c_run("load", path)  # evicts with fadvise itself
                    for r in rs:
                        record(op="load", fs=fs, impl="c", run=run, seconds=r["seconds"],
                               c_run=r["run"], peak_rss_mib=r["peak_rss_mib"],
                               bad_elements=r["bad_elements"], bytes=r["bytes"],
                               extra_rss_mib=r.get("extra_rss_mib"),
                               warmup=r["run"] == 0)
                    continue
                zero()
                how = None
                if rank == 0 and fs == "disk":
                    how = drop.drop_cache(path)
                if impl == "torch":
                    fn = lambda: tdcp.load(sd, checkpoint_id=path)  # noqa: E731
                elif impl == "dcp_torch":
                    fn = lambda: dcp_torch.load(sd, checkpoint_id=path)  # noqa: E731
                elif impl == "per_rank":  # every rank reads what it needs itself
                    fn = lambda: dcp_torch.load(sd, checkpoint_id=path,  # noqa: E731
                                                read_once=False)
                else:
                    fn = lambda: lctx.load(lentries, path,  # noqa: E731
                                           dapi._LOAD_ALLOW_UNEXPECTED
                                           | dapi._LOAD_SMALL_PER_RANK)
                sec, own, peaks, phases, _ = timed(fn)
                bad = 0
                if run == 0:
                    b = torch.tensor([tdb.check(params, sd, rank, world)])
                    dist.all_reduce(b)
                    bad = int(b.item())
                record(op="load", fs=fs, impl=impl, run=run, seconds=sec, call_seconds=own,
                       peak_rss_mib=peaks, bytes=total, cache=how, bad_elements=bad,
                       phases={k: v for k, v in phases.items()
                               if k in ("context", "agree", "flatten", "boxes")}
                       if impl == "dcp_torch" else {})
    del lentries, lkeep
    for fs, base in cfg["dirs"]:
        for impl in ("torch", "dcp_torch", "c", "engine"):
            fresh(os.path.join(base, "save_" + impl))

    # async_save: blocking time against a memcpy of this rank's state.
    refill()
    local = []
    for name, _ in params:
        s = sd["optim"]["state"][name]
        local += [sd["model"][name].to_local(), s["exp_avg"].to_local(),
                  s["exp_avg_sq"].to_local(), s["step"]]
    def memcpy():
        """copy_ of every local tensor into tensors allocated and faulted
        in beforehand (untimed); the slowest rank's seconds. The copies are
        freed before the saves (their peak RSS is the saves' own)."""
        dst = [torch.empty_like(t) for t in local]
        for d in dst:
            d.fill_(1.0)
        gc.collect()
        dist.barrier()
        t0 = time.perf_counter()
        for d, t in zip(dst, local):
            d.copy_(t)
        return allmax(time.perf_counter() - t0)

    def asave(impl, path):
        if impl == "torch":
            return tdcp.async_save(sd, checkpoint_id=path, process_group=async_group)
        return dcp_torch.async_save(sd, checkpoint_id=path)

    def async_once(impl, run):
        path = os.path.join(tmpfs, "async_" + impl)
        fresh(path)
        gc.collect()
        ok = drop.reset_peak()
        base = drop.vm("VmRSS")
        dist.barrier()
        t0 = time.perf_counter()
        fut = asave(impl, path)
        blk = time.perf_counter() - t0
        fut.result()
        done = time.perf_counter() - t0
        dist.barrier()
        peaks = [None] * world
        dist.all_gather_object(peaks, (drop.vm("VmHWM"), base) if ok else None)
        extra.clear()
        extra.extend(None if p is None else round(p[0] - p[1], 1) for p in peaks)
        return allmax(blk), allmax(done), [None if p is None else p[0] for p in peaks]

    for impl in ("torch", "dcp_torch"):  # warm-up: staging buffers, groups, threads
        blk, done, peaks = async_once(impl, -1)
        record(op="async", fs="tmpfs", impl=impl, run=-1, seconds=blk, commit_seconds=done,
               peak_rss_mib=peaks, warmup=True)
    for run in range(runs):
        mc = memcpy()
        record(op="memcpy", fs="ram", impl="copy_", run=run, seconds=mc, bytes=total)
        for impl in (("dcp_torch", "torch") if run % 2 == 0 else ("torch", "dcp_torch")):
            blk, done, peaks = async_once(impl, run)
            record(op="async", fs="tmpfs", impl=impl, run=run, seconds=blk, commit_seconds=done,
                   peak_rss_mib=peaks, memcpy_seconds=mc, bytes=total)
    for impl in ("torch", "dcp_torch"):
        fresh(os.path.join(tmpfs, "async_" + impl))

    if cfg["profile"]:
        out.append({"op": "profile", "text": profile(rank, sd, tmpfs, dist, dcp_torch, zero)})
    if rank == 0:
        with open(cfg["result"], "w") as f:
            json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


def profile(rank, sd, tmpfs, dist, dcp_torch, zero):
    """One cProfile'd dcp_torch save, load and async_save (rank 0 profiled,
    the others plain); the top functions of each as text."""
    import cProfile
    import pstats
    text = []
    path = os.path.join(tmpfs, "profile")

    def one(what, fn):
        gc.collect()
        dist.barrier()
        pr = cProfile.Profile() if rank == 0 else None
        t0 = time.perf_counter()
        if pr:
            pr.enable()
        r = fn()
        if pr:
            pr.disable()
        sec = time.perf_counter() - t0
        dist.barrier()
        if pr:
            for sort in ("cumulative", "tottime"):
                s = io.StringIO()
                pstats.Stats(pr, stream=s).sort_stats(sort).print_stats(28)
                text.append(f"==== {what}: {sec:.3f} s on rank 0 (profiled), sorted by {sort}\n"
                            + s.getvalue())
        return r

    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    dist.barrier()
    one("dcp_torch.save, tmpfs", lambda: dcp_torch.save(sd, checkpoint_id=path))
    zero()
    one("dcp_torch.load, tmpfs", lambda: dcp_torch.load(sd, checkpoint_id=path))
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    dist.barrier()
    fut = one("dcp_torch.async_save (the blocking call), tmpfs",
              lambda: dcp_torch.async_save(sd, checkpoint_id=path))
    fut.result()
    dist.barrier()
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    return "\n".join(text)


def run_ranks(world, runs, dirs, gpt2, tmp, build, scale, prof):
    import torch.multiprocessing as mp
    result = os.path.join(tmp, "ranks.json")
    cfg = {"world": world, "runs": runs, "dirs": dirs, "gpt2": gpt2, "build": build,
           "scale": scale, "profile": prof, "store": os.path.join(tmp, "store"), "result": result}
    mp.spawn(rank_main, args=(cfg,), nprocs=world, join=True)
    with open(result) as f:
        return json.load(f)


# ---------------------------------------------------------------- figures

def figures(recs):
    res = {}
    timed = [r for r in recs if not r.get("warmup") and r["op"] not in ("profile",)]

    def sel(op, fs, impl, key="seconds"):
        return [r.get(key) for r in timed if (r["op"], r["fs"], r["impl"]) == (op, fs, impl)]

    def peaks(op, fs, impl, key="peak_rss_mib"):
        return [max(p) for p in sel(op, fs, impl, key) if p and None not in p]

    for fs, sfx in (("tmpfs", ""), ("disk", "_disk")):
        for op in ("save", "load"):
            t, d, c = sel(op, fs, "torch"), sel(op, fs, "dcp_torch"), sel(op, fs, "c")
            if not t or not d:
                continue
            res[f"py_{op}_vs_torch{sfx}"] = drop.ratio(t, d)
            if c:
                res[f"py_{op}_vs_c{sfx}"] = drop.ratio(c, d)
            for impl, pre in (("torch", "py_torch_api"), ("dcp_torch", "py_api"),
                              ("c", "py_c_engine"), ("engine", "py_engine_call")):
                v = sel(op, fs, impl)
                if not v:
                    continue
                res[f"{pre}_{op}_seconds{sfx}"] = drop.fig(v, "s")
                pk = peaks(op, fs, impl)
                if pk:
                    res[f"{pre}_{op}_peak_rss_mib{sfx}"] = drop.fig(pk, "MiB", 1)
                ex = peaks(op, fs, impl, "extra_rss_mib")
                if ex:
                    res[f"{pre}_{op}_extra_rss_mib{sfx}"] = drop.fig(ex, "MiB", 1)
            e = sel(op, fs, "engine")
            if e:
                res[f"py_{op}_vs_engine_call{sfx}"] = drop.ratio(e, d)
            pr = sel(op, fs, "per_rank")
            if pr:
                res[f"py_api_{op}_per_rank_reads_seconds{sfx}"] = drop.fig(pr, "s")
                res[f"py_{op}_per_rank_reads_vs_read_once{sfx}"] = drop.ratio(d, pr)
    # async: per run, the ratio of the slowest rank's block to its memcpy
    mc = sel("memcpy", "ram", "copy_")
    if mc:
        for impl, pre in (("dcp_torch", "py_async"), ("torch", "py_torch_async")):
            blk = sel("async", "tmpfs", impl)
            if not blk:
                continue
            per = [r["seconds"] / r["memcpy_seconds"] for r in timed
                   if (r["op"], r["impl"]) == ("async", impl)]
            res[f"{pre}_block_vs_memcpy"] = drop.fig(per, "x memcpy", 2)
            res[f"{pre}_block_ms"] = drop.fig([x * 1e3 for x in blk], "ms", 1)
            res[f"{pre}_commit_seconds"] = drop.fig(sel("async", "tmpfs", impl,
                                                        "commit_seconds"), "s")
            pk = peaks("async", "tmpfs", impl)
            if pk:
                res[f"{pre}_peak_rss_mib"] = drop.fig(pk, "MiB", 1)
            ex = peaks("async", "tmpfs", impl, "extra_rss_mib")
            if ex:
                res[f"{pre}_extra_rss_mib"] = drop.fig(ex, "MiB", 1)
            w = [max(r["extra_rss_mib"]) for r in recs if r.get("warmup") and
                 (r["op"], r["impl"]) == ("async", impl) and r.get("extra_rss_mib")
                 and None not in r["extra_rss_mib"]]
            if w:
                res[f"{pre}_first_extra_rss_mib"] = drop.fig(w, "MiB", 1)
        res["py_async_memcpy_ms"] = drop.fig([x * 1e3 for x in mc], "ms", 1)
        if "py_async_block_vs_memcpy" in res and "py_torch_async_block_ms" in res:
            res["py_async_block_vs_torch"] = drop.ratio(
                sel("async", "tmpfs", "torch"), sel("async", "tmpfs", "dcp_torch"))
    return res


def phase_medians(recs, op, fs):
    """Medians of dcp_torch's phases (slowest rank) in op on fs."""
    ps = [r["phases"] for r in recs if not r.get("warmup") and r["op"] == op
          and r["fs"] == fs and r["impl"] == "dcp_torch" and r.get("phases")]
    keys = sorted({k for p in ps for k in p})
    return {k: statistics.median(p.get(k, 0.0) for p in ps) for k in keys}


def c_phase_medians(recs, fs):
    ps = [r["c_phases"] for r in recs if not r.get("warmup") and r["op"] == "save"
          and r["fs"] == fs and r["impl"] == "c" and r.get("c_phases")]
    keys = [k for k in (ps[0] if ps else {})]
    return {k: statistics.median(p[k] for p in ps) for k in keys}


TARGETS = {"py_save_vs_torch": (">=", 3.0), "py_load_vs_torch": (">=", 5.0),
           "py_save_vs_c": (">=", 0.9), "py_async_block_vs_memcpy": ("<=", 1.2)}


def met(key, f):
    t = TARGETS.get(key)
    if not t:
        return ""
    ok = f["value"] >= t[1] if t[0] == ">=" else f["value"] <= t[1]
    return f"{t[0]} {t[1]}: " + ("met" if ok else "missed")


def section(res, recs, cond):
    def v(key, nd=3):
        f = res.get(key)
        if not f:
            return "n/a"
        return f"{f['value']:.{nd}f} [{f['min']:.{nd}f}, {f['max']:.{nd}f}]"

    L = [BEGIN, "## PyTorch programs on dcp: `dcp_torch.save` / `load` / `async_save` against "
         "torch and the C engine (issue 31 item 6, `make bench`)", ""]
    L.append(
        f"Run {cond['date']} on {cond['machine']}, shared with other engineers' builds "
        f"(load average {cond['load_before']} before, {cond['load_after']} after; every "
        f"process `nice -n {cond['nice']}`). torch {cond['torch']}, Python {cond['python']}, "
        f"dcp_torch {cond['dcp_torch']}. Script: [`bench/py_api_bench.py`](py_api_bench.py).")
    L.append("")
    L.append(
        f"State: GPT-2 small + AdamW, fp32, {cond['bytes'] / 1e9:.3f} GB (as in the drop-in "
        "section (`bench/py_dropin_bench.py`): DTensors `Shard(0)` on a 1-D CPU mesh, a "
        "replicated 0-d `step` per parameter, "
        f"three values), {cond['world']} gloo ranks (torch.multiprocessing spawn, one thread "
        "each). Compared, in turn run by run (the order rotated every run), "
        f"{cond['runs']} runs each, median [min, max]: torch's "
        "`torch.distributed.checkpoint.save/load(sd, checkpoint_id=)` (its defaults: "
        "FileSystemWriter, one file per rank, fsync), `dcp_torch.save/load(sd, "
        "checkpoint_id=)` (defaults: fsync, O_DIRECT where the file system allows, CRCs "
        "written and checked), and dcp's C engine on the same state: `mpirun -n "
        f"{cond['world']} build/io_bench save|load DIR --runs 2` (the program and call "
        "behind `save_gbps_4rank` and `tmpfs_save_gbps`: `dcp_save`/`dcp_load` over MPI, the "
        f"state of `bench/gpt2_state.h`, the same tensors and bytes, {cond['world']} MPI "
        "processes on the same cores and the same directory), started by rank 0 between the "
        f"Python calls while the {cond['world']} Python ranks wait in a barrier; of its two "
        "runs the second is taken (a "
        "warm context, as the Python ranks' after their untimed warm-up save). The "
        "\"engine call\" rows are the extension's `Context.save` on entries built "
        "beforehand: dcp's engine over the torch.distributed communicator (TorchComm, gloo), "
        "without `dcp_torch.save`'s Python work. Time: the whole collective call, between "
        "barriers, slowest rank. Peak RSS: VmHWM over the call, worst rank, state and runtime "
        f"included. tmpfs: `{cond['tmpfs_dir']}` ({cond['tmpfs_fs']}); disk: "
        f"`{cond['disk_dir']}` ({cond['disk_fs']}); every save writes a fresh directory; "
        f"before every disk load the page cache was {cond['cache']} (io_bench: its files "
        f"evicted with posix_fadvise). Each first load checked every element: {cond['bad']} "
        "wrong.")
    L.append("")
    L.append("| key | what | median [min, max] | target |")
    L.append("|---|---|---|---|")
    rows = [
        ("py_save_vs_torch", "save, tmpfs: torch's save time / dcp_torch.save's"),
        ("py_load_vs_torch", "load, tmpfs: torch's load time / dcp_torch.load's"),
        ("py_save_vs_torch_disk", "save, disk: torch / dcp_torch"),
        ("py_load_vs_torch_disk", "load, disk (page cache dropped): torch / dcp_torch"),
        ("py_save_vs_c", "save, tmpfs: C engine (io_bench, MPI) time / dcp_torch.save's"),
        ("py_save_vs_c_disk", "save, disk: C engine / dcp_torch"),
        ("py_load_vs_c", "load, tmpfs: C engine / dcp_torch.load"),
        ("py_load_vs_c_disk", "load, disk: C engine / dcp_torch"),
        ("py_save_vs_engine_call", "save, tmpfs: the engine call alone / dcp_torch.save"),
        ("py_load_vs_engine_call", "load, tmpfs: the engine call alone / dcp_torch.load"),
        ("py_load_per_rank_reads_vs_read_once", "load, tmpfs: dcp_torch.load's time / the "
                                                "same with `read_once=False` (diagnostic)"),
        ("py_async_block_vs_memcpy", "`dcp_torch.async_save` blocking time / a `copy_` of "
                                     "the rank's state into preallocated tensors (per run)"),
        ("py_torch_async_block_vs_memcpy", "torch's `async_save` (dedicated gloo group) "
                                           "blocking time / the same memcpy"),
        ("py_async_block_vs_torch", "torch's async_save blocking time / dcp_torch's"),
    ]
    for key, what in rows:
        if key in res:
            L.append(f"| `{key}` | {what} | {v(key, 2)} | {met(key, res[key])} |")
    L.append("")
    def rss(pre):
        p, x = res.get(pre.replace("@", "peak")), res.get(pre.replace("@", "extra"))
        if not p:
            return "n/a"
        return f"{p['value']:.0f}" + (f" (+{x['value']:.0f})" if x else "")

    L.append("Times (s, slowest rank), medians [min, max]; peak RSS (MiB, worst rank, median; "
             "in brackets the peak above the RSS just before the call: what the call itself "
             "allocated):")
    L.append("")
    L.append("| fs | op | torch | dcp_torch | C engine (io_bench) | engine call | torch RSS | "
             "dcp_torch RSS | C engine RSS |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    for fs, sfx in (("tmpfs", ""), ("disk", "_disk")):
        for op in ("save", "load"):
            if f"py_api_{op}_seconds{sfx}" not in res:
                continue
            L.append(f"| {fs} | {op} | {v(f'py_torch_api_{op}_seconds{sfx}')} | "
                     f"{v(f'py_api_{op}_seconds{sfx}')} | {v(f'py_c_engine_{op}_seconds{sfx}')} | "
                     f"{v(f'py_engine_call_{op}_seconds{sfx}')} | "
                     f"{rss(f'py_torch_api_{op}_@_rss_mib{sfx}')} | "
                     f"{rss(f'py_api_{op}_@_rss_mib{sfx}')} | "
                     f"{rss(f'py_c_engine_{op}_@_rss_mib{sfx}')} |")
    L.append("")
    if "py_async_block_ms" in res:
        L.append("async_save, tmpfs (after one warm-up save of each; every future waited for "
                 "before the next save; the memcpy measured in the same run just before):")
        L.append("")
        L.append("| | blocks ms | until commit s | peak RSS MiB (+ above the RSS before) | "
                 "first save: MiB above the RSS before |")
        L.append("|---|---|---|---|---|")
        L.append(f"| dcp_torch.async_save | {v('py_async_block_ms', 1)} | "
                 f"{v('py_async_commit_seconds')} | {rss('py_async_@_rss_mib')} | "
                 f"{v('py_async_first_extra_rss_mib', 0)} |")
        L.append(f"| torch async_save | {v('py_torch_async_block_ms', 1)} | "
                 f"{v('py_torch_async_commit_seconds')} | {rss('py_torch_async_@_rss_mib')} | "
                 f"{v('py_torch_async_first_extra_rss_mib', 0)} |")
        L.append(f"| memcpy (`copy_`) | {v('py_async_memcpy_ms', 1)} | | | |")
        L.append("")
        L.append("Both async implementations run in the same processes: each keeps its "
                 "staging memory between saves (dcp's cached staging buffers, torch's staged "
                 "copy), so each one's absolute peak includes the other's; the first save's "
                 "growth is what each allocates for staging.")
        L.append("")
    for op, fs in (("save", "tmpfs"), ("load", "tmpfs"), ("save", "disk"), ("load", "disk")):
        p = phase_medians(recs, op, fs)
        if p:
            L.append(f"dcp_torch.{op} on {fs}, medians of the slowest rank's seconds in its "
                     "Python steps: " + ", ".join(f"{k} {x:.3f}" for k, x in p.items())
                     + " (the rest of the call is the engine's).")
            L.append("")
    for fs in ("tmpfs", "disk"):
        p = c_phase_medians(recs, fs)
        if p:
            L.append(f"C engine save on {fs}, medians of the slowest rank's phase seconds: "
                     + ", ".join(f"{k} {x:.3f}" for k, x in p.items() if x) + ".")
            L.append("")
    L.append("Reproduce: `make bench` (this step: `PYTHONPATH=build/python .venv/bin/python "
             "bench/py_api_bench.py --build build --runs $(PY_BENCH_RUNS)`); `--smoke` for a "
             "seconds-long check (2 ranks, tiny state, 1 run); `--profile` adds one "
             "cProfile'd save, load and async_save of rank 0 (build/py_api_profile.txt).")
    L.append(END)
    return "\n".join(L) + "\n"


def write_section(path, text):
    old = open(path).read() if os.path.exists(path) else "# Benchmark results\n"
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        new = head + text + ("\n" + tail if tail else "")
    else:
        new = old.rstrip("\n") + "\n\n" + text
    with open(path, "w") as f:
        f.write(new)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--tmpfs-dir", default="/dev/shm")
    ap.add_argument("--disk-dir", default=None,
                    help="a directory on the disk (default: BUILD/py_api_bench.tmp)")
    ap.add_argument("--no-disk", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", default=None,
                    help="folder of results.json and RESULTS.md (default: bench/; --smoke: none)")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()

    build = os.path.abspath(a.build)
    pydir = os.path.join(build, "python")
    if os.path.isdir(pydir) and pydir not in sys.path:
        sys.path.insert(0, pydir)
        os.environ["PYTHONPATH"] = pydir + (os.pathsep + os.environ["PYTHONPATH"]
                                            if os.environ.get("PYTHONPATH") else "")
    import torch
    import dcp_torch
    if not os.access(os.path.join(build, "io_bench"), os.X_OK):
        raise SystemExit(f"{build}/io_bench not found: cmake --build {a.build} --target io_bench")
    if not (shutil.which("mpirun") or shutil.which("mpiexec")):
        raise SystemExit("py_api_bench: mpirun not found (the C engine's save runs under MPI)")

    gpt2, scale = None, []
    out = a.out if a.out is not None else (None if a.smoke else HERE)
    if a.smoke:
        a.runs, a.world = 1, 2
        gpt2, scale = (2, 1000, 128, 256), ["--scale", "small"]  # io_bench's --scale small
    disk_root = a.disk_dir or os.path.join(build, "py_api_bench.tmp")
    tag = f"py_api_bench.{os.getpid()}"
    tmpfs = os.path.join(a.tmpfs_dir, tag)
    disk = os.path.join(disk_root, tag)
    dirs = [("tmpfs", tmpfs)] + ([] if a.no_disk else [("disk", disk)])
    for _, d in dirs:
        os.makedirs(d, exist_ok=True)
    t_start = time.perf_counter()
    load_before, source = drop.loadavg(), drop.source_state()
    nice = os.nice(0)
    log(f"{a.world} ranks, {a.runs} runs, dirs {[d for _, d in dirs]}, nice {nice}")
    try:
        recs = run_ranks(a.world, a.runs, dirs, gpt2, tmpfs, build, scale, a.profile)
    finally:
        for _, d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        if not a.disk_dir:
            try:
                os.rmdir(disk_root)
            except OSError:
                pass
    prof = [r["text"] for r in recs if r["op"] == "profile"]
    recs = [r for r in recs if r["op"] != "profile"]
    res = figures(recs)
    bad = sum(r.get("bad_elements") or 0 for r in recs)
    caches = sorted({r["cache"] for r in recs if r.get("cache")})
    cache = {"drop_caches": "dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`, as root)",
             "fadvise": "not dropped (no permission): each checkpoint file was evicted "
                        "with `posix_fadvise(DONTNEED)` after `fdatasync`"}
    cond = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": drop.machine(), "load_before": load_before, "load_after": drop.loadavg(),
            "nice": nice, "torch": torch.__version__, "python": platform.python_version(),
            "dcp_torch": f"{dcp_torch.__version__} (libdcp {dcp_torch.libdcp_version}, "
                         f"built from {source})",
            "bytes": next(r["bytes"] for r in recs if r.get("bytes")), "world": a.world,
            "runs": a.runs, "tmpfs_dir": a.tmpfs_dir, "tmpfs_fs": drop.fs_of(a.tmpfs_dir),
            "disk_dir": disk_root, "disk_fs": drop.fs_of(os.path.dirname(disk_root)),
            "cache": " and ".join(cache.get(c, c) for c in caches) or "n/a", "bad": bad}
    for k, f in res.items():
        print(f"{k}: {f['value']} {f['unit']} ({f['min']}..{f['max']}) {met(k, f)}")
    for op, fs in (("save", "tmpfs"), ("load", "tmpfs"), ("save", "disk"), ("load", "disk")):
        p = phase_medians(recs, op, fs)
        if p:
            print(f"dcp_torch.{op} {fs} phases: " + ", ".join(f"{k} {x:.3f}" for k, x in p.items()))
    log(f"done in {time.perf_counter() - t_start:.0f} s")
    if out:
        os.makedirs(out, exist_ok=True)
        drop.merge_results(os.path.join(out, "results.json"), res)
        write_section(os.path.join(out, "RESULTS.md"), section(res, recs, cond))
        log(f"wrote {out}/results.json and RESULTS.md")
    if os.path.isdir(build):
        with open(os.path.join(build, "py_api_runs.json"), "w") as f:
            json.dump({"ranks": recs, "conditions": cond}, f, indent=1)
        if prof:
            with open(os.path.join(build, "py_api_profile.txt"), "w") as f:
                f.write("\n".join(prof))
            log(f"profile: {build}/py_api_profile.txt")
    if bad:
        log(f"{bad} wrong elements after a load")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
