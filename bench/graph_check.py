"""CUDA graphs of torch.distributed collectives beside symmetric memory, checked, as a PyTorch
inference server runs them (every decode step captured, replayed without end).

Run with torchrun, one process per GPU, on the real NCCL or on mcast's (LD_PRELOAD of
libmcast_nccl.so with MCAST_NCCL_FALLBACK set):
    torchrun --nproc_per_node=4 bench/graph_check.py [--replays 1000]

For each size, one graph is captured with torch.cuda.graph (its default capture_error_mode,
"global", in which a capture-unsafe CUDA call of any thread of the process, such as a process
group's watchdog, invalidates the capture) holding: dist.all_reduce (sum), dist.all_reduce
(max), dist.all_gather_into_tensor, dist.reduce_scatter_tensor and dist.broadcast, and, where
this PyTorch has symmetric memory, one_shot_all_reduce beside them. Before each replay the
inputs are rewritten from the replay's number; after it every output is compared on the device
with its exact expected value (small integers in float32), the mismatches summed without a host
sync; one sync at the end. Prints one line per size and exits non-zero on any wrong element or
error. Multicast stays off (the kill switches are honoured and re-asserted).
"""

import argparse
import os
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replays", type=int, default=1000)
    ap.add_argument("--sizes", default="8192,1048576,16777216", help="bytes per rank's all-reduce input")
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    group = dist.group.WORLD.group_name
    sym_ops = None
    try:
        import torch.distributed._symmetric_memory as symm

        try:
            symm.enable_symm_mem_for_group(group)
        except Exception:
            pass
        probe = symm.empty(1024, dtype=torch.float32, device="cuda")
        symm.rendezvous(probe, group)
        sym_ops = torch.ops.symm_mem
    except Exception as e:
        if rank == 0:
            print(f"graph_check: symmetric memory unavailable ({type(e).__name__}: {e})", flush=True)
    failed = False
    for nbytes in (int(s) for s in args.sizes.split(",")):
        n = max(world, nbytes // 4) // world * world
        f32 = dict(dtype=torch.float32, device="cuda")
        a, b, c = torch.empty(n, **f32), torch.empty(n, **f32), torch.empty(n // world, **f32)
        gathered, rs_in, rs_out, bc = torch.empty(n, **f32), torch.empty(n, **f32), torch.empty(n // world, **f32), torch.empty(n, **f32)
        s = symm.empty(n, **f32) if sym_ops is not None else None
        if s is not None:
            symm.rendezvous(s, group)
        idx = torch.arange(n, **f32)
        cnt = torch.zeros((), dtype=torch.int64, device="cuda")
        step = torch.zeros((), **f32)

        def fill():
            # Inputs from the replay number `step` (a device scalar): no host sync per replay.
            v = (idx % 7) + step
            a.copy_(v * (rank + 1))
            b.copy_(v + rank)
            c.copy_(idx[: n // world] % 5 + rank + step)
            rs_in.copy_(v + rank)
            bc.copy_(v * 3 if rank == 0 else torch.full_like(v, -1.0))
            if s is not None:
                s.copy_(v * (rank + 1))

        def collectives():
            dist.all_reduce(a)
            dist.all_reduce(b, op=dist.ReduceOp.MAX)
            dist.all_gather_into_tensor(gathered, c)
            dist.reduce_scatter_tensor(rs_out, rs_in)
            dist.broadcast(bc, src=0)
            return sym_ops.one_shot_all_reduce(s, "sum", group) if s is not None else None

        def check(sym_out):
            v = (idx % 7) + step
            tri = world * (world + 1) / 2
            bad = (a != v * tri).sum() + (b != v + (world - 1)).sum() + (bc != v * 3).sum()
            per = n // world
            for q in range(world):
                bad += (gathered[q * per:(q + 1) * per] != idx[:per] % 5 + q + step).sum()
            rs_v = v[rank * per:(rank + 1) * per]
            bad += (rs_out != rs_v * world + (world - 1) * world / 2).sum()
            if sym_out is not None:
                bad += (sym_out != v * tri).sum()
            cnt.add_(bad)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fill()
                check(collectives())
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        cnt.zero_()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                sym_out = collectives()
            for i in range(args.replays):
                step.fill_(float(i % 11))
                fill()
                graph.replay()
                check(sym_out)
            torch.cuda.synchronize()
            wrong, err = int(cnt.item()), ""
        except Exception as e:
            wrong, err = -1, f"{type(e).__name__}: {str(e)[:300]}"
        t = torch.tensor([1 if wrong == 0 else 0], dtype=torch.int32, device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        ok = bool(t.item())
        failed |= not ok
        print(f"graph_check: rank {rank} of {world}: {nbytes} B per input, {args.replays} replays, "
              f"symmetric memory {'on' if s is not None else 'off'}: "
              f"{'0 wrong' if wrong == 0 else (err or f'{wrong} wrong')}{'' if ok else ' (FAILED on some rank)'}",
              flush=True)
        del graph
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
