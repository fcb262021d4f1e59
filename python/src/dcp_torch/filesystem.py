"""Drop-in storage for ``torch.distributed.checkpoint``: torch plans the
save and the load; dcp's C engine writes and reads the bytes.

``dcp_torch.FileSystemWriter`` and ``dcp_torch.FileSystemReader`` take the
constructor arguments of torch 2.13's classes of the same name and serve
``torch.distributed.checkpoint.save`` / ``load`` / ``async_save`` on any
number of ranks of any process group. What dcp adds underneath:

* the data files go through dcp's I/O engine (O_DIRECT and io_uring where
  the file system allows, batched), each tensor record with its CRC-32 and
  per-block CRCs and the save's id; tensors are written from their own
  memory when they are contiguous CPU tensors (no copy);
* one writer per path (the lock), fresh data file names when a checkpoint
  is overwritten (the old one stays loadable until the new one commits),
  ``.metadata`` published atomically (temporary, fsync, rename) and checked
  by dcp's decoder first; the old checkpoint's files removed after;
* ``.metadata`` is read by dcp's restricted decoder into torch's own
  ``Metadata`` objects: no ``pickle.load``; tensor data is read in one
  sorted batch with its CRCs checked; byte items (non-tensor values) are
  decoded by dcp's safe decoder too;
* ``s3://bucket/prefix`` paths (dcp's S3 client, docs/S3.md).
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import uuid
import warnings
from typing import Any, Sequence

import torch
from torch.futures import Future
from torch.distributed.checkpoint.filesystem import SerializationFormat, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult

from . import _C
from ._engine import (_DTYPES, TORCH_TYPES, fspath, host_tensor, make_context, tensor_code,
                      weights_only_value)
from ._errors import InvalidArgumentError, LimitError, NotSupportedError, UnsafeError


__all__ = ["FileSystemWriter", "FileSystemReader"]

_CURRENT_DCP_VERSION = "1.0.0"  # torch 2.13's CURRENT_DCP_VERSION


@dataclasses.dataclass
class _DcpStoragePrefix:
    """A rank's part of the global save plan: its file names' prefix
    (``__<rank>_``), the tag they carry and the save's id."""

    prefix: str
    tag: str = ""
    save_id: str = ""


def _valid_checkpoint_id(checkpoint_id) -> bool:
    """Whether these classes serve checkpoint_id (torch's _storage_setup
    asks): a Path, an s3:// URL, or what torch's FileSystem takes (a path
    whose parent exists); another scheme ("abc://...") is not ours."""
    from pathlib import Path
    if isinstance(checkpoint_id, Path):
        return True
    if isinstance(checkpoint_id, str) and "://" in checkpoint_id:
        return checkpoint_id.startswith("s3://")
    from torch.distributed.checkpoint.filesystem import FileSystem
    return FileSystem.validate_checkpoint_id(checkpoint_id)


def _is_s3(path: str) -> bool:
    return path.startswith("s3://")


def _metadata_exists(path: str, name: str) -> bool:
    if _is_s3(path):
        return False  # the coordinator's begin checks (DCP_PART_NO_OVERWRITE)
    return os.path.exists(os.path.join(path, name))


def _item_size(item: WriteItem) -> int:
    td = item.tensor_data
    n = 1
    for s in td.size:
        n *= s
    return n * torch._utils._element_size(td.properties.dtype)


def _split_by_size_and_type(bins: int, items: list[WriteItem]) -> list[list[WriteItem]]:
    """torch's split of a rank's items over thread_count files: byte items
    round robin, tensors largest first onto the lightest file."""
    if bins <= 1:
        return [items]
    byts = [wi for wi in items if wi.type == WriteItemType.BYTE_IO]
    tens = sorted((wi for wi in items if wi.type != WriteItemType.BYTE_IO),
                  key=_item_size, reverse=True)
    buckets: list[list[WriteItem]] = [[] for _ in range(bins)]
    sizes = [0] * bins
    for i, wi in enumerate(byts):
        buckets[i % bins].append(wi)
    for wi in tens:
        j = min(range(bins), key=sizes.__getitem__)
        buckets[j].append(wi)
        sizes[j] += _item_size(wi)
    return [b for b in buckets if b] or [[]]


