"""dcp_torch.CheckpointManager: dcp's checkpoint manager (dcp_manager.h)
for PyTorch programs — a root of step-named checkpoints, the latest
complete one, retention after each commit (keep the last k, keep every
N-th), saves every ``interval`` steps or when asked (a signal handler may
call ``request_save``), one asynchronous save in flight, committed at the
next call on the caller's thread (the manager's collectives never run on
a background thread)."""

from __future__ import annotations

import os
from typing import Any

import functools

from . import api
from ._engine import fspath, sigint_deferred

__all__ = ["CheckpointManager"]


def _collective(fn):
    """A manager call every rank makes alike: a SIGINT during it is held
    until it ends (``sigint_deferred``), as for save and load."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        with sigint_deferred():
            return fn(*args, **kwargs)
    return call


class CheckpointManager:
    """A root of checkpoints ``<root>/<prefix><step><suffix>``.

    Collective over ``process_group`` (the default group; one process when
    none is initialised or ``no_dist``): every rank makes it with the same
    arguments and calls its methods in the same order.

    * ``interval``: ``step()`` saves when the step is a multiple (0: only
      when ``request_save()`` was called on any rank).
    * ``keep_last`` (0: all), ``keep_every``: retention after each commit;
      the newest complete checkpoint is always kept.
    * ``async_save``: a save returns once staged; it commits at the next
      save, ``wait()``, ``latest()``, ``load_latest()`` or ``close()``.

    Step semantics: call ``step(state, n)`` after step n's work; checkpoint
    n holds the state after step n, and ``load_latest`` returns n (resume
    at n + 1)."""

    @_collective
    def __init__(self, root: str | os.PathLike, *, interval: int = 0, keep_last: int = 0,
                 keep_every: int = 0, async_save: bool = False, prefix: str = "step-",
                 suffix: str = "", sync_files: bool = True, process_group=None,
                 no_dist: bool = False) -> None:
        self.root = fspath(root)
        self._pg = process_group
        self._no_dist = no_dist
        ctx = api._context(process_group, no_dist, "manager")
        self._m = ctx.manager(self.root, prefix, suffix, int(interval), int(keep_last),
                              int(keep_every), bool(async_save), not sync_files)

    def _entries(self, state_dict: dict):
        return api._entries_agreed(state_dict, self._pg, self._no_dist)

    @_collective
    def step(self, state_dict: dict, step: int) -> bool:
        """The step boundary: saves state_dict as ``step`` when due (the
        interval, or a request on any rank); returns whether it saved."""
        entries, keep = self._entries(state_dict)
        did = self._m.save(entries, int(step), True)
        del keep
        return did

    @_collective
    def save(self, state_dict: dict, step: int) -> None:
        """Saves state_dict as ``step`` now (retention follows the commit)."""
        entries, keep = self._entries(state_dict)
        self._m.save(entries, int(step), False)
        del keep

    def request_save(self) -> None:
        """A save at the next ``step()``, whatever the interval (safe from
        a signal handler: it only sets a flag)."""
        self._m.request_save()

    @_collective
    def wait(self) -> None:
        """Completes the asynchronous save in flight, if any."""
        self._m.wait()

    @_collective
    def latest(self) -> int | None:
        """The newest complete checkpoint's step, or None. A listing that
        fails raises (never taken for "no checkpoints")."""
        s = self._m.latest()
        return None if s < 0 else s

    def path(self, step: int) -> str:
        return self._m.path(int(step))

    @_collective
    def load_latest(self, state_dict: dict, **kwargs: Any) -> int | None:
        """Loads the newest complete checkpoint into state_dict (as
        ``dcp_torch.load``) and returns its step; None (state untouched)
        when there is none."""
        s = self.latest()
        if s is None:
            return None
        api.load(state_dict, checkpoint_id=self.path(s), process_group=self._pg,
                 no_dist=self._no_dist, **kwargs)
        return s

    @_collective
    def close(self) -> None:
        """Completes a save in flight and releases the manager (collective)."""
        if self._m is not None:
            self._m.close()
            self._m = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
