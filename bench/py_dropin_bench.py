"""dcp_torch's drop-in storage against torch's own, through
torch.distributed.checkpoint.save / load (issue 28, item 6).

In one run:

1. The benchmark state (GPT-2 small + AdamW, fp32, the keys and tensors of
   bench/torch_dcp_bench.py and bench/gpt2_state.h: every tensor a DTensor
   sharded by rows, Shard(0), over a 1-D CPU mesh; the step a replicated
   0-d tensor; three hyper-parameters as values) saved and loaded by 4 gloo
   ranks (torch.multiprocessing spawn, 127.0.0.1, a free port) with
   torch's FileSystemWriter / FileSystemReader and with dcp_torch's, both
   with their default arguments, on tmpfs (/dev/shm) and on the disk. The
   two alternate run by run (the first of each pair swapped every run);
   every save writes a fresh directory (the previous one removed first and,
   on the disk, synced: not timed); before every disk load the page cache
   is dropped (`echo 3 > /proc/sys/vm/drop_caches`, else each file evicted
   with posix_fadvise). The loads read the checkpoint the same
   implementation saved, into a zeroed state; the first load of each is
   checked element by element. Time: the whole collective call, between
   barriers, slowest rank. Peak RSS: VmHWM of each rank over the call (the
   peak reset just before it through /proc/self/clear_refs), worst rank,
   state included.
2. A big `.metadata` (bench/plan_sim's FSDP-style layout, written with
   PLAN_SIM_DUMP) decoded into torch's Metadata objects by
   dcp_torch.read_metadata against pickle.load (what torch's
   FileSystemReader.read_metadata calls), each in a fresh process,
   alternating; peak RSS is that process's VmHWM.

Figures: bench/results.json (keys py_dropin_* and py_metadata_*, other keys
kept) and this benchmark's section of bench/RESULTS.md.

    PYTHONPATH=build/python .venv/bin/python bench/py_dropin_bench.py \
        [--build build] [--runs 3] [--meta-ranks 1024] [--meta-tensors 2000]
    ... bench/py_dropin_bench.py --smoke      # 2 ranks, tiny state, 1 run
    ... bench/py_dropin_bench.py --only-meta --meta-ranks 4096   # the metadata alone

--only-meta merges only the py_metadata_* keys and replaces only the
metadata paragraph (between its own markers) and row of the section.

--smoke writes nothing unless --out is given; it exits non-zero when a load
reads a wrong element or a step fails.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
IMPLS = ("torch", "dcp_torch")
BEGIN = "<!-- py-dropin-bench: begin (bench/py_dropin_bench.py writes this section) -->"
END = "<!-- py-dropin-bench: end -->"
META_BEGIN = "<!-- py-metadata: begin -->"
META_END = "<!-- py-metadata: end -->"


def log(msg):
    print(f"[py_dropin_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- memory

def reset_peak():
    """Resets this process's VmHWM to its current RSS (Linux >= 4.0);
    False when the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def vm(field):
    """A /proc/self/status field in MiB (VmHWM, VmRSS), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ---------------------------------------------------------------- page cache

def evict(d):
    """Every file under d out of the page cache (after its data is on disk)."""
    for dirpath, _, names in os.walk(d):
        for name in names:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def drop_cache(d):
    """'drop_caches' when the kernel's page cache was dropped, 'fadvise'
    when only d's files were evicted."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return "drop_caches"
    except OSError:
        evict(d)
        return "fadvise"


# ---------------------------------------------------------------- the ranks

