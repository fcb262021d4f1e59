"""Checkpoint layouts torch 2.13 writes beyond the plain one (issue 18).

ZStandard-compressed records: torch's FileSystemWriter(_extensions=
[ZStandard()]) compresses each record's torch.save archive into zstd frames
and records ["stream.zstd/1"] in its _StorageInfo.transform_descriptors.
dcptool ls, info, cat, verify and export read such a checkpoint, and
dcp_load reads every tensor and value bit-exact (whole and boxes).

Rank-local checkpoints: torch's dcp.save(use_collectives=False) on 3 gloo
ranks writes __<r>.metadata per rank and no .metadata; dcp reads the union
(docs/FORMAT.md §9.2). serialization_format=SAFETENSORS data files: dcp
reads them (§9.3). Hostile cases: damaged and oversized zstd frames,
unknown transforms, missing per-rank metadata, ranks that disagree, a key
the safetensors header lacks.
"""

import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcpio  # noqa: E402  (fails loudly without torch)
from dcpio import torch  # noqa: E402
import torch.distributed.checkpoint as tdcp  # noqa: E402
from torch.distributed.checkpoint._extension import ZStandard  # noqa: E402

R = dcpio.Runner("layouts")


def dcptool(*args, expect=0, text=True):
    r = subprocess.run([os.environ["DCPTOOL"]] + [str(a) for a in args],
                       capture_output=True, text=text, timeout=120)
    if r.returncode != expect:
        raise AssertionError(f"dcptool {' '.join(map(str, args))}: exit "
                             f"{r.returncode}, expected {expect}\n{r.stderr}")
    return r


def state():
    rng = random.Random(1818)
    return {"model": {"w": torch.randn(64, 33),
                      "zeros": torch.zeros(1000),  # compresses well
                      "ids": torch.arange(-5, 5),
                      "h": dcpio.random_tensor(torch.bfloat16, (7, 3), rng),
                      "s": torch.tensor(2.5, dtype=torch.float64),
                      "empty": torch.empty(0, 4)},
            "step": 7, "name": "zstd run"}


@R.test
def zstd_torch_writes_dcp_reads(check, tmp):
    st = state()
    ck = os.path.join(tmp, "ck")
    tdcp.save(st, storage_writer=tdcp.FileSystemWriter(
        ck, _extensions=[ZStandard()]))
    md = tdcp.FileSystemReader(ck).read_metadata()
    tds = {tuple(v.transform_descriptors or ())
           for v in md.storage_data.values()}
    check.eq(tds, {("stream.zstd/1",)}, "torch recorded the zstd transform")
    flat, _ = dcpio.flatten(st)

    rows = {ln.split("\t")[0]: ln.split("\t")[1:]
            for ln in dcptool("ls", ck).stdout.splitlines()}
    for k, v in flat.items():
        if isinstance(v, torch.Tensor):
            check.eq(rows.get(k, [None])[0], dcpio.dtype_name(v.dtype),
                     f"ls: dtype of {k}")
    dcptool("info", ck)
    dcptool("verify", ck)
    dump = dcpio.dcp_dumpall(ck, tmp)
    dcpio.compare_dump(st, dump, check)
    for key, offs, sizes in [("model.w", (3, 5), (10, 20)),
                             ("model.zeros", (100,), (7,))]:
        want = dcpio.slice_of(flat[key], offs, sizes)
        for mode in ("loadbox", "readbox"):
            got = dcpio.dcp_box(ck, key, offs, sizes, tmp, mode=mode)
            check.eq(got.hex(), dcpio.tensor_bytes(want).hex(),
                     f"{mode} {key}")
    for key in ("model.w", "model.h"):
        got = dcptool("cat", ck, key, text=False).stdout
        check.eq(got.hex(), dcpio.tensor_bytes(flat[key]).hex(), f"cat {key}")
    pt = os.path.join(tmp, "out.pt")
    dcptool("export", ck, pt)
    got = torch.load(pt, weights_only=True)
    check.none(dcpio.nested_identical(st, got), "export -> torch.load")



def _record_of(ck, key):
    """(file, offset, length) of key's first record, from torch's reader."""
    md = tdcp.FileSystemReader(ck).read_metadata()
    for idx, info in md.storage_data.items():
        if idx.fqn == key:
            return (os.path.join(ck, info.relative_path), info.offset,
                    info.length)
    raise KeyError(key)


