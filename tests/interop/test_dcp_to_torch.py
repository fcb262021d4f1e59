"""dcp saves (interop_state savefrom), PyTorch loads: dcp.load into a nested
state dict of zeroed tensors and placeholder values, and
format_utils.dcp_to_torch_save, which rebuilds the nesting from
planner_data. Everything bit-exact.
"""

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcpio  # noqa: E402  (fails loudly without torch)
from dcpio import torch  # noqa: E402
import torch.distributed.checkpoint as tdcp  # noqa: E402
from torch.distributed.checkpoint import FileSystemReader  # noqa: E402
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # noqa: E402
from torch.distributed.checkpoint.metadata import (  # noqa: E402
    BytesStorageMetadata, TensorStorageMetadata)
from torch.distributed.checkpoint.state_dict_loader import (  # noqa: E402
    _load_state_dict_from_keys)

R = dcpio.Runner("dcp_to_torch")


def mask_sids(data):
    """Replaces the id of every save-id extra field ("SI", u16 length, u16
    version 1, the id) by '0's: two saves differ exactly there."""
    import re

    def zero(m):
        n = int.from_bytes(m.group(1), "little") - 2
        return m.group(0)[:6] + b"0" * n + m.group(0)[6 + n:]
    return re.sub(rb"SI(..)\x01\x00[\x21-\x7e]{1,64}", zero, data, flags=re.S)


def check_metadata(check, ck, state):
    """torch's own reading of dcp's .metadata: keys, kinds, dtypes, shapes,
    one chunk per tensor, planner_data = torch's flatten mapping."""
    md = FileSystemReader(ck).read_metadata()
    flat, mapping = dcpio.flatten(state)
    check.eq(sorted(md.state_dict_metadata), sorted(flat), "metadata keys")
    check.eq(md.version, "1.0.0", "metadata version")
    pd = md.planner_data or {}
    check.eq({k: tuple(v) for k, v in pd.items()},
             {k: tuple(v) for k, v in mapping.items()}, "planner_data")
    for key, leaf in flat.items():
        m = md.state_dict_metadata.get(key)
        if m is None:
            continue
        if isinstance(leaf, torch.Tensor):
            if not check.true(isinstance(m, TensorStorageMetadata),
                              f"{key}: TensorStorageMetadata"):
                continue
            check.eq(m.properties.dtype, leaf.dtype, f"{key}: dtype")
            check.eq(tuple(m.size), tuple(leaf.shape), f"{key}: size")
            check.eq(len(m.chunks), 1, f"{key}: chunk count")
        else:
            check.true(isinstance(m, BytesStorageMetadata),
                       f"{key}: BytesStorageMetadata, got {type(m).__name__}")


def torch_load_and_compare(check, ck, state, tmp):
    tmpl = dcpio.zeros_template(state)
    tdcp.load(tmpl, checkpoint_id=ck)
    check.none(dcpio.nested_identical(state, tmpl), "dcp.load result")
    out = os.path.join(tmp, "full.pt")
    dcp_to_torch_save(ck, out)
    rebuilt = torch.load(out, weights_only=False)
    check.none(dcpio.nested_identical(state, rebuilt),
               "dcp_to_torch_save result (nesting from planner_data)")


@R.test
def full_state_every_dtype(check, tmp):
    state = dcpio.full_state()
    ck = os.path.join(tmp, "ck")
    dcpio.dcp_save_manifest(state, ck, tmp)
    check_metadata(check, ck, state)
    torch_load_and_compare(check, ck, state, tmp)
    # Key-filtered loading looks the keys' prefixes up in planner_data.
    part = _load_state_dict_from_keys({"optim", "top_level_int"},
                                      checkpoint_id=ck)
    check.none(dcpio.nested_identical(
        {"optim": state["optim"], "top_level_int": 5}, part),
        "_load_state_dict_from_keys({'optim', 'top_level_int'})")


@R.test
def async_save_every_dtype(check, tmp):
    # dcp_save_async through a 64 KiB staging budget (tensors staged in
    # pieces, CRCs chained over them), with the state freed as soon as the
    # call returned: PyTorch loads it bit-exact, and the data files are the
    # bytes dcp_save writes.
    state = dcpio.full_state(seed=5)
    # Large enough to be staged in many pieces (64 KiB ring, 16 KiB pieces).
    state["big"] = {
        "w": dcpio.random_tensor(torch.float32, (300, 257), random.Random(6)),
        "h": dcpio.random_tensor(torch.bfloat16, (70001,), random.Random(7)),
    }
    ck, ck_sync = os.path.join(tmp, "ck"), os.path.join(tmp, "ck_sync")
    dcpio.dcp_save_manifest(state, ck, tmp, mode="savefrom-async")
    check_metadata(check, ck, state)
    torch_load_and_compare(check, ck, state, tmp)
    dcpio.dcp_save_manifest(state, ck_sync, tmp)
    for name in sorted(f for f in os.listdir(ck) if f.endswith(".distcp")):
        with open(os.path.join(ck, name), "rb") as a, \
                open(os.path.join(ck_sync, name), "rb") as b:
            # Each save's id is in its records (docs/FORMAT.md §4, the
            # save-id field): equal but for the ids.
            check.true(mask_sids(a.read()) == mask_sids(b.read()),
                       f"{name}: async == sync bytes")


@R.test
def dcp_roundtrip(check, tmp):
    # dcp reads back what it wrote (paths, values, bytes).
    state = dcpio.full_state(seed=77)
    ck = os.path.join(tmp, "ck")
    dcpio.dcp_save_manifest(state, ck, tmp)
    dcpio.compare_dump(state, dcpio.dcp_dumpall(ck, tmp), check)