def rank_main(rank, cfg):
    """One of the world ranks: every save, then every load, in turn."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg["port"])
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    sys.path.insert(0, HERE)
    import torch_dcp_bench as tdb  # the state: gpt2_params, build, check
    import dcp_torch

    torch.set_num_threads(1)  # as torchrun's OMP_NUM_THREADS=1
    world = cfg["world"]
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    params = tdb.gpt2_params(*cfg["gpt2"]) if cfg["gpt2"] else tdb.gpt2_params()
    runs, out = cfg["runs"], []

    def timing(obj, names, acc):
        """obj with each method of names adding its time to acc[0]: the
        time spent in the storage class, the rest being torch's (planning,
        collectives, waiting for the other ranks)."""
        for name in names:
            def timed_method(*args, _f=getattr(obj, name), **kw):
                t = time.perf_counter()
                try:
                    return _f(*args, **kw)
                finally:
                    acc[0] += time.perf_counter() - t
            setattr(obj, name, timed_method)
        return obj

    def writer(impl, path, acc):
        w = (dcp.FileSystemWriter if impl == "torch" else dcp_torch.FileSystemWriter)(path)
        return timing(w, ("set_up_storage_writer", "prepare_local_plan", "prepare_global_plan",
                          "write_data", "finish"), acc)

    def reader(impl, path, acc):
        r = (dcp.FileSystemReader if impl == "torch" else dcp_torch.FileSystemReader)(path)
        return timing(r, ("read_metadata", "set_up_storage_reader", "prepare_local_plan",
                          "prepare_global_plan", "read_data"), acc)

    def timed(fn, acc):
        gc.collect()
        peak_ok = reset_peak()
        dist.barrier()
        t0, c0 = time.perf_counter(), cpu_seconds()
        fn()
        c1 = cpu_seconds()
        dist.barrier()
        t1 = time.perf_counter()
        t = torch.tensor([t1 - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        c = torch.tensor([c1 - c0], dtype=torch.float64)
        dist.all_reduce(c, op=dist.ReduceOp.SUM)
        s = torch.tensor([acc[0]], dtype=torch.float64)
        dist.all_reduce(s, op=dist.ReduceOp.MAX)
        info = [None] * world
        dist.all_gather_object(info, (vm("VmHWM") if peak_ok else None))
        return float(t.item()), float(c.item()), info, float(s.item())

    def zero(sd):
        for name, _ in params:
            s = sd["optim"]["state"][name]
            for t in (sd["model"][name], s["exp_avg"], s["exp_avg_sq"]):
                t.to_local().zero_()
            s["step"].zero_()

    for op in ("save", "load"):
        sd, total = tdb.build(params, mesh, rank, world, fill=op == "save")
        for fs, base in cfg["dirs"]:
            for run in range(runs):
                order = IMPLS if run % 2 == 0 else IMPLS[::-1]
                for impl in order:
                    path = os.path.join(base, impl)
                    how, bad, acc = None, 0, [0.0]
                    if op == "save":
                        if rank == 0:
                            shutil.rmtree(path, ignore_errors=True)
                            os.sync()
                        st = writer(impl, path, acc)
                        sec, cpu, peaks, sto = timed(lambda: dcp.save(sd, storage_writer=st), acc)
                    else:
                        zero(sd)
                        if rank == 0 and fs == "disk":
                            how = drop_cache(path)
                        st = reader(impl, path, acc)
                        sec, cpu, peaks, sto = timed(lambda: dcp.load(sd, storage_reader=st), acc)
                        if run == 0:
                            b = torch.tensor([tdb.check(params, sd, rank, world)])
                            dist.all_reduce(b)
                            bad = int(b.item())
                    rec = {"op": op, "fs": fs, "impl": impl, "run": run, "seconds": sec,
                           "cpu_seconds": cpu, "storage_seconds": sto, "bytes": total, "gbps": total / sec / 1e9,
                           "peak_rss_mib": [None if p is None else round(p, 1) for p in peaks],
                           "cache": how, "bad_elements": bad}
                    if rank == 0:
                        log(f"{op} {fs} {impl} run {run}: {sec:.3f} s (storage class {sto:.3f} s) "
                            f"({total / sec / 1e9:.3f} GB/s), peak RSS "
                            f"{max((p or 0) for p in peaks):.0f} MiB"
                            + (f", cache {how}" if how else "")
                            + (f", {bad} bad elements" if bad else ""))
                    out.append(rec)
        del sd
        gc.collect()
    if rank == 0:
        with open(cfg["result"], "w") as f:
            json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world, runs, dirs, gpt2, tmp):
    import torch.multiprocessing as mp
    result = os.path.join(tmp, "ranks.json")
    cfg = {"world": world, "runs": runs, "dirs": dirs, "gpt2": gpt2,
           "port": free_port(), "result": result}
    mp.spawn(rank_main, args=(cfg,), nprocs=world, join=True)
    with open(result) as f:
        return json.load(f)


# ---------------------------------------------------------------- metadata

def meta_child(mode, path, gc_off):
    """One decode in this fresh process; prints seconds and peak RSS."""
    import pickle

    import torch.distributed.checkpoint  # noqa: F401  (the classes pickle names)
    import dcp_torch

    base = vm("VmRSS")
    reset_peak()
    if gc_off:
        gc.disable()
    t0 = time.perf_counter()
    if mode == "dcp_torch":
        md = dcp_torch.read_metadata(path)
    else:
        with open(os.path.join(path, ".metadata"), "rb") as f:
            md = pickle.load(f)  # torch's FileSystemReader.read_metadata
    sec = time.perf_counter() - t0
    chunks = sum(len(getattr(v, "chunks", ())) for v in md.state_dict_metadata.values())
    print(json.dumps({"mode": mode, "seconds": sec, "peak_rss_mib": vm("VmHWM"),
                      "base_rss_mib": base, "entries": len(md.state_dict_metadata),
                      "chunks": chunks, "storage_items": len(md.storage_data)}))


def make_metadata(build, ranks, tensors, d):
    exe = os.path.join(build, "plan_sim")
    if not os.access(exe, os.X_OK):
        raise SystemExit(f"{exe} not found: build it (cmake --build {build} --target plan_sim)")
    os.makedirs(d, exist_ok=True)
    env = dict(os.environ, PLAN_SIM_DUMP=os.path.join(d, ".metadata"))
    env.pop("PLAN_SIM_BLOBS", None)
    t0 = time.perf_counter()
    subprocess.run([exe, str(ranks), str(tensors), "1"], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    size = os.path.getsize(os.path.join(d, ".metadata"))
    log(f"plan_sim {ranks} x {tensors}: .metadata {size / 2**20:.1f} MiB "
        f"({time.perf_counter() - t0:.1f} s)")
    return size


def run_meta(path, runs, gc_off=False):
    recs = []
    for run in range(runs):
        order = ("pickle", "dcp_torch") if run % 2 == 0 else ("dcp_torch", "pickle")
        for mode in order:
            cmd = [sys.executable, os.path.abspath(__file__), "--meta-child", mode, path]
            if gc_off:
                cmd.append("--gc-off")
            r = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
            rec = json.loads(r.stdout.strip().splitlines()[-1])
            rec["run"] = run
            rec["gc_off"] = gc_off
            log(f"metadata {mode}{' (gc off)' if gc_off else ''} run {run}: "
                f"{rec['seconds']:.2f} s, peak RSS {rec['peak_rss_mib']:.0f} MiB "
                f"({rec['chunks']} chunks)")
            recs.append(rec)
    return recs


# ---------------------------------------------------------------- figures

def fig(values, unit, nd=3):
    return {"value": round(statistics.median(values), nd), "unit": unit,
            "min": round(min(values), nd), "max": round(max(values), nd)}


def ratio(num, den):
    """median(num) / median(den), the range from the extremes (as s3_bench)."""
    return {"value": round(statistics.median(num) / statistics.median(den), 2), "unit": "x",
            "min": round(min(num) / max(den), 2), "max": round(max(num) / min(den), 2)}


def figures(recs, meta, meta_nogc):
    res = {}
    sel = lambda op, fs, impl, key: [r[key] for r in recs  # noqa: E731
                                     if (r["op"], r["fs"], r["impl"]) == (op, fs, impl)]
    for fs, suffix in (("tmpfs", ""), ("disk", "_disk")):
        for op in ("save", "load"):
            t = sel(op, fs, "torch", "seconds")
            d = sel(op, fs, "dcp_torch", "seconds")
            if not t or not d:
                continue
            res[f"py_dropin_{op}_vs_torch{suffix}"] = ratio(t, d)
            res[f"py_dropin_{op}_storage_vs_torch{suffix}"] = ratio(
                sel(op, fs, "torch", "storage_seconds"), sel(op, fs, "dcp_torch", "storage_seconds"))
            for impl, pre in (("torch", "py_torch"), ("dcp_torch", "py_dropin")):
                res[f"{pre}_{op}_seconds{suffix}"] = fig(sel(op, fs, impl, "seconds"), "s")
                res[f"{pre}_{op}_storage_seconds{suffix}"] = fig(
                    sel(op, fs, impl, "storage_seconds"), "s")
                peaks = [max(p) for p in sel(op, fs, impl, "peak_rss_mib") if None not in p]
                if peaks:
                    res[f"{pre}_{op}_peak_rss_mib{suffix}"] = fig(peaks, "MiB", 1)
                cpu = [c / b * 1e9 for c, b in zip(sel(op, fs, impl, "cpu_seconds"),
                                                   sel(op, fs, impl, "bytes"))]
                res[f"{pre}_{op}_cpu_s_per_gb{suffix}"] = fig(cpu, "CPU s/GB")
    for recs_m, suffix in ((meta, ""), (meta_nogc, "_gc_off")):
        if not recs_m:
            continue
        p = [r["seconds"] for r in recs_m if r["mode"] == "pickle"]
        d = [r["seconds"] for r in recs_m if r["mode"] == "dcp_torch"]
        res[f"py_metadata_read_vs_pickle{suffix}"] = ratio(p, d)
        if suffix:
            continue
        res["py_metadata_read_seconds"] = fig(d, "s")
        res["py_metadata_pickle_seconds"] = fig(p, "s")
        for mode, key in (("dcp_torch", "py_metadata_read_peak_rss_mib"),
                          ("pickle", "py_metadata_pickle_peak_rss_mib")):
            res[key] = fig([r["peak_rss_mib"] for r in recs_m if r["mode"] == mode], "MiB", 1)
    return res


def merge_results(path, figs):
    """figs merged into the results.json at path (other keys kept, in order)."""
    res = {}
    if os.path.exists(path):
        with open(path) as f:
            res = json.load(f)
    res.update(figs)
    with open(path, "w") as f:
        f.write("{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}"
                                   for k, v in res.items()) + "\n}\n")


def machine():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem:.1f} GiB, Linux {platform.release()}"


def fs_of(path):
    """'type (device)' of the mount holding path."""
    best, what = "", "?"
    path = os.path.realpath(path)
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, typ = line.split()[:3]
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                    best, what = mnt, typ if dev == typ else f"{typ} ({dev})"
    except OSError:
        pass
    return what


def meta_block(res, meta_info):
    """The metadata paragraph and table of the section, between their own
    markers (--only-meta replaces just these)."""
    L = [META_BEGIN]
    L.append(
        (f"Measured {meta_info['when']}. " if meta_info.get("when") else "") +
        f"Metadata: `build/plan_sim {meta_info['ranks']} {meta_info['tensors']}` with "
        f"`PLAN_SIM_DUMP` ({meta_info['ranks']} ranks x {meta_info['tensors']} tensors, "
        f"FSDP-style row shards: {meta_info['chunks']:,} chunks, "
        f"{meta_info['storage_items']:,} storage items, {meta_info['size'] / 2**20:.1f} MiB "
        f"of `.metadata`, on tmpfs). {meta_info['why']} Each decode in a fresh process "
        "(the interpreter, torch and dcp_torch imported first, not timed), alternating, "
        f"{meta_info['runs']} runs each; peak RSS is that process's VmHWM (after import: "
        f"{meta_info['base']:.0f} MiB). The Python garbage collector as a program has it "
        "(on); the `_gc_off` ratio is the same with `gc.disable()` around the call, "
        f"{meta_info['gc_off_runs']} run(s) each, to show where the time goes.")
    L.append("")
    L.append("| key | median | min | max | unit |")
    L.append("|---|---|---|---|---|")
    for key in ("py_metadata_read_seconds", "py_metadata_pickle_seconds",
                "py_metadata_read_peak_rss_mib", "py_metadata_pickle_peak_rss_mib",
                "py_metadata_read_vs_pickle", "py_metadata_read_vs_pickle_gc_off"):
        if key in res:
            f = res[key]
            L.append(f"| `{key}` | {f['value']} | {f['min']} | {f['max']} | {f['unit']} |")
    L.append(META_END)
    return "\n".join(L)


def section(res, recs, meta_info, cond):
    """This benchmark's section of RESULTS.md."""
    def v(key, nd=3):
        f = res.get(key)
        if not f:
            return "n/a", "n/a", "n/a"
        fmt = lambda x: f"{x:.{nd}f}"  # noqa: E731
        return fmt(f["value"]), fmt(f["min"]), fmt(f["max"])

    L = [BEGIN, "## PyTorch programs on dcp: drop-in FileSystemWriter/Reader and metadata "
         "without pickle (issue 28 item 6, `make bench`)", ""]
    L.append(
        f"Run {cond['date']} on {cond['machine']}, shared with other engineers' builds "
        f"(load average {cond['load_before']} before, {cond['load_after']} after; "
        f"every process `nice -n {cond['nice']}`). torch {cond['torch']}, Python "
        f"{cond['python']}, dcp_torch {cond['dcp_torch']}. Script: "
        "[`bench/py_dropin_bench.py`](py_dropin_bench.py).")
    L.append("")
    L.append(
        f"State: GPT-2 small + AdamW, fp32, {cond['bytes'] / 1e9:.3f} GB (the tensors of "
        "`bench/torch_dcp_bench.py` / `bench/gpt2_state.h`: parameters, exp_avg, "
        "exp_avg_sq, each a DTensor `Shard(0)` on a 1-D CPU mesh, plus a replicated 0-d "
        f"`step` per parameter and three values), {cond['world']} gloo ranks "
        "(torch.multiprocessing spawn, one thread each), `torch.distributed.checkpoint."
        "save`/`load` with `storage_writer=`/`storage_reader=` torch's `FileSystemWriter`/"
        "`FileSystemReader` or `dcp_torch`'s, default arguments (one file per rank, fsync; "
        "dcp: O_DIRECT where the file system allows it, CRCs written and checked). "
        f"{cond['runs']} runs of each, alternating (the order swapped every run); median "
        "[min, max]; time = the whole collective call, slowest rank, between barriers. "
        f"tmpfs: `{cond['tmpfs_dir']}` ({cond['tmpfs_fs']}); disk: `{cond['disk_dir']}` "
        f"({cond['disk_fs']}). Every save writes a fresh directory (the previous removed and "
        f"synced first, not timed). Before every disk load the page cache was "
        f"{cond['cache']}. Loads read the checkpoint the same implementation wrote, into a "
        f"zeroed state; the first load of each checked every element: {cond['bad']} wrong.")
    L.append("")
    L.append("| key | what | median | min | max | target |")
    L.append("|---|---|---|---|---|---|")
    tgt = {"py_dropin_save_vs_torch": 1.5, "py_dropin_load_vs_torch": 1.5,
           "py_metadata_read_vs_pickle": 1.0}
    rows = [
        ("py_dropin_save_vs_torch", "save, tmpfs: torch time / dcp_torch time"),
        ("py_dropin_load_vs_torch", "load, tmpfs: torch time / dcp_torch time"),
        ("py_dropin_save_vs_torch_disk", "save, disk: torch time / dcp_torch time"),
        ("py_dropin_load_vs_torch_disk", "load, disk (page cache dropped): torch / dcp_torch"),
        ("py_metadata_read_vs_pickle", "`.metadata` into torch objects: pickle.load time / "
                                       "dcp_torch.read_metadata time"),
        ("py_dropin_save_storage_vs_torch", "save, tmpfs, time in the storage class only "
                                            "(torch's / dcp_torch's)"),
        ("py_dropin_load_storage_vs_torch", "load, tmpfs, time in the storage class only"),
        ("py_dropin_save_storage_vs_torch_disk", "save, disk, time in the storage class only"),
        ("py_dropin_load_storage_vs_torch_disk", "load, disk, time in the storage class only"),
    ]
    for key, what in rows:
        m, lo, hi = v(key, 2)
        t = tgt.get(key)
        status = ""
        if t is not None and key in res:
            status = f">= {t}: " + ("met" if res[key]["value"] >= t else "missed")
        L.append(f"| `{key}` | {what} | {m} | {lo} | {hi} | {status} |")
    L.append("")
    L.append("Times and memory, medians (s in storage class: the time spent inside the "
             "writer's or reader's methods, slowest rank; the rest of the call is torch's "
             "planning, its collectives over gloo and waiting for the other ranks, the same "
             "code for both; peak RSS: VmHWM over the call, worst rank, state and Python/torch "
             "runtime included; CPU: user + system of all ranks per GB):")
    L.append("")
    L.append("| fs | op | torch s | dcp_torch s | torch GB/s | dcp_torch GB/s | torch s in "
             "storage class | dcp_torch s in storage class | torch peak RSS MiB | dcp_torch "
             "peak RSS MiB | torch CPU s/GB | dcp_torch CPU s/GB |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for fs, suffix in (("tmpfs", ""), ("disk", "_disk")):
        for op in ("save", "load"):
            ts, tlo, thi = v(f"py_torch_{op}_seconds{suffix}")
            ds, dlo, dhi = v(f"py_dropin_{op}_seconds{suffix}")
            if ts == "n/a":
                continue
            gb = cond["bytes"] / 1e9
            tr = v(f"py_torch_{op}_peak_rss_mib{suffix}", 1)[0]
            dr = v(f"py_dropin_{op}_peak_rss_mib{suffix}", 1)[0]
            tc = v(f"py_torch_{op}_cpu_s_per_gb{suffix}", 2)[0]
            dc = v(f"py_dropin_{op}_cpu_s_per_gb{suffix}", 2)[0]
            tst = v(f"py_torch_{op}_storage_seconds{suffix}")[0]
            dst = v(f"py_dropin_{op}_storage_seconds{suffix}")[0]
            L.append(f"| {fs} | {op} | {ts} [{tlo}, {thi}] | {ds} [{dlo}, {dhi}] | "
                     f"{gb / float(ts):.3f} | {gb / float(ds):.3f} | {tst} | {dst} | {tr} | {dr} | "
                     f"{tc} | {dc} |")
    L.append("")
    if meta_info:
        L.append(meta_block(res, meta_info))
        L.append("")
    L.append("Reproduce: `make bench` (this step: `PYTHONPATH=build/python .venv/bin/python "
             "bench/py_dropin_bench.py --build build --runs $(PY_BENCH_RUNS)`); "
             "`--smoke` for a seconds-long check (2 ranks, tiny state, 1 run).")
    L.append(END)
    return "\n".join(L) + "\n"


def replace_meta(path, block, ratio_fig):
    """The metadata paragraph and table of the section replaced by block
    (between META_BEGIN/META_END, or, in a section written before those
    markers, from its "Metadata:" paragraph to "Reproduce:"), and the
    section's py_metadata_read_vs_pickle row brought up to date."""
    text = open(path).read() if os.path.exists(path) else ""
    if BEGIN not in text or END not in text:
        log(f"{path}: no section of this benchmark; RESULTS.md not changed")
        return
    head, rest = text.split(BEGIN, 1)
    sec, tail = rest.split(END, 1)
    if META_BEGIN in sec and META_END in sec:
        a, b = sec.split(META_BEGIN, 1)
        sec = a + block + b.split(META_END, 1)[1]
    else:
        i = sec.index("\nMetadata: `build/plan_sim")
        j = sec.index("\nReproduce: `make bench`")
        sec = sec[:i + 1] + block + "\n\n" + sec[j + 1:]
    if ratio_fig:
        out = []
        for line in sec.split("\n"):
            cells = line.split(" | ")
            if line.startswith("| `py_metadata_read_vs_pickle` |") and len(cells) == 6:
                cells[2:5] = [f"{ratio_fig[x]:.2f}" for x in ("value", "min", "max")]
                cells[5] = ">= 1.0: " + ("met" if ratio_fig["value"] >= 1.0 else "missed") + " |"
                line = " | ".join(cells)
            out.append(line)
        sec = "\n".join(out)
    with open(path, "w") as f:
        f.write(head + BEGIN + sec + END + tail)


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


# ---------------------------------------------------------------- main

def source_state():
    """The commit, and whether python/src differs from it (others' edits)."""
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "python/src"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + (" (python/src with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "?"


def loadavg():
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--tmpfs-dir", default="/dev/shm")
    ap.add_argument("--disk-dir", default=None,
                    help="a directory on the disk (default: BUILD/py_dropin_bench.tmp)")
    ap.add_argument("--meta-ranks", type=int, default=1024)
    ap.add_argument("--meta-tensors", type=int, default=2000)
    ap.add_argument("--meta-runs", type=int, default=3)
    ap.add_argument("--meta-gc-off-runs", type=int, default=1)
    ap.add_argument("--no-disk", action="store_true")
    ap.add_argument("--no-meta", action="store_true")
    ap.add_argument("--only-meta", action="store_true",
                    help="only the metadata decode: its keys merged into results.json, its "
                         "paragraph and row of the section replaced in RESULTS.md")
    ap.add_argument("--out", default=None,
                    help="folder of results.json and RESULTS.md (default: bench/; "
                         "--smoke: none)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--meta-child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--gc-off", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.meta_child:
        meta_child(a.meta_child[0], a.meta_child[1], a.gc_off)
        return 0

    build = os.path.abspath(a.build)
    pydir = os.path.join(build, "python")
    if os.path.isdir(pydir) and pydir not in sys.path:
        sys.path.insert(0, pydir)
        os.environ["PYTHONPATH"] = pydir + (os.pathsep + os.environ["PYTHONPATH"]
                                            if os.environ.get("PYTHONPATH") else "")
    import torch
    import dcp_torch

    gpt2 = None
    out = a.out if a.out is not None else (None if a.smoke else HERE)
    if a.smoke:
        a.runs, a.world, a.meta_runs = 1, 2, 1
        a.meta_ranks, a.meta_tensors, a.meta_gc_off_runs = 16, 50, 0
        gpt2 = (2, 1000, 128, 256)  # io_bench's --scale small
    disk_root = a.disk_dir or os.path.join(build, "py_dropin_bench.tmp")
    tag = f"py_dropin_bench.{os.getpid()}"
    tmpfs = os.path.join(a.tmpfs_dir, tag)
    disk = os.path.join(disk_root, tag)
    dirs = [("tmpfs", tmpfs)] + ([] if a.no_disk or a.only_meta else [("disk", disk)])
    for _, d in dirs:
        os.makedirs(d, exist_ok=True)
    t_start = time.perf_counter()
    load_before, source = loadavg(), source_state()
    nice = os.nice(0)
    log(f"{a.world} ranks, {a.runs} runs, dirs {[d for _, d in dirs]}, nice {nice}")
    meta, meta_nogc, meta_info = [], [], None
    try:
        recs = [] if a.only_meta else run_ranks(a.world, a.runs, dirs, gpt2, tmpfs)
        for _, d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        if not a.no_meta:
            md = os.path.join(tmpfs, "meta")
            size = make_metadata(build, a.meta_ranks, a.meta_tensors, md)
            meta = run_meta(md, a.meta_runs)
            if a.meta_gc_off_runs:
                meta_nogc = run_meta(md, a.meta_gc_off_runs, gc_off=True)
            r0 = meta[0]
            why = ("(The plan_sim section's 4096 x 2000 case: see the notes below this "
                   "section.)" if a.meta_ranks < 4096 and not a.smoke else "")
            meta_info = {"ranks": a.meta_ranks, "tensors": a.meta_tensors, "size": size,
                         "chunks": r0["chunks"], "storage_items": r0["storage_items"],
                         "base": statistics.median(r["base_rss_mib"] for r in meta),
                         "why": why, "gc_off_runs": a.meta_gc_off_runs,
                         "runs": a.meta_runs,
                         "when": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} "
                                 f"UTC, load average {load_before} before, {loadavg()} after, "
                                 f"dcp_torch built from {source}"}
    finally:
        for _, d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        if not a.disk_dir:
            try:
                os.rmdir(disk_root)
            except OSError:
                pass
    res = figures(recs, meta, meta_nogc)
    if a.only_meta:
        for k, f in res.items():
            print(f"{k}: {f['value']} {f['unit']} ({f['min']}..{f['max']})")
        if out and meta_info:
            os.makedirs(out, exist_ok=True)
            merge_results(os.path.join(out, "results.json"), res)
            replace_meta(os.path.join(out, "RESULTS.md"), meta_block(res, meta_info),
                         res.get("py_metadata_read_vs_pickle"))
            log(f"wrote {out}/results.json and the metadata part of RESULTS.md")
        return 0
    bad = sum(r["bad_elements"] for r in recs)
    caches = sorted({r["cache"] for r in recs if r["cache"]})
    cache = {"drop_caches": "dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`, as root)",
             "fadvise": "not dropped (no permission): each checkpoint file was evicted "
                        "with `posix_fadvise(DONTNEED)` after `fdatasync`"}
    cond = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine(), "load_before": load_before, "load_after": loadavg(),
            "nice": nice, "torch": torch.__version__, "python": platform.python_version(),
            "dcp_torch": f"{dcp_torch.__version__} (libdcp {dcp_torch.libdcp_version}, "
                         f"built from {source})",
            "bytes": recs[0]["bytes"], "world": a.world, "runs": a.runs,
            "tmpfs_dir": a.tmpfs_dir, "tmpfs_fs": fs_of(a.tmpfs_dir),
            "disk_dir": disk_root, "disk_fs": fs_of(os.path.dirname(disk_root)),
            "cache": " and ".join(cache.get(c, c) for c in caches) or "n/a", "bad": bad}
    for k, f in res.items():
        print(f"{k}: {f['value']} {f['unit']} ({f['min']}..{f['max']})")
    log(f"done in {time.perf_counter() - t_start:.0f} s")
    if out:
        os.makedirs(out, exist_ok=True)
        merge_results(os.path.join(out, "results.json"), res)
        write_section(os.path.join(out, "RESULTS.md"), section(res, recs, meta_info, cond))
        log(f"wrote {out}/results.json and RESULTS.md")
    if os.path.isdir(build):  # every run's figures, for a closer look
        with open(os.path.join(build, "py_dropin_runs.json"), "w") as f:
            json.dump({"ranks": recs, "metadata": meta + meta_nogc, "conditions": cond}, f,
                      indent=1)
    if bad:
        log(f"{bad} wrong elements after a load")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
