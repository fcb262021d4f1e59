"""What the three tutorial programs share: process groups on CPU (gloo,
a rendezvous file), the module standing in for
torch.distributed.checkpoint (dcp_torch, or torch's own with --lib torch),
and the full-state reference each run compares against."""

import atexit
import os
import shutil
import tempfile

import torch
import torch.distributed as dist

# The runs that use torch's DCP alone (--save-lib/--load-lib torch) import
# dcp_torch too, for its exit grace only: torch's gloo workers can still be
# freeing the last collective's tensors when a rank returns, and a worker
# that waits for the GIL while the interpreter finalizes aborts the process
# (SIGABRT after the work is done; dcp_torch/_exit.py). Runs on dcp_torch
# have it anyway; these would fail now and then for torch's own reason.
import dcp_torch._exit  # noqa: E402,F401


def rendezvous() -> str:
    """Where the ranks of one mp.spawn meet: a file in a fresh directory
    (torch's FileStore; removed at exit). Not a TCP port: a port found free
    and then bound races with every other process on the machine, the test
    suites beside this run and gloo's own connections (EADDRINUSE)."""
    d = tempfile.mkdtemp(prefix="dcp_tutorial_")
    atexit.register(shutil.rmtree, d, True)
    return os.path.join(d, "store")


def setup(rank: int, world_size: int, store: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world_size)


def cleanup() -> None:
    dist.destroy_process_group()


def checkpoint_module(lib: str):
    """The module the program calls `dcp`: the one line that changes."""
    if lib == "torch":
        import torch.distributed.checkpoint as dcp
    else:
        import dcp_torch as dcp
    return dcp


def full_state(model, optimizer):
    """The whole (unsharded) model and optimizer state, on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    msd, osd = get_state_dict(model, optimizer,
                              options=StateDictOptions(full_state_dict=True, cpu_offload=False))
    def plain(v):
        if isinstance(v, torch.Tensor):
            return v.detach().clone()
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v
    return plain({"model": msd, "optim": osd})


def assert_equal_states(a, b, path="state"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a, b), f"{path} differs"
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{path}: keys {sorted(set(a) ^ set(b))}"
        for k in a:
            assert_equal_states(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal_states(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"
