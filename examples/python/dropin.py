"""PyTorch's distributed checkpoint with dcp underneath: one import and
the writer/reader you pass are all that change.

    .venv/bin/python examples/python/dropin.py [CHECKPOINT_DIR]

A small model and its AdamW state (torch's get_state_dict) saved with
dcp_torch.FileSystemWriter, loaded back into a fresh model and optimizer
with dcp_torch.FileSystemReader and with torch's own FileSystemReader, and
compared tensor by tensor; the metadata read without pickle.
"""

import sys
import tempfile
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import dcp_torch

warnings.filterwarnings("ignore", category=UserWarning)  # no process group: one process


def model_and_optim(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(16, 64)).sum().backward()
    optim.step()
    return model, optim


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="dcp-torch-demo-")
    model, optim = model_and_optim(0)
    msd, osd = get_state_dict(model, optim)
    dcp.save({"model": msd, "optim": osd}, storage_writer=dcp_torch.FileSystemWriter(path))
    print(f"saved with dcp_torch.FileSystemWriter into {path}")

    md = dcp_torch.read_metadata(path)  # torch's Metadata, decoded without pickle
    print(f"  {len(md.state_dict_metadata)} entries, save id {md.storage_meta.save_id}")
    dcp_torch.verify(path)
    print("  dcp_torch.verify: every record and CRC checked")

    for name, reader in (("dcp_torch.FileSystemReader", dcp_torch.FileSystemReader(path)),
                         ("torch's FileSystemReader", dcp.FileSystemReader(path))):
        model2, optim2 = model_and_optim(1)  # different weights
        msd2, osd2 = get_state_dict(model2, optim2)
        sd = {"model": msd2, "optim": osd2}
        dcp.load(sd, storage_reader=reader)
        set_state_dict(model2, optim2, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                    model2.state_dict().values()))
        st1, st2 = optim.state_dict()["state"], optim2.state_dict()["state"]
        same = same and all(torch.equal(st1[i][k], st2[i][k]) for i in st1 for k in st1[i])
        print(f"  loaded with {name}: every parameter and AdamW moment "
              f"{'identical' if same else 'DIFFERENT'}")
        if not same:
            sys.exit(1)


if __name__ == "__main__":
    main()
