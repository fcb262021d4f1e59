"""torch.distributed.checkpoint.format_utils with dcp's converters:
``dcp_to_torch_save`` and ``torch_save_to_dcp`` stream through dcp's C
engine (bounded memory; the torch.save file is read by dcp's restricted
decoder). ``BroadcastingTorchSaveReader`` and ``DynamicMetaLoadPlanner``
are torch's own (they are planners/readers torch's load drives)."""

from torch.distributed.checkpoint.format_utils import (  # noqa: F401
    BroadcastingTorchSaveReader,
    DynamicMetaLoadPlanner,
)

from .utils import dcp_to_torch_save, torch_save_to_dcp  # noqa: F401

__all__ = ["dcp_to_torch_save", "torch_save_to_dcp", "BroadcastingTorchSaveReader",
           "DynamicMetaLoadPlanner"]
