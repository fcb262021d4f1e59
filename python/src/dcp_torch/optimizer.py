"""torch.distributed.checkpoint.optimizer: ``load_sharded_optimizer_state_dict``
(the FSDP example's), torch's own function; given a
``dcp_torch.FileSystemReader`` it reads through dcp."""

from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict  # noqa: F401

__all__ = ["load_sharded_optimizer_state_dict"]
