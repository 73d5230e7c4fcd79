#!/usr/bin/env bash
# The pointer form's staged route (plain memory, LL off: all-gather, reduce-scatter, broadcast)
# of two mcast-bench builds, alternating on one warm machine (A B A B): whether a change to how
# the results leave the staging area moves its time by more than the run-to-run noise. From CUDA
# graphs, 8 B to 16 MiB (one to many 1 MiB staging chunks), check on.
#   bench/staged-ab.sh BIN_A BIN_B OUT
# Multicast stays off (the safety rule).
set -uo pipefail
export MCAST_MULTICAST=off NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export MCAST_LL=off # the staged route itself (LL, the default, serves small messages without staging)
a="$1" b="$2" out="$3"
devices="${DEVICES:-0,1}"
mkdir -p "$out"
common=(--backend cuda --devices "$devices" --memory pointer -b 8 -e 16M -f 4 -G 20 -n 20 -w 5 -q)
for round in 1 2; do
  for which in A B; do
    bin="$a"
    [ "$which" = B ] && bin="$b"
    "$bin" "${common[@]}" --op all_gather >"$out/$which${round}_ag.txt" 2>&1
    "$bin" "${common[@]}" --op reduce_scatter -d bf16 >"$out/$which${round}_rs.txt" 2>&1
    "$bin" "${common[@]}" --op broadcast >"$out/$which${round}_bc.txt" 2>&1
  done
done
"$(dirname "$0")/ab-table.sh" "$out" ag rs bc | tee "$out/table.txt"
