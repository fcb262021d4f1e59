"""Writes the hostile-file regression set: tests/fuzz/hostile/<case>/ (each a
checkpoint directory) and tests/fuzz/hostile/manifest.txt (case, expected
DCP_E* code, runtime setup, and what real bug or audit finding the case is
modelled on). hostile_replay.c (ctest fuzz.hostile) checks that dcp_verify
and dcp_load both refuse every case with exactly the expected code.

    .venv/bin/python tests/fuzz/make_hostile.py

Needs torch 2.13 (CPU) for the base checkpoint; the hostile parts are built
by hand (raw pickle opcodes, zip structures, edited DCP metadata). The
output is committed; rerun only to change the set. Setup directives that
git cannot hold portably (symbolic links, FIFOs) are applied by the runner:
  symlink:NAME=TARGET   NAME in the case directory becomes a link to TARGET
  fifo:NAME             NAME becomes a FIFO
References: CVE-2025-32434 (torch.load weights_only bypass), CVE-2022-45907
(torch.jit annotations eval), the safetensors Trail of Bits audit (2023:
overlapping and out-of-range offsets, duplicate keys, trailing bytes), the
llama.cpp GGUF integer-overflow CVEs (CVE-2024-25664..25668, 2024-21836),
the ONNX external-data path traversal CVEs (CVE-2022-25882, CVE-2024-27318,
CVE-2024-27319: "../", absolute paths, symlinks), zip bombs (Fifield 2019)
and zip64 length lies (CVE-2020-9487 style), Python pickle GLOBAL/REDUCE,
INST/OBJ, memo and protocol-5 buffer abuse (fickling, PyTorch issue #52596).
"""

import copy
import io
import json
import os
import shutil
import struct
import sys
import tempfile
import warnings
import zipfile

import torch
import torch.distributed.checkpoint as tdcp
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata,
                                                   MetadataIndex)
from torch.distributed.checkpoint.filesystem import _StorageInfo

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "hostile")
DATA = "__0_0.distcp"

cases = []  # (name, code, setup, description)


# ------------------------------------------------------------ raw pickles

def g(mod, name):
    return b"c" + mod.encode() + b"\n" + name.encode() + b"\n"


def uni(s):
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


P2 = b"\x80\x02"
STOP = b"."


# --------------------------------------------------------- base checkpoint

def base():
    tmp = tempfile.mkdtemp()
    p = os.path.join(tmp, "c")
    tdcp.save({"w": torch.arange(16.0).reshape(4, 4),
               "b": torch.tensor([1, 2, 3]), "step": 5}, checkpoint_id=p)
    md = tdcp.FileSystemReader(p).read_metadata()
    with open(os.path.join(p, DATA), "rb") as f:
        data = f.read()
    shutil.rmtree(tmp)
    md.storage_meta.checkpoint_id = "ckpt"
    md.storage_meta.save_id = "hostile"
    md.storage_meta.load_id = None
    return md, data


MD, DATAFILE = base()


def index(md, fqn):
    for k in md.storage_data:
        if k.fqn == fqn:
            return k
    raise KeyError(fqn)


def record(fqn):
    info = MD.storage_data[index(MD, fqn)]
    return DATAFILE[info.offset:info.offset + info.length]


def add(name, code, desc, metadata=None, files=None, setup=""):
    """A case directory: .metadata (a Metadata object or raw bytes) and data
    files (default: the base data file). code None: a control that must
    load (not a case; checks the construction of its neighbours)."""
    if code is None:
        return
    d = os.path.join(OUT, name)
    os.makedirs(d)
    if metadata is None:
        metadata = MD
    raw = metadata if isinstance(metadata, bytes) else \
        __import__("pickle").dumps(metadata, protocol=2)
    with open(os.path.join(d, ".metadata"), "wb") as f:
        f.write(raw)
    for fname, content in (files if files is not None
                           else {DATA: DATAFILE}).items():
        with open(os.path.join(d, fname), "wb") as f:
            f.write(content)
    cases.append((name, code, setup, desc))


def with_record(fqn, rec, md=None):
    """Base metadata and a data file where fqn's record is replaced by rec
    (appended at the end; the metadata points there)."""
    md = copy.deepcopy(md or MD)
    k = index(md, fqn)
    md.storage_data[k] = _StorageInfo(DATA, len(DATAFILE), len(rec))
    return md, {DATA: DATAFILE + rec}


def rows_split(rows):
    """Base metadata with w [4,4] stored as chunks of the given (first row,
    row count), each with its own torch.save record of those rows."""
    md = copy.deepcopy(MD)
    full = torch.arange(16.0).reshape(4, 4)
    data = DATAFILE
    del md.storage_data[index(md, "w")]
    md.state_dict_metadata["w"].chunks = []
    for i, (r0, n) in enumerate(rows):
        b = io.BytesIO()
        torch.save(full[r0:r0 + n].clone(), b)
        rec = b.getvalue()
        off = torch.Size([r0, 0])
        md.state_dict_metadata["w"].chunks.append(
            ChunkStorageMetadata(off, torch.Size([n, 4])))
        md.storage_data[MetadataIndex("w", off, i)] = _StorageInfo(
            DATA, len(data), len(rec))
        data += rec
    return md, {DATA: data}


def zip_record(entries, method=zipfile.ZIP_STORED):
    """A torch.save-like record from (name, bytes) entries."""
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", method) as z:
        for n, c in entries:
            z.writestr(zipfile.ZipInfo(n), c, compress_type=method)
    return b.getvalue()


def entries_of(rec):
    with zipfile.ZipFile(io.BytesIO(rec)) as z:
        return [(n, z.read(n)) for n in z.namelist()]


W_ENTRIES = entries_of(record("w"))


def w_entries(replace=None, drop=(), extra=()):
    out = []
    for n, c in W_ENTRIES:
        short = n.split("/", 1)[1]
        if short in drop:
            continue
        if replace and short in replace:
            c = replace[short]
        out.append((n, c))
    return out + list(extra)


