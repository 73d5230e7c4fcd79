#!/usr/bin/env bash
# Small-message latency of two mcast-bench builds for teams of 2, 3, 4 and 8 ranks sharing one GPU
# (one process, `--devices 0,0,...`), from CUDA graphs, rounds of A then B (3 by default); then
# bench/teams-table.py prints the medians. Ranks that share a GPU move their bytes through its own
# memory, not NVLink: what this compares is the kernels' own latency (waits, grid, code), which a
# change to them moves the same way on one GPU per rank.
#   bench/teams-ab.sh BIN_A BIN_B OUT        (ROUNDS=3, TEAMS="2 3 4 8", DEVICE=0)
# With DEVICES=0,1,2,3,0,1,2,3 a team of n ranks takes the first n devices of the list instead
# (one GPU per rank across NVLink where the list allows). SIZES="-b 512K -e 64M -f 2" times
# larger messages instead (OPS="all_reduce broadcast" to pick the collectives). ENV_A and ENV_B
# (VAR=value words, e.g. ENV_B="MCAST_PDL=on") set variables for one side's runs only, so one
# build can be compared with itself under two settings.
# Multicast stays off (the safety rule).
set -uo pipefail
export MCAST_MULTICAST=off NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
a="$1" b="$2" out="$3"
case "${ENV_A:-} ${ENV_B:-}" in
  *MULTICAST* | *NVLS*) echo "teams-ab.sh: ENV_A/ENV_B may not touch multicast or its kill switches" >&2; exit 2 ;;
esac
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
# The cases: name, team size, op and its flags. By default small messages (every op at its LL
# sizes); with SIZES (mcast-bench size flags, e.g. "-b 512K -e 64M -f 2") the ops of OPS (default
# all_reduce all_gather reduce_scatter broadcast) at those sizes for every team of TEAMS.
cases=()
for n in ${TEAMS:-2 3 4 8}; do
  if [ -n "${SIZES:-}" ]; then
    for op in ${OPS:-all_reduce all_gather reduce_scatter broadcast}; do
      cases+=("${op}$n $n --op $op -d bf16 $SIZES")
    done
  else
    cases+=("ar$n $n --op all_reduce -d bf16 -b 8 -e 128K -f 4" "ag$n $n --op all_gather -b 8 -e 32K -f 8")
  fi
done
[ -n "${SIZES:-}" ] || cases+=("rs4 4 --op reduce_scatter -d bf16 -b 64 -e 256K -f 8" "bc4 4 --op broadcast -b 64 -e 256K -f 8")
for ((round = 1; round <= ${ROUNDS:-3}; round++)); do
  for which in A B; do
    bin="$a" vars="${ENV_A:-}"
    [ "$which" = B ] && bin="$b" vars="${ENV_B:-}"
    for c in "${cases[@]}"; do
      # shellcheck disable=SC2086 # a case is its name, team size and flags
      set -- $c
      name="$1" n="$2"
      shift 2
      # shellcheck disable=SC2086 # vars is a list of VAR=value words
      env $vars "$bin" "${common[@]}" --devices "$(devs "$n")" "$@" >"$out/$which${round}_$name.txt" 2>&1
    done
  done
done
names=()
for c in "${cases[@]}"; do names+=("${c%% *}"); done
python3 "$(dirname "$0")/teams-table.py" "$out" "${ROUNDS:-3}" "${names[@]}" | tee "$out/table.md"
