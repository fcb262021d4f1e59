"""dcp_torch's CUDA path on a machine without a GPU: tensor entries in
device memory (DCP_MEM_CUDA, the 8th item of a tensor entry) through the
extension, against tests/cuda's fake libcudart (DCP_FAKE_CUDART names its
file; its "device" memory is a PROT_NONE mapping the host cannot touch, so
a device pointer dereferenced on the host crashes the test, and it counts
asynchronous copies into memory that is not page-locked). Each case runs
in a fresh interpreter with DCP_CUDART pointing at the fake.

What runs: a synchronous and an asynchronous save from device memory, the
async one staged into page-locked buffers only (no pageable copy), read
back bit-exact by dcp_torch.load and by torch's own load, and a load into
device memory. The Python layer's choice of entries for torch CUDA tensors
(api.py: box_source, cuda_ready) needs a CUDA build of torch and a GPU; it
is not exercised here."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

FAKE = os.environ.get("DCP_FAKE_CUDART", "")

CHILD = textwrap.dedent(r"""
    import ctypes, sys
    import torch
    import torch.distributed.checkpoint as tdcp
    import dcp_torch
    from dcp_torch import _engine

    path, fake = sys.argv[1], sys.argv[2]
    cu = ctypes.CDLL(fake)
    N = 3 * 1024 * 1024 + 5  # floats: several staging pieces, an odd tail
    want = torch.randn(N, generator=torch.Generator().manual_seed(7))
    nbytes = N * 4
    dev = ctypes.c_void_p()
    assert cu.cudaMalloc(ctypes.byref(dev), ctypes.c_size_t(nbytes)) == 0
    assert cu.cudaMemcpy(dev, ctypes.c_void_p(want.data_ptr()), ctypes.c_size_t(nbytes), 1) == 0
    code = _engine.tensor_code(want, "w")

    def stats():
        c, p, r, b = (ctypes.c_long() for _ in range(4))
        cu.fake_cudart_stats(ctypes.byref(c), ctypes.byref(p), ctypes.byref(r), ctypes.byref(b))
        return c.value, p.value, r.value, b.value

    def entries(ptr, mem=_engine.MEM_CUDA):
        return [(0, ("w",), code, (N,), (0,), (N,), ptr, mem), (1, ("step",), 3)]

    def check(p):
        got = {"w": torch.zeros(N), "step": 0}
        dcp_torch.load(got, checkpoint_id=p, no_dist=True)
        assert torch.equal(got["w"], want) and got["step"] == 3
        got = {"w": torch.zeros(N), "step": 0}
        tdcp.load(got, checkpoint_id=p, no_dist=True)
        assert torch.equal(got["w"], want) and got["step"] == 3

    ctx = _engine.make_context()
    ctx.save(entries(dev.value), path + "/sync", 0, True, False)
    check(path + "/sync")

    actx = _engine.make_context(staging_budget=0)
    before = stats()
    req = actx.save(entries(dev.value), path + "/async", 0, True, True)
    req.wait()
    after = stats()
    assert after[0] > before[0], (before, after)        # copied on the device's side
    assert after[1] == before[1] == 0, (before, after)  # never into pageable memory
    check(path + "/async")

    # a load into device memory, then back to the host through the fake
    dev2 = ctypes.c_void_p()
    assert cu.cudaMalloc(ctypes.byref(dev2), ctypes.c_size_t(nbytes)) == 0
    vals = ctx.load(entries(dev2.value)[:1], path + "/async", 1 << 3)
    back = torch.empty(N)
    assert cu.cudaMemcpy(ctypes.c_void_p(back.data_ptr()), dev2, ctypes.c_size_t(nbytes), 2) == 0
    assert torch.equal(back, want)

    # an unknown memory kind is refused by the extension
    try:
        ctx.save(entries(dev.value, 7), path + "/bad", 0, True, False)
    except ValueError as e:
        assert "memory kind" in str(e)
    else:
        raise AssertionError("mem 7 accepted")
    print("ok", stats())
""")


@pytest.mark.skipif(not FAKE, reason="DCP_FAKE_CUDART not set (ctest sets it)")
def test_device_entries_fake_cudart(tmp_path):
    env = dict(os.environ, DCP_CUDART=FAKE)
    r = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), FAKE], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, (r.returncode, r.stdout, r.stderr[-4000:])


def test_missing_cudart_is_not_supported(tmp_path):
    """DCP_CUDART naming no file: a device entry fails with
    NotSupportedError naming the key (no crash, nothing committed)."""
    child = textwrap.dedent(r"""
        import sys
        import dcp_torch
        from dcp_torch import _engine
        ctx = _engine.make_context()
        try:
            ctx.save([(0, ("w",), _engine.dtype_code(__import__("torch").float32), (4,), (0,),
                       (4,), 4096, _engine.MEM_CUDA)], sys.argv[1], 0, True, False)
        except dcp_torch.NotSupportedError as e:
            assert "'w'" in str(e) or "w" in e.message, str(e)
            print("refused", e)
        else:
            raise AssertionError("saved without libcudart")
        import os
        assert not os.path.exists(os.path.join(sys.argv[1], ".metadata"))
    """)
    env = dict(os.environ, DCP_CUDART=str(tmp_path / "no-such-libcudart.so"))
    r = subprocess.run([sys.executable, "-c", child, str(tmp_path / "ck")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "refused" in r.stdout, (r.returncode, r.stdout, r.stderr[-4000:])
