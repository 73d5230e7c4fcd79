# PyTorch on libmcast_nccl with a communicator that spans two NVLink domains, served
# hierarchically (MCAST_NCCL_HIER=on: mcast inside each domain, the fallback NCCL on the rails).
# One host pretends two domains: the first half of the ranks is domain A, the second half B, and
# the ranks of a domain share a GPU when there are more ranks than GPUs (rails then join distinct
# GPUs, which the real NCCL accepts). Every collective is checked against values every rank can
# compute, eager and replayed from a CUDA graph:
#   LD_PRELOAD=PREFIX/lib/libmcast_nccl.so MCAST_NCCL_FALLBACK=<libnccl.so.2> MCAST_NCCL_HIER=on \
#     torchrun --nproc_per_node=4 bench/torch_hier.py
# Multicast stays off (the kill switches are honoured and re-asserted).
import os, sys
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("MCAST_MULTICAST", "off")
local, world = int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
os.environ["MCAST_DOMAIN"] = "A" if local < world // 2 else "B"
import torch, torch.distributed as dist

ngpu = torch.cuda.device_count()
torch.cuda.set_device(local * ngpu // world)
dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
r, n = dist.get_rank(), dist.get_world_size()
dev = torch.device("cuda")

def data(rank, numel):
    # small integers: exact in bf16 sums of a few ranks
    return ((torch.arange(numel, device=dev) * 7 + rank * 13) % 9 - 4).to(torch.bfloat16)

failures = 0
def check(name, got, want):
    global failures
    ok = torch.equal(got.float(), want.float())
    if not ok:
        failures += 1
        print(f"rank {r}: {name}: WRONG (max diff {(got.float() - want.float()).abs().max().item()})", flush=True)
    return ok

def run_all(numel, tag):
    x = data(r, numel)
    a = x.clone(); dist.all_reduce(a)
    ag = torch.empty(numel * n, device=dev, dtype=x.dtype); dist.all_gather_into_tensor(ag, x)
    rs = torch.empty(numel // n, device=dev, dtype=x.dtype); dist.reduce_scatter_tensor(rs, x)
    b = x.clone(); dist.broadcast(b, src=n - 1)
    return (a, ag, rs, b)

def want(numel):
    total = sum(data(k, numel).float() for k in range(n))
    ag = torch.cat([data(k, numel) for k in range(n)])
    return (total, ag, total[r * (numel // n):(r + 1) * (numel // n)], data(n - 1, numel))

names = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
for numel in (1024 * n, (1 << 20) * n, (8 << 20) * n):
    got = run_all(numel, "eager")
    torch.cuda.synchronize()
    for nm, g, w in zip(names, got, want(numel)):
        check(f"eager {nm} {numel}", g, w)
    # CUDA graph: capture the four calls, replay twice.
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run_all(numel, "warm")
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = run_all(numel, "graph")
    for _ in range(2):
        g.replay()
    torch.cuda.synchronize()
    for nm, o, w in zip(names, out, want(numel)):
        check(f"graph {nm} {numel}", o, w)
    del g
dist.barrier()
print(f"rank {r} (domain {os.environ['MCAST_DOMAIN']}, GPU {torch.cuda.current_device()}): "
      f"{'all right' if failures == 0 else f'{failures} WRONG'}", flush=True)
dist.destroy_process_group()
sys.exit(1 if failures else 0)
