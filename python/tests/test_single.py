"""dcp_torch in one process: torch's save/load with the drop-in classes in
every writer/reader combination (bit-exact), the metadata without pickle,
hostile metadata, bad input, the utilities."""

from __future__ import annotations

import io
import os
import pickle
import warnings

import pytest
import torch
import torch.distributed.checkpoint as tdcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.stateful import Stateful

import dcp_torch
from dcp_torch import _C

warnings.filterwarnings("ignore")

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
          torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64,
          torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16,
          torch.uint32, torch.uint64]


def rand(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size(),),
                        generator=g, dtype=torch.uint8)
    if dtype == torch.bool:
        return (raw % 2).bool().reshape(shape)
    return raw.view(dtype).reshape(shape)


class Counter(Stateful):
    def __init__(self, n=0):
        self.n = n
        self.w = torch.zeros(3)

    def state_dict(self):
        return {"n": self.n, "w": self.w}

    def load_state_dict(self, sd):
        self.n = sd["n"]
        self.w = sd["w"]


def make_state(seed=0):
    sd = {f"t_{str(dt)[6:]}": rand((5, 7), dt, seed + i) for i, dt in enumerate(DTYPES)}
    sd["noncontig"] = rand((6, 4), torch.float32, seed + 99).t()          # strided view
    sd["sliced"] = rand((10, 10), torch.float32, seed + 98)[2:7, 1::3]
    sd["scalar"] = torch.tensor(3.5)
    sd["empty"] = torch.empty(0, 4)
    sd["nested"] = {"a": {"b": rand((3,), torch.float32, seed + 7)}, "lst": [rand((2,), torch.int64, seed + 8), 4]}
    sd["values"] = {"i": 7 + seed, "f": 0.25, "s": "text", "none": None, "b": True,
                    "l": [1, 2.5, "x"], "t": (1, 2), "d": {"k": [3]}}
    sd["state"] = Counter(seed)
    sd["state"].w = rand((3,), torch.float32, seed + 9)
    return sd


def zeros_like_state(sd):
    def z(v):
        if isinstance(v, torch.Tensor):
            return torch.zeros_like(v.contiguous()) if v.dtype != torch.bool else torch.zeros(v.shape, dtype=torch.bool)
        if isinstance(v, dict):
            return {k: z(x) for k, x in v.items()}
        if isinstance(v, list):
            return [z(x) for x in v]
        if isinstance(v, Counter):
            c = Counter(-1)
            c.w = torch.zeros(3)
            return c
        return v
    return z(sd)


def assert_same(a, b, path="root"):
    if isinstance(a, Counter):
        assert isinstance(b, Counter) and a.n == b.n, path
        assert_same(a.w, b.w, path + ".w")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert a.dtype == b.dtype and a.shape == b.shape, path
        # bit-exact, NaNs included
        assert a.contiguous().reshape(-1).view(torch.uint8).equal(b.contiguous().reshape(-1).view(torch.uint8)), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


WRITERS = {"torch": lambda p: tdcp.FileSystemWriter(p), "dcp": lambda p: dcp_torch.FileSystemWriter(p)}
READERS = {"torch": lambda p: tdcp.FileSystemReader(p), "dcp": lambda p: dcp_torch.FileSystemReader(p)}


@pytest.mark.parametrize("writer", ["torch", "dcp"])
@pytest.mark.parametrize("reader", ["torch", "dcp"])
def test_roundtrip_every_combination(ckpt, writer, reader):
    sd = make_state(1)
    tdcp.save(sd, storage_writer=WRITERS[writer](ckpt), no_dist=True)
    out = zeros_like_state(make_state(1))
    tdcp.load(out, storage_reader=READERS[reader](ckpt), no_dist=True)
    # torch's load of values replaces them; the Stateful got its state back
    assert_same(make_state(1), out)
    if writer == "dcp":
        dcp_torch.verify(ckpt)


