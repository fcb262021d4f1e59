#!/usr/bin/env python3
"""The layer rule of docs/ARCHITECTURE.md, checked on the sources and objects.

    check_layers.py --src DIR [--build DIR] [--objects LIST] [--lib libdcp.a]
                    [--nm nm]
        (ctest unit.layout) fails, one line per violation, on
        a. an #include "x.h" in src/<folder>/ that does not resolve to the
           file's own folder or one it may use (DCP_LAYERS in CMakeLists.txt,
           the one place the rule is written), and one in tools/ that is not
           a public header (dcp/...) or the tool's own;
        b. an include cycle between files of src/;
        c. a reference (nm: undefined symbol of one object, defined in
           another) from one folder to a folder it may not use, and a cycle
           of references between files or between folders;
        d. an external symbol defined in the static library that is not
           dcp_* or dcp__*;
        and on DCP_LAYERS itself: a folder of src/ not declared, or one that
        may use a folder not declared before it (so the order has no cycle).
        On success it prints a one-line summary and exits 0.

    check_layers.py --src DIR --cc CC --incdirs LAYER=DIR|DIR... [...]
        (ctest unit.layout_enforced) proves the build's include paths refuse
        what the rule forbids: with each layer's own include directories (as
        the build passes them), a header of each folder it may not use must
        not be found, and one of each folder it may use must be; and a file
        holding only #include "save.h" fails to preprocess with the format
        layer's directories and passes with the ckpt layer's.

Exit status: 0 clean, 1 violations, 2 usage or environment error.
Standard library only.
"""

import argparse
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
OBJ_RE = re.compile(r"src/([^/]+)/([^/]+)\.c\.(?:o|obj)$")
# nm types of external definitions: uppercase (text, data, bss, read-only,
# common, weak, small data) and GNU's unique global 'u'. Lowercase ones are
# local (static) and never clash.
DEF_TYPES = set("TDBRCVWGSu")
# Symbols the compiler's instrumentation defines (sanitizer ODR indicators,
# coverage counters), not the library's: the sanitizer and fuzzer builds run
# unit.layout too.
TOOL_PREFIXES = ("__odr_asan", "__asan", "___asan", "__sancov", "__ubsan",
                 "__tsan", "__llvm", "__profc_", "__profd_", "__covrec_",
                 "__start_", "__stop_")


def die(msg):
    print("check_layers: " + msg, file=sys.stderr)
    sys.exit(2)


# ------------------------------------------------------------- the rule

def read_layers(src):
    """[(folder, [folders it may use])] from DCP_LAYERS, lowest first."""
    path = os.path.join(src, "CMakeLists.txt")
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        die("cannot read %s: %s" % (path, e))
    m = re.search(r"set\(\s*DCP_LAYERS\s+(.*?)\)", text, re.S)
    if not m:
        die("no set(DCP_LAYERS ...) in %s" % path)
    layers = []
    for spec in re.findall(r'"([^"]*)"', m.group(1)):
        name, _, below = spec.partition(":")
        layers.append((name.strip(), below.split()))
    if not layers:
        die("DCP_LAYERS in %s is empty" % path)
    return layers


def check_declaration(src, layers, bad):
    """Each folder uses only folders declared before it (so the order has no
    cycle) and every folder of src/ is declared."""
    seen = set()
    for name, below in layers:
        for b in below:
            if b not in seen:
                bad.append("CMakeLists.txt: DCP_LAYERS: '%s' may use '%s', "
                           "which is not declared below it" % (name, b))
        seen.add(name)
    for d in sorted(os.listdir(os.path.join(src, "src"))):
        if os.path.isdir(os.path.join(src, "src", d)) and d not in seen:
            bad.append("src/%s/: folder not in DCP_LAYERS" % d)


# ------------------------------------------------------------ includes

