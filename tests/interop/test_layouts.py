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
import shutil
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

def unflat_state():
    rng = random.Random(1847)
    base = torch.arange(24, dtype=torch.float32) * 0.5
    return {"model": {"w": torch.randn(5, 3),
                      "b": dcpio.random_tensor(torch.bfloat16, (4, 2), rng),
                      "h": dcpio.random_tensor(torch.float16, (3,), rng),
                      "ids": torch.arange(-3, 9, dtype=torch.int32),
                      "flag": torch.tensor([True, False, True]),
                      "base": base,
                      "view": base[5:17].view(3, 4),  # storage_offset 5
                      "tr": torch.randn(4, 6).t(),    # strides (1, 6)
                      "s": torch.tensor(2.5, dtype=torch.float64),  # 0-d
                      "empty": torch.empty(0, 4),
                      "lst": [torch.ones(2, 2), torch.arange(3)],
                      "cfg": {"lr": 0.1, "n": 3, "name": "run",
                              "betas": (0.9, 0.95), 7: "int key"}},
            "opt": [{"m": torch.randn(3)}, {"m": torch.randn(2)}],
            "lst": [torch.ones(2), torch.zeros(3, dtype=torch.float64)],
            "step": 3, "top": torch.randn(4, 3),
            "plain": {"a": 11}}