class _Engine:
    """The C engine's handles of a writer or reader: a context made on
    first use; none of them pickled (async_save's process executor pickles
    the writer: they are made again where it runs)."""

    _HANDLES: dict = {"_ctx": None}

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update({k: (v.copy() if isinstance(v, (dict, list)) else v)
                      for k, v in self._HANDLES.items()})
        return state

    def _context(self):
        if self._ctx is None:
            self._ctx = make_context(**self._ctx_args)
        return self._ctx


class FileSystemWriter(_Engine, StorageWriter, BlockingAsyncStager):
    """torch's ``FileSystemWriter``, written by dcp.

    Arguments as torch 2.13's ``FileSystemWriter``:

    * ``path``: the checkpoint directory (created), or ``s3://bucket/prefix``.
    * ``single_file_per_rank`` (True): one data file per rank (per thread
      bucket), else one per item, as torch.
    * ``sync_files`` (True): data files fsynced, ``.metadata`` published
      durably (temporary, fsync, rename, directory fsync).
    * ``thread_count`` (1): the items of a rank are split over this many
      files as torch splits them; dcp writes them one after the other, each
      through its I/O engine's ``io_depth`` requests in flight.
    * ``per_thread_copy_ahead``: bytes copied from an accelerator ahead of
      writing; dcp copies one item ahead (at most one item's bytes), which
      is within any positive value.
    * ``cache_staged_state_dict`` (False): ``async_save``'s staging copy kept
      and reused (torch's ``BlockingAsyncStager``).
    * ``overwrite`` (True): a checkpoint at ``path`` is replaced at the
      commit (it stays loadable until then); False raises
      ``ExistsError`` as torch raises.
    * ``_extensions``: stream transforms. dcp writes none (``dcptool`` and
      ``dcp_save`` offer zstd): given any, the constructor returns torch's
      own ``FileSystemWriter`` with these arguments (a warning says so),
      which ``save`` then serves through torch.
    * ``serialization_format``: ``TORCH_SAVE``; ``SAFETENSORS`` likewise
      returns torch's writer (dcp reads such checkpoints but writes
      torch.save records).

    dcp's own, keyword only: ``io_depth`` (requests in flight, 0: dcp's
    default), ``io_block_bytes``, ``direct`` (O_DIRECT where possible,
    True), ``uring`` (io_uring where available, True).

    Not thread safe: one save at a time per writer (as torch's).
    """

    _HANDLES = {"_ctx": None, "_part": None}

    def __new__(cls, *args: Any, **kwargs: Any):
        # stream transforms or safetensors records: torch's own writer
        # (dcp writes neither), as a torch writer passed to save is served
        ext = kwargs.get("_extensions", args[7] if len(args) > 7 else None)
        fmt = kwargs.get("serialization_format", args[8] if len(args) > 8 else None)
        if cls is FileSystemWriter and (ext or (fmt is not None
                                                and fmt != SerializationFormat.TORCH_SAVE)):
            from torch.distributed.checkpoint import FileSystemWriter as TorchWriter
            warnings.warn("dcp_torch.FileSystemWriter: _extensions or a serialization_format "
                          "other than TORCH_SAVE: torch's FileSystemWriter writes this "
                          "checkpoint (dcp reads it)", stacklevel=2)
            return TorchWriter(*args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        path: str | os.PathLike,
        single_file_per_rank: bool = True,
        sync_files: bool = True,
        thread_count: int = 1,
        per_thread_copy_ahead: int = 10_000_000,
        cache_staged_state_dict: bool = False,
        overwrite: bool = True,
        _extensions: Sequence[Any] | None = None,
        serialization_format: SerializationFormat = SerializationFormat.TORCH_SAVE,
        *,
        io_depth: int = 0,
        io_block_bytes: int = 0,
        direct: bool = True,
        uring: bool = True,
    ) -> None:
        StorageWriter.__init__(self)
        BlockingAsyncStager.__init__(self, cache_staged_state_dict=cache_staged_state_dict)
        if _extensions:
            raise NotSupportedError(
                "dcp_torch.FileSystemWriter: _extensions (stream transforms) are not supported; "
                "save without them (dcp checks every record's CRC-32 instead)")
        if serialization_format != SerializationFormat.TORCH_SAVE:
            raise NotSupportedError(
                f"dcp_torch.FileSystemWriter: serialization_format={serialization_format} is not "
                "supported (dcp writes torch.save records; it reads SAFETENSORS checkpoints)")
        if int(thread_count) < 1:
            raise InvalidArgumentError(f"thread_count must be >= 1, not {thread_count}")
        self.path = fspath(path)
        self.single_file_per_rank = bool(single_file_per_rank)
        self.sync_files = bool(sync_files)
        self.thread_count = int(thread_count)
        self.per_thread_copy_ahead = int(per_thread_copy_ahead)
        self.overwrite = bool(overwrite)
        self.serialization_format = serialization_format
        self.save_id = uuid.uuid4().hex
        self.rank: int | None = None
        self.use_collectives = True
        self.is_coordinator = False
        self._ctx_args = dict(io_depth=io_depth, io_block_bytes=io_block_bytes,
                              direct=direct, uring=uring)
        self._ctx = None
        self._part = None  # the coordinator's dcp_part_save
        self._sid = ""


    def _drop_part(self) -> None:
        part, self._part = self._part, None
        if part is not None:
            part.close()  # a save that failed: the lock released

    def __del__(self) -> None:
        try:
            self._drop_part()
        except Exception:
            pass

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        self._drop_part()
        if checkpoint_id:
            self.path = fspath(checkpoint_id)
        self.save_id = uuid.uuid4().hex
        self._sid = ""

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank")
        self.use_collectives = kwargs.get("use_collectives", True)

    def _rank_local(self) -> bool:
        return not self.use_collectives and self.rank is not None

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        name = f"__{self.rank}.metadata" if self._rank_local() else ".metadata"
        if os.path.isfile(self.path):
            raise InvalidArgumentError(f"'{self.path}' is a file, not a checkpoint directory")
        if _metadata_exists(self.path, name):
            if self.overwrite:
                warnings.warn(f"Detected an existing checkpoint in {self.path}, overwriting since "
                              f"overwrite={self.overwrite} (dcp keeps it loadable until the new one "
                              "commits).", stacklevel=2)
            else:
                from ._errors import ExistsError
                raise ExistsError(f"Checkpoint already exists and overwrite={self.overwrite}: "
                                  f"'{self.path}'")
        if self._rank_local():
            plan = dataclasses.replace(plan, storage_data=_DcpStoragePrefix(f"__{self.rank}_"))
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        self._drop_part()
        flags = 0 if self.overwrite else _C.DCP_PART_NO_OVERWRITE
        if self._rank_local():
            flags |= _C.DCP_PART_NO_LOCK
        self._part = self._context().part_save_begin(self.path, flags)
        sid, tag, _ = self._part.info()
        self._sid = sid
        self.save_id = sid  # the id the committed metadata will name
        out = []
        for i, plan in enumerate(plans):
            sd = plan.storage_data
            prefix = sd.prefix if isinstance(sd, _DcpStoragePrefix) else f"__{i}_"
            out.append(dataclasses.replace(plan, storage_data=_DcpStoragePrefix(prefix, tag, sid)))
        return out

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        # Any failure here, a KeyboardInterrupt raised when the engine's
        # call returns included, ends the save: torch then raises without
        # calling finish, so the coordinator releases the lock now (the
        # next save, with this writer or a new one, must not find it).
        try:
            return self._write_data(plan, planner)
        except BaseException:
            self._drop_part()
            raise

    def _write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        sp = plan.storage_data
        if not isinstance(sp, _DcpStoragePrefix):
            raise InvalidArgumentError(
                "dcp_torch.FileSystemWriter: the plan carries no dcp storage prefix (was "
                "prepare_global_plan skipped?)")
        suffix = f".{sp.tag}.distcp" if sp.tag else ".distcp"
        self.save_id = sp.save_id
        if self.single_file_per_rank:
            groups = _split_by_size_and_type(self.thread_count, list(plan.items))
        else:
            groups = [[item] for item in plan.items]
        ctx = self._context()
        results: list[WriteResult] = []
        for n, group in enumerate(groups):
            name = f"{sp.prefix}{n}{suffix}"
            # torch's order in a file: byte items first, then tensors.
            ordered = ([wi for wi in group if wi.type == WriteItemType.BYTE_IO]
                       + [wi for wi in group if wi.type != WriteItemType.BYTE_IO])
            items, keep = [], []
            for wi in ordered:
                data = planner.resolve_data(wi)
                if wi.type == WriteItemType.BYTE_IO:
                    if not isinstance(data, io.BytesIO):
                        raise InvalidArgumentError(
                            f"'{wi.index.fqn}': a byte item must resolve to io.BytesIO")
                    items.append((1, bytes(data.getbuffer())))
                    continue
                t = host_tensor(data, wi.index.fqn)
                code = tensor_code(t, wi.index.fqn)
                keep.append(t)
                items.append((0, code, tuple(t.shape), t.data_ptr(),
                              t.numel() * t.element_size()))
            extents = ctx.write_file(self.path, name, sp.save_id, items, self.sync_files)
            for wi, (off, length) in zip(ordered, extents):
                results.append(WriteResult(index=wi.index, size_in_bytes=length,
                                           storage_data=_StorageInfo(name, off, length)))
            del keep
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        if self._part is None:
            raise InvalidArgumentError(
                "dcp_torch.FileSystemWriter.finish: no save in progress (prepare_global_plan "
                "did not run on this rank)")
        try:
            self._finish(metadata, results)
        except BaseException:
            self._drop_part()  # not committed: the lock released (as write_data)
            raise

    def _finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.version = _CURRENT_DCP_VERSION
        storage_md = {}
        for wr_list in results:
            storage_md.update({wr.index: wr.storage_data for wr in wr_list})
        metadata.storage_data = storage_md
        metadata.storage_meta = StorageMeta(checkpoint_id=self.path, save_id=self._sid)
        # Pickled here (writing, not reading); dcp decodes it before the commit.
        blob = pickle.dumps(metadata, protocol=pickle.DEFAULT_PROTOCOL)
        name = f"__{self.rank}.metadata" if self._rank_local() else None
        part, self._part = self._part, None
        try:
            part.commit(name, blob, self.sync_files)
        finally:
            part.close()

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.save_id)

    @property
    def checkpoint_id(self) -> str:
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return _valid_checkpoint_id(checkpoint_id)


