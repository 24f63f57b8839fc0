#!/usr/bin/env python3
"""Plots `spindle bench fio --json` output: IOPS per matrix point for Spindle, Ceph 16 RBD
(same run with --ceph, else published figures from another machine kind, as the legend
says) and nbdkit memory (same run), log scale, one panel per iodepth.

Usage: spindle bench fio --json > fio.json; python3 scripts/plot_fio.py fio.json out.png
Needs matplotlib (`pip install matplotlib`); only a documentation tool, not used by tests.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    report = json.load(open(sys.argv[1]))
    rows = report["rows"]
    depths = sorted({r["iodepth"] for r in rows})
    fig, axes = plt.subplots(len(depths), 1, figsize=(13, 4.2 * len(depths)))
    if len(depths) == 1:
        axes = [axes]
    ceph = "Ceph 16 RBD (this run)" if report.get("ceph_same_sitting") else \
        "Ceph 16 RBD (published, other machine kind)"
    series = [("spindle", "Spindle", "#1f77b4"), ("ceph", ceph, "#d62728"),
              ("nbdkit_memory", "nbdkit memory (ceiling)", "#999999")]
    for ax, qd in zip(axes, depths):
        pts = [r for r in rows if r["iodepth"] == qd]
        labels = [f'{r["bs"]} {r["rw"]}' for r in pts]
        width = 0.27
        for i, (key, name, color) in enumerate(series):
            vals = [(r.get(key) or {}).get("iops") or 0 for r in pts]
            xs = [j + (i - 1) * width for j in range(len(pts))]
            ax.bar(xs, vals, width, label=name, color=color)
        ax.set_yscale("log")
        ax.set_xticks(range(len(pts)))
        ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("IOPS (log)")
        ax.set_title(f"fio nbd/rbd, iodepth {qd}: 3-way replicated image, 2 vCPU")
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=90)


if __name__ == "__main__":
    main()
