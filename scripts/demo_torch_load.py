"""Load a checkpoint written by dcp with PyTorch's own DCP reader.

    .venv/bin/python scripts/demo_torch_load.py CHECKPOINT_DIR

Reads the metadata with torch.distributed.checkpoint.FileSystemReader, builds
a flat state dict from it (an empty tensor of the recorded shape and dtype per
tensor, None for any other value), loads it in place with the public
torch.distributed.checkpoint.load, and prints each key with its dtype, shape
and a CRC-32 of its bytes.
"""

import os
import sys
import warnings
import zlib

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

# dcp.load warns that it runs without a process group; that is intended here.
warnings.filterwarnings("ignore", category=UserWarning)


def tensor_crc(t):
    t = t.detach().contiguous().cpu()
    if t.numel() == 0:
        return 0
    return zlib.crc32(t.view(-1).view(torch.uint8).numpy().tobytes())


def main(argv):
    if len(argv) != 2:
        print(f"usage: {argv[0]} CHECKPOINT_DIR", file=sys.stderr)
        return 2
    path = argv[1]
    if not os.path.isfile(os.path.join(path, ".metadata")):
        print(f"{argv[0]}: no checkpoint at {path} (no .metadata)", file=sys.stderr)
        return 1
    md = dcp.FileSystemReader(path).read_metadata()
    n_tensors = sum(
        isinstance(v, TensorStorageMetadata)
        for v in md.state_dict_metadata.values()
    )
    print(
        f"torch {torch.__version__}: {path}: {len(md.state_dict_metadata)} "
        f"entries in .metadata ({n_tensors} tensors)"
    )

    sd = {}
    for key, smd in md.state_dict_metadata.items():
        if isinstance(smd, TensorStorageMetadata):
            sd[key] = torch.empty(smd.size, dtype=smd.properties.dtype)
        else:
            sd[key] = None  # bytes/object entry: torch.load fills it in
    dcp.load(sd, checkpoint_id=path)

    total = 0
    for key, val in sorted(sd.items()):
        if isinstance(val, torch.Tensor):
            crc = tensor_crc(val)
            shape = "x".join(map(str, val.shape)) or "scalar"
            print(f"  {key:<40} {str(val.dtype):<16} {shape:<14} crc32={crc:08x}")
        else:
            data = val if isinstance(val, bytes) else repr(val).encode()
            crc = zlib.crc32(data)
            shown = repr(val)
            if len(shown) > 40:
                shown = shown[:37] + "..."
            print(f"  {key:<40} {type(val).__name__:<16} {shown}")
        total = zlib.crc32(key.encode() + crc.to_bytes(4, "little"), total)
    print(f"loaded by torch.distributed.checkpoint.load: checksum {total:08x}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
