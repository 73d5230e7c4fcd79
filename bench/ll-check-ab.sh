#!/usr/bin/env bash
# The LL kernels' call-signature check: two mcast-bench builds with MCAST_LL=on, alternating on one
# warm machine, A and B with the check on and C = B with the check off (MCAST_CHECK_CALLS=off), in
# the order A B C A B C: B - A is the change, B - C what the check still costs. From CUDA graphs,
# 8 B to 64 KiB, the LL all-reduce (bf16), all-gather and broadcast.
#   bench/ll-check-ab.sh BIN_A BIN_B OUT
# Multicast stays off (the safety rule).
set -uo pipefail
export MCAST_MULTICAST=off NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
a="$1" b="$2" out="$3"
devices="${DEVICES:-0,1}"
mkdir -p "$out"
common=(--backend cuda --devices "$devices" -b 8 -e 64K -f 4 -G 20 -n 50 -w 10 -q)
for round in 1 2; do
  for which in A B C; do
    bin="$a" check=on
    [ "$which" != A ] && bin="$b"
    [ "$which" = C ] && check=off
    MCAST_LL=on MCAST_CHECK_CALLS=$check "$bin" "${common[@]}" --op all_reduce -d bf16 >"$out/$which${round}_ar_ll.txt" 2>&1
    MCAST_LL=on MCAST_CHECK_CALLS=$check "$bin" "${common[@]}" --op all_gather >"$out/$which${round}_ag_ll.txt" 2>&1
    MCAST_LL=on MCAST_CHECK_CALLS=$check "$bin" "${common[@]}" --op broadcast >"$out/$which${round}_bc_ll.txt" 2>&1
  done
done
"$(dirname "$0")/abc-table.sh" "$out" ar_ll ag_ll bc_ll | tee "$out/table.txt"
