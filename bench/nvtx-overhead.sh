#!/usr/bin/env bash
# Host cost of the NVTX ranges on a small collective (mcast_all_reduce, 4 KiB, 2 ranks, P2P):
# `mcast-bench --host-overhead N` RUNS times in each of three settings, interleaved:
#   none   no tool attached (NVTX_INJECTION64_PATH unset): the off path, one relaxed load a call
#   off    a tool named but MCAST_NVTX=off
#   tool   a tool attached: tests/nvtx/fake_tool.c built here, logging nothing (the cost of
#          mcast's side: naming the range, the push and the pop; a real tool adds its own)
# Prints per setting the medians of the call's median and p99 (ns), allocations per call, and the
# median of the call's entry alone (count 0). Compare `none` with an mcast-bench built without the
# ranges (BASE=path) to see the off path's cost, which must be within run-to-run noise.
# Simulator by default; BACKEND=cuda on a GPU machine (multicast always off here).
# Usage: BIN=target/release/mcast-bench [BASE=...] [BACKEND=sim|cuda] bench/nvtx-overhead.sh [N] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/mcast-bench}
BACKEND=${BACKEND:-sim}
N=${1:-20000}
RUNS=${2:-5}
export MCAST_MULTICAST=off
unset MCAST_NVTX NVTX_INJECTION64_PATH FAKE_NVTX_LOG FAKE_NVTX_MODE

tool_dir=$(mktemp -d)
trap 'rm -rf "$tool_dir"' EXIT
cc -shared -fPIC -O2 -o "$tool_dir/libfake_nvtx_tool.so" tests/nvtx/fake_tool.c
TOOL=$tool_dir/libfake_nvtx_tool.so

# One run: "median p99 allocs entry".
one() {
  "$@" --backend "$BACKEND" --devices 0,1 -b 4K -e 4K --host-overhead "$N" -q 2>/dev/null |
    awk '/^ +4096 /{m=$6; p=$7; a=$9} /entry alone/{sub(/.*median /, ""); sub(/ ns,.*/, ""); e=$0}
         END{print m, p, a, e}'
}
median() { sort -n | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}'; }

declare -A rows
settings=(none off tool)
[[ -n ${BASE:-} ]] && settings=(base "${settings[@]}")
for _ in $(seq "$RUNS"); do
  for s in "${settings[@]}"; do
    case $s in
      base) r=$(one "$BASE") ;;
      none) r=$(one "$BIN") ;;
      off) r=$(one env MCAST_NVTX=off NVTX_INJECTION64_PATH="$TOOL" "$BIN") ;;
      tool) r=$(one env NVTX_INJECTION64_PATH="$TOOL" "$BIN") ;;
    esac
    rows[$s]+="$r"$'\n'
  done
done
printf '%-6s | %-10s | %-10s | %-11s | %s\n' setting "median ns" "p99 ns" allocs/call "entry ns"
for s in "${settings[@]}"; do
  col() { printf '%s' "${rows[$s]}" | awk -v c="$1" 'NF{print $c}' | median; }
  printf '%-6s | %-10s | %-10s | %-11s | %s\n' "$s" "$(col 1)" "$(col 2)" "$(col 3)" "$(col 4)"
done
