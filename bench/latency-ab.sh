#!/usr/bin/env bash
# Small-message latency of two mcast-bench builds, alternating on one warm machine (A B A B), to
# see whether a change moves it by more than the run-to-run noise (A against A). From CUDA graphs,
# bf16, 8 B to 64 KiB, the routes the kernels take for small messages: the one-shot/barrier
# all-reduce, the LL kernels, the barrier all-gather, the pointer form's push all-reduce (all but
# the LL case with MCAST_LL=off, since LL is the default where it serves).
#   bench/latency-ab.sh BIN_A BIN_B OUT [--devices 0,1]
# Multicast stays off (the safety rule).
set -uo pipefail
export MCAST_MULTICAST=off NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
a="$1" b="$2" out="$3"
shift 3
devices="${DEVICES:-0,1}"
mkdir -p "$out"
common=(--backend cuda --devices "$devices" -b 8 -e 64K -f 4 -G 20 -n 50 -w 10 -q)
for round in 1 2; do
  for which in A B; do
    bin="$a"
    [ "$which" = B ] && bin="$b"
    MCAST_LL=off "$bin" "${common[@]}" --op all_reduce -d bf16 >"$out/$which${round}_ar.txt" 2>&1
    MCAST_LL=on "$bin" "${common[@]}" --op all_reduce -d bf16 >"$out/$which${round}_ar_ll.txt" 2>&1
    MCAST_LL=off "$bin" "${common[@]}" --op all_gather >"$out/$which${round}_ag.txt" 2>&1
    MCAST_LL=off "$bin" "${common[@]}" --op all_reduce -d bf16 --memory pointer >"$out/$which${round}_ar_ptr.txt" 2>&1
  done
done
# One table: time (us) per size for each run, by case.
"$(dirname "$0")/ab-table.sh" "$out" ar ar_ll ag ar_ptr | tee "$out/table.txt"
