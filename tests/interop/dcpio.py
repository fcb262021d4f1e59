"""Shared helpers for the PyTorch interop tests (tests/interop/test_*.py).

- the manifest format of interop_state.c (see the comment at the top of that
  file): write one from a nested state dict, read one back;
- torch's own flattening (torch.distributed.checkpoint._nested_dict), so the
  keys and paths are exactly PyTorch's;
- bit-exact comparison of tensors (raw bytes) and values (types, float bits);
- a tiny test runner that ends with the line "N passed, M failed".

The tests run in CI and never skip: without torch they fail loudly.
"""

import math
import os
import random
import shlex
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import traceback
import warnings

# dcp.save/load without a process group warn that they run single-process.
warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")

try:
    import torch
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
except Exception as exc:  # pragma: no cover - the point is to fail loudly
    print(f"FAIL: torch is not importable with {sys.executable}: {exc!r}",
          file=sys.stderr)
    print("0 passed, 1 failed")
    sys.exit(1)


# ------------------------------------------------------------------ dtypes

DTYPES = [
    torch.float64, torch.float32, torch.float16, torch.bfloat16,
    torch.float8_e4m3fn, torch.float8_e5m2,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
    torch.bool,
]


def dtype_name(dt):
    return str(dt).replace("torch.", "")


def dtype_from_name(name):
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype name {name!r}")
    return dt


# ----------------------------------------------------------------- tensors

def tensor_bytes(t):
    """Raw little-endian C-order bytes of t (any layout, 0-d, empty)."""
    t = t.detach().cpu().contiguous()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def tensor_from_bytes(data, dtype, shape):
    shape = tuple(shape)
    esize = torch.empty((), dtype=dtype).element_size()
    n = 1
    for d in shape:
        n *= d
    if len(data) != n * esize:
        raise ValueError(f"{len(data)} bytes for {dtype} {list(shape)}")
    if n == 0:
        return torch.empty(shape, dtype=dtype)
    u8 = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return u8.view(dtype).reshape(shape).clone()


def random_tensor(dtype, shape, rng):
    """Random bit patterns (NaN payloads, infinities, subnormals included)
    viewed as dtype; bool gets 0/1 only. rng: random.Random."""
    shape = tuple(shape)
    n = 1
    for d in shape:
        n *= d
    if dtype == torch.bool:
        vals = [rng.randrange(2) for _ in range(n)]
        return torch.tensor(vals, dtype=torch.bool).reshape(shape)
    esize = torch.empty((), dtype=dtype).element_size()
    raw = bytes(rng.randrange(256) for _ in range(n * esize))
    return tensor_from_bytes(raw, dtype, shape)


def tensors_identical(a, b):
    """None when a and b have the same dtype, shape and bytes, else a text."""
    if not isinstance(b, torch.Tensor):
        return f"expected a tensor, got {type(b).__name__}"
    if a.dtype != b.dtype:
        return f"dtype {b.dtype} != expected {a.dtype}"
    if tuple(a.shape) != tuple(b.shape):
        return f"shape {list(b.shape)} != expected {list(a.shape)}"
    ba, bb = tensor_bytes(a), tensor_bytes(b)
    if ba != bb:
        esize = a.element_size()
        for i in range(0, len(ba), esize):
            if ba[i:i + esize] != bb[i:i + esize]:
                return (f"bytes differ first at element {i // esize}: "
                        f"got {bb[i:i + esize].hex()} expected "
                        f"{ba[i:i + esize].hex()} ({len(ba)} bytes)")
    return None


# ------------------------------------------------------------------ values

def _float_bits(x):
    return struct.pack(">d", x).hex()


