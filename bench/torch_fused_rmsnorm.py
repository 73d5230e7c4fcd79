# The PyTorch side of the fused all-reduce + residual + RMSNorm comparison (examples/fused_rmsnorm
# --bench): NCCL all-reduce of x, h = x + residual, torch.nn.functional.rms_norm(h) with a weight,
# bf16, hidden 4096, the same message sizes (8 KiB to 32 MiB of x), each step replayed from a
# CUDA graph (PyTorch's best mode), timed with CUDA events. Checks the result against a float
# reference built from the same inputs first.
#   torchrun --nproc_per_node=2 bench/torch_fused_rmsnorm.py [replays]
# Multicast stays off where the machine sets the kill switches (NCCL_NVLS_ENABLE=0).
import os, sys, torch, torch.distributed as dist
import torch.nn.functional as F

HIDDEN, EPS, PER_GRAPH = 4096, 1e-6, 10
replays = int(sys.argv[1]) if len(sys.argv) > 1 else 200
dist.init_process_group("nccl")
r, n = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", r)))
dev = torch.device("cuda")
w = torch.tensor([0.5 + (i % 5) / 4.0 for i in range(HIDDEN)], device=dev).to(torch.bfloat16)
rows = []
size = 8 << 10
while size <= 32 << 20:
    tokens = max(size // (HIDDEN * 2), 1)
    e = torch.arange(tokens * HIDDEN, device=dev, dtype=torch.int64)
    def part(rank):
        return ((((e * 2654435761 + rank * 40503) % (1 << 32)) % 17) - 8).float().div(8).view(tokens, HIDDEN)
    x0 = part(r).to(torch.bfloat16)
    res = (((e * 11) % 13) - 6).float().div(4).view(tokens, HIDDEN).to(torch.bfloat16)
    x = x0.clone()
    def step():
        dist.all_reduce(x)
        h = x + res
        return F.rms_norm(h, (HIDDEN,), w, EPS)
    out = step()
    total = sum(part(k) for k in range(n)).to(torch.bfloat16)
    ref = F.rms_norm((total.float() + res.float()).to(torch.bfloat16).float(), (HIDDEN,), w.float(), EPS)
    err = (out.float() - ref).abs().max().item()
    # Graph: PER_GRAPH steps (x is restored by the copy so values stay bounded).
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            x.copy_(x0); step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(PER_GRAPH):
            x.copy_(x0); step()
    # The copy alone, to subtract.
    gc = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gc):
        for _ in range(PER_GRAPH):
            x.copy_(x0)
    def timed(graph):
        graph.replay(); torch.cuda.synchronize(); dist.barrier()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(replays // PER_GRAPH + 1):
            graph.replay()
        b.record(); torch.cuda.synchronize()
        return a.elapsed_time(b) * 1e3 / ((replays // PER_GRAPH + 1) * PER_GRAPH)
    t_all, t_copy = timed(g), timed(gc)
    rows.append((tokens * HIDDEN * 2, tokens, t_all - t_copy, t_all, err))
    del g, gc
    size *= 4
if r == 0:
    print(f"torch {torch.__version__} nccl {'.'.join(map(str, torch.cuda.nccl.version()))} ranks {n}")
    print("| bytes | tokens | torch graph us (all-reduce + add + rms_norm) | incl. input copy us | max abs err |")
    print("|---|---|---|---|---|")
    for b, t, us, us_copy, err in rows:
        print(f"| {b} | {t} | {us:.1f} | {us_copy:.1f} | {err:.3g} |")
dist.destroy_process_group()
