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
from . import _exit  # noqa: F401  (the exit grace for gloo workers)
from ._metadata import read_metadata
from .filesystem import FileSystemReader, FileSystemWriter
from .api import async_save, load, load_state_dict, save, save_state_dict
from .manager import CheckpointManager
from . import format_utils, optimizer  # noqa: E402  (torch's submodule names)
# The names programs reach through `dcp.` (import dcp_torch as dcp): torch's
# own planners, metadata and protocols, unchanged.
from torch.distributed.checkpoint import (  # noqa: E402
    BytesStorageMetadata,
    ChunkStorageMetadata,
    DefaultLoadPlanner,
    DefaultSavePlanner,
    LoadPlan,
    LoadPlanner,
    Metadata,
    ReadItem,
    SavePlan,
    SavePlanner,
    StorageReader,
    StorageWriter,
    TensorStorageMetadata,
    WriteItem,
)
from torch.distributed.checkpoint import (  # noqa: E402
    CheckpointException,
    HuggingFaceStorageReader,
    HuggingFaceStorageWriter,
    QuantizedHuggingFaceStorageReader,
    load_sharded_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful  # noqa: E402
from .utils import (
    clean,
    dcp_to_torch_save,
    export_safetensors,
    import_safetensors,
    ls,
    torch_save_to_dcp,
    verify,
)

# torch's submodules that dcp_torch has none of its own for (the planners,
# metadata, stagers, Stateful, ...): `dcp.default_planner`,
# `from dcp_torch.staging import ...` reach torch's, as a program written for
# `torch.distributed.checkpoint` reaches them. dcp_torch's own (api,
# filesystem, format_utils, optimizer, utils) are not replaced.
_TORCH_SUBMODULES = ("_extension", "_nested_dict", "_storage_utils", "_traverse", "default_planner",
                     "hf_storage", "logger", "metadata", "planner", "planner_helpers", "resharding",
                     "staging", "state_dict", "state_dict_loader", "state_dict_saver", "stateful",
                     "storage")


def __getattr__(name: str):
    if name in _TORCH_SUBMODULES:
        import importlib
        import sys
        mod = importlib.import_module("torch.distributed.checkpoint." + name)
        sys.modules.setdefault(f"{__name__}.{name}", mod)
        return mod
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _alias_submodules() -> None:
    import sys
    for name in _TORCH_SUBMODULES:
        mod = sys.modules.get("torch.distributed.checkpoint." + name)
        if mod is not None:  # already imported by torch: aliased now
            sys.modules.setdefault(f"{__name__}.{name}", mod)


_alias_submodules()

__version__ = "0.1.0"
libdcp_version = _C.version()

__all__ = [
    "save",
    "load",
    "async_save",
    "save_state_dict",
    "load_state_dict",
    "Stateful",
    "CheckpointException",
    "HuggingFaceStorageReader",
    "HuggingFaceStorageWriter",
    "QuantizedHuggingFaceStorageReader",
    "load_sharded_optimizer_state_dict",
    "CheckpointManager",
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