@R.test
def unflattened_torch_writes_dcp_reads(check, tmp):
    """DefaultSavePlanner(flatten_state_dict=False): a top-level tensor is
    a tensor entry, a nested dict or list one value entry (torch.save of the
    container, its tensors inside), no planner_data. dcp lists the leaves
    of each value holding tensors under the names torch's
    flatten_state_dict gives them (model.w, model.lst.0, model.cfg.lr,
    opt.0.m) and reads every leaf bit-exact: ls, cat, verify, export,
    dcp_load whole and boxes, and boxes on 2 MPI ranks. Views with a
    storage offset and transposed strides read as torch rebuilds them."""
    from torch.distributed.checkpoint import DefaultSavePlanner
    st = unflat_state()
    ck = os.path.join(tmp, "ck")
    tdcp.save(st, checkpoint_id=ck,
              planner=DefaultSavePlanner(flatten_state_dict=False))
    md = tdcp.FileSystemReader(ck).read_metadata()
    check.eq(sorted(md.state_dict_metadata),
             ["lst", "model", "opt", "plain", "step", "top"], "torch's keys")
    check.eq(md.planner_data, None, "no planner_data")
    flat, _ = dcpio.flatten(st)
    # torch's flatten keeps the plain dict "plain" as leaves too; dcp keeps
    # a value without tensors as one entry, as stored
    want = {k: v for k, v in flat.items() if not k.startswith("plain.")}
    rows = {ln.split("\t")[0]: ln.split("\t")[1:]
            for ln in dcptool("ls", ck).stdout.splitlines()}
    check.eq(sorted(rows), sorted(list(want) + ["plain"]), "ls keys")
    for k, v in want.items():
        if isinstance(v, torch.Tensor):
            check.eq(rows.get(k, [None, None])[:2],
                     [dcpio.dtype_name(v.dtype),
                      "[" + ",".join(map(str, v.shape)) + "]"],
                     f"ls: dtype and shape of {k}")
        else:
            check.eq(rows.get(k, [None])[0], "value", f"ls: {k} a value")
    for k, v in want.items():
        if isinstance(v, torch.Tensor):
            got = dcptool("cat", ck, k, text=False).stdout
            check.eq(got.hex(), dcpio.tensor_bytes(v).hex(), f"cat {k}")
    check.eq(dcptool("cat", ck, "model.cfg.name").stdout.strip(), '"run"',
             "cat model.cfg.name")
    check.eq(dcptool("cat", ck, "model.cfg.7").stdout.strip(), '"int key"',
             "cat model.cfg.7 (int dict key, str() as torch names it)")
    dcptool("verify", ck)
    # dcp_load of everything (dumpall), bit-exact, planner paths as torch's
    dump = dcpio.dcp_dumpall(ck, tmp)
    check.eq(sorted(dump.entries), sorted(list(want) + ["plain"]),
             "dumped keys")
    _, mapping = dcpio.flatten(st)
    for k, v in want.items():
        e = dump.entries.get(k)
        if e is None:
            continue
        check.eq(e["path"], tuple(mapping[k]), f"path of {k}")
        if isinstance(v, torch.Tensor):
            check.none(dcpio.tensors_identical(v, e.get("tensor")), k)
        else:
            check.none(dcpio.values_identical(v, e.get("value"), k), k)
    # boxes (dcp_load of a part, and the inspection read)
    for key, offs, sizes in (("model.w", (1, 0), (3, 3)),
                             ("model.view", (1, 1), (2, 2)),
                             ("model.tr", (2, 1), (3, 2)),
                             ("model.lst.1", (1,), (2,)),
                             ("top", (1, 0), (2, 3))):
        for mode in ("loadbox", "readbox"):
            got = dcpio.dcp_box(ck, key, offs, sizes, tmp, mode=mode)
            check.eq(got.hex(), dcpio.tensor_bytes(
                dcpio.slice_of(want[key], offs, sizes)).hex(),
                f"{mode} {key} {offs} {sizes}")
    # export: torch.load of the file equals the flattened state
    pt = os.path.join(tmp, "out.pt")
    dcptool("export", ck, pt)
    back = torch.load(pt, weights_only=True)
    for k in ("w", "b", "view", "tr", "s", "empty"):
        check.none(dcpio.tensors_identical(st["model"][k], back["model"][k]),
                   f"export model.{k}")
    check.none(dcpio.tensors_identical(st["opt"][1]["m"],
                                       back["opt"][1]["m"]), "export opt.1.m")
    # a value of 300 tensors: its archive has more entries than a tensor
    # record may (64); every one is read
    many = {f"p{i}": torch.full((i % 5 + 1,), float(i)) for i in range(300)}
    ck4 = os.path.join(tmp, "ck4")
    tdcp.save({"m": many}, checkpoint_id=ck4,
              planner=DefaultSavePlanner(flatten_state_dict=False))
    rows = dcptool("ls", ck4).stdout.splitlines()
    check.eq(len(rows), 300, "300 tensors listed")
    dump = dcpio.dcp_dumpall(ck4, tmp, name="dump4")
    check.eq(sorted(dump.entries), sorted(f"m.{k}" for k in many),
             "300 tensors loaded")
    bad = [k for k, v in many.items()
           if dcpio.tensors_identical(v, dump.entries.get(
               f"m.{k}", {}).get("tensor")) is not None]
    check.eq(bad, [], "300 tensors bit-exact")
    # 2 MPI ranks load row halves of model.w and model.view, the rest whole
    # (a checkpoint without the plain dict, which a template cannot name)
    if os.environ.get("DCP_PROG_interop_state_mpi"):
        st3 = {k: v for k, v in st.items() if k != "plain"}
        ck3 = os.path.join(tmp, "ck3")
        tdcp.save(st3, checkpoint_id=ck3,
                  planner=DefaultSavePlanner(flatten_state_dict=False))
        tmpl = dcpio.zeros_template(st3)
        halves = {0: {"model.w": [((0, 0), (3, 3))],
                      "model.view": [((0, 0), (2, 4))]},
                  1: {"model.w": [((3, 0), (2, 3))],
                      "model.view": [((2, 0), (1, 4))]}}
        for r in (0, 1):
            dcpio.write_manifest(tmpl, os.path.join(tmp, "in", str(r)),
                                 boxes=halves[r], files=False)
        os.makedirs(os.path.join(tmp, "out"))
        res = dcpio.mpiexec(2, "loadinto",
                            os.path.join(tmp, "in", "{rank}", "manifest"),
                            ck3, os.path.join(tmp, "out", "{rank}"), tmp=tmp)
        if check.eq(res.returncode, 0, f"mpiexec loadinto: {res.stderr}"):
            for r in (0, 1):
                got = dcpio.read_manifest(os.path.join(tmp, "out", str(r)),
                                          boxes=True)
                check.eq(len(got.boxes), len([k for k, v in want.items()
                                              if isinstance(v, torch.Tensor)
                                              ]),
                         f"rank {r}: every tensor written back")
                for b in got.boxes:
                    w = dcpio.slice_of(want[b["key"]], b["offsets"],
                                       b["sizes"])
                    check.none(dcpio.tensors_identical(w, b["tensor"]),
                               f"rank {r}: {b['key']} {b['offsets']}")
                for k in ("model.cfg.lr", "model.cfg.betas", "step"):
                    check.none(dcpio.values_identical(
                        want[k], got.entries.get(k, {}).get("value"), k),
                        f"rank {r}: value {k}")


