"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/).

    .venv/bin/python tests/fuzz/make_corpus.py [DCPTOOL_BUILD_DIR] [--targets T,...]

Needs torch 2.13 (CPU) for real torch.save records and DCP checkpoints;
everything else is the standard library. The corpora are committed; rerun
this only to reseed (fuzzing runs add their own finds with
`tests/fuzz/run_fuzz.sh --merge`). Seeds are named seed-*, so they can be
told from merged finds. Keep them small: each target's seeds stay under
about 200 KB.

  pickle    stdlib pickles of Python values (protocols 0-5), pickles of
            stub classes named like torch's rebuild functions, the data.pkl
            of real torch.save records and real .metadata pickles
  torchzip  real torch.save records (tensors of several dtypes, a view
            with an offset, values), the records of the fixture
            checkpoints, cut out at their storage offsets, and records
            with dcp's block-CRC field (good and damaged)
  metadata  whole checkpoints in memfs.h's format: .metadata, then each
            data file, joined by the memfs separator
  safetensors  files written by the safetensors package (torch and numpy
            flavours: every dtype, scalars, empty tensors, __metadata__,
            names that need escaping, many tensors) and by dcp's export
  srcfile   whole torch.save files of state dicts (nested dicts and lists,
            OrderedDict, nn.Parameter, tied weights, views, values) and
            safetensors files, as dcp_import and dcp_load_file read them
  layouts   (into metadata/, beside its seeds) torch's ZStandard records,
            SAFETENSORS data files and unflattened layout; dcp's planner
            outputs (planner data, a bf16 copy, a filtered state)
  (all)     the hostile set of make_hostile.py (run that first)
--targets picks some of them (default: all).
"""

import collections
import io
import os
import pickle
import shutil
import sys
import tempfile
import warnings
import zipfile

import torch
import torch.distributed.checkpoint as tdcp

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")
SEP = b"\xff\xfeDCPFILE"


def out_dir(target):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        if f.startswith("seed-"):
            os.remove(os.path.join(d, f))
    return d


def write(d, name, data):
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def stub(module, name):
    """A class that pickles as a GLOBAL module.name (no torch needed)."""
    cls = type(name, (), {})
    cls.__module__ = module
    cls.__qualname__ = name
    return cls


class Reduce:
    def __init__(self, fn, args, state=None):
        self.fn, self.args, self.state = fn, args, state

    def __reduce__(self):
        if self.state is None:
            return (self.fn, self.args)
        return (self.fn, self.args, self.state)


SAVED = []


def register_stub(module, name):
    """Makes module.name resolvable for pickle's save_global check (undone
    by unregister_stubs, so torch's own names come back)."""
    import types
    cls = stub(module, name)
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        mod = ".".join(parts[:i])
        if mod not in sys.modules:
            sys.modules[mod] = types.ModuleType(mod)
    m = sys.modules[module]
    SAVED.append((m, name, getattr(m, name, None)))
    setattr(m, name, cls)
    return cls


def unregister_stubs():
    for m, name, old in reversed(SAVED):
        if old is None:
            delattr(m, name)
        else:
            setattr(m, name, old)
    SAVED.clear()


class _Storage:
    def __init__(self, pid):
        self.pid = pid


class _PidPickler(pickle.Pickler):
    """Storages as BINPERSID, as torch.save writes them."""

    def persistent_id(self, obj):
        return obj.pid if isinstance(obj, _Storage) else None


def nested_pickle(d, rebuild, floatst):
    """The data.pkl of a value holding tensors (flatten_state_dict=False):
    a nested dict with tensors in dicts, lists and a tuple, a view with a
    storage offset into a shared storage, int keys, plain leaves."""
    od = collections.OrderedDict()
    s0 = _Storage(("storage", floatst, "0", "cpu", 12))
    s1 = _Storage(("storage", floatst, "1", "cpu", 2))
    t = lambda st, off, size, stride: Reduce(
        rebuild, (st, off, size, stride, False, od))
    v = {"w": t(s0, 0, (3, 4), (4, 1)), "view": t(s0, 5, (2, 2), (1, 2)),
         "lst": [t(s1, 0, (2,), (1,)), t(s1, 1, (), ())],
         "cfg": {"lr": 0.1, 3: "x", "betas": (0.9, 0.95)},
         "opt": [{"m": t(s1, 0, (1,), (1,))}], "tup": (t(s1, 0, (2,), (1,)),)}
    buf = io.BytesIO()
    _PidPickler(buf, protocol=2).dump(v)
    write(d, "nested-value-p2", buf.getvalue())


