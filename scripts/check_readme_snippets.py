#!/usr/bin/env python3
"""Compiles every C snippet of README.md with -Wall -Wextra -Werror.

  check_readme_snippets.py --cc CC --include DIR README.md

A snippet is a fragment: its #include lines go to the top of a file, the
functions it defines (a line starting with "static" and "(" up to a line
that is "}") stay at file scope, and its statements become the body of a
function returning int (a snippet may return an error code). The names a
snippet uses without declaring them (ctx, st, the buffers of the state
dict example, train_one_step ...) are declared once in PRELUDE (with dcp.h
and dcp_statedict.h, whose example the README splits in two), so that a
snippet that uses an API wrongly, or initialises a struct in a way
-Wextra warns about, fails here. Prints one line per snippet and ends with
"N passed, N failed".
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

PRELUDE = """\
#include <stdint.h>
#include <stdio.h>
#include <dcp/dcp.h>
#include <dcp/dcp_statedict.h>
#define U __attribute__((unused))
static dcp_ctx *ctx U;
static dcp_state *st U, *st2 U;
static dcp_request *req U;
static dcp_sd *sd U;
static const char *path U = "ckpt";
static void *weights U;
static float *params U, *exp_avg U, *exp_avg_sq U, *momentum_buffer U;
static int64_t lo U, hi U, lo2 U, hi2 U, numel U, nsteps U, step U;
static int tier U;
static U void train_one_step(void) {}
"""


def split_snippet(text):
    """(includes, file-scope definitions, statements) of a snippet."""
    inc, top, body = [], [], []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        ln = lines[i]
        if ln.startswith("#include"):
            inc.append(ln)
        elif ln.startswith("static ") and "(" in ln and not ln.rstrip().endswith(";"):
            while i < len(lines):
                top.append(lines[i])
                if lines[i] == "}":
                    break
                i += 1
        else:
            body.append(ln)
        i += 1
    return inc, top, body


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cc", required=True)
    ap.add_argument("--include", required=True)
    ap.add_argument("readme")
    a = ap.parse_args()
    with open(a.readme, encoding="utf-8") as f:
        text = f.read()
    snippets = re.findall(r"^```c\n(.*?)^```", text, re.S | re.M)
    npass = nfail = 0
    with tempfile.TemporaryDirectory(prefix="dcp-readme-") as tmp:
        for k, snip in enumerate(snippets):
            inc, top, body = split_snippet(snip)
            src = (PRELUDE + "\n".join(inc) + "\n" + "\n".join(top) +
                   f"\nint snippet_{k}(void);\nint snippet_{k}(void)\n{{\n" +
                   "\n".join(body) + "\nreturn 0;\n}\n")
            fn = os.path.join(tmp, f"snippet{k}.c")
            with open(fn, "w", encoding="utf-8") as f:
                f.write(src)
            r = subprocess.run([a.cc, "-std=c11", "-Wall", "-Wextra", "-Werror",
                                "-fsyntax-only", "-I", a.include, fn],
                               capture_output=True, text=True)
            first = snip.strip().splitlines()[0] if snip.strip() else ""
            if r.returncode == 0:
                npass += 1
                print(f"ok   snippet {k} ({first})")
            else:
                nfail += 1
                print(f"FAIL snippet {k} ({first}):\n{r.stderr}")
    if not snippets:
        print("FAIL no C snippet found")
        nfail += 1
    print(f"{npass} passed, {nfail} failed")
    return 1 if nfail else 0


if __name__ == "__main__":
    sys.exit(main())
