"""PyTorch DTensor (gloo, CPU) and dcp over MPI exchange sharded checkpoints.

- torch_saves_dcp_loads: 4 torch processes save (torch.distributed.checkpoint
  .save) DTensors placed Shard(0), Shard(1) (uneven: 10 rows over 4, and an
  empty shard), on a 2x2 mesh [Shard(0), Shard(1)], [Shard(1), Shard(0)] and
  [Replicate(), Shard(0)], plus a replicated plain tensor, a 0-d tensor and
  values, in fp32, bf16 and int64. dcp then loads on 3 MPI ranks
  (interop_state_mpi loadinto under mpiexec), each rank with its own boxes
  (rows, columns, two boxes of one key, whole replicated tensors, a key and
  a value some ranks do not ask for), strict; every box is compared
  bit-exact with the full tensors.
- dcp_saves_torch_loads: dcp saves on 4 MPI ranks (interop_state_mpi
  savefrom): row, column and 2x2 block boxes, two boxes per rank, an empty
  box, replicated tensors and values; 2 torch processes load it with
  dcp.load into DTensors of other placements and plain tensors, and check
  every local shard and value bit-exact.

The data are random bit patterns from fixed seeds (NaN payloads included),
computed the same way in every process.
"""

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcpio  # noqa: E402  (fails loudly without torch)
from dcpio import torch  # noqa: E402
import torch.distributed.checkpoint as tdcp  # noqa: E402
from torch.distributed.checkpoint import FileSystemReader  # noqa: E402

R = dcpio.Runner("dtensor_mpi")

f32, bf16, i64 = torch.float32, torch.bfloat16, torch.int64


def split(n, parts, i):
    """(offset, size) of part i when n is cut into parts, the first n % parts
    one longer (10 over 3: 4, 3, 3)."""
    base, extra = divmod(n, parts)
    return i * base + min(i, extra), base + (1 if i < extra else 0)


def rows_box(shape, parts, i):
    o, n = split(shape[0], parts, i)
    return (o,) + (0,) * (len(shape) - 1), (n,) + tuple(shape[1:])


def cols_box(shape, parts, i):
    o, n = split(shape[1], parts, i)
    return (0, o), (shape[0], n)


def whole(shape):
    return (0,) * len(shape), tuple(shape)


def placements(spec):
    """("S", d) -> Shard(d), ("R",) -> Replicate()."""
    from torch.distributed.tensor import Replicate, Shard
    return [Shard(p[1]) if p[0] == "S" else Replicate() for p in spec]


# --------------------------------------------- torch saves, dcp loads

# key -> (dtype, shape, seed, mesh shape, placements)
TORCH_SAVED = {
    "rows": (f32, (10, 6), 1, (4,), [("S", 0)]),          # 3, 3, 3, 1
    "cols": (bf16, (5, 10), 2, (4,), [("S", 1)]),
    "short": (i64, (3, 5), 3, (4,), [("S", 0)]),          # 1, 1, 1, 0
    "vec": (bf16, (13,), 4, (4,), [("S", 0)]),
    "grid": (f32, (9, 7), 5, (2, 2), [("S", 0), ("S", 1)]),
    "grid_t": (bf16, (6, 11), 6, (2, 2), [("S", 1), ("S", 0)]),
    "half": (i64, (10, 3), 7, (2, 2), [("R",), ("S", 0)]),
    "exp_avg": (f32, (10, 6), 8, (2, 2), [("S", 0), ("R",)]),
}


def torch_saved_full():
    """The full tensors and the nested state, DTensor keys as plain
    tensors."""
    full = {k: dcpio.random_tensor(dt, shape, random.Random(seed))
            for k, (dt, shape, seed, _, _) in TORCH_SAVED.items()}
    rng = random.Random(9)
    full["replicated"] = dcpio.random_tensor(f32, (4, 4), rng)
    full["step"] = dcpio.random_tensor(f32, (), rng)
    return full


def torch_saved_state(leaf):
    """The nested state with leaf(key) for each tensor."""
    model = {k: leaf(k) for k in ("rows", "cols", "short", "vec", "grid",
                                  "grid_t", "half", "replicated")}
    return {
        "model": model,
        "optim": {
            "state": {"rows": {"exp_avg": leaf("exp_avg"),
                               "step": leaf("step")}},
            "param_groups": [{"lr": 0.001, "betas": (0.9, 0.999),
                              "eps": 1e-8, "amsgrad": False,
                              "foreach": None, "params": ["rows"]}],
        },
        "epoch": 3,
        "tag": "run-\u03b1",
    }


def _torch_save(rank, world, ck):
    from torch.distributed.device_mesh import init_device_mesh
    meshes = {(4,): init_device_mesh("cpu", (4,)),
              (2, 2): init_device_mesh("cpu", (2, 2))}
    full = torch_saved_full()

    def leaf(k):
        if k not in TORCH_SAVED:
            return full[k].clone()
        _, _, _, mesh, pl = TORCH_SAVED[k]
        return dcpio.dtensor_from_full(full[k], meshes[mesh], placements(pl))

    tdcp.save(torch_saved_state(leaf), checkpoint_id=ck)


