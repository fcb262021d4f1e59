"""dcp_torch.save / load / async_save (dcp's own planning over
torch.distributed): 1-4 gloo ranks, both directions with torch, N -> M on
1-D and 2-D meshes, replicated loads read once, Stateful objects, a rank
failing in its state_dict, states whose ranks disagree, missing and
hostile checkpoints, async saves overlapping training steps."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as tdcp
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import dcp_torch
from conftest import run_ranks

warnings.filterwarnings("ignore")


def glob_state():
    g = torch.Generator().manual_seed(5)
    return {
        "rows": torch.randn(11, 5, generator=g),
        "cols": torch.randn(3, 9, generator=g).to(torch.bfloat16),
        "grid": torch.randn(10, 6, generator=g),
        "rep": torch.randn(7, generator=g),
        "plain": torch.arange(6, dtype=torch.int32),
        "noncontig": torch.randn(4, 6, generator=g).t(),
    }


class Loop(Stateful):
    def __init__(self, step=0, w=None):
        self.step = step
        self.w = torch.zeros(4) if w is None else w

    def state_dict(self):
        return {"step": self.step, "w": self.w}

    def load_state_dict(self, sd):
        self.step = sd["step"]
        self.w = sd["w"]


def state(world, zero=False):
    g = glob_state()
    if zero:
        g = {k: torch.zeros_like(v) for k, v in g.items()}
    mesh = init_device_mesh("cpu", (world,))
    sd = {
        "rows": distribute_tensor(g["rows"], mesh, [Shard(0)]),
        "cols": distribute_tensor(g["cols"], mesh, [Shard(1)]),
        "rep": distribute_tensor(g["rep"], mesh, [Replicate()]),
        "plain": g["plain"].clone(),
        "noncontig": g["noncontig"],
        "nested": {"a": [g["plain"].clone() + 1, {"b": 0 if zero else 5}], "lr": 0.0 if zero else 0.01},
        "loop": Loop(0, torch.zeros(4)) if zero else Loop(9, torch.arange(4.0)),
    }
    if world % 2 == 0 and world > 2:
        mesh2 = init_device_mesh("cpu", (2, world // 2))
        sd["grid"] = distribute_tensor(g["grid"], mesh2, [Shard(0), Shard(1)])
    else:
        sd["grid"] = distribute_tensor(g["grid"], mesh, [Shard(1)])
    return sd


def check(sd):
    g = glob_state()
    for k in ("rows", "cols", "grid", "rep"):
        assert torch.equal(sd[k].full_tensor(), g[k]), k
    assert torch.equal(sd["plain"], g["plain"])
    assert torch.equal(sd["noncontig"], g["noncontig"])
    assert torch.equal(sd["nested"]["a"][0], g["plain"] + 1)
    assert sd["nested"]["a"][1] == {"b": 5} and sd["nested"]["lr"] == 0.01
    assert sd["loop"].step == 9 and torch.equal(sd["loop"].w, torch.arange(4.0))


def _save(rank, world, path, lib):
    m = dcp_torch if lib == "dcp" else tdcp
    m.save(state(world), checkpoint_id=path)


def _load(rank, world, path, lib):
    m = dcp_torch if lib == "dcp" else tdcp
    sd = state(world, zero=True)
    m.load(sd, checkpoint_id=path)
    check(sd)


@pytest.mark.parametrize("saver,loader,n,m", [
    ("dcp", "dcp", 4, 3), ("dcp", "torch", 3, 2), ("torch", "dcp", 2, 4), ("dcp", "dcp", 1, 2)])
def test_save_load_reshard(tmp_path, saver, loader, n, m):
    path = str(tmp_path / "ck")
    run_ranks(n, _save, path, saver)
    if saver == "dcp":
        dcp_torch.verify(path)
    run_ranks(m, _load, path, loader)


def test_one_process_no_dist(tmp_path):
    path = str(tmp_path / "ck")
    sd = {"w": torch.arange(10.0), "v": {"x": 1}, "loop": Loop(3, torch.ones(4))}
    dcp_torch.save(sd, checkpoint_id=path, no_dist=True)
    out = {"w": torch.zeros(10), "v": {"x": 0}, "loop": Loop()}
    dcp_torch.load(out, checkpoint_id=path, no_dist=True)
    assert torch.equal(out["w"], sd["w"]) and out["v"] == {"x": 1} and out["loop"].step == 3
    out2 = {"w": torch.zeros(10), "v": {"x": 0}, "loop": Loop()}
    tdcp.load(out2, checkpoint_id=path, no_dist=True)
    assert torch.equal(out2["w"], sd["w"]) and out2["loop"].step == 3
    with pytest.raises(dcp_torch.KeyMismatchError) as ei:
        dcp_torch.load({"missing": torch.zeros(2)}, checkpoint_id=path, no_dist=True)
    assert "missing" in str(ei.value)
    with pytest.raises(dcp_torch.NotFoundError):
        dcp_torch.load({"w": torch.zeros(10)}, checkpoint_id=str(tmp_path / "nope"), no_dist=True)
    with pytest.raises(dcp_torch.ShapeMismatchError):
        dcp_torch.load({"w": torch.zeros(11)}, checkpoint_id=path, no_dist=True)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / ".metadata").write_bytes(b"cos\nsystem\n(S'echo pwned'\ntR.")
    with pytest.raises(dcp_torch.UnsafeError):
        dcp_torch.load({"w": torch.zeros(10)}, checkpoint_id=str(bad), no_dist=True)
    with pytest.raises(dcp_torch.InvalidArgumentError):
        dcp_torch.save({1: torch.zeros(1)}, checkpoint_id=path, no_dist=True)
    # values dcp's encoder does not hold are stored as torch stores them:
    # torch plans that save, dcp's drop-in writer writes it (a warning)
    import io
    odd = {"w": torch.arange(4.0), "b": io.BytesIO(b"xyz"), "s": {1, 2}, "big": 1 << 70,
           "size": torch.Size([2, 3])}
    with pytest.warns(UserWarning, match="torch plans this save"):
        dcp_torch.save(odd, checkpoint_id=str(tmp_path / "o"), no_dist=True)
    for loader in (dcp_torch, tdcp):
        got = {"w": torch.zeros(4), "b": None, "s": None, "big": 0, "size": None}
        loader.load(got, checkpoint_id=str(tmp_path / "o"), no_dist=True)
        assert torch.equal(got["w"], odd["w"]) and got["b"].getvalue() == b"xyz"
        assert got["s"] == {1, 2} and got["big"] == 1 << 70 and got["size"] == torch.Size([2, 3])
    with pytest.warns(UserWarning, match="torch plans this save"):
        dcp_torch.async_save(odd, checkpoint_id=str(tmp_path / "oa"), no_dist=True).result()
    got = {"w": torch.zeros(4), "b": None, "s": None, "big": 0, "size": None}
    dcp_torch.load(got, checkpoint_id=str(tmp_path / "oa"), no_dist=True)
    assert got["b"].getvalue() == b"xyz" and got["s"] == {1, 2}
    # with the rename/skip planners (dcp's own) such a value is refused
    with pytest.raises(NotImplementedError):
        dcp_torch.save({"obj": object()}, checkpoint_id=str(tmp_path / "o2"), no_dist=True,
                       skip=["nothing"])


def _fail_one(rank, world, path):
    class Boom(Stateful):
        def state_dict(self):
            if rank == 1:
                raise RuntimeError("rank 1's state_dict failed")
            return {"x": torch.ones(2)}

        def load_state_dict(self, sd):
            pass

    dcp_torch.save({"w": torch.ones(3)}, checkpoint_id=path)
    before = open(os.path.join(path, ".metadata"), "rb").read()
    # a rank whose Stateful raises: every rank raises the same exception,
    # naming the failing rank, nothing written
    with pytest.raises(dcp_torch.CheckpointError) as ei:
        dcp_torch.save({"w": torch.ones(3), "b": Boom()}, checkpoint_id=path)
    assert "rank 1 failed" in str(ei.value) and "state_dict failed" in str(ei.value)
    # a value only torch stores on one rank: every rank takes torch's
    # planning (dcp's writer), the others' state too
    with pytest.warns(UserWarning, match="torch plans this save"):
        dcp_torch.save({"w": torch.ones(3), "o": {1, 2} if rank == 0 else 1},
                       checkpoint_id=path + "_odd")
    got = {"w": torch.zeros(3), "o": None}
    dcp_torch.load(got, checkpoint_id=path + "_odd")
    assert torch.equal(got["w"], torch.ones(3)) and got["o"] in ({1, 2}, 1)
    # with dcp's own planners such a value is refused on every rank alike
    with pytest.raises(dcp_torch.NotSupportedError) as ei:
        dcp_torch.save({"w": torch.ones(3), "o": object() if rank == 0 else 1}, checkpoint_id=path,
                       skip=["nothing"])
    assert "rank 0 failed" in str(ei.value) and "'o'" in str(ei.value)
    # ranks that disagree: a shape differing by rank -> the same error on
    # every rank, naming the key, nothing written
    with pytest.raises(dcp_torch.CheckpointError) as ei:
        dcp_torch.save({"w": torch.ones(3 + rank)}, checkpoint_id=path)
    assert "'w'" in str(ei.value) or "w" in ei.value.message
    codes = [None] * world
    dist.all_gather_object(codes, ei.value.code)
    assert len(set(codes)) == 1, codes
    assert open(os.path.join(path, ".metadata"), "rb").read() == before
    # async_save: the call itself raises on every rank, nothing written
    with pytest.raises(dcp_torch.CheckpointError) as ei:
        dcp_torch.async_save({"w": torch.ones(3), "b": Boom()}, checkpoint_id=path)
    assert "rank 1 failed" in str(ei.value) and "state_dict failed" in str(ei.value)
    assert open(os.path.join(path, ".metadata"), "rb").read() == before
    # load: a rank whose Stateful raises while its template is built:
    # every rank raises the same error, no tensor changed
    w = torch.zeros(3)
    with pytest.raises(dcp_torch.CheckpointError) as ei:
        dcp_torch.load({"w": w, "b": Boom()}, checkpoint_id=path)
    assert "rank 1 failed" in str(ei.value) and "state_dict failed" in str(ei.value)
    assert torch.equal(w, torch.zeros(3))
    # a rank asking for a value dcp's decoder refuses (torch stored an
    # io.BytesIO), the other for none: both load (the fallback is agreed)
    import io
    tdcp.save({"w": torch.ones(3) * 2, "buf": io.BytesIO(b"abc")}, checkpoint_id=path + "_t")
    sd = {"w": torch.zeros(3)}
    if rank == 0:
        sd["buf"] = None
    dcp_torch.load(sd, checkpoint_id=path + "_t")
    assert torch.equal(sd["w"], torch.ones(3) * 2)
    if rank == 0:
        assert sd["buf"].getvalue() == b"abc"


def test_rank_failures(tmp_path):
    run_ranks(2, _fail_one, str(tmp_path / "ck"))


def _async_overlap(rank, world, path):
    sd = state(world)
    futs = []
    for step in range(3):
        sd["loop"].step = 9
        fut = dcp_torch.async_save(sd, checkpoint_id=f"{path}/s{step}")
        # a training step's collectives overlap the background commit
        t = torch.ones(1000)
        for _ in range(5):
            dist.all_reduce(t)
        futs.append(fut)
    for f in futs:  # the checkpoint's Metadata, as torch's future gives
        assert isinstance(f.result(), tdcp.Metadata)
    for step in range(3):
        out = state(world, zero=True)
        dcp_torch.load(out, checkpoint_id=f"{path}/s{step}")
        check(out)
    # an error in the background reaches future.result()
    bad = f"{path}/file"
    if rank == 0:
        open(bad, "w").write("x")
    dist.barrier()
    with pytest.raises(BaseException):
        dcp_torch.async_save(sd, checkpoint_id=bad).result()


def test_async_overlapping_training(tmp_path):
    run_ranks(2, _async_overlap, str(tmp_path / "ck"))


def _replicated_read_once(rank, world, path):
    g = torch.Generator().manual_seed(1)
    big = torch.randn(256, 1024, generator=g)
    if world == 2:
        dcp_torch.save({"big": big}, checkpoint_id=path)
        return


def test_replicated_load_reads_once(tmp_path):
    path = str(tmp_path / "ck")
    g = torch.Generator().manual_seed(1)
    big = torch.randn(256, 1024, generator=g)
    dcp_torch.save({"big": big}, checkpoint_id=path, no_dist=True)
    run_ranks(3, _read_all, path, False)
    run_ranks(3, _read_all, path, True)


def _read_all(rank, world, path, per_rank):
    g = torch.Generator().manual_seed(1)
    big = torch.randn(256, 1024, generator=g)
    out = {"big": torch.zeros(256, 1024)}
    dcp_torch.load(out, checkpoint_id=path, read_once=not per_rank)
    assert torch.equal(out["big"], big)


def _manager(rank, world, root):
    sd = state(world)
    with dcp_torch.CheckpointManager(root, interval=2, keep_last=2, async_save=True) as m:
        assert m.latest() is None
        saved = [s for s in range(1, 8) if m.step(sd, s)]
        assert saved == [2, 4, 6]
        m.request_save()
        assert m.step(sd, 7)
        m.wait()
        assert m.latest() == 7
        names = sorted(os.listdir(root))
        assert names == ["step-6", "step-7"], names
        out = state(world, zero=True)
        assert m.load_latest(out) == 7
        check(out)
        assert m.path(7) == os.path.join(root, "step-7")


def test_checkpoint_manager(tmp_path):
    run_ranks(2, _manager, str(tmp_path / "root"))


def _strided(rank, world, path):
    from torch.distributed.tensor.placement_types import _StridedShard
    mesh = init_device_mesh("cpu", (2, 2))
    g = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)
    place = [_StridedShard(0, split_factor=2), Shard(0)]  # FSDP2 over TP on one dim

    def strided(src):
        local = src.chunk(2, 0)[mesh.get_local_rank(1)].chunk(2, 0)[mesh.get_local_rank(0)]
        return DTensor.from_local(local.clone(), mesh, place, shape=g.shape, stride=g.stride())

    flat = init_device_mesh("cpu", (world,))
    tiny = torch.arange(6.0).reshape(2, 3)  # 2 rows on 4 ranks: two empty shards
    for saver in (dcp_torch, tdcp):
        p = f"{path}/{saver.__name__}"
        saver.save({"s": strided(g), "tiny": distribute_tensor(tiny, flat, [Shard(0)])}, checkpoint_id=p)
        for loader in (dcp_torch, tdcp):
            sd = {"s": strided(torch.zeros_like(g)),
                  "tiny": distribute_tensor(torch.zeros(2, 3), flat, [Shard(0)])}
            loader.load(sd, checkpoint_id=p)
            assert torch.equal(sd["s"].full_tensor(), g), (saver.__name__, loader.__name__)
            assert torch.equal(sd["tiny"].full_tensor(), tiny), (saver.__name__, loader.__name__)


def test_strided_shard_and_empty_shards(tmp_path):
    """A _StridedShard DTensor (FSDP2 over TP on one dim, 2x2 mesh) and a
    DTensor with empty shards (2 rows on 4 ranks): saved and loaded by dcp
    and torch in every direction, bit-exact."""
    run_ranks(4, _strided, str(tmp_path / "ck"))


def _wrapped(rank, world, path):
    """A DTensor whose local tensor is torch's LocalShardsWrapper holding two
    row blocks of its own (rows 2r..2r+1 and 4+2r..4+2r+1 of 8): several
    local chunks per rank."""
    from torch.distributed.tensor._shards_wrapper import LocalShardsWrapper
    mesh = init_device_mesh("cpu", (world,))
    g = torch.arange(8 * 3, dtype=torch.float32).reshape(8, 3)

    def wrapped(src):
        offs = [[2 * rank, 0], [4 + 2 * rank, 0]]
        w = LocalShardsWrapper([src[o[0]:o[0] + 2].clone() for o in offs], offs)
        return DTensor.from_local(w, mesh, (Replicate(),), run_check=False, shape=src.shape,
                                  stride=src.stride())

    def rows(t):
        return [s.clone() for s in t._local_tensor.local_shards()]

    want = rows(wrapped(g))
    for saver in (dcp_torch, tdcp):
        p = f"{path}/{saver.__name__}"
        saver.save({"w": wrapped(g), "n": 3}, checkpoint_id=p)
        for loader in (dcp_torch, tdcp):
            sd = {"w": wrapped(torch.zeros_like(g)), "n": 0}
            loader.load(sd, checkpoint_id=p)
            got = rows(sd["w"])
            assert all(torch.equal(a, b) for a, b in zip(got, want)), (saver.__name__, loader.__name__)
            assert sd["n"] == 3
        # resharded into a plain row-sharded DTensor
        sd = {"w": distribute_tensor(torch.zeros_like(g), mesh, [Shard(0)])}
        dcp_torch.load(sd, checkpoint_id=p)
        assert torch.equal(sd["w"].full_tensor(), g), saver.__name__
    md = dcp_torch.read_metadata(f"{path}/dcp_torch")
    assert sorted(tuple(c.offsets) for c in md.state_dict_metadata["w"].chunks) == \
        [(0, 0), (2, 0), (4, 0), (6, 0)]


def test_dtensor_local_shards_wrapper(tmp_path):
    """A DTensor over LocalShardsWrapper (several chunks on each rank, as
    TorchRec shards tables): both directions with torch, bit-exact, and
    loaded resharded into Shard(0)."""
    run_ranks(2, _wrapped, str(tmp_path / "ck"))


def _bad_input(rank, world, path):
    """Bad input on ranks: the same exception class on every rank, naming
    the key, nothing written or changed."""
    def same(exc_info, needle):
        names = [None] * world
        dist.all_gather_object(names, type(exc_info.value).__name__)
        assert len(set(names)) == 1, names
        assert needle in str(exc_info.value), str(exc_info.value)

    dcp_torch.save({"w": torch.ones(4)}, checkpoint_id=path)
    before = open(os.path.join(path, ".metadata"), "rb").read()
    # a '.' collision after flattening, on one rank
    sd = {"a.b": torch.ones(2), "a": {"b": torch.ones(2)}} if rank == 1 else {"a.b": torch.ones(2)}
    with pytest.raises(dcp_torch.CheckpointError) as ei:
        dcp_torch.save(sd, checkpoint_id=path)
    same(ei, "a.b")
    # a key the checkpoint lacks, on one rank only: KeyMismatchError
    # everywhere, naming it; no tensor changed
    w = torch.zeros(4)
    sd = {"w": w, "model.extra": torch.zeros(2)} if rank == 1 else {"w": w}
    with pytest.raises(dcp_torch.KeyMismatchError) as ei:
        dcp_torch.load(sd, checkpoint_id=path)
    same(ei, "model.extra")
    assert torch.equal(w, torch.zeros(4))
    # a checkpoint of another model: a shape that differs
    with pytest.raises(dcp_torch.ShapeMismatchError) as ei:
        dcp_torch.load({"w": torch.zeros(5)}, checkpoint_id=path)
    same(ei, "'w'")
    # a DTensor over a mesh of more ranks than the process group saving it:
    # the group's boxes do not cover the tensor: refused, naming it
    mesh = init_device_mesh("cpu", (world,))
    d = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
    sub = dist.new_group([0, 1])
    if rank < 2:
        with pytest.raises(dcp_torch.CheckpointError) as ei:
            dcp_torch.save({"d": d}, checkpoint_id=path, process_group=sub)
        names = [None, None]
        dist.all_gather_object(names, type(ei.value).__name__, group=sub)
        assert len(set(names)) == 1, names
        assert "'d'" in str(ei.value), str(ei.value)
    dist.barrier()
    assert open(os.path.join(path, ".metadata"), "rb").read() == before


def test_bad_input_on_ranks(tmp_path):
    """Keys colliding after flattening, a key on one rank only, another
    model's checkpoint, a DTensor whose mesh is not the process group's:
    the same exception on every rank, naming the key, nothing changed."""
    run_ranks(4, _bad_input, str(tmp_path / "ck"))


def test_torch_api_names_and_semantics(tmp_path):
    """What a program written for torch.distributed.checkpoint meets
    through `import dcp_torch as dcp`: a dtype that differs is cast as
    torch's load casts (cast=False refuses it), dcp's errors are torch's
    CheckpointException too, an id without storage or with a scheme dcp
    does not serve raises torch's RuntimeError, use_collectives and
    async_checkpointer_type are accepted, async_save's future gives the
    Metadata, and torch's names and submodules are reachable."""
    import pickle

    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    path = str(tmp_path / "ck")
    w = torch.linspace(-3, 3, 12).reshape(4, 3)
    md = dcp_torch.save({"w": w, "n": 2}, checkpoint_id=path, no_dist=True)
    assert isinstance(md, tdcp.Metadata)
    # float32 stored, bfloat16 and float64 asked: converted as copy_ does
    for dt in (torch.bfloat16, torch.float64):
        out = {"w": torch.zeros(4, 3, dtype=dt)}
        dcp_torch.load(out, checkpoint_id=path, no_dist=True)
        assert out["w"].dtype == dt and torch.equal(out["w"], w.to(dt))
    out = {"w": torch.zeros(4, 3, dtype=torch.bfloat16)}
    with pytest.raises(dcp_torch.ShapeMismatchError, match="dtype"):
        dcp_torch.load(out, checkpoint_id=path, no_dist=True, cast=False)
    assert torch.equal(out["w"], torch.zeros(4, 3, dtype=torch.bfloat16))
    # dcp's errors are torch's CheckpointException and Exceptions
    with pytest.raises(tdcp.CheckpointException) as ei:
        dcp_torch.load({"gone": torch.zeros(1)}, checkpoint_id=path, no_dist=True)
    e = ei.value
    assert isinstance(e, dcp_torch.KeyMismatchError) and isinstance(e, Exception)
    assert e.failures == {} and "gone" in str(e)
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is type(e) and e2.message == e.message
    # no checkpoint_id, no storage: torch's RuntimeError
    for call in (lambda: dcp_torch.save({"w": w}, no_dist=True),
                 lambda: dcp_torch.async_save({"w": w}, no_dist=True),
                 lambda: dcp_torch.load({"w": w}, no_dist=True)):
        with pytest.raises(RuntimeError, match="checkpoint_id"):
            call()
    # a scheme dcp does not serve: torch detects the storage (and refuses)
    for call in (lambda: dcp_torch.save({"w": w}, checkpoint_id="abc://x.y", no_dist=True),
                 lambda: dcp_torch.async_save({"w": w}, checkpoint_id="abc://x.y",
                                              no_dist=True).result(),
                 lambda: dcp_torch.load({"w": w}, checkpoint_id="abc://x.y", no_dist=True)):
        with pytest.warns(UserWarning, match="torch serves"):
            with pytest.raises(RuntimeError, match="Cannot detect"):
                call()
    assert not os.path.exists("abc:")
    # use_collectives: True is dcp's save; False is torch's (rank-local)
    p2 = str(tmp_path / "uc")
    dcp_torch.save({"w": w}, checkpoint_id=p2, no_dist=True, use_collectives=True)
    assert isinstance(dcp_torch.read_metadata(p2), tdcp.Metadata)
    p3 = str(tmp_path / "uc3")
    with pytest.warns(UserWarning, match="use_collectives=False"):
        dcp_torch.save({"w": w}, checkpoint_id=p3, no_dist=True, use_collectives=False)
    out = {"w": torch.zeros(4, 3)}
    tdcp.load(out, checkpoint_id=p3, no_dist=True)
    assert torch.equal(out["w"], w)
    # async_save: torch's checkpointer type accepted; the future's Metadata
    p4 = str(tmp_path / "as")
    fut = dcp_torch.async_save({"w": w, "n": 5}, checkpoint_id=p4, no_dist=True,
                               async_checkpointer_type=AsyncCheckpointerType.PROCESS)
    got = fut.result()
    assert isinstance(got, tdcp.Metadata) and set(got.state_dict_metadata) == {"w", "n"}
    out = {"w": torch.zeros(4, 3), "n": 0}
    dcp_torch.load(out, checkpoint_id=p4, no_dist=True)
    assert torch.equal(out["w"], w) and out["n"] == 5
    # torch's top-level names and submodules through dcp_torch
    for name in ("CheckpointException", "HuggingFaceStorageReader", "HuggingFaceStorageWriter",
                 "QuantizedHuggingFaceStorageReader", "load_sharded_optimizer_state_dict"):
        assert getattr(dcp_torch, name) is getattr(tdcp, name)
    from dcp_torch.default_planner import DefaultLoadPlanner
    from dcp_torch.stateful import Stateful as S
    assert DefaultLoadPlanner is tdcp.DefaultLoadPlanner and S is Stateful
    assert dcp_torch.state_dict.get_state_dict is not None
    assert dcp_torch.staging.AsyncStager is not None
    from dcp_torch.api import CheckpointException as CE
    assert CE is tdcp.CheckpointException
    with pytest.raises(AttributeError):
        dcp_torch.no_such_name  # noqa: B018


