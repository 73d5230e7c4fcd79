"""The peers mcast-bench is compared with, each at its best: eager calls and CUDA-graph replay.

Run with torchrun, one process per GPU:
    torchrun --nproc_per_node=2 bench/peers.py --out peers.csv [--modes eager,graph]

For each message size (bytes; bf16 elements; all_gather and reduce_scatter sizes are the TOTAL
over ranks, as nccl-tests and mcast-bench count them):
  - NCCL through torch.distributed: all_reduce, all_gather_into_tensor, reduce_scatter_tensor,
    broadcast (impl "nccl");
  - PyTorch symmetric memory: one_shot_all_reduce and two_shot_all_reduce_ (impls
    "torch_one_shot", "torch_two_shot"), and, where this PyTorch has it, reduce_scatter_out
    ("torch_symm"). The copy-engine all-gather (_low_contention_all_gather) is not timed: it
    runs on side streams that events on the calling stream do not cover (1 GiB "took" 107 us on
    2 x H200) and its graph capture fails ("capturing stream has unjoined work").
Modes: "eager" times a loop of calls; "graph" captures --iters calls in a torch.cuda.CUDAGraph
(as nccl-tests -G and mcast-bench -G do) and replays it --replays times. Time per call = CUDA
events around the loop (or the replays) / calls, the median of --repeats repeats, the max over
ranks. A peer or op this PyTorch lacks, or that fails, prints a note and is skipped; the rest runs.

Multicast stays off: the kill switches (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1) are honoured and re-asserted here, and no multimem op is called.
"""

import argparse
import csv
import os
import statistics
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def sizes(lo, hi):
    s = lo
    while s <= hi:
        yield s
        s *= 2


def note(rank, msg):
    if rank == 0:
        print(f"peers: note: {msg}", file=sys.stderr, flush=True)


def everyone_ok(ok):
    """True when every rank's `ok` is true (so all ranks skip a failing peer together)."""
    t = torch.tensor([1 if ok else 0], device="cuda", dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def max_over_ranks(x):
    t = torch.tensor([x], device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def time_eager(fn, iters, warmup, repeats):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    results = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        results.append(start.elapsed_time(end) * 1000.0 / iters)
    return statistics.median(results)


def time_graph(fn, iters, warmup, repeats, replays):
    """`iters` calls captured in one CUDA graph (after eager warm-up on a side stream, as PyTorch
    requires), one untimed replay, then `replays` replays per repeat."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 1)):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    results = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        torch.cuda.synchronize()
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        results.append(start.elapsed_time(end) * 1000.0 / (iters * replays))
    del graph
    return statistics.median(results)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-bytes", type=int, default=8 << 10)
    ap.add_argument("--max-bytes", type=int, default=1 << 30)
    ap.add_argument("--out", default="peers.csv")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default="eager,graph")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--replays", type=int, default=10, help="graph replays per repeat (graph mode)")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    ops = [o for o in args.ops.split(",") if o]
    for m in modes:
        if m not in ("eager", "graph"):
            ap.error(f"--modes: unknown mode {m!r}")
    for o in ops:
        if o not in OPS:
            ap.error(f"--ops: unknown op {o!r}")

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    group_name = dist.group.WORLD.group_name
    rows = []

    symm = None
    try:
        import torch.distributed._symmetric_memory as symm_mem

        try:
            symm_mem.enable_symm_mem_for_group(group_name)
        except Exception:
            pass  # newer PyTorch needs no opt-in
        symm = symm_mem
    except Exception as e:  # depends on the torch build
        note(rank, f"symmetric memory unavailable ({e}); only NCCL runs")

    elems = args.max_bytes // 2
    symm_in = symm_out = None
    if symm is not None:
        try:
            symm_in = symm.empty(elems, dtype=torch.bfloat16, device="cuda")
            symm.rendezvous(symm_in, group_name)
        except Exception as e:
            note(rank, f"symmetric memory rendezvous failed ({type(e).__name__}: {e}); only NCCL runs")
            symm_in = None
    if not everyone_ok(symm_in is not None):
        symm_in = None
    sym_ops = torch.ops.symm_mem if symm_in is not None and hasattr(torch.ops, "symm_mem") else None

    big = torch.empty(elems, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(elems, dtype=torch.bfloat16, device="cuda")
    dead = set()  # (impl, op, mode) that failed once: skipped afterwards

    def peers_for(op, n, x):
        """(impl, fn) pairs for `op` on n elements in total (x: the input, n elements)."""
        per = n // world
        if op == "all_reduce":
            yield "nccl", lambda: dist.all_reduce(x)
            if sym_ops is not None:
                s = symm_in[:n]
                yield "torch_one_shot", lambda: sym_ops.one_shot_all_reduce(s, "sum", group_name)
                yield "torch_two_shot", lambda: sym_ops.two_shot_all_reduce_(s, "sum", group_name)
        elif op == "all_gather" and per > 0:
            yield "nccl", lambda: dist.all_gather_into_tensor(out[: per * world], x[:per])
        elif op == "reduce_scatter" and per > 0:
            yield "nccl", lambda: dist.reduce_scatter_tensor(out[:per], x[: per * world])
            if sym_ops is not None and hasattr(sym_ops, "reduce_scatter_out"):
                s, o = symm_in[: per * world], out[:per]
                yield "torch_symm", lambda: sym_ops.reduce_scatter_out(s, group_name, False, o)
        elif op == "broadcast":
            yield "nccl", lambda: dist.broadcast(x, src=0)

    for nbytes in sizes(args.min_bytes, args.max_bytes):
        n = nbytes // 2
        iters = 100 if nbytes <= (4 << 20) else (20 if nbytes <= (64 << 20) else 5)
        warmup = 10 if nbytes <= (64 << 20) else 2
        x = big[:n]
        data = torch.randint(-8, 8, (n,), device="cuda", dtype=torch.int32).to(torch.bfloat16)
        for op in ops:
            total = (n // world) * world if op in ("all_gather", "reduce_scatter") else n
            for impl, fn in list(peers_for(op, n, x)):
                if impl.startswith("torch_"):
                    symm_in[:n].copy_(data)
                x.copy_(data)
                for mode in modes:
                    if (impl, op, mode) in dead:
                        continue
                    t, ok, why = 0.0, True, ""
                    try:
                        if mode == "eager":
                            t = time_eager(fn, iters, warmup, args.repeats)
                        else:
                            t = time_graph(fn, iters, warmup, args.repeats, args.replays)
                    except Exception as e:
                        ok, why = False, f"{type(e).__name__}: {str(e)[:160]}"
                        torch.cuda.synchronize()
                    if not everyone_ok(ok):
                        dead.add((impl, op, mode))
                        note(rank, f"{impl} {op} ({mode}) at {nbytes} B failed and is skipped from now on: "
                                   f"{why or 'on another rank'}")
                        continue
                    rows.append((impl, op, total * 2, max_over_ranks(t), mode))
        note(rank, f"{nbytes} B done")

    if rank == 0:
        with open(args.out, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["impl", "op", "bytes", "time_us", "mode"])
            w.writerows(rows)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
