"""Hugging Face layouts torch 2.13 writes (issue 18 item 6, docs/FORMAT.md
§9.5).

torch's HuggingFaceStorageWriter writes safetensors files and no
.metadata: one process (no_dist=True) writes model-0000i-of-0000N.safetensors
and model.safetensors.index.json; 3 gloo ranks with save_distributed=True
write shard-0000r-model-00001-of-00001.safetensors per rank, each holding
the rank's DTensor pieces with their offsets in __metadata__
DCP_SHARDING_INFO (and, with enable_consolidation, the whole tensors
beside a sharded/ directory). dcp reads each directory as a checkpoint
(dcptool ls/info/cat/export, dcp_load whole and in boxes across the pieces,
dcp_load_file and dcp_load resharded over 1 to 3 MPI ranks), bit-exact.
Hostile directories (overlapping pieces, gaps, bad offsets, bad JSON,
disagreeing dtypes) are refused with DCP_EFORMAT naming file and tensor.
"""

import json
import os
import random
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcpio  # noqa: E402  (fails loudly without torch)
from dcpio import torch  # noqa: E402
import torch.distributed.checkpoint as tdcp  # noqa: E402
from torch.distributed.checkpoint import HuggingFaceStorageWriter  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

R = dcpio.Runner("hf_layouts")


def dcptool(*args, expect=0, text=True):
    r = subprocess.run([os.environ["DCPTOOL"]] + [str(a) for a in args],
                       capture_output=True, text=text, timeout=120)
    if r.returncode != expect:
        raise AssertionError(f"dcptool {' '.join(map(str, args))}: exit "
                             f"{r.returncode}, expected {expect}\n{r.stderr}")
    return r


def mpi_loadfile(n, *args):
    """tests/mpi/mpi_loadfile on n ranks (an MPI build)."""
    exe = shutil.which("mpiexec") or shutil.which("mpirun")
    prog = os.path.join(os.environ.get("DCP_BIN_DIR", ""), "mpi",
                        "mpi_loadfile")
    if not exe or not os.path.exists(prog):
        raise AssertionError(f"need mpiexec and {prog} (an MPI build)")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    r = subprocess.run([exe, "--oversubscribe", "-n", str(n), prog]
                       + [str(a) for a in args], capture_output=True,
                       text=True, timeout=300, env=env)
    if r.returncode != 0:
        raise AssertionError(f"mpi_loadfile exited {r.returncode}: "
                             f"{r.stdout} {r.stderr}")


def ls_rows(d):
    return {ln.split("\t")[0]: ln.split("\t")[1:]
            for ln in dcptool("ls", d).stdout.splitlines()}


def check_reads(check, d, want, tmp, tag, chunks=None):
    """Every way dcp reads directory d gives the tensors of want."""
    rows = ls_rows(d)
    check.eq(sorted(rows), sorted(want), f"{tag}: ls keys")
    for k, v in want.items():
        check.eq(rows[k][0], dcpio.dtype_name(v.dtype), f"{tag}: dtype {k}")
        check.eq(rows[k][1], "[" + ",".join(map(str, v.shape)) + "]",
                 f"{tag}: shape {k}")
        if chunks and k in chunks:
            check.eq(int(rows[k][2]), chunks[k], f"{tag}: pieces of {k}")
        got = dcptool("cat", d, k, text=False).stdout
        check.eq(got.hex(), dcpio.tensor_bytes(v).hex(), f"{tag}: cat {k}")
    info = json.loads(dcptool("info", d, "--json").stdout)
    check.eq(info["entries"] if "entries" in info else len(want), len(want),
             f"{tag}: info")
    dcptool("verify", d)
    # export: one safetensors file, read by the safetensors library
    out = os.path.join(tmp, f"{tag}.safetensors")
    dcptool("export", d, out, "--no-fsync")
    got = load_file(out)
    check.eq(sorted(got), sorted(want), f"{tag}: export keys")
    for k, v in want.items():
        check.none(dcpio.tensors_identical(v, got[k]), f"{tag}: export {k}")
    # dcp_load of every tensor whole, and dcp_metadata_read_box
    dump = dcpio.dcp_dumpall(d, tmp, name=f"dump-{tag}")
    dcpio.compare_dump(want, dump, check)
    # dcp_import of the directory (srcfile's pieces, read in C order)
    imp = os.path.join(tmp, f"imp-{tag}")
    dcptool("import", d, imp, "--no-fsync")
    for k, v in want.items():
        got = dcptool("cat", imp, k, text=False).stdout
        check.eq(got.hex(), dcpio.tensor_bytes(v).hex(), f"{tag}: import {k}")


