"""dcp's own save, load and async_save for PyTorch programs: the top level
of ``torch.distributed.checkpoint`` with the same names, arguments and
semantics, planned and run by dcp's C engine over the caller's
torch.distributed process group (``import dcp_torch as dcp``).

The state is flattened as torch flattens it (``flatten_state_dict``: keys
joined with ``.``, the paths recorded in ``planner_data``); DTensors and
ShardedTensors give their local boxes (torch's own chunk geometry),
plain tensors are replicated (written once), non-tensor values are stored
as torch stores them. Stateful objects' ``state_dict()`` is called at
save, ``load_state_dict()`` after a load (a load calls both in sorted key
order, as torch's does: collectives they make meet on every rank). The result is the checkpoint
torch's FileSystemWriter writes: torch loads it, and dcp loads torch's.
"""

from __future__ import annotations

import os
import threading
import warnings
from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as tdcp
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException  # noqa: F401  (torch's api's name)
from torch.distributed.checkpoint.stateful import Stateful

from ._comm import TorchComm
from ._engine import (MEM_CUDA, MEM_HOST, dcp_direct, box_source, cuda_ready, fspath,
                      make_context, sigint_deferred, tensor_code, weights_only_value)
from ._errors import InvalidArgumentError, LimitError, NotSupportedError, UnsafeError

__all__ = ["save", "load", "async_save", "save_state_dict", "load_state_dict"]

_SAVE_ZSTD = 1 << 1          # DCP_SAVE_ZSTD
_LOAD_PARTIAL = 1 << 0       # DCP_LOAD_PARTIAL
_LOAD_CAST = 1 << 1          # DCP_LOAD_CAST
_LOAD_NO_VERIFY = 1 << 2     # DCP_LOAD_NO_VERIFY
_LOAD_ALLOW_UNEXPECTED = 1 << 3
_LOAD_PER_RANK_READS = 1 << 5
_LOAD_SMALL_PER_RANK = 1 << 8  # DCP_LOAD_SMALL_PER_RANK

_lock = threading.Lock()
_contexts: dict[Any, Any] = {}
_async_groups: dict[Any, Any] = {}


def _own_writer(storage_writer, planner):
    """dcp_torch's own FileSystemWriter without a planner: served by dcp's
    engine (its path and options), not through torch's planning."""
    from .filesystem import FileSystemWriter
    if type(storage_writer) is FileSystemWriter and planner is None:
        return storage_writer
    return None


def _writer_route(what: str, storage_writer, planner, checkpoint_id, sync_files):
    """Who serves a save given these arguments: (True, checkpoint_id,
    sync_files) for dcp's engine (none given, or dcp_torch's own writer,
    whose path and options then apply); (False, ...) for torch's path with
    a torch writer or planner (a warning says so)."""
    own = _own_writer(storage_writer, planner)
    if own is not None:
        checkpoint_id = checkpoint_id or own.path
        if not own.overwrite:
            _refuse_existing(fspath(checkpoint_id))
        return True, checkpoint_id, own.sync_files
    if storage_writer is not None or planner is not None:
        warnings.warn(f"dcp_torch.{what}: a storage_writer or planner was given: torch plans "
                      "this save (dcp's own planning is not used)", stacklevel=3)
        return False, checkpoint_id, sync_files
    return True, checkpoint_id, sync_files


def _torch_scheme(checkpoint_id) -> bool:
    """A checkpoint_id with a URL scheme dcp does not serve (anything but
    s3://): torch picks its storage for it (fsspec, or its "Cannot detect
    which StorageReader or StorageWriter to use" RuntimeError), as its own
    save and load do."""
    if checkpoint_id is None or not isinstance(checkpoint_id, str):
        return False
    return "://" in checkpoint_id and not checkpoint_id.startswith("s3://")


class _MissingIdError(InvalidArgumentError, RuntimeError):
    """No checkpoint_id and no storage: torch raises a RuntimeError."""


def _require_id(what: str, checkpoint_id) -> None:
    if checkpoint_id is None:
        raise _MissingIdError(f"dcp_torch.{what}: `checkpoint_id` must be specified if "
                              "storage_reader/storage_writer is None.")


def _warn_torch(what: str, checkpoint_id, use_collectives: bool = True) -> bool:
    why = ("use_collectives=False" if not use_collectives
           else f"checkpoint_id {checkpoint_id!r} is not a path or s3:// URL")
    warnings.warn(f"dcp_torch.{what}: {why}: torch serves this call", stacklevel=3)
    return False


