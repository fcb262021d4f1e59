"""Tensors stored as several boxes (chunks), both directions.

- dcp saves one tensor as several boxes (several dcp_state_add_tensor calls
  with one name): PyTorch loads the whole tensor bit-exact, and into DTensor
  shards of another layout (3 gloo ranks, Shard(1)); dcp loadbox/readbox of
  a box that spans several stored chunks equals the slice; overlapping or
  gapped box sets are refused.
- PyTorch saves DTensors sharded over 3 gloo ranks (Shard(0), Shard(1), an
  uneven split with an empty shard, Replicate, several dtypes): dcp dumpall
  gives the whole tensors, loadbox/readbox across chunks give the slices.

The ranks are local processes (dcpio.run_ranks) meeting at
tcp://127.0.0.1:<free port>, loopback only.
"""

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcpio  # noqa: E402  (fails loudly without torch)
from dcpio import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as tdcp  # noqa: E402
from torch.distributed.checkpoint import FileSystemReader  # noqa: E402
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # noqa: E402

R = dcpio.Runner("boxes")


# ------------------------------------------------------------ the tensors

def rows_tensor():
    return dcpio.random_tensor(torch.float32, (10, 6), random.Random(10))


def block_tensor():
    return dcpio.random_tensor(torch.int16, (7, 9), random.Random(11))


def mid_tensor():
    return dcpio.random_tensor(torch.bfloat16, (4, 6, 5), random.Random(12))


# key -> (tensor, boxes as (offsets, sizes)), boxes in a scrambled order
def dcp_boxed():
    return {
        "rows": (rows_tensor(), [((3, 0), (4, 6)), ((0, 0), (3, 6)),
                                 ((7, 0), (3, 6))]),
        "block": (block_tensor(), [((3, 4), (4, 5)), ((0, 0), (3, 4)),
                                   ((3, 0), (4, 4)), ((0, 4), (3, 5))]),
        "mid": (mid_tensor(), [((0, 0, 0), (4, 2, 5)),
                               ((0, 2, 0), (4, 4, 5))]),
    }


def check_boxes(check, ck, key, full, cases, tmp):
    for offs, sizes in cases:
        want = dcpio.tensor_bytes(dcpio.slice_of(full, offs, sizes))
        for mode in ("loadbox", "readbox"):
            what = f"{mode} {key} offsets {offs} sizes {sizes}"
            try:
                got = dcpio.dcp_box(ck, key, offs, sizes, tmp, mode=mode)
            except AssertionError as exc:
                check.true(False, f"{what}: {exc}")
                continue
            check.eq(got.hex(), want.hex(), what)


# ------------------------------------------------------- distributed part

def sharded_full():
    """The tensors the ranks shard, the same on every rank."""
    rng = random.Random(21)
    return {
        "a": dcpio.random_tensor(torch.float32, (10, 6), rng),
        "b": dcpio.random_tensor(torch.int16, (5, 7), rng),
        "c": dcpio.random_tensor(torch.bfloat16, (2, 3), rng),
        "r": dcpio.random_tensor(torch.float64, (4,), rng),
        "plain": dcpio.random_tensor(torch.uint8, (3, 3), rng),
        "f8": dcpio.random_tensor(torch.float8_e5m2, (7, 2), rng),
    }


def _ranks(rank, world, ck_torch, ck_dcp):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    _dtensor = dcpio.dtensor_from_full
    mesh = init_device_mesh("cpu", (world,))
    full = sharded_full()
    model = {
        "a": _dtensor(full["a"], mesh, [Shard(0)]),
        "b": _dtensor(full["b"], mesh, [Shard(1)]),
        "c": _dtensor(full["c"], mesh, [Shard(0)]),
        "r": _dtensor(full["r"], mesh, [Replicate()]),
        "f8": _dtensor(full["f8"], mesh, [Shard(0)]),
        "plain": full["plain"].clone(),
    }
    tdcp.save({"model": model, "step": 9}, checkpoint_id=ck_torch)
    dist.barrier()
    # dcp's boxed checkpoint, loaded into DTensors of another layout.
    if ck_dcp:
        boxed = dcp_boxed()
        tmpl = {}
        for key, (t, _) in boxed.items():
            z = torch.zeros(t.shape, dtype=t.dtype)
            tmpl[key] = _dtensor(z, mesh, [Shard(1)])
        tdcp.load(tmpl, checkpoint_id=ck_dcp)
        for key, (t, _) in boxed.items():
            want = _dtensor(t, mesh, [Shard(1)]).to_local()
            got = tmpl[key].to_local()
            d = dcpio.tensors_identical(want, got)
            if d:
                raise AssertionError(f"rank {rank}: DTensor {key}: {d}")


# ------------------------------------------------------------------ tests

