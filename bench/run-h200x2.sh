#!/usr/bin/env bash
# The same-run comparison on nvidia-h200-x2 (two H200s), P2P path only: mcast-bench, then NCCL
# and PyTorch symmetric memory through torch.distributed, then one table with the ratios.
# Usage (on the GPU machine, from the repository root, with the built binary in $BIN):
#   BIN=path/to/mcast-bench bench/run-h200x2.sh OUTDIR
# Multicast stays off: never create a multicast object on a shared machine.
set -euo pipefail
export MCAST_MULTICAST=off NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out="${1:-bench-out}"
mkdir -p "$out"
bin="${BIN:-target/release/mcast-bench}"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$out/gpus.txt"
nvidia-smi topo -m | tee "$out/topo.txt" || true
for op in all_reduce all_gather broadcast; do
  "$bin" --backend cuda --devices 0,1 --op "$op" --dtype bf16 -b 8K -e 1G -f 2 --csv "$out/mcast_$op.csv" \
    2>"$out/mcast_$op.err" | tee "$out/mcast_$op.txt"
done
PYTHONUNBUFFERED=1 torchrun --nproc_per_node=2 bench/peers.py --out "$out/peers.csv" 2>"$out/peers.err"
python3 bench/compare.py $(for op in all_reduce all_gather broadcast; do echo --mcast "$out/mcast_$op.csv"; done) \
  --peers "$out/peers.csv" --md "$out/table.md"