def _refuse_existing(path: str) -> None:
    if not path.startswith("s3://") and os.path.exists(os.path.join(path, ".metadata")):
        from ._errors import ExistsError
        raise ExistsError(f"Checkpoint already exists and overwrite=False: '{path}'")


def _use_dist(process_group, no_dist: bool) -> bool:
    if no_dist:
        return False
    if not (dist.is_available() and dist.is_initialized()):
        return False
    return True


def _context(process_group, no_dist: bool, kind: str = "sync", **opts):
    """The context of a process group (one per group and kind, kept: dcp's
    plan caches live in it). kind "async": over a dedicated gloo group, so
    that the commit running on the background thread never shares a group
    with the training loop's collectives."""
    if not _use_dist(process_group, no_dist):
        key = (None, kind, tuple(sorted(opts.items())))
        with _lock:
            ctx = _contexts.get(key)
            if ctx is None:
                ctx = _contexts[key] = make_context(**opts)
        return ctx
    group = process_group
    backend = str(dist.get_backend(process_group))
    if kind == "async" or "gloo" not in backend:
        # A group of its own (gloo: dcp's collectives carry CPU tensors),
        # made once per process group and kind: collective on first use.
        gkey = (kind, process_group)
        with _lock:
            group = _async_groups.get(gkey)
        if group is None:
            ranks = None if process_group is None else dist.get_process_group_ranks(process_group)
            group = dist.new_group(ranks=ranks, backend="gloo")
            with _lock:
                _async_groups[gkey] = group
    key = (group, kind, tuple(sorted(opts.items())))
    with _lock:
        ctx = _contexts.get(key)
    if ctx is None:
        comm = TorchComm(group)
        ctx = make_context(comm=comm, rank=comm.rank, size=comm.size, **opts)
        with _lock:
            _contexts[key] = ctx
    return ctx


# A DTensor's chunk geometry by its spec (mesh, placements, shard order,
# global shape, stride, dtype: what torch's own sharding cache keys on; this
# process's coordinate on the mesh is fixed): the same parameters are saved
# every step, and torch's __create_chunk_list__ costs ~0.1 ms a tensor. A
# dict lookup of the same spec object is its cached hash and an identity
# test. Bounded: cleared when it grows past _CHUNKS_MAX specs.
_chunks_by_spec: dict = {}
_CHUNKS_MAX = 1 << 16


def _dtensor_chunk(v, key: str):
    """(offsets, sizes) of a DTensor whose local tensor is one plain
    tensor (torch gives it one chunk)."""
    spec = getattr(v, "_spec", None)
    try:
        hit = _chunks_by_spec.get(spec) if spec is not None else None
    except TypeError:  # an unhashable spec: no cache
        spec, hit = None, None
    if hit is None:
        chunks = v.__create_chunk_list__()
        if len(chunks) != 1:
            raise NotSupportedError(f"'{key}': a DTensor whose local part is {len(chunks)} chunks")
        hit = (tuple(chunks[0].offsets), tuple(chunks[0].sizes))
        if spec is not None:
            if len(_chunks_by_spec) >= _CHUNKS_MAX:
                _chunks_by_spec.clear()
            _chunks_by_spec[spec] = hit
    return hit


def _boxes(v, key: str):
    """(global shape, [(offsets, sizes, local tensor)]) of a tensor leaf."""
    from torch.distributed.tensor import DTensor
    if isinstance(v, DTensor):
        inner = getattr(v, "_local_tensor", None)
        if inner is not None and hasattr(inner, "__create_chunk_list__"):
            # a local tensor holding several chunks of its own (torch's
            # LocalShardsWrapper: TorchRec's table-wise/row-wise shards):
            # its chunk list and each chunk's tensor, as torch's planner
            # takes them (__create_chunk_list__, __get_tensor_shard__)
            from torch.distributed.checkpoint.metadata import MetadataIndex
            out = []
            for i, c in enumerate(inner.__create_chunk_list__()):
                offsets, sizes = tuple(c.offsets), tuple(c.sizes)
                local = inner.__get_tensor_shard__(MetadataIndex(key, c.offsets, i))
                if tuple(local.shape) != sizes:
                    local = local.reshape(sizes)
                out.append((offsets, sizes, local))
            return tuple(v.shape), out
        offsets, sizes = _dtensor_chunk(v, key)
        # the local shard itself (to_local() is an autograd Function call
        # returning a view of it; the boxes are read or filled, never
        # part of a graph)
        local = getattr(v, "_local_tensor", None)
        if local is None:
            local = v.to_local()
        if tuple(local.shape) != sizes:
            local = local.reshape(sizes)
        return tuple(v.shape), [(offsets, sizes, local)]
    try:
        from torch.distributed._shard.sharded_tensor import ShardedTensor
    except Exception:  # pragma: no cover
        ShardedTensor = ()
    if ShardedTensor and isinstance(v, ShardedTensor):
        out = []
        for sh in v.local_shards():
            out.append((tuple(sh.metadata.shard_offsets), tuple(sh.metadata.shard_sizes), sh.tensor))
        return tuple(v.size()), out
    return tuple(v.shape), [((0,) * v.dim(), tuple(v.shape), v)]


