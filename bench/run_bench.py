"""make bench: dcp's save and load against the disk's limit and PyTorch DCP.

Runs, in one go, on the GPT-2 small + AdamW state (bench/gpt2_state.h,
1.49 GB of fp32, every tensor sharded by rows):

  fio        sequential write (new file, fsync at the end) and read of the
             same number of bytes: O_DIRECT, 4 MiB blocks, io_uring (libaio
             when fio lacks it), with the best iodepth x numjobs of a sweep
             (Fio.SWEEP) run first; and the read through the page cache,
             for reference
  dcp        save and load on 1 rank and on 4 ranks, load of the 4-rank
             checkpoint on 3 ranks (resharding), with and without the CRC
             check, run by run in turn (reshard_verify_ratio, target >= 0.9), a 4-rank save from unaligned buffers (the copying path)
             and a 4-rank load through the page cache; peak RSS per rank,
             the save's memory beyond the state, CPU time per GB
  replicated every one of 4 ranks loading the whole state, read once (each
             stored chunk read by one rank and forwarded) and with
             DCP_LOAD_PER_RANK_READS, run by run in turn: the bytes read
             from storage over the state's bytes
             (replicated_load_read_amplification, target 1.0) and the
             time ratio (replicated_load_speedup_vs_per_rank);
             --only-replicated runs just these (and the 4-rank save they
             load) and merges their keys into results.json
  torch      torch.distributed.checkpoint save and load, 4 processes, gloo,
             DTensor Shard(0): the same tensors (bench/torch_dcp_bench.py)
  async      bench/async_bench (built with the library): how long
             dcp_save_async blocks against a memcpy of the same bytes
             (async_block_ratio, target <= 1.5) and the peak memory of a
             save with a staging budget (async_budget_peak_ratio), on tmpfs

Every figure is the median of --runs runs (5) with their min and max. The
fio runs alternate with the 4-rank dcp save and load runs, and the ratios
to fio are taken run by run, so that each pair sees the same disk and the
same load on a shared machine. The page cache is dropped (posix_fadvise)
before every load, and every save writes new files, as fio's write does. Writes bench/results.json (merging:
keys of other benchmarks are kept), the section of bench/RESULTS.md between
the io-bench markers (the rest is kept), bench/io_bench.png, and every run's
raw figures in bench/io_bench_runs.json (--report-only redoes the other
outputs from it).

    python bench/run_bench.py [--build build] [--data DIR] [--runs 5]
                              [--scale full|small] [--no-torch] [--out DIR]
                              [--report-only] [--issue16]

--issue16 runs only issue 16's figures side by side (the fio sweep and the
save/load paired with its best configuration, reshard_verify_ratio, the
replicated load read once / per rank / by PyTorch DCP, save and load on
tmpfs against PyTorch DCP, the save on tmpfs paired with the limit of plain
write() there, bench/tmpfs_limit.c) and merges them into results.json and
their own section of RESULTS.md.
"""

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BEGIN = "<!-- io-bench: begin (bench/run_bench.py writes this section) -->"
END = "<!-- io-bench: end -->"
RAW = "io_bench_runs.json"  # every run's figures, as measured
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1",
           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def log(*a):
    print("bench:", *a, file=sys.stderr, flush=True)


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def run_json(cmd, env=None, timeout=3600):
    """Runs cmd; returns the JSON objects it printed, one per line."""
    e = dict(os.environ)
    e.update(env or {})
    log(" ".join(cmd))
    p = subprocess.run(cmd, env=e, stdout=subprocess.PIPE, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"bench: {cmd[0]} failed ({p.returncode})")
    out = []
    for line in p.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


class Stage:
    """Runs of one kind, with the load average before the first and after
    the last."""

    def __init__(self, name):
        self.name = name
        self.before = loadavg()
        self.after = None
        self.runs = []

    def add(self, runs):
        for r in runs:
            if r.get("bad_elements", 0):
                raise SystemExit(f"bench: {self.name}: {r['bad_elements']} "
                                 "elements differ after a load")
        self.runs += runs
        self.after = loadavg()
        return self

    def done(self, runs):
        self.add(runs)
        if self.runs:
            g = [r["gbps"] for r in self.runs]
            log(f"{self.name}: " + " ".join(f"{x:.3f}" for x in g) + " GB/s")
        return self


def merge_results(path, figs):
    """figs merged into the results.json at path (other keys kept)."""
    res = {}
    if os.path.exists(path):
        with open(path) as f:
            res = json.load(f)
    res.update(figs)
    with open(path, "w") as f:
        f.write("{\n" + ",\n".join(
            f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in res.items())
            + "\n}\n")


def fig(values, unit, nd=3):
    return {"value": round(statistics.median(values), nd), "unit": unit,
            "min": round(min(values), nd), "max": round(max(values), nd)}


RO, PR = "dcp replicated load 4 ranks", "dcp replicated load 4, per-rank reads"


def replicated_stages(c4, runs, build, scale):
    """The replicated load, read once and per rank, run by run in turn."""
    ro, pr = Stage(RO), Stage(PR)
    for _ in range(runs):
        ro.add(run_json(mpirun(4, ["load", c4, "--runs", "1", "--replicated",
                                   "1"] + scale, build), MPI_ENV))
        pr.add(run_json(mpirun(4, ["load", c4, "--runs", "1", "--replicated",
                                   "1", "--per-rank", "1"] + scale, build),
                        MPI_ENV))
    return [ro.done([]), pr.done([])]


def replicated_figs(by):
    """results.json keys of the replicated load (when it ran)."""
    if RO not in by or PR not in by:
        return {}
    ro, pr = by[RO].runs, by[PR].runs
    return {
        "replicated_load_read_amplification": fig(
            [r["storage_bytes"] / r["bytes"] for r in ro], "x state bytes", 4),
        "replicated_load_per_rank_read_amplification": fig(
            [r["storage_bytes"] / r["bytes"] for r in pr], "x state bytes", 4),
        "replicated_load_seconds": fig([r["seconds"] for r in ro], "s", 3),
        "replicated_load_per_rank_seconds": fig([r["seconds"] for r in pr],
                                                "s", 3),
        # Each read-once run against the per-rank run right after it.
        "replicated_load_speedup_vs_per_rank": fig(
            [p["seconds"] / r["seconds"] for r, p in zip(ro, pr)], "x", 2),
    }


# ------------------------------------------------------------------ fio

def fio_cpu(job):
    return (job["usr_cpu"] + job["sys_cpu"]) / 100 * job["job_runtime"] / 1e3


