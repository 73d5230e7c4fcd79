"""One table per op from one run: mcast-bench, nccl-tests and PyTorch, each eager and from a CUDA
graph, with ratios, the peer-copy roofline measured in the same run, and issue 16's targets.

    python3 bench/compare.py --mcast mcast_all_reduce_eager.csv --mcast mcast_all_reduce_graph.csv ... \\
        [--peers peers.csv] [--nccl-tests nccl_all_reduce_graph.txt ...] [--roofline roofline.txt] \\
        [--md table.md]

Inputs (any may be missing; what is missing is named in a note):
  --mcast       mcast-bench --csv files; the mode column (eager/graph) says which mode
                (files without it are eager)
  --peers       bench/peers.py's CSV (impl, op, bytes, time_us, mode)
  --nccl-tests  nccl-tests *_perf output, saved as nccl_<op>_<eager|graph>.txt; the in-place
                time is used (mcast's collectives are in place)
  --roofline    bench/p2p_roofline.cu's output: the copy-engine rate with both directions busy is
                the peak peer copy (GB/s per direction)
  --first-use   run-h200x2.sh's first_use.txt (seconds from process start, empty kernel cache)
Times are microseconds per call; "x" columns are peer time / mcast time in the same mode (above 1:
mcast is faster); busbw uses NCCL's factors.
"""

import argparse
import csv
import os
import re
import sys
from collections import defaultdict

FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
          "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
MODES = ("eager", "graph")
KIB, MIB = 1 << 10, 1 << 20


def human(b):
    for unit, s in (("G", 1 << 30), ("M", MIB), ("K", KIB)):
        if b >= s and b % s == 0:
            return f"{b // s}{unit}"
    return str(b)


def read_mcast(path, times, notes, ranks):
    try:
        with open(path) as f:
            for r in csv.DictReader(f):
                mode = r.get("mode") or "eager"
                times[(r["op"], int(r["size"]))][("mcast", mode)] = float(r["time_us"])
                if r.get("nranks"):
                    ranks.add(int(r["nranks"]))
    except (OSError, KeyError, ValueError) as e:
        notes.append(f"mcast-bench CSV {path} unreadable ({e}); skipped")


def read_peers(path, times, notes):
    try:
        with open(path) as f:
            for r in csv.DictReader(f):
                mode = r.get("mode") or "eager"
                times[(r["op"], int(r["bytes"]))][(r["impl"], mode)] = float(r["time_us"])
    except (OSError, KeyError, ValueError) as e:
        notes.append(f"PyTorch/NCCL peers CSV {path} unreadable ({e}); skipped")


def read_nccl_tests(path, times, notes):
    """nccl-tests output: data rows are `size count type redop root` then out-of-place and
    in-place `time algbw busbw #wrong`; the in-place time is the 4th field from the end."""
    m = re.search(r"nccl_(all_reduce|all_gather|reduce_scatter|broadcast)_(eager|graph)", os.path.basename(path))
    if not m:
        notes.append(f"{path}: name it nccl_<op>_<eager|graph>.txt; skipped")
        return
    op, mode = m.group(1), m.group(2)
    rows = 0
    try:
        with open(path) as f:
            for line in f:
                fields = line.split()
                if len(fields) < 13 or line.lstrip().startswith("#") or not fields[0].isdigit():
                    continue
                try:
                    times[(op, int(fields[0]))][("nccl-tests", mode)] = float(fields[-4])
                    rows += 1
                except ValueError:
                    continue
    except OSError as e:
        notes.append(f"nccl-tests output {path} unreadable ({e}); skipped")
        return
    if rows == 0:
        notes.append(f"nccl-tests output {path} has no result rows; skipped")


def read_roofline(path, notes):
    """(copy engine both directions, best SM push, best SM pull), GB/s per direction."""
    ce = push = pull = None
    try:
        with open(path) as f:
            for line in f:
                m = re.search(r"([\d.]+) GB/s per direction, both directions at once", line)
                if not m:
                    continue
                v = float(m.group(1))
                if line.startswith("copy engine"):
                    ce = max(ce or 0, v)
                elif line.startswith("SM push"):
                    push = max(push or 0, v)
                elif line.startswith("SM pull"):
                    pull = max(pull or 0, v)
    except OSError as e:
        notes.append(f"roofline {path} unreadable ({e}); the roofline targets are not judged")
    if ce is None and path:
        notes.append(f"no copy-engine figure in {path}; the roofline targets are not judged")
    return ce, push, pull