def _sorted_keys(state_dict: dict) -> list:
    """The top-level keys in the order torch's load visits them (sorted:
    Stateful objects' state_dict()/load_state_dict() may run collectives,
    and every rank must call them in the same order whatever its dict's
    order); keys that do not sort (not all str) keep the dict's order."""
    try:
        return sorted(state_dict)
    except TypeError:
        return list(state_dict)


def _resolve_stateful(state_dict: dict, keys=None) -> dict:
    out = {}
    for k in (state_dict if keys is None else keys):
        v = state_dict[k]
        if not isinstance(k, str):
            raise InvalidArgumentError(f"state_dict keys must be str, not {type(k).__name__} ({k!r})")
        out[k] = v.state_dict() if isinstance(v, Stateful) else v
    return out


def _flatten(state_dict: dict):
    flat, mappings = flatten_state_dict(state_dict)
    return flat, mappings


_PLAIN = (type(None), bool, int, float, str, bytes)


# In the message of a value dcp's encoder does not hold (_TorchStored):
# the agreed error every rank gets carries it, so all take torch's path.
_TORCH_STORED_MARK = "[stored by torch]"


class _TorchStored(NotSupportedError):
    """A value dcp's value encoder does not hold (io.BytesIO, a set,
    torch.Size, an int beyond 64 bits, a dict with other keys than str,
    any other object): torch stores it (torch.save of the object, or the
    BytesIO's bytes), so the save is planned by torch and written by dcp's
    drop-in writer (_torch_stored_save)."""


def _check_value(v, key: str, depth: int = 0) -> None:
    """What dcp can store as a value (the extension's py_to_value rules),
    checked before the collective so that every rank can agree; what it
    cannot raises _TorchStored."""
    if depth > 100:
        raise InvalidArgumentError(f"'{key}': value nested too deeply")
    if isinstance(v, _PLAIN):
        if isinstance(v, int) and not isinstance(v, bool) and not -(1 << 63) <= v < (1 << 63):
            raise _TorchStored(f"'{key}': int {v} does not fit in 64 bits {_TORCH_STORED_MARK}")
        return
    if isinstance(v, (list, tuple)):
        for x in v:
            _check_value(x, key, depth + 1)
        return
    if isinstance(v, dict):
        for k, x in v.items():
            if not isinstance(k, str):
                raise _TorchStored(f"'{key}': a dict key other than str {_TORCH_STORED_MARK}")
            _check_value(x, key, depth + 1)
        return
    raise _TorchStored(f"'{key}': a {type(v).__name__} value, which dcp's value encoder does not "
                       f"hold (None, bool, int, float, str, bytes, lists, tuples and dicts of "
                       f"them) {_TORCH_STORED_MARK}")


def _torch_stored(e: BaseException) -> bool:
    """Whether e (this rank's own, or the agreed error of every rank) is a
    value only torch stores: the same answer on every rank."""
    return isinstance(e, NotSupportedError) and _TORCH_STORED_MARK in getattr(e, "message", "")


def _agree(group_ctx_args, error: BaseException | None):
    """Every rank learns whether any rank failed before the collective save
    or load (one allreduce; the failing rank's exception broadcast only
    then); each raises the same exception: the lowest failing rank's class
    and message."""
    process_group, no_dist = group_ctx_args
    if not _use_dist(process_group, no_dist):
        if error is not None:
            raise error
        return
    world = dist.get_world_size(process_group)
    # one small allreduce in the common case: the lowest failing rank (or
    # world when none); its exception is sent only when there is one
    flag = torch.tensor([dist.get_rank(process_group) if error is not None else world],
                        dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=process_group)
    r = int(flag.item())
    if r == world:
        return
    mine = None
    if error is not None:
        from ._errors import CheckpointError
        cls = type(error).__name__ if isinstance(error, CheckpointError) else None
        # a CheckpointError's message without its " [NAME]" (the agreed
        # exception adds its own)
        text = error.message if isinstance(error, CheckpointError) else str(error)
        mine = (cls, f"{type(error).__name__}: {text}")
    box = [mine]
    src = r if process_group is None else dist.get_global_rank(process_group, r)
    dist.broadcast_object_list(box, src=src, group=process_group)
    bad = [(r, box[0])]
    r, (cls, msg) = bad[0]
    from . import _errors
    exc_cls = getattr(_errors, cls, None) if cls else None
    if exc_cls is None:
        exc_cls = _errors.InvalidArgumentError
    exc = exc_cls(f"rank {r} failed: {msg}", code=exc_cls.code or -1, name=exc_cls.name or "DCP_EINVAL")
    if error is not None:
        raise exc from error
    raise exc


