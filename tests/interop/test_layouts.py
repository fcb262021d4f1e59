"""Checkpoint layouts torch 2.13 writes beyond the plain one (issue 18).

ZStandard-compressed records: torch's FileSystemWriter(_extensions=
[ZStandard()]) compresses each record's torch.save archive into zstd frames
and records ["stream.zstd/1"] in its _StorageInfo.transform_descriptors.
dcptool ls, info, cat, verify and export read such a checkpoint, and
dcp_load reads every tensor and value bit-exact (whole and boxes).
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


if __name__ == "__main__":
    R.main()