def load_boxes(key, shape, r, n):
    """The boxes dcp rank r of n asks for."""
    if key in ("rows", "cols", "exp_avg"):
        return [rows_box(shape, n, r)]          # cols: columns become rows
    if key in ("short", "grid"):
        return [cols_box(shape, n, r)]
    if key == "vec":
        return [rows_box(shape, n, r)]          # 5, 4, 4
    if key == "grid_t":                         # two boxes, rows r and r + 3
        return [((r, 0), (1, shape[1])), ((r + 3, 0), (1, shape[1]))]
    if key == "half" or key == "step":
        return [whole(shape)]
    if key == "replicated":                     # whole, whole, a box
        return [whole(shape)] if r < 2 else [((2, 1), (2, 3))]
    raise KeyError(key)


@R.test
def torch_saves_dcp_loads(check, tmp):
    ck = os.path.join(tmp, "ck_torch")
    dcpio.run_ranks(check, 4, _torch_save, (ck,), tmp)
    if not check.true(os.path.exists(os.path.join(ck, ".metadata")),
                      "torch wrote a checkpoint"):
        return
    full = torch_saved_full()
    state = torch_saved_state(lambda k: full[k])
    flat, mapping = dcpio.flatten(state)
    md = FileSystemReader(ck).read_metadata()
    check.eq(sorted(md.state_dict_metadata), sorted(flat), "torch's keys")
    check.eq(len(md.state_dict_metadata["model.rows"].chunks), 4,
             "model.rows: 4 chunks (3, 3, 3, 1 rows)")
    check.eq(len(md.state_dict_metadata["model.half"].chunks), 2,
             "model.half: 2 chunks ([Replicate(), Shard(0)], deduplicated)")

    # Each of 3 dcp ranks asks for its boxes; values as None templates
    # (rank 1 leaves "epoch" out, some rank still asks for every key).
    n = 3
    tmpl = dcpio.zeros_template(state)
    asked = {}
    for r in range(n):
        boxes = {}
        for key in flat:
            name = key.split(".")[-1]
            if name in full:
                boxes[key] = load_boxes(name, full[name].shape, r, n)
        st = dict(tmpl)
        if r == 1:
            del st["epoch"]
        asked[r] = boxes
        dcpio.write_manifest(st, os.path.join(tmp, "in", str(r)),
                             boxes=boxes, files=False)
    os.makedirs(os.path.join(tmp, "out"))
    res = dcpio.mpiexec(n, "loadinto", os.path.join(tmp, "in", "{rank}",
                                                    "manifest"),
                        ck, os.path.join(tmp, "out", "{rank}"), tmp=tmp)
    if not check.eq(res.returncode, 0, f"mpiexec loadinto: {res.stderr}"):
        return
    for r in range(n):
        got = dcpio.read_manifest(os.path.join(tmp, "out", str(r)),
                                  boxes=True)
        want_boxes = sorted((k, tuple(o), tuple(s))
                            for k, bs in asked[r].items() for o, s in bs)
        check.eq(sorted((b["key"], tuple(b["offsets"]), tuple(b["sizes"]))
                        for b in got.boxes), want_boxes,
                 f"rank {r}: boxes written back")
        for b in got.boxes:
            want = dcpio.slice_of(flat[b["key"]], b["offsets"], b["sizes"])
            check.none(dcpio.tensors_identical(want, b["tensor"]),
                       f"rank {r}: {b['key']} box {b['offsets']} "
                       f"{b['sizes']}")
        want_values = {k: v for k, v in flat.items()
                       if not isinstance(v, torch.Tensor)
                       and not (r == 1 and k == "epoch")}
        check.eq(sorted(got.entries), sorted(want_values),
                 f"rank {r}: values")
        for k, v in want_values.items():
            if k in got.entries:
                check.none(dcpio.values_identical(
                    v, got.entries[k]["value"], k), f"rank {r}: value {k}")
                check.eq(tuple(got.entries[k]["path"]), tuple(mapping[k]),
                         f"rank {r}: path of {k}")


# --------------------------------------------- dcp saves, torch loads

# key -> (dtype, shape, seed, how 4 dcp ranks save it, torch's placements
# on 2 ranks, None: a plain tensor)
DCP_SAVED = {
    "w_rows": (f32, (10, 6), 21, "rows", [("S", 1)]),    # 3, 3, 2, 2 rows
    "w_cols": (bf16, (7, 9), 22, "cols", [("S", 0)]),
    "w_grid": (i64, (6, 10), 23, "grid", [("S", 1)]),
    "w_two": (bf16, (5, 4), 24, "two", [("R",)]),
    "w_empty": (f32, (3, 4), 25, "rows", [("S", 0)]),    # 1, 1, 1, 0 rows
    "w_rep": (i64, (4,), 26, "whole", None),
    "scalar": (f32, (), 27, "whole", None),
    "exp_avg": (f32, (10, 6), 28, "rows", [("S", 0)]),
}