def pickles():
    d = out_dir("pickle")
    values = {
        "int": 7, "neg": -123456789012, "big": 2 ** 70, "float": 2.5,
        "nan": float("nan"), "str": "héllo", "bytes": b"\x00\xff" * 10,
        "none": None, "bools": [True, False],
        "tuple": (1, "x", 2.0, None), "list": [1, [2, [3, [4]]]],
        "dict": {"a": 1, "b": {"c": [1, 2, {"d": b"x"}]}},
        "odict": collections.OrderedDict([("x", 1), ("y", 2)]),
        "shared": (lambda s: [s, s, {"k": s}])([1, 2]),
        "empty": [(), [], {}, "", b""],
        "long_str": "x" * 300, "unicode": "\u2603" * 20,
    }
    for name, v in values.items():
        for proto in (0, 2, 4, 5):
            write(d, "%s-p%d" % (name, proto), pickle.dumps(v, protocol=proto))
    # Stubs of torch's globals: a tensor rebuild, storages, Size, and a
    # global that is not allowed (os.system) used with REDUCE.
    rebuild = register_stub("torch._utils", "_rebuild_tensor_v2")
    size = register_stub("torch", "Size")
    floatst = register_stub("torch", "FloatStorage")
    system = register_stub("os", "system")
    od = collections.OrderedDict()
    t = Reduce(rebuild, (("storage", floatst, "0", "cpu", 6), 0, (2, 3),
                         (3, 1), False, od))
    write(d, "rebuild-p2", pickle.dumps(t, protocol=2))
    write(d, "size-p2", pickle.dumps(Reduce(size, ((2, 3),)), protocol=2))
    write(d, "evil-reduce-p2",
          pickle.dumps(Reduce(system, ("echo pwned",)), protocol=2))
    write(d, "build-p2",
          pickle.dumps(Reduce(size, ((1,),), {"a": 1}), protocol=2))
    nested_pickle(d, rebuild, floatst)
    unregister_stubs()
    for item in ("torch_item_w.bin", "torch_item_step.bin", "torch_item_f8.bin"):
        with zipfile.ZipFile(os.path.join(DATA, item)) as z:
            for n in z.namelist():
                if n.endswith("data.pkl"):
                    write(d, "datapkl-" + item[:-4], z.read(n))
    for ck in ("torch_small", "torch_sharded", "torch_mixed"):
        with open(os.path.join(DATA, ck, ".metadata"), "rb") as f:
            write(d, "metadata-" + ck, f.read())


def torch_records():
    recs = {}
    for name, obj in {
        "f32": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "bf16": torch.ones(4, dtype=torch.bfloat16),
        "i64": torch.tensor([1, -2, 3]),
        "bool": torch.tensor([True, False]),
        "f8": torch.zeros(3, dtype=torch.float8_e4m3fn),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.zeros(0, 3),
        "view": torch.arange(10.0)[2:8:2],
        "transposed": torch.arange(6.0).reshape(2, 3).t(),
        "value-int": 7,
        "value-tuple": ("tiny", 0.5, True, None, b"\x00\xff", [1, 2]),
        "value-dict": {"a": [1, 2], "b": "c"},
    }.items():
        b = io.BytesIO()
        torch.save(obj, b)
        recs[name] = b.getvalue()
    return recs


def fixture_records(path):
    reader = tdcp.FileSystemReader(path)
    md = reader.read_metadata()
    out = {}
    for idx, info in md.storage_data.items():
        with open(os.path.join(path, info.relative_path), "rb") as f:
            f.seek(info.offset)
            out["%s-%s" % (os.path.basename(path), idx.fqn)] = f.read(info.length)
    return out


