"""Strided boxes (dcp_state_add_tensor_strided): PyTorch loads them as it
loads packed ones.

interop_state saves each box from the interior of an allocation one element
larger on each side of every dimension (DCP_INTEROP_STRIDED=1; the ghost
elements hold 0xee bytes, which must never reach the checkpoint), sync and
async through a 64 KiB staging budget. PyTorch 2.13's dcp.load gives every
tensor bit-exact (every dtype, 0-d to 8-d, several boxes per tensor), and
the data file equals the one saved from packed buffers, byte for byte but
for the records' save ids.
"""

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcpio  # noqa: E402  (fails loudly without torch)
from dcpio import torch  # noqa: E402
import torch.distributed.checkpoint as tdcp  # noqa: E402

R = dcpio.Runner("strided")


def mask_sids(p):
    """The records' save ids replaced by '0's (tests/sidmask.h)."""
    p = bytearray(p)
    i, n, k = 0, len(p), 0
    while i + 6 <= n:
        if p[i] == 0x53 and p[i + 1] == 0x49 and p[i + 4] == 1 and \
                p[i + 5] == 0:
            ln = p[i + 2] | (p[i + 3] << 8)
            if 3 <= ln and ln - 2 <= 64 and ln <= n - i - 4:
                p[i + 6:i + 4 + ln] = b"0" * (ln - 2)
                k += 1
                i += 4 + ln
                continue
        i += 1
    return bytes(p), k


def data_file(ck):
    with open(os.path.join(ck, "__0_0.distcp"), "rb") as f:
        return f.read()


def save(state, ck, tmp, strided, mode="savefrom", boxes=None):
    old = os.environ.pop("DCP_INTEROP_STRIDED", None)
    if strided:
        os.environ["DCP_INTEROP_STRIDED"] = "1"
    try:
        dcpio.dcp_save_manifest(state, ck, tmp, boxes=boxes, mode=mode)
    finally:
        os.environ.pop("DCP_INTEROP_STRIDED", None)
        if old is not None:
            os.environ["DCP_INTEROP_STRIDED"] = old


def check_same_files(check, a, b, what):
    pa, ka = mask_sids(data_file(a))
    pb, kb = mask_sids(data_file(b))
    check.true(ka > 0 and ka == kb, f"{what}: save ids in every record")
    check.true(pa == pb, f"{what}: data file equal to the packed save's")


@R.test
def every_dtype_and_rank(check, tmp):
    state = dcpio.full_state()
    packed = os.path.join(tmp, "packed")
    save(state, packed, tmp, False)
    for mode in ("savefrom", "savefrom-async"):
        ck = os.path.join(tmp, mode)
        save(state, ck, tmp, True, mode=mode)
        tmpl = dcpio.zeros_template(state)
        tdcp.load(tmpl, checkpoint_id=ck)
        check.none(dcpio.nested_identical(state, tmpl),
                   f"{mode}: torch dcp.load of the strided save")
        check_same_files(check, ck, packed, mode)


@R.test
def several_boxes(check, tmp):
    rng = random.Random(7)
    t = dcpio.random_tensor(torch.float64, (66, 50), rng)
    u = dcpio.random_tensor(torch.bfloat16, (6, 8, 10), rng)
    state = {"field": t, "brick": u}
    boxes = {
        "field": [((0, 0), (33, 50)), ((33, 0), (33, 25)),
                  ((33, 25), (33, 25))],
        "brick": [((0, 0, 0), (6, 8, 5)), ((0, 0, 5), (6, 8, 5))],
    }
    packed = os.path.join(tmp, "packed")
    ck = os.path.join(tmp, "strided")
    save(state, packed, tmp, False, boxes=boxes)
    save(state, ck, tmp, True, boxes=boxes)
    tmpl = dcpio.zeros_template(state)
    tdcp.load(tmpl, checkpoint_id=ck)
    check.none(dcpio.nested_identical(state, tmpl), "torch dcp.load")
    check_same_files(check, ck, packed, "boxes")


if __name__ == "__main__":
    R.main()
