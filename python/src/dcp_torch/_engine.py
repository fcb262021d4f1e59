"""The C engine (dcp_torch._C) set up for Python: the error factory, the
torch types the metadata is built of, dtype codes, default contexts."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any, Iterator

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from . import _C
from ._errors import _make

_C._set_error_factory(_make)

# Every torch dtype by its name ("float32", ...): the names dcp uses.
_DTYPES: dict[str, torch.dtype] = {
    str(v)[len("torch."):]: v for v in vars(torch).values() if isinstance(v, torch.dtype)
}

TORCH_TYPES: dict[str, Any] = {
    "Metadata": Metadata,
    "TensorStorageMetadata": TensorStorageMetadata,
    "BytesStorageMetadata": BytesStorageMetadata,
    "ChunkStorageMetadata": ChunkStorageMetadata,
    "TensorProperties": TensorProperties,
    "MetadataIndex": MetadataIndex,
    "_StorageInfo": _StorageInfo,
    "StorageMeta": StorageMeta,
    "Size": torch.Size,
    "dtypes": _DTYPES,
    "strided": torch.strided,
    "contiguous_format": torch.contiguous_format,
}

_CODES: dict[torch.dtype, int] = {}


def dtype_code(dtype: torch.dtype) -> int:
    """dcp's code of a torch dtype, 0 when dcp does not hold it."""
    code = _CODES.get(dtype)
    if code is None:
        code = _C.dtype_code(str(dtype)[len("torch."):])
        _CODES[dtype] = code
    return code


def host_tensor(t: Any, key: str) -> torch.Tensor:
    """A CPU, C-contiguous, dense tensor holding t's elements (t itself when
    it already is one: written without a copy); what dcp cannot store is
    refused naming the key."""
    from ._errors import InvalidArgumentError, NotSupportedError
    if not isinstance(t, torch.Tensor):
        raise InvalidArgumentError(f"'{key}': a {type(t).__name__}, not a tensor")
    if t.is_sparse or t.layout != torch.strided:
        raise NotSupportedError(f"'{key}': a {t.layout} tensor cannot be saved by dcp (dense tensors only)")
    if getattr(t, "is_nested", False):
        raise NotSupportedError(f"'{key}': nested tensors cannot be saved by dcp")
    if t.device.type == "meta":
        raise NotSupportedError(f"'{key}': a tensor on the meta device has no data to save")
    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t.contiguous()


MEM_HOST, MEM_CUDA = 0, 1  # dcp_mem


def dcp_direct(t: torch.Tensor) -> bool:
    """Whether dcp reads or fills t's own memory: dense, C-contiguous, no
    lazy conjugate or negation bit."""
    return (t.layout == torch.strided and t.is_contiguous() and not t.is_conj()
            and not t.is_neg() and not getattr(t, "is_nested", False))


_cudart = [False]  # DCP_CUDART pointed at torch's libcudart already


def _use_torch_cudart() -> None:
    """dcp opens libcudart itself (dlopen, DCP_CUDART or the usual names):
    pointed at the copy torch loaded (found in /proc/self/maps), unless the
    environment names one, so that both use one runtime."""
    if _cudart[0]:
        return
    _cudart[0] = True
    if os.environ.get("DCP_CUDART"):
        return
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                p = line.rstrip("\n").split(None, 5)
                if len(p) == 6 and "/libcudart.so" in p[5]:
                    os.environ["DCP_CUDART"] = p[5]
                    return
    except OSError:
        pass


def cuda_ready(devices) -> None:
    """Before dcp reads or fills CUDA tensors of these devices: the work
    queued on torch's current stream of each is finished (dcp copies on
    the legacy default stream, which does not wait for torch's streams)."""
    if not devices:
        return
    _use_torch_cudart()
    for d in devices:
        torch.cuda.current_stream(d).synchronize()


def box_source(t: torch.Tensor, key: str) -> tuple[torch.Tensor, int]:
    """(tensor, dcp_mem) a tensor box is saved from: a dense contiguous
    CUDA tensor as it is, as device memory (dcp copies it into its
    page-locked staging buffers: an async save blocks only for that copy);
    anything else as host_tensor makes it."""
    if t.device.type == "cuda":
        d = t.detach()
        if dcp_direct(d):
            return d, MEM_CUDA
    return host_tensor(t, key), MEM_HOST


