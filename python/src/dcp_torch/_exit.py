"""At interpreter exit, a moment without the GIL for torch's gloo workers.

A gloo worker thread drops its own reference to a finished collective
after the caller has already returned. When the collective's tensors were
Python tensors the caller has let go (FSDP's all_gather chunks, for one),
that last drop frees them and takes the GIL. A program whose last
collective comes just before it ends (FSDP.summon_full_params, then
destroy_process_group, then return: PyTorch's own FSDP checkpoint example)
can reach interpreter finalization before the worker has had the GIL;
CPython then ends the worker with pthread_exit, whose unwinding through
torch's noexcept destructor calls std::terminate, and the process dies of
SIGABRT after all its work is done. Measured with torch's own DCP and no
dcp_torch at all: 2 runs in 16 of that example on this 2-core machine.

dcp_torch cannot change the program, so at exit (atexit runs before
finalization) it releases the GIL for a moment when gloo's workers are
still alive (threads named pt_gloo_runloop: a process group not yet
destroyed, or kept by the program's objects): a worker waiting for the GIL
gets it, frees its tensors and goes back to its queue. Other processes
exit at once."""

from __future__ import annotations

import atexit
import os
import sys
import time

GRACE_S = 0.05
WORKER = "pt_gloo_runloop"


def gloo_workers() -> int:
    """How many of this process's threads are gloo workers."""
    n = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 1 if "torch.distributed" in sys.modules else 0
    for t in tasks:
        try:
            with open(f"/proc/self/task/{t}/comm", encoding="ascii", errors="replace") as f:
                n += f.read().strip() == WORKER
        except OSError:
            continue  # a thread that has just ended
    return n


def _grace() -> None:
    if gloo_workers():
        time.sleep(GRACE_S)


atexit.register(_grace)
