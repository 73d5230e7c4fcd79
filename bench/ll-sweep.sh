#!/usr/bin/env bash
# The LL kernels on a GPU machine (issue 16): correctness first, then LL on against LL off in
# the same run, every collective, bf16, 8K..1M (nccl-tests sizes: all-gather and reduce-scatter
# totals), eager and from CUDA graphs. What it prints decides where LL stops winning (the plan's
# LL_MAX_BYTES, per collective if they differ) and whether MCAST_LL's default on CUDA turns on.
# Usage (on the GPU machine, from the repository root, with the built binary in $BIN):
#   BIN=target/release/mcast-bench bench/ll-sweep.sh OUTDIR [DEVICES, default 0,1]
# Multicast stays off (the LL kernels are P2P kernels; never create a multicast object on a
# shared machine).
set -uo pipefail
default_out=ll-out
source "$(dirname "$0")/sweep-setup.sh"

# 1. Correctness with LL on: teams of 2, 3 and 4 ranks on the given GPUs (a device may repeat),
#    every collective, in and out of place, buffers and plain memory, odd sizes across the LL
#    limit; then dtypes and operators from CUDA graphs. The last column is #wrong per size.
for team in "$devices" "$devices,$first" "$devices,$devices"; do
  for op in all_reduce reduce_scatter all_gather broadcast; do
    for inplace in 1 0; do
      for memory in buffer pointer; do
        line=$(MCAST_LL=on "$bin" --backend "$backend" --devices "$team" --op "$op" -d f32 -b 1000 -e 600K -f 3 -q \
          --inplace "$inplace" --memory "$memory" -r 1 -n 3 -w 1 2>&1 | wrong) || status=1
        echo "devices $team $op inplace=$inplace $memory:$line" | tee -a "$out/correctness.txt"
      done
    done
  done
done
for dtype in f16 bf16 f64 i64 u32; do
  for op in all_reduce reduce_scatter; do
    for redop in sum max; do
      line=$(MCAST_LL=on "$bin" --backend "$backend" --devices "$devices" --op "$op" -d "$dtype" -o "$redop" -b 1000 \
        -e 600K -f 3 -q --inplace 0 -n 3 -w 1 -G 3 2>&1 | wrong) || status=1
      echo "$dtype $op $redop graph:$line" | tee -a "$out/correctness.txt"
    done
  done
done

# 2. LL on against LL off, the same binary, one after the other.
for op in all_reduce reduce_scatter all_gather broadcast; do
  for graph in 20 0; do
    for ll in on off; do
      MCAST_LL=$ll "$bin" --backend "$backend" --devices "$devices" --op "$op" -d bf16 -b 8K -e 1M -f 2 -G "$graph" -q \
        --csv "$out/$op-G$graph-ll-$ll.csv" >"$out/$op-G$graph-ll-$ll.txt" 2>&1 || status=1
    done
    echo "== $op, $([ "$graph" = 0 ] && echo eager || echo "graph (-G $graph)"): size, us with LL on, us with LL off"
    paste <(awk '/^ +[0-9]/ {print $1, $6}' "$out/$op-G$graph-ll-on.txt") \
      <(awk '/^ +[0-9]/ {print $6}' "$out/$op-G$graph-ll-off.txt") | tee -a "$out/ll-on-off.txt"
  done
done
exit $status
