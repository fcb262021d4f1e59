"""Every dtype torch 2.13 can put in a DCP checkpoint beyond the classic
twelve: complex32/64/128, uint16/32/64, float8_e4m3fnuz/e5m2fnuz/e8m0fnu,
float4_e2m1fn_x2 (the list is checked against torch: each of these is
written by torch.distributed.checkpoint.save on the CPU; the bits*, int1..7,
uint1..7 and quantized dtypes are not).

torch writes a checkpoint with one tensor of each next to ordinary ones (a
RoPE complex64 freqs_cis buffer among them): dcptool ls and info name every
dtype as torch does, dcp loads each bit-exact into a buffer of the same
dtype, loads the other keys alone (partial) and cats them. dcp writes each
dtype and torch's own dcp.load reads it bit-exact; dcptool export to a
torch.save file (ComplexFloatStorage, or UntypedStorage + dtype, as torch
writes them) is read by torch.load bit-exact.
"""

import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcpio  # noqa: E402  (fails loudly without torch)
from dcpio import torch  # noqa: E402
import torch.distributed.checkpoint as tdcp  # noqa: E402
import warnings  # noqa: E402

warnings.filterwarnings("ignore", message=".*ComplexHalf support.*")

R = dcpio.Runner("exotic_dtypes")

EXOTIC = [torch.complex32, torch.complex64, torch.complex128, torch.uint16,
          torch.uint32, torch.uint64, torch.float8_e4m3fnuz,
          torch.float8_e5m2fnuz, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2]


def dcptool(*args, expect=0, text=True):
    r = subprocess.run([os.environ["DCPTOOL"]] + [str(a) for a in args],
                       capture_output=True, text=text, timeout=120)
    if r.returncode != expect:
        raise AssertionError(f"dcptool {' '.join(map(str, args))}: exit "
                             f"{r.returncode}, expected {expect}\n{r.stderr}")
    return r


def freqs_cis(dim, end, theta=10000.0):
    """RoPE's complex64 buffer, as Llama computes it."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    t = torch.arange(end, dtype=torch.float32)
    return torch.polar(torch.ones(end, dim // 2), torch.outer(t, freqs))


def state():
    rng = random.Random(18)
    ex = {}
    for dt in EXOTIC:
        name = dcpio.dtype_name(dt)
        ex[name] = dcpio.random_tensor(dt, (3, 5), rng)
        ex[name + ".scalar"] = dcpio.random_tensor(dt, (), rng)
    return {"model": {"w": torch.randn(4, 6), "ids": torch.arange(-5, 5),
                      "rope.freqs_cis": freqs_cis(8, 6)},
            "exotic": ex, "step": 3}


@R.test
def torch_writes_dcp_reads(check, tmp):
    st = state()
    ck = os.path.join(tmp, "ck")
    tdcp.save(st, checkpoint_id=ck)
    flat, _ = dcpio.flatten(st)

    rows = {ln.split("\t")[0]: ln.split("\t")[1:]
            for ln in dcptool("ls", ck).stdout.splitlines()}
    for k, v in flat.items():
        if isinstance(v, torch.Tensor):
            check.eq(rows.get(k, [None])[0], dcpio.dtype_name(v.dtype),
                     f"ls: dtype of {k}")
    info = dcptool("info", ck).stdout
    check.true("entries: 24 (23 tensors, 1 values)" in info, info)

    # every tensor, whole, bit-exact (dcp_load and dcp_metadata_read_box)
    dump = dcpio.dcp_dumpall(ck, tmp)
    dcpio.compare_dump(st, dump, check)

    # the ordinary keys alone: a partial load and cat, next to the exotic
    for key, offs, sizes in [("model.w", (1, 2), (2, 3)),
                             ("model.ids", (0,), (10,)),
                             ("model.rope.freqs_cis", (2, 0), (3, 4)),
                             ("exotic.uint64", (1, 1), (2, 3)),
                             ("exotic.float4_e2m1fn_x2", (0, 0), (3, 5))]:
        want = flat[key]
        for d, (o, s) in enumerate(zip(offs, sizes)):
            want = want.narrow(d, o, s)
        for mode in ("loadbox", "readbox"):
            got = dcpio.dcp_box(ck, key, offs, sizes, tmp, mode=mode)
            check.eq(got.hex(), dcpio.tensor_bytes(want).hex(),
                     f"{mode} {key}")
    for key in ("model.w", "model.rope.freqs_cis", "exotic.complex128"):
        got = dcptool("cat", ck, key, text=False).stdout
        check.eq(got.hex(), dcpio.tensor_bytes(flat[key]).hex(), f"cat {key}")


@R.test
def dcp_writes_torch_reads(check, tmp):
    st = state()
    ck = os.path.join(tmp, "ck")
    dcpio.dcp_save_manifest(st, ck, tmp)
    md = tdcp.FileSystemReader(ck).read_metadata()
    flat, _ = dcpio.flatten(st)
    for k, v in flat.items():
        if isinstance(v, torch.Tensor):
            check.eq(md.state_dict_metadata[k].properties.dtype, v.dtype,
                     f"dtype of {k} in dcp's .metadata")
    tmpl = {"model": {k: torch.empty_like(v) for k, v in st["model"].items()},
            "exotic": {k: torch.empty_like(v)
                       for k, v in st["exotic"].items()},
            "step": 0}
    tdcp.load(tmpl, checkpoint_id=ck)
    check.none(dcpio.nested_identical(st, tmpl), "torch's dcp.load")

    # dcptool export to a torch.save file: torch.load reads every dtype
    pt = os.path.join(tmp, "out.pt")
    dcptool("export", ck, pt)
    got = torch.load(pt, weights_only=True)
    check.none(dcpio.nested_identical(st, got), "export -> torch.load")

    # safetensors has uint16/32/64, complex64 and float8_e8m0fnu; a dtype
    # it lacks is refused naming the key, and nothing is written
    sf = os.path.join(tmp, "out.safetensors")
    r = dcptool("export", ck, sf, expect=1)
    check.true("'exotic.complex128" in r.stderr and "complex128" in r.stderr,
               r.stderr)
    check.true(not os.path.exists(sf), "no safetensors after the refusal")
    dcptool("export", ck, sf, "--keys", "model.*", "--keys", "exotic.uint*",
            "--keys", "exotic.complex64*", "--keys", "exotic.float8_e8m0fnu*")
    from safetensors.torch import load_file
    got = load_file(sf)
    check.eq(len(got), 13, "tensors in the safetensors file")
    for k, v in got.items():
        check.none(dcpio.tensors_identical(flat[k], v), f"safetensors {k}")


if __name__ == "__main__":
    R.main()
