"""The cast table (tests/data/cast_table.bin, which tests/unit/test_cast_table.c
checks dcp__convert against) is what the installed torch 2.13 produces:
tests/data/make_cast_table.py is run again and its output must be the
committed file byte for byte (it is deterministic). Then the casts end to
end: torch writes a checkpoint, dcptool export --dtype casts it, and every
element is torch's own Tensor.to() bit for bit (the values the issue found
wrong included: float64 -> float16 through float32).
"""

import importlib.util
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcpio  # noqa: E402  (fails loudly without torch)
from dcpio import torch  # noqa: E402
import torch.distributed.checkpoint as tdcp  # noqa: E402

R = dcpio.Runner("cast_table")
DATA = os.environ.get("DCP_TEST_DATA",
                      os.path.join(os.path.dirname(__file__), "..", "data"))


def dcptool(*args, expect=0):
    r = subprocess.run([os.environ["DCPTOOL"]] + [str(a) for a in args],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != expect:
        raise AssertionError(f"dcptool {' '.join(map(str, args))}: exit "
                             f"{r.returncode}, expected {expect}\n{r.stderr}")
    return r


@R.test
def table_regenerates(check, tmp):
    spec = importlib.util.spec_from_file_location(
        "make_cast_table", os.path.join(DATA, "make_cast_table.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    got = mod.build()
    with open(os.path.join(DATA, "cast_table.bin"), "rb") as f:
        want = f.read()
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                 None if len(got) == len(want) else min(len(got), len(want)))
    check.true(first is None,
               f"torch {torch.__version__} makes a different table: "
               f"first difference at byte {first} ({len(got)} vs "
               f"{len(want)} bytes)")


@R.test
def export_casts_as_torch(check, tmp):
    f64 = torch.tensor([1 + 2.0**-11 + 2.0**-40, 1 + 2.0**-8 + 2.0**-30,
                        65519.99, 3.0e-8, -0.0, 2.0**-24 * 1.5000001,
                        448.0 + 2.0**-30, 1e300, float("inf"), 0.1, 1 / 3],
                       dtype=torch.float64)
    f32 = torch.tensor([2.0**60 + 2.0**37, 1 + 2.0**-11, 3.3e38, 1e-40,
                        -2.5, 0.1], dtype=torch.float32)
    state = {"f64": f64, "f32": f32, "f16": torch.arange(-8, 8).half() / 3}
    ck = os.path.join(tmp, "ck")
    tdcp.save(state, checkpoint_id=ck)
    for dt in (torch.float16, torch.bfloat16, torch.float8_e4m3fn,
               torch.float8_e5m2, torch.float32):
        out = os.path.join(tmp, f"{dcpio.dtype_name(dt)}.pt")
        dcptool("export", ck, out, "--dtype", dcpio.dtype_name(dt),
                "--allow-overflow")
        got = torch.load(out, weights_only=True)
        for k, v in state.items():
            check.none(dcpio.tensors_identical(v.to(dt), got[k]),
                       f"{k} -> {dt}")


if __name__ == "__main__":
    R.main()