class Fio:
    """fio runs on one file of the state's size (rounded down to 4 MiB)."""

    def __init__(self, data, nbytes):
        fio = shutil.which("fio")
        if not fio:
            raise SystemExit("bench: fio not found (scripts/deps.sh "
                             "installs it)")
        engines = subprocess.run([fio, "--enghelp"], stdout=subprocess.PIPE,
                                 text=True).stdout
        self.engine = "io_uring" if "io_uring" in engines else "libaio"
        self.fio = fio
        self.path = os.path.join(data, "fio.dat")
        # A multiple of 4 jobs x 4 MiB blocks (at least one of each).
        self.size = max(16 << 20, nbytes - nbytes % (16 << 20))
        # (iodepth, numjobs) of the write and of the read: the best of
        # SWEEP once sweep() ran, else fio's usual 8 x 1.
        self.conf = {"write": (8, 1), "read": (8, 1)}
        self.swept = {}

    def _cmd(self, rw):
        depth, jobs = self.conf[rw if rw in self.conf else "read"]
        # numjobs jobs over disjoint parts of one file, one group report.
        return [self.fio, "--filename=" + self.path, "--bs=4M",
                f"--iodepth={depth}", f"--numjobs={jobs}",
                f"--size={self.size // jobs}",
                f"--offset_increment={self.size // jobs}",
                "--group_reporting", "--ioengine=" + self.engine,
                "--direct=1", "--output-format=json", "--name=seq"]

    def _run(self, rw, extra):
        cmd = self._cmd(rw) + [f"--rw={rw}"] + extra
        log(" ".join(cmd[1:]))
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True,
                             check=True)
        j = json.loads(out.stdout)["jobs"][0]
        return {"gbps": j[rw]["bw_bytes"] / 1e9, "cpu_seconds": fio_cpu(j)}

    SWEEP = [(1, 1), (8, 1), (32, 1), (1, 4), (8, 4), (32, 4)]

    def sweep(self):
        """Every configuration of SWEEP once, write then read; the best of
        each becomes the one the paired runs use (the storage's limit is
        the best any of them reaches, not fio's default)."""
        for rw in ("write", "read"):
            best = None
            for c in self.SWEEP:
                self.conf[rw] = c
                if rw == "read" and not os.path.exists(self.path):
                    self.write()
                g = (self.write() if rw == "write" else self.read())["gbps"]
                self.swept[f"{rw} iodepth {c[0]} x {c[1]} jobs"] = round(g, 3)
                if best is None or g > best[0]:
                    best = (g, c)
            self.conf[rw] = best[1]
            log(f"fio {rw}: best iodepth {best[1][0]} x {best[1][1]} jobs, "
                f"{best[0]:.3f} GB/s")
        return self.swept

    def write(self):
        """A new file each time, as every save writes new files."""
        if os.path.exists(self.path):
            os.unlink(self.path)
        os.sync()
        return self._run("write", ["--end_fsync=1"])

    def read(self):
        return self._run("read", [])

    def read_buffered(self):
        """Through the page cache (dropped first), as PyTorch DCP reads."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return self._run("read", ["--direct=0"])

    def remove(self):
        if os.path.exists(self.path):
            os.unlink(self.path)


# ------------------------------------------------------------------ dcp

def mpirun(n, args, build, prog="io_bench"):
    exe = shutil.which("mpirun") or shutil.which("mpiexec")
    if not exe:
        raise SystemExit("bench: mpirun not found")
    cmd = [exe, "--oversubscribe", "-n", str(n)] if "mpirun" in exe else \
        [exe, "-n", str(n)]
    return cmd + [os.path.join(build, prog)] + args


def dcp_stage(name, n, mode, ckpt, runs, build, extra):
    s = Stage(name)
    args = [mode, ckpt, "--runs", str(runs)] + extra
    return s.done(run_json(mpirun(n, args, build), MPI_ENV))


def paired_fio_stages(fio, c4, R, build, scale, tag=""):
    """Each 4-rank dcp save and load right after a fio write / read, so
    that each pair sees the same disk and the same neighbours."""
    fw, ds = Stage("fio write" + tag), Stage("dcp save 4 ranks")
    for _ in range(R):
        fw.add([fio.write()])
        ds.add(run_json(mpirun(4, ["save", c4, "--runs", "1"] + scale,
                               build), MPI_ENV))
    fr, dl = Stage("fio read" + tag), Stage("dcp load 4 ranks")
    for _ in range(R):
        fr.add([fio.read()])
        dl.add(run_json(mpirun(4, ["load", c4, "--runs", "1"] + scale,
                               build), MPI_ENV))
    return fw, ds, fr, dl


def tmpfs_limit_stages(shm, d4, R, build, scale):
    """The limit of a save into tmpfs: 4 processes writing the state's
    bytes into new files with write() (bench/tmpfs_limit.c). Every
    configuration once (block size, fallocate first or not, threads per
    process; write_crc and memcpy for reference), then each 4-rank dcp
    save right after a run of
    the best write configuration, so that each pair sees the same machine.
    Returns the sweep {name: GB/s}, the best configuration, the paired
    stages (limit, dcp save)."""
    lim = os.path.join(shm, "limit")
    swept, best = {}, None
    for r in run_json(mpirun(4, [lim, "--runs", "1"] + scale, build,
                             "tmpfs_limit"), MPI_ENV):
        thr = f", {r['threads']} threads" if r["threads"] > 1 else ""
        name = r["op"] + (f" {r['block'] >> 20} MiB"
                          f"{', fallocate' if r['fallocate'] else ''}{thr}"
                          if r["op"].startswith("write") else "")
        swept[name] = round(r["gbps"], 3)
        if r["op"] == "write" and (best is None or r["gbps"] > best["gbps"]):
            best = r
    conf = ["--op", "write", "--block", str(best["block"]), "--fallocate",
            str(best["fallocate"]), "--threads", str(best["threads"])]
    lw = Stage(f"tmpfs write limit ({best['block'] >> 20} MiB"
               f"{', fallocate' if best['fallocate'] else ''}, "
               f"{best['threads']} thread(s))")
    ds = Stage("tmpfs dcp save 4")
    for _ in range(R):
        lw.add(run_json(mpirun(4, [lim, "--runs", "1"] + conf + scale, build,
                               "tmpfs_limit"), MPI_ENV))
        ds.add(run_json(mpirun(4, ["save", d4, "--runs", "1"] + scale,
                               build), MPI_ENV))
    shutil.rmtree(lim, ignore_errors=True)
    return swept, best, lw.done([]), ds.done([])


def reshard_verify_stages(c4, R, build, scale):
    """Loads 4 -> 3 with and without the CRC check, run by run in turn
    (reshard_verify_ratio)."""
    rv, rn = Stage("dcp load 4 to 3 ranks"), Stage("dcp load 4 to 3, no CRC")
    for _ in range(R):
        rv.add(run_json(mpirun(3, ["load", c4, "--runs", "1"] + scale,
                               build), MPI_ENV))
        rn.add(run_json(mpirun(3, ["load", c4, "--runs", "1", "--no-verify",
                                   "1"] + scale, build), MPI_ENV))
    return rv.done([]), rn.done([])


# ------------------------------------------------------------------ torch

def torch_stage(name, n, mode, ckpt, runs, extra):
    s = Stage(name)
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1")
        cmd = [sys.executable, os.path.join(HERE, "torch_dcp_bench.py"),
               mode, ckpt, "--runs", str(runs)] + extra
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      text=True))
    log(f"{n} x torch_dcp_bench.py {mode} {ckpt}")
    out = []
    for p in procs:
        o, _ = p.communicate(timeout=3600)
        if p.returncode != 0:
            raise SystemExit(f"bench: torch_dcp_bench.py failed "
                             f"({p.returncode})")
        out += [json.loads(l) for l in o.splitlines() if l.startswith("{")]
    return s.done(out)


# ------------------------------------------------------------------ report

def gbps(stage):
    return [r["gbps"] for r in stage.runs]


def cpu_per_gb(stage, nbytes):
    return [r["cpu_seconds"] / (nbytes / 1e9) for r in stage.runs]


def describe_machine(data):
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    fs = "?"
    if shutil.which("findmnt"):
        fs = subprocess.run(["findmnt", "-no", "FSTYPE", "-T", data],
                            stdout=subprocess.PIPE,
                            text=True).stdout.strip() or "?"
    dev = subprocess.run(["df", "--output=source", data],
                         stdout=subprocess.PIPE,
                         text=True).stdout.split()[-1]
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    ra = "?"
    base = os.path.basename(dev)
    for d in (base, base.rstrip("0123456789"), base.split("p")[0]):
        p = f"/sys/block/{d}/queue/read_ahead_kb"
        if d and os.path.exists(p):
            with open(p) as f:
                ra = f.read().strip()
            break
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gib": round(mem, 1),
            "kernel": platform.release(), "fs": fs, "device": dev,
            "read_ahead_kb": ra}


def write_outputs(res, stages, machine, meta, out_dir, plot):
    merge_results(os.path.join(out_dir, "results.json"), res)
    # RESULTS.md: our section only.
    mpath = os.path.join(out_dir, "RESULTS.md")
    text = open(mpath).read() if os.path.exists(mpath) else \
        "# Benchmark results\n"
    section = render_md(res, stages, machine, meta)
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        text = head + BEGIN + "\n" + section + END + tail
    else:
        text = text.rstrip("\n") + "\n\n" + BEGIN + "\n" + section + END + "\n"
    with open(mpath, "w") as f:
        f.write(text)
    if plot:
        draw(res, os.path.join(out_dir, "io_bench.png"), meta)


ROWS = [
    ("fio_write_gbps", "fio sequential write, new file + fsync (the limit)"),
    ("save_gbps_1rank", "dcp_save, 1 rank"),
    ("save_gbps_4rank", "dcp_save, 4 ranks"),
    ("save_gbps_4rank_unaligned", "dcp_save, 4 ranks, unaligned buffers "
     "(copied, CRC fused)"),
    ("torch_save_gbps_4rank", "PyTorch DCP save, 4 processes"),
    ("fio_read_gbps", "fio sequential read (the limit)"),
    ("load_gbps_1rank", "dcp_load, 1 rank"),
    ("load_gbps_4rank", "dcp_load, 4 ranks"),
    ("load_gbps_reshard_4to3", "dcp_load of the 4-rank checkpoint on 3 ranks"),
    ("load_gbps_reshard_4to3_noverify",
     "the same with DCP_LOAD_NO_VERIFY (reads only the bytes needed)"),
    ("torch_load_gbps_4rank", "PyTorch DCP load, 4 processes"),
    ("fio_read_buffered_gbps", "fio sequential read through the page cache "
     "(`--direct=0`, cache dropped first), for reference"),
    ("load_gbps_4rank_buffered", "dcp_load, 4 ranks, with DCP_IO_NO_DIRECT "
     "(page cache), for reference"),
    ("sync_save_extra_rss_mib", "dcp_save, 4 ranks: peak RSS beyond the state, "
     "worst rank"),
    ("sync_save_extra_rss_mib_unaligned", "the same, unaligned buffers "
     "(copied through dcp's I/O buffers)"),
    ("save_peak_rss_mib_4rank", "dcp_save, 4 ranks: peak RSS, worst rank "
     "(state included)"),
    ("load_peak_rss_mib_4rank", "dcp_load, 4 ranks: peak RSS, worst rank"),
    ("reshard_peak_rss_mib_3rank", "dcp_load 4 to 3: peak RSS, worst rank"),
    ("torch_save_peak_rss_mib_4rank", "PyTorch DCP save: peak RSS, worst "
     "process"),
    ("torch_load_peak_rss_mib_4rank", "PyTorch DCP load: peak RSS, worst "
     "process"),
    ("fio_write_cpu_s_per_gb", "CPU time per GB (user + system, all "
     "processes and kernel workers): fio write"),
    ("save_cpu_s_per_gb_4rank", "the same: dcp save, 4 ranks (CRC of every "
     "byte included)"),
    ("torch_save_cpu_s_per_gb_4rank", "the same: PyTorch DCP save"),
    ("fio_read_cpu_s_per_gb", "the same: fio read"),
    ("load_cpu_s_per_gb_4rank", "the same: dcp load, 4 ranks (CRC checked)"),
    ("torch_load_cpu_s_per_gb_4rank", "the same: PyTorch DCP load"),
    ("save_vs_fio_write", "dcp 4-rank save / fio write, each run over the "
     "fio run just before it"),
    ("load_vs_fio_read", "dcp 4-rank load / fio read, paired the same way"),
    ("reshard_verify_ratio", "dcp_load 4 to 3 with the CRC check / without "
     "it, each verified run over the unverified run just after it (block "
     "CRCs: only the 1 MiB blocks a rank's boxes overlap are read and "
     "checked; target >= 0.9)"),
    ("save_vs_torch", "dcp 4-rank save / PyTorch DCP save"),
    ("load_vs_torch", "dcp 4-rank load / PyTorch DCP load"),
    ("async_block_ratio_gpt2_1rank", "dcp_save_async of this state, 1 rank: "
     "blocking time / memcpy of the same bytes (target <= 1.5)"),
    ("async_block_ratio_gpt2_4rank", "the same, 4 ranks (slowest rank of "
     "each run, both times)"),
    ("async_block_ms_gpt2_1rank", "dcp_save_async blocking time, 1 rank"),
    ("async_block_ms_gpt2_4rank", "dcp_save_async blocking time, 4 ranks"),
    ("async_save_gbps_gpt2_1rank", "dcp_save_async to completion (wait), "
     "1 rank"),
    ("async_save_gbps_gpt2_4rank", "dcp_save_async to completion, 4 ranks"),
    ("async_block_ratio", "dcp_save_async blocking time / memcpy of the "
     "same bytes (bench/async_bench: 16 tensors, 256 MiB, tmpfs)"),
    ("async_block_ratio_planned", "the same with DCP_SAVE_NO_PLAN_CACHE: "
     "planning inside the blocking time, as in a first save"),
    ("async_block_ms", "dcp_save_async blocking time"),
    ("async_memcpy_ms", "memcpy of the same bytes"),
    ("async_budget_peak_ratio", "save with staging_budget = 1/8 of the "
     "state: peak memory / budget"),
]


def val(res, k):
    return res[k]["value"] if k in res else None


def render_md(res, stages, machine, meta):
    L = []
    a = L.append
    a("## Save and load against the disk and PyTorch DCP (`make bench`)\n")
    a(f"Run {meta['date']} on {machine['cores']} cores ({machine['cpu']}), "
      f"{machine['mem_gib']} GiB, Linux {machine['kernel']}, data on "
      f"{machine['fs']} ({machine['device']}). State: GPT-2 small + AdamW, "
      f"fp32, {meta['nbytes'] / 1e9:.3f} GB in {meta['ntensors']} tensors "
      "(parameters, exp_avg, exp_avg_sq; each sharded by rows, torch.chunk "
      "style) plus a replicated 0-d `step` per parameter and three values. "
      f"Each figure: median of {meta['runs']} runs, [min, max]; GB = 1e9 "
      "bytes; throughput = state bytes / wall time of the whole collective "
      "call (slowest rank, between barriers). fio: "
      f"`--rw=write|read --bs=4M --ioengine={meta['engine']} "
      f"--direct=1 --size={meta['fio_size']}` with the iodepth x numjobs "
      f"that was best of a sweep of {len(Fio.SWEEP)} run first "
      f"({meta.get('fio_conf') or 'iodepth 8 x 1 job: runs before the sweep'}"
      f"; jobs over disjoint parts of one file) (write: a new file each run, "
      "`--end_fsync=1`); fio runs alternate with the 4-rank dcp runs they "
      "are compared with. The page cache is dropped before every load; every "
      "save writes new files. PyTorch DCP: `dcp.save`/`dcp.load` with their "
      "defaults (FileSystemWriter: a file per rank, one thread, fsync), "
      "gloo, `OMP_NUM_THREADS=1` per process as torchrun sets it.\n")
    a("| key | what | median | min | max | unit |")
    a("|---|---|---|---|---|---|")
    for k, what in ROWS:
        if k in res:
            r = res[k]
            a(f"| `{k}` | {what} | {r['value']} | {r['min']} | {r['max']} | "
              f"{r['unit']} |")
    for k, r in res.items():
        if k not in dict(ROWS):
            a(f"| `{k}` | | {r['value']} | {r['min']} | {r['max']} | "
              f"{r['unit']} |")
    a("")
    a("### Targets\n")
    a("| target | measured | status |")
    a("|---|---|---|")
    targets = [("save >= 0.9x fio write", "save_vs_fio_write", 0.9),
               ("load >= 0.9x fio read", "load_vs_fio_read", 0.9),
               ("save >= 5x PyTorch DCP", "save_vs_torch", 5.0),
               ("load >= 5x PyTorch DCP", "load_vs_torch", 5.0)]
    missed = []
    for name, k, want in targets:
        v = val(res, k)
        if v is None:
            a(f"| {name} | not measured | - |")
            continue
        ok = v >= want
        st = "met" if ok else f"missed by {100 * (1 - v / want):.0f}%"
        a(f"| {name} | {v:.2f}x (runs: {res[k]['min']:.2f}-"
          f"{res[k]['max']:.2f}) | {st} |")
        if not ok:
            missed.append(k)
    v = val(res, "sync_save_extra_rss_mib")
    if v is not None:
        ok = v <= 64
        a(f"| sync save memory beyond the state <= 64 MiB/rank | {v:.1f} MiB "
          f"| {'met' if ok else 'missed by %.0f MiB' % (v - 64)} |")
        if not ok:
            missed.append("sync_save_extra_rss_mib")
    a("")
    a("### Conditions and notes\n")
    a("Load average (1, 5, 15 min) before and after each stage; the machine "
      "is shared, so the absolute figures move with it:\n")
    a("| stage | load before | load after |")
    a("|---|---|---|")
    for s in stages:
        a(f"| {s.name} | {' '.join(f'{x:.1f}' for x in s.before)} | "
          f"{' '.join(f'{x:.1f}' for x in (s.after or []))} |")
    a("")
    io = meta.get("io")
    if io:
        a(f"- dcp's I/O report (4-rank save, rank 0): O_DIRECT "
          f"{'yes' if io['direct'] == 1 else 'no'}, io_uring "
          f"{'yes' if io['uring'] == 1 else 'no'}, "
          f"{io['zero_copy_bytes'] / 1e6:.1f} MB written straight from the "
          f"tensors, {io['bounce_bytes'] / 1e6:.2f} MB copied (zip headers, "
          f"small tensors), {io['requests']} requests, at most "
          f"{io['max_in_flight']} in flight"
          + (f"; fallback: {io['fallback']}" if io["fallback"] else "") + ".")
    rio = meta.get("reshard_io")
    if rio:
        a(f"- Resharding 4 to 3 reads {rio['bytes'] / 1e6:.0f} MB on rank 0 "
          f"for {meta['nbytes'] / 3e6:.0f} MB it needs: a stored chunk that "
          "only partly overlaps a rank's box is read whole so that its CRC "
          "can be checked (DCP_LOAD_NO_VERIFY reads only the overlap, "
          "straight into the rank's buffer).")
    notes = {
        "save_vs_fio_write":
            "save below 0.9x fio write: dcp's time includes what fio's does "
            "not: planning and the gather/scatter of the plan, the CRC of "
            "every byte (computed while the writes are in flight, but on a "
            "CPU shared with the other ranks and other jobs), creating and "
            "preallocating the files, 4 files written at once instead of "
            "one stream, one fsync per file, and the commit (.metadata "
            "written, fsynced, renamed, directory fsynced).",
        "load_vs_fio_read":
            "load below 0.9x fio read: each rank first parses its records' "
            "zip headers (small reads at scattered offsets, a seek each), "
            "then reads the tensor bytes; the CRC of every byte is checked "
            "on a shared CPU; the ranks' streams compete for the disk.",
        "save_vs_torch":
            "PyTorch DCP's save on this state is closer to the disk's limit "
            "than 1/5 of it, so 5x would exceed what the disk can do (5x "
            "torch > fio write).",
        "load_vs_torch":
            "PyTorch DCP's load on this state is closer to the disk's limit "
            "than 1/5 of it, so 5x would exceed what the disk can do.",
    }
    for k in missed:
        if k not in notes:
            continue
        text = notes[k]
        if k in ("save_vs_torch", "load_vs_torch"):
            fk, tk = (("fio_write_gbps", "torch_save_gbps_4rank")
                      if k == "save_vs_torch" else
                      ("fio_read_gbps", "torch_load_gbps_4rank"))
            if val(res, fk) and val(res, tk):
                best = val(res, fk)
                if k == "load_vs_torch" and val(res, "fio_read_buffered_gbps"):
                    # PyTorch reads through the page cache: its limit is the
                    # faster of the two.
                    best = max(best, val(res, "fio_read_buffered_gbps"))
                lim = best / val(res, tk)
                text = (f"{'save' if k == 'save_vs_torch' else 'load'} "
                        f"below 5x PyTorch DCP: the disk's own limit (fio"
                        + (", the faster of O_DIRECT and the page cache"
                           if k == "load_vs_torch" else "") +
                        f") is {lim:.1f}x PyTorch DCP's figure here"
                        + (", so 5x is out of reach on this disk."
                           if lim < 5 else "."))
        if k in ("save_vs_fio_write", "load_vs_fio_read"):
            op = "save" if k == "save_vs_fio_write" else "load"
            fk = "fio_write" if op == "save" else "fio_read"
            dc, fc = (val(res, f"{op}_cpu_s_per_gb_4rank"),
                      val(res, f"{fk}_cpu_s_per_gb"))
            st = next((x for x in stages
                       if x.name == f"dcp {op} 4 ranks"), None)
            if dc is not None and fc is not None and st:
                text += (f" Measured: dcp used {dc:.2f} CPU s/GB, fio "
                         f"{fc:.2f}; the load average was "
                         f"{st.before[0]:.1f} on {machine['cores']} cores "
                         "during that stage, so each of the 4 ranks got a "
                         "fraction of a core. The runs' ratios spread from "
                         f"{res[k]['min']:.2f}x to {res[k]['max']:.2f}x"
                         + (", so the target was reached in some pairings "
                            "and the gap is within the noise."
                            if res[k]["max"] >= 0.9 else "."))
        a(f"- {text}")
    fb, fd_, lb = (val(res, "fio_read_buffered_gbps"),
                   val(res, "fio_read_gbps"),
                   val(res, "load_gbps_4rank_buffered"))
    if fb and fd_ and fb > 1.1 * fd_:
        a(f"- On this machine reads through the page cache are faster than "
          f"O_DIRECT reads: fio {fb:.2f} GB/s buffered against {fd_:.2f} "
          f"direct (the kernel's read-ahead here: "
          f"{machine.get('read_ahead_kb', '?')} KiB). PyTorch DCP reads "
          "through the page cache; dcp's O_DIRECT load is measured against "
          "fio's O_DIRECT read (the target), and with DCP_IO_NO_DIRECT it "
          f"loads at {lb:.2f} GB/s here.")
    tc = [(op, val(res, f"{op}_cpu_s_per_gb_4rank"),
           val(res, f"torch_{op}_cpu_s_per_gb_4rank")) for op in
          ("save", "load")]
    if all(d and t for _, d, t in tc):
        a("- Against PyTorch DCP the difference on this machine is in the "
          "cost more than in the time: "
          + "; ".join(f"{op} {d:.2f} CPU s/GB against {t:.2f} "
                      f"({t / d:.1f}x less)" for op, d, t in tc)
          + ". Peak RSS per process, state included: dcp "
          f"{val(res, 'save_peak_rss_mib_4rank')} MiB (save) and "
          f"{val(res, 'load_peak_rss_mib_4rank')} MiB (load), PyTorch DCP "
          f"{val(res, 'torch_save_peak_rss_mib_4rank')} and "
          f"{val(res, 'torch_load_peak_rss_mib_4rank')} MiB (its runtime "
          "included).")
    a("- Peak RSS is VmHWM; the memory beyond the state is VmHWM after "
      "the save minus VmRSS just before it (peak reset with "
      "/proc/self/clear_refs), the worst rank, median over runs. dcp keeps "
      "io_depth x io_block_bytes (8 x 4 MiB) of I/O buffers per context, "
      "touched only as far as they are used; aligned tensors are written "
      "from the caller's memory.")
    if "async_block_ratio" not in res:
        a("- `async_block_ratio`: build/tests/async_bench was not built, so this "
          "run has no asynchronous-save figures.")
    a("")
    a("![dcp vs fio vs PyTorch DCP](io_bench.png)\n")
    a("Reproduce: `make bench` (or `python bench/run_bench.py --runs 5`; "
      "`--scale small --no-torch` for a quick smoke run).\n")
    return "\n".join(L)


def draw(res, path, meta):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = [("save", [("fio write", "fio_write_gbps"),
                        ("dcp 1 rank", "save_gbps_1rank"),
                        ("dcp 4 ranks", "save_gbps_4rank"),
                        ("dcp 4, unaligned", "save_gbps_4rank_unaligned"),
                        ("torch DCP 4", "torch_save_gbps_4rank")]),
              ("load", [("fio read", "fio_read_gbps"),
                        ("dcp 1 rank", "load_gbps_1rank"),
                        ("dcp 4 ranks", "load_gbps_4rank"),
                        ("dcp 4 to 3", "load_gbps_reshard_4to3"),
                        ("dcp 4 to 3, no CRC",
                         "load_gbps_reshard_4to3_noverify"),
                        ("torch DCP 4", "torch_load_gbps_4rank"),
                        ("fio read, page cache", "fio_read_buffered_gbps"),
                        ("dcp 4, page cache", "load_gbps_4rank_buffered")])]
    fig_, axes = plt.subplots(1, 2, figsize=(13, 4.8),
                              gridspec_kw={"width_ratios": [5, 8]})
    for ax, (title, bars) in zip(axes, groups):
        bars = [(n, k) for n, k in bars if k in res]
        xs = range(len(bars))
        v = [res[k]["value"] for _, k in bars]
        lo = [res[k]["value"] - res[k]["min"] for _, k in bars]
        hi = [res[k]["max"] - res[k]["value"] for _, k in bars]
        colors = ["#bbbbbb" if "page cache" in n and n.startswith("fio") else
                  "#888888" if n.startswith("fio") else
                  "#d62728" if n.startswith("torch") else
                  "#9ecae1" if "page cache" in n else "#1f77b4"
                  for n, _ in bars]
        ax.bar(xs, v, yerr=[lo, hi], color=colors, capsize=4)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([n for n, _ in bars], rotation=25, ha="right")
        ax.set_ylabel("GB/s")
        ax.set_title(f"{title}, {meta['nbytes'] / 1e9:.2f} GB "
                     f"(median of {meta['runs']}, bars: min-max)")
        for x, y, h in zip(xs, v, hi):
            ax.text(x + 0.08, y + h, f"{y:.2f}", ha="left", va="bottom",
                    fontsize=8)
    fig_.tight_layout()
    fig_.savefig(path, dpi=110)


# ------------------------------------------------------------------ issue 16

I16_BEGIN = "<!-- issue16-bench: begin (run_bench.py --issue16 writes this) -->"
I16_END = "<!-- issue16-bench: end -->"


def secs(stage):
    return [r["seconds"] for r in stage.runs]


def median_ratio(num, den, nd=2):
    """median(num) / median(den), the spread from the worst and best
    pairing of runs."""
    return {"value": round(statistics.median(num) / statistics.median(den),
                           nd), "unit": "x",
            "min": round(min(num) / max(den), nd),
            "max": round(max(num) / min(den), nd)}


def issue16(a, build, data, scale, R):
    """Issue 16's figures, side by side in one run (see --issue16)."""
    if not os.path.exists(os.path.join(build, "tmpfs_limit")):
        raise SystemExit(f"bench: {build}/tmpfs_limit missing (cmake --build)")
    c4, ct = os.path.join(data, "dcp4"), os.path.join(data, "torch4")
    res, lines = {}, []
    # The storage limit: the best of several fio configurations, then
    # each dcp run paired with a run of the best one just before it.
    first = run_json(mpirun(4, ["save", c4, "--runs", "1"] + scale, build),
                     MPI_ENV)
    nbytes = first[0]["bytes"]
    fio = Fio(data, nbytes)
    swept = fio.sweep()
    fw, ds, fr, dl = paired_fio_stages(fio, c4, R, build, scale, " (best)")
    fio.remove()
    for x in (fw, ds, fr, dl):
        x.done([])
    res["fio_write_gbps"] = fig(gbps(fw), "GB/s")
    res["fio_read_gbps"] = fig(gbps(fr), "GB/s")
    res["save_vs_fio_write"] = fig(
        [x / y for x, y in zip(gbps(ds), gbps(fw))], "x", 2)
    res["load_vs_fio_read"] = fig(
        [x / y for x, y in zip(gbps(dl), gbps(fr))], "x", 2)
    for rw in ("write", "read"):
        d, j = fio.conf[rw]
        res[f"fio_best_{rw}_iodepth"] = {"value": d, "unit": "iodepth",
                                         "min": d, "max": d}
        res[f"fio_best_{rw}_numjobs"] = {"value": j, "unit": "jobs",
                                         "min": j, "max": j}
    # Resharding 4 -> 3 with and without the CRC check, run by run.
    rv, rn = reshard_verify_stages(c4, R, build, scale)
    res["reshard_verify_ratio"] = fig(
        [x / y for x, y in zip(gbps(rv), gbps(rn))], "x", 2)
    # The replicated load: dcp read once, dcp per rank, PyTorch DCP (4
    # processes each loading every tensor whole from its own checkpoint of
    # the same tensors), run by run in turn; page cache dropped before each.
    ro, pr = replicated_stages(c4, R, build, scale)
    shutil.rmtree(c4)
    torch_stage("torch save 4", 4, "save", ct, 1, scale)
    tr = torch_stage("torch replicated load 4", 4, "replicated", ct, R,
                     scale)
    shutil.rmtree(ct)
    res.update(replicated_figs({ro.name: ro, pr.name: pr}))
    res["replicated_load_torch_seconds"] = fig(secs(tr), "s", 3)
    res["replicated_load_vs_torch"] = median_ratio(secs(tr), secs(ro))
    # tmpfs, where the software is the limit: 4 ranks save and load, dcp
    # and PyTorch DCP on identical tensors.
    shm = tempfile.mkdtemp(prefix="dcp-bench-tmpfs-", dir="/dev/shm")
    try:
        d4, t4 = os.path.join(shm, "dcp4"), os.path.join(shm, "torch4")
        lswept, lbest, tlw, tds = tmpfs_limit_stages(shm, d4, R, build,
                                                     scale)
        tdl = dcp_stage("tmpfs dcp load 4", 4, "load", d4, R, build, scale)
        shutil.rmtree(d4)
        tts = torch_stage("tmpfs torch save 4", 4, "save", t4, R, scale)
        ttl = torch_stage("tmpfs torch load 4", 4, "load", t4, R, scale)
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    res["tmpfs_save_gbps"] = fig(gbps(tds), "GB/s")
    res["tmpfs_load_gbps"] = fig(gbps(tdl), "GB/s")
    res["tmpfs_torch_save_gbps"] = fig(gbps(tts), "GB/s")
    res["tmpfs_torch_load_gbps"] = fig(gbps(ttl), "GB/s")
    res["tmpfs_save_vs_torch"] = median_ratio(gbps(tds), gbps(tts))
    res["tmpfs_write_limit_gbps"] = fig(gbps(tlw), "GB/s")
    res["tmpfs_save_vs_limit"] = fig(
        [x / y for x, y in zip(gbps(tds), gbps(tlw))], "x", 2)
    res["tmpfs_load_vs_torch"] = median_ratio(gbps(tdl), gbps(ttl))
    # Outputs: merged into results.json; RESULTS.md's own section.
    merge_results(os.path.join(a.out, "results.json"), res)
    def row(k, what):
        v = res[k]
        return (f"| `{k}` | {v['value']} {v['unit']} | {v['min']} – "
                f"{v['max']} | {what} |")
    stages = (fw, ds, fr, dl, rv, rn, ro, pr, tr, tlw, tds, tdl, tts, ttl)
    md = [I16_BEGIN, "",
          "## Issue 16: read once, the fio sweep, tmpfs against PyTorch DCP",
          "",
          f"`python bench/run_bench.py --issue16 --runs {R}` on "
          f"{time.strftime('%Y-%m-%d %H:%M %Z')}: the GPT-2 small + AdamW "
          f"state ({nbytes / 1e9:.2f} GB fp32, sharded by rows), medians of "
          f"{R} runs, [min – max]; load average "
          f"{stages[0].before[0]:.1f} at the start, "
          f"{stages[-1].after[0]:.1f} at the end (2-core VM, shared). "
          "The keys below replace the same keys of the io-bench section "
          "in results.json (that section's table is from its own, earlier "
          "full `make bench` run, with fio at iodepth 8 x 1 job).", "",
          "fio sweep (O_DIRECT, 4 MiB blocks, " + fio.engine + ", one run "
          "each; numjobs jobs over disjoint parts of one file): " +
          ", ".join(f"{k} {v} GB/s" for k, v in swept.items()) + ". "
          f"Best write: iodepth {fio.conf['write'][0]} x "
          f"{fio.conf['write'][1]} jobs; best read: iodepth "
          f"{fio.conf['read'][0]} x {fio.conf['read'][1]} jobs; the paired "
          "runs below use them.", "",
          "tmpfs limit sweep (bench/tmpfs_limit.c, 4 processes, each "
          "writing its shards into new /dev/shm files (one per thread) "
          "with write() of at most the block size, fsync, close; one run "
          "each; write_crc "
          "computes each piece's CRC-32 first, memcpy copies into new "
          "memory, for reference): " +
          ", ".join(f"{k} {v} GB/s" for k, v in lswept.items()) + ". "
          f"Best write: {lbest['block'] >> 20} MiB blocks"
          f"{', fallocate first' if lbest['fallocate'] else ''}, "
          f"{lbest['threads']} thread(s) per process; the paired "
          "runs below use it.", "",
          "| key | median | range | what |", "|---|---|---|---|",
          row("fio_write_gbps", "fio write, best configuration (the limit)"),
          row("fio_read_gbps", "fio read, best configuration (the limit)"),
          row("save_vs_fio_write", "dcp 4-rank save / the fio write run just "
              "before it"),
          row("load_vs_fio_read", "dcp 4-rank load / the fio read run just "
              "before it"),
          row("reshard_verify_ratio", "load 4 → 3 with the CRC check / "
              "without, run by run (target ≥ 0.9)"),
          row("replicated_load_read_amplification", "4 ranks each loading "
              "the whole state, read once: bytes read from storage / state "
              "bytes (target 1.0)"),
          row("replicated_load_per_rank_read_amplification", "the same with "
              "DCP_LOAD_PER_RANK_READS"),
          row("replicated_load_seconds", "read once"),
          row("replicated_load_per_rank_seconds", "per-rank reads"),
          row("replicated_load_torch_seconds", "PyTorch DCP, 4 processes "
              "each loading every tensor whole (plain tensors)"),
          row("replicated_load_speedup_vs_per_rank", "per-rank seconds / "
              "read-once seconds, run by run"),
          row("replicated_load_vs_torch", "PyTorch DCP seconds / dcp "
              "read-once seconds"),
          row("tmpfs_save_gbps", "dcp 4-rank save into /dev/shm"),
          row("tmpfs_torch_save_gbps", "PyTorch DCP 4-process save into "
              "/dev/shm"),
          row("tmpfs_save_vs_torch", "dcp / PyTorch DCP (goal 8)"),
          row("tmpfs_write_limit_gbps", "4 processes writing the same bytes "
              "into new /dev/shm files with write(), best configuration "
              "(the limit)"),
          row("tmpfs_save_vs_limit", "dcp 4-rank save into /dev/shm / the "
              "limit run just before it"),
          row("tmpfs_load_gbps", "dcp 4-rank load from /dev/shm"),
          row("tmpfs_torch_load_gbps", "PyTorch DCP 4-process load from "
              "/dev/shm"),
          row("tmpfs_load_vs_torch", "dcp / PyTorch DCP (goal 8)"),
          "", "Per stage (GB/s, each run): " + "; ".join(
              f"{x.name}: " + " ".join(f"{g:.3f}" for g in gbps(x))
              for x in stages) + ".", "", I16_END]
    rpath = os.path.join(a.out, "RESULTS.md")
    text = open(rpath).read() if os.path.exists(rpath) else ""
    if I16_BEGIN in text and I16_END in text:
        text = (text[:text.index(I16_BEGIN)] + "\n".join(md) +
                text[text.index(I16_END) + len(I16_END):])
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(md) + "\n"
    with open(rpath, "w") as f:
        f.write(text)
    for k, v in res.items():
        log(f"{k}: {v['value']} {v['unit']} ({v['min']} .. {v['max']})")