def pkl_of(entries):
    return [c for n, c in entries if n.endswith("data.pkl")][0]


def add_file(name, code, desc, files, setup):
    """A single-file case: a directory holding the files (name -> bytes);
    setup names the file to import and load ("file:NAME"), and maybe
    more directives after commas."""
    d = os.path.join(OUT, name)
    os.makedirs(d)
    for fname, content in files.items():
        with open(os.path.join(d, fname), "wb") as f:
            f.write(content)
    cases.append((name, code, setup, desc))


# ------------------------------------------------------------------ cases

def pickle_cases():
    # Code execution through the metadata pickle.
    add("pkl-global-os-system", "DCP_EUNSAFE",
        "GLOBAL os.system + REDUCE in .metadata (the classic pickle RCE; "
        "torch.distributed.checkpoint runs pickle.load here)",
        P2 + g("os", "system") + uni("id") + b"\x85R" + STOP)
    add("pkl-stack-global-eval", "DCP_EUNSAFE",
        "protocol-4 STACK_GLOBAL builtins.eval (fickling-style payload)",
        b"\x80\x04" + b"\x8c\x08builtins\x8c\x04eval\x93" +
        b"\x8c\x041+1\x85R" + STOP)
    add("pkl-inst", "DCP_EUNSAFE", "INST opcode (imports and calls)",
        P2 + b"(" + b"ios\nsystem\n" + STOP)
    add("pkl-obj", "DCP_EUNSAFE", "OBJ opcode with a global class",
        P2 + b"(" + g("os", "system") + uni("id") + b"o" + STOP)
    add("pkl-ext1", "DCP_EUNSAFE", "EXT1: extension registry lookup",
        P2 + b"\x82\x01" + STOP)
    add("pkl-global-builtins-getattr", "DCP_EUNSAFE",
        "getattr gadget (CVE-2025-32434-style weights_only bypass chains)",
        P2 + g("builtins", "getattr") + STOP)
    add("pkl-torch-load-global", "DCP_EUNSAFE",
        "torch.load named as a global (nested deserialisation)",
        P2 + g("torch", "load") + STOP)
    add("pkl-allowed-class-hostile-args", "DCP_EFORMAT",
        "allow-listed torch.Size REDUCE'd with a str instead of ints",
        P2 + g("torch", "Size") + b"(" + uni("x") + b"t\x85R" + STOP)
    add("pkl-build-on-list", "DCP_EFORMAT",
        "BUILD applied to a list (state injection on a non-object)",
        P2 + b"]}b" + STOP)
    add("pkl-memo-out-of-range", "DCP_EFORMAT",
        "BINGET of a memo slot never PUT",
        P2 + b"h\x07" + STOP)
    add("pkl-long-binget-huge", "DCP_EFORMAT",
        "LONG_BINGET 0x7fffffff (memo index as an allocation size)",
        P2 + b"j\xff\xff\xff\x7f" + STOP)
    add("pkl-stack-underflow", "DCP_EFORMAT", "REDUCE on an empty stack",
        P2 + b"R" + STOP)
    add("pkl-unmatched-mark", "DCP_EFORMAT", "APPENDS with no MARK",
        P2 + b"]N" + b"e" + STOP)
    add("pkl-binunicode-2g", "DCP_EFORMAT",
        "BINUNICODE declaring 2^31 bytes in a tiny file (size from the "
        "header, GGUF-style)",
        P2 + b"X\x00\x00\x00\x80abc" + STOP)
    add("pkl-binbytes8-huge", "DCP_EFORMAT",
        "BINBYTES8 declaring 2^63 bytes",
        P2 + b"\x8e" + struct.pack("<Q", 1 << 63) + STOP)
    add("pkl-deep-nesting", "DCP_ELIMIT",
        "5000 nested lists (stack exhaustion in recursive consumers)",
        P2 + b"]" * 5000 + b"a" * 4999 + STOP)
    add("pkl-long4-huge", "DCP_ELIMIT",
        "LONG4 of 4 KiB (a bignum where an int64 is expected)",
        P2 + b"\x8b" + struct.pack("<I", 4096) + b"\x01" * 4096 + STOP)
    add("pkl-proto5-next-buffer", "DCP_EUNSAFE",
        "protocol-5 NEXT_BUFFER (out-of-band buffers)",
        b"\x80\x05\x97" + STOP)
    add("pkl-proto6", "DCP_ENOTSUP", "pickle protocol 6 (unknown)",
        b"\x80\x06N" + STOP)
    add("pkl-unknown-opcode", "DCP_EFORMAT", "opcode 0xff",
        P2 + b"\xff" + STOP)
    add("pkl-no-stop", "DCP_EFORMAT", "pickle truncated before STOP",
        P2 + b"]" + uni("abc"))
    add("pkl-trailing-bytes", "DCP_EFORMAT",
        "bytes after STOP (polyglot file, safetensors audit)",
        __import__("pickle").dumps(MD, protocol=2) + b"PK\x03\x04junk")
    add("pkl-self-referencing-list", "DCP_EFORMAT",
        "a list appended to itself via the memo, as the chunk list "
        "(cycle for a naive tree walk)",
        P2 + b"]q\x00h\x00a" + STOP)
    add("pkl-persid", "DCP_EFORMAT",
        "BINPERSID in .metadata (persistent load hook)",
        P2 + uni("x") + b"Q" + STOP)
    add("pkl-empty-file", "DCP_EFORMAT", "an empty .metadata", b"")
    add("pkl-not-metadata", "DCP_EFORMAT",
        "a valid pickle of the wrong type (a dict)", P2 + b"}" + STOP)


