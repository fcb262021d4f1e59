"""The FSDP checkpoint example of PyTorch's DCP documentation
(torch/distributed/checkpoint/examples/fsdp_checkpoint_example.py), written
here, on dcp: ``import dcp_torch as dist_cp`` instead of
``import torch.distributed.checkpoint as dist_cp``.

    python fsdp_checkpoint.py DIR [--ranks N] [--save-lib dcp|torch] [--load-lib dcp|torch]

An FSDP model and Adam state saved sharded (SHARDED_STATE_DICT, the older
save_state_dict with a FileSystemWriter), loaded into a fresh model and
optimizer (load_state_dict, then load_sharded_optimizer_state_dict and
FSDP.optim_state_dict_to_load), and every tensor compared.
"""

import argparse
import os
import sys
import warnings

import torch
import torch.multiprocessing as mp
from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.fully_sharded_data_parallel import StateDictType

sys.path.insert(0, os.path.dirname(__file__))
from _common import checkpoint_module, cleanup, rendezvous, setup  # noqa: E402

warnings.filterwarnings("ignore")


def opt_at(opt, idx):
    return list(opt.state.values())[idx]


def init_model(seed):
    torch.manual_seed(seed)
    model = FSDP(torch.nn.Linear(4, 4), device_id=torch.device("cpu"))
    optim = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.rand(4, 4)).sum().backward()
    optim.step()
    return model, optim


def print_params(stage, model_1, model_2, optim_1, optim_2):
    with FSDP.summon_full_params(model_1), FSDP.summon_full_params(model_2):
        same = torch.equal(model_1.weight, model_2.weight) and torch.equal(model_1.bias, model_2.bias)
    same = same and all(torch.equal(opt_at(optim_1, 0)[k], opt_at(optim_2, 0)[k]) for k in ("exp_avg", "exp_avg_sq"))
    return same


def run(rank, world_size, store, args):
    setup(rank, world_size, store)
    save_cp = checkpoint_module(args.save_lib)
    load_cp = checkpoint_module(args.load_lib)
    model_1, optim_1 = init_model(0)
    with FSDP.state_dict_type(model_1, StateDictType.SHARDED_STATE_DICT):
        state_dict = {"model": model_1.state_dict(),
                      "optim": FSDP.optim_state_dict(model_1, optim_1)}
        save_cp.save_state_dict(state_dict=state_dict,
                                storage_writer=save_cp.FileSystemWriter(args.dir))
    model_2, optim_2 = init_model(1)
    assert not print_params("Before loading", model_1, model_2, optim_1, optim_2)
    with FSDP.state_dict_type(model_2, StateDictType.SHARDED_STATE_DICT):
        state_dict = {"model": model_2.state_dict()}
        load_cp.load_state_dict(state_dict=state_dict,
                                storage_reader=load_cp.FileSystemReader(args.dir))
        model_2.load_state_dict(state_dict["model"])
        optim_state = load_sharded_optimizer_state_dict(
            model_state_dict=state_dict["model"], optimizer_key="optim",
            storage_reader=load_cp.FileSystemReader(args.dir))
        flattened_osd = FSDP.optim_state_dict_to_load(model_2, optim_2, optim_state["optim"])
        optim_2.load_state_dict(flattened_osd)
    assert print_params("After loading", model_1, model_2, optim_1, optim_2), "tensors differ"
    if rank == 0:
        print(f"fsdp_checkpoint: {world_size} ranks, saved with {args.save_lib}, loaded with "
              f"{args.load_lib}: model and optimizer identical", flush=True)
    cleanup()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--save-lib", choices=("dcp", "torch"), default="dcp")
    p.add_argument("--load-lib", choices=("dcp", "torch"), default="dcp")
    args = p.parse_args()
    mp.spawn(run, args=(args.ranks, rendezvous(), args), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