class _KeyMap:
    """dcp's rename and skip planners as keyword arguments: the stored key
    a state key is saved under or loaded from (``rename``: a mapping of
    state keys to stored keys, or a callable taking a key and returning its
    stored key), and the keys left out (``skip``: an iterable of keys, or a
    callable returning True for a key to leave out; on load a skipped entry
    is left as it is). Keys are torch's flattened keys (the levels joined
    with dots: ``"app.model.net1.weight"``)."""

    def __init__(self, rename=None, skip=None):
        if rename is not None and not callable(rename) and not hasattr(rename, "get"):
            raise InvalidArgumentError("rename: a mapping of keys to stored keys, or a callable")
        if skip is not None and not callable(skip):
            if isinstance(skip, (str, bytes)):
                raise InvalidArgumentError("skip: an iterable of keys (not one str), or a callable")
            skip = frozenset(skip)
        self.rename, self.skip = rename, skip
        self.on = rename is not None or skip is not None
        self._claimed: dict = {}

    def stored(self, key: str):
        """The stored key of key, or None when it is skipped."""
        sk = self.skip
        if sk is not None and (sk(key) if callable(sk) else key in sk):
            return None
        rn = self.rename
        if rn is None:
            return key
        new = rn(key) if callable(rn) else rn.get(key, key)
        if not isinstance(new, str) or not new:
            raise InvalidArgumentError(f"rename: '{key}' renamed to {new!r}, not a non-empty str")
        return new

    def path(self, key: str, mappings: dict, verb: str):
        """The entry path of key: (stored key,) when renamed, torch's own
        path otherwise; None when skipped. Two keys onto one stored key:
        InvalidArgumentError ("rename: 'a' and 'b' both <verb> 'c'")."""
        if self.on:
            stored = self.stored(key)
            if stored is None:
                return None
            other = self._claimed.setdefault(stored, key)
            if other != key:
                raise InvalidArgumentError(f"rename: '{other}' and '{key}' both {verb} '{stored}'")
            if stored != key:
                return (stored,)
        return tuple(mappings.get(key, (key,)))


_NO_KEYMAP = _KeyMap()


def _entries_save(state_dict: dict, keymap: _KeyMap = _NO_KEYMAP):
    flat, mappings = _flatten(_resolve_stateful(state_dict))
    entries, keep, devices = [], [], set()
    for key, v in flat.items():
        path = keymap.path(key, mappings, "would be saved as")
        if path is None:
            continue
        if isinstance(v, torch.Tensor):
            shape, boxes = _boxes(v, key)
            for off, size, local in boxes:
                t, mem = box_source(local, key)
                keep.append(t)
                if mem == MEM_CUDA:
                    devices.add(t.device)
                entries.append((0, path, tensor_code(t, key), shape, off, size, t.data_ptr(), mem))
        else:
            _check_value(v, key)
            entries.append((1, path, v))
    cuda_ready(devices)
    return entries, keep


def _entries_agreed(state_dict, process_group, no_dist, rename=None, skip=None):
    err, entries, keep = None, [], []
    try:
        entries, keep = _entries_save(state_dict, _KeyMap(rename, skip))
    except Exception as e:  # noqa: BLE001 - agreed with every rank, re-raised
        err = e
    _agree((process_group, no_dist), err)
    return entries, keep


def _fail_mark(group_args, err: BaseException | None):
    """What a rank whose entries failed (err) hands the engine with an
    empty state (the extension's ``fail``: dcp_state_fail), so that the
    failure is agreed in the engine's first collective instead of one more
    of ours: every rank then raises the same CheckpointError, "rank R
    failed: <type>: <message>" (R the lowest failing rank), of err's class
    when it is a CheckpointError (dcp's code travels), InvalidArgumentError
    otherwise. None when err is None; one process: err itself is raised."""
    if err is None:
        return None
    if not _use_dist(*group_args):
        raise err
    from ._errors import CheckpointError
    if isinstance(err, CheckpointError):
        code, text = (err.code or -1), err.message
    else:
        code, text = -1, str(err)  # DCP_EINVAL
    return (code, f"{type(err).__name__}: {text}")