# ------------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--data", default=None)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--scale", default="full", choices=["full", "small"])
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--only-replicated", action="store_true",
                    help="only the replicated load (merged into results.json)")
    ap.add_argument("--issue16", action="store_true",
                    help="only issue 16's figures: the fio sweep and the "
                    "paired save/load against the best configuration, the "
                    "replicated load (dcp read once, per rank, PyTorch "
                    "DCP), reshard_verify_ratio, save and load on tmpfs "
                    "against PyTorch DCP and the save against plain write() "
                    "there (merged into results.json and "
                    "their own section of RESULTS.md)")
    ap.add_argument("--report-only", action="store_true",
                    help=f"redo the outputs from OUT/{RAW}, measuring nothing")
    a = ap.parse_args()
    if a.report_only:
        with open(os.path.join(a.out, RAW)) as f:
            report(json.load(f), a.out, not a.no_plot)
        return
    build = os.path.abspath(a.build)
    if not os.path.exists(os.path.join(build, "io_bench")):
        raise SystemExit(f"bench: {build}/io_bench missing (cmake --build)")
    data = os.path.abspath(a.data or os.path.join(build, "bench-data"))
    shutil.rmtree(data, ignore_errors=True)
    os.makedirs(data)
    scale = ["--scale", "small"] if a.scale == "small" else []
    st = os.statvfs(data)
    free = st.f_bavail * st.f_frsize
    need = 3 * 1.6e9 if a.scale == "full" else 1e8
    if free < need:
        raise SystemExit(f"bench: {free / 1e9:.1f} GB free in {data}, "
                         f"{need / 1e9:.1f} GB needed")
    R = a.runs
    c1, c4, ct = (os.path.join(data, x) for x in ("dcp1", "dcp4", "torch4"))
    stages = []
    if a.issue16:
        issue16(a, build, data, scale, R)
        shutil.rmtree(data, ignore_errors=True)
        return
    if a.only_replicated:
        run_json(mpirun(4, ["save", c4, "--runs", "1"] + scale, build),
                 MPI_ENV)
        st = replicated_stages(c4, R, build, scale)
        shutil.rmtree(data, ignore_errors=True)
        figs = replicated_figs({x.name: x for x in st})
        merge_results(os.path.join(a.out, "results.json"), figs)
        for k, v in figs.items():
            log(f"{k}: {v['value']} {v['unit']} ({v['min']} .. {v['max']})")
        return

    s = dcp_stage("dcp save 1 rank", 1, "save", c1, R, build, scale)
    nbytes = s.runs[0]["bytes"]
    stages.append(s)
    stages.append(dcp_stage("dcp load 1 rank", 1, "load", c1, R, build,
                            scale))
    shutil.rmtree(c1)
    # The targets' runs: each dcp run right after a fio run, so that each
    # pair sees the same disk and the same neighbours on the machine.
    fio = Fio(data, nbytes)
    fio.sweep()
    fw, ds, fr, dl = paired_fio_stages(fio, c4, R, build, scale)
    # Reads through the page cache, for reference: fio, and dcp with
    # DCP_IO_NO_DIRECT.
    fb = Stage("fio read, buffered")
    for _ in range(R):
        fb.add([fio.read_buffered()])
    fio.remove()
    stages += [x.done([]) for x in (fw, ds, fr, dl, fb)]
    stages.append(dcp_stage("dcp load 4 ranks, buffered", 4, "load", c4, R,
                            build, scale + ["--io-flags", "1"]))
    stages += replicated_stages(c4, R, build, scale)
    # Resharding with and without the CRC check, run by run in turn, so
    # that each pair sees the same machine (reshard_verify_ratio).
    stages += list(reshard_verify_stages(c4, R, build, scale))
    stages.append(dcp_stage("dcp save 4 ranks unaligned", 4, "save", c4, R,
                            build, scale + ["--misalign", "16"]))
    # Asynchronous save of the same state: blocking time against a memcpy
    # of each rank's bytes, in the same run.
    stages.append(dcp_stage("dcp async save 1 rank", 1, "async", c4, R,
                            build, scale))
    stages.append(dcp_stage("dcp async save 4 ranks", 4, "async", c4, R,
                            build, scale))
    shutil.rmtree(c4)
    if not a.no_torch:
        stages.append(torch_stage("torch save 4", 4, "save", ct, R, scale))
        stages.append(torch_stage("torch load 4", 4, "load", ct, R, scale))
        shutil.rmtree(ct)
    # Asynchronous save: how long dcp_save_async blocks against a memcpy
    # of the same bytes (bench/async_bench.c; on tmpfs, where the blocking
    # time does not depend on the disk), and the staging budget's peak.
    hooked = {}
    ab = os.path.join(build, "tests", "async_bench")
    if os.access(ab, os.X_OK):
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else data
        adir = tempfile.mkdtemp(prefix="dcp-async-bench-", dir=shm)
        mib = "256" if a.scale == "full" else "32"
        log(f"{ab} {adir} {mib} {max(R, 3)}")
        p = subprocess.run([ab, adir, mib, str(max(R, 3))],
                           stdout=subprocess.PIPE, text=True, timeout=3600)
        shutil.rmtree(adir, ignore_errors=True)
        if p.returncode != 0:
            raise SystemExit(f"bench: async_bench failed ({p.returncode})")
        for k, v in json.loads("{" + p.stdout.strip().rstrip(",") +
                               "}").items():
            hooked[k] = v
    raw = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "runs": R,
           "nbytes": nbytes, "engine": fio.engine, "fio_size": fio.size,
           "fio_sweep": fio.swept, "fio_conf": fio.conf,
           "scale": a.scale, "machine": describe_machine(data),
           "hooked": hooked,
           "stages": [{"name": x.name, "before": x.before, "after": x.after,
                       "runs": x.runs} for x in stages]}
    shutil.rmtree(data, ignore_errors=True)
    with open(os.path.join(a.out, RAW), "w") as f:
        json.dump(raw, f, indent=1)
        f.write("\n")
    report(raw, a.out, not a.no_plot)