def values_identical(a, b, where="value"):
    """None when b is a's exact twin (types, list vs tuple, float bits)."""
    if type(a) is not type(b):
        return f"{where}: type {type(b).__name__} != expected {type(a).__name__} ({b!r} vs {a!r})"
    if isinstance(a, float):
        if _float_bits(a) != _float_bits(b):
            return f"{where}: float bits {_float_bits(b)} != expected {_float_bits(a)}"
        return None
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{where}: length {len(b)} != expected {len(a)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = values_identical(x, y, f"{where}[{i}]")
            if d:
                return d
        return None
    if isinstance(a, dict):
        if set(a.keys()) != set(b.keys()):
            return f"{where}: keys {list(b.keys())} != expected {list(a.keys())}"
        for k in a:
            d = values_identical(a[k], b[k], f"{where}[{k!r}]")
            if d:
                return d
        return None
    if isinstance(a, torch.Tensor):
        d = tensors_identical(a, b)
        return f"{where}: {d}" if d else None
    if a != b:
        return f"{where}: {b!r} != expected {a!r}"
    return None


def nested_identical(a, b, where="state"):
    """Deep comparison of nested state dicts holding tensors and values."""
    return values_identical(a, b, where)


def _enc_str(tag, data):
    out = [tag, '"']
    for ch in data:
        if 0x21 <= ch <= 0x7E and ch not in (0x22, 0x5C):
            out.append(chr(ch))
        else:
            out.append(f"\\x{ch:02x}")
    out.append('"')
    return "".join(out)


def encode_value(v):
    """A Python value in the manifest's value syntax."""
    if v is None:
        return "none"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if type(v) is int:
        if not -(2 ** 63) <= v < 2 ** 63:
            raise ValueError(f"int {v} outside int64")
        return f"i{v}"
    if type(v) is float:
        return "f" + _float_bits(v)
    if type(v) is str:
        return _enc_str("s", v.encode("utf-8"))
    if type(v) is bytes:
        return "b" + v.hex()
    if type(v) is list:
        return "[" + " ".join(encode_value(x) for x in v) + "]"
    if type(v) is tuple:
        return "(" + " ".join(encode_value(x) for x in v) + ")"
    if type(v) is dict:
        return "{" + " ".join(encode_value(k) + " " + encode_value(x)
                              for k, x in v.items()) + "}"
    raise TypeError(f"cannot encode {type(v).__name__} {v!r} in a manifest")


class _Parser:
    def __init__(self, text):
        self.s = text
        self.i = 0

    def ws(self):
        while self.i < len(self.s) and self.s[self.i] in " \t\r":
            self.i += 1

    def eof(self):
        self.ws()
        return self.i >= len(self.s)

    def word(self):
        self.ws()
        j = self.i
        while j < len(self.s) and self.s[j] not in " \t\r)]}":
            j += 1
        w = self.s[self.i:j]
        self.i = j
        return w

    def quoted(self):
        if self.s[self.i] != '"':
            raise ValueError(f"expected '\"' at {self.i} in {self.s!r}")
        self.i += 1
        out = bytearray()
        while True:
            ch = self.s[self.i]
            self.i += 1
            if ch == '"':
                return bytes(out)
            if ch == "\\":
                e = self.s[self.i]
                self.i += 1
                if e == "x":
                    out.append(int(self.s[self.i:self.i + 2], 16))
                    self.i += 2
                else:
                    out += e.encode()
            else:
                out += ch.encode()

    def dims(self):
        self.ws()
        j = self.i
        while j < len(self.s) and self.s[j] not in " \t\r":
            j += 1
        w = self.s[self.i:j]
        self.i = j
        if not (w.startswith("[") and w.endswith("]")):
            raise ValueError(f"bad dims {w!r}")
        body = w[1:-1]
        return [int(x) for x in body.split(",")] if body else []

    def value(self):
        self.ws()
        c = self.s[self.i]
        if c in "[({":
            self.i += 1
            close = {"[": "]", "(": ")", "{": "}"}[c]
            items = []
            while True:
                self.ws()
                if self.s[self.i] == close:
                    self.i += 1
                    break
                items.append(self.value())
            if c == "[":
                return items
            if c == "(":
                return tuple(items)
            return {items[k]: items[k + 1] for k in range(0, len(items), 2)}
        if c == "s":
            self.i += 1
            return self.quoted().decode("utf-8", errors="surrogateescape")
        w = self.word()
        if w == "none":
            return None
        if w == "true":
            return True
        if w == "false":
            return False
        if w[0] == "i":
            return int(w[1:])
        if w[0] == "f":
            return struct.unpack(">d", bytes.fromhex(w[1:]))[0]
        if w[0] == "b":
            return bytes.fromhex(w[1:])
        raise ValueError(f"unknown value token {w!r}")


def decode_value(text):
    p = _Parser(text)
    v = p.value()
    if not p.eof():
        raise ValueError(f"trailing text in {text!r}")
    return v


# ---------------------------------------------------------------- manifests

def flatten(state):
    """torch's flatten_state_dict: (flat {key: leaf}, mapping {key: path})."""
    return flatten_state_dict(state)


def write_manifest(state, dirpath, boxes=None, flat=None, files=True):
    """Writes dirpath/manifest (+ side files) for a nested state dict.

    boxes: {key: [(offsets, sizes), ...]} saves that tensor as several boxes
    (one "tensor" line each, with the box's own bytes); an empty list leaves
    the key out. files=False writes no side files (a manifest for
    interop_state loadinto, whose FILE names are outputs; the tensors are
    then only read for their dtype and shape). Returns the manifest path."""
    os.makedirs(dirpath, exist_ok=True)
    flat_sd, mapping = flatten(state)
    boxes = boxes or {}
    lines = ["dcp-manifest 1"]
    nfile = 0
    for key, leaf in flat_sd.items():
        path = "(" + " ".join(encode_value(p) for p in mapping[key]) + ")"
        if isinstance(leaf, torch.Tensor):
            t = leaf.detach().cpu()
            shape = list(t.shape)
            for offs, sizes in boxes.get(key, [([0] * t.dim(), shape)]):
                box = t
                for d, (o, s) in enumerate(zip(offs, sizes)):
                    box = box.narrow(d, o, s)
                fname = f"b{nfile}.bin"
                nfile += 1
                if files:
                    with open(os.path.join(dirpath, fname), "wb") as f:
                        f.write(tensor_bytes(box))
                lines.append(
                    f"tensor {path} {dtype_name(t.dtype)} "
                    f"[{','.join(map(str, shape))}] "
                    f"[{','.join(map(str, offs))}] "
                    f"[{','.join(map(str, sizes))}] "
                    + _enc_str("s", fname.encode()))
        else:
            lines.append(f"value {path} {encode_value(leaf)}")
    mpath = os.path.join(dirpath, "manifest")
    with open(mpath, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")
    return mpath


class Dump:
    """A manifest read back: entries {key: entry} in file order, meta, and
    (read_manifest(boxes=True)) the tensor boxes."""

    def __init__(self):
        self.entries = {}
        self.meta = {}
        self.nchunks = {}
        self.boxes = []


def read_manifest(dirpath, boxes=False):
    """Reads dirpath/manifest as dumpall writes it. Tensor entries are
    {"path", "tensor"}, value entries {"path", "value"}. boxes=True (what
    loadinto writes): tensor lines may be any box, several per key; each goes
    to d.boxes as {"key", "path", "shape", "offsets", "sizes", "tensor"}
    (the box's elements) instead of d.entries."""
    d = Dump()
    with open(os.path.join(dirpath, "manifest"), encoding="ascii") as f:
        lines = f.read().split("\n")
    header = False
    for ln in lines:
        if not ln.strip() or ln.lstrip().startswith("#"):
            continue
        p = _Parser(ln)
        tag = p.word()
        if not header:
            assert tag == "dcp-manifest" and p.word() == "1", ln
            header = True
            continue
        if tag == "meta":
            name = p.word()
            v = p.value()
            if name == "nchunks":
                d.nchunks[v[0]] = v[1]
            else:
                d.meta[name] = v
            continue
        path = p.value()
        key = ".".join(map(str, path))
        if key in d.entries:
            raise ValueError(f"key {key!r} twice in the dumped manifest")
        if tag == "tensor":
            dt = dtype_from_name(p.word())
            shape, offs, sizes = p.dims(), p.dims(), p.dims()
            p.ws()
            assert p.s[p.i] == "s"
            p.i += 1
            fname = p.quoted().decode()
            with open(os.path.join(dirpath, fname), "rb") as f:
                data = f.read()
            if boxes:
                d.boxes.append({"key": key, "path": path, "shape": shape,
                                "offsets": offs, "sizes": sizes,
                                "tensor": tensor_from_bytes(data, dt, sizes)})
                assert p.eof(), ln
                continue
            assert offs == [0] * len(shape) and sizes == shape, ln
            d.entries[key] = {"path": path,
                              "tensor": tensor_from_bytes(data, dt, shape)}
        elif tag == "value":
            d.entries[key] = {"path": path, "value": p.value()}
        else:
            raise ValueError(f"unknown record {tag!r}")
        assert p.eof(), ln
    assert header, "no manifest header"
    return d


def compare_dump(state, dump, check):
    """Checks that dump (read_manifest) holds exactly state's flattened
    entries: same keys, same paths, tensors and values bit-exact."""
    flat_sd, mapping = flatten(state)
    check.eq(sorted(dump.entries), sorted(flat_sd), "dumped keys")
    for key, leaf in flat_sd.items():
        e = dump.entries.get(key)
        if e is None:
            continue
        check.eq(e["path"], tuple(mapping[key]), f"planner_data path of {key}")
        if isinstance(leaf, torch.Tensor):
            check.true("tensor" in e, f"{key} dumped as a tensor")
            if "tensor" in e:
                check.none(tensors_identical(leaf, e["tensor"]), f"tensor {key}")
        else:
            check.true("value" in e, f"{key} dumped as a value")
            if "value" in e:
                check.none(values_identical(leaf, e["value"], key),
                           f"value {key}")


# ------------------------------------------------------------ the program

def prog(name="interop_state"):
    path = os.environ.get(f"DCP_PROG_{name}")
    if not path:
        bindir = os.environ.get("DCP_BIN_DIR")
        if bindir and os.path.exists(os.path.join(bindir, name)):
            return os.path.join(bindir, name)
        raise RuntimeError(
            f"DCP_PROG_{name} is not set (run through ctest, or export it)")
    return path


def run(*args, expect_ok=True):
    """Runs interop_state with args; raises with its stderr on failure."""
    cmd = [prog()] + [str(a) for a in args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if expect_ok and r.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")
    return r


def dcp_save_manifest(state, ckpt_dir, work_dir, boxes=None, mode="savefrom"):
    mdir = os.path.join(work_dir, "manifest_in")
    shutil.rmtree(mdir, ignore_errors=True)
    mpath = write_manifest(state, mdir, boxes=boxes)
    run(mode, mpath, ckpt_dir)


def dcp_dumpall(ckpt_dir, work_dir, name="dump"):
    out = os.path.join(work_dir, name)
    shutil.rmtree(out, ignore_errors=True)
    run("dumpall", ckpt_dir, out)
    return read_manifest(out)


def dcp_box(ckpt_dir, key, offsets, sizes, work_dir, mode="loadbox"):
    out = os.path.join(work_dir, f"{mode}.bin")
    csv = lambda xs: ",".join(map(str, xs)) if len(xs) else "-"
    run(mode, ckpt_dir, key, csv(offsets), csv(sizes), out)
    with open(out, "rb") as f:
        return f.read()


def mpiexec(np, *args, tmp, timeout=120, program="interop_state_mpi"):
    """Runs program (interop_state_mpi) ARGS on np ranks under mpiexec (DCP_MPIEXEC,
    as CMake found it; mpiexec --oversubscribe from PATH otherwise) and
    returns the CompletedProcess. Open MPI's session directory goes under
    tmp, so concurrent tests do not share one."""
    launcher = os.environ.get("DCP_MPIEXEC")
    if launcher:
        cmd = shlex.split(launcher)
    else:
        found = shutil.which("mpiexec")
        if not found:
            raise RuntimeError("no DCP_MPIEXEC and no mpiexec in PATH")
        cmd = [found, "--oversubscribe"]
    cmd += [os.environ.get("DCP_MPIEXEC_NUMPROC_FLAG") or "-n", str(np),
            prog(program)] + [str(a) for a in args]
    env = dict(os.environ)
    for k in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
              "OMPI_MCA_rmaps_base_oversubscribe"):
        env.setdefault(k, "1")
    env["OMPI_MCA_orte_tmpdir_base"] = os.path.join(tmp, "ompi")
    os.makedirs(env["OMPI_MCA_orte_tmpdir_base"], exist_ok=True)
    return subprocess.run(cmd, capture_output=True, text=True,
                          timeout=timeout, env=env)


# ---------------------------------------------------- torch.distributed

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slice_of(t, offs, sizes):
    """The box of t at offsets offs with sizes sizes (a view)."""
    for d, (o, n) in enumerate(zip(offs, sizes)):
        t = t.narrow(d, o, n)
    return t


def local_box(full_shape, mesh, placements):
    """(offsets, sizes) of this rank's DTensor shard."""
    from torch.distributed.tensor._utils import (
        compute_local_shape_and_global_offset)
    sizes, offs = compute_local_shape_and_global_offset(
        full_shape, mesh, placements)
    return tuple(offs), tuple(sizes)


def dtensor_from_full(full, mesh, placements):
    """full as a DTensor, each rank holding its own slice (built locally
    with from_local: gloo cannot scatter every dtype)."""
    from torch.distributed.tensor import DTensor
    offs, sizes = local_box(full.shape, mesh, placements)
    local = slice_of(full, offs, sizes).clone()
    return DTensor.from_local(local, mesh, placements, run_check=False,
                              shape=full.shape, stride=full.stride())


def _rank_main(rank, world, port, fn, args, result_dir):
    import datetime
    import torch.distributed as dist
    msg = "ok"
    try:
        # Forked from a parent that imported torch: no OpenMP pool here.
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
            world_size=world, timeout=datetime.timedelta(seconds=60))
        fn(rank, world, *args)
        dist.barrier()
    except Exception:
        msg = traceback.format_exc()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        with open(os.path.join(result_dir, f"rank{rank}.txt"), "w") as f:
            f.write(msg)


def run_ranks(check, world, fn, args, tmp):
    """Runs fn(rank, world, *args) on world local processes in a gloo
    process group at tcp://127.0.0.1:<free port>, loopback only. Each rank's
    outcome ("ok" or its traceback) is one check. The processes are forked,
    not spawned: a spawned child imports torch again, 3 s of CPU each, which
    made 4 ranks take half a minute on 2 busy cores; the parent has run no
    intra-op parallel work (small tensors only) and no process group."""
    import torch.multiprocessing as mp
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result_dir = os.path.join(tmp, f"results{world}-{fn.__name__}")
    os.makedirs(result_dir, exist_ok=True)
    try:
        mp.start_processes(_rank_main,
                           args=(world, free_port(), fn, args, result_dir),
                           nprocs=world, join=True, start_method="fork")
    except Exception as exc:
        check.true(False, f"spawned ranks failed: {exc}")
    for r in range(world):
        p = os.path.join(result_dir, f"rank{r}.txt")
        text = open(p).read() if os.path.exists(p) else "no result file"
        check.eq(text, "ok", f"{fn.__name__}: rank {r} of {world}")


# -------------------------------------------------------------- the runner

class Check:
    """Assertions that count instead of stopping at the first failure."""

    def __init__(self):
        self.passed = 0
        self.failed = 0

    def _rec(self, ok, msg):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            print(f"  FAIL: {msg}", flush=True)
        return ok

    def true(self, cond, msg):
        return self._rec(bool(cond), msg)

    def eq(self, got, want, msg):
        return self._rec(got == want, f"{msg}: got {got!r}, expected {want!r}")

    def none(self, diff, msg):
        return self._rec(diff is None, f"{msg}: {diff}")


class Runner:
    """Runs test functions f(check, tmpdir); prints "N passed, M failed"."""

    def __init__(self, name):
        self.name = name
        self.tests = []

    def test(self, fn):
        self.tests.append(fn)
        return fn

    def main(self):
        only = sys.argv[1:]
        npass = nfail = 0
        keep = os.environ.get("DCP_KEEP_TMP")
        for fn in self.tests:
            if only and fn.__name__ not in only:
                continue
            tmp = tempfile.mkdtemp(prefix=f"dcp-{fn.__name__}-")
            check = Check()
            ok = True
            try:
                fn(check, tmp)
            except Exception:
                ok = False
                print(f"  EXCEPTION in {fn.__name__}:", flush=True)
                traceback.print_exc(file=sys.stdout)
            if check.failed or not ok:
                nfail += 1
                print(f"FAIL {fn.__name__} ({check.passed} checks passed, "
                      f"{check.failed} failed)", flush=True)
            else:
                npass += 1
                print(f"ok   {fn.__name__} ({check.passed} checks)", flush=True)
            if keep:
                print(f"     (kept {tmp})")
            else:
                shutil.rmtree(tmp, ignore_errors=True)
        print(f"{npass} passed, {nfail} failed")
        sys.exit(1 if nfail or npass == 0 else 0)


# ------------------------------------------------------------ common state

SHAPES = [(), (7,), (3, 5), (2, 3, 4), (2, 1, 3, 2), (1, 2, 2, 1, 3),
          (2, 1, 1, 2, 1, 2), (1, 2, 1, 2, 1, 1, 2), (2, 1, 2, 1, 2, 1, 2, 1),
          (0,), (3, 0, 2)]


def _nan_with_payload(bits):
    """The float whose IEEE-754 bits are bits (NaN payloads kept)."""
    return struct.unpack(">d", struct.pack(">Q", bits))[0]


def value_samples():
    """Non-tensor leaves of every kind dcp supports."""
    return {
        "int": 7,
        "zero": 0,
        "neg": -42,
        "big": 2 ** 62 + 12345,
        "int64_max": 2 ** 63 - 1,
        "int64_min": -(2 ** 63),
        "int32_edge": 2 ** 31,
        "float": 3.14159,
        "neg_zero": -0.0,
        "tiny": 5e-324,
        "nan": float("nan"),
        "nan_payload": _nan_with_payload(0x7FF8000000000123),
        "snan": _nan_with_payload(0x7FF0000000000001),
        "neg_nan": _nan_with_payload(0xFFF8000000000000),
        "inf": math.inf,
        "ninf": -math.inf,
        "true": True,
        "false": False,
        "str": "héllo wörld ✓ 🚀 \"quoted\" \\ back\nslash",
        "empty_str": "",
        "nul_str": "a\x00b",
        "bytes": bytes(range(256)),
        "empty_bytes": b"",
        "none": None,
        "list": [1, 2.5, "x", None, True, b"\x01"],
        "empty_list": [],
        "tuple": (1, "a", (2, 3.0), None),
        "empty_tuple": (),
        "nested_lists": [[1, 2], [3, [4, 5]], [], [[]]],
        "tuple_with_dict": ("x", {"k": 1, "j": [1, 2], "n": None}),
    }


def full_state(seed=1234):
    """A nested state covering every dtype, 0-d to 8-d, empty and
    non-contiguous tensors, and values of every kind."""
    rng = random.Random(seed)
    model = {}
    for dt in DTYPES:
        n = dtype_name(dt)
        for shape in SHAPES:
            sname = "x".join(map(str, shape)) if shape else "scalar"
            model[f"{n}.{sname}"] = random_tensor(dt, shape, rng)
        # Non-contiguous: a transpose (torch keeps its strides on save).
        model[f"{n}.transposed"] = random_tensor(dt, (4, 3), rng).t()
        # A permuted 3-d tensor.
        model[f"{n}.permuted"] = random_tensor(dt, (2, 3, 4), rng).permute(2, 0, 1)
    f32 = torch.float32
    model["layout.channels_last"] = random_tensor(f32, (2, 3, 4, 5), rng) \
        .contiguous(memory_format=torch.channels_last)
    model["layout.strided_slice"] = random_tensor(f32, (4, 6), rng)[:, ::2]
    model["layout.narrow_view"] = random_tensor(f32, (6, 5), rng).narrow(0, 2, 3)
    model["layout.expanded"] = random_tensor(f32, (1, 4), rng).expand(3, 4)
    optim = {
        "state": {
            "fc.weight": {"step": torch.tensor(3.0),
                          "exp_avg": random_tensor(f32, (4, 3), rng),
                          "exp_avg_sq": random_tensor(f32, (4, 3), rng)},
        },
        "param_groups": [
            {"lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-8,
             "weight_decay": 0.01, "amsgrad": False, "foreach": None,
             "params": ["fc.weight"]},
        ],
    }
    return {"model": model, "optim": optim, "extra": value_samples(),
            "top_level_int": 5, "top_tensor": random_tensor(f32, (2, 2), rng)}


def list_state(seed=99):
    """Leaves whose flatten path ends in a list index: a list of tensors and
    a list mixing a tensor and values (PyTorch expands such lists)."""
    rng = random.Random(seed)
    return {
        "buffers": [random_tensor(torch.float32, (3,), rng),
                    random_tensor(torch.int64, (2, 2), rng)],
        "mixed": [random_tensor(torch.bfloat16, (2,), rng), 5, "s", [1, 2]],
        "nested": [[random_tensor(torch.int8, (4,), rng)], {"a": 1.5}],
    }


def zeros_template(state, keep_tensors=False):
    """Same nesting as state: tensors zeroed (contiguous), values None.
    keep_tensors: the tensors (DTensors too) are kept as they are."""
    flat_sd, mapping = flatten(state)
    from torch.distributed.checkpoint._nested_dict import unflatten_state_dict
    tmpl = {}
    for k, v in flat_sd.items():
        if isinstance(v, torch.Tensor):
            tmpl[k] = v if keep_tensors else torch.zeros(v.shape,
                                                         dtype=v.dtype)
        else:
            tmpl[k] = None
    return unflatten_state_dict(tmpl, mapping)
