"""The C trainer (examples/train_mlp.c) and PyTorch resume each other.

train_mlp trains a small MLP with AdamW, data parallel on MPI ranks with
the optimizer state sharded (ZeRO-1), and checkpoints through
dcp_statedict.h. Here:

- c_to_torch: train_mlp runs steps 1..30 on 2 ranks, checkpointing every
  10. The same nn.Module and torch.optim.AdamW (two param groups) load its
  step-20 checkpoint with get_state_dict + dcp.load + set_state_dict
  (strict, as torch's recipe does), and train steps 21..30 on the same
  data: every loss matches the C trainer's within LOSS_RTOL, and the
  parameters after step 30 match the C trainer's step-30 checkpoint within
  PARAM_ATOL. The loaded state itself is checked bit-exact, and the
  checkpoint's keys are exactly those torch's own dcp.save writes for the
  same model and optimizer.
- torch_to_c: PyTorch saves its state after step 30 with get_state_dict +
  dcp.save (plus the trainer's settings); train_mlp resumes from it on 3
  ranks and trains steps 31..40, matching PyTorch's own steps 31..40 within
  LOSS_RTOL.

Tolerances. Both sides compute in float32 but in other orders (torch's
matmuls vs the C loops; the C trainer also rounds each sample's gradient to
2^-36 fixed point so that its sums do not depend on the rank count), so
the trajectories drift apart by float32 rounding. Measured over 10 steps:
relative loss differences up to 1.2e-7, parameter differences up to 3e-8.
LOSS_RTOL = 1e-5 and PARAM_ATOL = 1e-5 leave a margin of about 100, and
still catch a wrong step: after loading, an lr 1% off moves the losses by
1e-3 (relative), a step count off by one by 1.7e-4, weight decay on the
biases' group by 3.5e-5.
"""

import os
import shlex
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcpio  # noqa: E402  (fails loudly without torch)
from dcpio import torch  # noqa: E402
import torch.distributed.checkpoint as tdcp  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.checkpoint.state_dict import (  # noqa: E402
    get_state_dict, set_state_dict)

R = dcpio.Runner("train_torch_mpi")

LOSS_RTOL = 1e-5
PARAM_ATOL = 1e-5
BATCH, SEED = 32, 1
D_IN, HIDDEN, N_CLASS = 16, 64, 8
M64 = (1 << 64) - 1


# ------------------------------------------------- the C trainer's data

def mix(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def hash3(seed, a, b):
    return mix(mix(mix(seed) ^ a) ^ b)


TEACHER = [[hash3(SEED ^ 0x7EAC4E5, c, j) % 7 - 3 for j in range(D_IN)]
           for c in range(N_CLASS)]


def batch(step):
    """Samples (step-1)*B .. step*B-1, as examples/train_mlp.c makes them."""
    xs, ys = [], []
    for i in range(BATCH):
        n = (step - 1) * BATCH + i
        xi = [hash3(SEED, n, j) % 17 - 8 for j in range(D_IN)]
        scores = [sum(t * x for t, x in zip(row, xi)) for row in TEACHER]
        ys.append(max(range(N_CLASS), key=lambda c: (scores[c], -c)))
        xs.append([x / 8.0 for x in xi])
    return (torch.tensor(xs, dtype=torch.float32),
            torch.tensor(ys, dtype=torch.int64))


# --------------------------------------------------- the same in torch

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(D_IN, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, HIDDEN)
        self.fc3 = nn.Linear(HIDDEN, N_CLASS)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def make():
    torch.manual_seed(1234)  # any: the checkpoint replaces everything
    model = MLP()
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    optim = torch.optim.AdamW(
        [{"params": weights, "weight_decay": 0.1},
         {"params": biases, "weight_decay": 0.0}],
        lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    return model, optim


def full_state(model, optim):
    msd, osd = get_state_dict(model, optim)
    return {"model": msd, "optim": osd,
            "trainer": {"batch": BATCH, "seed": SEED}}


def load_into_torch(ck):
    model, optim = make()
    state = full_state(model, optim)
    tdcp.load(state, checkpoint_id=ck)
    set_state_dict(model, optim, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    return model, optim, state


def train(model, optim, first, last):
    losses = {}
    for s in range(first, last + 1):
        x, y = batch(s)
        optim.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optim.step()
        losses[s] = loss.item()
    return losses


# ------------------------------------------------------- the C trainer

def train_mlp(np, tmp, *args):
    launcher = os.environ.get("DCP_MPIEXEC")
    cmd = (shlex.split(launcher) if launcher
           else [shutil.which("mpiexec") or "mpiexec", "--oversubscribe"])
    cmd += [os.environ.get("DCP_MPIEXEC_NUMPROC_FLAG") or "-n", str(np),
            dcpio.prog("train_mlp"), "--quiet"] + [str(a) for a in args]
    env = dict(os.environ)
    for k in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
              "OMPI_MCA_rmaps_base_oversubscribe"):
        env.setdefault(k, "1")
    env["OMPI_MCA_orte_tmpdir_base"] = os.path.join(tmp, "ompi")
    os.makedirs(env["OMPI_MCA_orte_tmpdir_base"], exist_ok=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                       env=env)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}:\n"
                             f"{r.stdout}{r.stderr}")


