"""Merges mcast-bench's CSV and bench/peers.py's CSV into one table with ratios.

    python3 bench/compare.py --mcast mcast.csv --peers peers.csv [--md table.md]

For each op and size: mcast's time, each peer's time, and peer/mcast (above 1: mcast is faster),
plus bus bandwidth (NCCL's definitions) for mcast and the best peer.
"""

import argparse
import csv
from collections import defaultdict

FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
          "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}


def human(b):
    for unit, s in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= s and b % s == 0:
            return f"{b // s}{unit}"
    return str(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mcast", action="append", required=True)
    ap.add_argument("--peers", required=True)
    ap.add_argument("--nranks", type=int, default=2)
    ap.add_argument("--md")
    args = ap.parse_args()

    times = defaultdict(dict)  # (op, bytes) -> impl -> us
    for path in args.mcast:
        for r in csv.DictReader(open(path)):
            times[(r["op"], int(r["size"]))]["mcast"] = float(r["time_us"])
    for r in csv.DictReader(open(args.peers)):
        times[(r["op"], int(r["bytes"]))][r["impl"]] = float(r["time_us"])

    lines = []
    for op in ("all_reduce", "all_gather", "broadcast", "reduce_scatter"):
        keys = sorted(k for k in times if k[0] == op)
        if not keys:
            continue
        peers = sorted({i for k in keys for i in times[k] if i != "mcast"})
        head = ["size", "mcast us"] + [f"{p} us" for p in peers] + ["best peer / mcast", "mcast busbw", "best peer busbw"]
        lines.append(f"\n### {op} (bf16{', sum' if op in ('all_reduce', 'reduce_scatter') else ''}), {args.nranks} ranks\n")
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        f = FACTOR[op](args.nranks)
        for k in keys:
            t = times[k]
            m = t.get("mcast")
            vals = [t.get(p) for p in peers]
            best = min((v for v in vals if v), default=None)
            ratio = f"{best / m:.2f}x" if m and best else "n/a"
            bw = lambda us: f"{k[1] / us / 1e3 * f:.1f}" if us else "n/a"
            row = [human(k[1]), f"{m:.1f}" if m else "n/a"] + [f"{v:.1f}" if v else "n/a" for v in vals]
            row += [ratio, bw(m), bw(best)]
            lines.append("| " + " | ".join(row) + " |")
    text = "\n".join(lines)
    print(text)
    if args.md:
        open(args.md, "w").write(text + "\n")


if __name__ == "__main__":
    main()
