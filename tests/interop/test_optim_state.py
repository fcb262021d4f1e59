"""A real model + AdamW state through both directions.

1. PyTorch saves get_state_dict(model, optim); dcp dumpall reads it
   bit-exact.
2. dcp saves the same state (savefrom); PyTorch loads it into a fresh
   model/optimizer (get_state_dict + dcp.load + set_state_dict). Parameters
   and optimizer state must equal the originals bit-exact, and one more
   optimizer step must give identical results on both.
The same procedure on PyTorch's own checkpoint is run as a control.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcpio  # noqa: E402  (fails loudly without torch)
from dcpio import torch  # noqa: E402
import torch.distributed.checkpoint as tdcp  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.checkpoint.state_dict import (  # noqa: E402
    get_state_dict, set_state_dict)

R = dcpio.Runner("optim_state")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.norm = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


def make(seed):
    torch.manual_seed(seed)
    model = Net()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    return model, optim


def train_step(model, optim, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 6, generator=g)
    y = torch.randn(8, 3, generator=g)
    optim.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    optim.step()


def trained():
    model, optim = make(0)
    for s in range(4):
        train_step(model, optim, 100 + s)
    return model, optim


def full_state(model, optim):
    msd, osd = get_state_dict(model, optim)
    return {"model": msd, "optim": osd}


def plain(x):
    """Mappings as plain dicts (state_dict() returns OrderedDicts)."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [plain(v) for v in x]
    return x


def restore_into_fresh(ck):
    model, optim = make(12345)  # different initial weights
    state = full_state(model, optim)  # initialises the optimizer state
    tdcp.load(state, checkpoint_id=ck)
    set_state_dict(model, optim, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    return model, optim


def compare_models(check, a, b, what):
    pa, pb = dict(a[0].named_parameters()), dict(b[0].named_parameters())
    check.eq(sorted(pb), sorted(pa), f"{what}: parameter names")
    for name in pa:
        if name in pb:
            check.none(dcpio.tensors_identical(pa[name].detach(),
                                               pb[name].detach()),
                       f"{what}: parameter {name}")
    check.none(dcpio.nested_identical(plain(a[1].state_dict()),
                                      plain(b[1].state_dict()),
                                      "optimizer.state_dict()"),
               f"{what}: optimizer state")


def restore_and_step(check, ck, ref, what):
    got = restore_into_fresh(ck)
    compare_models(check, ref, got, f"{what} after load")
    train_step(ref[0], ref[1], 999)
    train_step(got[0], got[1], 999)
    compare_models(check, ref, got, f"{what} after one more step")


@R.test
def torch_saves_dcp_reads(check, tmp):
    model, optim = trained()
    state = full_state(model, optim)
    ck = os.path.join(tmp, "ck_torch")
    tdcp.save(state, checkpoint_id=ck)
    dcpio.compare_dump(state, dcpio.dcp_dumpall(ck, tmp), check)


@R.test
def control_torch_saves_torch_loads(check, tmp):
    ref = trained()
    ck = os.path.join(tmp, "ck_torch")
    tdcp.save(full_state(*ref), checkpoint_id=ck)
    restore_and_step(check, ck, ref, "control (torch checkpoint)")


@R.test
def dcp_saves_torch_loads(check, tmp):
    ref = trained()
    state = full_state(*ref)
    ck = os.path.join(tmp, "ck_dcp")
    dcpio.dcp_save_manifest(state, ck, tmp)
    restore_and_step(check, ck, ref, "dcp checkpoint")


if __name__ == "__main__":
    R.main()