def metadata_cases():
    md = copy.deepcopy(MD)
    md.state_dict_metadata["w"].chunks[0].sizes = torch.Size([5, 4])
    add("md-chunk-outside-shape", "DCP_EFORMAT",
        "chunk offsets + sizes beyond the global shape", md)

    md = copy.deepcopy(MD)
    md.state_dict_metadata["w"].chunks = [
        ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([3, 4])),
        ChunkStorageMetadata(torch.Size([2, 0]), torch.Size([2, 4]))]
    k = index(md, "w")
    info = md.storage_data.pop(k)
    md.storage_data[MetadataIndex("w", torch.Size([0, 0]), 0)] = info
    md.storage_data[MetadataIndex("w", torch.Size([2, 0]), 1)] = info
    add("md-overlapping-chunks", "DCP_EFORMAT",
        "two chunks overlapping in rows 2..3 (safetensors audit: "
        "overlapping tensors)", md)

    md = copy.deepcopy(MD)
    md.state_dict_metadata["w"].chunks[0].sizes = torch.Size([2, 4])
    add("md-chunks-leave-gap", "DCP_EFORMAT",
        "chunks cover rows 0..1 of 4 (a load would leave rows 2..3 "
        "unwritten)", md)

    md = copy.deepcopy(MD)
    k = index(md, "w")
    i = md.storage_data[k]
    md.storage_data[k] = _StorageInfo(DATA, i.offset, len(DATAFILE))
    add("md-record-past-eof", "DCP_ECORRUPT",
        "storage (offset, length) past the end of the data file", md)

    md = copy.deepcopy(MD)
    md.storage_data[index(md, "w")] = _StorageInfo(DATA, 2 ** 63 - 1,
                                                   2 ** 63 - 1)
    add("md-offset-huge", "DCP_EFORMAT",
        "offset and length 2^63-1 (their sum overflows int64)", md)

    md = copy.deepcopy(MD)
    md.storage_data[index(md, "w")] = _StorageInfo(DATA, 2 ** 64, 16)
    add("md-offset-beyond-int64", "DCP_ELIMIT",
        "offset 2^64 (a Python int no 64-bit field holds)", md)

    # Two consistent records for w's rows: every chunk matches its record,
    # so only a check of the tiling itself can see the gap or the overlap.
    md, files = rows_split([(0, 2), (2, 2)])
    add("md-rows-ok", None, None, md, files)
    md, files = rows_split([(0, 2)])
    add("md-gap-consistent-records", "DCP_EFORMAT",
        "one chunk of rows 0..1 of a [4,4] tensor, its record right: a load "
        "that does not check the tiling returns rows 2..3 unwritten", md,
        files)
    md, files = rows_split([(0, 3), (2, 2)])
    add("md-overlap-consistent-records", "DCP_EFORMAT",
        "chunks of rows 0..2 and 2..3, both records right: row 2 comes from "
        "whichever is read last", md, files)

    for name, path, desc in (
            ("md-path-dotdot", "../../etc/passwd",
             "relative_path ../../etc/passwd (ONNX CVE-2022-25882)"),
            ("md-path-absolute", "/etc/passwd",
             "absolute relative_path (ONNX CVE-2024-27318)"),
            ("md-path-subdir", "sub/__0_0.distcp",
             "relative_path with a directory component"),
            ("md-path-dot", ".", "relative_path '.' (the directory)"),
            ("md-path-empty", "", "empty relative_path")):
        md = copy.deepcopy(MD)
        for k, i in list(md.storage_data.items()):
            md.storage_data[k] = _StorageInfo(path, i.offset, i.length)
        add(name, "DCP_EUNSAFE", desc, md)

    add("md-symlinked-data-file", "DCP_EUNSAFE",
        "the data file is a symbolic link to /etc/passwd (ONNX "
        "CVE-2024-27319 chain)", MD, files={},
        setup="symlink:" + DATA + "=/etc/passwd")
    add("md-symlinked-metadata", "DCP_EUNSAFE",
        ".metadata is a symbolic link (to the base data file)",
        MD, files={"real": b""}, setup="symlink:.metadata=real")
    add("md-data-file-is-fifo", "DCP_EUNSAFE",
        "the data file is a FIFO (a read would block forever)", MD,
        files={}, setup="fifo:" + DATA)

    md = copy.deepcopy(MD)
    md.state_dict_metadata["w"].size = torch.Size([2 ** 40, 2 ** 40])
    md.state_dict_metadata["w"].chunks[0].sizes = torch.Size([2 ** 40,
                                                              2 ** 40])
    add("md-numel-overflow", "DCP_EFORMAT",
        "shape 2^40 x 2^40: element count x size overflows 64 bits "
        "(GGUF CVE-2024-25664 style)", md)

    md = copy.deepcopy(MD)
    md.state_dict_metadata["w"].size = torch.Size([1] * 64)
    md.state_dict_metadata["w"].chunks[0] = ChunkStorageMetadata(
        torch.Size([0] * 64), torch.Size([1] * 64))
    add("md-rank-64", "DCP_ELIMIT", "a tensor of 64 dimensions", md)

    md = copy.deepcopy(MD)
    md.state_dict_metadata["w"].size = torch.Size([4, -4])
    add("md-negative-dim", "DCP_EFORMAT", "a negative dimension", md)

    md = copy.deepcopy(MD)
    md.state_dict_metadata["w"].properties.dtype = torch.qint8
    add("md-unsupported-dtype", "DCP_ENOTSUP",
        "dtype qint8 (not supported: named, not guessed; refused for its key "
        "only)", md)

    md = copy.deepcopy(MD)
    del md.storage_data[index(md, "w")]
    add("md-missing-storage", "DCP_EFORMAT",
        "a chunk with no storage entry", md)

    md = copy.deepcopy(MD)
    md.storage_data[MetadataIndex("ghost", torch.Size([0]), 0)] = \
        _StorageInfo(DATA, 0, 10)
    add("md-storage-unknown-key", "DCP_EFORMAT",
        "a storage entry for a key that is not in the checkpoint", md)

    # Duplicate keys: same-length markers renamed in the pickle bytes.
    md = copy.deepcopy(MD)
    md.state_dict_metadata["dupA"] = md.state_dict_metadata.pop("b")
    md.planner_data["dupA"] = ("dupA",)
    del md.planner_data["b"]
    k = index(md, "b")
    md.storage_data[MetadataIndex("dupA", k.offset, k.index)] = \
        md.storage_data.pop(k)
    md.state_dict_metadata["dupB"] = md.state_dict_metadata.pop("step")
    md.planner_data["dupB"] = ("dupB",)
    del md.planner_data["step"]
    md.storage_data[MetadataIndex("dupB")] = \
        md.storage_data.pop(index(md, "step"))
    raw = __import__("pickle").dumps(md, protocol=2).replace(b"dupB", b"dupA")
    add("md-duplicate-key", "DCP_EFORMAT",
        "the same key twice in state_dict_metadata (safetensors audit: "
        "duplicate keys, last one wins in Python)", raw)

    md = copy.deepcopy(MD)
    md.state_dict_metadata = [1, 2]
    add("md-wrong-container", "DCP_EFORMAT",
        "state_dict_metadata is a list", md)

    md = copy.deepcopy(MD)
    i = md.storage_data[index(md, "step")]
    md.storage_data[index(md, "step")] = _StorageInfo(DATA, len(DATAFILE) - 8,
                                                     i.length)
    add("md-value-record-past-eof", "DCP_ECORRUPT",
        "a value's record runs past the end of the data file", md)

    add("md-data-file-missing", "DCP_ENOENT",
        "the data file the metadata names does not exist", MD, files={})

    add("md-data-file-truncated", "DCP_ECORRUPT",
        "the data file cut in half (interrupted copy)", MD,
        files={DATA: DATAFILE[:len(DATAFILE) // 2]})


def record_cases():
    w = record("w")
    off = w.find(struct.pack("<f", 5.0))
    rec = bytearray(w)
    rec[off] ^= 0x01
    md, files = with_record("w", bytes(rec))
    add("rec-crc-mismatch", "DCP_ECORRUPT",
        "one bit flipped in the tensor bytes (CRC-32 must catch it)",
        md, files)

    md, files = with_record("w", zip_record(
        [(n.replace("archive/data.pkl", "archive/../ata.pkl"), c)
         for n, c in w_entries()]))
    add("rec-zip-dotdot-name", "DCP_EFORMAT",
        "zip entry named archive/../ata.pkl (zip slip)", md, files)

    md, files = with_record("w", zip_record(w_entries(),
                                            zipfile.ZIP_DEFLATED))
    add("rec-zip-compressed", "DCP_EFORMAT",
        "deflated entries (torch.save never compresses; a bomb vector)",
        md, files)

    e = w_entries()
    md, files = with_record("w", zip_record(e + [e[0]]))
    add("rec-zip-duplicate-entry", "DCP_EFORMAT",
        "the same entry name twice", md, files)

    big = zip_record(w_entries())
    cd = big.rfind(b"PK\x05\x06")
    lie = bytearray(big)
    struct.pack_into("<HH", lie, cd + 8, 0xffff, 0xffff)
    md, files = with_record("w", bytes(lie))
    add("rec-zip-count-lie", "DCP_EFORMAT",
        "end record declaring 65535 entries", md, files)

    lie = bytearray(big)
    cen = lie.find(b"PK\x01\x02")
    struct.pack_into("<II", lie, cen + 20, 0xffffffff, 0xffffffff)
    md, files = with_record("w", bytes(lie))
    add("rec-zip64-size-lie", "DCP_EFORMAT",
        "central directory sizes 0xffffffff with no zip64 extra "
        "(zip64 length lie)", md, files)

    lie = bytearray(big)
    loc = lie.find(b"PK\x03\x04")
    struct.pack_into("<II", lie, loc + 18, 0x7fffffff, 0x7fffffff)
    cen = lie.find(b"PK\x01\x02")
    struct.pack_into("<II", lie, cen + 20, 0x7fffffff, 0x7fffffff)
    md, files = with_record("w", bytes(lie))
    add("rec-zip-bomb-size", "DCP_EFORMAT",
        "an entry declaring 2 GiB inside a 1.5 KiB record (zip bomb: "
        "size taken from the header)", md, files)

    ents = w_entries()
    rec = bytearray(zip_record(ents))
    # Point the second central entry's local header at the first one.
    first = rec.find(b"PK\x01\x02")
    second = rec.find(b"PK\x01\x02", first + 4)
    struct.pack_into("<I", rec, second + 42,
                     struct.unpack_from("<I", rec, first + 42)[0])
    md, files = with_record("w", bytes(rec))
    add("rec-zip-overlapping-entries", "DCP_EFORMAT",
        "two central directory entries sharing one local record "
        "(overlapping files, Fifield's zip bomb)", md, files)

    evil = P2 + g("os", "system") + uni("id") + b"\x85R" + STOP
    md, files = with_record("w", zip_record(w_entries({"data.pkl": evil})))
    add("rec-datapkl-os-system", "DCP_EUNSAFE",
        "a tensor record whose data.pkl calls os.system "
        "(CVE-2025-32434 class)", md, files)

    pkl = pkl_of(W_ENTRIES)
    # stride (4, 1) -> (400, 1): the view reaches past its storage
    bad = pkl.replace(b"K\x04K\x01\x86", b"M\x90\x01K\x01\x86", 1)
    assert bad != pkl
    md, files = with_record("w", zip_record(w_entries({"data.pkl": bad})))
    add("rec-view-outside-storage", "DCP_EFORMAT",
        "tensor strides reaching past the storage (out-of-bounds view)",
        md, files)

    md, files = with_record("w", zip_record(w_entries(
        {"data/0": b"\x00" * 32})))
    add("rec-storage-too-short", "DCP_EFORMAT",
        "storage of 32 bytes for a 64-byte tensor", md, files)

    md, files = with_record("w", record("b"))
    add("rec-dtype-mismatch", "DCP_EFORMAT",
        "the record holds int64 [3], the metadata says float32 [4,4]",
        md, files)

    md, files = with_record("w", zip_record(w_entries(
        {"byteorder": b"big"})))
    add("rec-big-endian", "DCP_ENOTSUP",
        "a big-endian record (bytes would be misread)", md, files)

    md, files = with_record("w", zip_record(w_entries(drop=("data.pkl",))))
    add("rec-no-datapkl", "DCP_EFORMAT", "a record without data.pkl",
        md, files)

    md, files = with_record("step", zip_record(
        [(n, evil if n.endswith("data.pkl") else c)
         for n, c in entries_of(record("step"))]))
    add("rec-value-os-system", "DCP_EUNSAFE",
        "a value record whose pickle calls os.system", md, files)

    laughs = P2 + uni("lol" * 10) + b"2\x86" * 40 + STOP
    md, files = with_record("step", zip_record(
        [(n, laughs if n.endswith("data.pkl") else c)
         for n, c in entries_of(record("step"))]))
    add("rec-value-billion-laughs", "DCP_ELIMIT",
        "a value pickle (x, x) nested 40 deep through DUP: 2^40 leaves from "
        "a 120-byte pickle (found by fuzz_pickle as a timeout)", md, files)

    shared = (P2 + b"X" + struct.pack("<I", 16384) + b"a" * 16384 +
              b"q\x000]q\x01(" + b"h\x00" * 20000 + b"e" + STOP)
    md, files = with_record("step", zip_record(
        [(n, shared if n.endswith("data.pkl") else c)
         for n, c in entries_of(record("step"))]))
    add("rec-value-shared-string", "DCP_ELIMIT",
        "a 16 KiB string referenced 20 000 times through the memo: 320 MiB "
        "of value from a 56 KiB pickle", md, files)

    md, files = with_record("w", b"\x00" * 200)
    add("rec-not-a-zip", "DCP_EFORMAT", "a record of zeros", md, files)

    md, files = with_record("w", w[:len(w) - 30])
    add("rec-truncated-end-record", "DCP_EFORMAT",
        "a record cut before its end of central directory", md, files)


# ------------------------------------------------------- safetensors

ST = "model.safetensors"
W_HDR = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
         "b": {"dtype": "I64", "shape": [3], "data_offsets": [16, 40]}}
W_DATA = struct.pack("<4f", 1, 2, 3, 4) + struct.pack("<3q", 1, -2, 3)


def st_bytes(header, data=W_DATA, length=None, pad=True):
    """A safetensors file: header (a dict, str or bytes), data; length
    overrides the length prefix."""
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    h = header.encode() if isinstance(header, str) else header
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h) if length is None else length) + h + data


