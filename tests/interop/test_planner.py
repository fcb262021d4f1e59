"""Issue 17 against torch 2.13: the planner recipes of torch's planner
documentation, written in C with dcp_planner.h (examples/planner_recipes.c),
checked against what torch produces with the equivalent Python planner.

- bf16 copy: dcp's cast planner and torch's FP16Planner recipe (with
  bfloat16) give the same metadata dtypes and bit-identical tensors, and
  each loads in the other's reader;
- planner data: torch loads a checkpoint carrying dcp's planner data, and
  finds the data in Metadata.planner_data;
- rename on load: dcp loads torch's checkpoint into renamed keys exactly as
  torch's RenamePlanner-style load planner does;
- the default planners: a save through them equals one without.
"""

import dataclasses
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcpio  # noqa: E402  (fails loudly without torch)
import torch  # noqa: E402
import torch.distributed.checkpoint as tdcp  # noqa: E402
from torch.distributed.checkpoint import (  # noqa: E402
    DefaultLoadPlanner, DefaultSavePlanner, FileSystemReader)
from torch.distributed.checkpoint.planner import WriteItemType  # noqa: E402

R = dcpio.Runner("planner")


def recipes(*args):
    cmd = [dcpio.prog("planner_recipes")] + [str(a) for a in args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)}: {r.stderr.strip()}")


def model_state():
    """The state examples/planner_recipes.c saves, computed the same way
    (float32 arithmetic: an int converted, divided by 7 or 3)."""
    i = torch.arange(8 * 16, dtype=torch.int64)
    w = (((i * 37) % 101) - 50).to(torch.float32) / 7.0
    b = torch.arange(16, dtype=torch.int64).to(torch.float32) / 3.0
    return {"model": {"layer.weight": w.reshape(8, 16), "layer.bias": b},
            "step": 42}


class BF16Planner(DefaultSavePlanner):
    """torch's FP16Planner recipe (SavePlanner docs), with bfloat16."""

    def create_local_plan(self):
        plan = super().create_local_plan()
        items = []
        for it in plan.items:
            if it.tensor_data is not None:
                props = dataclasses.replace(it.tensor_data.properties,
                                            dtype=torch.bfloat16)
                td = dataclasses.replace(it.tensor_data, properties=props)
                it = dataclasses.replace(it, tensor_data=td)
            items.append(it)
        plan = dataclasses.replace(plan, items=items)
        self.plan = plan
        return plan

    def resolve_data(self, write_item):
        item = super().resolve_data(write_item)
        if write_item.type == WriteItemType.BYTE_IO:
            return item
        return item.to(torch.bfloat16)


def load_torch(ck, like):
    sd = {"model": {k: torch.zeros_like(v) for k, v in like["model"].items()},
          "step": 0}
    tdcp.load(sd, checkpoint_id=ck, no_dist=True)
    return sd


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and \
        dcpio.tensor_bytes(a) == dcpio.tensor_bytes(b)


@R.test
def bf16_copy_matches_torch_planner(check, tmp):
    mine = os.path.join(tmp, "dcp_bf16")
    theirs = os.path.join(tmp, "torch_bf16")
    recipes("bf16", mine)
    tdcp.save(model_state(), checkpoint_id=theirs, planner=BF16Planner(),
              no_dist=True)
    md_m = FileSystemReader(mine).read_metadata()
    md_t = FileSystemReader(theirs).read_metadata()
    for k in ("model.layer.weight", "model.layer.bias"):
        check.eq(md_m.state_dict_metadata[k].properties.dtype,
                 md_t.state_dict_metadata[k].properties.dtype,
                 f"{k}: stored dtype")
    want = {k: v.to(torch.bfloat16) for k, v in model_state()["model"].items()}
    like = {"model": want}
    a = load_torch(mine, like)
    b = load_torch(theirs, like)
    for k in want:
        check.true(same_bits(a["model"][k], want[k]),
                   f"{k}: dcp's bf16 copy == Tensor.to(bfloat16)")
        check.true(same_bits(a["model"][k], b["model"][k]),
                   f"{k}: dcp's bf16 copy == torch's planner's")
    check.eq(a["step"], 42, "step")
    # dcp reads torch's planner's checkpoint back: same bytes.
    out = os.path.join(tmp, "renamed")
    os.makedirs(out)
    recipes("rename", theirs, "model.", "model.", out)
    for k, v in want.items():
        with open(os.path.join(out, "model." + k), "rb") as f:
            check.eq(f.read(), dcpio.tensor_bytes(v), f"dcp reads torch {k}")