class FileSystemReader(_Engine, StorageReader):
    """torch's ``FileSystemReader``, read by dcp.

    * ``path``: the checkpoint directory or ``s3://bucket/prefix``; any
      checkpoint dcp reads (torch's and dcp's writers, rank-local metadata,
      zstd records, safetensors-format records).
    * ``_extension_registry``: accepted for compatibility; dcp undoes the
      transforms it knows (zstd) itself, and refuses others naming them.

    dcp's own, keyword only: ``verify`` (check CRCs, True), ``io_depth``,
    ``io_block_bytes``, ``direct``, ``uring``, ``allow_pickle`` (False):
    byte items (non-tensor values) are decoded by dcp's restricted decoder
    and handed to the planner as a fresh ``torch.save`` of the decoded
    object; a value that decoder does not hold is read by torch's
    ``weights_only`` loader (also an allow-list: io.BytesIO, sets,
    torch.Size, dtypes, tensors inside values); one both refuse raises
    ``UnsafeError`` naming the key, unless ``allow_pickle=True``,
    which hands the stored bytes to the planner as torch does (torch's
    planner then unpickles them: only for checkpoints you trust).
    """

    _HANDLES = {"_ctx": None, "_md": None, "_index": {}, "_dtypes": []}

    def __init__(
        self,
        path: str | os.PathLike,
        _extension_registry: Any = None,
        *,
        verify: bool = True,
        io_depth: int = 0,
        io_block_bytes: int = 0,
        direct: bool = True,
        uring: bool = True,
        allow_pickle: bool = False,
    ) -> None:
        super().__init__()
        self.path = fspath(path)
        self.verify = bool(verify)
        self.allow_pickle = bool(allow_pickle)
        self.load_id = uuid.uuid4().hex
        self.storage_data: dict[Any, Any] = {}
        self.rank = None
        self.use_collectives = True
        self._ctx_args = dict(io_depth=io_depth, io_block_bytes=io_block_bytes,
                              direct=direct, uring=uring)
        self._ctx = None
        self._md = None
        self._index: dict[str, int] = {}
        self._dtypes: list = []


    def _meta(self):
        """dcp's metadata of the checkpoint, opened once per load, with each
        entry's index by key and torch dtype."""
        if self._md is None:
            self._md = self._context().metadata_open(self.path)
            entries = self._md.entries()
            self._index = {e[0]: i for i, e in enumerate(entries)}
            self._dtypes = [_DTYPES.get(e[2]) if e[1] else None for e in entries]
        return self._md

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        self.storage_data = {}
        if checkpoint_id:
            self.path = fspath(checkpoint_id)
        self.load_id = uuid.uuid4().hex
        self._md = None
        self._index = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        self._md = None
        md = self._meta().build(TORCH_TYPES, self.path)
        md.storage_meta.load_id = self.load_id
        return md

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        self.storage_data = metadata.storage_data
        self.rank = kwargs.get("rank")
        self.use_collectives = kwargs.get("use_collectives", True)
        if self.storage_data is None:
            raise InvalidArgumentError("storage_data must not be None in metadata")

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def _entry(self, fqn: str) -> int:
        self._meta()  # the index of the keys, read once
        k = self._index.get(fqn)
        if k is None:
            from ._errors import KeyMismatchError
            raise KeyMismatchError(f"'{fqn}' is not in the checkpoint '{self.path}'")
        return k

    def _load_value(self, k: int, fqn: str) -> io.BytesIO:
        md = self._meta()
        if self.allow_pickle:
            return io.BytesIO(md.read_record(k, 0))
        try:
            obj = md.read_value(k)
        except (UnsafeError, NotSupportedError, LimitError) as e:
            # Outside dcp's value decoder: torch's weights_only loader.
            try:
                obj = weights_only_value(md, k, fqn, e)
            except UnsafeError as u:
                raise UnsafeError(f"{u.message}: pass allow_pickle=True to FileSystemReader to "
                                  "unpickle it as torch does (only for a checkpoint you trust)"
                                  ) from None
        buf = io.BytesIO()
        torch.save(obj, buf)
        buf.seek(0)
        return buf

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        md = self._meta()
        reads, pending = [], []
        for req in plan.items:
            fqn = req.storage_index.fqn
            k = self._entry(fqn)
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, self._load_value(k, fqn))
                continue
            base = req.storage_index.offset
            if base is None:
                base = (0,) * len(req.storage_offsets)
            offsets = tuple(int(b) + int(o) for b, o in zip(base, req.storage_offsets))
            sizes = tuple(int(x) for x in req.lengths)
            target = planner.resolve_tensor(req).detach()
            if tuple(target.shape) != sizes:
                raise InvalidArgumentError(
                    f"req {req.storage_index} mismatch sizes {tuple(target.shape)} vs {sizes}")
            stored = self._dtype(k)
            if (target.device.type == "cpu" and target.dtype == stored
                    and target.is_contiguous() and target.layout == torch.strided
                    and not target.is_conj() and not target.is_neg()):
                buf = target
            else:
                buf = torch.empty(sizes, dtype=stored)
            nbytes = buf.numel() * buf.element_size()
            reads.append((k, offsets, sizes, buf.data_ptr(), nbytes))
            pending.append((req, target, buf))
        if reads:
            md.read_boxes(reads, self.verify)
        for req, target, buf in pending:
            if buf is not target:
                target.copy_(buf)
            planner.commit_tensor(req, target)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _dtype(self, k: int) -> torch.dtype:
        dt = self._dtypes[k]
        if dt is None:
            raise NotSupportedError(f"entry {k}: a dtype torch does not name")
        return dt

    @property
    def checkpoint_id(self) -> str:
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return _valid_checkpoint_id(checkpoint_id)