@R.test
def list_index_paths(check, tmp):
    # Leaves at a list index: ("buffers", 0), ("mixed", 1), ("nested", 0, 0).
    state = dcpio.list_state()
    ck = os.path.join(tmp, "ck")
    dcpio.dcp_save_manifest(state, ck, tmp)
    check_metadata(check, ck, state)
    torch_load_and_compare(check, ck, state, tmp)


@R.test
def non_ascii_keys(check, tmp):
    # Keys and path components in UTF-8 beyond ASCII (CJK, Cyrillic, an
    # emoji outside the BMP, accents): dcp writes them as torch does, and
    # torch loads them bit-exact, nesting included.
    rng = random.Random(11)
    state = {
        "層.weight": dcpio.random_tensor(torch.float32, (3, 4), rng),
        "模型": {
            "ключ": dcpio.random_tensor(torch.bfloat16, (5,), rng),
            "🚀": dcpio.random_tensor(torch.int64, (2, 2), rng),
            "schritt_ü": 7,
            "name": "größe ✓",
        },
    }
    ck = os.path.join(tmp, "ck")
    dcpio.dcp_save_manifest(state, ck, tmp)
    check_metadata(check, ck, state)
    torch_load_and_compare(check, ck, state, tmp)
    md = FileSystemReader(ck).read_metadata()
    check.true("模型.ключ" in md.state_dict_metadata, "key '模型.ключ'")


@R.test
def values_only(check, tmp):
    # A checkpoint without tensors, and a value-only nested dict.
    state = {"extra": dcpio.value_samples(), "step": 3}
    ck = os.path.join(tmp, "ck")
    dcpio.dcp_save_manifest(state, ck, tmp)
    check_metadata(check, ck, state)
    torch_load_and_compare(check, ck, state, tmp)


@R.test
def overwrite_keeps_loadable(check, tmp):
    # Saving twice into one directory: torch loads the second state.
    ck = os.path.join(tmp, "ck")
    first = dcpio.full_state(seed=1)
    second = dcpio.full_state(seed=2)
    dcpio.dcp_save_manifest(first, ck, tmp)
    dcpio.dcp_save_manifest(second, ck, tmp)
    torch_load_and_compare(check, ck, second, tmp)
    # No stale data files of the first save remain referenced or present.
    md = FileSystemReader(ck).read_metadata()
    used = {si.relative_path for si in md.storage_data.values()}
    present = {f for f in os.listdir(ck) if f.endswith(".distcp")}
    check.eq(present, used, "data files present vs referenced")



@R.test
def block_crc_records_pass_zip_tools(check, tmp):
    # dcp's block-CRC extra field (docs/FORMAT.md section 4) in the storage
    # entry's central directory record: every record still passes zipfile's
    # CRC check and `python -m zipfile -t` (and `unzip -t` where installed),
    # torch.load reads it bit-exact, and the field holds the zlib CRC-32 of
    # each 1 MiB block of the data.
    import io
    import shutil
    import struct
    import subprocess
    import zipfile
    import zlib
    rng = random.Random(11)
    state = {"w": dcpio.random_tensor(torch.float32, (700, 1024), rng),
             "b": dcpio.random_tensor(torch.bfloat16, (33,), rng)}
    ck = os.path.join(tmp, "ck")
    dcpio.dcp_save_manifest(state, ck, tmp)
    torch_load_and_compare(check, ck, state, tmp)
    md = FileSystemReader(ck).read_metadata()
    for idx, info in md.storage_data.items():
        with open(os.path.join(ck, info.relative_path), "rb") as f:
            f.seek(info.offset)
            raw = f.read(info.length)
        z = zipfile.ZipFile(io.BytesIO(raw))
        check.none(z.testzip(), f"{idx.fqn}: zipfile CRC check")
        rec = os.path.join(tmp, "rec.zip")
        with open(rec, "wb") as f:
            f.write(raw)
        p = subprocess.run([sys.executable, "-m", "zipfile", "-t", rec],
                           capture_output=True, text=True)
        check.eq(p.returncode, 0, f"{idx.fqn}: python -m zipfile -t "
                 f"({p.stderr.strip()})")
        if shutil.which("unzip"):
            p = subprocess.run(["unzip", "-t", rec], capture_output=True,
                               text=True)
            check.eq(p.returncode, 0, f"{idx.fqn}: unzip -t")
        check.true(torch.equal(torch.load(io.BytesIO(raw), weights_only=True)
                               .view(torch.uint8),
                               state[idx.fqn].view(torch.uint8)),
                   f"{idx.fqn}: torch.load of the record")
        zi = [i for i in z.infolist() if i.filename.endswith("/data/0")][0]
        data = z.read(zi)
        ext, fields = zi.extra, {}
        while len(ext) >= 4:
            tag, ln = struct.unpack("<HH", ext[:4])
            fields[tag] = ext[4:4 + ln]
            ext = ext[4 + ln:]
        f = fields.get(0x4344)
        if not check.true(f is not None, f"{idx.fqn}: block-CRC field"):
            continue
        ver, bs, size = struct.unpack("<IIQ", f[:16])
        crcs = list(struct.unpack(f"<{(len(f) - 16) // 4}I", f[16:]))
        check.eq((ver, bs, size), (1, 1 << 20, len(data)),
                 f"{idx.fqn}: field header")
        check.eq(crcs, [zlib.crc32(data[k:k + bs])
                        for k in range(0, len(data), bs)],
                 f"{idx.fqn}: block CRCs")

if __name__ == "__main__":
    R.main()