@R.test
def planner_data_loads_in_torch(check, tmp):
    ck = os.path.join(tmp, "extra")
    recipes("extra", ck)
    md = FileSystemReader(ck).read_metadata()
    for k in ("model.layer.weight", "model.layer.bias"):
        check.eq(md.planner_data.get("dcp.planner_data:" + k),
                 {"dtype": "float32", "note": "master weights"},
                 f"{k}: planner data")
        check.eq(md.planner_data.get(k), ("model", k[len("model."):]),
                 f"{k}: path kept")
    got = load_torch(ck, model_state())
    for k, v in model_state()["model"].items():
        check.true(same_bits(got["model"][k], v), f"{k}: torch loads it")
    # torch's own loader without a state dict (format utils) too.
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    pt = os.path.join(tmp, "extra.pt")
    dcp_to_torch_save(ck, pt)
    sd = torch.load(pt, weights_only=True)
    check.true(same_bits(sd["model"]["layer.weight"],
                         model_state()["model"]["layer.weight"]),
               "dcp_to_torch_save of a checkpoint with planner data")


class RenameLoadPlanner(DefaultLoadPlanner):
    """torch's rename-on-load recipe: state keys 'net.*' read 'model.*'."""

    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
        self.orig = state_dict
        renamed = {("model." + k[4:] if k.startswith("net.") else k): v
                   for k, v in state_dict.items()}
        super().set_up_planner(renamed, metadata, is_coordinator)


@R.test
def rename_on_load_matches_torch(check, tmp):
    ck = os.path.join(tmp, "torch_model")
    sd = model_state()
    sd["model"]["layer.weight"] = sd["model"]["layer.weight"] * 1.5
    tdcp.save(sd, checkpoint_id=ck, no_dist=True)
    # torch's planner: flat state with the new names.
    flat = {"net.layer.weight": torch.zeros(8, 16),
            "net.layer.bias": torch.zeros(16)}
    tdcp.load(flat, checkpoint_id=ck, planner=RenameLoadPlanner(),
              no_dist=True)
    out = os.path.join(tmp, "dcp_out")
    os.makedirs(out)
    recipes("rename", ck, "model.", "net.", out)
    for k, v in flat.items():
        with open(os.path.join(out, k), "rb") as f:
            check.eq(f.read(), dcpio.tensor_bytes(v),
                     f"{k}: dcp's rename == torch's")
    check.true(same_bits(flat["net.layer.weight"],
                         sd["model"]["layer.weight"]), "torch's rename read")


@R.test
def filter_and_transform(check, tmp):
    """Skips and a user transform at save time, as torch reads them."""
    ck = os.path.join(tmp, "filtered")
    recipes("filter", ck)
    md = FileSystemReader(ck).read_metadata()
    check.eq(sorted(md.state_dict_metadata), ["model.layer.weight"],
             "only the kept key is stored")
    check.eq(md.state_dict_metadata["model.layer.weight"].properties.dtype,
             torch.float64, "stored dtype")
    w = model_state()["model"]["layer.weight"]
    sd = {"model": {"layer.weight": torch.zeros(8, 16, dtype=torch.float64)}}
    tdcp.load(sd, checkpoint_id=ck, no_dist=True)
    check.true(same_bits(sd["model"]["layer.weight"], w.double() * 2),
               "the transform's output, loaded by torch")


@R.test
def post_load_hook(check, tmp):
    """A post-load hook after torch's data landed: what torch loads + 1."""
    ck = os.path.join(tmp, "torch_model")
    sd = model_state()
    tdcp.save(sd, checkpoint_id=ck, no_dist=True)
    out = os.path.join(tmp, "out")
    os.makedirs(out)
    recipes("postload", ck, out)
    with open(os.path.join(out, "model.layer.weight"), "rb") as f:
        check.eq(f.read(),
                 dcpio.tensor_bytes(sd["model"]["layer.weight"] + 1.0),
                 "loaded + 1")


@R.test
def default_save_is_plain(check, tmp):
    ck = os.path.join(tmp, "plain")
    recipes("save", ck)
    got = load_torch(ck, model_state())
    for k, v in model_state()["model"].items():
        check.true(same_bits(got["model"][k], v), f"{k}")
    check.eq(got["step"], 42, "step")


if __name__ == "__main__":
    R.main()
