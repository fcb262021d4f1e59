"""Asynchronous saving, on dcp: PyTorch's recipe ("Asynchronous Saving with
Distributed Checkpoint") with one import changed.

    python async_checkpoint.py DIR [--ranks N] [--steps K] [--resume-ranks M]
                              [--save-lib dcp|torch] [--load-lib dcp|torch]

A model wrapped in fully_shard trains K steps; every step starts
dcp.async_save of the AppState after waiting for the previous save's future
(at most one in flight), the training step overlapping the save. Then a
resume on M ranks loads the last checkpoint into a fresh model and checks
every tensor against the state after the last saved step.
"""

import argparse
import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.dirname(__file__))
from _common import assert_equal_states, checkpoint_module, cleanup, rendezvous, full_state, setup  # noqa: E402

warnings.filterwarnings("ignore")


class AppState(Stateful):
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


def make(seed):
    torch.manual_seed(seed)
    model = ToyModel()
    fully_shard(model)
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def run_train(rank, world_size, store, args):
    setup(rank, world_size, store)
    dcp = checkpoint_module(args.save_lib)
    model, optimizer = make(0)
    loss_fn = nn.MSELoss()
    checkpoint_future = None
    # torch's async_save runs its collectives on a background thread: its
    # recipe gives it a gloo group of its own, or they meet the training
    # step's. dcp_torch makes and caches such a group itself.
    extra = {"process_group": dist.new_group(backend="gloo")} if args.save_lib == "torch" else {}
    for step in range(args.steps):
        torch.manual_seed(100 + step)
        optimizer.zero_grad()
        loss_fn(model(torch.rand(8, 16)), torch.rand(8, 8)).backward()
        optimizer.step()
        # at most one save in flight: wait for the previous one first
        if checkpoint_future is not None:
            checkpoint_future.result()
        state_dict = {"app": AppState(model, optimizer)}
        checkpoint_future = dcp.async_save(state_dict, checkpoint_id=f"{args.dir}/step{step}", **extra)
        ref = full_state(model, optimizer)  # what this save holds
    checkpoint_future.result()
    if rank == 0:
        torch.save(ref, f"{args.dir}/last.ref.pt")
    cleanup()


def run_resume(rank, world_size, store, args):
    setup(rank, world_size, store)
    dcp = checkpoint_module(args.load_lib)
    model, optimizer = make(7)
    torch.manual_seed(3)
    model(torch.rand(2, 16)).sum().backward()
    optimizer.step()
    state_dict = {"app": AppState(model, optimizer)}
    dcp.load(state_dict, checkpoint_id=f"{args.dir}/step{args.steps - 1}")
    assert_equal_states(torch.load(f"{args.dir}/last.ref.pt", weights_only=True),
                        full_state(model, optimizer))
    if rank == 0:
        print(f"async_checkpoint: {args.steps} async saves on {args.ranks} ranks ({args.save_lib}), "
              f"resumed on {world_size} ({args.load_lib}): every tensor identical", flush=True)
    cleanup()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--resume-ranks", type=int, default=3)
    p.add_argument("--save-lib", choices=("dcp", "torch"), default="dcp")
    p.add_argument("--load-lib", choices=("dcp", "torch"), default="dcp")
    args = p.parse_args()
    mp.spawn(run_train, args=(args.ranks, rendezvous(), args), nprocs=args.ranks, join=True)
    mp.spawn(run_resume, args=(args.resume_ranks, rendezvous(), args), nprocs=args.resume_ranks,
             join=True)


if __name__ == "__main__":
    main()