def st_case(name, code, desc, content, setup=""):
    add_file(name, code, desc, {ST: content},
             "file:" + ST + ("," + setup if setup else ""))


def st_with(name, field, value):
    """W_HDR with tensor name's field set to value (raw JSON text)."""
    h = json.dumps(W_HDR, separators=(",", ":"))
    key = '"%s":{' % name
    start = h.index(key) + len(key)
    end = h.index("}", start)
    fields = dict(f.split(":", 1) for f in
                  [x for x in h[start:end].replace(',"', '\n"').split("\n")])
    fields['"%s"' % field] = value
    body = ",".join("%s:%s" % kv for kv in fields.items())
    return h[:start] + body + h[end:]


def safetensors_cases():
    from safetensors.torch import save as st_save
    good = st_bytes(W_HDR)
    hdr = json.dumps(W_HDR, separators=(",", ":"))
    n = struct.unpack("<Q", good[:8])[0]
    st_case("st-header-length-past-eof", "DCP_EFORMAT",
            "header length 100 bytes beyond the file (length prefix lie)",
            st_bytes(W_HDR, length=n + 100))
    st_case("st-header-length-2-63", "DCP_EFORMAT",
            "header length 2^63 (allocate what the prefix says)",
            st_bytes(W_HDR, length=1 << 63))
    st_case("st-header-length-zero", "DCP_EFORMAT",
            "header length 0", st_bytes(b"", data=b"", pad=False))
    st_case("st-file-too-short", "DCP_EFORMAT",
            "a 5-byte file (no room for the length prefix)", b"\x10\0\0\0\0")
    st_case("st-not-json", "DCP_EFORMAT",
            "the header is HTML, not JSON (a download error page)",
            st_bytes("<html><body>404</body></html>", data=b""))
    st_case("st-header-is-array", "DCP_EFORMAT",
            "the header is a JSON array", st_bytes("[]", data=b""))
    st_case("st-name-invalid-utf8", "DCP_EFORMAT",
            "a tensor name with the byte 0xff (invalid UTF-8)",
            st_bytes(hdr.replace('"w"', '"w\xff"').encode("latin-1")))
    st_case("st-name-overlong-utf8", "DCP_EFORMAT",
            "a tensor name with an overlong UTF-8 '/' (0xc0 0xaf)",
            st_bytes(hdr.replace('"w"', '"..\xc0\xafw"').encode("latin-1")))
    st_case("st-name-lone-surrogate", "DCP_EFORMAT",
            "a tensor name with a lone \\ud800 escape",
            st_bytes(hdr.replace('"w"', '"w\\ud800"')))
    st_case("st-name-nul", "DCP_EFORMAT",
            "a tensor name with an escaped NUL (a\\u0000b: C strings would "
            "cut it; the safetensors library accepts it)",
            st_bytes(hdr.replace('"w"', '"a\\u0000b"')))
    st_case("st-name-empty", "DCP_EFORMAT", "a tensor named \"\"",
            st_bytes(hdr.replace('"w"', '""')))
    st_case("st-duplicate-name", "DCP_EFORMAT",
            "a tensor named twice (the safetensors library keeps the last: "
            "two readers, two models; Trail of Bits audit)",
            st_bytes(hdr[:-1] + ',"w":{"dtype":"F32","shape":[2,2],'
                     '"data_offsets":[0,16]}}'))
    st_case("st-duplicate-field", "DCP_EFORMAT",
            "a tensor entry giving dtype twice (F32 then I32; the "
            "safetensors library refuses it, dcp took the first)",
            st_bytes(hdr.replace('{"dtype":"F32",',
                                 '{"dtype":"F32","dtype":"I32",')))
    st_case("st-duplicate-metadata-key", "DCP_EFORMAT",
            "__metadata__ with the key 'format' twice",
            st_bytes('{"__metadata__":{"format":"pt","format":"np"},' +
                     hdr[1:]))
    st_case("st-overlapping-offsets", "DCP_EFORMAT",
            "two tensors sharing bytes (data_offsets overlap; Trail of "
            "Bits audit)",
            st_bytes(st_with("b", "data_offsets", "[8,32]"), data=W_DATA[:32]))
    st_case("st-gap-between-tensors", "DCP_EFORMAT",
            "8 unreferenced bytes between the tensors (hidden payload)",
            st_bytes(st_with("b", "data_offsets", "[24,48]"),
                     data=W_DATA[:16] + b"\xcc" * 8 + W_DATA[16:]))
    st_case("st-offsets-past-eof", "DCP_ECORRUPT",
            "data_offsets ending 64 bytes past the end of the file",
            st_bytes(st_with("b", "data_offsets", "[16,104]").replace(
                '"shape":[3]', '"shape":[11]')))
    st_case("st-offsets-reversed", "DCP_EFORMAT", "data_offsets [40, 16]",
            st_bytes(st_with("b", "data_offsets", "[40,16]")))
    st_case("st-offsets-negative", "DCP_EFORMAT", "data_offsets [-24, 0]",
            st_bytes(st_with("b", "data_offsets", "[-24,0]")))
    st_case("st-offsets-three", "DCP_EFORMAT",
            "data_offsets with three numbers",
            st_bytes(st_with("b", "data_offsets", "[16,40,40]")))
    st_case("st-offsets-float", "DCP_EFORMAT", "data_offsets [16, 40.0]",
            st_bytes(st_with("b", "data_offsets", "[16,40.0]")))
    st_case("st-offsets-beyond-int64", "DCP_EFORMAT",
            "data_offsets end 2^64 (wraps a 64-bit parser)",
            st_bytes(st_with("b", "data_offsets",
                             "[16,18446744073709551656]")))
    st_case("st-offsets-exponent", "DCP_EFORMAT",
            "data_offsets written 4e1", st_bytes(
                st_with("b", "data_offsets", "[16,4e1]")))
    st_case("st-offsets-leading-zero", "DCP_EFORMAT",
            "data_offsets written 016 (not JSON)",
            st_bytes(st_with("b", "data_offsets", "[016,40]")))
    st_case("st-zero-size-inside-tensor", "DCP_EFORMAT",
            "an empty tensor whose offsets [8, 8] fall inside another "
            "tensor (the safetensors library refuses it)",
            st_bytes(hdr[:-1] + ',"z":{"dtype":"F32","shape":[0],'
                     '"data_offsets":[8,8]}}'))
    st_case("st-dtype-shape-mismatch", "DCP_EFORMAT",
            "F32 [2,2] in 12 bytes (dtype x shape against the byte range)",
            st_bytes(st_with("w", "data_offsets", "[0,12]").replace(
                "[16,40]", "[12,36]"), data=W_DATA[4:]))
    st_case("st-numel-overflow", "DCP_EFORMAT",
            "shape [2^32, 2^32, 16]: the element count overflows 64 bits "
            "(GGUF CVE-2024-25664 class)",
            st_bytes(st_with("w", "shape", "[4294967296,4294967296,16]")))
    st_case("st-nbytes-overflow", "DCP_EFORMAT",
            "F64 [2^62]: element count x 8 overflows 64 bits",
            st_bytes(st_with("w", "shape", "[4611686018427387904]").replace(
                '"F32"', '"F64"', 1)))
    st_case("st-rank-64", "DCP_ELIMIT", "a tensor of 64 dimensions",
            st_bytes(st_with("w", "shape", "[" + ",".join(["1"] * 62) +
                             ",2,2]")))
    st_case("st-negative-dim", "DCP_EFORMAT", "shape [-2, -2]",
            st_bytes(st_with("w", "shape", "[-2,-2]")))
    st_case("st-shape-not-array", "DCP_EFORMAT", 'shape "2x2"',
            st_bytes(st_with("w", "shape", '"2x2"')))
    st_case("st-shape-nan", "DCP_EFORMAT", "shape [NaN, 4] (not JSON)",
            st_bytes(st_with("w", "shape", "[NaN,4]")))
    st_case("st-unknown-dtype", "DCP_EFORMAT", 'dtype "F128"',
            st_bytes(hdr.replace('"F32"', '"F128"')))
    st_case("st-unsupported-dtype", "DCP_ENOTSUP",
            "an F6_E2M3 tensor (a safetensors dtype dcp does not hold)",
            st_bytes(hdr.replace('"F32"', '"F6_E2M3"')))
    st_case("st-trailing-bytes", "DCP_EFORMAT",
            "a zip archive appended after the data (polyglot file; Trail of "
            "Bits audit)", good + zip_record([("x/data.pkl", b"\x80\x02N.")]))
    st_case("st-nul-padding", "DCP_EFORMAT",
            "the header padded with NUL bytes instead of spaces",
            st_bytes(hdr.encode() + b"\0" * 6, pad=False))
    st_case("st-trailing-comma", "DCP_EFORMAT",
            "a trailing comma in the header (JSON5, not JSON)",
            st_bytes(hdr[:-1] + ",}"))
    st_case("st-comment", "DCP_EFORMAT", "a /* comment */ in the header",
            st_bytes("/* x */" + hdr))
    st_case("st-single-quotes", "DCP_EFORMAT", "keys in single quotes",
            st_bytes(hdr.replace('"', "'")))
    st_case("st-tensor-not-object", "DCP_EFORMAT", 'an entry "w": [0, 16]',
            st_bytes('{"w":[0,16],' + hdr[hdr.index('"b"'):], data=W_DATA))
    st_case("st-missing-dtype", "DCP_EFORMAT", "a tensor without dtype",
            st_bytes(hdr.replace('"dtype":"F32",', "")))
    st_case("st-missing-offsets", "DCP_EFORMAT",
            "a tensor without data_offsets",
            st_bytes(hdr.replace(',"data_offsets":[0,16]', ""),
                     data=W_DATA[16:]).replace(b"[16,40]", b"[0,24]  "))
    st_case("st-metadata-not-string", "DCP_EFORMAT",
            "a __metadata__ value that is a number",
            st_bytes('{"__metadata__":{"format":1},' + hdr[1:]))
    st_case("st-metadata-not-object", "DCP_EFORMAT",
            "__metadata__ that is a list",
            st_bytes('{"__metadata__":["pt"],' + hdr[1:]))
    st_case("st-metadata-deep-nesting", "DCP_ELIMIT",
            "__metadata__ holding lists nested 10 deep (limit 8)",
            st_bytes('{"__metadata__":{"a":' + "[" * 10 + "]" * 10 + "}," +
                     hdr[1:]))
    st_case("st-nesting-5000", "DCP_ELIMIT",
            "5000 nested arrays (stack exhaustion in recursive parsers)",
            st_bytes("[" * 5000 + "]" * 5000, data=b""))
    st_case("st-file-is-fifo", "DCP_EINVAL",
            "the file to import is a FIFO (the open blocked forever)",
            b"", "fifo:" + ST)
    # An index (model.safetensors.index.json) and its shards.
    a = st_bytes({"w": W_HDR["w"]}, data=W_DATA[:16])
    b = st_bytes({"b": {"dtype": "I64", "shape": [3],
                        "data_offsets": [0, 24]}}, data=W_DATA[16:])
    IX = "model.safetensors.index.json"

    def index_case(name, code, desc, wmap, files=None, setup="", raw=None):
        doc = raw if raw is not None else json.dumps(
            {"metadata": {"total_size": 40}, "weight_map": wmap}).encode()
        fs = {IX: doc}
        fs.update(files if files is not None else {"a.safetensors": a,
                                                   "b.safetensors": b})
        add_file(name, code, desc, fs,
                 "file:" + IX + ("," + setup if setup else ""))
    index_case("st-index-dotdot-shard", "DCP_EUNSAFE",
               "an index mapping a tensor to ../b.safetensors (path "
               "traversal, ONNX CVE-2022-25882 class)",
               {"w": "a.safetensors", "b": "../b.safetensors"})
    index_case("st-index-absolute-shard", "DCP_EUNSAFE",
               "an index mapping a tensor to /etc/passwd",
               {"w": "a.safetensors", "b": "/etc/passwd"})
    index_case("st-index-subdir-shard", "DCP_EUNSAFE",
               "an index mapping a tensor to sub/b.safetensors",
               {"w": "a.safetensors", "b": "sub/b.safetensors"})
    index_case("st-index-nul-in-shard", "DCP_EUNSAFE",
               "a shard name with an escaped NUL (b.safetensors\\u0000/x: "
               "C strings would cut it)",
               {"w": "a.safetensors", "b": "b.safetensors\0/../x"})
    index_case("st-index-shard-not-string", "DCP_EFORMAT",
               "an index mapping a tensor to a number",
               {"w": "a.safetensors", "b": 7})
    index_case("st-index-missing-shard", "DCP_ENOENT",
               "an index naming a shard that is not there",
               {"w": "a.safetensors", "b": "c.safetensors"})
    index_case("st-index-unmapped-tensor", "DCP_EFORMAT",
               "a shard holding a tensor the index does not map to it "
               "(hidden tensor)",
               {"w": "a.safetensors"}, files={"a.safetensors": good})
    index_case("st-index-extra-entry", "DCP_EFORMAT",
               "an index mapping a tensor to a shard that lacks it",
               {"w": "a.safetensors", "b": "b.safetensors",
                "c": "b.safetensors"})
    index_case("st-index-tensor-in-other-shard", "DCP_EFORMAT",
               "an index mapping both tensors to the shard that holds one",
               {"w": "a.safetensors", "b": "a.safetensors"})
    index_case("st-index-duplicate-key", "DCP_EFORMAT",
               "an index mapping one tensor twice", None,
               raw=b'{"weight_map":{"w":"a.safetensors","b":"b.safetensors",'
                   b'"w":"b.safetensors"}}')
    index_case("st-index-no-weight-map", "DCP_EFORMAT",
               "an index without weight_map", None,
               raw=b'{"metadata":{}}')
    index_case("st-index-deep-nesting", "DCP_ELIMIT",
               "an index with lists nested 20 deep (limit 16)", None,
               raw=b'{"metadata":' + b"[" * 20 + b"]" * 20 +
                   b',"weight_map":{}}')
    index_case("st-index-shard-fifo", "DCP_EUNSAFE",
               "a shard that is a FIFO (the open blocked forever)",
               {"w": "a.safetensors", "b": "b.safetensors"},
               files={"a.safetensors": a}, setup="fifo:b.safetensors")
    index_case("st-index-bad-shard", "DCP_ECORRUPT",
               "an index whose second shard is truncated",
               {"w": "a.safetensors", "b": "b.safetensors"},
               files={"a.safetensors": a, "b.safetensors": b[:-8]})