def single_state():
    rng = random.Random(618)
    g = torch.Generator().manual_seed(618)
    return {"embed.weight": dcpio.random_tensor(torch.bfloat16, (11, 4), rng),
            "layer.0.w": torch.randn(6, 5, generator=g),
            "layer.0.h": dcpio.random_tensor(torch.float16, (3, 2, 2), rng),
            "ids": torch.arange(-5, 9, dtype=torch.int64),
            "scale": torch.tensor(2.5, dtype=torch.float64),
            "empty": torch.empty(0, 4)}


@R.test
def hf_single_process_dcp_reads(check, tmp):
    """no_dist=True: one file, and two files through fqn_to_index_mapping;
    every tensor whole with saved_offsets 0."""
    st = single_state()
    one = os.path.join(tmp, "one")
    tdcp.save(st, storage_writer=HuggingFaceStorageWriter(one), no_dist=True)
    check.eq(sorted(os.listdir(one)),
             ["model-00001-of-00001.safetensors",
              "model.safetensors.index.json"], "torch's file names")
    check.true(not os.path.exists(os.path.join(one, ".metadata")),
               "no .metadata")
    check_reads(check, one, st, tmp, "one")
    two = os.path.join(tmp, "two")
    mapping = {k: 1 + (i % 2) for i, k in enumerate(sorted(st))}
    tdcp.save(st, storage_writer=HuggingFaceStorageWriter(
        two, fqn_to_index_mapping=mapping), no_dist=True)
    check.eq(sorted(os.listdir(two)),
             ["model-00001-of-00002.safetensors",
              "model-00002-of-00002.safetensors",
              "model.safetensors.index.json"], "torch's file names")
    check_reads(check, two, st, tmp, "two")
    # the index, as before, through dcp_import
    imp = os.path.join(tmp, "imp-index")
    dcptool("import", os.path.join(two, "model.safetensors.index.json"), imp)
    check.eq(sorted(ls_rows(imp)), sorted(st), "import of the index")
    # dcp_load and dcp_load_file on 1 and 2 ranks, the same bytes
    for n in (1, 2):
        mpi_loadfile(n, "model", two, two, os.path.join(tmp, f"re{n}"))


# -------------------------------------------------- 3 ranks, DTensors

WORLD = 3


def dist_full():
    rng = random.Random(1866)
    g = torch.Generator().manual_seed(1866)  # the same on every rank
    return {"w": torch.arange(7 * 5, dtype=torch.float32).reshape(7, 5) / 3,
            "c": torch.randn(4, 6, generator=g),
            "h": dcpio.random_tensor(torch.bfloat16, (5, 8), rng),
            "grid": torch.randn(6, 4, dtype=torch.float64, generator=g),
            "b": torch.linspace(-1, 1, 9, dtype=torch.float64)}


def _hf_save(rank, world, d, consolidate):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    mesh = init_device_mesh("cpu", (world,))
    full = dist_full()
    st = {"w": dcpio.dtensor_from_full(full["w"], mesh, [Shard(0)]),
          "c": dcpio.dtensor_from_full(full["c"], mesh, [Shard(1)]),
          "h": dcpio.dtensor_from_full(full["h"], mesh, [Shard(1)]),
          "grid": dcpio.dtensor_from_full(full["grid"], mesh, [Shard(0)]),
          "b": dcpio.dtensor_from_full(full["b"], mesh, [Replicate()])}
    tdcp.save(st, storage_writer=HuggingFaceStorageWriter(
        d, save_distributed=True, enable_consolidation=consolidate))