def _entries_marked(state_dict, group_args, rename=None, skip=None):
    """(entries, keep, err, fail) of a save: this rank's entries, or none
    and its failure (err) with the engine's mark (fail, _fail_mark)."""
    try:
        entries, keep = _entries_save(state_dict, _KeyMap(rename, skip))
        return entries, keep, None, None
    except Exception as e:  # noqa: BLE001 - agreed by the engine, re-raised
        return [], [], e, _fail_mark(group_args, e)


def _engine_call(fn, err: BaseException | None):
    """fn() (the engine's save or load); its error chained to this rank's
    own failure (err) when the rank had one."""
    from ._errors import CheckpointError
    try:
        out = fn()
    except CheckpointError as e:
        if err is not None:
            raise e from err
        raise
    if err is not None:  # cannot happen: a marked state never succeeds
        raise err
    return out


def save(state_dict: dict, *, checkpoint_id: str | os.PathLike | None = None,
         storage_writer=None, planner=None, process_group=None, no_dist: bool = False,
         use_collectives: bool = True, sync_files: bool = True, zstd: bool = False,
         io_depth: int = 0, direct: bool = True, rename=None, skip=None):
    """torch.distributed.checkpoint.save, by dcp: collective over
    ``process_group`` (the default group; none initialised or
    ``no_dist=True``: one process). ``checkpoint_id``: a directory or
    ``s3://bucket/prefix``. A torch ``storage_writer`` or ``planner`` is
    served through torch's own save with it (torch plans; a warning says
    so). dcp's extras: ``sync_files`` (fsync, True), ``zstd`` (compressed
    records), ``io_depth``, ``direct``, and the rename and skip planners:
    ``rename`` (a mapping of flattened keys to the keys they are saved
    under, or a callable key -> stored key) and ``skip`` (keys to leave
    out: an iterable, or a callable key -> bool). Returns the checkpoint's
    Metadata.
    Every rank raises the same ``CheckpointError`` on failure; nothing is
    committed then. ``use_collectives=False`` (each rank saving without the
    others, torch's rank-local metadata) and a ``checkpoint_id`` with a URL
    scheme other than ``s3://`` are served by torch's own save."""
    served, checkpoint_id, sync_files = _writer_route("save", storage_writer, planner,
                                                      checkpoint_id, sync_files)
    if served and (_torch_scheme(checkpoint_id) or not use_collectives):
        served = _warn_torch("save", checkpoint_id, use_collectives)
    if not served:
        return tdcp.save(state_dict, checkpoint_id=checkpoint_id, storage_writer=storage_writer,
                         planner=planner, process_group=process_group, no_dist=no_dist,
                         use_collectives=use_collectives)
    _require_id("save", checkpoint_id)
    path = fspath(checkpoint_id)
    try:
        with sigint_deferred():  # every rank runs the save to its end alike
            ctx = _context(process_group, no_dist, io_depth=io_depth, direct=direct)
            entries, keep, err, fail = _entries_marked(state_dict, (process_group, no_dist),
                                                       rename, skip)
            _engine_call(lambda: ctx.save(entries, path, _SAVE_ZSTD if zstd else 0,
                                          not sync_files, False, fail), err)
            del keep
    except NotSupportedError as e:
        if not _torch_stored(e) or rename is not None or skip is not None:
            raise
        return _torch_stored_save("save", e, state_dict, path, sync_files, process_group, no_dist)
    from ._metadata import read_metadata
    return read_metadata(path)


def _torch_stored_save(what: str, cause, state_dict, path: str, sync_files: bool, process_group,
                       no_dist: bool, async_: bool = False):
    """save or async_save of a state holding values dcp's encoder does not
    hold (cause, agreed by every rank: all come here): planned by torch,
    as torch stores such values, and written by dcp's drop-in writer (a
    warning says so). Stateful objects' state_dict() has run once already
    (for dcp's own entries) and runs again for torch's planning."""
    from .filesystem import FileSystemWriter
    warnings.warn(f"dcp_torch.{what}: {getattr(cause, 'message', cause)}: torch plans this save "
                  "(dcp_torch.FileSystemWriter writes it)", stacklevel=3)
    writer = FileSystemWriter(path, sync_files=sync_files)
    if async_:
        return tdcp.async_save(state_dict, storage_writer=writer, process_group=process_group,
                               no_dist=no_dist)
    return tdcp.save(state_dict, storage_writer=writer, process_group=process_group,
                     no_dist=no_dist)


