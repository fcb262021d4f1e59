"""dcp's utilities from Python: verify, ls, clean, and the format
conversions (torch.save and safetensors, in and out, with dcp's bounded
memory: tensors stream through buffers of ``mem_limit`` bytes)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from . import _C
from ._engine import _DTYPES, default_context, dtype_code, fspath

__all__ = [
    "verify",
    "ls",
    "clean",
    "dcp_to_torch_save",
    "torch_save_to_dcp",
    "export_safetensors",
    "import_safetensors",
]


def verify(path: Any) -> None:
    """Checks a checkpoint completely (every chunk tiled, every record
    parsed, every CRC): returns None, or raises the first problem
    (``CorruptError`` naming the key, file and offset, ...)."""
    default_context().verify(fspath(path))


def ls(path: Any) -> list[dict]:
    """A summary of each entry, sorted by key: ``key``, ``kind``
    (``"tensor"`` or ``"value"``), ``dtype`` (a torch.dtype, None for values),
    ``shape`` (a torch.Size), ``chunks`` (stored chunks), ``nbytes`` (tensor
    data, or a value's record bytes) and ``path`` (planner_data, or None)."""
    md = default_context().metadata_open(fspath(path))
    out = []
    for key, is_tensor, dtype, shape, nchunks, nbytes, opath in md.entries():
        out.append({
            "key": key,
            "kind": "tensor" if is_tensor else "value",
            "dtype": _DTYPES.get(dtype) if is_tensor else None,
            "shape": torch.Size(shape) if is_tensor else None,
            "chunks": nchunks,
            "nbytes": nbytes,
            "path": opath,
        })
    return out


def clean(path: Any, force: bool = False) -> tuple[int, int]:
    """Removes what interrupted writers left in a checkpoint directory
    (dcp_clean): data files no committed .metadata names, temporaries;
    never a file of the committed checkpoint or one dcp did not write.
    Returns (files, bytes) removed. ``BusyError`` while a save holds the
    lock; ``force=True`` also removes another host's lock (only when that
    writer is known to be gone)."""
    return default_context().clean(fspath(path), bool(force))


def _convert(export: bool, src: Any, dst: Any, fmt: int, dtype: torch.dtype | None,
             max_shard_bytes: int, keys: Sequence[str] | None, strip_prefix: str | None,
             add_prefix: str | None, mem_limit: int, verify: bool, sync: bool) -> dict:
    code = 0
    if dtype is not None:
        code = dtype_code(dtype)
        if code == 0:
            raise TypeError(f"dtype {dtype} is not one dcp holds")
    flags = (0 if verify else _C.DCP_CONVERT_NO_VERIFY) | (0 if sync else _C.DCP_CONVERT_NO_FSYNC)
    return default_context().convert(export, fspath(src), fspath(dst), fmt, code,
                                     int(max_shard_bytes), list(keys) if keys else None,
                                     strip_prefix, add_prefix, int(mem_limit), flags)


def dcp_to_torch_save(dcp_checkpoint_dir: Any, torch_save_path: Any, *, dtype=None,
                      keys=None, strip_prefix=None, add_prefix=None, mem_limit: int = 0,
                      verify: bool = True) -> dict:
    """torch's ``format_utils.dcp_to_torch_save``: the checkpoint as one
    ``torch.save`` file (``torch.load(path, weights_only=True)`` gives the
    nested state dict), streamed with bounded memory. Returns the counts
    (tensors, values, bytes, ...)."""
    return _convert(True, dcp_checkpoint_dir, torch_save_path, _C.DCP_FORMAT_TORCH, dtype, 0,
                    keys, strip_prefix, add_prefix, mem_limit, verify, True)


def torch_save_to_dcp(torch_save_path: Any, dcp_checkpoint_dir: Any, *, keys=None,
                      strip_prefix=None, add_prefix=None, mem_limit: int = 0) -> dict:
    """torch's ``format_utils.torch_save_to_dcp``: a ``torch.save`` file
    (read by dcp's restricted decoder: nothing executed) into a new
    checkpoint, keys flattened as torch flattens them."""
    return _convert(False, torch_save_path, dcp_checkpoint_dir, _C.DCP_FORMAT_TORCH, None, 0,
                    keys, strip_prefix, add_prefix, mem_limit, True, True)


def export_safetensors(dcp_checkpoint_dir: Any, out: Any, *, max_shard_bytes: int = 0,
                       dtype=None, keys=None, strip_prefix=None, add_prefix=None,
                       mem_limit: int = 0, verify: bool = True) -> dict:
    """The checkpoint's tensors as safetensors (one file, or shards and an
    index with ``max_shard_bytes``); values are left out (counted in
    ``skipped``)."""
    return _convert(True, dcp_checkpoint_dir, out, _C.DCP_FORMAT_SAFETENSORS, dtype,
                    max_shard_bytes, keys, strip_prefix, add_prefix, mem_limit, verify, True)


def import_safetensors(src: Any, dcp_checkpoint_dir: Any, *, keys=None, strip_prefix=None,
                       add_prefix=None, mem_limit: int = 0) -> dict:
    """A safetensors file, an index with its shards, or a directory of
    them into a new checkpoint (the format found from the content)."""
    return _convert(False, src, dcp_checkpoint_dir, _C.DCP_FORMAT_AUTO, None, 0, keys,
                    strip_prefix, add_prefix, mem_limit, True, True)