def fmt(v, digits=1):
    return f"{v:.{digits}f}" if v is not None else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mcast", action="append", default=[])
    ap.add_argument("--peers")
    ap.add_argument("--nccl-tests", action="append", default=[])
    ap.add_argument("--roofline")
    ap.add_argument("--first-use", help="run-h200x2.sh's first_use.txt")
    ap.add_argument("--nranks", type=int, help="ranks (default: mcast-bench's CSV, else 2)")
    ap.add_argument("--md")
    args = ap.parse_args()

    notes = []
    times = defaultdict(dict)  # (op, bytes) -> (impl, mode) -> us
    ranks = set()
    for p in args.mcast:
        read_mcast(p, times, notes, ranks)
    if args.peers:
        read_peers(args.peers, times, notes)
    else:
        notes.append("no PyTorch/NCCL peers CSV (bench/peers.py did not run)")
    for p in args.nccl_tests:
        read_nccl_tests(p, times, notes)
    if not args.nccl_tests:
        notes.append("no nccl-tests output (set NCCL_TESTS_DIR to a directory of built *_perf binaries)")
    ce, push, pull = read_roofline(args.roofline, notes) if args.roofline else (None, None, None)
    if not args.roofline:
        notes.append("no roofline measured (no nvcc?); the roofline targets are not judged")

    n = args.nranks or (ranks.pop() if len(ranks) == 1 else 2)
    if args.nranks is None and len(ranks) > 1:
        notes.append(f"mcast-bench CSVs disagree on the rank count ({sorted(ranks)}); busbw assumes 2")
    out = []
    if ce is not None:
        out.append(f"Peak peer copy in this run (bench/p2p_roofline.cu, GB/s per direction, both directions "
                   f"busy): copy engine {ce:.1f}; SM push {fmt(push)}; SM pull {fmt(pull)}. "
                   f"95% of the copy-engine rate: {0.95 * ce:.1f} GB/s.\n")
    for op in OPS:
        keys = sorted(k for k in times if k[0] == op)
        if not keys:
            continue
        impls = sorted({i for k in keys for (i, _) in times[k]} - {"mcast"})
        cols = [(i, m) for i in ["mcast"] + impls for m in MODES
                if any((i, m) in times[k] for k in keys)]
        head = ["size"] + [f"{i} {m}" for i, m in cols]
        head += [f"best peer {m} / mcast {m}" for m in MODES] + ["mcast busbw (graph)", "best peer busbw (graph)"]
        f = FACTOR[op](n)
        red = ", sum" if op in ("all_reduce", "reduce_scatter") else ""
        out.append(f"\n### {op} (bf16{red}), {n} ranks, us per call\n")
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        for k in keys:
            t = times[k]
            row = [human(k[1])] + [fmt(t.get(c)) for c in cols]
            for m in MODES:
                mine = t.get(("mcast", m))
                peers = [v for (i, mm), v in t.items() if i != "mcast" and mm == m]
                row.append(f"{min(peers) / mine:.2f}x" if mine and peers else "-")
            bw = lambda us: k[1] / us / 1e3 * f if us else None  # noqa: E731
            graph_peers = [v for (i, mm), v in t.items() if i != "mcast" and mm == "graph"]
            row += [fmt(bw(t.get(("mcast", "graph")))), fmt(bw(min(graph_peers)) if graph_peers else None)]
            out.append("| " + " | ".join(row) + " |")
    out.append("\n### Targets (2 ranks, P2P, bf16)\n")
    out += ["| target | status | figure |", "|---|---|---|"]
    for name, status, figure in targets(times, n, ce):
        out.append(f"| {name} | {status} | {figure} |")
    first = None
    if args.first_use:
        try:
            m = re.search(r"([\d.]+) s", open(args.first_use).read())
            first = float(m.group(1)) if m else None
        except OSError:
            pass
    out.append("| first use (empty cache, process start to one bf16 all-reduce done) <= 2 s | "
               + ("not measured | - |" if first is None else f"{'met' if first <= 2.0 else 'missed'} | {first:.2f} s |"))
    if notes:
        out.append("\nNotes:")
        out += [f"- {x}" for x in notes]
    text = "\n".join(out)
    print(text)
    if args.md:
        with open(args.md, "w") as fh:
            fh.write(text + "\n")