def tensor_code(t: torch.Tensor, key: str) -> int:
    """dcp's dtype code of t, NotSupportedError naming the key when dcp does
    not hold its dtype."""
    code = dtype_code(t.dtype)
    if code == 0:
        from ._errors import NotSupportedError
        raise NotSupportedError(f"'{key}': dtype {t.dtype} cannot be saved by dcp")
    return code


def fspath(path: Any) -> str:
    """A checkpoint path as a str (os.PathLike accepted; s3:// kept)."""
    if isinstance(path, (str, os.PathLike)):
        return os.fspath(path)
    raise TypeError(f"a checkpoint path must be a str or os.PathLike, not {type(path).__name__}")


def make_context(io_depth: int = 0, io_block_bytes: int = 0, direct: bool = True,
                 uring: bool = True, max_metadata_bytes: int = 0,
                 max_value_bytes: int = 0, staging_budget: int = 0, comm=None,
                 rank: int = 0, size: int = 1, worker_nice: int = 0) -> "_C.Context":
    """A context of the C engine; with comm (a _comm.TorchComm), over a
    torch.distributed group (rank and size in it). worker_nice: added to
    the niceness of the thread writing async saves (dcp_ctx_options)."""
    return _C.Context(io_depth=io_depth, io_block_bytes=io_block_bytes,
                      direct=direct, uring=uring,
                      max_metadata_bytes=max_metadata_bytes,
                      max_value_bytes=max_value_bytes,
                      staging_budget=staging_budget, comm=comm, rank=rank,
                      size=size, worker_nice=worker_nice)


_local = threading.local()


def default_context() -> "_C.Context":
    """A context of the calling thread (the utilities' default)."""
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        ctx = _local.ctx = make_context()
    return ctx


def weights_only_value(md: Any, k: int, fqn: str, cause: Exception) -> Any:
    """The value of entry k of md (an opened checkpoint's metadata) that
    dcp's value decoder refused (``cause``), through torch's own restricted
    loader (weights_only: an allow-list, nothing executed), which also
    admits tensors inside values, torch.Size, dtypes, devices, sets,
    complex and io.BytesIO (torch's planner stores BytesIO values as a
    torch.save of one). UnsafeError naming the key when it refuses too."""
    import io
    from ._errors import UnsafeError
    try:
        with torch.serialization.safe_globals([io.BytesIO]):
            return torch.load(io.BytesIO(md.read_record(k, 0)), map_location="cpu",
                              weights_only=True)
    except Exception:  # noqa: BLE001 - refused: reported below
        pass
    msg = getattr(cause, "message", str(cause))
    raise UnsafeError(
        f"{msg}; the value '{fqn}' holds objects dcp's restricted decoder and torch's "
        "weights_only loader refuse (unpickle it yourself, as torch's FileSystemReader "
        "does, only for a checkpoint you trust)") from None


_deferring = [False]  # the main thread is inside a sigint_deferred block


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """A SIGINT that arrives inside the block is acted on when the block
    ends (its handler, by default KeyboardInterrupt, runs then; chained to
    the block's own exception if it raised one); a second SIGINT inside
    the block runs the handler at once. So that a collective save or load
    ends alike on every rank: the engine's collectives call Python
    (_comm.TorchComm), where a KeyboardInterrupt raised on one rank would
    fail its part of a collective the other ranks still wait in. Only on
    the main thread (the only one that runs Python signal handlers) and
    only when SIGINT has a Python handler (SIG_DFL and SIG_IGN stay)."""
    if threading.current_thread() is not threading.main_thread() or _deferring[0]:
        yield  # another thread, or inside a block already (one holds)
        return
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):
        yield
        return
    frames: list = []
    _deferring[0] = True

    def record(signum, frame):
        if frames:
            handler(signum, frame)  # the second one: at once
        frames.append(frame)

    signal.signal(signal.SIGINT, record)
    try:
        yield
    finally:
        # signal.signal runs the handlers of signals already pending first
        # (recorded here), then puts the caller's back
        signal.signal(signal.SIGINT, handler)
        _deferring[0] = False
        if frames:
            handler(signal.SIGINT, frames[0])
