"""The three programs PyTorch's DCP documentation is built on, written
here (examples/python/tutorials/), run with `import dcp_torch as dcp`:
saved on N ranks and loaded on M, each also loaded by torch's own
torch.distributed.checkpoint and each loading what torch saved."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TUT = os.path.join(HERE, "..", "..", "examples", "python", "tutorials")


def run(prog, tmp_path, *args):
    out = subprocess.run([sys.executable, os.path.join(TUT, prog), str(tmp_path / "ck"), *args],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "identical" in out.stdout, out.stdout + out.stderr
    return out.stdout


@pytest.mark.parametrize("args", [
    ["--save-ranks", "2", "--load-ranks", "3", "--fsdp", "2"],
    ["--save-ranks", "3", "--load-ranks", "2", "--fsdp", "1"],
    ["--save-lib", "torch", "--save-ranks", "2", "--load-ranks", "3"],
    ["--load-lib", "torch", "--save-ranks", "3", "--load-ranks", "2"],
])
def test_getting_started(tmp_path, args):
    run("getting_started.py", tmp_path, *args)


@pytest.mark.parametrize("args", [
    ["--ranks", "2", "--resume-ranks", "3"],
    ["--save-lib", "torch", "--ranks", "2", "--resume-ranks", "2"],
    ["--load-lib", "torch", "--ranks", "3", "--resume-ranks", "2", "--steps", "2"],
])
def test_async_checkpoint(tmp_path, args):
    run("async_checkpoint.py", tmp_path, *args)


@pytest.mark.parametrize("args", [[], ["--save-lib", "torch"], ["--load-lib", "torch"]])
def test_fsdp_checkpoint(tmp_path, args):
    run("fsdp_checkpoint.py", tmp_path, *args)