class _AsyncState:
    """The one async save in flight per process (its thread and future)."""
    thread: threading.Thread | None = None


def async_save(state_dict: dict, *, checkpoint_id: str | os.PathLike | None = None,
               storage_writer=None, planner=None, process_group=None,
               async_checkpointer_type=None, async_stager=None, no_dist: bool = False,
               use_collectives: bool = True, sync_files: bool = True, zstd: bool = False,
               staging_budget: int = 0, writer_nice: int = 10, rename=None, skip=None):
    """torch.distributed.checkpoint.async_save, by dcp: returns a
    ``concurrent.futures.Future`` once the state is staged (copied into
    dcp's cached staging buffers; the call blocks only for that copy and the
    planning); the files are written by dcp's thread with the GIL released,
    and the commit (agreed by every rank) runs on a background thread over a
    dedicated gloo group made once per process group, so it never meets the
    training loop's collectives. ``future.result()`` returns None after the
    commit, or raises the save's error. A second async_save while one is in
    flight waits for it first (as dcp's one-save-in-flight rule).
    ``staging_budget``: bytes of staging memory at most (0: the whole
    state); ``writer_nice``: niceness added to dcp's thread writing the
    files in the background (0 to 19; 10 by default, so that it takes the
    CPU the training loop and the other ranks' staging leave rather than
    competing with them; 0: the caller's); ``rename``, ``skip`` as for
    ``save``. torch's ``async_checkpointer_type`` is accepted (dcp's thread
    serves either kind); an ``async_stager``, ``use_collectives=False`` or
    a URL scheme other than ``s3://`` is served by torch's async_save."""
    served, checkpoint_id, sync_files = _writer_route("async_save", storage_writer, planner,
                                                      checkpoint_id, sync_files)
    if served and (_torch_scheme(checkpoint_id) or not use_collectives or async_stager is not None):
        if async_stager is not None:
            warnings.warn("dcp_torch.async_save: an async_stager was given: torch serves this "
                          "call", stacklevel=2)
            served = False
        else:
            served = _warn_torch("async_save", checkpoint_id, use_collectives)
    if not served:
        kw = {} if async_checkpointer_type is None else {"async_checkpointer_type":
                                                         async_checkpointer_type}
        return tdcp.async_save(state_dict, checkpoint_id=checkpoint_id, storage_writer=storage_writer,
                               planner=planner, process_group=process_group,
                               async_stager=async_stager, no_dist=no_dist,
                               use_collectives=use_collectives, **kw)
    _require_id("async_save", checkpoint_id)
    path = fspath(checkpoint_id)
    prev = _AsyncState.thread
    if prev is not None:
        prev.join()
    with sigint_deferred():  # planning and staging end alike; the commit
        # thread is started before a deferred KeyboardInterrupt is raised
        ctx = _context(process_group, no_dist, "async", staging_budget=staging_budget,
                       worker_nice=writer_nice)
        try:
            entries, keep, err, fail = _entries_marked(state_dict, (process_group, no_dist),
                                                       rename, skip)
            req = _engine_call(lambda: ctx.save(entries, path, _SAVE_ZSTD if zstd else 0,
                                                not sync_files, True, fail), err)
        except NotSupportedError as e:
            if not _torch_stored(e) or rename is not None or skip is not None:
                raise
            return _torch_stored_save("async_save", e, state_dict, path, sync_files,
                                      process_group, no_dist, async_=True)
        del keep  # staged: the caller may change its tensors now
        fut: Future = Future()

        def finish():
            try:
                req.wait()
                from ._metadata import read_metadata
                md = read_metadata(path)  # torch's future gives the Metadata
            except BaseException as e:  # reaches future.result()
                fut.set_exception(e)
            else:
                fut.set_result(md)

        th = threading.Thread(target=finish, name="dcp_torch-async-commit", daemon=True)
        _AsyncState.thread = th
        th.start()
    return fut


