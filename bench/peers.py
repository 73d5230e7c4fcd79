"""The peers mcast-bench is compared with, measured the way mcast-bench measures itself.

Run with torchrun, one process per GPU:
    torchrun --nproc_per_node=2 bench/peers.py --out peers.csv

For each message size (bytes, bf16 elements): NCCL through torch.distributed (all_reduce,
all_gather_into_tensor, broadcast) and PyTorch symmetric memory (one_shot_all_reduce,
two_shot_all_reduce_). Timing: warm-up, then CUDA events around a loop of iterations on the
current stream, time per iteration = elapsed / iters, the median of several repeats, the max
over ranks. Multicast stays off: the machine's kill switches (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1) are honoured and re-asserted here.
"""

import argparse
import csv
import os
import statistics
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def sizes(lo, hi):
    s = lo
    while s <= hi:
        yield s
        s *= 2


def time_op(fn, iters, warmup, repeats):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    results = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        dist.barrier()
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        results.append(start.elapsed_time(end) * 1000.0 / iters)
    t = torch.tensor([statistics.median(results)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--min", type=int, default=8 << 10)
    ap.add_argument("--max", type=int, default=1 << 30)
    ap.add_argument("--out", default="peers.csv")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

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
            pass
        symm = symm_mem
    except Exception as e:  # pragma: no cover - depends on the torch build
        print(f"symmetric memory unavailable: {e}", file=sys.stderr)

    symm_buf = None
    if symm is not None:
        try:
            symm_buf = symm.empty(args.max // 2, dtype=torch.bfloat16, device="cuda")
            symm.rendezvous(symm_buf, group_name)
        except Exception as e:
            print(f"symmetric memory rendezvous failed: {e}", file=sys.stderr)
            symm_buf = None

    big = torch.empty(args.max // 2, dtype=torch.bfloat16, device="cuda")
    gathered = torch.empty(args.max // 2 * world, dtype=torch.bfloat16, device="cuda")
    for nbytes in sizes(args.min, args.max):
        n = nbytes // 2
        iters = 100 if nbytes <= (4 << 20) else (20 if nbytes <= (64 << 20) else 5)
        warmup = 10 if nbytes <= (64 << 20) else 2
        x = big[:n]
        x.copy_(torch.randint(-8, 8, (n,), device="cuda", dtype=torch.int32).to(torch.bfloat16))
        t = time_op(lambda: dist.all_reduce(x), iters, warmup, args.repeats)
        rows.append(("nccl", "all_reduce", nbytes, t))
        # all_gather: nbytes is the total (nccl-tests convention), each rank sends nbytes / world.
        per = n // world
        if per > 0:
            t = time_op(lambda: dist.all_gather_into_tensor(gathered[: per * world], x[:per]), iters, warmup, args.repeats)
            rows.append(("nccl", "all_gather", per * world * 2, t))
        t = time_op(lambda: dist.broadcast(x, src=0), iters, warmup, args.repeats)
        rows.append(("nccl", "broadcast", nbytes, t))
        if symm_buf is not None:
            s = symm_buf[:n]
            s.copy_(x)
            for name, fn in (
                ("torch_one_shot", lambda: torch.ops.symm_mem.one_shot_all_reduce(s, "sum", group_name)),
                ("torch_two_shot", lambda: torch.ops.symm_mem.two_shot_all_reduce_(s, "sum", group_name)),
            ):
                try:
                    t = time_op(fn, iters, warmup, args.repeats)
                    rows.append((name, "all_reduce", nbytes, t))
                except Exception as e:
                    if rank == 0:
                        print(f"{name} at {nbytes} B: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
        if rank == 0:
            print(f"peers: {nbytes} B done", file=sys.stderr, flush=True)

    if rank == 0:
        with open(args.out, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["impl", "op", "bytes", "time_us"])
            w.writerows(rows)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
