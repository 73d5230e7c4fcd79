# PyTorch collectives through whichever libnccl the process loaded, for issue 17: run it plainly and
# with LD_PRELOAD=PREFIX/lib/libmcast_nccl.so (MCAST_NCCL_FALLBACK=<the wheel's libnccl.so.2>) under
# torchrun --nproc_per_node=2, then compare: it prints a checksum of each result and the time per call.
# Multicast stays off where the machine sets the kill switches (NCCL_NVLS_ENABLE=0, MCAST_MULTICAST=off).
import os, time, torch, torch.distributed as dist
dist.init_process_group("nccl")
r, n = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(r)
g = torch.Generator(device="cuda").manual_seed(1234 + r)
out = []
for numel in (4096, 1 << 20, 16 << 20):
    x = torch.randint(-8, 8, (numel,), device="cuda", generator=g).to(torch.bfloat16)
    a = x.clone(); dist.all_reduce(a)
    ag = torch.empty(numel * n, device="cuda", dtype=x.dtype); dist.all_gather_into_tensor(ag, x)
    rs = torch.empty(numel // n, device="cuda", dtype=x.dtype); dist.reduce_scatter_tensor(rs, x)
    b = x.clone(); dist.broadcast(b, src=0)
    torch.cuda.synchronize()
    sums = [float(t.float().sum()) for t in (a, ag, rs, b)]
    t0 = time.perf_counter()
    for _ in range(20): dist.all_reduce(a)
    torch.cuda.synchronize()
    out.append((numel, sums, (time.perf_counter() - t0) / 20 * 1e6))
for numel, sums, us in out:
    print(f"rank {r} numel {numel} sums {sums} all_reduce {us:.1f} us", flush=True)
dist.destroy_process_group()