def load(state_dict: dict, *, checkpoint_id: str | os.PathLike | None = None,
         storage_reader=None, planner=None, process_group=None, no_dist: bool = False,
         verify: bool = True, read_once: bool = True, cast: bool = True, rename=None,
         skip=None):
    """torch.distributed.checkpoint.load, by dcp: in place (tensors filled,
    values replaced, Stateful objects given their state), strict as torch's
    default (a key the checkpoint lacks raises ``KeyMismatchError`` naming
    it, on every rank, before any tensor changes), resharded from any world
    size. A torch ``storage_reader`` or ``planner`` is served by torch's
    load. dcp's extras: ``verify`` (CRCs, True), ``read_once`` (a chunk
    several ranks need read by one and forwarded, True; chunks under 64 KiB
    are read by each rank that needs them: the two messages through
    torch.distributed cost more than such a read), ``cast`` (True, as
    torch's load: a tensor stored in another dtype is converted to the
    state's, as torch's ``copy_`` does; False: that is a
    ShapeMismatchError), and the rename and skip planners: ``rename`` (a
    mapping of the state's flattened keys to the stored keys they load
    from, or a callable key -> stored key), ``skip`` (keys left as they
    are: an iterable, or a callable key -> bool)."""
    from .filesystem import FileSystemReader
    if type(storage_reader) is FileSystemReader and planner is None and not storage_reader.allow_pickle:
        checkpoint_id = checkpoint_id or storage_reader.path
        verify = storage_reader.verify
    elif storage_reader is not None or planner is not None or _torch_scheme(checkpoint_id):
        if _torch_scheme(checkpoint_id) and storage_reader is None and planner is None:
            _warn_torch("load", checkpoint_id)
        else:
            warnings.warn("dcp_torch.load: a storage_reader or planner was given: torch plans "
                          "this load", stacklevel=2)
        return tdcp.load(state_dict, checkpoint_id=checkpoint_id, storage_reader=storage_reader,
                         planner=planner, process_group=process_group, no_dist=no_dist)
    _require_id("load", checkpoint_id)
    with sigint_deferred():  # every rank runs the load to its end alike
        _load(state_dict, fspath(checkpoint_id), process_group, no_dist, verify, read_once, cast,
              rename, skip)


def _load(state_dict: dict, path: str, process_group, no_dist: bool, verify: bool,
          read_once: bool, cast: bool, rename, skip) -> None:
    ctx = _context(process_group, no_dist)
    keys = _sorted_keys(state_dict)  # torch's load: state_dict() and
    # load_state_dict() of Stateful objects called in sorted key order
    statefuls = {k: state_dict[k] for k in keys if isinstance(state_dict[k], Stateful)}
    err, entries, copies, resolved, mappings, back = None, [], [], {}, {}, {}
    devices = set()
    try:
        keymap = _KeyMap(rename, skip)
        resolved = _resolve_stateful(state_dict, keys)
        flat, mappings = _flatten(resolved)
        for key, v in flat.items():
            path_t = keymap.path(key, mappings, "load")
            if path_t is None:
                continue
            if keymap.on:
                back[_ckey(path_t)] = key  # the engine names values by stored key
            if isinstance(v, torch.Tensor):
                shape, boxes = _boxes(v, key)
                for off, size, local in boxes:
                    target = local.detach()
                    mem = MEM_HOST
                    if target.device.type in ("cpu", "cuda") and dcp_direct(target):
                        buf = target  # filled in place (CUDA: by dcp's copy to the device)
                        if target.device.type == "cuda":
                            mem = MEM_CUDA
                            devices.add(target.device)
                    else:
                        buf = torch.empty(size, dtype=target.dtype)
                        copies.append((target, buf))
                    entries.append((0, path_t, tensor_code(buf, key), shape, off, size, buf.data_ptr(),
                                    mem))
                    copies.append((None, buf))  # keeps buf alive
            else:
                # the value is replaced by what was saved: its template is
                # None (any object may stand there)
                entries.append((1, path_t, None))
        cuda_ready(devices)
    except Exception as e:  # noqa: BLE001 - agreed by the engine, re-raised
        err, entries, copies = e, [], []
    # a rank whose entries failed makes the engine's call with an empty
    # state marked failed: every rank raises the same error (_fail_mark)
    fail = _fail_mark((process_group, no_dist), err)
    # torch's semantics: a key the checkpoint lacks raises, keys of the
    # checkpoint that no rank asks for are ignored.
    flags = (_LOAD_ALLOW_UNEXPECTED | (0 if verify else _LOAD_NO_VERIFY) | (_LOAD_CAST if cast else 0)
             | (_LOAD_SMALL_PER_RANK if read_once else _LOAD_PER_RANK_READS))
    try:
        values = _engine_call(lambda: ctx.load(entries, path, flags, fail), err)
    except (UnsafeError, NotSupportedError, LimitError) as e:
        # A value dcp's decoder refuses (torch's planner stores io.BytesIO,
        # sets, torch.Size, tensors in tuples...): nothing was changed;
        # such values are read through torch's weights_only loader and the
        # rest loaded again. Every rank got this error (agreed): all come
        # here, whatever their entries, and agree again there.
        values = _load_refused_values(ctx, entries, path, flags, e, (process_group, no_dist), err)
    for target, buf in copies:
        if target is not None:
            target.copy_(buf.reshape(target.shape))
    for key, val in values.items():
        key = back.get(key, key)
        if key in mappings:
            set_element(resolved, mappings[key], val)
    for k, obj in statefuls.items():
        obj.load_state_dict(resolved[k])
    for k in state_dict:
        if k not in statefuls:
            state_dict[k] = resolved[k]


