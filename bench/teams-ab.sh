#!/usr/bin/env bash
# Small-message latency of two mcast-bench builds for teams of 2, 3, 4 and 8 ranks sharing one GPU
# (one process, `--devices 0,0,...`), from CUDA graphs, rounds of A then B (3 by default); then
# bench/teams-table.py prints the medians. Ranks that share a GPU move their bytes through its own
# memory, not NVLink: what this compares is the kernels' own latency (waits, grid, code), which a
# change to them moves the same way on one GPU per rank.
#   bench/teams-ab.sh BIN_A BIN_B OUT        (ROUNDS=3, TEAMS="2 3 4 8", DEVICE=0)
# With DEVICES=0,1,2,3,0,1,2,3 a team of n ranks takes the first n devices of the list instead
# (one GPU per rank across NVLink where the list allows). AR_SIZES gives the all-reduce's size
# flags (default "-b 8 -e 128K -f 4"); ONLY_AR=1 times the all-reduce alone (with
# AR_SIZES="-b 512K -e 64M -f 2": the two-shot's range).
# Multicast stays off (the safety rule).
set -uo pipefail
export MCAST_MULTICAST=off NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
a="$1" b="$2" out="$3"
mkdir -p "$out"
dev="${DEVICE:-0}"
devs() {
  local n="$1" s="$dev"
  if [ -n "${DEVICES:-}" ]; then
    echo "$DEVICES" | cut -d, -f1-"$n"
    return
  fi
  for ((i = 1; i < n; i++)); do s="$s,$dev"; done
  echo "$s"
}
common=(--backend cuda -G 20 -n 50 -w 10 -q)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$out/gpu.txt" 2>&1
# The first run of each build fills the kernel cache (not timed).
for bin in "$a" "$b"; do "$bin" --backend cuda --devices "$(devs 2)" -b 8 -e 8 -n 1 -w 1 -q >/dev/null 2>&1; done
for ((round = 1; round <= ${ROUNDS:-3}; round++)); do
  for which in A B; do
    bin="$a"
    [ "$which" = B ] && bin="$b"
    for n in ${TEAMS:-2 3 4 8}; do
      d="$(devs "$n")"
      # shellcheck disable=SC2086 # AR_SIZES is a list of flags
      "$bin" "${common[@]}" --devices "$d" --op all_reduce -d bf16 ${AR_SIZES:--b 8 -e 128K -f 4} >"$out/$which${round}_ar$n.txt" 2>&1
      [ -n "${ONLY_AR:-}" ] && continue
      "$bin" "${common[@]}" --devices "$d" --op all_gather -b 8 -e 32K -f 8 >"$out/$which${round}_ag$n.txt" 2>&1
    done
    [ -n "${ONLY_AR:-}" ] && continue
    d="$(devs 4)"
    "$bin" "${common[@]}" --devices "$d" --op reduce_scatter -d bf16 -b 64 -e 256K -f 8 >"$out/$which${round}_rs4.txt" 2>&1
    "$bin" "${common[@]}" --devices "$d" --op broadcast -b 64 -e 256K -f 8 >"$out/$which${round}_bc4.txt" 2>&1
  done
done
cases=""
for n in ${TEAMS:-2 3 4 8}; do
  cases="$cases ar$n"
  [ -n "${ONLY_AR:-}" ] || cases="$cases ag$n"
done
[ -n "${ONLY_AR:-}" ] || cases="$cases rs4 bc4"
# shellcheck disable=SC2086 # one argument per case
python3 "$(dirname "$0")/teams-table.py" "$out" "${ROUNDS:-3}" $cases | tee "$out/table.md"
