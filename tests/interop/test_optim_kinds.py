"""Every optimizer preset of dcp_statedict.h, both ways, with real torch.

For each case (an optimizer with options, the nested or the flattened
optimizer layout, one or two param groups, a frozen parameter or not):
1. torch trains 3 steps and DCP-saves get_state_dict(model, optim);
   sd_optim (tests/interop/sd_optim.c) describes the same model and
   optimizer with dcp_sd_optim_preset + the case's options and loads it
   with dcp_sd_load, strictly (its hyper-parameters must equal torch's);
   every parameter, state tensor, step and scalar must equal torch's
   bit-exact, and the group values torch's.
2. sd_optim saves torch's values through the same description; torch
   loads that checkpoint into a fresh model and optimizer (get_state_dict
   + dcp.load + set_state_dict); parameters and optimizer.state_dict()
   (Python types included) must equal the trained ones bit-exact, and one
   more optimizer step must agree bit-exact with the original's.
"""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcpio  # noqa: E402  (fails loudly without torch)
from dcpio import torch  # noqa: E402
import torch.distributed.checkpoint as tdcp  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.checkpoint.state_dict import (  # noqa: E402
    StateDictOptions, get_state_dict, set_state_dict)

R = dcpio.Runner("optim_kinds")

# dcp_optim_kind and dcp_optim_variant
(SGD, ADAM, ADAMW, ADAGRAD, RMSPROP, ADADELTA, ADAMAX, NADAM, RADAM,
 ADAFACTOR) = range(1, 11)
