#!/usr/bin/env python3
"""S3 benchmark: dcp's save and load of the GPT-2 small + AdamW state
(bench/gpt2_state.h, 1.49 GB) through its S3 back end, beside the same
server's raw parallel throughput with a well-known client (boto3's transfer
manager: a multipart upload of the same bytes, dcp's data object, in 8 MiB
parts, 16 in flight, and the download of dcp's data object in 8 MiB ranged
GETs, 16 in flight; run by run in turn with dcp's save and load, the ratios
to raw taken pair by pair) and beside PyTorch DCP's S3 path (torch's
FsspecWriter/FsspecReader over s3fs), all in the same run, against the
server tests/s3/s3_env.py starts on loopback (radosgw for make bench-s3):

    python tests/s3/s3_env.py --server rgw python bench/s3_bench.py
        [--build build] [--runs 5] [--scale small|medium|full]

(make bench-s3). One process each. Medians of --runs runs; merges
s3_save_vs_raw, s3_load_vs_raw, s3_save_vs_torch, s3_load_vs_torch (dcp's
throughput over the other's: above 1 is dcp faster) and the GB/s figures
into bench/results.json and prints them. The default scale, full (the
whole state), on radosgw writes the s3_* keys; another scale or server
writes s3_[<server>_]<scale>_* (s3_medium_*: the GPT-2 layout with 4
layers, 109 MB; s3_small_*: 6.7 MB, bound by round trips; moto copies the
whole object for every ranged GET, so it serves the medium scale at most).
Each figure records its server and scale.
"""
import argparse
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1",
           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")


def log(*a):
    print("s3_bench:", *a, file=sys.stderr, flush=True)


def jruns(cmd, env):
    log(" ".join(cmd))
    p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                       timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"s3_bench: {cmd[0]} failed: {p.stderr[-2000:]}")
    return [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]


def fig(v, unit, nd=3):
    return {"value": round(statistics.median(v), nd), "unit": unit,
            "min": round(min(v), nd), "max": round(max(v), nd)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--scale", default="full", choices=["small", "medium", "full"])
    ap.add_argument("--out", default=HERE)
    a = ap.parse_args()
    bucket = os.environ["DCP_S3_BUCKET"]
    base = f"s3://{bucket}/bench"
    extra = ["--runs", str(a.runs)] + (["--scale", a.scale]
                                       if a.scale != "full" else [])
    io_bench = [os.path.join(a.build, "io_bench")]
    one = ["--runs", "1"] + extra[2:]
    res, gb = {}, {}
    import boto3
    from boto3.s3.transfer import TransferConfig
    cfg = TransferConfig(multipart_threshold=8 << 20,
                         multipart_chunksize=8 << 20, max_concurrency=16)
    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    for k in ("dcp_save", "dcp_load", "raw_save", "raw_load"):
        gb[k] = []
    # Run by run, in turn: dcp's save (one rank, mpiexec -n 1), the raw
    # upload of the same bytes (dcp's data object, read back first), dcp's
    # load, the raw download of dcp's data object; each pair sees the same
    # server state and the same neighbours.
    for _ in range(a.runs):
        r = jruns(["mpiexec", "-n", "1"] + io_bench +
                  ["save", base + "/dcp"] + one, ENV)
        gb["dcp_save"] += [x["bytes"] / x["seconds"] / 1e9 for x in r]
        nbytes = r[0]["bytes"]
        keys = [o["Key"] for o in s3.list_objects_v2(
            Bucket=bucket, Prefix="bench/dcp/")["Contents"]
            if o["Key"].endswith(".distcp")]
        assert len(keys) == 1, keys
        data = s3.get_object(Bucket=bucket, Key=keys[0])["Body"].read()
        t0 = time.perf_counter()
        s3.upload_fileobj(io.BytesIO(data), bucket, "bench/raw/blob",
                          Config=cfg)
        gb["raw_save"].append(len(data) / (time.perf_counter() - t0) / 1e9)
        r = jruns(["mpiexec", "-n", "1"] + io_bench +
                  ["load", base + "/dcp"] + one, ENV)
        assert all(x.get("bad_elements", 0) == 0 for x in r)
        gb["dcp_load"] += [x["bytes"] / x["seconds"] / 1e9 for x in r]
        out = io.BytesIO()
        t0 = time.perf_counter()
        s3.download_fileobj(bucket, keys[0], out, Config=cfg)
        gb["raw_load"].append(len(data) / (time.perf_counter() - t0) / 1e9)
        assert out.getvalue() == data
        del data, out
    # torch's S3 path, one process
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    tenv = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                DCP_S3FS_DIR=os.path.join(ROOT, ".pydeps", "s3fs"))
    for op in ("save", "load"):
        r = jruns([sys.executable, os.path.join(HERE, "torch_dcp_bench.py"),
                   op, base + "/torch"] + extra, tenv)
        assert all(x.get("bad_elements", 0) == 0 for x in r)
        gb["torch_" + op] = [x["bytes"] / x["seconds"] / 1e9 for x in r]
    # The full scale on radosgw writes the s3_* keys; another scale or
    # server s3_[<server>_]<scale>_*.
    server = os.environ.get("DCP_S3_SERVER", "moto")
    pre = "s3_" + ("" if server == "rgw" else server + "_") + \
        ("" if a.scale == "full" and server == "rgw" else a.scale + "_")
    for k, v in gb.items():
        res[f"{pre}{k}_gbps"] = fig(v, "GB/s")
    for op in ("save", "load"):
        # against raw: the runs were paired, so the ratio of each pair
        pr = [d / r for d, r in zip(gb["dcp_" + op], gb["raw_" + op])]
        res[f"{pre}{op}_vs_raw"] = fig(pr, "x", 2)
        for other in ("torch",):
            res[f"{pre}{op}_vs_{other}"] = {
                "value": round(statistics.median(gb["dcp_" + op]) /
                               statistics.median(gb[f"{other}_{op}"]), 2),
                "unit": "x",
                "min": round(min(gb["dcp_" + op]) / max(gb[f"{other}_{op}"]), 2),
                "max": round(max(gb["dcp_" + op]) / min(gb[f"{other}_{op}"]), 2)}
    res[f"{pre}bench_bytes"] = {"value": nbytes, "unit": "B", "min": nbytes,
                                "max": nbytes}
    for v in res.values():
        v["scale"] = a.scale
        v["server"] = server
    os.makedirs(a.out, exist_ok=True)
    jpath = os.path.join(a.out, "results.json")
    old = {}
    if os.path.exists(jpath):
        with open(jpath) as f:
            old = json.load(f)
    old.update(res)
    with open(jpath, "w") as f:
        f.write("{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}"
                                   for k, v in old.items()) + "\n}\n")
    for k, v in res.items():
        print(f"{k}: {v['value']} {v['unit']} ({v['min']}..{v['max']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
