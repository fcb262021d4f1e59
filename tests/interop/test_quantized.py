"""A torch 2.13 checkpoint holding a quantized tensor (torch.quantize_per_tensor:
qint8, and quint8), which torch's dcp.save writes but dcp cannot read
(docs/FORMAT.md: the record is a QTensor with its scale and zero point): the
unreadable keys are refused per key, the rest of the checkpoint stays usable.

dcptool ls lists every key, the quantized ones with torch's dtype name marked
unsupported (text and --json); dcptool cat of another key works and of a
quantized one fails (exit 1) naming the key and its dtype, and so does
verify once the rest verified; dcp_load of the
other keys (a partial load of one box, and a strict load of every readable
key) gives torch's bytes exactly; a load naming the quantized key fails with
DCP_ENOTSUP naming it, a partial one too.
"""

import json
import os
import subprocess
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcpio  # noqa: E402  (fails loudly without torch)
from dcpio import torch  # noqa: E402
import torch.distributed.checkpoint as tdcp  # noqa: E402

warnings.filterwarnings("ignore", message=".*quantize.*deprecated.*")
warnings.filterwarnings("ignore", message=".*TypedStorage is deprecated.*")

R = dcpio.Runner("quantized")


def dcptool(*args, expect=0, text=True):
    r = subprocess.run([os.environ["DCPTOOL"]] + [str(a) for a in args],
                       capture_output=True, text=text, timeout=120)
    if r.returncode != expect:
        raise AssertionError(f"dcptool {' '.join(map(str, args))}: exit "
                             f"{r.returncode}, expected {expect}\n{r.stderr}")
    return r


def state():
    g = torch.Generator().manual_seed(29)
    return {"model": {"w": torch.randn(3, 4, generator=g),
                      "q": torch.quantize_per_tensor(
                          torch.tensor([0.5, -1.0, 2.0, 3.5]), 0.5, 3,
                          torch.qint8),
                      "zq": torch.quantize_per_tensor(
                          torch.tensor([[1.0, 2.0]]), 0.25, 10, torch.quint8),
                      "b": torch.arange(-3, 4, dtype=torch.int64)},
            "step": 12}


@R.test
def quantized_refused_per_key(check, tmp):
    ck = os.path.join(tmp, "ck")
    st = state()
    tdcp.save(st, checkpoint_id=ck)

    # ls: every key, the quantized ones marked (sorted by key)
    lines = dcptool("ls", ck).stdout.splitlines()
    check.eq([ln.split("\t")[0] for ln in lines],
             ["model.b", "model.q", "model.w", "model.zq", "step"], "ls keys")
    check.eq(lines[1], "model.q\tqint8 (unsupported)\t[4]\t1\t-", "ls q")
    check.eq(lines[3], "model.zq\tquint8 (unsupported)\t[1,2]\t1\t-",
             "ls zq")
    check.eq(lines[2], "model.w\tfloat32\t[3,4]\t1\t48", "ls w")
    js = json.loads(dcptool("ls", ck, "--json").stdout)
    check.eq([e["key"] for e in js],
             ["model.b", "model.q", "model.w", "model.zq", "step"], "json keys")
    check.eq(js[1], {"key": "model.q", "kind": "tensor", "dtype": "qint8",
                     "unsupported": True, "shape": [4], "chunks": 1,
                     "bytes": None}, "json q")

    # cat: another key works, the quantized one is refused by name
    r = dcptool("cat", ck, "step")
    check.true("12" in r.stdout, f"cat step: {r.stdout!r}")
    r = dcptool("cat", ck, "model.w", text=False)
    check.eq(r.stdout, dcpio.tensor_bytes(st["model"]["w"]), "cat model.w")
    r = dcptool("cat", ck, "model.q", expect=1)
    check.true("'model.q'" in r.stderr and "torch.qint8" in r.stderr and
               "not supported" in r.stderr, r.stderr)

    # verify: the rest verified, the unreadable keys said (DCP_ENOTSUP)
    r = dcptool("verify", ck, expect=1)
    check.true("'model.q'" in r.stderr and "other keys verified" in r.stderr,
               r.stderr)

    # dcp_load of the other keys: bit-exact with torch's tensors
    w = st["model"]["w"]
    got = dcpio.dcp_box(ck, "model.w", [1, 0], [2, 4], tmp)
    check.eq(got, dcpio.tensor_bytes(w[1:3].contiguous()), "loadbox model.w")
    got = dcpio.dcp_box(ck, "model.b", [0], [7], tmp)
    check.eq(got, dcpio.tensor_bytes(st["model"]["b"]), "loadbox model.b")
    dump = dcpio.dcp_dumpall(ck, tmp)
    check.eq(sorted(dump.entries), ["model.b", "model.w", "step"],
             "strict load of every readable key")
    check.none(dcpio.tensors_identical(w, dump.entries["model.w"]["tensor"]),
               "dumpall model.w")

    # a load naming the quantized key: DCP_ENOTSUP naming it (partial too)
    r = dcpio.run("loadbox", ck, "model.q", "0", "4",
                  os.path.join(tmp, "q.bin"), expect_ok=False)
    check.eq(r.returncode, 1, "loadbox model.q exit")
    check.true("DCP_ENOTSUP" in r.stderr and "'model.q'" in r.stderr and
               "qint8" in r.stderr, r.stderr)


if __name__ == "__main__":
    R.main()
