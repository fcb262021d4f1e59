"""Commit-protocol check on the real system calls (strace), complementing
the storage-level trace test (test_commit_trace.c): the POSIX back end must
issue, for a save into a new directory and for one over a committed
checkpoint:
  - fsync of every data file after its last pwrite, before the metadata's
    temporary (.metadata.<pid>-<n>-<random>.tmp, unique to the save)
    is opened;
  - fsync of that temporary after its last pwrite, before the rename;
  - renameat(temporary -> .metadata), then fsync of the checkpoint
    directory, before the program prints its marker (the API returned);
  - fsync of the parent directory after mkdir of the checkpoint directory;
  - every fsync and close of a written file returning 0.
    python3 strace_commit.py TEST_CRASH_BINARY
Exit 0 when every rule holds, 1 on a violation, 77 (ctest: skipped) when
strace cannot trace here (no ptrace permission).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

prog = sys.argv[1]
tmp = tempfile.mkdtemp(prefix="dcp-strace-")
LINE = re.compile(r"^(?:\[pid\s+\d+\]\s+|\d+\s+)?(\w+)\((.*)\)\s+=\s+(-?\d+)")
FD = re.compile(r"(-?\d+)<([^>]*)>")


def trace(args):
    out = os.path.join(tmp, "trace")
    # LeakSanitizer stops the world with ptrace, which a traced process
    # cannot: no leak check inside strace (the other tests do it).
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
    r = subprocess.run(["strace", "-f", "-y", "-qq", "-o", out, "-e",
                        "trace=openat,open,mkdir,pwrite64,write,fsync,"
                        "fdatasync,close,rename,renameat,renameat2,unlinkat",
                        prog] + args, capture_output=True, text=True,
                       env=env)
    if r.returncode != 0:
        if "ptrace" in r.stderr or "Operation not permitted" in r.stderr:
            print("strace cannot trace here:", r.stderr.strip())
            sys.exit(77)
        print("traced run failed:", r.stdout, r.stderr)
        sys.exit(1)
    with open(out) as f:
        return f.read().splitlines()


def check(lines, d, label):
    events = []  # (index, call, first fd path, args, ret)
    for i, l in enumerate(lines):
        m = LINE.match(l)
        if not m:
            continue
        call, args, ret = m.group(1), m.group(2), int(m.group(3))
        fds = FD.findall(args)
        events.append((i, call, fds[0][1] if fds else "", args, ret))
    bad = []
    def first(pred):
        for e in events:
            if pred(e):
                return e[0]
        return None
    def last(pred):
        r = None
        for e in events:
            if pred(e):
                r = e[0]
        return r
    tmpname = re.compile(r"\.metadata\.[0-9]+-[0-9]+-[0-9a-f]{8}\.tmp")
    opened = [e for e in events if e[1] == "openat" and tmpname.search(e[3])]
    tmpmeta = (os.path.join(d, tmpname.search(opened[0][3]).group(0))
               if opened else os.path.join(d, ".metadata.?.tmp"))
    open_tmp = opened[0][0] if opened else None
    if any(".metadata.tmp" in e[3] for e in events):
        bad.append("a fixed .metadata.tmp is used")
    rename = first(lambda e: e[1].startswith("rename") and
                   tmpname.search(e[3]) and e[4] == 0)
    dsync = first(lambda e: e[1] == "fsync" and e[2] == d and
                  rename is not None and e[0] > rename)
    if open_tmp is None or rename is None:
        bad.append("no metadata temporary written and renamed")
    if dsync is None:
        bad.append("no fsync of the directory after the rename")
    data = sorted({e[2] for e in events
                   if e[1] == "pwrite64" and e[2].endswith(".distcp")})
    if not data:
        bad.append("no data file written")
    for p in data + [tmpmeta]:
        lw = last(lambda e: e[1] == "pwrite64" and e[2] == p)
        fs = first(lambda e: e[1] == "fsync" and e[2] == p and e[0] > lw)
        if fs is None:
            bad.append("%s: no fsync after its last write" % p)
            continue
        limit = open_tmp if p != tmpmeta else rename
        if limit is not None and fs > limit:
            bad.append("%s: fsync after %s" % (
                p, "the metadata temporary was opened" if p != tmpmeta
                else "rename"))
    for e in events:
        if e[1] in ("fsync", "close") and e[4] != 0 and \
                (e[2].endswith(".distcp") or tmpname.search(e[2])):
            bad.append("%s of %s returned %d" % (e[1], e[2], e[4]))
    made = first(lambda e: e[1] == "mkdir" and e[3].startswith('"%s"' % d)
                 and e[4] == 0)
    if made is not None:
        parent = os.path.dirname(d)
        ps = first(lambda e: e[1] == "fsync" and e[2] == parent and
                   e[0] > made)
        if ps is None or (open_tmp is not None and ps > open_tmp):
            bad.append("mkdir of %s not followed by an fsync of %s" %
                       (d, parent))
    for b in bad:
        print("FAIL %s: %s" % (label, b))
    if not bad:
        n_sync = sum(1 for e in events if e[1] == "fsync")
        print("ok   %s: %d system calls traced, %d fsyncs, rules hold" %
              (label, len(events), n_sync))
    return not bad


def main():
    d = os.path.join(os.path.realpath(tmp), "ckpt")
    ok = check(trace(["save", d, "1"]), d, "save into a new directory")
    ok &= check(trace(["save", d, "2"]), d, "save over a checkpoint")
    ok &= check(trace(["save", d, "1"]), d, "save over a tagged checkpoint")
    shutil.rmtree(tmp)
    print("%d passed, %d failed" % (3 if ok else 0, 0 if ok else 1))
    return 0 if ok else 1


sys.exit(main())
