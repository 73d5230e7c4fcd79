"""The NCCL rows of two bench/peers.py runs side by side: PyTorch's process group on the real NCCL
and on libmcast_nccl (LD_PRELOAD), per op, size and mode, with the ratio (real NCCL's time over the
shim's: above 1, the shim is faster).

    python3 bench/shim_table.py peers_nccl.csv peers_shim.csv > shim.md
"""

import csv
import sys


def rows(path):
    with open(path, newline="") as f:
        return {(r["op"], int(r["bytes"]), r["mode"]): float(r["time_us"]) for r in csv.DictReader(f) if r["impl"] == "nccl"}


def size(b):
    for unit, s in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= s and b % s == 0:
            return f"{b // s} {unit}B"
    return f"{b} B"


def main():
    real, shim = rows(sys.argv[1]), rows(sys.argv[2])
    for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        keys = sorted({(b, m) for (o, b, m) in real.keys() | shim.keys() if o == op})
        if not keys:
            continue
        print(f"\n### {op}\n")
        print("| size | mode | NCCL (us) | mcast shim (us) | NCCL / shim |")
        print("|---|---|---|---|---|")
        for b, m in sorted(keys, key=lambda k: (k[1], k[0])):
            a, s = real.get((op, b, m)), shim.get((op, b, m))
            ratio = f"{a / s:.2f}x" if a and s else "-"
            fa = f"{a:.2f}" if a else "failed"
            fs = f"{s:.2f}" if s else "failed"
            print(f"| {size(b)} | {m} | {fa} | {fs} | {ratio} |")


if __name__ == "__main__":
    main()