def dcp_saved_full():
    return {k: dcpio.random_tensor(dt, shape, random.Random(seed))
            for k, (dt, shape, seed, _, _) in DCP_SAVED.items()}


def dcp_saved_state(leaf):
    model = {k: leaf(k) for k in DCP_SAVED if k != "exp_avg"}
    return {
        "model": model,
        "optim": {"state": {"w_rows": {"exp_avg": leaf("exp_avg")}},
                  "param_groups": [{"lr": 0.25, "betas": (0.5, 0.75),
                                    "params": ["w_rows"], "foreach": None,
                                    "maximize": True}]},
        "epoch": 11,
        "name": "dcp/mpi",
        "blob": b"\x00\xff\x10",
    }


def save_boxes(how, shape, r, n):
    if how == "rows":
        return [rows_box(shape, n, r)]
    if how == "cols":
        return [cols_box(shape, n, r)]
    if how == "grid":                            # 2 x 2 blocks
        (ro, rn), (co, cn) = split(shape[0], 2, r // 2), split(shape[1], 2,
                                                                r % 2)
        return [((ro, co), (rn, cn))]
    if how == "two":                             # rows r and r + 4
        return [((i, 0), (1, shape[1])) for i in (r, r + 4) if i < shape[0]]
    if how == "whole":
        return [whole(shape)]
    raise KeyError(how)


def _torch_load(rank, world, ck):
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    full = dcp_saved_full()

    def template(k):
        _, _, _, _, pl = DCP_SAVED[k]
        z = torch.zeros(full[k].shape, dtype=full[k].dtype)
        if pl is None:
            return z
        return dcpio.dtensor_from_full(z, mesh, placements(pl))

    # Zeroed DTensors and plain tensors, values as None templates.
    tmpl = dcpio.zeros_template(dcp_saved_state(template), keep_tensors=True)
    tdcp.load(tmpl, checkpoint_id=ck)
    flat_got, _ = dcpio.flatten(tmpl)
    want_state = dcp_saved_state(lambda k: full[k])
    flat_want, _ = dcpio.flatten(want_state)
    errors = []
    names = {k: k.split(".")[-1] for k in flat_want}
    for k, want in flat_want.items():
        got = flat_got[k]
        if isinstance(want, torch.Tensor):
            pl = DCP_SAVED[names[k]][4]
            if pl is not None:
                offs, sizes = dcpio.local_box(want.shape, mesh,
                                              placements(pl))
                want, got = dcpio.slice_of(want, offs, sizes), got.to_local()
            d = dcpio.tensors_identical(want, got)
        else:
            d = dcpio.values_identical(want, got, k)
        if d:
            errors.append(f"{k}: {d}")
    if errors:
        raise AssertionError(f"rank {rank}: " + "; ".join(errors))


@R.test
def dcp_saves_torch_loads(check, tmp):
    full = dcp_saved_full()
    state = dcp_saved_state(lambda k: full[k])
    flat, _ = dcpio.flatten(state)
    n = 4
    saved = {}
    for r in range(n):
        boxes = {}
        for key in flat:
            name = key.split(".")[-1]
            if name in DCP_SAVED:
                how = DCP_SAVED[name][3]
                boxes[key] = save_boxes(how, full[name].shape, r, n)
        saved[r] = boxes
        dcpio.write_manifest(state, os.path.join(tmp, "in", str(r)),
                             boxes=boxes)
    ck = os.path.join(tmp, "ck_dcp")
    res = dcpio.mpiexec(n, "savefrom", os.path.join(tmp, "in", "{rank}",
                                                    "manifest"), ck, tmp=tmp)
    if not check.eq(res.returncode, 0, f"mpiexec savefrom: {res.stderr}"):
        return
    files = sorted(f for f in os.listdir(ck) if f.endswith(".distcp"))
    check.eq(files, [f"__{r}_0.distcp" for r in range(n)],
             "one data file per rank")
    md = FileSystemReader(ck).read_metadata()
    check.eq(sorted(md.state_dict_metadata), sorted(flat), "torch's keys")
    for key, leaf in flat.items():
        if not isinstance(leaf, torch.Tensor):
            continue
        # Every non-empty box once (replicated ones deduplicated).
        want = sorted({(tuple(o), tuple(s)) for r in range(n)
                       for o, s in saved[r][key] if 0 not in s})
        got = sorted((tuple(c.offsets), tuple(c.sizes))
                     for c in md.state_dict_metadata[key].chunks
                     if 0 not in tuple(c.sizes))
        check.eq(got, want, f"{key}: non-empty chunks in torch's metadata")
    dcpio.run_ranks(check, 2, _torch_load, (ck,), tmp)


if __name__ == "__main__":
    R.main()
