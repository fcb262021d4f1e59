"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/).

    .venv/bin/python tests/fuzz/make_corpus.py [DCPTOOL_BUILD_DIR]

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
            with an offset, values) and the records of the fixture
            checkpoints, cut out at their storage offsets
  metadata  whole checkpoints in memfs.h's format: .metadata, then each
            data file, joined by the memfs separator
  (both)    the hostile set of make_hostile.py (run that first)
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


def torchzips():
    d = out_dir("torchzip")
    for name, data in torch_records().items():
        write(d, "torch-" + name, data)
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


def hostile_seeds():
    """The hostile set (make_hostile.py) as seeds: each .metadata for the
    pickle target, each case as a whole checkpoint for the metadata one."""
    hdir = os.path.join(HERE, "hostile")
    if not os.path.isdir(hdir):
        return
    for case in sorted(os.listdir(hdir)):
        d = os.path.join(hdir, case)
        m = os.path.join(d, ".metadata")
        if not os.path.isfile(m) or os.path.islink(m):
            continue
        raw = open(m, "rb").read()
        if len(raw) <= 8192:
            write(os.path.join(HERE, "corpus", "pickle"), "hostile-" + case,
                  raw)
        parts = [raw]
        data = os.path.join(d, "__0_0.distcp")
        if os.path.isfile(data):
            parts.append(open(data, "rb").read())
        write(os.path.join(HERE, "corpus", "metadata"), "hostile-" + case,
              SEP.join(parts))


if __name__ == "__main__":
    pickles()
    torchzips()
    metadatas()
    hostile_seeds()
    for t in ("pickle", "torchzip", "metadata"):
        d = os.path.join(HERE, "corpus", t)
        n = len(os.listdir(d))
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print("%-9s %3d files, %6d bytes" % (t, n, size))