@R.test
def zstd_hostile(check, tmp):
    """A damaged frame and a frame that expands past the chunk's bound
    are refused with DCP_ECORRUPT naming the key; an unknown transform
    with DCP_ENOTSUP."""
    import pickle
    import shutil
    import zstandard
    st = state()
    ck = os.path.join(tmp, "ck")
    tdcp.save(st, storage_writer=tdcp.FileSystemWriter(
        ck, _extensions=[ZStandard()]))

    bad = os.path.join(tmp, "bad")
    shutil.copytree(ck, bad)
    path, off, ln = _record_of(bad, "model.w")
    with open(path, "r+b") as f:
        f.seek(off + ln // 2)
        b = f.read(1)
        f.seek(off + ln // 2)
        f.write(bytes([b[0] ^ 0x55]))
    r = dcpio.run("dumpall", bad, os.path.join(tmp, "d1"), expect_ok=False)
    check.true(r.returncode != 0 and "DCP_ECORRUPT" in r.stderr and
               "'model.w'" in r.stderr, r.stderr)
    dcptool("verify", bad, expect=1)

    # a bomb: model.ids's record replaced by a frame of 64 MiB of zeros
    # (a few KiB compressed), its metadata byte range updated to match
    bomb = os.path.join(tmp, "bomb")
    shutil.copytree(ck, bomb)
    frame = zstandard.ZstdCompressor().compress(bytes(64 << 20))
    path, off, ln = _record_of(bomb, "model.ids")
    with open(path, "ab") as f:
        at = f.tell()
        f.write(frame)
    mdp = os.path.join(bomb, ".metadata")
    with open(mdp, "rb") as f:
        md = pickle.load(f)
    for idx, info in md.storage_data.items():
        if idx.fqn == "model.ids":
            info.offset, info.length = at, len(frame)
    with open(mdp, "wb") as f:
        pickle.dump(md, f)
    r = dcpio.run("dumpall", bomb, os.path.join(tmp, "d2"), expect_ok=False)
    check.true(r.returncode != 0 and "DCP_ECORRUPT" in r.stderr and
               "'model.ids'" in r.stderr and "allows" in r.stderr, r.stderr)

    # an unknown transform
    for info in md.storage_data.values():
        info.transform_descriptors = ["stream.zstd/2"]
    with open(mdp, "wb") as f:
        pickle.dump(md, f)
    r = dcpio.run("dumpall", bomb, os.path.join(tmp, "d3"), expect_ok=False)
    check.true(r.returncode != 0 and "DCP_ENOTSUP" in r.stderr, r.stderr)




@R.test
def zstd_dcp_writes_torch_reads(check, tmp):
    """DCP_SAVE_ZSTD (sync and async): every record a zstd frame with
    ["stream.zstd/1"] recorded; torch's dcp.load reads it bit-exact, and
    so does dcp."""
    st = state()
    for mode in ("savefrom", "savefrom-async"):
        ck = os.path.join(tmp, mode)
        os.environ["DCP_INTEROP_SAVE_FLAGS"] = "2"  # DCP_SAVE_ZSTD
        try:
            dcpio.dcp_save_manifest(st, ck, tmp, mode=mode)
        finally:
            del os.environ["DCP_INTEROP_SAVE_FLAGS"]
        md = tdcp.FileSystemReader(ck).read_metadata()
        tds = {tuple(v.transform_descriptors or ())
               for v in md.storage_data.values()}
        check.eq(tds, {("stream.zstd/1",)}, f"{mode}: transforms recorded")
        with open(os.path.join(ck, "__0_0.distcp"), "rb") as f:
            head = f.read(4)
        check.eq(head, b"\x28\xb5\x2f\xfd", f"{mode}: a zstd frame")
        tmpl = dcpio.zeros_template(st)
        tdcp.load(tmpl, checkpoint_id=ck)
        check.none(dcpio.nested_identical(st, tmpl), f"{mode}: torch load")
        dump = dcpio.dcp_dumpall(ck, tmp)
        dcpio.compare_dump(st, dump, check)
        dcptool("verify", ck)



# ------------------------------------- serialization_format=SAFETENSORS

@R.test
def safetensors_torch_writes_dcp_reads(check, tmp):
    """FileSystemWriter(serialization_format=SAFETENSORS): values are plain
    records, the tensors one safetensors file at the end of the data file,
    every tensor's storage entry pointing at its start (torch 2.13's own
    FileSystemReader cannot load it back). dcp reads every tensor and value
    bit-exact, whole and in boxes; a tensor missing from the safetensors
    header is DCP_EFORMAT naming it."""
    import pickle
    import shutil
    from torch.distributed.checkpoint.filesystem import SerializationFormat
    st = state()
    ck = os.path.join(tmp, "ck")
    tdcp.save(st, storage_writer=tdcp.FileSystemWriter(
        ck, serialization_format=SerializationFormat.SAFETENSORS))
    md = tdcp.FileSystemReader(ck).read_metadata()
    offs = {i.fqn: info.offset for i, info in md.storage_data.items()
            if i.offset is not None}
    check.eq(len(set(offs.values())), 1, f"tensors share one offset {offs}")
    flat, _ = dcpio.flatten(st)
    rows = {ln.split("\t")[0]: ln.split("\t")[1:]
            for ln in dcptool("ls", ck).stdout.splitlines()}
    for k, v in flat.items():
        if isinstance(v, torch.Tensor):
            check.eq(rows.get(k, [None])[0], dcpio.dtype_name(v.dtype),
                     f"ls: dtype of {k}")
    dcptool("verify", ck)
    dump = dcpio.dcp_dumpall(ck, tmp)
    dcpio.compare_dump(st, dump, check)
    for mode in ("loadbox", "readbox"):
        got = dcpio.dcp_box(ck, "model.w", (3, 5), (10, 20), tmp, mode=mode)
        check.eq(got.hex(), dcpio.tensor_bytes(
            dcpio.slice_of(flat["model.w"], (3, 5), (10, 20))).hex(),
            f"{mode} model.w")
    got = dcptool("cat", ck, "model.h", text=False).stdout
    check.eq(got.hex(), dcpio.tensor_bytes(flat["model.h"]).hex(), "cat")
    pt = os.path.join(tmp, "out.pt")
    dcptool("export", ck, pt)
    check.none(dcpio.nested_identical(st, torch.load(pt, weights_only=True)),
               "export -> torch.load")

    # hostile: the metadata names a key the safetensors header lacks
    bad = os.path.join(tmp, "bad")
    shutil.copytree(ck, bad)
    mdp = os.path.join(bad, ".metadata")
    with open(mdp, "rb") as f:
        m = pickle.load(f)
    sdm = m.state_dict_metadata
    sdm["model.w2"] = sdm["model.w"]
    for i, info in list(m.storage_data.items()):
        if i.fqn == "model.w":
            m.storage_data[type(i)("model.w2", i.offset, i.index)] = info
    with open(mdp, "wb") as f:
        pickle.dump(m, f)
    r = dcpio.run("dumpall", bad, os.path.join(tmp, "d1"), expect_ok=False)
    check.true(r.returncode != 0 and "DCP_EFORMAT" in r.stderr and
               "'model.w2'" in r.stderr and "does not hold it" in r.stderr,
               r.stderr)



# ------------------------------------------- flatten_state_dict=False

@R.test
def unflattened_torch_writes_dcp_reads(check, tmp):
    """DefaultSavePlanner(flatten_state_dict=False): a top-level tensor is
    a tensor entry, a nested dict one value entry (a torch.save of the
    dict, tensors inside), no planner_data. dcp lists every entry, reads
    the top-level tensors and plain values bit-exact, and refuses only the
    value holding tensors, with DCP_ENOTSUP naming it."""
    from torch.distributed.checkpoint import DefaultSavePlanner
    top = torch.randn(4, 3)
    st = {"model": {"w": torch.randn(2, 3), "sub": {"b": torch.ones(2)}},
          "step": 3, "top": top}
    ck = os.path.join(tmp, "ck")
    tdcp.save(st, checkpoint_id=ck,
              planner=DefaultSavePlanner(flatten_state_dict=False))
    md = tdcp.FileSystemReader(ck).read_metadata()
    check.eq(sorted(md.state_dict_metadata), ["model", "step", "top"],
             "torch's keys")
    check.eq(md.planner_data, None, "no planner_data")
    rows = {ln.split("\t")[0]: ln.split("\t")[1:]
            for ln in dcptool("ls", ck).stdout.splitlines()}
    check.eq(sorted(rows), ["model", "step", "top"], "ls")
    check.eq(rows["model"][0], "value", "model is a value")
    got = dcptool("cat", ck, "top", text=False).stdout
    check.eq(got.hex(), dcpio.tensor_bytes(top).hex(), "cat top")
    got = dcpio.dcp_box(ck, "top", (1, 0), (2, 3), tmp)
    check.eq(got.hex(), dcpio.tensor_bytes(top[1:3]).hex(), "loadbox top")
    r = dcptool("cat", ck, "step")
    check.eq(r.stdout.strip(), "3", "cat step")
    r = dcptool("cat", ck, "model", expect=1)
    check.true("'model'" in r.stderr and "holds torch tensors" in r.stderr,
               r.stderr)
    r = dcpio.run("dumpall", ck, os.path.join(tmp, "d"), expect_ok=False)
    check.true(r.returncode != 0 and "DCP_ENOTSUP" in r.stderr and
               "'model'" in r.stderr, r.stderr)
    # a top-level list of tensors is one value holding tensors (refused),
    # a top-level dict of plain values one value dcp reads
    ck2 = os.path.join(tmp, "ck2")
    tdcp.save({"lst": [torch.ones(2), torch.zeros(3)], "plain": {"a": 11}},
              checkpoint_id=ck2,
              planner=DefaultSavePlanner(flatten_state_dict=False))
    rows = {ln.split("\t")[0]: ln.split("\t")[1:]
            for ln in dcptool("ls", ck2).stdout.splitlines()}
    check.eq(sorted(rows), ["lst", "plain"], "ls lists")
    check.eq((rows["lst"][0], rows["plain"][0]), ("value", "value"),
             "both values")
    r = dcptool("cat", ck2, "lst", expect=1)
    check.true("'lst'" in r.stderr and "holds torch tensors" in r.stderr,
               r.stderr)
    r = dcptool("cat", ck2, "plain")
    check.true("a" in r.stdout and "11" in r.stdout, r.stdout)


@R.test
def pre_2_4_key_layout_torch_writes_dcp_reads(check, tmp):
    """The pre-2.4 key layout (torch's traverse_state_dict_v_2_3, which
    torch 2.13 still loads): a nested dict or list holding no tensor is one
    value entry (a torch.save of the plain container) instead of one key
    per leaf; containers with tensors flatten as today ("model.w"). Written
    here by torch 2.13 itself with _version._derived_version = "2_3". dcp
    lists the keys as stored, reads the tensors bit-exact and the plain
    container as one value."""
    from torch.distributed.checkpoint import _version
    w = torch.randn(3, 5)
    st = {"model": {"w": w}, "cfg": {"lr": 0.5, "n": 3}, "step": 7}
    ck = os.path.join(tmp, "ck")
    _version._derived_version = "2_3"
    try:
        tdcp.save(st, checkpoint_id=ck)
    finally:
        _version._derived_version = None
    md = tdcp.FileSystemReader(ck).read_metadata()
    check.eq(sorted(md.state_dict_metadata), ["cfg", "model.w", "step"],
             "torch's 2.3 keys")
    back = {"model": {"w": torch.zeros(3, 5)}, "cfg": {"lr": 0.0, "n": 0},
            "step": 0}
    tdcp.load(back, checkpoint_id=ck)
    check.true(torch.equal(back["model"]["w"], w) and
               back["cfg"] == {"lr": 0.5, "n": 3}, "torch 2.13 reads it")
    rows = {ln.split("\t")[0]: ln.split("\t")[1:]
            for ln in dcptool("ls", ck).stdout.splitlines()}
    check.eq(sorted(rows), ["cfg", "model.w", "step"], "ls")
    check.eq(rows["cfg"][0], "value", "cfg is a value")
    got = dcptool("cat", ck, "model.w", text=False).stdout
    check.eq(got.hex(), dcpio.tensor_bytes(w).hex(), "cat model.w")
    r = dcptool("cat", ck, "cfg")
    check.true("lr" in r.stdout and "0.5" in r.stdout and "3" in r.stdout,
               r.stdout)
    r = dcptool("cat", ck, "step")
    check.eq(r.stdout.strip(), "7", "cat step")


# ------------------------------------------------ rank-local checkpoints

RL_WORLD = 3


def rl_full():
    return {"w": torch.arange(7 * 5, dtype=torch.float32).reshape(7, 5) / 3,
            "b": torch.linspace(-1, 1, 6, dtype=torch.float64)}


def _rl_save(rank, world, ck, zstd):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    mesh = init_device_mesh("cpu", (world,))
    full = rl_full()
    st = {"model": {"w": dcpio.dtensor_from_full(full["w"], mesh, [Shard(0)]),
                    "b": full["b"].clone()},  # replicated plain tensor
          f"rank{rank}": {"x": torch.full((2,), float(rank))},
          "step": 11}
    kw = {}
    if zstd:
        kw["storage_writer"] = tdcp.FileSystemWriter(
            ck, _extensions=[ZStandard()])
    else:
        kw["checkpoint_id"] = ck
    tdcp.save(st, use_collectives=False, **kw)


@R.test
def ranklocal_torch_writes_dcp_reads(check, tmp):
    """torch's dcp.save(use_collectives=False) on 3 gloo ranks writes
    __<r>.metadata and __<r>_0.distcp per rank and no .metadata; dcp reads
    the union of the ranks' metadata: the Shard(0) DTensor whole and in
    boxes across ranks, the replicated tensor, each rank's own key."""
    full = rl_full()
    for zstd in (False, True):
        ck = os.path.join(tmp, "rlz" if zstd else "rl")
        dcpio.run_ranks(check, RL_WORLD, _rl_save, (ck, zstd), tmp)
        names = sorted(os.listdir(ck))
        check.eq([n for n in names if n.endswith(".metadata")],
                 [f"__{r}.metadata" for r in range(RL_WORLD)],
                 f"rank-local metadata files {names}")
        rows = {ln.split("\t")[0]: ln.split("\t")[1:]
                for ln in dcptool("ls", ck).stdout.splitlines()}
        want = {"model.w": full["w"], "model.b": full["b"]}
        for r in range(RL_WORLD):
            want[f"rank{r}.x"] = torch.full((2,), float(r))
        for k in list(want) + ["step"]:
            check.true(k in rows, f"ls lists {k}: {sorted(rows)}")
        dcptool("verify", ck)
        # dcptool clean: torch's rank-local data files are not leftovers
        dcptool("clean", ck)
        check.eq(sorted(os.listdir(ck)), names, "clean keeps a rank-local "
                 "checkpoint's files")
        for k, v in want.items():
            got = dcptool("cat", ck, k, text=False).stdout
            check.eq(got.hex(), dcpio.tensor_bytes(v).hex(), f"cat {k}")
        # a box across the ranks' shards (rows 1..5 of 3 + 3 + 1)
        for mode in ("loadbox", "readbox"):
            got = dcpio.dcp_box(ck, "model.w", (1, 1), (5, 3), tmp, mode=mode)
            check.eq(got.hex(), dcpio.tensor_bytes(
                dcpio.slice_of(full["w"], (1, 1), (5, 3))).hex(),
                f"{mode} model.w zstd={zstd}")
        dump = dcpio.dcp_dumpall(ck, tmp)
        st = {"model": dict(full), "step": 11}
        for r in range(RL_WORLD):
            st[f"rank{r}"] = {"x": torch.full((2,), float(r))}
        dcpio.compare_dump(st, dump, check)


@R.test
def ranklocal_hostile(check, tmp):
    """A rank's metadata missing between others: DCP_EFORMAT naming it;
    ranks disagreeing on a key's global shape: DCP_EFORMAT naming both."""
    import pickle
    import shutil
    ck = os.path.join(tmp, "rl")
    dcpio.run_ranks(check, RL_WORLD, _rl_save, (ck, False), tmp)
    gap = os.path.join(tmp, "gap")
    shutil.copytree(ck, gap)
    os.remove(os.path.join(gap, "__1.metadata"))
    r = dcpio.run("dumpall", gap, os.path.join(tmp, "d1"), expect_ok=False)
    check.true(r.returncode != 0 and "DCP_EFORMAT" in r.stderr and
               "__1.metadata" in r.stderr, r.stderr)
    r = dcptool("ls", gap, expect=1)
    check.true("__1.metadata" in r.stderr, r.stderr)
    no0 = os.path.join(tmp, "no0")
    shutil.copytree(ck, no0)
    os.remove(os.path.join(no0, "__0.metadata"))
    r = dcpio.run("dumpall", no0, os.path.join(tmp, "d2"), expect_ok=False)
    check.true(r.returncode != 0 and "DCP_EFORMAT" in r.stderr and
               "__0.metadata" in r.stderr, r.stderr)
    bad = os.path.join(tmp, "shape")
    shutil.copytree(ck, bad)
    p = os.path.join(bad, "__2.metadata")
    with open(p, "rb") as f:
        md = pickle.load(f)
    md.state_dict_metadata["model.b"].size = torch.Size([7])
    md.state_dict_metadata["model.b"].chunks[0].sizes = torch.Size([7])
    with open(p, "wb") as f:
        pickle.dump(md, f)
    r = dcpio.run("dumpall", bad, os.path.join(tmp, "d3"), expect_ok=False)
    check.true(r.returncode != 0 and "DCP_EFORMAT" in r.stderr and
               "'model.b'" in r.stderr and "__2.metadata" in r.stderr,
               r.stderr)
    empty = os.path.join(tmp, "empty")
    os.makedirs(empty)
    r = dcpio.run("dumpall", empty, os.path.join(tmp, "d4"), expect_ok=False)
    check.true(r.returncode != 0 and "DCP_ENOENT" in r.stderr, r.stderr)


if __name__ == "__main__":
    R.main()
