"""dcp's communicator over torch.distributed: the collectives dcp's C
engine calls (dcp_comm.h), run on a torch process group with uint8
tensors. The extension calls these methods on the thread that called
save/load/wait, holding the GIL only for the call."""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist

__all__ = ["TorchComm"]


class _Pending:
    """A point-to-point request. gloo completes a request only inside its
    wait(), so a thread of its own waits for it (the transfer progresses
    without us) and tells the communicator when it is done."""

    __slots__ = ("work", "buf", "done", "error", "thread")

    def __init__(self, work, buf, cond: threading.Condition):
        self.work = work
        self.buf = buf
        self.done = False
        self.error = None
        self.thread = threading.Thread(target=self._wait, args=(cond,), daemon=True,
                                       name="dcp_torch-p2p")
        self.thread.start()

    def _wait(self, cond: threading.Condition) -> None:
        try:
            self.work.wait()
        except BaseException as e:  # noqa: BLE001 - reported by waitany
            self.error = e
        with cond:
            self.done = True
            cond.notify_all()


def _u8(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


class TorchComm:
    """The collectives of one process group (gloo, or any group that
    carries CPU tensors). ``timeout``: seconds a point-to-point wait may
    take before it fails (dcp's read-once load)."""

    def __init__(self, group=None, timeout: float = 1800.0) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.timeout = timeout
        self._cond = threading.Condition()
        if group is None or group is dist.GroupMember.WORLD:
            self._g = list(range(self.size))
        else:
            self._g = [dist.get_global_rank(group, r) for r in range(self.size)]

    def bcast(self, data: bytes, root: int) -> bytes:
        if not data:
            return b""
        t = _u8(data)
        dist.broadcast(t, src=self._g[root], group=self.group)
        return t.numpy().tobytes()

    def gather(self, data: bytes, root: int):
        n = len(data)
        if n == 0:
            return b"" if self.rank == root else None
        t = _u8(data)
        if self.rank == root:
            out = [torch.empty(n, dtype=torch.uint8) for _ in range(self.size)]
            dist.gather(t, gather_list=out, dst=self._g[root], group=self.group)
            return b"".join(x.numpy().tobytes() for x in out)
        dist.gather(t, gather_list=None, dst=self._g[root], group=self.group)
        return None

    def gatherv(self, data: bytes, root: int):
        lens = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        dist.all_gather(lens, torch.tensor([len(data)], dtype=torch.int64), group=self.group)
        lens = [int(x.item()) for x in lens]
        m = max(lens)
        if m == 0:
            return [b""] * self.size if self.rank == root else None
        t = torch.zeros(m, dtype=torch.uint8)
        if data:
            t[: len(data)] = _u8(data)
        if self.rank == root:
            out = [torch.empty(m, dtype=torch.uint8) for _ in range(self.size)]
            dist.gather(t, gather_list=out, dst=self._g[root], group=self.group)
            return [x[:n].numpy().tobytes() for x, n in zip(out, lens)]
        dist.gather(t, gather_list=None, dst=self._g[root], group=self.group)
        return None

    def scatterv(self, parts, n: int, root: int) -> bytes:
        m = torch.tensor([max(len(p) for p in parts) if parts is not None else 0], dtype=torch.int64)
        dist.broadcast(m, src=self._g[root], group=self.group)
        m = int(m.item())
        if m == 0:
            return b""
        out = torch.empty(m, dtype=torch.uint8)
        if self.rank == root:
            src = []
            for p in parts:
                t = torch.zeros(m, dtype=torch.uint8)
                if p:
                    t[: len(p)] = _u8(p)
                src.append(t)
            dist.scatter(out, scatter_list=src, src=self._g[root], group=self.group)
        else:
            dist.scatter(out, scatter_list=None, src=self._g[root], group=self.group)
        return out[:n].numpy().tobytes()

    def allreduce_min(self, vals):
        t = torch.tensor(vals, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return t.tolist()

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def isend(self, data: bytes, peer: int, tag: int):
        t = _u8(data)
        return _Pending(dist.isend(t, dst=self._g[peer], group=self.group, tag=tag), t, self._cond)

    def irecv(self, n: int, peer: int, tag: int):
        t = torch.empty(n, dtype=torch.uint8)
        return _Pending(dist.irecv(t, src=self._g[peer], group=self.group, tag=tag), t, self._cond)

    def waitany(self, pending) -> int:
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while True:
                for i, p in enumerate(pending):
                    if p is not None and p.done:
                        if p.error is not None:
                            raise p.error
                        return i
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no message completed within {self.timeout:.0f} s")
                self._cond.wait(min(left, 1.0))

    def received(self, p: _Pending) -> bytes:
        return p.buf.numpy().tobytes()