class _NoValues(Exception):
    """This rank asks for no value: nothing of its own to fall back on."""


def _ckey(path_t: tuple) -> str:
    """dcp's key of an entry's path (the extension joins it with dots)."""
    return ".".join(str(p) for p in path_t)


def _load_refused_values(ctx, entries, path, flags, cause, group_args, own=None):
    """load's second try after the engine's load failed with cause (an
    error a refused value gives; agreed, so every rank is here): every
    value entry whose record dcp's decoder refuses is read through torch's
    weights_only loader, the others loaded by the engine as before. A rank
    fails this try (agreed again: every rank raises the lowest failing
    rank's error) when its own entries had failed (own), when a value of
    its refuses both decoders (UnsafeError), or when it holds values and
    none is refused (cause was another error); a rank without values does
    not fail it."""
    err, fallback = None, {}
    try:
        if own is not None:
            raise own
        if not any(ent[0] == 1 for ent in entries):
            raise _NoValues()
        md = ctx.metadata_open(path)
        for ent in entries:
            if ent[0] != 1:
                continue
            key = _ckey(ent[1])
            k = md.find(key)
            if k < 0:
                continue  # missing: the engine names it
            try:
                md.read_value(k)
            except (UnsafeError, NotSupportedError, LimitError) as e:
                fallback[key] = weights_only_value(md, k, key, e)
        if not fallback:
            raise cause
    except _NoValues:
        pass
    except Exception as e:  # noqa: BLE001 - agreed with every rank, re-raised
        err = e
    _agree(group_args, err)
    rest = [ent for ent in entries if ent[0] != 1 or _ckey(ent[1]) not in fallback]
    values = ctx.load(rest, path, flags)
    values.update(fallback)
    return values


def save_state_dict(state_dict: dict, storage_writer, process_group=None, coordinator_rank: int = 0,
                    no_dist: bool = False, planner=None):
    """The older name (torch's deprecated ``save_state_dict``): ``save``
    with this writer. A torch writer or planner is served by torch's
    ``save_state_dict`` (``coordinator_rank`` honoured); dcp's own save
    takes any ``coordinator_rank`` (rank 0 of the group coordinates; the
    checkpoint is the same)."""
    if _own_writer(storage_writer, planner) is None:
        warnings.warn("dcp_torch.save_state_dict: a storage_writer or planner was given: torch "
                      "plans this save", stacklevel=2)
        return tdcp.save_state_dict(state_dict, storage_writer, process_group=process_group,
                                    coordinator_rank=coordinator_rank, no_dist=no_dist,
                                    planner=planner)
    return save(state_dict, storage_writer=storage_writer, process_group=process_group,
                no_dist=no_dist, planner=planner)


def load_state_dict(state_dict: dict, storage_reader, process_group=None, coordinator_rank: int = 0,
                    no_dist: bool = False, planner=None):
    """The older name (torch's deprecated ``load_state_dict``): ``load``
    with this reader; a torch reader or planner is served by torch's
    ``load_state_dict`` (``coordinator_rank`` honoured), dcp's own load
    takes any ``coordinator_rank``."""
    from .filesystem import FileSystemReader
    if not (type(storage_reader) is FileSystemReader and planner is None
            and not storage_reader.allow_pickle):
        warnings.warn("dcp_torch.load_state_dict: a storage_reader or planner was given: torch "
                      "plans this load", stacklevel=2)
        return tdcp.load_state_dict(state_dict, storage_reader, process_group=process_group,
                                    coordinator_rank=coordinator_rank, no_dist=no_dist,
                                    planner=planner)
    return load(state_dict, storage_reader=storage_reader, process_group=process_group,
                no_dist=no_dist, planner=planner)
