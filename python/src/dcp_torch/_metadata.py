"""`.metadata` read without pickle: dcp's restricted decoder (an allow-list
of classes, every length and count bounded, nothing executed) and torch's
own Metadata objects built from what it decoded."""

from __future__ import annotations

from typing import Any

from torch.distributed.checkpoint.metadata import Metadata

from ._engine import TORCH_TYPES, default_context, fspath

__all__ = ["read_metadata", "open_metadata"]


def open_metadata(path: Any, ctx=None):
    """dcp's decoded metadata of the checkpoint at path (a handle of the C
    engine: entries, batch reads)."""
    return (ctx or default_context()).metadata_open(fspath(path))


def read_metadata(path: Any, *, ctx=None) -> Metadata:
    """The checkpoint's metadata as torch's own ``Metadata`` object
    (``state_dict_metadata``, ``planner_data``, ``storage_data``,
    ``storage_meta``, ``version``), decoded by dcp's restricted decoder:
    ``pickle`` is never called. A hostile or malformed ``.metadata`` raises
    a :class:`dcp_torch.CheckpointError` subclass (``FormatError``,
    ``UnsafeError``, ``LimitError``, ...) naming the problem; a missing one
    ``NotFoundError``."""
    p = fspath(path)
    return open_metadata(p, ctx).build(TORCH_TYPES, p)
