"""Getting started with distributed checkpoints, on dcp: PyTorch's recipe
("Getting Started with Distributed Checkpoint") with one import changed.

    python getting_started.py DIR [--save-ranks N] [--load-ranks M]
                              [--fsdp 1|2] [--save-lib dcp|torch] [--load-lib dcp|torch]

A toy model wrapped in FSDP (FSDP1 with device_id=cpu, or fully_shard),
trained one step; an AppState Stateful holds the model and optimizer
through get_state_dict / set_state_dict; saved on N ranks, loaded on M
into a fresh model and optimizer, and every tensor compared with what was
saved. --save-lib/--load-lib torch run the same program with
torch.distributed.checkpoint itself (the checkpoints are the same format).
"""

import argparse
import sys
import warnings

import torch
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

sys.path.insert(0, __import__("os").path.dirname(__file__))
from _common import assert_equal_states, checkpoint_module, cleanup, rendezvous, full_state, setup  # noqa: E402

warnings.filterwarnings("ignore")


class AppState(Stateful):
    """The application's state as one Stateful: dcp calls state_dict() at a
    save and load_state_dict() at a load."""

    def __init__(self, model, optimizer=None):
        self.model = model
        self.optimizer = optimizer

    def state_dict(self):
        model_state_dict, optimizer_state_dict = get_state_dict(self.model, self.optimizer)
        return {"model": model_state_dict, "optim": optimizer_state_dict}

    def load_state_dict(self, state_dict):
        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"])


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(16, 16)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(16, 8)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def wrap(model, fsdp: int):
    if fsdp == 1:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        return FSDP(model, device_id=torch.device("cpu"))
    from torch.distributed.fsdp import fully_shard
    fully_shard(model.net1)
    fully_shard(model.net2)
    fully_shard(model)
    return model


def train_step(model, optimizer, seed):
    torch.manual_seed(seed)
    optimizer.zero_grad()
    model(torch.rand(8, 16)).sum().backward()
    optimizer.step()


def run_save(rank, world_size, store, args):
    setup(rank, world_size, store)
    dcp = checkpoint_module(args.save_lib)
    torch.manual_seed(0)
    model = wrap(ToyModel(), args.fsdp)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    train_step(model, optimizer, 1)
    state_dict = {"app": AppState(model, optimizer)}
    dcp.save(state_dict, checkpoint_id=args.dir)
    ref = full_state(model, optimizer)
    if rank == 0:
        torch.save(ref, args.dir + ".ref.pt")
    cleanup()


def run_load(rank, world_size, store, args):
    setup(rank, world_size, store)
    dcp = checkpoint_module(args.load_lib)
    torch.manual_seed(1)  # other weights: the load must replace them
    model = wrap(ToyModel(), args.fsdp)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    train_step(model, optimizer, 2)  # the optimizer has state to replace
    state_dict = {"app": AppState(model, optimizer)}
    dcp.load(state_dict=state_dict, checkpoint_id=args.dir)
    ref = torch.load(args.dir + ".ref.pt", weights_only=True)
    assert_equal_states(ref, full_state(model, optimizer))
    if rank == 0:
        print(f"getting_started: saved on {args.save_ranks} ranks ({args.save_lib}), loaded on "
              f"{world_size} ({args.load_lib}), FSDP{args.fsdp}: every tensor identical", flush=True)
    cleanup()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--save-ranks", type=int, default=2)
    p.add_argument("--load-ranks", type=int, default=3)
    p.add_argument("--fsdp", type=int, choices=(1, 2), default=2)
    p.add_argument("--save-lib", choices=("dcp", "torch"), default="dcp")
    p.add_argument("--load-lib", choices=("dcp", "torch"), default="dcp")
    p.add_argument("--skip-save", action="store_true")
    args = p.parse_args()
    if not args.skip_save:
        mp.spawn(run_save, args=(args.save_ranks, rendezvous(), args), nprocs=args.save_ranks, join=True)
    mp.spawn(run_load, args=(args.load_ranks, rendezvous(), args), nprocs=args.load_ranks, join=True)


if __name__ == "__main__":
    main()
