"""Issue 17 over several ranks, against torch 2.13 on 3 gloo ranks: the
same replicated state (six float32 tensors rep0..rep5 and a value epoch on
every rank) saved by dcp on 3 MPI ranks (tests/mpi/mpi_planner --save) and
by torch with the equivalent Python planner; each key lands in the same
data file (the rank that writes it), and torch loads dcp's checkpoint
bit-exact.

- dedup to the lowest rank: DCP_PLAN_DEDUP_LOWEST_RANK against
  DefaultSavePlanner(dedup_save_to_lowest_rank=True);
- the load-balanced DDP recipe of torch's SavePlanner documentation
  (DDPLoadBalancingPlanner: the state's items cut into world chunks, rank r
  saving chunk r) against dcp's item hook doing the same.
"""

import math
import os
import sys
from itertools import islice

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcpio  # noqa: E402  (fails loudly without torch)
from dcpio import torch  # noqa: E402
import torch.distributed.checkpoint as tdcp  # noqa: E402
from torch.distributed.checkpoint import (  # noqa: E402
    DefaultSavePlanner, FileSystemReader)

R = dcpio.Runner("planner_mpi")
WORLD = 3
NREP, NEL = 6, 64


def rep_state():
    """mpi_planner.c's make_rep: rep<i>[j] = i * 1000 + j, epoch 3."""
    sd = {f"rep{i}": torch.arange(NEL, dtype=torch.float32) + i * 1000
          for i in range(NREP)}
    sd["epoch"] = 3
    return sd


class DDPLoadBalancingPlanner(DefaultSavePlanner):
    """The recipe of torch's SavePlanner documentation."""

    def create_local_plan(self):
        def chunk(it, size):
            it = iter(it)
            return list(iter(lambda: tuple(islice(it, size)), ()))

        import torch.distributed as dist
        all_items = list(self.state_dict.items())
        world = dist.get_world_size()
        per = math.ceil(len(all_items) / world)
        items_per_rank = [dict(c) for c in chunk(all_items, per)]
        items_per_rank += [{}] * (world - len(items_per_rank))
        self.state_dict = items_per_rank[dist.get_rank()]
        return super().create_local_plan()


def torch_save(rank, world, ck, mode):
    planner = (DefaultSavePlanner(dedup_save_to_lowest_rank=True)
               if mode == "lowest" else DDPLoadBalancingPlanner())
    tdcp.save(rep_state(), checkpoint_id=ck, planner=planner)


def files_of(ck):
    """{key: data file} from a checkpoint's metadata."""
    md = FileSystemReader(ck).read_metadata()
    return {idx.fqn: info.relative_path
            for idx, info in md.storage_data.items()}


def writer_of(name):
    """The rank of a data file name __<r>_0[.<tag>].distcp."""
    return int(name[2:].split("_")[0])


def compare(check, tmp, mode):
    theirs = os.path.join(tmp, f"torch_{mode}")
    mine = os.path.join(tmp, f"dcp_{mode}")
    dcpio.run_ranks(check, WORLD, torch_save, (theirs, mode), tmp)
    r = dcpio.mpiexec(WORLD, "--save", mode, mine, tmp=tmp,
                      program="mpi_planner")
    check.eq(r.returncode, 0, f"dcp save ({r.stderr.strip()})")
    t = {k: writer_of(v) for k, v in files_of(theirs).items()}
    m = {k: writer_of(v) for k, v in files_of(mine).items()}
    check.eq(m, t, f"{mode}: the rank writing each key, dcp == torch")
    want = rep_state()
    got = {k: torch.zeros_like(v) for k, v in want.items() if k != "epoch"}
    got["epoch"] = 0
    tdcp.load(got, checkpoint_id=mine, no_dist=True)
    for k, v in want.items():
        if k == "epoch":
            check.eq(got[k], v, "epoch")
        else:
            check.true(dcpio.tensor_bytes(got[k]) == dcpio.tensor_bytes(v),
                       f"{mode}: torch loads dcp's {k} bit-exact")


@R.test
def dedup_lowest_rank(check, tmp):
    compare(check, tmp, "lowest")


@R.test
def ddp_load_balanced(check, tmp):
    compare(check, tmp, "ddp")


if __name__ == "__main__":
    R.main()