def _pk_str(s):
    b = s.encode()
    return b"X" + len(b).to_bytes(4, "little") + b


def _pk_int(i):
    return b"J" + i.to_bytes(4, "little", signed=True)


def _pk_tuple(items):
    return b"(" + b"".join(items) + b"t"


def _tensor_pkl(key, numel, size, stride, offset=0,
                storage=b"ctorch\nFloatStorage\n"):
    """A _rebuild_tensor_v2 expression (protocol 2) as torch.save writes
    it, with the given storage key, numel, view."""
    return (b"ctorch._utils\n_rebuild_tensor_v2\n" + b"(" +
            _pk_tuple([_pk_str("storage"), storage, _pk_str(key),
                       _pk_str("cpu"), _pk_int(numel)]) + b"Q" +
            _pk_int(offset) + _pk_tuple([_pk_int(x) for x in size]) +
            _pk_tuple([_pk_int(x) for x in stride]) + b"\x89" +
            b"ccollections\nOrderedDict\n)R" + b"tR")


def _dict_pkl(items):
    """{name: expression} as a protocol-2 pickle."""
    body = b"".join(_pk_str(k) + v for k, v in items)
    return b"\x80\x02}(" + body + b"u."


def _splice_value(ck, key, pkl, storages):
    """Appends a record (a zip: archive/data.pkl, archive/data/<k>) to the
    data file of value entry key and points its _StorageInfo there."""
    import io
    import pickle
    import zipfile
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", "little")
        for k, data in storages.items():
            z.writestr(f"archive/data/{k}", data)
        z.writestr("archive/version", "3\n")
    rec = buf.getvalue()
    mdp = os.path.join(ck, ".metadata")
    with open(mdp, "rb") as f:
        m = pickle.load(f)
    for i, info in m.storage_data.items():
        if i.fqn == key:
            path = os.path.join(ck, info.relative_path)
            off = os.path.getsize(path)
            off += (-off) % 64
            with open(path, "ab") as f:
                f.write(b"\0" * (off - os.path.getsize(path)))
                f.write(rec)
            info.offset, info.length = off, len(rec)
    with open(mdp, "wb") as f:
        pickle.dump(m, f)


