#!/usr/bin/env bash
# Host cost of one collective call on the simulator (issue 16 item 4): runs
# `mcast-bench --host-overhead N` for each call form RUNS times and prints one line per form:
# median and p99 ns (the range over the runs), heap allocations per call in mcast's code and,
# apart, in the simulated device's own work. Simulator only (--backend sim): nothing here
# touches a GPU. Usage: BIN=target/release/mcast-bench bench/host-overhead-sim.sh [N] [RUNS]
set -euo pipefail
BIN=${BIN:-target/release/mcast-bench}
N=${1:-20000}
RUNS=${2:-3}
SIZE=4K

# name | environment | arguments (every run also passes --backend sim: the MULTICAST form is the
# simulator's multicast, never a GPU's)
FORMS=(
  "mcast_all_reduce, 2 ranks, P2P|MCAST_MULTICAST=off|--devices 0,1"
  "the same, 1 rank|MCAST_MULTICAST=off|--devices 0"
  "the same, eager|MCAST_MULTICAST=off|--devices 0,1 --host-launch eager"
  "mcast_all_reduce, 2 ranks, MULTICAST|MCAST_BACKEND=sim MCAST_MULTICAST=auto|--devices 0,1"
  "mcast_all_reduce_into, 2 ranks, P2P|MCAST_MULTICAST=off|--devices 0,1 --inplace 0"
  "mcast_team_all_reduce (plain memory), in place|MCAST_MULTICAST=off|--devices 0,1 --memory pointer"
  "mcast_team_all_reduce (plain memory), out of place|MCAST_MULTICAST=off|--devices 0,1 --memory pointer --inplace 0"
  "mcast_team_reduce_scatter (plain memory)|MCAST_MULTICAST=off|--devices 0,1 --memory pointer --op reduce_scatter"
  "mcast_all_gather, 2 ranks, P2P|MCAST_MULTICAST=off|--devices 0,1 --op all_gather"
)

# The lowest and highest of the arguments ("a-b"; "a" when equal).
range() { printf '%s\n' "$@" | sort -n | awk 'NR==1{lo=$1} {hi=$1} END{print (lo==hi? lo : lo "-" hi)}'; }

printf '%-62s | %-11s | %-11s | %-9s | %s\n' "call (4 KiB, capture unless said)" "median ns" "p99 ns" "allocs" "sim allocs"
entry_med=() entry_p99=() entry_alloc=()
for form in "${FORMS[@]}"; do
  IFS='|' read -r name envs args <<<"$form"
  meds=() p99s=() allocs=() sims=()
  for _ in $(seq "$RUNS"); do
    # shellcheck disable=SC2086
    out=$(env $envs "$BIN" --backend sim -b $SIZE -e $SIZE --host-overhead "$N" -q $args)
    row=$(grep -E '^ +[0-9]+ ' <<<"$out" | head -1)
    meds+=("$(awk '{print $6}' <<<"$row")")
    p99s+=("$(awk '{print $7}' <<<"$row")")
    allocs+=("$(awk '{print $9}' <<<"$row")")
    sims+=("$(grep -o 'up to [0-9.]* more' <<<"$out" | awk '{print $3}' || echo 0)")
    entry=$(grep "entry alone" <<<"$out" || true)
    if [[ -n "$entry" && "$name" == "mcast_all_reduce, 2 ranks, P2P" ]]; then
      entry_med+=("$(sed -E 's/.*median ([0-9]+) ns.*/\1/' <<<"$entry")")
      entry_p99+=("$(sed -E 's/.*p99 ([0-9]+) ns.*/\1/' <<<"$entry")")
      entry_alloc+=("$(sed -E 's/.*ns, ([0-9.]+) heap.*/\1/' <<<"$entry")")
    fi
  done
  printf '%-62s | %-11s | %-11s | %-9s | %s\n' "$name" "$(range "${meds[@]}")" "$(range "${p99s[@]}")" \
    "$(range "${allocs[@]}")" "$(range "${sims[@]}")"
done
printf '%-62s | %-11s | %-11s | %-9s | %s\n' "count 0 (entry: guard, handle lookup, checks)" \
  "$(range "${entry_med[@]}")" "$(range "${entry_p99[@]}")" "$(range "${entry_alloc[@]}")" "0"
