# Regenerates tests/data/torch_mixed/ with real torch 2.13 (one process):
#   .venv/bin/python tests/data/torch_mixed_gen.py tests/data/torch_mixed
# test_torch_read.c asserts exactly this content.
import sys
import warnings

import torch
import torch.distributed.checkpoint as dcp

warnings.filterwarnings("ignore")
sd = {
    "w": torch.arange(6, dtype=torch.float32).reshape(2, 3),
    "step": 7,
    "f8": torch.zeros(3, dtype=torch.float8_e4m3fn),
    "nested": {"a": torch.ones(2, dtype=torch.bfloat16), "lst": [1, 2],
               "t": (1, "x"), "b": b"hi"},
    "s0": torch.tensor(3.5),
}
dcp.save(sd, checkpoint_id=sys.argv[1])
