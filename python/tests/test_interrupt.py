"""A SIGINT (Ctrl-C) while a save is writing: dcp_torch.save and the
drop-in writer under torch.distributed.checkpoint.save, in one process and
on 2 gloo ranks (the signal to every rank, or to rank 0 alone).

The signal is sent to the main thread (signal.pthread_kill, so that the
engine's own system calls there may see EINTR) by a thread that waits for
this rank's first data file of the new save to appear: it lands while the
engine writes, with the GIL released. What must hold (python/README.md,
"Interrupting a save"):

* dcp_torch.save runs the save to its end (the signal is acted on when the
  call ends, alike on every rank), then raises KeyboardInterrupt on each
  rank the signal reached: the new checkpoint is committed whole;
* the drop-in writer: the write raises KeyboardInterrupt when the engine's
  call returns, and torch wraps it (as it wraps every storage error) in a
  CheckpointException raised on every rank: nothing is committed, the
  previous checkpoint (or none) is what the directory holds;
* either way the exception comes no later than the rest of the save takes,
  no lock is left, and the next save in the same process (a new writer)
  succeeds and removes the interrupted save's files.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as tdcp
from torch.distributed.checkpoint.api import CheckpointException

import dcp_torch
from conftest import run_ranks

warnings.filterwarnings("ignore")

# 16 tensors of 8 MiB a rank, written one request at a time (io_depth 1):
# the write takes tens of milliseconds at least, the poll below 1 ms.
NT, NEL = 16, 2 * 1024 * 1024


def state(seed: int, rank: int = 0) -> dict:
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return {f"r{rank}.t{i}": torch.randn(NEL, generator=g) for i in range(NT)}


def save(kind: str, sd: dict, path: str, no_dist: bool) -> None:
    if kind == "api":
        dcp_torch.save(sd, checkpoint_id=path, no_dist=no_dist, io_depth=1)
    else:
        tdcp.save(sd, storage_writer=dcp_torch.FileSystemWriter(path, io_depth=1),
                  no_dist=no_dist)


def load_equal(path: str, seed: int, rank: int, no_dist: bool) -> None:
    want = state(seed, rank)
    got = {k: torch.zeros_like(v) for k, v in want.items()}
    dcp_torch.load(got, checkpoint_id=path, no_dist=no_dist)
    for k in want:
        assert torch.equal(got[k], want[k]), k


def interrupted_save(kind: str, sd: dict, path: str, rank: int, no_dist: bool, signal_me: bool):
    """The save of sd with a SIGINT to this process's main thread once its
    first new data file is there (signal_me); returns (what the save raised
    or None, seconds from the signal to the call's end)."""
    before = set(os.listdir(path)) if os.path.isdir(path) else set()
    main = threading.main_thread().ident
    sent: list[float] = []

    def killer():
        while True:
            names = os.listdir(path) if os.path.isdir(path) else []
            if any(n.startswith(f"__{rank}_") and n not in before for n in names):
                break
            time.sleep(0.0005)
        sent.append(time.monotonic())
        signal.pthread_kill(main, signal.SIGINT)

    th = threading.Thread(target=killer, daemon=True) if signal_me else None
    raised, returned, end = None, False, 0.0
    try:
        try:
            if th:
                th.start()
            save(kind, sd, path, no_dist)
            returned = True
        finally:
            end = time.monotonic()
            if th:
                th.join()
                time.sleep(0.05)  # a signal sent after the call would be raised here
    except BaseException as e:  # noqa: BLE001 - what the save raised is checked
        raised = e
    if signal_me:
        assert sent, "the signal was never sent"
        assert not (returned and isinstance(raised, KeyboardInterrupt)), \
            "the signal came after the save had returned: the write was too quick"
        return raised, end - sent[0]
    return raised, 0.0


def check_outcome(kind: str, raised, signalled: bool, world: int) -> None:
    if kind == "api":
        if signalled:
            assert type(raised) is KeyboardInterrupt, repr(raised)
        else:
            assert raised is None, repr(raised)
        return
    # torch wraps what the writer raised, on every rank
    assert type(raised) is CheckpointException, repr(raised)
    fails = raised.failures
    assert set(fails) <= set(range(world)) and fails, fails
    for exc, _ in fails.values():
        assert type(exc) is KeyboardInterrupt, repr(exc)


def check_dir(path: str, committed: bool) -> None:
    """No lock left; a .metadata only where a checkpoint is committed."""
    names = sorted(os.listdir(path))
    assert ".lock" not in names, names
    assert (".metadata" in names) == committed, names


@pytest.mark.parametrize("kind", ["api", "dropin"])
@pytest.mark.parametrize("previous", [True, False], ids=["over_previous", "fresh"])
def test_sigint_mid_save_one_process(tmp_path, kind, previous):
    path = str(tmp_path / "ckpt")
    t0 = time.monotonic()
    if previous:
        save(kind, state(1), path, True)
        md = open(os.path.join(path, ".metadata"), "rb").read()
    full = time.monotonic() - t0
    raised, lag = interrupted_save(kind, state(2), path, 0, True, True)
    check_outcome(kind, raised, True, 1)
    # no later than the rest of the save (a full save's time, and slack
    # for a loaded machine or a sanitised build)
    assert lag < max(full, 1.0) + 5.0, lag
    if kind == "api":
        # the save ran to its end: the new checkpoint, whole
        check_dir(path, True)
        load_equal(path, 2, 0, True)
    elif previous:
        check_dir(path, True)
        assert open(os.path.join(path, ".metadata"), "rb").read() == md
        load_equal(path, 1, 0, True)
    else:
        check_dir(path, False)
    # the next save, same process, a new writer: works, leftovers removed
    save(kind, state(3), path, True)
    load_equal(path, 3, 0, True)
    names = os.listdir(path)
    assert ".lock" not in names and len(names) == 2, names


def _ranks_body(rank, world, path, kind, who):
    save(kind, state(1, rank), path, False)
    dist.barrier()
    md = open(os.path.join(path, ".metadata"), "rb").read()
    signal_me = who == "all" or rank == 0
    raised, _ = interrupted_save(kind, state(2, rank), path, rank, False, signal_me)
    check_outcome(kind, raised, signal_me, world)
    dist.barrier()
    check_dir(path, True)
    if kind == "api":
        load_equal(path, 2, rank, False)
    else:
        assert open(os.path.join(path, ".metadata"), "rb").read() == md
        load_equal(path, 1, rank, False)
    dist.barrier()
    save(kind, state(3, rank), path, False)
    load_equal(path, 3, rank, False)
    dist.barrier()
    names = os.listdir(path)
    assert ".lock" not in names and len(names) == 1 + world, names


@pytest.mark.parametrize("kind", ["api", "dropin"])
@pytest.mark.parametrize("who", ["all", "rank0"])
def test_sigint_mid_save_two_ranks(tmp_path, kind, who):
    run_ranks(2, _ranks_body, str(tmp_path / "ckpt"), kind, who, timeout=240)


class _FailingComm:
    """A communicator whose every collective raises exc (as a signal
    handler's KeyboardInterrupt would inside TorchComm's Python code)."""

    def __init__(self, exc):
        self.exc = exc
        self.calls: list[str] = []

    def __getattr__(self, name):
        def call(*args):
            self.calls.append(name)
            raise self.exc(name)
        return call


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_base_exception_in_collective_raised_not_swallowed(tmp_path, exc):
    # raised itself when the engine's call returns, not turned into a
    # StorageIOError (an Exception there is a transport failure: below)
    from dcp_torch._engine import make_context, tensor_code
    t = torch.arange(4.0)
    entry = (0, ("a",), tensor_code(t, "a"), (4,), (0,), (4,), t.data_ptr())
    comm = _FailingComm(exc)
    ctx = make_context(comm=comm, rank=0, size=2)
    with pytest.raises(exc) as ei:
        ctx.save([entry], str(tmp_path / "c"), 0, True, False)
    assert ei.value.args == (comm.calls[0],) and len(comm.calls) == 1
    assert not os.path.exists(tmp_path / "c" / ".metadata")
    comm = _FailingComm(RuntimeError)
    ctx = make_context(comm=comm, rank=0, size=2)
    with pytest.raises(dcp_torch.StorageIOError) as ei:
        ctx.save([entry], str(tmp_path / "c"), 0, True, False)
    assert f"failed: {comm.calls[0]})" in str(ei.value)


def _manager_body(rank, world, root):
    """CheckpointManager.save with a SIGINT to rank 0 alone while it
    writes: every rank runs the save to its end, rank 0 raises
    KeyboardInterrupt then, the step is committed, the manager goes on."""
    with dcp_torch.CheckpointManager(root, keep_last=2) as m:
        m.save(state(1, rank), 1)
        step_dir = m.path(2)
        before = set()
        main = threading.main_thread().ident
        sent: list[float] = []

        def killer():
            while not (os.path.isdir(step_dir) and any(
                    n.startswith(f"__{rank}_") and n not in before for n in os.listdir(step_dir))):
                time.sleep(0.0005)
            sent.append(time.monotonic())
            signal.pthread_kill(main, signal.SIGINT)

        raised = None
        th = threading.Thread(target=killer, daemon=True) if rank == 0 else None
        try:
            try:
                if th:
                    th.start()
                m.save(state(2, rank), 2)
            finally:
                if th:
                    th.join()
                    time.sleep(0.05)
        except BaseException as e:  # noqa: BLE001 - checked below
            raised = e
        if rank == 0:
            assert sent and type(raised) is KeyboardInterrupt, repr(raised)
        else:
            assert raised is None, repr(raised)
        assert m.latest() == 2
        want = state(2, rank)
        got = {k: torch.zeros_like(v) for k, v in want.items()}
        assert m.load_latest(got) == 2
        assert all(torch.equal(got[k], want[k]) for k in want)
        m.save(state(3, rank), 3)
        assert m.latest() == 3
    dist.barrier()
    assert sorted(os.listdir(root)) == ["step-2", "step-3"]


def test_sigint_mid_manager_save(tmp_path):
    """dcp_torch.CheckpointManager holds SIGINT as save and load do."""
    run_ranks(2, _manager_body, str(tmp_path / "root"), timeout=240)
