"""Issue 14 against torch 2.13: the checkpoints dcp writes with fresh
data-file names on every overwrite (__<r>_0.<save id>.distcp) and the
save-id extra field in every record (docs/FORMAT.md §4) load in torch
bit-exact, and the id in each record is the save_id of the .metadata that
names it (torch's own storage_meta.save_id).
"""

import io
import os
import re
import struct
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcpio  # noqa: E402  (fails loudly without torch)
import torch.distributed.checkpoint as tdcp  # noqa: E402
from torch.distributed.checkpoint import FileSystemReader  # noqa: E402

R = dcpio.Runner("lifecycle")


def sid_fields(extra):
    """The save ids of the save-id fields (0x4953) of an extra field."""
    out = []
    while len(extra) >= 4:
        tag, ln = struct.unpack("<HH", extra[:4])
        if tag == 0x4953:
            ver = struct.unpack("<H", extra[4:6])[0]
            out.append((ver, extra[6:4 + ln].decode("ascii")))
        extra = extra[4 + ln:]
    return out


def record_ids(ck, md):
    """{(file, offset): [save ids in the record's central directory]}."""
    ids = {}
    for info in md.storage_data.values():
        with open(os.path.join(ck, info.relative_path), "rb") as f:
            f.seek(info.offset)
            data = f.read(info.length)
        z = zipfile.ZipFile(io.BytesIO(data))
        got = []
        for zi in z.infolist():
            got += sid_fields(zi.extra)
        ids[(info.relative_path, info.offset)] = got
    return ids


@R.test
def overwrites_load_in_torch(check, tmp):
    ck = os.path.join(tmp, "ck")
    names_seen = set()
    for seed in (21, 22, 23):
        state = dcpio.full_state(seed=seed)
        dcpio.dcp_save_manifest(state, ck, tmp)
        names = sorted(n for n in os.listdir(ck) if n.endswith(".distcp"))
        md = FileSystemReader(ck).read_metadata()
        sid = md.storage_meta.save_id
        check.true(re.fullmatch(r"[0-9a-f]{16}", sid or ""),
                   f"seed {seed}: save_id {sid!r} in torch's storage_meta")
        if seed == 21:
            check.eq(names, ["__0_0.distcp"], "first save: torch's names")
        else:
            check.eq(names, [f"__0_0.{sid}.distcp"],
                     f"seed {seed}: fresh names carrying the save id")
        check.true(not (set(names) & names_seen),
                   f"seed {seed}: no name of an earlier save reused")
        names_seen |= set(names)
        # Only the committed files are left, no lock, no temporary.
        check.eq(sorted(os.listdir(ck)), sorted(names + [".metadata"]),
                 f"seed {seed}: directory holds exactly the checkpoint")
        ids = record_ids(ck, md)
        check.true(len(ids) > 10, f"seed {seed}: {len(ids)} records")
        bad = {k: v for k, v in ids.items() if v != [(1, sid)]}
        check.eq(bad, {}, f"seed {seed}: every record has one save-id "
                 "field, version 1, equal to .metadata's save_id")
        tmpl = dcpio.zeros_template(state)
        tdcp.load(tmpl, checkpoint_id=ck)
        check.none(dcpio.nested_identical(state, tmpl),
                   f"seed {seed}: torch dcp.load bit-exact")


if __name__ == "__main__":
    R.main()