def test_metadata_equals_torch_pickle(ckpt):
    tdcp.save(make_state(2), storage_writer=dcp_torch.FileSystemWriter(ckpt), no_dist=True)
    with open(os.path.join(ckpt, ".metadata"), "rb") as f:
        ref = pickle.load(f)
    md = dcp_torch.read_metadata(ckpt)
    assert md.state_dict_metadata == ref.state_dict_metadata
    assert md.planner_data == ref.planner_data
    assert md.storage_data == ref.storage_data
    assert md.version == ref.version
    assert md.storage_meta.save_id == ref.storage_meta.save_id
    # and for a checkpoint torch wrote
    d2 = ckpt + "_torch"
    tdcp.save(make_state(2), storage_writer=tdcp.FileSystemWriter(d2), no_dist=True)
    with open(os.path.join(d2, ".metadata"), "rb") as f:
        ref = pickle.load(f)
    md = dcp_torch.read_metadata(d2)
    assert md.state_dict_metadata == ref.state_dict_metadata
    assert md.planner_data == ref.planner_data
    assert md.storage_data == ref.storage_data


def test_overwrite_fresh_names_old_removed(ckpt):
    tdcp.save(make_state(3), storage_writer=dcp_torch.FileSystemWriter(ckpt), no_dist=True)
    first = set(os.listdir(ckpt))
    assert first == {".metadata", "__0_0.distcp"}
    w = dcp_torch.FileSystemWriter(ckpt)
    tdcp.save(make_state(4), storage_writer=w, no_dist=True)
    second = set(os.listdir(ckpt))
    assert ".metadata" in second and "__0_0.distcp" not in second and len(second) == 2
    # the same writer reused for a third save
    tdcp.save(make_state(5), storage_writer=w, no_dist=True)
    out = zeros_like_state(make_state(5))
    tdcp.load(out, storage_reader=tdcp.FileSystemReader(ckpt), no_dist=True)
    assert_same(make_state(5), out)
    assert len(os.listdir(ckpt)) == 2


def test_overwrite_false_refused_previous_kept(ckpt):
    tdcp.save(make_state(6), storage_writer=dcp_torch.FileSystemWriter(ckpt), no_dist=True)
    with pytest.raises(CheckpointException) as ei:
        tdcp.save(make_state(7), storage_writer=dcp_torch.FileSystemWriter(ckpt, overwrite=False),
                  no_dist=True)
    assert "already exists" in str(ei.value)
    out = zeros_like_state(make_state(6))
    tdcp.load(out, storage_reader=dcp_torch.FileSystemReader(ckpt), no_dist=True)
    assert_same(make_state(6), out)


def test_path_is_a_file(tmp_path):
    p = tmp_path / "file"
    p.write_bytes(b"x")
    with pytest.raises(CheckpointException) as ei:
        tdcp.save({"a": torch.ones(2)}, storage_writer=dcp_torch.FileSystemWriter(str(p)), no_dist=True)
    assert "is a file" in str(ei.value)
    assert p.read_bytes() == b"x"


def test_unsupported_tensor_named_nothing_committed(ckpt):
    tdcp.save(make_state(8), storage_writer=dcp_torch.FileSystemWriter(ckpt), no_dist=True)
    before = open(os.path.join(ckpt, ".metadata"), "rb").read()
    bad = {"ok": torch.ones(3), "sparse_w": torch.eye(3).to_sparse()}
    with pytest.raises(CheckpointException) as ei:
        tdcp.save(bad, storage_writer=dcp_torch.FileSystemWriter(ckpt), no_dist=True)
    assert "sparse_w" in str(ei.value)
    assert open(os.path.join(ckpt, ".metadata"), "rb").read() == before
    out = zeros_like_state(make_state(8))
    tdcp.load(out, storage_reader=dcp_torch.FileSystemReader(ckpt), no_dist=True)
    assert_same(make_state(8), out)


def test_second_writer_busy(ckpt):
    tdcp.save(make_state(9), storage_writer=dcp_torch.FileSystemWriter(ckpt), no_dist=True)
    holder = _C.Context().part_save_begin(ckpt, 0)  # another writer holds the lock
    try:
        with pytest.raises(CheckpointException) as ei:
            tdcp.save(make_state(10), storage_writer=dcp_torch.FileSystemWriter(ckpt), no_dist=True)
        assert "DCP_EBUSY" in str(ei.value)
    finally:
        holder.close()
    out = zeros_like_state(make_state(9))
    tdcp.load(out, storage_reader=dcp_torch.FileSystemReader(ckpt), no_dist=True)
    assert_same(make_state(9), out)
    # the lock released: the next save works
    tdcp.save(make_state(11), storage_writer=dcp_torch.FileSystemWriter(ckpt), no_dist=True)