@R.test
def dcp_boxes_torch_loads(check, tmp):
    boxed = dcp_boxed()
    state = {k: t for k, (t, _) in boxed.items()}
    ck = os.path.join(tmp, "ck")
    dcpio.dcp_save_manifest(state, ck, tmp,
                            boxes={k: b for k, (_, b) in boxed.items()})
    md = FileSystemReader(ck).read_metadata()
    for key, (t, boxes) in boxed.items():
        m = md.state_dict_metadata[key]
        got = sorted((tuple(c.offsets), tuple(c.sizes)) for c in m.chunks)
        check.eq(got, sorted(boxes), f"{key}: chunks in torch's metadata")
        check.eq(tuple(m.size), tuple(t.shape), f"{key}: global size")
    tmpl = dcpio.zeros_template(state)
    tdcp.load(tmpl, checkpoint_id=ck)
    check.none(dcpio.nested_identical(state, tmpl), "torch dcp.load")
    out = os.path.join(tmp, "full.pt")
    dcp_to_torch_save(ck, out)
    check.none(dcpio.nested_identical(state, torch.load(out)),
               "dcp_to_torch_save")
    # dcp reads boxes that span several stored chunks.
    check_boxes(check, ck, "rows", state["rows"],
                [((2, 0), (7, 6)), ((1, 1), (8, 4)), ((0, 0), (10, 6)),
                 ((3, 2), (4, 1))], tmp)
    check_boxes(check, ck, "block", state["block"],
                [((2, 3), (3, 3)), ((1, 1), (5, 7)), ((6, 8), (1, 1))], tmp)
    check_boxes(check, ck, "mid", state["mid"],
                [((1, 1, 1), (2, 3, 3)), ((0, 1, 0), (4, 2, 5))], tmp)
    dcpio.compare_dump(state, dcpio.dcp_dumpall(ck, tmp), check)


@R.test
def dcp_boxes_with_empty_box(check, tmp):
    # An empty box at the end, as torch itself stores an uneven Shard(0) of
    # 2 rows over 3 ranks (sizes 1, 1, 0; the last offset equals the size).
    t = dcpio.random_tensor(torch.bfloat16, (2, 3), random.Random(13))
    boxes = [((0, 0), (1, 3)), ((1, 0), (1, 3)), ((2, 0), (0, 3))]
    ck = os.path.join(tmp, "ck")
    dcpio.dcp_save_manifest({"c": t}, ck, tmp, boxes={"c": boxes})
    md = FileSystemReader(ck).read_metadata()
    got = sorted((tuple(c.offsets), tuple(c.sizes))
                 for c in md.state_dict_metadata["c"].chunks)
    check.true(set(got) >= set(boxes[:2]), f"chunks in torch's metadata: {got}")
    tmpl = {"c": torch.zeros(2, 3, dtype=torch.bfloat16)}
    tdcp.load(tmpl, checkpoint_id=ck)
    check.none(dcpio.tensors_identical(t, tmpl["c"]), "torch dcp.load")
    check_boxes(check, ck, "c", t, [((0, 0), (2, 3)), ((1, 1), (1, 2))], tmp)


@R.test
def bad_box_sets_are_refused(check, tmp):
    # Overlapping boxes and boxes that leave a gap must not commit.
    t = rows_tensor()
    for name, boxes in [("overlap", [((0, 0), (6, 6)), ((5, 0), (5, 6))]),
                        ("gap", [((0, 0), (3, 6)), ((4, 0), (6, 6))])]:
        ck = os.path.join(tmp, name)
        mdir = os.path.join(tmp, "m_" + name)
        mpath = dcpio.write_manifest({"rows": t}, mdir,
                                     boxes={"rows": boxes})
        r = dcpio.run("savefrom", mpath, ck, expect_ok=False)
        check.eq(r.returncode, 1, f"{name}: savefrom exit status "
                 f"(stderr {r.stderr.strip()!r})")
        check.true(r.stderr.startswith("interop_state: "),
                   f"{name}: error message {r.stderr!r}")
        check.true(not os.path.exists(os.path.join(ck, ".metadata")),
                   f"{name}: no .metadata committed")


@R.test
def torch_dtensor_ranks_dcp_reads(check, tmp):
    # dcp's boxed checkpoint for the ranks to load as DTensors.
    boxed = dcp_boxed()
    ck_dcp = os.path.join(tmp, "ck_dcp")
    dcpio.dcp_save_manifest({k: t for k, (t, _) in boxed.items()}, ck_dcp,
                            tmp, boxes={k: b for k, (_, b) in boxed.items()})
    ck = os.path.join(tmp, "ck_torch")
    world = 3
    dcpio.run_ranks(check, world, _ranks, (ck, ck_dcp), tmp)
    if not os.path.exists(os.path.join(ck, ".metadata")):
        check.true(False, "torch wrote no checkpoint")
        return
    full = sharded_full()
    state = {"model": full, "step": 9}
    md = FileSystemReader(ck).read_metadata()
    nfiles = len([f for f in os.listdir(ck) if f.endswith(".distcp")])
    check.eq(nfiles, world, "torch data files (one per rank)")
    dump = dcpio.dcp_dumpall(ck, tmp)
    dcpio.compare_dump(state, dump, check)
    for key, n in dump.nchunks.items():
        check.eq(n, len(md.state_dict_metadata[key].chunks),
                 f"{key}: dcp chunk count vs torch's metadata")
    check.eq(len(md.state_dict_metadata["model.a"].chunks), 3,
             "model.a stored as 3 chunks")
    check_boxes(check, ck, "model.a", full["a"],
                [((1, 0), (8, 6)), ((3, 2), (6, 3)), ((0, 0), (10, 6))], tmp)
    check_boxes(check, ck, "model.b", full["b"],
                [((0, 2), (5, 5)), ((1, 1), (3, 6))], tmp)
    check_boxes(check, ck, "model.c", full["c"],
                [((0, 0), (2, 3)), ((1, 1), (1, 2))], tmp)
    check_boxes(check, ck, "model.r", full["r"], [((1,), (2,))], tmp)
    check_boxes(check, ck, "model.f8", full["f8"], [((2, 0), (4, 2))], tmp)


if __name__ == "__main__":
    R.main()