def blockcrc_record(obj, bsize, mutate=None):
    """A torch.save record re-zipped (stored, same entries) with dcp's
    block-CRC extra field (docs/FORMAT.md section 4) on its storage entry:
    python's zipfile puts it in the local header and the central directory
    (dcp reads the central one). mutate(field) may damage the field."""
    import struct
    import zlib
    b = io.BytesIO()
    torch.save(obj, b)
    src = zipfile.ZipFile(io.BytesIO(b.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for zi in src.infolist():
            data = src.read(zi)
            info = zipfile.ZipInfo(zi.filename, date_time=(1980, 1, 1, 0, 0, 0))
            if zi.filename.endswith("/data/0"):
                crcs = [zlib.crc32(data[k:k + bsize])
                        for k in range(0, len(data), bsize)]
                field = struct.pack("<BxxxIQ", 1, bsize, len(data))
                field += b"".join(struct.pack("<I", c) for c in crcs)
                field = struct.pack("<HH", 0x4344, len(field)) + field
                if mutate:
                    field = mutate(field)
                info.extra = field
            z.writestr(info, data)
    return out.getvalue()


def blockcrc_records():
    u8 = torch.arange(3 * 4096 + 7, dtype=torch.int64).to(torch.uint8)

    def put(at, fmt, v):
        import struct
        return lambda f: f[:at] + struct.pack(fmt, v) + f[at + struct.calcsize(fmt):]
    return {
        "u8-4blocks": blockcrc_record(u8, 4096),
        "f32-1block": blockcrc_record(torch.arange(6.0).reshape(2, 3), 4096),
        "bad-crc": blockcrc_record(u8, 4096, put(20, "<I", 0)),
        "bsize-0": blockcrc_record(u8, 4096, put(8, "<I", 0)),
        "count": blockcrc_record(u8, 4096, put(8, "<I", 8192)),
    }


def torchzips():
    d = out_dir("torchzip")
    for name, data in torch_records().items():
        write(d, "torch-" + name, data)
    for name, data in blockcrc_records().items():
        write(d, "blockcrc-" + name, data)
    for ck in ("torch_small", "torch_sharded"):
        for name, data in fixture_records(os.path.join(DATA, ck)).items():
            write(d, "record-" + name.replace("/", "_"), data)


def checkpoint_bytes(path):
    reader = tdcp.FileSystemReader(path)
    md = reader.read_metadata()
    files = []
    for info in md.storage_data.values():
        if info.relative_path not in files:
            files.append(info.relative_path)
    # memfs serves the k-th distinct name opened as part k; dcp opens data
    # files in the order it reads chunks, which follows the metadata's
    # sorted keys: approximate that order (a wrong guess is a fine mutation).
    order = []
    for fqn in sorted(md.state_dict_metadata):
        for idx, info in md.storage_data.items():
            if idx.fqn == fqn and info.relative_path not in order:
                order.append(info.relative_path)
    parts = [open(os.path.join(path, ".metadata"), "rb").read()]
    for f in order:
        parts.append(open(os.path.join(path, f), "rb").read())
    return SEP.join(parts)


def metadatas():
    d = out_dir("metadata")
    for ck in ("torch_small", "torch_sharded", "torch_mixed"):
        write(d, ck, checkpoint_bytes(os.path.join(DATA, ck)))
    tmp = tempfile.mkdtemp()
    try:
        states = {
            "values": {"step": 3, "cfg": {"lr": 0.1, "name": "x"}},
            "dtypes": {"m": {k: torch.ones(3, dtype=getattr(torch, k))
                             for k in ("float16", "int8", "uint8", "int32",
                                       "float64", "int16")}},
            "matrix": {"w": torch.arange(40.0).reshape(5, 8)},
            "scalar": {"s": torch.tensor(1.0), "e": torch.zeros(0)},
        }
        for name, sd in states.items():
            p = os.path.join(tmp, name)
            tdcp.save(sd, checkpoint_id=p)
            write(d, "torch-" + name, checkpoint_bytes(p))
        # Checkpoints written by dcp itself (tests/interop/interop_state
        # savefrom), when a build directory is given.
        prog = os.path.join(sys.argv[1], "tests", "interop_state") \
            if len(sys.argv) > 1 else ""
        if os.path.exists(prog):
            sys.path.insert(0, os.path.join(HERE, "..", "interop"))
            import dcpio
            for name, sd in {
                "mixed": {"model": {"w": torch.arange(12.0).reshape(3, 4),
                                    "b": torch.ones(4, dtype=torch.bfloat16)},
                          "step": 9, "tag": ("x", 1.5, None, b"\x01")},
                "sharded": {"x": torch.arange(24, dtype=torch.int32)
                            .reshape(6, 4)},
            }.items():
                src = os.path.join(tmp, "m-" + name)
                os.makedirs(src)
                boxes = None
                if name == "sharded":
                    boxes = {"x": [((0, 0), (3, 4)), ((3, 0), (3, 4))]}
                m = dcpio.write_manifest(sd, src, boxes=boxes)
                p = os.path.join(tmp, "dcp-" + name)
                if os.system("%s savefrom %s %s" % (prog, m, p)) == 0:
                    write(d, "dcp-" + name, checkpoint_bytes(p))
    finally:
        shutil.rmtree(tmp)


def layouts():
    """Issue 18's and 17's layouts as whole checkpoints for the metadata
    target (added beside the other seeds, which stay): torch's ZStandard
    records, SAFETENSORS data files and the unflattened layout; dcp's own
    zstd records and planner data, when a build directory is given."""
    from torch.distributed.checkpoint import (DefaultSavePlanner,
                                              FileSystemWriter)
    from torch.distributed.checkpoint._extension import ZStandard
    from torch.distributed.checkpoint.filesystem import SerializationFormat
    d = os.path.join(HERE, "corpus", "metadata")
    os.makedirs(d, exist_ok=True)
    tmp = tempfile.mkdtemp()
    sd = {"model": {"w": torch.arange(24.0).reshape(4, 6),
                    "b": torch.ones(6, dtype=torch.bfloat16)},
          "step": 7, "cfg": {"lr": 0.5}}
    try:
        writers = {
            "zstd": lambda p: FileSystemWriter(p, _extensions=[ZStandard()]),
            "safetensors": lambda p: FileSystemWriter(
                p, serialization_format=SerializationFormat.SAFETENSORS),
        }
        for name, w in writers.items():
            p = os.path.join(tmp, name)
            tdcp.save(sd, storage_writer=w(p), no_dist=True)
            write(d, "torch-layout-" + name, checkpoint_bytes(p))
        p = os.path.join(tmp, "unflat")
        tdcp.save(sd, checkpoint_id=p, no_dist=True,
                  planner=DefaultSavePlanner(flatten_state_dict=False))
        write(d, "torch-layout-unflat", checkpoint_bytes(p))
        build = sys.argv[1] if len(sys.argv) > 1 else ""
        recipes = os.path.join(build, "planner_recipes")
        if os.path.exists(recipes):
            for mode in ("extra", "bf16", "filter"):
                p = os.path.join(tmp, "dcp-" + mode)
                if os.system("%s %s %s" % (recipes, mode, p)) == 0:
                    write(d, "dcp-planner-" + mode, checkpoint_bytes(p))
    finally:
        shutil.rmtree(tmp)


def st_states():
    g = torch.Generator().manual_seed(1)
    states = {
        "f32": {"w": torch.randn(4, 3, generator=g), "b": torch.randn(3, generator=g)},
        "dtypes": {k: torch.arange(4).to(getattr(torch, k)) for k in (
            "float64", "float32", "float16", "bfloat16", "int64", "int32",
            "int16", "int8", "uint8", "bool", "float8_e4m3fn", "float8_e5m2")},
        "unsupported": {"u16": torch.zeros(2, dtype=torch.uint16),
                        "c64": torch.zeros(1, dtype=torch.complex64)},
        "scalar-empty": {"s": torch.tensor(2.5), "e": torch.zeros(0, 4),
                         "z": torch.zeros(3, 0, 2, dtype=torch.int8)},
        "names": {'quote"back\\slash': torch.ones(1),
                  "tab\tnew\nline": torch.ones(2),
                  "unicode-\u00e9\u2603\U0001f680": torch.ones(1, 1),
                  "model.layers.0.attn.q_proj.weight": torch.ones(2, 2)},
        "many": {"t%03d" % i: torch.full((i % 5 + 1,), float(i))
                 for i in range(40)},
        "rank8": {"r": torch.zeros(*([1] * 7 + [2]))},
    }
    return states


def safetensorses():
    """Seeds for the safetensors target: real files from the safetensors
    package, and the ones make_hostile.py wrote (added by hostile_seeds)."""
    from safetensors.torch import save as st_save
    from safetensors.numpy import save as np_save
    import numpy as np
    d = out_dir("safetensors")
    for name, sd in st_states().items():
        write(d, "torch-" + name, st_save(sd))
        if name == "f32":
            write(d, "torch-meta-" + name,
                  st_save(sd, metadata={"format": "pt", "note": "x\"y\u00e9"}))
    write(d, "numpy-mixed", np_save({
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.array([1, 2], dtype=np.uint64),
        "c": np.array([True]), "d": np.zeros((0,), dtype=np.int16)}))
    write(d, "empty", st_save({}))


def srcfiles():
    """Seeds for the srcfile target: torch.save files of state dicts as
    users write them, and safetensors files."""
    from safetensors.torch import save as st_save
    d = out_dir("srcfile")
    g = torch.Generator().manual_seed(2)
    lin = torch.nn.Linear(3, 2)
    emb = torch.randn(5, 3, generator=g)
    base = torch.arange(24.0).reshape(4, 6)
    states = {
        "module": lin.state_dict(),
        "nested": {"model": {"w": torch.ones(2, 3), "b": torch.zeros(3)},
                   "optim": {"state": {0: {"step": torch.tensor(3.0),
                                           "exp_avg": torch.ones(2, 3)}},
                             "param_groups": [{"lr": 0.1, "params": [0]}]},
                   "step": 7, "name": "run", "ok": True, "none": None},
        "lists": {"layers": [torch.ones(2), torch.zeros(3)],
                  "mixed": [1, "a", 2.5], "tup": (torch.ones(1), 3)},
        "ordered": collections.OrderedDict([("b", torch.ones(2)),
                                            ("a", torch.zeros(1))]),
        "parameter": {"p": torch.nn.Parameter(torch.ones(2, 2))},
        "tied": {"emb": emb, "head": emb},
        "views": {"t": base.t(), "row": base[1], "col": base[:, 2],
                  "slice": base[1:3, ::2], "base": base},
        "dtypes": {k: torch.arange(3).to(getattr(torch, k)) for k in (
            "float64", "float16", "bfloat16", "int32", "int8", "uint8",
            "bool", "float8_e4m3fn")},
        "scalar-empty": {"s": torch.tensor(1.5), "e": torch.zeros(0, 2)},
        "bytes": {"blob": b"\x00\x01", "w": torch.ones(1)},
    }
    for name, sd in states.items():
        b = io.BytesIO()
        torch.save(sd, b)
        write(d, "torch-" + name, b.getvalue())
    for name in ("f32", "names", "scalar-empty"):
        write(d, "st-" + name, st_save(st_states()[name]))


def hostile_seeds(targets):
    """The hostile set (make_hostile.py) as seeds: each .metadata for the
    pickle target, each case as a whole checkpoint for the metadata one,
    each single-file case for safetensors (safetensors files) and srcfile
    (safetensors and torch.save files); only for the targets asked for."""
    hdir = os.path.join(HERE, "hostile")
    if not os.path.isdir(hdir):
        return
    for case in sorted(os.listdir(hdir)):
        d = os.path.join(hdir, case)
        m = os.path.join(d, ".metadata")
        if not os.path.isfile(m) or os.path.islink(m):
            continue
        raw = open(m, "rb").read()
        if len(raw) <= 8192 and "pickle" in targets:
            write(os.path.join(HERE, "corpus", "pickle"), "hostile-" + case,
                  raw)
        parts = [raw]
        data = os.path.join(d, "__0_0.distcp")
        if os.path.isfile(data):
            parts.append(open(data, "rb").read())
        if "metadata" in targets:
            write(os.path.join(HERE, "corpus", "metadata"), "hostile-" + case,
                  SEP.join(parts))
    # Single-file cases (setup file:NAME): safetensors files for both file
    # targets, torch.save files for srcfile.
    for line in open(os.path.join(hdir, "manifest.txt")):
        if line.startswith("#") or len(line.split()) < 3:
            continue
        case, _, setup = line.split()[:3]
        for item in setup.split(","):
            if not item.startswith("file:"):
                continue
            f = os.path.join(hdir, case, item[5:])
            if not os.path.isfile(f) or os.path.getsize(f) > 65536:
                continue
            raw = open(f, "rb").read()
            if (not raw.startswith(b"PK") and not f.endswith(".json") and
                    "safetensors" in targets):
                write(os.path.join(HERE, "corpus", "safetensors"),
                      "hostile-" + case, raw)
            if not f.endswith(".json") and "srcfile" in targets:
                write(os.path.join(HERE, "corpus", "srcfile"),
                      "hostile-" + case, raw)


if __name__ == "__main__":
    ALL = ("pickle", "torchzip", "metadata", "safetensors", "srcfile",
           "layouts")
    targets = ALL
    if "--targets" in sys.argv:
        i = sys.argv.index("--targets")
        targets = tuple(sys.argv[i + 1].split(","))
        del sys.argv[i:i + 2]
    makers = {"pickle": pickles, "torchzip": torchzips,
              "metadata": metadatas, "safetensors": safetensorses,
              "srcfile": srcfiles, "layouts": layouts}
    for t in targets:
        makers[t]()
    hostile_seeds(targets)
    for t in targets:
        if t == "layouts":
            continue
        d = os.path.join(HERE, "corpus", t)
        n = len(os.listdir(d))
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print("%-9s %3d files, %6d bytes" % (t, n, size))