def test_exception_mid_save_no_commit_next_save_works(ckpt):
    tdcp.save(make_state(12), storage_writer=dcp_torch.FileSystemWriter(ckpt), no_dist=True)
    before = open(os.path.join(ckpt, ".metadata"), "rb").read()

    class Boom(Stateful):
        def state_dict(self):
            raise KeyboardInterrupt("interrupted")

        def load_state_dict(self, sd):
            pass

    w = dcp_torch.FileSystemWriter(ckpt)

    class Planner(tdcp.DefaultSavePlanner):
        def resolve_data(self, item):
            if item.index.fqn == "t_int8":
                raise RuntimeError("planner failed mid-write")
            return super().resolve_data(item)

    with pytest.raises(CheckpointException):
        tdcp.save(make_state(13), storage_writer=w, planner=Planner(), no_dist=True)
    assert open(os.path.join(ckpt, ".metadata"), "rb").read() == before
    with pytest.raises(BaseException):
        tdcp.save({"x": Boom()}, storage_writer=w, no_dist=True)
    assert open(os.path.join(ckpt, ".metadata"), "rb").read() == before
    tdcp.save(make_state(14), storage_writer=w, no_dist=True)
    out = zeros_like_state(make_state(14))
    tdcp.load(out, storage_reader=dcp_torch.FileSystemReader(ckpt), no_dist=True)
    assert_same(make_state(14), out)
    assert len(os.listdir(ckpt)) == 2  # leftovers removed by the next save


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _hostile_set(tmp_path):
    marker = str(tmp_path / "PWNED")
    good = io.BytesIO()
    tdcp.save({"a": torch.ones(2)}, storage_writer=tdcp.FileSystemWriter(str(tmp_path / "g")),
              no_dist=True)
    real = open(tmp_path / "g" / ".metadata", "rb").read()
    evil_md = pickle.loads(real)
    evil_md.planner_data = {"a": _Evil(marker)}
    return marker, {
        "garbage": (b"\x00\x01not a pickle at all" * 10, (dcp_torch.FormatError, dcp_torch.UnsafeError)),
        "os_system": (pickle.dumps(_Evil(marker)), dcp_torch.UnsafeError),
        "os_system_proto0": (b"cos\nsystem\n(S'touch " + marker.encode() + b"'\ntR.", dcp_torch.UnsafeError),
        "evil_inside_metadata": (pickle.dumps(evil_md), dcp_torch.UnsafeError),
        "truncated": (real[: len(real) // 2], dcp_torch.FormatError),
        "empty": (b"", (dcp_torch.FormatError, dcp_torch.CheckpointError)),
        "deep": (b"(" * 100000 + b".", (dcp_torch.FormatError, dcp_torch.LimitError)),
        "not_metadata": (pickle.dumps({"a": 1}), dcp_torch.FormatError),
    }


def test_hostile_metadata_refused_nothing_runs(tmp_path):
    marker, cases = _hostile_set(tmp_path)
    for name, (blob, exc) in cases.items():
        d = tmp_path / name
        d.mkdir()
        (d / ".metadata").write_bytes(blob)
        with pytest.raises(exc) as ei:
            dcp_torch.read_metadata(str(d))
        assert isinstance(ei.value, dcp_torch.CheckpointError), name
        assert ei.value.code < 0 and ei.value.message, name
        # through torch's load with the drop-in reader: refused too
        with pytest.raises(CheckpointException) as ei:
            tdcp.load({"a": torch.zeros(2)}, storage_reader=dcp_torch.FileSystemReader(str(d)),
                      no_dist=True)
        assert "DCP_E" in str(ei.value), name
        assert not os.path.exists(marker), f"{name}: the pickle ran"


def test_values_refused_unless_allowed(ckpt):
    class Opaque:  # a class dcp's decoder does not admit
        pass
    import datetime
    sd = {"w": torch.ones(2), "od": datetime.timedelta(seconds=5)}
    tdcp.save(sd, storage_writer=tdcp.FileSystemWriter(ckpt), no_dist=True)
    with pytest.raises(CheckpointException) as ei:
        tdcp.load({"w": torch.zeros(2), "od": None}, storage_reader=dcp_torch.FileSystemReader(ckpt),
                  no_dist=True)
    assert "allow_pickle" in str(ei.value) and "od" in str(ei.value)
    out = {"w": torch.zeros(2), "od": None}
    tdcp.load(out, storage_reader=dcp_torch.FileSystemReader(ckpt, allow_pickle=True), no_dist=True)
    assert out["od"] == datetime.timedelta(seconds=5)


def test_corrupt_data_detected(ckpt):
    tdcp.save({"w": torch.arange(100000, dtype=torch.float32)},
              storage_writer=dcp_torch.FileSystemWriter(ckpt), no_dist=True)
    f = os.path.join(ckpt, "__0_0.distcp")
    data = bytearray(open(f, "rb").read())
    data[8192 + 100] ^= 0xFF  # inside the tensor bytes (aligned at 4096)
    open(f, "wb").write(bytes(data))
    with pytest.raises(dcp_torch.CorruptError):
        dcp_torch.verify(ckpt)
    with pytest.raises(CheckpointException) as ei:
        tdcp.load({"w": torch.zeros(100000)}, storage_reader=dcp_torch.FileSystemReader(ckpt),
                  no_dist=True)
    assert "DCP_ECORRUPT" in str(ei.value)


def test_options_refused_or_honoured(ckpt):
    from torch.distributed.checkpoint.filesystem import SerializationFormat
    # what dcp does not write: torch's own writer (a warning says so)
    with pytest.warns(UserWarning, match="torch's FileSystemWriter"):
        w = dcp_torch.FileSystemWriter(ckpt, serialization_format=SerializationFormat.SAFETENSORS)
    assert type(w) is tdcp.FileSystemWriter
    with pytest.warns(UserWarning, match="torch's FileSystemWriter"):
        w = dcp_torch.FileSystemWriter(ckpt, True, True, 1, 10_000_000, False, True, [object()])
    assert type(w) is tdcp.FileSystemWriter
    assert type(dcp_torch.FileSystemWriter(ckpt, _extensions=[])) is dcp_torch.FileSystemWriter
    # thread_count splits into files; single_file_per_rank=False one per item
    sd = {f"k{i}": torch.full((1000,), float(i)) for i in range(6)}
    tdcp.save(sd, storage_writer=dcp_torch.FileSystemWriter(ckpt, thread_count=3, sync_files=False,
                                                            direct=False), no_dist=True)
    assert len([n for n in os.listdir(ckpt) if n.endswith(".distcp")]) == 3
    d2 = ckpt + "_items"
    tdcp.save(sd, storage_writer=dcp_torch.FileSystemWriter(d2, single_file_per_rank=False), no_dist=True)
    assert len([n for n in os.listdir(d2) if n.endswith(".distcp")]) == 6
    for d in (ckpt, d2):
        out = {k: torch.zeros(1000) for k in sd}
        tdcp.load(out, storage_reader=tdcp.FileSystemReader(d), no_dist=True)
        assert_same(sd, out)
    # a writer is picklable (async_save's process executor)
    w = pickle.loads(pickle.dumps(dcp_torch.FileSystemWriter(ckpt, io_depth=4)))
    assert w.path == ckpt


def test_async_save_drop_in(ckpt):
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    from conftest import free_port
    os.environ["MASTER_PORT"] = str(free_port())
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        sd = make_state(20)
        fut = tdcp.async_save(sd, storage_writer=dcp_torch.FileSystemWriter(ckpt))
        fut.result()
        out = zeros_like_state(make_state(20))
        tdcp.load(out, storage_reader=dcp_torch.FileSystemReader(ckpt))
        assert_same(make_state(20), out)
    finally:
        dist.destroy_process_group()


def test_utilities(ckpt, tmp_path):
    sd = {"model": {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.ones(4)},
          "step": 3}
    tdcp.save(sd, storage_writer=dcp_torch.FileSystemWriter(ckpt), no_dist=True)
    rows = {r["key"]: r for r in dcp_torch.ls(ckpt)}
    assert rows["model.w"]["dtype"] == torch.float32 and rows["model.w"]["shape"] == (3, 4)
    assert rows["step"]["kind"] == "value"
    f = str(tmp_path / "one.pt")
    res = dcp_torch.dcp_to_torch_save(ckpt, f)
    assert res["tensors"] == 2
    loaded = torch.load(f, weights_only=True)
    assert torch.equal(loaded["model"]["w"], sd["model"]["w"]) and loaded["step"] == 3
    d2 = str(tmp_path / "back")
    dcp_torch.torch_save_to_dcp(f, d2)
    out = {"model": {"w": torch.zeros(3, 4), "b": torch.zeros(4)}, "step": 0}
    tdcp.load(out, storage_reader=dcp_torch.FileSystemReader(d2), no_dist=True)
    assert torch.equal(out["model"]["w"], sd["model"]["w"]) and out["step"] == 3
    st = str(tmp_path / "m.safetensors")
    dcp_torch.export_safetensors(ckpt, st)
    d3 = str(tmp_path / "fromst")
    dcp_torch.import_safetensors(st, d3)
    assert {r["key"] for r in dcp_torch.ls(d3)} == {"model.w", "model.b"}
    # clean: a leftover data file removed, the checkpoint kept
    open(os.path.join(ckpt, "__7_0.distcp"), "wb").write(b"junk")
    files, _ = dcp_torch.clean(ckpt)
    assert files == 1 and not os.path.exists(os.path.join(ckpt, "__7_0.distcp"))
    dcp_torch.verify(ckpt)
    with pytest.raises(dcp_torch.NotFoundError):
        dcp_torch.verify(str(tmp_path / "missing"))


def test_values_torch_stores(ckpt):
    """Values torch's planner stores that dcp's value decoder does not hold
    (a BytesIO, a set, torch.Size, a dtype, a tensor inside a tuple): read
    through torch's weights_only loader, nothing executed."""
    sd = {"w": torch.ones(2), "losses": io.BytesIO(b"\x00\x01loss-log"), "s": {1, 2},
          "size": torch.Size([3, 4]), "dt": torch.float16, "tt": (torch.arange(3), 2)}
    tdcp.save(sd, storage_writer=dcp_torch.FileSystemWriter(ckpt), no_dist=True)
    out = {"w": torch.zeros(2), "losses": None, "s": None, "size": None, "dt": None, "tt": None}
    tdcp.load(out, storage_reader=dcp_torch.FileSystemReader(ckpt), no_dist=True)
    assert out["losses"].getvalue() == b"\x00\x01loss-log"
    assert out["s"] == {1, 2} and out["size"] == torch.Size([3, 4]) and out["dt"] == torch.float16
    assert torch.equal(out["tt"][0], torch.arange(3)) and out["tt"][1] == 2


def test_checkpoint_id_detection_and_save_id(ckpt):
    from torch.distributed.checkpoint.metadata import StorageMeta
    assert not dcp_torch.FileSystemWriter.validate_checkpoint_id("abc://abc.abc")
    assert not dcp_torch.FileSystemReader.validate_checkpoint_id("abc://abc.abc")
    assert dcp_torch.FileSystemWriter.validate_checkpoint_id("s3://bucket/prefix")
    assert dcp_torch.FileSystemWriter.validate_checkpoint_id(ckpt)
    w = dcp_torch.FileSystemWriter(ckpt)
    tdcp.save({"a": torch.ones(1)}, storage_writer=w, no_dist=True)
    md = dcp_torch.read_metadata(ckpt)
    assert md.storage_meta.save_id == w.save_id == w.storage_meta().save_id


def test_exit_grace_sees_gloo_workers(tmp_path):
    """The exit grace (dcp_torch/_exit.py) waits only while gloo's workers
    live: none before a process group, some while one lives, none after
    destroy_process_group; and the process exits cleanly with one alive."""
    import subprocess
    import sys
    prog = tmp_path / "p.py"
    prog.write_text(
        "import os, torch, torch.distributed as dist\n"
        "from dcp_torch import _exit\n"
        "os.environ['MASTER_ADDR'] = '127.0.0.1'; os.environ['MASTER_PORT'] = os.environ['PORT']\n"
        "print(_exit.gloo_workers())\n"
        "dist.init_process_group('gloo', rank=0, world_size=1)\n"
        "dist.all_reduce(torch.ones(1))\n"
        "print(_exit.gloo_workers())\n"
        "pg = dist.group.WORLD\n"
        "dist.destroy_process_group()\n"
        "del pg\n"
        "print(_exit.gloo_workers())\n"
        "dist.init_process_group('gloo', rank=0, world_size=1, init_method='tcp://127.0.0.1:' + os.environ['PORT2'])\n"
        "dist.all_gather(list(torch.empty(2).chunk(1)), torch.ones(2))\n"
        "keep = dist.group.WORLD\n")
    import socket
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(str(s.getsockname()[1]))
    env = dict(os.environ, PORT=ports[0], PORT2=ports[1])
    out = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    counts = [int(x) for x in out.stdout.split()]
    assert counts[0] == 0 and counts[1] >= 1 and counts[2] == 0, counts


def test_rename_skip_cast_planners(tmp_path):
    """dcp's rename, skip and cast planners as keyword arguments of
    dcp_torch.save/load: keys saved under other names and left out, loaded
    back from the stored names (bit-exact), skipped entries untouched, a
    stored float32 cast into a float64 state only when asked."""
    path = str(tmp_path / "ck")
    w, b, tmp = rand((8, 5), torch.float32, 1), rand((5,), torch.float32, 2), rand((3,), torch.int64, 3)
    sd = {"model": {"w": w, "b": b}, "tmp": tmp, "epoch": 7}
    dcp_torch.save(sd, checkpoint_id=path, no_dist=True,
                   rename={"model.w": "weights"}, skip=lambda k: k == "tmp")
    md = dcp_torch.read_metadata(path)
    assert set(md.state_dict_metadata) == {"weights", "model.b", "epoch"}
    # torch reads the stored names
    got = {"weights": torch.zeros(8, 5), "model.b": torch.zeros(5), "epoch": 0}
    tdcp.load(got, checkpoint_id=path, no_dist=True)
    assert torch.equal(got["weights"], w) and torch.equal(got["model.b"], b) and got["epoch"] == 7
    # loaded back through the rename; a skipped entry is left as it is
    out = {"model": {"w": torch.zeros(8, 5), "b": torch.zeros(5)}, "tmp": torch.full((3,), -1), "epoch": 0}
    dcp_torch.load(out, checkpoint_id=path, no_dist=True, rename=lambda k: "weights" if k == "model.w" else k,
                   skip=["tmp"])
    assert torch.equal(out["model"]["w"], w) and torch.equal(out["model"]["b"], b)
    assert torch.equal(out["tmp"], torch.full((3,), -1)) and out["epoch"] == 7
    # without the rename the stored key is missing
    with pytest.raises(dcp_torch.KeyMismatchError, match="model.w"):
        dcp_torch.load({"model": {"w": torch.zeros(8, 5)}}, checkpoint_id=path, no_dist=True)
    # cast: float32 into float64 (torch's default); refused with cast=False
    wide = {"weights": torch.zeros(8, 5, dtype=torch.float64)}
    with pytest.raises(dcp_torch.CheckpointError, match="weights"):
        dcp_torch.load(wide, checkpoint_id=path, no_dist=True, cast=False)
    assert torch.equal(wide["weights"], torch.zeros(8, 5, dtype=torch.float64))
    dcp_torch.load(wide, checkpoint_id=path, no_dist=True)
    assert torch.equal(wide["weights"], w.double())
    # two keys onto one stored key: refused before anything is written or read
    with pytest.raises(dcp_torch.InvalidArgumentError, match="weights"):
        dcp_torch.save(sd, checkpoint_id=str(tmp_path / "ck2"), no_dist=True,
                       rename={"model.w": "weights", "model.b": "weights"})
    assert not os.path.exists(str(tmp_path / "ck2" / ".metadata"))
    with pytest.raises(dcp_torch.InvalidArgumentError, match="both load 'weights'"):
        dcp_torch.load({"a": torch.zeros(8, 5), "weights": torch.zeros(8, 5)}, checkpoint_id=path,
                       no_dist=True, rename={"a": "weights"})
    with pytest.raises(dcp_torch.InvalidArgumentError, match="not a non-empty str"):
        dcp_torch.save(sd, checkpoint_id=str(tmp_path / "ck3"), no_dist=True, rename=lambda k: None)
    with pytest.raises(dcp_torch.InvalidArgumentError, match="skip"):
        dcp_torch.save(sd, checkpoint_id=str(tmp_path / "ck4"), no_dist=True, skip="tmp")


class _Opaque:
    """A value class no restricted loader admits."""

    def __init__(self, x=1):
        self.x = x


def test_load_values_torch_stores(tmp_path):
    """dcp_torch.load of a checkpoint torch saved with values dcp's value
    decoder does not hold (io.BytesIO, torch.Size, a set, a tensor in a
    tuple): read through torch's weights_only loader, equal to torch's own
    load; a value both refuse: UnsafeError naming it, tensors untouched."""
    path = str(tmp_path / "ck")
    sd = {"w": torch.arange(10.0), "blob": io.BytesIO(b"hello"), "size": torch.Size([2, 3]),
          "set": {1, 2}, "pair": (torch.ones(2), 3), "n": 5}
    tdcp.save(sd, checkpoint_id=path, no_dist=True)
    out = {"w": torch.zeros(10), "blob": None, "size": None, "set": None, "pair": None, "n": 0}
    dcp_torch.load(out, checkpoint_id=path, no_dist=True)
    assert torch.equal(out["w"], sd["w"]) and out["n"] == 5
    assert out["blob"].getvalue() == b"hello" and out["size"] == torch.Size([2, 3])
    assert out["set"] == {1, 2} and torch.equal(out["pair"][0], torch.ones(2)) and out["pair"][1] == 3
    bad = str(tmp_path / "bad")
    tdcp.save({"w": torch.arange(4.0), "obj": _Opaque(3)}, checkpoint_id=bad, no_dist=True)
    out = {"w": torch.zeros(4), "obj": None}
    with pytest.raises(dcp_torch.UnsafeError, match="'obj'"):
        dcp_torch.load(out, checkpoint_id=bad, no_dist=True)
    assert torch.equal(out["w"], torch.zeros(4)) and out["obj"] is None


def test_torch_writer_for_stream_transforms_and_coordinator_rank(tmp_path):
    """torch's zstd stream transform asked of dcp_torch.FileSystemWriter:
    torch's writer writes it (through dcp_torch.save too) and dcp's reader
    loads it; save_state_dict/load_state_dict take torch's coordinator_rank
    (dcp's own path: any rank, the same checkpoint; a torch writer or
    reader: torch's function with it)."""
    from torch.distributed.checkpoint._extension import ZStandard

    sd = {"x": rand((6, 7), torch.float32, 4), "v": {"blob": b"abc", "n": 3}}
    p = str(tmp_path / "z")
    with pytest.warns(UserWarning):
        w = dcp_torch.FileSystemWriter(p, thread_count=2, _extensions=[ZStandard()])
        dcp_torch.save(sd, storage_writer=w, no_dist=True)
    out = {"x": torch.zeros(6, 7), "v": {"blob": b"", "n": 0}}
    dcp_torch.load(out, storage_reader=dcp_torch.FileSystemReader(p), no_dist=True)
    assert torch.equal(out["x"], sd["x"]) and out["v"] == sd["v"]
    p2 = str(tmp_path / "c")
    dcp_torch.save_state_dict(sd, dcp_torch.FileSystemWriter(p2), coordinator_rank=1, no_dist=True)
    out = {"x": torch.zeros(6, 7), "v": {"blob": b"", "n": 0}}
    dcp_torch.load_state_dict(out, dcp_torch.FileSystemReader(p2), coordinator_rank=1, no_dist=True)
    assert torch.equal(out["x"], sd["x"]) and out["v"] == sd["v"]
    p3 = str(tmp_path / "t")
    with pytest.warns(UserWarning, match="torch plans"):
        dcp_torch.save_state_dict(sd, tdcp.FileSystemWriter(p3), coordinator_rank=0, no_dist=True)
    out = {"x": torch.zeros(6, 7), "v": {"blob": b"", "n": 0}}
    with pytest.warns(UserWarning, match="torch plans"):
        dcp_torch.load_state_dict(out, tdcp.FileSystemReader(p3), coordinator_rank=0, no_dist=True)
    assert torch.equal(out["x"], sd["x"]) and out["v"] == sd["v"]