def src_files(src, folders):
    files = {}
    for f in folders:
        for p in sorted(glob.glob(os.path.join(src, "src", f, "*.[ch]"))):
            files["%s/%s" % (f, os.path.basename(p))] = p
    return files


def check_includes(src, layers, bad):
    allowed = {n: [n] + b for n, b in layers}
    files = src_files(src, allowed)
    where = collections.defaultdict(list)  # header name -> folders
    for rel in files:
        folder, base = rel.split("/")
        if base.endswith(".h"):
            where[base].append(folder)
    public = os.path.join(src, "include")
    edges = collections.defaultdict(set)
    n = 0
    for rel, path in files.items():
        folder = rel.split("/")[0]
        for inc in INCLUDE_RE.findall(open(path, encoding="utf-8").read()):
            n += 1
            if inc.startswith("dcp/"):
                if not os.path.isfile(os.path.join(public, inc)):
                    bad.append("src/%s: #include \"%s\": no such public "
                               "header" % (rel, inc))
                continue
            hit = next((f for f in allowed[folder] if inc in where
                        and f in where[inc]), None)
            if hit:
                edges[rel].add("%s/%s" % (hit, inc))
            elif inc in where:
                bad.append("src/%s: #include \"%s\" is in src/%s/, which "
                           "%s/ may not use" % (rel, inc, where[inc][0],
                                                folder))
            else:
                bad.append("src/%s: #include \"%s\": not found in src/%s/ or "
                           "the folders it may use" % (rel, inc, folder))
    for comp in cycles(edges, files):
        bad.append("include cycle: " + " -> ".join(
            "src/" + f for f in comp + comp[:1]))
    return len(files), sum(len(v) for v in edges.values())


def check_tools(src, bad):
    """tools/: public headers (dcp/...) and the tool's own headers only."""
    n = 0
    for path in sorted(glob.glob(os.path.join(src, "tools", "*", "*.[ch]"))):
        rel = os.path.relpath(path, src)
        here = os.path.dirname(path)
        for inc in INCLUDE_RE.findall(open(path, encoding="utf-8").read()):
            n += 1
            if inc.startswith("dcp/") and os.path.isfile(
                    os.path.join(src, "include", inc)):
                continue
            if "/" not in inc and os.path.isfile(os.path.join(here, inc)):
                continue
            bad.append("%s: #include \"%s\": tools use public headers "
                       "(dcp/...) only" % (rel, inc))
    return n


# --------------------------------------------------------------- graphs

