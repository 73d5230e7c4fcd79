#!/usr/bin/env bash
# The copy-engine forms on a GPU machine: correctness first, then the SM kernels against the copy
# engines in the same run (A B A B), all-gather, broadcast and all-reduce, bf16, 4M..1G, from CUDA
# graphs and eager. What it prints decides MCAST_CE_MIN_BYTES's default on CUDA (where the copy
# engines start to win, if they do).
# Usage (on the GPU machine, from the repository root, with the built binary in $BIN):
#   BIN=target/release/mcast-bench bench/ce-sweep.sh OUTDIR [DEVICES, default 0,1]
# Multicast stays off (the copy-engine forms are P2P forms; never create a multicast object on a
# shared machine).
set -uo pipefail
default_out=ce-out
source "$(dirname "$0")/sweep-setup.sh"

# 1. Correctness with every message on the copy engines (--ce-min-bytes 1): teams of 2, 3 and 4
#    ranks on the given GPUs (a device may repeat), in and out of place, buffers and registered
#    memory, odd sizes. The last column is #wrong per size.
for team in "$devices" "$devices,$first" "$devices,$devices"; do
  for op in all_reduce all_gather broadcast; do
    for inplace in 1 0; do
      for memory in buffer registered; do
        line=$("$bin" --backend "$backend" --devices "$team" --op "$op" -d bf16 -b 1000 -e 9M -f 7 -q \
          --inplace "$inplace" --memory "$memory" -r 1 -n 3 -w 1 --ce-min-bytes 1 2>&1 | wrong) || status=1
        echo "devices $team $op inplace=$inplace $memory:$line" | tee -a "$out/correctness.txt"
      done
    done
  done
done

# 2. The SM kernels (--ce-min-bytes 0) against the copy engines from 4M (--ce-min-bytes 4M), the
#    same binary, alternating: sm ce sm ce.
for op in all_gather broadcast all_reduce; do
  for graph in 20 0; do
    for round in 1 2; do
      for t in 0 4M; do
        "$bin" --backend "$backend" --devices "$devices" --op "$op" -d bf16 -b 4M -e 1G -f 2 -G "$graph" -n 20 -q \
          --ce-min-bytes "$t" --csv "$out/$op-G$graph-ce$t-$round.csv" >"$out/$op-G$graph-ce$t-$round.txt" 2>&1 ||
          status=1
      done
    done
    echo "== $op, $([ "$graph" = 0 ] && echo eager || echo "graph (-G $graph)"): size, us SM kernels, us copy engines (run 1, run 2)"
    paste <(awk '/^ +[0-9]/ {print $1, $6}' "$out/$op-G$graph-ce0-1.txt") \
      <(awk '/^ +[0-9]/ {print $6}' "$out/$op-G$graph-ce4M-1.txt") \
      <(awk '/^ +[0-9]/ {print $6}' "$out/$op-G$graph-ce0-2.txt") \
      <(awk '/^ +[0-9]/ {print $6}' "$out/$op-G$graph-ce4M-2.txt") | tee -a "$out/sm-ce.txt"
  done
done
exit $status
