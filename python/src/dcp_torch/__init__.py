"""dcp_torch: PyTorch's distributed checkpoints written and read by dcp's C
engine.

    import torch.distributed.checkpoint as dcp
    import dcp_torch

    dcp.save(state_dict, storage_writer=dcp_torch.FileSystemWriter(path))
    dcp.load(state_dict, storage_reader=dcp_torch.FileSystemReader(path))

The checkpoint is PyTorch DCP's format: torch's own FileSystemReader loads
what these classes write, and they read what torch writes. See
python/README.md.
"""

from ._errors import (
    BusyError,
    CheckpointError,
    CorruptError,
    ExistsError,
    FormatError,
    InvalidArgumentError,
    KeyMismatchError,
    LimitError,
    NotFoundError,
    NotSupportedError,
    NoSpaceError,
    OutOfMemoryError,
    PeerError,
    PlanError,
    ShapeMismatchError,
    StorageIOError,
    TimeoutError_,
    UnsafeError,
)
from ._engine import _C
from ._metadata import read_metadata
from .filesystem import FileSystemReader, FileSystemWriter
from .api import async_save, load, save
from .utils import (
    clean,
    dcp_to_torch_save,
    export_safetensors,
    import_safetensors,
    ls,
    torch_save_to_dcp,
    verify,
)

__version__ = "0.1.0"
libdcp_version = _C.version()

__all__ = [
    "save",
    "load",
    "async_save",
    "FileSystemWriter",
    "FileSystemReader",
    "read_metadata",
    "verify",
    "ls",
    "clean",
    "dcp_to_torch_save",
    "torch_save_to_dcp",
    "export_safetensors",
    "import_safetensors",
    "CheckpointError",
    "InvalidArgumentError",
    "OutOfMemoryError",
    "StorageIOError",
    "NotFoundError",
    "FormatError",
    "UnsafeError",
    "CorruptError",
    "KeyMismatchError",
    "ShapeMismatchError",
    "LimitError",
    "PeerError",
    "NotSupportedError",
    "NoSpaceError",
    "ExistsError",
    "TimeoutError_",
    "BusyError",
    "PlanError",
]
