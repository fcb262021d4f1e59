"""Makes the small PyTorch-written checkpoints that the CLI golden tests
(tests/cli/) use. Run with a Python that has torch 2.13:

    .venv/bin/python tests/data/make_fixtures.py

It rewrites tests/data/torch_small/ and tests/data/torch_sharded/. The
tensor and value content is deterministic; the .metadata files are not
byte-identical between runs (torch records a fresh save_id uuid), which no
golden output depends on. Keep the result small (it is committed): about
25 KB. Only loopback networking is used (gloo on 127.0.0.1).

torch_small    (one rank)
  model.w      float32  [3,4]   (arange(12) - 4) / 4
  model.b      bfloat16 [4]     1, -2, 0.5, 3
  model.ids    int64    [2,3]   1000 * arange(6) - 2000
  model.mask   bool     [5]     T F T T F
  model.f8     float8_e4m3fn [4]  bytes 00 38 40 c8 (0, 1, 2, -4)
  model.scalar float64  []      2.5
  model.empty  float16  [0,3]
  step         value    7
  info         value    ("tiny", 0.5, True, None, b"\x00\xff", [1, 2])
torch_sharded  (two ranks, DTensors on a 1-d mesh)
  x            float32  [6,4]   arange(24), Shard(0): 2 chunks of [3,4]
  y            int32    [3,5]   arange(15) - 7, Shard(1): [3,3] and [3,2]
  step         value    1
"""

import datetime
import os
import shutil
import socket
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as tdcp
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))


def small_state():
    return {
        "model": {
            "w": (torch.arange(12, dtype=torch.float32) - 4).reshape(3, 4) / 4,
            "b": torch.tensor([1, -2, 0.5, 3], dtype=torch.bfloat16),
            "ids": (1000 * torch.arange(6, dtype=torch.int64) - 2000)
            .reshape(2, 3),
            "mask": torch.tensor([True, False, True, True, False]),
            "f8": torch.tensor([0x00, 0x38, 0x40, 0xC8], dtype=torch.uint8)
            .view(torch.float8_e4m3fn),
            "scalar": torch.tensor(2.5, dtype=torch.float64),
            "empty": torch.zeros((0, 3), dtype=torch.float16),
        },
        "step": 7,
        "info": ("tiny", 0.5, True, None, b"\x00\xff", [1, 2]),
    }


def sharded_full():
    return {
        "x": torch.arange(24, dtype=torch.float32).reshape(6, 4),
        "y": (torch.arange(15, dtype=torch.int32) - 7).reshape(3, 5),
    }


def _sharded_worker(rank, world, port):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
        world_size=world, timeout=datetime.timedelta(seconds=60))
    mesh = init_device_mesh("cpu", (world,))
    full = sharded_full()
    state = {
        "x": distribute_tensor(full["x"], mesh, [Shard(0)]),
        "y": distribute_tensor(full["y"], mesh, [Shard(1)]),
        "step": 1,
    }
    tdcp.save(state, checkpoint_id="torch_sharded")
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    os.chdir(HERE)  # relative checkpoint ids: no local paths in .metadata
    for name in ("torch_small", "torch_sharded"):
        shutil.rmtree(name, ignore_errors=True)
    tdcp.save(small_state(), checkpoint_id="torch_small")
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    mp.spawn(_sharded_worker, args=(2, free_port()), nprocs=2, join=True)
    total = 0
    for name in ("torch_small", "torch_sharded"):
        for f in sorted(os.listdir(name)):
            size = os.path.getsize(os.path.join(name, f))
            total += size
            print(f"{name}/{f}: {size} bytes")
    print(f"total {total} bytes")
    if total > 100_000:
        sys.exit("fixtures too large to commit")


if __name__ == "__main__":
    main()
