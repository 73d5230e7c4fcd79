"""One table per op from one run: mcast-bench, nccl-tests and PyTorch, each eager and from a CUDA
graph, with ratios, the peer-copy roofline measured in the same run, and the targets.

    python3 bench/compare.py --dir OUT [--nranks N] [--md table.md]      (what bench/run.sh writes)
    python3 bench/compare.py --mcast mcast_all_reduce_eager.csv --mcast mcast_all_reduce_graph.csv ... \\
        [--peers peers.csv] [--nccl-tests nccl_all_reduce_graph.txt ...] [--roofline roofline.txt] \\
        [--md table.md]

Inputs (any may be missing; what is missing is named in a note):
  --dir         a directory of bench/run.sh's files: mcast_<op>_<mode>.csv, mcast-procs_<op>_<mode>.csv,
                nccl_<op>_<mode>.txt, peers*.csv, roofline.txt, first_use.txt, nranks.txt
  --mcast-procs mcast-bench --procs N --csv files (impl "mcast-procs")
  --mcast       mcast-bench --csv files; the mode column (eager/graph) says which mode
                (files without it are eager)
  --peers       bench/peers.py's CSV (impl, op, bytes, time_us, mode)
  --nccl-tests  nccl-tests *_perf output, saved as nccl_<op>_<eager|graph>.txt; the in-place
                time is used (mcast's collectives are in place)
  --roofline    bench/p2p_roofline.cu's output: the copy-engine rate with both directions busy is
                the peak peer copy (GB/s per direction)
  --first-use   run.sh's first_use.txt (seconds from process start, empty kernel cache)
Times are microseconds per call. Each table has mcast (one process driving every rank) and
mcast-procs (one process per rank) eager and graph, then every peer in its best mode (the mode
letter after the time: e eager, g graph), the best peer eager / mcast eager (the eager rows) and
the best peer in any mode / mcast's best (above 1: mcast is faster), and bus bandwidth with
nccl-tests' factors for N ranks (all-reduce 2(N-1)/N, all-gather and reduce-scatter (N-1)/N,
broadcast 1) applied to the size column (the whole message, as nccl-tests counts it).
bench/plot.py reads the same inputs (load() here) and draws one plot per op.
"""

import argparse
import csv
import glob
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


MCAST = ("mcast", "mcast-procs")


def read_mcast(path, times, notes, ranks, impl="mcast"):
    try:
        with open(path) as f:
            for r in csv.DictReader(f):
                mode = r.get("mode") or "eager"
                times[(r["op"], int(r["size"]))][(impl, mode)] = float(r["time_us"])
                if (r.get("wrong") or "0") not in ("0", "N/A"):
                    notes.append(f"{path}: {r['op']} {r['size']} B ({mode}) had {r['wrong']} wrong elements")
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


def arguments(ap):
    """The inputs compare.py and plot.py share."""
    ap.add_argument("--dir", help="bench/run.sh's output directory (every input below found there)")
    ap.add_argument("--mcast", action="append", default=[])
    ap.add_argument("--mcast-procs", action="append", default=[])
    ap.add_argument("--peers", action="append", default=[])
    ap.add_argument("--nccl-tests", action="append", default=[])
    ap.add_argument("--roofline")
    ap.add_argument("--first-use", help="run.sh's first_use.txt")
    ap.add_argument("--nranks", type=int, help="ranks (default: --dir's nranks.txt, else mcast-bench's CSV, else 2)")


def load(args):
    """(times, n, notes, (ce, push, pull), first use in s): times[(op, bytes)][(impl, mode)] = us."""
    notes = []
    times = defaultdict(dict)  # (op, bytes) -> (impl, mode) -> us
    ranks = set()
    d = args.dir
    if d:
        if not os.path.isdir(d):
            notes.append(f"--dir {d} is not a directory")
        found = lambda pat: sorted(glob.glob(os.path.join(d, pat)))  # noqa: E731
        args.mcast += found("mcast_*_*.csv")
        args.mcast_procs += found("mcast-procs_*_*.csv")
        args.peers += found("peers*.csv")
        args.nccl_tests += found("nccl_*_*.txt")
        for name, attr in (("roofline.txt", "roofline"), ("first_use.txt", "first_use")):
            if getattr(args, attr) is None and os.path.isfile(os.path.join(d, name)):
                setattr(args, attr, os.path.join(d, name))
        if args.nranks is None and os.path.isfile(os.path.join(d, "nranks.txt")):
            try:
                args.nranks = int(open(os.path.join(d, "nranks.txt")).read().split()[0])
            except (ValueError, IndexError):
                notes.append(f"{d}/nranks.txt unreadable")
    for p in args.mcast:
        read_mcast(p, times, notes, ranks)
    for p in args.mcast_procs:
        read_mcast(p, times, notes, ranks, "mcast-procs")
    for p in args.peers:
        read_peers(p, times, notes)
    if not args.peers:
        notes.append("no PyTorch/NCCL peers CSV (bench/peers.py did not run)")
    for p in args.nccl_tests:
        read_nccl_tests(p, times, notes)
    if not args.nccl_tests:
        notes.append("no nccl-tests output (NCCL_TESTS_DIR or NCCL_TESTS_SRC for bench/run.sh)")
    roof = read_roofline(args.roofline, notes) if args.roofline else (None, None, None)
    if not args.roofline:
        notes.append("no roofline measured (no nvcc?); the roofline targets are not judged")
    n = args.nranks or (next(iter(ranks)) if len(ranks) == 1 else 2)
    if args.nranks is None and len(ranks) > 1:
        notes.append(f"mcast-bench CSVs disagree on the rank count ({sorted(ranks)}); busbw assumes 2")
    elif args.nranks is not None and ranks and ranks != {n}:
        notes.append(f"mcast-bench CSVs have {sorted(ranks)} ranks, the tables assume {n}")
    first = None
    if args.first_use:
        try:
            m = re.search(r"([\d.]+) s", open(args.first_use).read())
            first = float(m.group(1)) if m else None
        except OSError:
            pass
    return times, n, notes, roof, first