# ------------------------------------------------------ torch.save files

PT = "model.pt"


def pt_bytes(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def pt_edit(obj, fn):
    """torch.save(obj) with its entries rewritten by fn(short, bytes)
    (None drops an entry)."""
    out = []
    for n, c in entries_of(pt_bytes(obj)):
        short = n.split("/", 1)[1]
        c = fn(short, c)
        if c is not None:
            out.append((n, c))
    return zip_record(out)


def pt_case(name, code, desc, content):
    add_file(name, code, desc, {PT: content}, "file:" + PT)


def torch_file_cases():
    sd = {"w": torch.arange(16.0).reshape(4, 4), "step": 5}
    evil = P2 + g("os", "system") + uni("id") + b"\x85R" + STOP
    pt_case("pt-os-system", "DCP_EUNSAFE",
            "a torch.save file whose data.pkl calls os.system "
            "(CVE-2025-32434 class)",
            pt_edit(sd, lambda s, c: evil if s == "data.pkl" else c))
    ev = (b"\x80\x04" + uni("builtins") + uni("eval") + b"\x93" +
          uni("__import__('os').system('id')") + b"\x85R" + STOP)
    pt_case("pt-stack-global-eval", "DCP_EUNSAFE",
            "data.pkl calling builtins.eval through STACK_GLOBAL",
            pt_edit(sd, lambda s, c: ev if s == "data.pkl" else c))
    pt_case("pt-key-collision", "DCP_EFORMAT",
            "keys 'a.b' and ('a', 'b') flatten to the same key",
            pt_bytes({"a.b": torch.ones(1), "a": {"b": torch.zeros(1)}}))
    pkl = [c for n, c in entries_of(pt_bytes({"w": sd["w"]}))
           if n.endswith("data.pkl")][0]
    bad = pkl.replace(b"K\x04K\x01\x86", b"M\x90\x01K\x01\x86", 1)
    assert bad != pkl
    pt_case("pt-view-outside-storage", "DCP_EFORMAT",
            "tensor strides reaching past the storage (out-of-bounds view)",
            pt_edit({"w": sd["w"]},
                    lambda s, c: bad if s == "data.pkl" else c))
    pt_case("pt-storage-missing", "DCP_EFORMAT",
            "the tensor's storage record removed from the archive",
            pt_edit(sd, lambda s, c: None if s == "data/0" else c))
    pt_case("pt-storage-short", "DCP_EFORMAT",
            "a storage record of 32 bytes for 64 bytes of tensor",
            pt_edit(sd, lambda s, c: c[:32] if s == "data/0" else c))
    pt_case("pt-big-endian", "DCP_ENOTSUP",
            "byteorder 'big' (the bytes would be misread)",
            pt_edit(sd, lambda s, c: b"big" if s == "byteorder" else c))
    pt_case("pt-no-datapkl", "DCP_EFORMAT", "an archive without data.pkl",
            pt_edit(sd, lambda s, c: None if s == "data.pkl" else c))
    pt_case("pt-zip-slip", "DCP_EFORMAT",
            "entries named archive/../data.pkl (zip slip)",
            zip_record([(n.replace("archive/", "archive/../"), c)
                        for n, c in entries_of(pt_bytes(sd))]))
    pt_case("pt-compressed", "DCP_EFORMAT",
            "deflated entries (torch.save never compresses; a bomb vector)",
            zip_record(entries_of(pt_bytes(sd)), zipfile.ZIP_DEFLATED))
    pt_case("pt-not-a-zip", "DCP_EFORMAT",
            "a zip signature followed by zeros",
            b"PK\x03\x04" + b"\0" * 200)
    deep = {}
    cur = deep
    for i in range(100):
        cur["d"] = {}
        cur = cur["d"]
    cur["w"] = torch.ones(1)
    pt_case("pt-deep-nesting", "DCP_ELIMIT",
            "a state dict nested 100 dicts deep (walk depth bound)",
            pt_bytes(deep))
    # {"a": d, "b": d} with d the same 30 levels down: 2^30 paths (the
    # pickler's memo shares d).
    d = {"t": True}
    for i in range(30):
        d = {"a": d, "b": d}
    laughs = __import__("pickle").dumps(d, protocol=2)
    pt_case("pt-shared-dict-laughs", "DCP_ELIMIT",
            "a dict referencing the same dict twice, 30 levels deep "
            "through the memo: 2^30 entries from a 300-byte pickle",
            pt_edit(sd, lambda s, c: laughs if s == "data.pkl" else c))
    loop = P2 + b"]q\x00h\x00a" + STOP  # l = []; l.append(l)
    pt_case("pt-self-referencing-list", "DCP_ELIMIT",
            "a list that contains itself (a cycle through the memo)",
            pt_edit(sd, lambda s, c: (P2 + b"}q\x00" + uni("l") + loop[2:-1] +
                                      b"s" + STOP) if s == "data.pkl" else c))
    pt_case("pt-bits-tensor", "DCP_ENOTSUP",
            "a bits8 tensor (a dtype dcp does not hold; DCP cannot save it)",
            pt_bytes({"c": torch.zeros(2, dtype=torch.uint8).view(torch.bits8)}))


if __name__ == "__main__":
    if os.path.exists(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    pickle_cases()
    metadata_cases()
    record_cases()
    safetensors_cases()
    torch_file_cases()
    with open(os.path.join(OUT, "manifest.txt"), "w") as f:
        f.write("# case  expected-code  setup  # description (generated by "
                "tests/fuzz/make_hostile.py)\n")
        for name, code, setup, desc in cases:
            f.write("%s %s %s # %s\n" % (name, code, setup or "-", desc))
    total = sum(os.path.getsize(os.path.join(dp, fn))
                for dp, _, fns in os.walk(OUT) for fn in fns)
    print("%d cases, %d bytes" % (len(cases), total))
