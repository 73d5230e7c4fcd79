#!/usr/bin/env python3
"""The table of a bench/teams-ab.sh run: per case, the median over the rounds of mcast-bench's
time (us) per size for builds A and B, and the wrong elements of every run summed.

    bench/teams-table.py OUT ROUNDS CASE...   (OUT holds A1_CASE.txt ... B<ROUNDS>_CASE.txt)
"""
import os
import re
import statistics
import sys

ROW = re.compile(r"^\s+(\d+)\s+\d+\s+\S+\s+\S+\s+\S+\s+([\d.]+)\s+\S+\s+\S+\s+(\d+)")


def rows(path):
    """{bytes: (time_us, wrong)} of one mcast-bench output; {} when the run left none."""
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                m = ROW.match(line)
                if m:
                    out[int(m.group(1))] = (float(m.group(2)), int(m.group(3)))
    return out


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    out, rounds, cases = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    for case in cases:
        runs = {w: [rows(f"{out}/{w}{i}_{case}.txt") for i in range(1, rounds + 1)] for w in "AB"}
        sizes = sorted(set().union(*runs["A"], *runs["B"]))
        wrong = sum(v[1] for w in "AB" for r in runs[w] for v in r.values())
        missing = sum(1 for w in "AB" for r in runs[w] if not r)
        print(f"\n{case}: us, median of {rounds} (wrong elements: {wrong}; runs without rows: {missing})\n")
        print("| bytes | A | B | B / A |\n|---|---|---|---|")
        for s in sizes:
            med = {}
            for w in "AB":
                t = [r[s][0] for r in runs[w] if s in r]
                med[w] = statistics.median(t) if t else float("nan")
            print(f"| {s} | {med['A']:.2f} | {med['B']:.2f} | {med['B'] / med['A']:.2f} |")


if __name__ == "__main__":
    main()