def busbw(op, n, size, us):
    """GB/s of bus bandwidth (nccl-tests' definition) of `size` bytes in `us` on n ranks."""
    return size / us / 1e3 * FACTOR[op](n) if us else None


def best(t, mode=None, impls=None):
    """(impl, mode, us) of the fastest peer (not mcast) in `t`, in `mode` (None: any)."""
    c = [(i, m, v) for (i, m), v in t.items()
         if i not in MCAST and (mode is None or m == mode) and (impls is None or i in impls)]
    return min(c, key=lambda x: x[2]) if c else None


def table(op, times, n):
    """The markdown lines of op's table."""
    keys = sorted(k for k in times if k[0] == op)
    if not keys:
        return []
    impls = sorted({i for k in keys for (i, _) in times[k]} - set(MCAST))
    mine = [(i, m) for i in MCAST for m in MODES if any((i, m) in times[k] for k in keys)]
    head = ["size"] + [f"{i} {m}" for i, m in mine] + [f"{i} (best mode)" for i in impls]
    head += ["best peer eager / mcast eager", "best peer / mcast best", "mcast busbw (best)", "best peer busbw"]
    red = ", sum" if op in ("all_reduce", "reduce_scatter") else ""
    out = [f"\n### {op} (bf16{red}), {n} ranks, us per call\n", "| " + " | ".join(head) + " |",
           "|" + "---|" * len(head)]
    for k in keys:
        t = times[k]
        row = [human(k[1])] + [fmt(t.get(c)) for c in mine]
        for i in impls:
            b = best(t, impls=(i,))
            row.append(f"{b[2]:.1f} {b[1][0]}" if b else "-")
        me_eager = min((v for (i, m), v in t.items() if i in MCAST and m == "eager"), default=None)
        me_best = min((v for (i, m), v in t.items() if i in MCAST), default=None)
        pe, pb = best(t, "eager"), best(t)
        row.append(f"{pe[2] / me_eager:.2f}x" if pe and me_eager else "-")
        row.append(f"{pb[2] / me_best:.2f}x" if pb and me_best else "-")
        row += [fmt(busbw(op, n, k[1], me_best)), fmt(busbw(op, n, k[1], pb[2]) if pb else None)]
        out.append("| " + " | ".join(row) + " |")
    return out


def main():
    ap = argparse.ArgumentParser()
    arguments(ap)
    ap.add_argument("--md")
    args = ap.parse_args()
    times, n, notes, (ce, push, pull), first = load(args)
    out = []
    if ce is not None:
        out.append(f"Peak peer copy in this run (bench/p2p_roofline.cu, GPUs 0 and 1, GB/s per direction, both "
                   f"directions busy): copy engine {ce:.1f}; SM push {fmt(push)}; SM pull {fmt(pull)}. "
                   f"95% of the copy-engine rate: {0.95 * ce:.1f} GB/s.\n")
    for op in OPS:
        out += table(op, times, n)
    out.append(f"\n### Targets ({n} ranks, P2P, bf16)\n")
    out += ["| target | status | figure |", "|---|---|---|"]
    for name, status, figure in (targets(times, n, ce) if n == 2 else targets_n(times, n)):
        out.append(f"| {name} | {status} | {figure} |")
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


def targets_n(times, n):
    """(target, met/missed/not measured, figure) for issue 39's targets (N ranks, graph mode)."""
    res = []

    def mc(op, size, mode="graph"):
        return times.get((op, size), {}).get(("mcast", mode))

    def sizes(op, lo, hi):
        return sorted(s for (o, s) in times if o == op and lo <= s <= hi)

    v = mc("all_reduce", 8 * KIB)
    res.append(("all-reduce 8K <= 4.0 us (graph)", "not measured" if v is None else ("met" if v <= 4.0 else "missed"),
                "-" if v is None else f"{v:.2f} us"))
    for op in (o for o in OPS if any(k[0] == o for k in times)):
        for mode, lo, hi, ratio in (("graph", 0, 1 << 40, 1.0), ("eager", 0, 1 << 40, 1.0)) + (
                (("graph", 8 * KIB, MIB, 1.2),) if op == "all_reduce" else ()):
            losses, seen = [], 0
            for s in sizes(op, lo, hi):
                t = times[(op, s)]
                mine = mc(op, s, mode)
                b = best(t) if mode == "graph" else best(t, "eager")
                if mine is None or b is None:
                    continue
                seen += 1
                if b[2] / mine < ratio:
                    losses.append(f"{human(s)} ({b[0]} {b[1]} {b[2]:.1f} vs {mine:.1f}: {b[2] / mine:.2f}x)")
            peer = "the best peer in any mode" if mode == "graph" else "the best peer's eager rows"
            name = f"{op} {mode}: >= {ratio}x {peer}" + (f", {human(lo)}-{human(hi)}" if hi < 1 << 40 else ", every size")
            res.append((name, "not measured" if not seen else ("met" if not losses else "missed"),
                        f"{seen} sizes" + (f"; short at {', '.join(losses[:6])}" + (" ..." if len(losses) > 6 else "")
                                           if losses else "")))
        s = 1 << 30
        v = mc(op, s)
        bw = busbw(op, n, s, v)
        res.append((f"{op} 1G busbw >= 360 GB/s (graph)", "not measured" if bw is None else ("met" if bw >= 360 else "missed"),
                    "-" if bw is None else f"{bw:.1f} GB/s"))
    return res


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
