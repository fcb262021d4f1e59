"""PyTorch saves (torch.distributed.checkpoint.save, single process), dcp
loads (interop_state dumpall / loadbox / readbox); everything bit-exact.

Covers every dtype dcp knows, 0-d to 8-d, empty and non-contiguous tensors
(torch keeps a transpose's strides on disk), values of every kind, nested
dicts, list-index paths, and FileSystemWriter's file layouts.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcpio  # noqa: E402  (fails loudly without torch)
from dcpio import torch  # noqa: E402
import torch.distributed.checkpoint as tdcp  # noqa: E402
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter  # noqa: E402

R = dcpio.Runner("torch_to_dcp")


def torch_save(state, ck, **writer_kw):
    if writer_kw:
        tdcp.save(state, storage_writer=FileSystemWriter(ck, **writer_kw))
    else:
        tdcp.save(state, checkpoint_id=ck)


@R.test
def full_state_every_dtype(check, tmp):
    state = dcpio.full_state()
    ck = os.path.join(tmp, "ck")
    torch_save(state, ck)
    dump = dcpio.dcp_dumpall(ck, tmp)
    dcpio.compare_dump(state, dump, check)
    flat, _ = dcpio.flatten(state)
    check.eq(dump.meta.get("version"), "1.0.0", "metadata version")
    check.eq(dump.meta.get("entries"), len(flat), "entry count")
    for key, n in dump.nchunks.items():
        check.eq(n, 1, f"chunks of {key}")
    # The non-contiguous tensors really were stored with their strides: the
    # test is only meaningful if torch kept them.
    md = FileSystemReader(ck).read_metadata()
    check.true("model.float32.transposed" in md.state_dict_metadata,
               "transposed tensor present in torch's metadata")


@R.test
def list_index_paths(check, tmp):
    # Lists holding tensors are expanded by torch: paths end in an int.
    state = dcpio.list_state()
    ck = os.path.join(tmp, "ck")
    torch_save(state, ck)
    dump = dcpio.dcp_dumpall(ck, tmp)
    dcpio.compare_dump(state, dump, check)


@R.test
def writer_layouts(check, tmp):
    # Several data files per rank, and one file per item.
    state = {"model": {k: v for k, v in dcpio.full_state()["model"].items()
                       if k.startswith(("float32", "bfloat16", "int8"))},
             "extra": {"step": 11, "name": "run-1"}}
    for i, kw in enumerate([{"thread_count": 3},
                            {"single_file_per_rank": False}]):
        ck = os.path.join(tmp, f"ck{i}")
        torch_save(state, ck, **kw)
        ndata = len([f for f in os.listdir(ck) if f.endswith(".distcp")])
        check.true(ndata > 1, f"{kw}: torch wrote {ndata} data files")
        dump = dcpio.dcp_dumpall(ck, tmp, name=f"dump{i}")
        dcpio.compare_dump(state, dump, check)


@R.test
def boxes_of_torch_tensors(check, tmp):
    state = dcpio.full_state()
    ck = os.path.join(tmp, "ck")
    torch_save(state, ck)
    model = state["model"]
    cases = [  # (name in state["model"], offsets, sizes)
        ("float32.transposed", (1, 1), (2, 2)),   # strided on disk
        ("bfloat16.permuted", (1, 0, 1), (3, 2, 2)),
        ("int16.2x1x2x1x2x1x2x1", (1, 0, 1, 0, 0, 0, 1, 0),
         (1, 1, 1, 1, 2, 1, 1, 1)),
        ("float8_e5m2.3x5", (0, 2), (3, 3)),
        ("bool.2x3x4", (1, 1, 0), (1, 2, 4)),
        ("float64.scalar", (), ()),
        ("float32.3x5", (1, 0), (0, 5)),          # an empty box
        ("layout.channels_last", (0, 1, 1, 2), (2, 2, 3, 3)),
    ]
    for name, offs, sizes in cases:
        want = model[name]
        for d, (o, s) in enumerate(zip(offs, sizes)):
            want = want.narrow(d, o, s)
        for mode in ("loadbox", "readbox"):
            what = f"{mode} model.{name} offsets {offs} sizes {sizes}"
            try:
                got = dcpio.dcp_box(ck, "model." + name, offs, sizes, tmp,
                                    mode=mode)
            except AssertionError as exc:
                check.true(False, f"{what}: {exc}")
                continue
            check.eq(got.hex(), dcpio.tensor_bytes(want).hex(), what)


if __name__ == "__main__":
    R.main()