def sharding_info(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    return json.loads(h["__metadata__"]["DCP_SHARDING_INFO"])


@R.test
def hf_distributed_dcp_reads(check, tmp):
    """save_distributed=True on 3 gloo ranks: per-rank files with
    DCP_SHARDING_INFO; dcp assembles each tensor from its pieces; with
    enable_consolidation, the consolidated files and sharded/ both."""
    full = dist_full()
    d = os.path.join(tmp, "dist")
    dcpio.run_ranks(check, WORLD, _hf_save, (d, False), tmp)
    names = sorted(os.listdir(d))
    check.eq(names, [f"shard-0000{r}-model-00001-of-00001.safetensors"
                     for r in range(1, WORLD + 1)], "torch's file names")
    info = sharding_info(os.path.join(d, names[1]))
    check.eq(info["w"]["saved_offsets"], [3, 0], "rank 1's piece of w")
    check_reads(check, d, full, tmp, "dist",
                chunks={"w": 3, "c": 3, "h": 3, "b": 1})
    # boxes across the pieces: rows 1..6 of w (3 + 3 + 1), columns of c
    for key, offs, sizes in [("w", (1, 1), (5, 3)), ("c", (1, 1), (2, 4)),
                             ("h", (0, 2), (5, 5))]:
        want = dcpio.slice_of(full[key], offs, sizes)
        for mode in ("loadbox", "readbox"):
            got = dcpio.dcp_box(d, key, offs, sizes, tmp, mode=mode)
            check.eq(got.hex(), dcpio.tensor_bytes(want).hex(),
                     f"{mode} {key}")
    # dcp_load of the directory resharded by rows over 1..3 ranks, dcp_save,
    # and dcp_load_file of the directory (every rank reading, then rank 0
    # reading for all) into the same boxes: the same bytes
    for n in (1, 2, 3):
        mpi_loadfile(n, "model", d, d, os.path.join(tmp, f"re{n}"))
        out = os.path.join(tmp, f"re{n}.safetensors")
        dcptool("export", os.path.join(tmp, f"re{n}"), out, "--no-fsync")
        got = load_file(out)
        for k, v in full.items():
            check.none(dcpio.tensors_identical(v, got[k]),
                       f"{n} ranks: {k}")
    # enable_consolidation: whole tensors beside sharded/
    c = os.path.join(tmp, "cons")
    dcpio.run_ranks(check, WORLD, _hf_save, (c, True), tmp)
    check.true(os.path.isdir(os.path.join(c, "sharded")), "sharded/")
    check_reads(check, c, full, tmp, "cons",
                chunks={"w": 1, "c": 1, "h": 1, "b": 1})
    check_reads(check, os.path.join(c, "sharded"), full, tmp, "cons-sharded",
                chunks={"w": 3, "c": 3})


# ------------------------------------------- dcp writes, torch reads

def split(n, r, world):
    """Rows [o, o + s) of rank r when n rows are cut into world pieces
    as torch's Shard does (ceil division, trailing ranks possibly empty)."""
    per = -(-n // world)
    o = min(r * per, n)
    return o, min(per, n - o)


def dcp_hf_save(check, full, boxes_of, d, tmp, world, how):
    """interop_state_mpi savefrom on world ranks with dcp_save_hf."""
    for r in range(world):
        dcpio.write_manifest(full, os.path.join(tmp, "m-" + how, str(r)),
                             boxes=boxes_of(r))
    os.environ["DCP_INTEROP_SAVE_HF"] = how
    try:
        res = dcpio.mpiexec(world, "savefrom",
                            os.path.join(tmp, "m-" + how, "{rank}",
                                         "manifest"), d,
                            tmp=tmp)
    finally:
        del os.environ["DCP_INTEROP_SAVE_HF"]
    return check.eq(res.returncode, 0, f"mpiexec savefrom {how}: "
                    f"{res.stderr}")


def torch_hf_load(d, full):
    """torch's own HuggingFaceStorageReader, one process."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    sd = {k: torch.zeros_like(v) for k, v in full.items()}
    tdcp.load(sd, storage_reader=HuggingFaceStorageReader(d), no_dist=True)
    return sd


@R.test
def dcp_writes_hf_torch_reads(check, tmp):
    """dcp_save_hf on 3 MPI ranks, sharded (each rank its own piece file
    with DCP_SHARDING_INFO) and consolidated (whole tensors, the index at
    the commit): torch's HuggingFaceStorageReader loads them bit-exact, the
    file names and __metadata__ are torch's."""
    full = dist_full()
    world = 3

    def sharded_boxes(r):
        b = {}
        for k in ("w", "grid"):
            o, n = split(full[k].shape[0], r, world)
            b[k] = [((o, 0), (n, full[k].shape[1]))]
        for k in ("c", "h"):
            o, n = split(full[k].shape[1], r, world)
            b[k] = [((0, o), (full[k].shape[0], n))]
        return b  # "b": whole on every rank (replicated)

    d = os.path.join(tmp, "sharded")
    if dcp_hf_save(check, full, sharded_boxes, d, tmp, world, "sharded"):
        names = sorted(os.listdir(d))
        check.eq(names, [f"shard-0000{r}-model-00001-of-00001.safetensors"
                         for r in range(1, world + 1)], "file names")
        info = sharding_info(os.path.join(d, names[1]))
        check.eq(info["w"]["saved_offsets"], [3, 0], "rank 1's w")
        check.eq(info["c"]["saved_offsets"], [0, 2], "rank 1's c")
        check.true("b" not in info, "b written once, by rank 0")
        from safetensors import safe_open
        with safe_open(os.path.join(d, names[0]), "pt") as f:
            md = f.metadata()
            check.eq((md.get("format"), md.get("DCP_VERSION")),
                     ("pt", "1.0"), "__metadata__")
        got = torch_hf_load(d, full)
        for k, v in full.items():
            check.none(dcpio.tensors_identical(v, got[k]), f"torch {k}")
        check_reads(check, d, full, tmp, "dcp-sharded",
                    chunks={"w": 3, "c": 3, "b": 1})

    def whole_boxes(r):
        # each tensor whole on one rank (k-th key on rank k % world), "b"
        # on every rank, and rank 2 also holds a piece of w: not written
        b = {k: ([] if i % world != r else [((0,) * v.dim(), v.shape)])
             for i, (k, v) in enumerate(sorted(full.items())) if k != "b"}
        if r == 2:
            b["w"] = b.get("w") or [((0, 0), (2, 5))]
        return b

    c = os.path.join(tmp, "cons")
    if dcp_hf_save(check, full, whole_boxes, c, tmp, world, "consolidated"):
        names = sorted(os.listdir(c))
        check.eq(names, [f"model-0000{k}-of-00003.safetensors"
                         for k in range(1, 4)]
                 + ["model.safetensors.index.json"], "file names")
        with open(os.path.join(c, "model.safetensors.index.json")) as f:
            idx = json.load(f)
        check.eq(sorted(idx["weight_map"]), sorted(full), "weight_map")
        check.eq(idx["metadata"]["total_size"],
                 sum(v.numel() * v.element_size() for v in full.values()),
                 "total_size")
        got = torch_hf_load(c, full)
        for k, v in full.items():
            check.none(dcpio.tensors_identical(v, got[k]), f"torch {k}")
        for name in names[:-1]:
            got = load_file(os.path.join(c, name))
            for k, v in got.items():
                check.eq(idx["weight_map"][k], name, f"index of {k}")
                check.none(dcpio.tensors_identical(full[k], v), f"{name} {k}")
    # refused: a tensor held whole by no rank, consolidated; an existing
    # output
    os.environ["DCP_INTEROP_SAVE_HF"] = "consolidated"
    try:
        for r in range(world):
            dcpio.write_manifest(full, os.path.join(tmp, "bad", str(r)),
                                 boxes=sharded_boxes(r))
        res = dcpio.mpiexec(world, "savefrom",
                            os.path.join(tmp, "bad", "{rank}", "manifest"),
                            os.path.join(tmp, "badout"), tmp=tmp)
        check.true(res.returncode != 0 and "DCP_ENOTSUP" in res.stderr
                   and "held whole by no rank" in res.stderr, res.stderr)
        res = dcpio.mpiexec(world, "savefrom",
                            os.path.join(tmp, "m-consolidated", "{rank}",
                                         "manifest"),
                            c, tmp=tmp)
        check.true(res.returncode != 0 and "DCP_EEXIST" in res.stderr,
                   res.stderr)
    finally:
        del os.environ["DCP_INTEROP_SAVE_HF"]
    out = os.path.join(tmp, "badout")
    check.true(not os.path.exists(out) or not os.listdir(out),
               "a refused save writes nothing")


# ------------------------------------------------------ dequantization

def quantized_dir(d):
    """A quantized HF checkpoint as DeepSeek (FP8 weights, 128 x 128 block
    scales) and gpt-oss (MXFP4 blocks and exponents) ship them: two files
    and the index torch's QuantizedHuggingFaceStorageReader needs. Every
    float8 bit pattern and every exponent byte (0 and 255 included)
    occurs."""
    g = torch.Generator().manual_seed(4242)
    w8 = torch.randint(0, 256, (300, 200), dtype=torch.uint8, generator=g)
    w8[0, :256 - 200 + 200] = torch.arange(200, dtype=torch.uint8)
    w8[1, :56] = torch.arange(200, 256, dtype=torch.uint8)
    s8 = torch.rand(3, 2, generator=g) * 2 ** torch.randint(
        -20, 20, (3, 2), generator=g).float()
    s8[2, 1] = -3.0e-3
    wb = (torch.randn(100, 50, generator=g) * 20).to(torch.float8_e5m2)
    sb = torch.tensor([[0.0625]], dtype=torch.bfloat16)
    blocks = torch.randint(0, 256, (2, 3, 45, 16), dtype=torch.uint8,
                           generator=g)
    scales = torch.arange(270, dtype=torch.int64).reshape(2, 3, 45) % 256
    scales = scales.to(torch.uint8)
    files = {
        "model-00001-of-00002.safetensors": {
            "layers.0.mlp.weight": w8.view(torch.float8_e4m3fn),
            "layers.1.attn.weight": wb,
            "norm.weight": torch.linspace(-1, 1, 7),
            "experts.down_proj_blocks": blocks},
        "model-00002-of-00002.safetensors": {
            "layers.0.mlp.weight_scale_inv": s8,
            "layers.1.attn.weight_scale_inv": sb,
            "experts.down_proj_scales": scales}}
    os.makedirs(d)
    wmap = {}
    for name, tensors in files.items():
        save_file(tensors, os.path.join(d, name), metadata={"format": "pt"})
        wmap.update({k: name for k in tensors})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": wmap}, f)
    return {"layers.0.mlp.weight": (300, 200),
            "layers.1.attn.weight": (100, 50),
            "norm.weight": (7,),
            "experts.down_proj_blocks": (2, 3, 45 * 16 * 2)}


class _Req:
    """The two fields of a ReadItem that _dequantize_tensor_mxfp4 reads."""

    def __init__(self, offs, lens):
        self.storage_offsets = offs
        self.lengths = lens


def torch_dequantized(d, shapes, target):
    """What torch 2.13's QuantizedHuggingFaceStorageReader gives. Its load
    fills only [..., :G] of an MXFP4 tensor (its planner intersects the
    stored 4-D chunk [a, b, G, B] with the 3-D target, so the read covers
    G values a row, the rest of the target is left as it was: checked
    below), so the MXFP4 tensor is taken from the reader's own
    _dequantize_tensor_mxfp4 on the whole tensor."""
    from torch.distributed.checkpoint.quantized_hf_storage import (
        QuantizedHuggingFaceStorageReader)
    sd = {k: torch.zeros(s, dtype=target) for k, s in shapes.items()}
    reader = QuantizedHuggingFaceStorageReader(d, target_dtype=target)
    tdcp.load(sd, storage_reader=reader, no_dist=True)
    blocks = load_file(os.path.join(d, "model-00001-of-00002.safetensors"))[
        "experts.down_proj_blocks"]
    scales = load_file(os.path.join(d, "model-00002-of-00002.safetensors"))[
        "experts.down_proj_scales"]
    a, b, g, _ = blocks.shape
    full = reader._dequantize_tensor_mxfp4(
        blocks, scales, _Req([0, 0, 0], list(shapes[
            "experts.down_proj_blocks"])), 0, 0)
    loaded = sd["experts.down_proj_blocks"]
    assert torch.equal(loaded[..., :g].view(torch.int8),
                       full[..., :g].view(torch.int8)), "torch's load"
    assert not loaded[..., g:].any(), "torch's load fills [..., :G] only"
    sd["experts.down_proj_blocks"] = full
    # a request inside: groups 1.. from value 8 of group 1
    part = reader._dequantize_tensor_mxfp4(
        blocks[1:2, 1:3, 1:5], scales, _Req([1, 1, 40], [1, 2, 100]), 1, 8)
    assert torch.equal(part.view(torch.int8),
                       full[1:2, 1:3, 40:140].view(torch.int8)), "a box"
    return sd


@R.test
def dequantized_like_torch(check, tmp):
    """dcptool import --dequant (dcp_import with DCP_CONVERT_DEQUANT, the
    srcfile route dcp_load_file takes with DCP_LOAD_FILE_DEQUANT) gives
    torch 2.13's QuantizedHuggingFaceStorageReader's tensors bit for bit:
    float32 as read, bfloat16 and float16 through the torch-exact cast."""
    d = os.path.join(tmp, "q")
    shapes = quantized_dir(d)
    for target, name in ((torch.float32, None), (torch.bfloat16, "bf16"),
                         (torch.float16, "f16")):
        sd = torch_dequantized(d, shapes, target)
        ck = os.path.join(tmp, f"ck-{name}")
        args = ["import", os.path.join(d, "model.safetensors.index.json"), ck,
                "--dequant", "--no-fsync"]
        if name:
            args += ["--dtype", name, "--allow-overflow"]
        dcptool(*args)
        rows = ls_rows(ck)
        for k, want in sd.items():
            check.eq(rows[k][1], "[" + ",".join(map(str, want.shape)) + "]",
                     f"{name}: shape {k}")
            got = dcptool("cat", ck, k, text=False).stdout
            check.true(got == dcpio.tensor_bytes(want),
                       f"{name}: {k} as torch dequantizes it")
    # the directory (no index needed) dequantizes the same
    ck = os.path.join(tmp, "ck-dir")
    dcptool("import", d, ck, "--dequant", "--no-fsync")
    sd = torch_dequantized(d, shapes, torch.float32)
    for k, want in sd.items():
        got = dcptool("cat", ck, k, text=False).stdout
        check.true(got == dcpio.tensor_bytes(want), f"dir: {k}")
    # without --dequant: the stored tensors as they are
    ck = os.path.join(tmp, "ck-raw")
    dcptool("import", d, ck, "--no-fsync")
    check.eq(ls_rows(ck)["experts.down_proj_blocks"][:2],
             ["uint8", "[2,3,45,16]"], "raw blocks")


# ------------------------------------------------------------ hostile

def write_piece(d, name, tensors, info, dcp_version=True):
    meta = {"format": "pt"}
    if info is not None:
        meta["DCP_SHARDING_INFO"] = info if isinstance(info, str) \
            else json.dumps(info)
    if dcp_version:
        meta["DCP_VERSION"] = "1.0"
    save_file(tensors, os.path.join(d, name), metadata=meta)


def refused(check, d, tmp, what, *needles):
    r = dcpio.run("dumpall", d, os.path.join(tmp, "dump-bad"),
                  expect_ok=False)
    check.true(r.returncode != 0 and "DCP_EFORMAT" in r.stderr and
               all(n in r.stderr for n in needles),
               f"{what}: {r.stderr.strip()}")
    r = subprocess.run([os.environ["DCPTOOL"], "ls", d], capture_output=True,
                       text=True, timeout=60)
    check.true(r.returncode == 1 and all(n in r.stderr for n in needles),
               f"{what}: ls: {r.stderr.strip()}")
    # the srcfile route (dcp_import of the directory) refuses it too
    out = os.path.join(tmp, "imp-bad")
    shutil.rmtree(out, ignore_errors=True)
    r = subprocess.run([os.environ["DCPTOOL"], "import", d, out],
                       capture_output=True, text=True, timeout=60)
    check.true(r.returncode == 1 and all(n in r.stderr for n in needles),
               f"{what}: import: {r.stderr.strip()}")


@R.test
def hf_hostile(check, tmp):
    """Pieces that overlap or leave a gap, offsets out of range or of the
    wrong rank, bad JSON, a missing entry, dtypes that disagree: DCP_EFORMAT
    naming the file and the tensor; a lone piece is refused by import."""
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    cases = [
        ("overlap", [("s1.safetensors", {"w": a}, {"w": {"saved_offsets":
                                                          [0, 0]}}),
                     ("s2.safetensors", {"w": a}, {"w": {"saved_offsets":
                                                          [2, 0]}})],
         ["'w'", "s1.safetensors", "s2.safetensors", "overlap"]),
        ("gap", [("s1.safetensors", {"w": a}, {"w": {"saved_offsets":
                                                      [0, 0]}}),
                 ("s2.safetensors", {"w": a}, {"w": {"saved_offsets":
                                                      [4, 0]}})],
         ["'w'", "s1.safetensors", "gap"]),
        ("whole-and-piece", [("m.safetensors", {"w": a}, None),
                             ("s2.safetensors", {"w": a},
                              {"w": {"saved_offsets": [3, 4]}})],
         ["'w'", "gap"]),
        ("negative", [("s1.safetensors", {"w": a},
                       {"w": {"saved_offsets": [-1, 0]}})],
         ["'w'", "s1.safetensors", "saved_offsets[0]"]),
        ("huge", [("s1.safetensors", {"w": a},
                   {"w": {"saved_offsets": [2 ** 63 - 2, 0]}})],
         ["'w'", "s1.safetensors", "saved_offsets[0]"]),
        ("rank", [("s1.safetensors", {"w": a},
                   {"w": {"saved_offsets": [0]}})],
         ["'w'", "s1.safetensors", "saved_offsets of 2"]),
        ("missing", [("s1.safetensors", {"w": a, "v": a.clone()},
                      {"w": {"saved_offsets": [0, 0]}})],
         ["'v'", "s1.safetensors"]),
        ("bad-json", [("s1.safetensors", {"w": a}, '{"w": {"saved_')],
         ["s1.safetensors", "DCP_SHARDING_INFO"]),
        ("not-object", [("s1.safetensors", {"w": a}, "[1, 2]")],
         ["s1.safetensors", "DCP_SHARDING_INFO"]),
        ("dtype", [("s1.safetensors", {"w": a}, {"w": {"saved_offsets":
                                                        [0, 0]}}),
                   ("s2.safetensors", {"w": a.double()},
                    {"w": {"saved_offsets": [3, 0]}})],
         ["'w'", "s1.safetensors", "s2.safetensors", "float64"]),
    ]
    for what, files, needles in cases:
        d = os.path.join(tmp, what)
        os.makedirs(d)
        for name, tensors, info in files:
            write_piece(d, name, tensors, info)
        refused(check, d, tmp, what, *needles)
    # a well-formed pair reads (the hostile cases are not refused blindly)
    d = os.path.join(tmp, "good")
    os.makedirs(d)
    write_piece(d, "s1.safetensors", {"w": a}, {"w": {"saved_offsets":
                                                       [0, 0]}})
    write_piece(d, "s2.safetensors", {"w": a + 12}, {"w": {"saved_offsets":
                                                            [3, 0]}})
    got = dcptool("cat", d, "w", text=False).stdout
    check.eq(got.hex(), dcpio.tensor_bytes(torch.cat([a, a + 12])).hex(),
             "good pieces")
    # one piece alone, opened as a file: refused, naming the tensor
    r = subprocess.run([os.environ["DCPTOOL"], "import",
                        os.path.join(d, "s2.safetensors"),
                        os.path.join(tmp, "lone")],
                       capture_output=True, text=True, timeout=60)
    check.true(r.returncode == 1 and "'w' is a piece at [3,0]" in r.stderr,
               f"lone piece: {r.stderr.strip()}")


if __name__ == "__main__":
    R.main()