def read_log(path):
    losses = {}
    with open(path) as f:
        for line in f:
            w = line.split()
            if w[0] == "step":
                losses[int(w[1])] = float(w[3])
    return losses


def compare_losses(check, got, want, what):
    worst = 0.0
    for s in sorted(want):
        check.true(s in got, f"{what}: step {s} ran")
        if s in got:
            rel = abs(got[s] - want[s]) / abs(want[s])
            worst = max(worst, rel)
            check.true(rel <= LOSS_RTOL,
                       f"{what}: step {s} loss {got[s]!r} vs {want[s]!r} "
                       f"(relative {rel:.3g} > {LOSS_RTOL})")
    print(f"  {what}: {len(want)} losses, largest relative difference "
          f"{worst:.3g} (bound {LOSS_RTOL})", flush=True)


def compare_params(check, a, b, what):
    worst = 0.0
    for (name, p), (name2, q) in zip(a.named_parameters(),
                                     b.named_parameters()):
        d = (p.detach() - q.detach()).abs().max().item()
        worst = max(worst, d)
        check.true(d <= PARAM_ATOL, f"{what}: {name} differs by {d:.3g}")
    print(f"  {what}: largest parameter difference {worst:.3g} "
          f"(bound {PARAM_ATOL})", flush=True)


def metadata_keys(ck):
    return set(tdcp.FileSystemReader(ck).read_metadata()
               .state_dict_metadata.keys())


# ------------------------------------------------------------- the tests

@R.test
def c_to_torch(check, tmp):
    ck = os.path.join(tmp, "c")
    log = os.path.join(tmp, "c.log")
    train_mlp(2, tmp, "--steps", 30, "--every", 10, "--dir", ck, "--log", log)
    c_losses = read_log(log)
    ck20 = os.path.join(ck, "step-000020")

    # The same keys torch writes for the same model and optimizer.
    model, optim = make()
    train(model, optim, 1, 1)
    ref = os.path.join(tmp, "torch_layout")
    tdcp.save(full_state(model, optim), checkpoint_id=ref)
    check.eq(sorted(metadata_keys(ck20)), sorted(metadata_keys(ref)),
             "checkpoint keys")

    model, optim, state = load_into_torch(ck20)
    # What landed is what was saved, bit for bit.
    raw = {k: torch.empty_like(v) if isinstance(v, torch.Tensor) else v
           for k, v in dcpio.flatten(state)[0].items()}
    tdcp.load(raw, checkpoint_id=ck20)
    for name, p in model.named_parameters():
        check.none(dcpio.tensors_identical(raw[f"model.{name}"], p.detach()),
                   f"parameter {name} after set_state_dict")
    osd = optim.state_dict()
    names = [n for n, _ in model.named_parameters()]
    pid = {n: i for i, n in enumerate(
        names[0::2] + names[1::2])}  # ids: weights (group 0), then biases
    for n in names:
        st = osd["state"][pid[n]]
        check.eq(st["step"].item(), 20.0, f"step of {n}")
        for k in ("exp_avg", "exp_avg_sq"):
            check.none(dcpio.tensors_identical(
                raw[f"optim.state.{n}.{k}"], st[k]), f"{k} of {n}")
    groups = osd["param_groups"]
    check.eq([g["weight_decay"] for g in groups], [0.1, 0.0], "weight decay")
    check.eq([g["betas"] for g in groups], [(0.9, 0.95)] * 2, "betas")
    check.eq(groups[0]["lr"], 3e-3, "lr")

    compare_losses(check, train(model, optim, 21, 30),
                   {s: c_losses[s] for s in range(21, 31)},
                   "torch steps 21..30 vs C")
    c30, _ = make()
    msd = c30.state_dict()
    tdcp.load({"model": msd}, checkpoint_id=os.path.join(ck, "step-000030"))
    c30.load_state_dict(msd)
    compare_params(check, model, c30, "torch after step 30 vs C")


@R.test
def torch_to_c(check, tmp):
    ck = os.path.join(tmp, "c")
    train_mlp(2, tmp, "--steps", 20, "--every", 20, "--dir", ck)
    model, optim, _ = load_into_torch(os.path.join(ck, "step-000020"))
    train(model, optim, 21, 30)
    t30 = os.path.join(tmp, "torch-step-30")
    tdcp.save(full_state(model, optim), checkpoint_id=t30)
    torch_losses = train(model, optim, 31, 40)

    log = os.path.join(tmp, "resumed.log")
    train_mlp(3, tmp, "--steps", 40, "--every", 10, "--resume", t30,
              "--dir", os.path.join(tmp, "c2"), "--log", log)
    compare_losses(check, read_log(log), torch_losses,
                   "C steps 31..40 (3 ranks, from torch) vs torch")
    c40, _ = make()
    msd = c40.state_dict()
    tdcp.load({"model": msd},
              checkpoint_id=os.path.join(tmp, "c2", "step-000040"))
    c40.load_state_dict(msd)
    compare_params(check, c40, model, "C after step 40 vs torch")


if __name__ == "__main__":
    R.main()