def targets(times, n, ce):
    """(target, met/missed/not measured, figure) for each target of issue 16."""
    res = []

    def mc(op, size, mode):
        return times.get((op, size), {}).get(("mcast", mode))

    def sizes(op, lo, hi):
        return sorted(s for (o, s) in times if o == op and lo <= s <= hi)

    # 1. Small all-reduce latency.
    for mode, limit in (("eager", 4.5), ("graph", 3.5)):
        got = [(s, mc("all_reduce", s, mode)) for s in sizes("all_reduce", 8 * KIB, 256 * KIB)]
        got = [(s, v) for s, v in got if v is not None]
        name = f"all-reduce 8K-256K <= {limit} us ({mode})"
        if not got:
            res.append((name, "not measured", "-"))
            continue
        s, worst = max(got, key=lambda x: x[1])
        res.append((name, "met" if worst <= limit else "missed", f"worst {worst:.2f} us at {human(s)}"))
    # 2. Mid sizes: 1.2x the best of PyTorch two-shot and NCCL, graph mode.
    worst = None
    missing = False
    for s in sizes("all_reduce", MIB, 32 * MIB):
        t = times[("all_reduce", s)]
        mine = t.get(("mcast", "graph"))
        peers = [v for (i, m), v in t.items() if m == "graph" and i in ("torch_two_shot", "nccl", "nccl-tests")]
        if mine is None or not peers:
            missing = True
            continue
        r = min(peers) / mine
        if worst is None or r < worst[1]:
            worst = (s, r)
    name = "all-reduce 1-32 MB >= 1.2x best of two-shot and NCCL (graph)"
    if worst is None:
        res.append((name, "not measured", "-"))
    else:
        res.append((name, "met" if worst[1] >= 1.2 and not missing else "missed",
                    f"worst {worst[1]:.2f}x at {human(worst[0])}" + ("; some sizes lack a figure" if missing else "")))
    # 3/4. Large sizes against the roofline.
    for op, lo, floor in (("all_reduce", 256 * MIB, 365.0), ("all_gather", 256 * MIB, None),
                          ("reduce_scatter", 256 * MIB, None), ("broadcast", 256 * MIB, None)):
        f = FACTOR[op](n)
        bws = [(s, s / mc(op, s, "graph") / 1e3 * f) for s in sizes(op, lo, 1 << 40) if mc(op, s, "graph")]
        need = [x for x in (floor, 0.95 * ce if ce else None) if x is not None]
        name = f"{op} >= 256 MB: busbw >= " + " and ".join(
            (["365 GB/s"] if floor else []) + ["95% of the peer-copy roofline"])
        if not bws:
            res.append((name, "not measured", "-"))
        elif ce is None and floor is None:
            s, bw = min(bws, key=lambda x: x[1])
            res.append((name, "not judged (no roofline)", f"lowest {bw:.1f} GB/s at {human(s)}"))
        else:
            s, bw = min(bws, key=lambda x: x[1])
            ok = all(bw >= x for x in need)
            extra = f" = {bw / ce * 100:.1f}% of {ce:.1f}" if ce else " (no roofline measured)"
            res.append((name, "met" if ok else "missed", f"lowest {bw:.1f} GB/s at {human(s)}{extra}"))
    # 4b. Faster than every peer at every size, in each mode.
    for op in ("all_gather", "reduce_scatter", "broadcast"):
        for mode in MODES:
            losses, seen = [], 0
            for s in sizes(op, 0, 1 << 40):
                t = times[(op, s)]
                mine = t.get(("mcast", mode))
                peers = {i: v for (i, m), v in t.items() if m == mode and i != "mcast"}
                if mine is None or not peers:
                    continue
                seen += 1
                best_impl = min(peers, key=peers.get)
                if peers[best_impl] <= mine:
                    losses.append(f"{human(s)} ({best_impl} {peers[best_impl]:.1f} vs {mine:.1f})")
            name = f"{op}: faster than every peer at every size ({mode})"
            if not seen:
                res.append((name, "not measured", "-"))
            else:
                res.append((name, "met" if not losses else "missed",
                            f"{seen} sizes" + (f"; slower at {', '.join(losses[:6])}" + (" ..." if len(losses) > 6 else "")
                                               if losses else "")))
    return res


if __name__ == "__main__":
    sys.exit(main())
