"""Issue 19 (memory tiers) against torch 2.13: mpi_tier saves one step on
4 ranks grouped as 2 nodes (one tier-0 directory each) and drains it to
tier 1, and saves the same state plainly with dcp_save. torch reads the
tier-1 checkpoint as it is, and the union of the two node directories of
the tier-0 step (their files gathered in one directory: every node's
holds the same .metadata and its own ranks' data files) as an ordinary
checkpoint; both equal the plain one, tensor by tensor, bit-exact.
"""

import os
import shlex
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcpio  # noqa: E402  (fails loudly without torch)
import torch  # noqa: E402
import torch.distributed.checkpoint as tdcp  # noqa: E402
from torch.distributed.checkpoint import FileSystemReader  # noqa: E402
from torch.distributed.checkpoint.metadata import (  # noqa: E402
    TensorStorageMetadata)

R = dcpio.Runner("tier")


def mpi_tier(np, args, tmp):
    launcher = os.environ.get("DCP_MPIEXEC")
    cmd = shlex.split(launcher) if launcher else [
        shutil.which("mpiexec") or "mpiexec", "--oversubscribe"]
    cmd += [os.environ.get("DCP_MPIEXEC_NUMPROC_FLAG") or "-n", str(np),
            dcpio.prog("mpi_tier")] + [str(a) for a in args]
    env = dict(os.environ)
    for k in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
              "OMPI_MCA_rmaps_base_oversubscribe"):
        env.setdefault(k, "1")
    env["OMPI_MCA_orte_tmpdir_base"] = os.path.join(tmp, "ompi")
    os.makedirs(env["OMPI_MCA_orte_tmpdir_base"], exist_ok=True)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env=env)


def torch_load(ck):
    md = FileSystemReader(ck).read_metadata()
    sd = {}
    for k, m in md.state_dict_metadata.items():
        if isinstance(m, TensorStorageMetadata):
            sd[k] = torch.zeros(m.size, dtype=m.properties.dtype)
        else:
            sd[k] = None
    tdcp.load(sd, checkpoint_id=ck)
    return sd


@R.test
def tiers_load_in_torch(check, tmp):
    d = os.path.join(tmp, "t")
    r = mpi_tier(4, ["interop", d], tmp)
    check.eq(r.returncode, 0, f"mpi_tier interop: {r.stderr[-2000:]}")
    if r.returncode:
        return
    union = os.path.join(tmp, "union")
    os.makedirs(union)
    for node in ("n0", "n1"):
        src = os.path.join(d, node, "step-1")
        names = sorted(os.listdir(src))
        check.true(".metadata" in names, f"{node}: .metadata")
        for n in names:
            if n.endswith(".distcp") or n == ".metadata":
                shutil.copy(os.path.join(src, n), os.path.join(union, n))
    plain = torch_load(os.path.join(d, "plain"))
    check.eq(sorted(plain), ["b", "step", "w"], "keys")
    check.eq(plain["step"], 1, "step")
    for name, ck in (("tier 1", os.path.join(d, "t1", "step-1")),
                     ("tier-0 union", union)):
        got = torch_load(ck)
        check.eq(sorted(got), sorted(plain), f"{name}: keys")
        check.eq(got.get("step"), 1, f"{name}: step")
        for k in ("w", "b"):
            check.none(dcpio.tensors_identical(got[k], plain[k]),
                       f"{name}: {k}")


if __name__ == "__main__":
    R.main()