def _cast_ranks(rank, world, path):
    # a float32 DTensor loaded into bfloat16 shards on every rank, resharded
    mesh = init_device_mesh("cpu", (world,))
    full = torch.arange(48, dtype=torch.float32).reshape(8, 6) / 7
    dcp_torch.save({"t": distribute_tensor(full, mesh, [Shard(0)])}, checkpoint_id=path)
    out = {"t": distribute_tensor(torch.zeros(8, 6, dtype=torch.bfloat16), mesh, [Shard(1)])}
    dcp_torch.load(out, checkpoint_id=path)
    assert torch.equal(out["t"].full_tensor(), full.to(torch.bfloat16))
    with pytest.raises(tdcp.CheckpointException, match="dtype"):
        dcp_torch.load(out, checkpoint_id=path, cast=False)


def test_cast_by_default_two_ranks(tmp_path):
    run_ranks(2, _cast_ranks, str(tmp_path / "ck"))


class _Collective(Stateful):
    """A Stateful whose load_state_dict runs a collective of its own (an
    all_gather or an all_reduce, by kind)."""

    def __init__(self, kind, log):
        self.kind, self.log = kind, log

    def state_dict(self):
        return {"kind": self.kind}

    def load_state_dict(self, sd):
        t = torch.arange(2) + 1 + 2 * dist.get_rank()
        if self.kind == "gather":
            out = [torch.zeros(2, dtype=torch.int64) for _ in range(dist.get_world_size())]
            dist.all_gather(out, t)
        else:
            dist.all_reduce(t)
        self.log.append((self.kind, sd["kind"]))


def _stateful_order(rank, world, path):
    log = []
    a, b = _Collective("gather", log), _Collective("reduce", log)
    # the ranks' dicts in opposite orders: torch's load calls the Stateful
    # objects in sorted key order, so their collectives meet
    sd = {"A": a, "B": b, "t": torch.ones(3)} if rank == 0 else {"t": torch.ones(3), "B": b, "A": a}
    dcp_torch.save(sd, checkpoint_id=path)
    dcp_torch.load(sd, checkpoint_id=path)
    assert log == [("gather", "gather"), ("reduce", "reduce")], log


def test_stateful_load_order_sorted(tmp_path):
    run_ranks(2, _stateful_order, str(tmp_path / "ck"), timeout=120)