def report(raw, out, plot):
    """Figures from the raw runs: results.json, RESULTS.md, the plot."""
    stages = []
    for d in raw["stages"]:
        x = Stage.__new__(Stage)
        x.name, x.before, x.after, x.runs = (d["name"], d["before"],
                                             d["after"], d["runs"])
        stages.append(x)
    by = {x.name: x for x in stages}
    nbytes = raw["nbytes"]
    torch_ran = "torch save 4" in by

    res = {}
    res["save_gbps_1rank"] = fig(gbps(by["dcp save 1 rank"]), "GB/s")
    res["save_gbps_4rank"] = fig(gbps(by["dcp save 4 ranks"]), "GB/s")
    res["save_gbps_4rank_unaligned"] = fig(
        gbps(by["dcp save 4 ranks unaligned"]), "GB/s")
    res["load_gbps_1rank"] = fig(gbps(by["dcp load 1 rank"]), "GB/s")
    res["load_gbps_4rank"] = fig(gbps(by["dcp load 4 ranks"]), "GB/s")
    res["load_gbps_reshard_4to3"] = fig(gbps(by["dcp load 4 to 3 ranks"]),
                                        "GB/s")
    res["load_gbps_reshard_4to3_noverify"] = fig(
        gbps(by["dcp load 4 to 3, no CRC"]), "GB/s")
    res["fio_write_gbps"] = fig(gbps(by["fio write"]), "GB/s")
    res["fio_read_gbps"] = fig(gbps(by["fio read"]), "GB/s")
    res["fio_read_buffered_gbps"] = fig(gbps(by["fio read, buffered"]),
                                        "GB/s")
    res["load_gbps_4rank_buffered"] = fig(
        gbps(by["dcp load 4 ranks, buffered"]), "GB/s")
    for n, x in (("1rank", "dcp async save 1 rank"),
                 ("4rank", "dcp async save 4 ranks")):
        if x in by:
            res[f"async_block_ratio_gpt2_{n}"] = fig(
                [r["block_ratio"] for r in by[x].runs], "x memcpy")
            res[f"async_block_ms_gpt2_{n}"] = fig(
                [r["block_seconds"] * 1e3 for r in by[x].runs], "ms", 1)
            res[f"async_save_gbps_gpt2_{n}"] = fig(gbps(by[x]), "GB/s")
    s4 = by["dcp save 4 ranks"].runs
    res["sync_save_extra_rss_mib"] = fig(
        [max(r["extra_rss_mib"]) for r in s4], "MiB", 1)
    res["sync_save_extra_rss_mib_unaligned"] = fig(
        [max(r["extra_rss_mib"]) for r in by["dcp save 4 ranks unaligned"].runs],
        "MiB", 1)
    res["save_peak_rss_mib_4rank"] = fig(
        [max(r["peak_rss_mib"]) for r in s4], "MiB", 1)
    res["load_peak_rss_mib_4rank"] = fig(
        [max(r["peak_rss_mib"]) for r in by["dcp load 4 ranks"].runs], "MiB",
        1)
    res["reshard_peak_rss_mib_3rank"] = fig(
        [max(r["peak_rss_mib"]) for r in by["dcp load 4 to 3 ranks"].runs],
        "MiB", 1)
    if torch_ran:
        res["torch_save_gbps_4rank"] = fig(gbps(by["torch save 4"]), "GB/s")
        res["torch_load_gbps_4rank"] = fig(gbps(by["torch load 4"]), "GB/s")
        res["torch_save_peak_rss_mib_4rank"] = fig(
            [max(r["peak_rss_mib"]) for r in by["torch save 4"].runs], "MiB",
            1)
        res["torch_load_peak_rss_mib_4rank"] = fig(
            [max(r["peak_rss_mib"]) for r in by["torch load 4"].runs], "MiB",
            1)

    for key, name in (("fio_write_cpu_s_per_gb", "fio write"),
                      ("fio_read_cpu_s_per_gb", "fio read"),
                      ("save_cpu_s_per_gb_4rank", "dcp save 4 ranks"),
                      ("load_cpu_s_per_gb_4rank", "dcp load 4 ranks"),
                      ("torch_save_cpu_s_per_gb_4rank", "torch save 4"),
                      ("torch_load_cpu_s_per_gb_4rank", "torch load 4")):
        if name in by:
            res[key] = fig(cpu_per_gb(by[name], nbytes), "CPU s/GB", 3)

    def ratio(key, num, den):
        n, d = gbps(by[num]), gbps(by[den])
        # Spread: the worst and best pairing of the runs.
        res[key] = {"value": round(statistics.median(n) /
                                   statistics.median(d), 2),
                    "unit": "x", "min": round(min(n) / max(d), 2),
                    "max": round(max(n) / min(d), 2)}

    def paired(key, num, den):
        # Each dcp run over the fio run just before it.
        q = [x / y for x, y in zip(gbps(by[num]), gbps(by[den]))]
        res[key] = fig(q, "x", 2)
    paired("save_vs_fio_write", "dcp save 4 ranks", "fio write")
    paired("load_vs_fio_read", "dcp load 4 ranks", "fio read")
    paired("reshard_verify_ratio", "dcp load 4 to 3 ranks",
           "dcp load 4 to 3, no CRC")
    if torch_ran:
        ratio("save_vs_torch", "dcp save 4 ranks", "torch save 4")
        ratio("load_vs_torch", "dcp load 4 ranks", "torch load 4")

    res.update(replicated_figs(by))
    res.update(raw.get("hooked", {}))
    for n, x in (("1rank", "dcp async save 1 rank"),
                 ("4rank", "dcp async save 4 ranks")):
        if x in by:
            res[f"async_block_ratio_gpt2_{n}"] = fig(
                [r["block_ratio"] for r in by[x].runs], "x memcpy")
            res[f"async_block_ms_gpt2_{n}"] = fig(
                [r["block_seconds"] * 1e3 for r in by[x].runs], "ms", 1)
            res[f"async_save_gbps_gpt2_{n}"] = fig(gbps(by[x]), "GB/s")
    s4 = by["dcp save 4 ranks"].runs
    meta = {"date": raw["date"], "runs": raw["runs"], "nbytes": nbytes,
            "engine": raw["engine"], "fio_size": raw["fio_size"],
            "fio_conf": raw.get("fio_conf"),
            "ntensors": 3 * (12 * 12 + 4) if raw["scale"] == "full" else
            3 * (2 * 12 + 4),
            "io": s4[0].get("io"),
            "reshard_io": by["dcp load 4 to 3 ranks"].runs[0].get("io")}
    write_outputs(res, stages, raw["machine"], meta, out, plot)
    for k in ("save_vs_fio_write", "load_vs_fio_read", "reshard_verify_ratio",
              "save_vs_torch", "load_vs_torch"):
        if k in res:
            log(f"{k}: {res[k]['value']}x")
    log(f"wrote {out}/results.json, RESULTS.md, {RAW}"
        + ("" if not plot else ", io_bench.png"))


if __name__ == "__main__":
    main()
