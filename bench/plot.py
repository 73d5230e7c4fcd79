"""One plot per op from the files bench/compare.py reads: bus bandwidth (GB/s, nccl-tests' factors
for N ranks) and latency (us per call) against message size, log-log, mcast eager and graph (and
one process per rank, where measured) beside every peer in each mode it was measured in.

    python3 bench/plot.py --dir OUT [--nranks N] [--out OUT/plots]     (what bench/run.sh writes)
    python3 bench/plot.py --mcast ... --peers ... --nccl-tests ... --out DIR   (as compare.py)

Writes DIR/<op>.png for each op with results. Needs matplotlib (pip install matplotlib).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    compare.arguments(ap)
    ap.add_argument("--out", help="directory of the PNGs (default: DIR/plots with --dir, else plots)")
    args = ap.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot.py: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return 1
    times, n, notes, _, _ = compare.load(args)
    out = args.out or (os.path.join(args.dir, "plots") if args.dir else "plots")
    os.makedirs(out, exist_ok=True)
    written = []
    for op in compare.OPS:
        keys = sorted(k for k in times if k[0] == op)
        if not keys:
            continue
        series = sorted({c for k in keys for c in times[k]},
                        key=lambda c: (c[0] not in compare.MCAST, c[0], c[1]))
        fig, (bw_ax, lat_ax) = plt.subplots(1, 2, figsize=(13, 5))
        for impl, mode in series:
            pts = [(s, times[(op, s)][(impl, mode)]) for (_, s) in keys if (impl, mode) in times[(op, s)]]
            if not pts:
                continue
            xs = [s for s, _ in pts]
            mine = impl in compare.MCAST
            style = dict(linestyle="-" if mode == "graph" else "--", marker="o" if mine else ".",
                         linewidth=2.2 if mine else 1.2, label=f"{impl} {mode}")
            bw_ax.plot(xs, [compare.busbw(op, n, s, us) for s, us in pts], **style)
            lat_ax.plot(xs, [us for _, us in pts], **style)
        for ax, what in ((bw_ax, "bus bandwidth (GB/s)"), (lat_ax, "time per call (us)")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("message size (bytes, the whole message)")
            ax.set_ylabel(what)
            ax.grid(True, which="both", alpha=0.3)
        ticks = [s for (_, s) in keys][:: max(1, len(keys) // 9)]
        for ax in (bw_ax, lat_ax):
            ax.set_xticks(ticks, [compare.human(s) for s in ticks])
        lat_ax.legend(fontsize=8)
        fig.suptitle(f"{op}, bf16, {n} ranks: mcast and its peers (dashed: eager, solid: CUDA graph)")
        fig.tight_layout()
        path = os.path.join(out, f"{op}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    for x in notes:
        print(f"plot.py: note: {x}", file=sys.stderr)
    if not written:
        print("plot.py: no results to plot", file=sys.stderr)
        return 1
    print("\n".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