MOMENTUM, AMSGRAD, CENTERED = 1, 2, 4


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 5)
        self.norm = nn.LayerNorm(5)
        self.fc2 = nn.Linear(5, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


# name, torch class, kind, variant, kwargs, flat, two groups, frozen
CASES = [
    ("sgd", "SGD", SGD, 0, dict(lr=0.05), False, False, False),
    ("sgd_momentum", "SGD", SGD, MOMENTUM,
     dict(lr=0.05, momentum=0.9, nesterov=True), False, False, False),
    ("adam", "Adam", ADAM, 0, dict(lr=0.01), False, False, False),
    ("adam_amsgrad_flat", "Adam", ADAM, AMSGRAD,
     dict(lr=0.01, amsgrad=True, weight_decay=0.1), True, False, False),
    ("adamw_amsgrad", "AdamW", ADAMW, AMSGRAD,
     dict(lr=0.01, amsgrad=True, betas=(0.8, 0.99)), False, True, False),
    ("adamw_flat_groups", "AdamW", ADAMW, 0, dict(lr=0.01), True, True,
     False),
    ("adagrad", "Adagrad", ADAGRAD, 0, dict(lr=0.05), False, False, False),
    ("rmsprop", "RMSprop", RMSPROP, 0, dict(lr=0.01), False, False, False),
    ("rmsprop_momentum_centered", "RMSprop", RMSPROP, MOMENTUM | CENTERED,
     dict(lr=0.01, momentum=0.5, centered=True), True, False, False),
    ("adadelta", "Adadelta", ADADELTA, 0, {}, False, False, False),
    ("adamax", "Adamax", ADAMAX, 0, {}, False, False, True),
    ("nadam", "NAdam", NADAM, 0, {}, False, False, False),
    ("nadam_decoupled_flat", "NAdam", NADAM, 0,
     dict(decoupled_weight_decay=True, weight_decay=0.01), True, False,
     True),
    ("radam", "RAdam", RADAM, 0, dict(lr=0.01), False, True, False),
    ("adafactor", "Adafactor", ADAFACTOR, 0, {}, False, False, False),
    ("adafactor_flat_frozen_groups", "Adafactor", ADAFACTOR, 0,
     dict(lr=0.02, weight_decay=0.01), True, True, True),
]

FROZEN = "fc1.weight"  # requires_grad=False in the frozen cases


def make(case, seed):
    _, cls, _, _, kw, _, two, frozen = case
    torch.manual_seed(seed)
    model = Net()
    if frozen:
        model.get_parameter(FROZEN).requires_grad_(False)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if two:
        groups = [{"params": [p for n, p in named if n.endswith("weight")]},
                  {"params": [p for n, p in named if n.endswith("bias")],
                   "lr": 0.002}]
    else:
        groups = [p for _, p in named]
    return model, getattr(torch.optim, cls)(groups, **kw)


def group_of(case, name):
    return 1 if case[6] and name.endswith("bias") else 0


def train_step(model, optim, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 4, generator=g)
    y = torch.randn(8, 2, generator=g)
    optim.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    optim.step()


def trained(case):
    model, optim = make(case, 0)
    for s in range(3):
        train_step(model, optim, 100 + s)
    return model, optim


def options(case):
    return StateDictOptions(flatten_optimizer_state_dict=case[5])


def hp_line(g, name, v):
    if type(v) is bool:
        return f"hp {g} {name} b {int(v)}"
    if type(v) is int:
        return f"hp {g} {name} i {v}"
    if type(v) is float:
        return f"hp {g} {name} f {v.hex()}"
    if type(v) is tuple:
        return f"hp {g} {name} p {float(v[0]).hex()},{float(v[1]).hex()}"
    raise TypeError(name)


def write_spec(case, model, path):
    _, _, kind, variant, kw, flat, two, _ = case
    lines = [f"kind {kind}", f"variant {variant}", f"flat {int(flat)}",
             f"groups {2 if two else 1}"]
    for g in range(2 if two else 1):
        for k, v in kw.items():
            lines.append(hp_line(g, k, v))
        if g == 1:
            lines.append(hp_line(1, "lr", 0.002))
    for n, p in model.named_parameters():
        dims = " ".join(str(d) for d in p.shape)
        lines.append(f"param {n} {group_of(case, n)} "
                     f"{int(not p.requires_grad)} {p.dim()} {dims}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def state_names(optim):
    """State tensors and 0-d scalars, over every parameter's state."""
    tensors, scalars = [], []
    for st in optim.state.values():
        for k, v in st.items():
            if k == "step" or k in tensors or k in scalars:
                continue
            (tensors if v.dim() > 0 or k == "variance" else scalars).append(k)
    return tensors, scalars


def factor_numel(p, name):
    """Elements of Adafactor's row_var / col_var of p (0 when p has none)."""
    if p.dim() < 2:
        return 0
    shape = list(p.shape)
    shape[-1 if name == "row_var" else -2] = 1
    return int(torch.Size(shape).numel())


def flat_of(model, optim, name):
    """Parameter (name None) or state tensor name over its flat space:
    that of the parameters, or for row_var / col_var their own (every
    parameter's factor in turn); zeros where torch has none."""
    parts = []
    for p in model.parameters():
        st = optim.state.get(p, {})
        if name is None:
            parts.append(p.detach().reshape(-1))
        elif name in st:
            parts.append(st[name].detach().reshape(-1))
        elif name in ("row_var", "col_var"):
            parts.append(torch.zeros(factor_numel(p, name)))
        else:
            parts.append(torch.zeros(p.numel()))
    return torch.cat(parts).contiguous()


def sd_optim(*args):
    cmd = [dcpio.prog("sd_optim")] + [str(a) for a in args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")


def read_f32(path, n):
    with open(path, "rb") as f:
        return dcpio.tensor_from_bytes(f.read(), torch.float32, (n,))


def write_f32(path, t):
    with open(path, "wb") as f:
        f.write(dcpio.tensor_bytes(t))


def scalar_lines(model, optim):
    params = list(model.parameters())
    first = next(iter(optim.state.values()), {})
    step = int(first["step"].item()) if "step" in first else 0
    lines = [f"step {step}"]
    for name in state_names(optim)[1]:
        for i, p in enumerate(params):
            v = optim.state[p][name].item() if p in optim.state else 0.0
            lines.append(f"{name} {i} {float(v).hex()}")
    return lines


def torch_to_c(check, case, tmp):
    model, optim = trained(case)
    ck = os.path.join(tmp, "ck_torch")
    msd, osd = get_state_dict(model, optim, options=options(case))
    tdcp.save({"model": msd, "optim": osd}, checkpoint_id=ck)
    spec = os.path.join(tmp, "spec")
    write_spec(case, model, spec)
    out = os.path.join(tmp, "out")
    os.makedirs(out)
    sd_optim("load", spec, ck, out)
    for name in [None] + state_names(optim)[0]:
        want = flat_of(model, optim, name)
        got = read_f32(os.path.join(out, f"{name or 'model'}.bin"),
                       want.numel())
        check.none(dcpio.tensors_identical(want, got),
                   f"{case[0]}: {name or 'parameters'} as dcp loaded them")
    with open(os.path.join(out, "scalars.txt")) as f:
        got = f.read().split("\n")[:-1]
    want = scalar_lines(model, optim)
    check.eq([g.split()[:2] + [float.fromhex(g.split()[2])] if i else g
              for i, g in enumerate(got)],
             [w.split()[:2] + [float.fromhex(w.split()[2])] if i else w
              for i, w in enumerate(want)],
             f"{case[0]}: step and scalars as dcp loaded them")
    with open(os.path.join(out, "groups.json")) as f:
        groups = [json.loads(line) for line in f]
    want = [{k: list(v) if type(v) is tuple else v for k, v in g.items()
             if k != "params"} for g in optim.state_dict()["param_groups"]]
    check.eq(groups, want, f"{case[0]}: param_groups as dcp holds them")


def c_to_torch(check, case, tmp):
    ref = trained(case)
    model, optim = ref
    spec = os.path.join(tmp, "spec")
    write_spec(case, model, spec)
    inp = os.path.join(tmp, "in")
    os.makedirs(inp)
    for name in [None] + state_names(optim)[0]:
        write_f32(os.path.join(inp, f"{name or 'model'}.bin"),
                  flat_of(model, optim, name))
    with open(os.path.join(inp, "scalars.txt"), "w") as f:
        f.write("\n".join(scalar_lines(model, optim)) + "\n")
    ck = os.path.join(tmp, "ck_dcp")
    sd_optim("save", spec, inp, ck)
    got = make(case, 12345)
    msd, osd = get_state_dict(got[0], got[1], options=options(case))
    state = {"model": msd, "optim": osd}
    tdcp.load(state, checkpoint_id=ck)
    set_state_dict(got[0], got[1], model_state_dict=state["model"],
                   optim_state_dict=state["optim"], options=options(case))
    compare(check, ref, got, f"{case[0]} after load")
    train_step(ref[0], ref[1], 999)
    train_step(got[0], got[1], 999)
    compare(check, ref, got, f"{case[0]} after one more step")


def plain(x):
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [plain(v) for v in x]
    return x


def compare(check, a, b, what):
    pa, pb = dict(a[0].named_parameters()), dict(b[0].named_parameters())
    for name in pa:
        check.none(dcpio.tensors_identical(pa[name].detach(),
                                           pb[name].detach()),
                   f"{what}: parameter {name}")
    check.none(dcpio.nested_identical(plain(a[1].state_dict()),
                                      plain(b[1].state_dict()),
                                      "optimizer.state_dict()"),
               f"{what}: optimizer state")


def _register(case):
    def t1(check, tmp):
        torch_to_c(check, case, tmp)

    def t2(check, tmp):
        c_to_torch(check, case, tmp)

    t1.__name__ = f"torch_saves_c_loads_{case[0]}"
    t2.__name__ = f"c_saves_torch_resumes_{case[0]}"
    R.test(t1)
    R.test(t2)


for _case in CASES:
    _register(_case)

if __name__ == "__main__":
    R.main()
