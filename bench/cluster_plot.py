#!/usr/bin/env python3
"""The cluster_* figures of bench/results.json against their targets, as a
bar chart (make bench-cluster; bench/RESULTS.md, "A cluster on one machine").

  cluster_plot.py [RESULTS_JSON [PNG]]   defaults: bench/results.json,
                                         bench/cluster.png
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
KEYS = [("cluster_readonce_speedup", "read once\n(per rank / read once)", 2.5),
        ("cluster_tier_restore_vs_s3", "tier restore\n(S3 / peers)", 2.0),
        ("cluster_save_vs_link", "save\n(/ store link)", 0.9),
        ("cluster_load_vs_link", "load\n(/ store link)", 0.9)]


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "results.json")
    png = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "cluster.png")
    d = json.load(open(src))
    keys = [k for k in KEYS if k[0] in d]
    if not keys:
        print("cluster_plot: no cluster_* figures in " + src, file=sys.stderr)
        return 1
    fig, ax = plt.subplots(figsize=(7, 3.6))
    xs = range(len(keys))
    vals = [d[k]["value"] for k, _, _ in keys]
    ax.bar(xs, vals, color=["tab:green" if v >= t else "tab:orange"
                            for v, (_, _, t) in zip(vals, keys)])
    for x, v, (_, _, t) in zip(xs, vals, keys):
        ax.hlines(t, x - 0.4, x + 0.4, colors="k", linestyles="dashed")
        ax.text(x, v, f"{v:.2f}", ha="center", va="bottom")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([lab for _, lab, _ in keys])
    ax.set_ylabel("ratio (dashed: target)")
    e = d[keys[0][0]]
    ax.set_title(f"4 nodes x 1 rank, node links {e.get('node_rate', '?')}, "
                 f"store link {e.get('store_rate', '?')}")
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    return 0


if __name__ == "__main__":
    sys.exit(main())
