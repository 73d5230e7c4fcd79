#!/usr/bin/env bash
# PyTorch's NCCL process group on libmcast_nccl against the real NCCL, N GPUs, one process per GPU,
# same run (CUDA graphs beside the process group's watchdog and symmetric memory; issue 38):
#   1. bench/graph_check.py (collectives and symmetric memory captured with torch.cuda.graph in its
#      default global mode, replayed REPLAYS times, every output checked) on the real NCCL, then
#      through the shim (LD_PRELOAD=libmcast_nccl.so, MCAST_NCCL_FALLBACK = the wheel's NCCL);
#   2. bench/peers.py, every op, eager and graph, MIN to MAX, on the real NCCL and through the shim;
#      bench/shim_table.py tabulates the NCCL rows of both (OUT/shim.md);
#   3. with NCCL_TESTS_SRC (an nccl-tests source tree): nccl-tests built against the shim (its
#      header and library as NCCL_HOME) and run -g N -G 20 -c 1 for the four collectives.
# Usage, on the GPU machine from the repository root, PREFIX an installed mcast (scripts/install):
#   PREFIX=... [NCCL_TESTS_SRC=...] [MIN=8K] [MAX=256M] [REPLAYS=1000] bench/shim-check.sh OUT [N]
# SHIM_ONLY=1 NO_FALLBACK=1 run the shim's steps alone, without the fallback NCCL: with fewer GPUs
# than N (the ranks then share GPUs, which mcast's teams allow and NCCL refuses).
# Each step writes OUT/<name>.log and a line "name: exit CODE" to OUT/summary.txt.
# Multicast stays off: the kill switches are exported here and never unset.
set -uo pipefail
export MCAST_MULTICAST=off NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
out="${1:?usage: bench/shim-check.sh OUT [N]}"
n="${2:-4}"
prefix="$(cd "${PREFIX:?PREFIX names an installed mcast}" && pwd)"
mkdir -p "$out"
bytes() { numfmt --from=iec "$1"; }
min="$(bytes "${MIN:-8K}")"
max="$(bytes "${MAX:-256M}")"
replays="${REPLAYS:-1000}"
nccl="$(scripts/find-nccl)" || { echo "shim-check: no NCCL in the Python environment" >&2; exit 1; }
shim="$prefix/lib/libmcast_nccl.so"
if [ -z "${MCAST_NVRTC_PATH:-}" ]; then
  MCAST_NVRTC_PATH="$(ls /usr/local/cuda/lib64/libnvrtc.so.* 2>/dev/null | sort | head -n 1)"
  export MCAST_NVRTC_PATH
fi
export LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
date -u +%Y-%m-%dT%H:%M:%SZ >"$out/date.txt"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader >"$out/gpus.txt" 2>&1

# step NAME [VAR=VALUE...] -- COMMAND...: runs COMMAND with the variables set, bounded in time.
step() {
  local name="$1" rc
  shift
  local vars=()
  while [ "$1" != "--" ]; do vars+=("$1"); shift; done
  shift
  env "${vars[@]}" timeout "${LIMIT:-420}" "$@" >"$out/$name.log" 2>&1
  rc=$?
  echo "$name: exit $rc" | tee -a "$out/summary.txt"
  grep -E "graph_check:|note:.*fail|Error|error" "$out/$name.log" | head -n 12
}
torchrun_n=(torchrun --standalone --nproc_per_node="$n")
on_shim=(LD_PRELOAD="$shim" MCAST_BACKEND=cuda)
# The fallback NCCL (for calls mcast does not serve) keeps a communicator beside each team, which
# NCCL refuses where ranks share a GPU: NO_FALLBACK=1 leaves it out.
[ -n "${NO_FALLBACK:-}" ] || on_shim+=(MCAST_NCCL_FALLBACK="$nccl")

[ -n "${SHIM_ONLY:-}" ] || step "graph_check_nccl_$n" -- "${torchrun_n[@]}" bench/graph_check.py --replays "$replays"
step "graph_check_shim_$n" "${on_shim[@]}" -- "${torchrun_n[@]}" bench/graph_check.py --replays "$replays"
[ -n "${SHIM_ONLY:-}" ] || step "peers_nccl_$n" -- "${torchrun_n[@]}" bench/peers.py --out "$out/peers_nccl_$n.csv" \
  --min-bytes "$min" --max-bytes "$max"
step "peers_shim_$n" "${on_shim[@]}" -- "${torchrun_n[@]}" bench/peers.py --out "$out/peers_shim_$n.csv" \
  --min-bytes "$min" --max-bytes "$max" --ops "${OPS:-all_reduce,all_gather,reduce_scatter,broadcast}"

if [ -f "$out/peers_nccl_$n.csv" ] && [ -f "$out/peers_shim_$n.csv" ]; then
  python3 bench/shim_table.py "$out/peers_nccl_$n.csv" "$out/peers_shim_$n.csv" >"$out/shim.md" 2>&1 &&
    cat "$out/shim.md"
fi

if [ -n "${NCCL_TESTS_SRC:-}" ]; then
  home="$out/nccl_home"
  mkdir -p "$home/include" "$home/lib"
  cp "$prefix/include/mcast/nccl.h" "$home/include/nccl.h"
  ln -sf "$shim" "$home/lib/libnccl.so"
  ln -sf "$shim" "$home/lib/libnccl.so.2"
  build="$(mktemp -d)"
  cp -r "$NCCL_TESTS_SRC"/. "$build/"
  if make -C "$build/src" -j 32 NCCL_HOME="$(cd "$home" && pwd)" BUILDDIR="$build/build" >"$out/nccl_tests_build.log" 2>&1; then
    for op in all_reduce all_gather reduce_scatter broadcast; do
      step "nccl_tests_shim_${op}_$n" LD_LIBRARY_PATH="$(cd "$home" && pwd)/lib:$LD_LIBRARY_PATH" \
        MCAST_NCCL_FALLBACK="$nccl" -- "$build/build/${op}_perf" -b 8 -e 64M -f 8 -g "$n" -G 20 -c 1 -d bfloat16
      grep -E "Out of bounds|Avg bus" "$out/nccl_tests_shim_${op}_$n.log"
    done
  else
    echo "nccl_tests_build: failed (see nccl_tests_build.log)" | tee -a "$out/summary.txt"
  fi
fi