def cycles(edges, nodes):
    """Strongly connected components of more than one node (or a node with
    an edge to itself), each as a sorted list; iterative Tarjan."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in sorted(set(nodes) | set(edges)):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in edges.get(v, ()):
                    out.append(sorted(comp))
    return sorted(out)


# ---------------------------------------------------------------- calls

def nm(tool, paths):
    """{path: [(member, type, name)]}, from one run of nm over all paths
    (an archive's members are named by the "member:" lines nm prints)."""
    r = subprocess.run([tool] + paths, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True)
    if r.returncode != 0:
        die("%s failed: %s" % (tool, r.stderr.strip()))
    out = {p: [] for p in paths}
    cur = paths[0] if len(paths) == 1 else None
    member = "?"
    for line in r.stdout.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            name = line[:-1]
            if name in out:
                cur, member = name, "?"
            else:
                member = name
            continue
        p = line.split()
        if cur is None or len(p) < 2:
            continue
        if len(p) == 2:
            out[cur].append((member, p[0], p[1]))
        else:
            out[cur].append((member, p[1], p[2]))
    return out


def find_objects(args, folders):
    objs = []
    if args.objects:
        for item in re.split(r"[;|]", args.objects):
            if item:
                objs.append(item)
    elif args.build:
        for f in folders:
            objs += glob.glob(os.path.join(args.build, "CMakeFiles",
                                           "dcp_%s.dir" % f, "**", "*.o"),
                              recursive=True)
    out = {}
    for o in objs:
        m = OBJ_RE.search(o.replace(os.sep, "/"))
        if not m:
            die("object %s: not under src/<folder>/" % o)
        out["%s/%s.c" % (m.group(1), m.group(2))] = o
    if not out:
        die("no object files (build first; pass --build or --objects)")
    return out


def check_calls(args, layers, bad):
    allowed = {n: set([n] + b) for n, b in layers}
    objs = find_objects(args, allowed)
    defs, undef = {}, collections.defaultdict(set)
    syms = nm(args.nm, sorted(objs.values()))
    for rel, o in sorted(objs.items()):
        if rel.split("/")[0] not in allowed:
            bad.append("%s: object of a folder not in DCP_LAYERS" % o)
            continue
        for _, t, name in syms[o]:
            if t in DEF_TYPES:
                defs[name] = rel
            elif t in "Uw":
                undef[rel].add(name)
    fedges = collections.defaultdict(dict)  # file -> {file: first symbol}
    for rel in sorted(undef):
        for sym in sorted(undef[rel]):
            to = defs.get(sym)
            if to is None or to == rel:
                continue
            fedges[rel].setdefault(to, sym)
            a, b = rel.split("/")[0], to.split("/")[0]
            if b not in allowed[a]:
                bad.append("src/%s: calls %s in src/%s: %s/ may not use "
                           "%s/" % (rel, sym, to, a, b))
    graph = {f: set(t) for f, t in fedges.items()}
    for comp in cycles(graph, objs):
        hops = []
        for f in comp:
            for t in comp:
                if t in fedges.get(f, {}):
                    hops.append("src/%s -> src/%s (%s)" % (f, t, fedges[f][t]))
        bad.append("call cycle between files: %s: %s" % (
            " ".join("src/" + f for f in comp), "; ".join(hops)))
    folders = collections.defaultdict(set)
    for f, ts in graph.items():
        for t in ts:
            if f.split("/")[0] != t.split("/")[0]:
                folders[f.split("/")[0]].add(t.split("/")[0])
    for comp in cycles(folders, allowed):
        bad.append("call cycle between folders: " + " ".join(
            "src/%s/" % f for f in comp))
    return (len(objs), sum(len(t) for t in graph.values()),
            sum(len(t) for t in folders.values()))


# -------------------------------------------------------------- symbols

def check_symbols(args, bad):
    n = 0
    for member, t, name in nm(args.nm, [args.lib])[args.lib]:
        if t not in DEF_TYPES or name.startswith(TOOL_PREFIXES):
            continue
        n += 1
        if not name.startswith("dcp_"):
            bad.append("%s(%s): external symbol %s is neither dcp_* nor "
                       "dcp__*" % (os.path.basename(args.lib), member, name))
    return n


# ------------------------------------------------- the build refuses it

def preprocess(cc, flags, path):
    r = subprocess.run([cc, "-E", "-o", os.devnull] + flags + [path],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True)
    return r.returncode, r.stderr


def check_enforced(args, layers):
    """Per layer, one preprocessor run: __has_include (which searches the
    include path exactly as #include does) of one header of every folder,
    an #error for each answer the rule does not allow. Then the example
    in full: format/ flags + #include "save.h" fails, ckpt/ flags pass."""
    allowed = {n: [n] + b for n, b in layers}
    files = src_files(args.src, allowed)
    headers = collections.defaultdict(list)  # folder -> header names
    owner = collections.defaultdict(set)
    for rel in files:
        folder, base = rel.split("/")
        if base.endswith(".h"):
            headers[folder].append(base)
            owner[base].add(folder)
    pick = {}  # folder -> one header named only there
    for folder, _ in layers:
        hs = [h for h in sorted(headers[folder]) if owner[h] == {folder}]
        if hs:
            pick[folder] = "save.h" if "save.h" in hs else hs[0]
    incdirs = {}
    for spec in args.incdirs:
        name, _, dirs = spec.partition("=")
        incdirs[name] = ["-I" + d for d in re.split(r"[;|]", dirs) if d]
    bad, n = [], 0
    tmp = tempfile.mkdtemp(prefix="dcp-layout-")
    try:
        for name, _ in layers:
            if name not in incdirs:
                die("no --incdirs for layer %s" % name)
            lines = []
            for folder, h in sorted(pick.items()):
                n += 1
                if folder in allowed[name]:
                    lines += ['#if !__has_include("%s")' % h,
                              "#error %s/ cannot include %s (src/%s/, "
                              "allowed)" % (name, h, folder), "#endif"]
                else:
                    lines += ['#if __has_include("%s")' % h,
                              "#error %s/ can include %s (src/%s/, not "
                              "allowed): the build does not enforce the "
                              "rule" % (name, h, folder), "#endif"]
            c = os.path.join(tmp, "%s.c" % name)
            with open(c, "w") as fp:
                fp.write("\n".join(lines) + "\n")
            rc, err = preprocess(args.cc, incdirs[name], c)
            # gcc shows the message twice (diagnostic and source line).
            msgs = list(dict.fromkeys(
                m.strip() for m in re.findall(r"#error (.*)", err)))
            bad += msgs
            if rc != 0 and not msgs:
                bad.append("%s/: the preprocessor failed: %s" %
                           (name, err.strip()[:300]))
        # The literal case of the issue: the build refuses it.
        c = os.path.join(tmp, "upward.c")
        with open(c, "w") as fp:
            fp.write('#include "save.h"\n')
        if "format" in incdirs and "ckpt" in incdirs:
            rc, err = preprocess(args.cc, incdirs["format"], c)
            if rc == 0 or "save.h" not in err:
                bad.append("format/ + #include \"save.h\" was not refused "
                           "for the missing header: %s" % err.strip()[:300])
            else:
                print("format/ + #include \"save.h\": refused: %s" %
                      err.strip().splitlines()[0])
            rc2, err2 = preprocess(args.cc, incdirs["ckpt"], c)
            if rc2 != 0:
                bad.append("ckpt/ + #include \"save.h\" fails: %s" %
                           err2.strip()[:300])
    finally:
        for f in glob.glob(os.path.join(tmp, "*")):
            os.unlink(f)
        os.rmdir(tmp)
    for line in bad:
        print(line)
    if bad:
        return 1
    print("layout enforced: %d layer/folder pairs, as the build's include "
          "paths see them" % n)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", required=True, help="source tree root")
    ap.add_argument("--build", help="build tree (objects found by glob)")
    ap.add_argument("--objects", help="object files, ';' or '|' separated")
    ap.add_argument("--lib", help="the static library (libdcp.a)")
    ap.add_argument("--nm", default="nm")
    ap.add_argument("--cc", help="C compiler: check the build's include "
                    "paths instead (with --incdirs)")
    ap.add_argument("--incdirs", action="append", default=[],
                    help="LAYER=DIR|DIR...: a layer's include directories")
    args = ap.parse_args()
    layers = read_layers(args.src)
    if args.cc:
        return check_enforced(args, layers)
    bad = []
    check_declaration(args.src, layers, bad)
    nsrc, ninc = check_includes(args.src, layers, bad)
    ntool = check_tools(args.src, bad)
    nobj, ncall, nfold = check_calls(args, layers, bad)
    nsym = check_symbols(args, bad) if args.lib else 0
    for line in bad:
        print(line)
    summary = ("%d source files in %d folders, %d include edges, %d tool "
               "includes; %d objects, %d call edges between files, %d between "
               "folders; %d external symbols in %s" %
               (nsrc, len(layers), ninc, ntool, nobj, ncall, nfold, nsym,
                os.path.basename(args.lib) if args.lib else "(no library)"))
    if bad:
        print("layout: %d violation(s); %s" % (len(bad), summary))
        return 1
    print("layout ok: " + summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
