#!/usr/bin/env bash
# Two NVLink domains on one two-GPU host, with the real NCCL on the rails (multicast off):
# ranks 0-1 on GPU 0 (MCAST_DOMAIN=A), ranks 2-3 on GPU 1 (B); rails {0,2} and {1,3} join distinct
# GPUs, so NCCL accepts them; NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 put the rails on NCCL's
# network path (sockets on lo), as between hosts.
#   1. mcast-bench --procs 4 (and the two-process variant, one rank per domain): every op, the
#      three memory forms, eager and from CUDA graphs, checked against a host reference;
#   2. flat NCCL (bench/peers.py, 2 processes) on the same network path, the same run;
#   3. PyTorch on libmcast_nccl with MCAST_NCCL_HIER=on (bench/torch_hier.py, 4 processes).
# Usage (on the GPU machine, from the repository root): bench/run-two-domains.sh PREFIX OUT
set -uo pipefail
export MCAST_MULTICAST=off NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
prefix="$(cd "$1" && pwd)"
out="$2"
mkdir -p "$out"
bin="$prefix/bin/mcast-bench"
nccl="$("$(dirname "$0")/../scripts/find-nccl")"
echo "NCCL: $nccl" | tee "$out/nccl.txt"
export MCAST_NET_NCCL="$nccl" NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo MCAST_SOCKET_IFNAME=lo
if [ -z "${MCAST_NVRTC_PATH:-}" ]; then
  MCAST_NVRTC_PATH="$(ls /usr/local/cuda/lib64/libnvrtc.so.* 2>/dev/null | sort | head -n 1)"
  export MCAST_NVRTC_PATH
fi
sizes=(-b "${MIN:-8K}" -e "${MAX:-16M}" -f 4 -n "${ITERS:-5}" -w 2)
fails=0
run() { # name args...
  local name="$1"
  shift
  timeout 120 "$bin" --backend cuda "$@" -q >"$out/$name.txt" 2>&1
  local rc=$?
  echo "$name: exit $rc, $(grep -c '^ *[0-9]' "$out/$name.txt") rows, $(grep '# wrong elements' "$out/$name.txt")"
  [ "$rc" = 0 ] || { fails=$((fails + 1)); tail -n 5 "$out/$name.txt"; }
}
for op in all_reduce reduce_scatter all_gather broadcast; do
  for mem in buffer registered pointer; do
    for g in 0 5; do
      run "h4_${op}_${mem}_G$g" --procs 4 --visible 0,0,1,1 --domains A,A,B,B --net nccl --op "$op" -d bf16 \
        --memory "$mem" -G "$g" "${sizes[@]}"
    done
  done
  run "h2_${op}_G5" --procs 2 --visible 0,1 --domains A,B --net nccl --op "$op" -d bf16 -G 5 "${sizes[@]}"
done
run "h4_all_reduce_f32_max_G5" --procs 4 --visible 0,0,1,1 --domains A,A,B,B --net nccl --op all_reduce -d f32 \
  -o max -G 5 "${sizes[@]}"
# The pipelined all-reduce (from 32 MiB through the rails): this build against BEFORE (an
# unpipelined build's mcast-bench), alternating, from graphs; and its results checked eager
# around the threshold, bf16 max.
run "h4_all_reduce_bf16_max_pipelined" --procs 4 --visible 0,0,1,1 --domains A,A,B,B --net nccl --op all_reduce \
  -d bf16 -o max -b 4M -e 256M -f 2 -n 3 -w 1
if [ -n "${BEFORE:-}" ]; then
  for round in 1 2; do
    for which in before after; do
      b="$bin"
      [ "$which" = before ] && b="$BEFORE"
      timeout 120 "$b" --backend cuda --procs 4 --visible 0,0,1,1 --domains A,A,B,B --net nccl --op all_reduce \
        -d f32 -b 4M -e 256M -f 4 -n 5 -w 2 -G 5 -q >"$out/pipe_${which}_$round.txt" 2>&1
      echo "pipe_${which}_$round: exit $?"
    done
  done
  echo "== all-reduce busbw GB/s: bytes | before 1 | after 1 | before 2 | after 2"
  paste <(awk '/^ +[0-9]/{print $1}' "$out/pipe_before_1.txt") \
    <(awk '/^ +[0-9]/{print $8}' "$out/pipe_before_1.txt") <(awk '/^ +[0-9]/{print $8}' "$out/pipe_after_1.txt") \
    <(awk '/^ +[0-9]/{print $8}' "$out/pipe_before_2.txt") <(awk '/^ +[0-9]/{print $8}' "$out/pipe_after_2.txt")
fi
if python3 -c 'import torch' 2>/dev/null; then
  timeout 200 python3 -m torch.distributed.run --nproc_per_node=2 bench/peers.py --out "$out/nccl_flat.csv" \
    --modes graph --max-bytes 16777216 >"$out/nccl_flat.txt" 2>&1 || { echo "flat NCCL (peers.py) failed"; tail -n 5 "$out/nccl_flat.txt"; }
  LD_PRELOAD="$prefix/lib/libmcast_nccl.so" MCAST_NCCL_FALLBACK="$nccl" MCAST_NCCL_HIER=on \
    timeout 200 python3 -m torch.distributed.run --nproc_per_node=4 bench/torch_hier.py >"$out/torch_hier.txt" 2>&1
  rc=$?
  echo "torch_hier: exit $rc"; grep -E "all right|WRONG|Error|error" "$out/torch_hier.txt" | head -n 8
  [ "$rc" = 0 ] || fails=$((fails + 1))
fi
echo "run-two-domains: $fails failed"
