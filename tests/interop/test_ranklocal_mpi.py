"""dcp writes rank-local checkpoints (DCP_SAVE_RANK_LOCAL), torch reads them.

dcp's interop_state_mpi saves on 3 MPI ranks the state torch's own
dcp.save(use_collectives=False) saves in test_layouts.py (a Shard(0)
DTensor's rows, a replicated plain tensor, a key of each rank's own, a
value): plain, with DCP_SAVE_ZSTD, and asynchronously. The files have
torch's layout: __<r>.metadata and __<r>_0.distcp per rank, no .metadata;
rank r's metadata lists the same keys, global sizes, chunks and
storage_data entries (all in __<r>_0.distcp) as torch's rank r file.
torch 2.13's dcp.load on 3 gloo ranks (each rank reading its own
__<r>.metadata) gets every byte back, and so does dcp (docs/FORMAT.md
§9.2); dcptool verify passes and dcptool clean keeps every file.
"""

import os
import pickle

import dcpio  # noqa: E402  (fails loudly without torch)
from dcpio import torch  # noqa: E402
import torch.distributed.checkpoint as tdcp  # noqa: E402
from test_layouts import RL_WORLD, _rl_save, dcptool, rl_full  # noqa: E402

R = dcpio.Runner("ranklocal_mpi")

FLAG_ZSTD = 2
FLAG_RANK_LOCAL = 4


def rows(r, n, nrows):
    """torch.chunk's row split, as Shard(0) makes it."""
    c = -(-nrows // n)
    o = min(c * r, nrows)
    return o, min(c * (r + 1), nrows) - o


def rank_state(r):
    full = rl_full()
    return {"model": {"w": full["w"], "b": full["b"]},
            f"rank{r}": {"x": torch.full((2,), float(r))},
            "step": 11}


def _torch_load(rank, world, ck):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    mesh = init_device_mesh("cpu", (world,))
    full = rl_full()
    tmpl = {"model": {"w": dcpio.dtensor_from_full(
                          torch.zeros_like(full["w"]), mesh, [Shard(0)]),
                      "b": torch.zeros_like(full["b"])},
            f"rank{rank}": {"x": torch.zeros(2)},
            "step": None}
    tdcp.load(tmpl, checkpoint_id=ck)
    o, n = rows(rank, world, full["w"].shape[0])
    errs = [dcpio.tensors_identical(full["w"][o:o + n],
                                    tmpl["model"]["w"].to_local()),
            dcpio.tensors_identical(full["b"], tmpl["model"]["b"]),
            dcpio.tensors_identical(torch.full((2,), float(rank)),
                                    tmpl[f"rank{rank}"]["x"]),
            dcpio.values_identical(11, tmpl["step"], "step")]
    errs = [e for e in errs if e]
    if errs:
        raise AssertionError(f"rank {rank}: " + "; ".join(errs))


def structure(ck, r):
    """Rank r's __<r>.metadata as comparable data: per key its kind, global
    size and sorted chunks; the storage_data entries (key, chunk offset,
    file); the planner_data keys."""
    with open(os.path.join(ck, f"__{r}.metadata"), "rb") as f:
        md = pickle.load(f)
    keys = {}
    for k, v in md.state_dict_metadata.items():
        if hasattr(v, "chunks"):
            keys[k] = ("tensor", str(v.properties.dtype), tuple(v.size),
                       sorted((tuple(c.offsets), tuple(c.sizes))
                              for c in v.chunks))
        else:
            keys[k] = ("bytes",)
    storage = sorted((i.fqn, tuple(i.offset) if i.offset is not None else (),
                      s.relative_path,
                      tuple(getattr(s, "transform_descriptors", None) or ()))
                     for i, s in md.storage_data.items())
    return keys, storage, sorted((md.planner_data or {}).items())


def dcp_save_ranklocal(ck, tmp, flags, mode):
    for r in range(RL_WORLD):
        o, n = rows(r, RL_WORLD, rl_full()["w"].shape[0])
        dcpio.write_manifest(rank_state(r), os.path.join(tmp, "in", str(r)),
                             boxes={"model.w": [((o, 0), (n, 5))]})
    os.environ["DCP_INTEROP_SAVE_FLAGS"] = str(flags)
    try:
        return dcpio.mpiexec(RL_WORLD, mode,
                             os.path.join(tmp, "in", "{rank}", "manifest"),
                             ck, tmp=tmp)
    finally:
        del os.environ["DCP_INTEROP_SAVE_FLAGS"]


@R.test
def ranklocal_dcp_writes_torch_reads(check, tmp):
    for zstd, mode in ((False, "savefrom"), (True, "savefrom"),
                       (False, "savefrom-async")):
        tag = f"zstd={zstd} {mode}"
        ref = os.path.join(tmp, f"torch-{zstd}")
        if not os.path.exists(ref):
            dcpio.run_ranks(check, RL_WORLD, _rl_save, (ref, zstd), tmp)
        ck = os.path.join(tmp, f"dcp-{zstd}-{mode}")
        flags = FLAG_RANK_LOCAL | (FLAG_ZSTD if zstd else 0)
        res = dcp_save_ranklocal(ck, tmp, flags, mode)
        if not check.eq(res.returncode, 0, f"{tag}: mpiexec: {res.stderr}"):
            continue
        names = sorted(os.listdir(ck))  # no .lock, no temporaries left
        want = sorted([f"__{r}.metadata" for r in range(RL_WORLD)] +
                      [f"__{r}_0.distcp" for r in range(RL_WORLD)])
        check.eq(names, want, f"{tag}: files")
        check.eq(sorted(n for n in os.listdir(ref)
                        if n.endswith(".metadata")),
                 [n for n in want if n.endswith(".metadata")],
                 f"{tag}: torch's metadata files are the same")
        for r in range(RL_WORLD):
            got, want_s = structure(ck, r), structure(ref, r)
            check.eq(got[0], want_s[0], f"{tag}: rank {r}'s keys and chunks")
            check.eq(got[1], want_s[1], f"{tag}: rank {r}'s storage_data")
            check.eq(got[2], want_s[2], f"{tag}: rank {r}'s planner_data")
        dcpio.run_ranks(check, RL_WORLD, _torch_load, (ck,), tmp)
        dcptool("verify", ck)
        dcptool("clean", ck)
        check.eq(sorted(os.listdir(ck)), names, f"{tag}: clean keeps them")
        # dcp reads it back merged (every key once, resharded to one rank).
        dump = dcpio.dcp_dumpall(ck, tmp)
        st = {"model": dict(rl_full()), "step": 11}
        for r in range(RL_WORLD):
            st[f"rank{r}"] = {"x": torch.full((2,), float(r))}
        dcpio.compare_dump(st, dump, check)


if __name__ == "__main__":
    R.main()