@R.test
def unflattened_hostile(check, tmp):
    """A value record holding tensors whose pickle is hostile is refused
    alone (DCP_EFORMAT naming the value and the member), listed as one
    value; the other entries stay readable. Checked: a view past its
    storage, a storage record missing, one of the wrong length, a
    negative storage offset, a disallowed global, two leaves of one name;
    and a well-formed spliced record reads (the test's own writer is
    right). Written by torch: a tuple of tensors inside the dict, more
    than 64 archive entries, a compressed record, a top-level tuple:
    refused alone, as documented."""
    from torch.distributed.checkpoint import DefaultSavePlanner
    st = {"model": {"w": torch.ones(2)}, "top": torch.arange(6.0)}
    ck = os.path.join(tmp, "ck")
    tdcp.save(st, checkpoint_id=ck,
              planner=DefaultSavePlanner(flatten_state_dict=False))
    good = bytes(range(24))  # 6 floats
    cases = [
        ("good", _dict_pkl([("a", _tensor_pkl("0", 6, (2, 3), (3, 1))),
                            ("n", _pk_int(5))]), {"0": good}, None),
        ("past", _dict_pkl([("a", _tensor_pkl("0", 6, (2, 4), (4, 1)))]),
         {"0": good}, "DCP_EFORMAT"),
        ("offset", _dict_pkl([("a", _tensor_pkl("0", 6, (2, 3), (3, 1),
                                                offset=1))]),
         {"0": good}, "DCP_EFORMAT"),
        ("negoff", _dict_pkl([("a", _tensor_pkl("0", 6, (2,), (1,),
                                                offset=-1))]),
         {"0": good}, "DCP_EFORMAT"),
        ("missing", _dict_pkl([("a", _tensor_pkl("1", 6, (6,), (1,)))]),
         {"0": good}, "DCP_EFORMAT"),
        ("short", _dict_pkl([("a", _tensor_pkl("0", 6, (6,), (1,)))]),
         {"0": good[:20]}, "DCP_EFORMAT"),
        ("repeat", b"\x80\x02}(" + _pk_str("a") + b"}(" + _pk_str("b") +
         _tensor_pkl("0", 6, (6,), (1,)) + b"u" + _pk_str("a.b") +
         _pk_int(1) + b"u.", {"0": good}, "DCP_EFORMAT"),
        ("global", _dict_pkl([("a", _tensor_pkl("0", 6, (6,), (1,))),
                              ("x", b"cos\nsystem\n")]),
         {"0": good}, "DCP_EUNSAFE"),
    ]
    for name, pkl, storages, err in cases:
        bad = os.path.join(tmp, name)
        shutil.copytree(ck, bad)
        _splice_value(bad, "model", pkl, storages)
        rows = {ln.split("\t")[0]: ln.split("\t")[1:]
                for ln in dcptool("ls", bad).stdout.splitlines()}
        got = dcptool("cat", bad, "top", text=False).stdout
        check.eq(got.hex(), dcpio.tensor_bytes(st["top"]).hex(),
                 f"{name}: top still reads")
        if err is None:
            check.eq(sorted(rows), ["model.a", "model.n", "top"],
                     f"{name}: ls")
            got = dcptool("cat", bad, "model.a", text=False).stdout
            check.eq(got, good, f"{name}: cat model.a")
            check.eq(dcptool("cat", bad, "model.n").stdout.strip(), "5",
                     f"{name}: cat model.n")
            continue
        check.eq(sorted(rows), ["model", "top"], f"{name}: ls")
        r = dcptool("cat", bad, "model", expect=1)
        check.true("'model'" in r.stderr and
                   (err != "DCP_EFORMAT" or "member" in r.stderr),
                   f"{name}: {r.stderr}")
        r = dcpio.run("dumpall", bad, os.path.join(tmp, "d" + name),
                      expect_ok=False)
        check.true(r.returncode != 0 and err in r.stderr and
                   "'model'" in r.stderr, f"{name}: {r.stderr}")
    # written by torch: a tuple holding tensors inside the nested dict (a
    # leaf torch's flatten keeps whole), a compressed record: each refused
    # alone, the other entries read
    for name, value, ext, err, what in (
            ("pair", {"w": torch.ones(2), "pair": (torch.ones(1),)}, None,
             "DCP_ENOTSUP", "member 'model.pair'"),
            ("zstd", {"w": torch.ones(2)}, [ZStandard()], "DCP_ENOTSUP",
             "holds torch tensors")):
        ckn = os.path.join(tmp, "ck_" + name)
        tdcp.save({"model": value, "top": st["top"]},
                  storage_writer=tdcp.FileSystemWriter(
                      ckn, _extensions=ext) if ext else
                  tdcp.FileSystemWriter(ckn),
                  planner=DefaultSavePlanner(flatten_state_dict=False))
        rows = {ln.split("\t")[0] for ln in
                dcptool("ls", ckn).stdout.splitlines()}
        check.eq(sorted(rows), ["model", "top"], f"{name}: ls")
        got = dcptool("cat", ckn, "top", text=False).stdout
        check.eq(got.hex(), dcpio.tensor_bytes(st["top"]).hex(),
                 f"{name}: top still reads")
        r = dcpio.run("dumpall", ckn, os.path.join(tmp, "dn" + name),
                      expect_ok=False)
        check.true(r.returncode != 0 and err in r.stderr and
                   "'model'" in r.stderr and what in r.stderr,
                   f"{name}: {r.stderr}")
    # the plain layouts are unchanged: a top-level tuple of tensors is
    # not a nested state (torch's flatten keeps it a leaf): refused alone
    ck2 = os.path.join(tmp, "ck2")
    tdcp.save({"tup": (torch.ones(2), torch.zeros(3)), "top": torch.ones(1)},
              checkpoint_id=ck2,
              planner=DefaultSavePlanner(flatten_state_dict=False))
    rows = {ln.split("\t")[0]: ln.split("\t")[1:]
            for ln in dcptool("ls", ck2).stdout.splitlines()}
    check.eq(sorted(rows), ["top", "tup"], "tuple: ls")
    r = dcptool("cat", ck2, "tup", expect=1)
    check.true("'tup'" in r.stderr and "holds torch tensors" in r.stderr,
               r.stderr)


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
