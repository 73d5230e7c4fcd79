#!/usr/bin/env bash
# The same-run comparison on nvidia-h200-x2 (two H200s), P2P path only, every peer eager and
# replayed from a CUDA graph, then one table per op with ratios and issue 16's targets:
#   1. the peak peer-copy roofline (bench/p2p_roofline.cu, compiled here with nvcc), and the
#      first-use time (process start to one bf16 all-reduce done, empty kernel cache);
#   2. mcast-bench for each op, eager and -G $GRAPH_LAUNCHES;
#   3. nccl-tests *_perf binaries, eager and -G $GRAPH_LAUNCHES, when NCCL_TESTS_DIR names a
#      directory of already-built binaries (this script never builds them);
#   4. NCCL and PyTorch symmetric memory through torch.distributed (bench/peers.py), both modes;
#   5. bench/compare.py -> $OUT/table.md.
# Usage (on the GPU machine, from the repository root, with the built binary in $BIN):
#   BIN=target/release/mcast-bench [NCCL_TESTS_DIR=.../nccl-tests/build] bench/run-h200x2.sh OUTDIR
# Optional: OPS="all_reduce all_gather" MIN=8K MAX=1G GRAPH_LAUNCHES=20 SKIP_PEERS=1.
# A missing piece (no nvcc, no nccl-tests, no torch) prints a note and the rest still runs.
# Multicast stays off: never create a multicast object on a shared machine; the kill switches the
# machine sets stay set (and are re-asserted for every program started here).
set -uo pipefail
export MCAST_MULTICAST=off NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out="${1:-bench-out}"
mkdir -p "$out"
bin="${BIN:-target/release/mcast-bench}"
ops="${OPS:-all_reduce all_gather reduce_scatter broadcast}"
min="${MIN:-8K}"
max="${MAX:-1G}"
graph="${GRAPH_LAUNCHES:-20}"
note() { echo "run-h200x2: note: $*" | tee -a "$out/notes.txt" >&2; }
: >"$out/notes.txt"

date -u +%Y-%m-%dT%H:%M:%SZ | tee "$out/date.txt"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$out/gpus.txt" ||
  note "nvidia-smi failed"
nvidia-smi topo -m >"$out/topo.txt" 2>&1 || true

# 1. Roofline, same run.
roof_args=()
if command -v nvcc >/dev/null; then
  if nvcc -O3 -std=c++17 -arch=sm_90 bench/p2p_roofline.cu -o "$out/p2p_roofline" 2>"$out/p2p_roofline.build.err"; then
    if "$out/p2p_roofline" | tee "$out/roofline.txt"; then
      roof_args=(--roofline "$out/roofline.txt")
    else
      note "p2p_roofline failed; the roofline targets are not judged"
    fi
  else
    note "nvcc could not build bench/p2p_roofline.cu (see p2p_roofline.build.err)"
  fi
else
  note "no nvcc: no roofline measured"
fi

# First use: process start to the end of one bf16 all-reduce, with an empty kernel cache (the
# first call compiles its module with NVRTC). Issue 16's target is <= 2 s.
if [[ -x "$bin" ]]; then
  cache="$(mktemp -d)"
  t0=$(date +%s.%N)
  if MCAST_CACHE_DIR="$cache" "$bin" --backend cuda --devices 0,1 --op all_reduce --dtype bf16 -b 8K -e 8K \
    -n 1 -w 0 -q >"$out/first_use.out" 2>&1; then
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
    echo "first use (empty kernel cache, process start to exit): $secs s" | tee "$out/first_use.txt"
  else
    note "first-use run failed: $(tail -n 3 "$out/first_use.out" | tr '\n' ' ')"
  fi
  rm -rf "$cache"
fi

# 2. mcast-bench, eager and graph.
mcast_args=()
if [[ -x "$bin" ]]; then
  for op in $ops; do
    for mode in eager graph; do
      g=0
      [[ $mode == graph ]] && g="$graph"
      if "$bin" --backend cuda --devices 0,1 --op "$op" --dtype bf16 -b "$min" -e "$max" -f 2 -G "$g" \
        --csv "$out/mcast_${op}_$mode.csv" 2>"$out/mcast_${op}_$mode.err" | tee "$out/mcast_${op}_$mode.txt"; then
        mcast_args+=(--mcast "$out/mcast_${op}_$mode.csv")
      else
        note "mcast-bench $op ($mode) failed: $(tail -n 3 "$out/mcast_${op}_$mode.err" | tr '\n' ' ')"
        [[ -s "$out/mcast_${op}_$mode.csv" ]] && mcast_args+=(--mcast "$out/mcast_${op}_$mode.csv")
      fi
    done
  done
else
  note "no mcast-bench binary at $bin (cargo build --release)"
fi

# 3. nccl-tests, eager and graph, from already-built binaries. NCCL from the PyTorch wheel when
# the binaries do not find one themselves.
nccl_args=()
if [[ -n "${NCCL_TESTS_DIR:-}" && -d "${NCCL_TESTS_DIR}" ]]; then
  wheel_nccl="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)"
  [[ -n "$wheel_nccl" ]] && export LD_LIBRARY_PATH="$wheel_nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  for op in $ops; do
    exe="$NCCL_TESTS_DIR/${op}_perf"
    if [[ ! -x "$exe" ]]; then
      note "no $exe"
      continue
    fi
    for mode in eager graph; do
      g=0
      [[ $mode == graph ]] && g="$graph"
      redop=()
      [[ $op == all_reduce || $op == reduce_scatter ]] && redop=(-o sum)
      if "$exe" -b "$min" -e "$max" -f 2 -g 2 -d bfloat16 "${redop[@]}" -n 20 -w 5 -c 1 -G "$g" \
        >"$out/nccl_${op}_$mode.txt" 2>&1; then
        nccl_args+=(--nccl-tests "$out/nccl_${op}_$mode.txt")
      else
        note "nccl-tests $op ($mode) failed: $(tail -n 3 "$out/nccl_${op}_$mode.txt" | tr '\n' ' ')"
      fi
    done
  done
else
  note "NCCL_TESTS_DIR is not set to a directory of built nccl-tests binaries: nccl-tests skipped"
fi

# 4. PyTorch: NCCL and symmetric memory, eager and graph.
peers_args=()
if [[ -n "${SKIP_PEERS:-}" ]]; then
  note "SKIP_PEERS set: bench/peers.py skipped"
elif python3 -c 'import torch, torch.distributed' 2>/dev/null && command -v torchrun >/dev/null; then
  # The byte counts are plain numbers for peers.py.
  bytes() { python3 -c "import sys; v=sys.argv[1].upper(); m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(v[:-1])*m[v[-1]] if v[-1] in m else int(v))" "$1"; }
  if PYTHONUNBUFFERED=1 torchrun --nproc_per_node=2 bench/peers.py --min-bytes "$(bytes "$min")" --max-bytes "$(bytes "$max")" \
    --ops "$(echo $ops | tr ' ' ',')" --modes eager,graph --out "$out/peers.csv" 2>"$out/peers.err"; then
    peers_args=(--peers "$out/peers.csv")
  else
    note "bench/peers.py failed: $(tail -n 5 "$out/peers.err" | tr '\n' ' ')"
    # It writes its CSV before tearing down; a failure after that leaves the measurements.
    if [[ -s "$out/peers.csv" ]]; then
      note "bench/peers.py wrote peers.csv before it failed: its rows are used"
      peers_args=(--peers "$out/peers.csv")
    fi
  fi
  grep 'peers: note' "$out/peers.err" >>"$out/notes.txt" 2>/dev/null || true
else
  note "no torch/torchrun: the PyTorch peers are skipped"
fi

# 5. One table per op.
first_args=()
[[ -s "$out/first_use.txt" ]] && first_args=(--first-use "$out/first_use.txt")
python3 bench/compare.py "${mcast_args[@]}" "${nccl_args[@]}" "${peers_args[@]}" "${roof_args[@]}" \
  "${first_args[@]}" --md "$out/table.md"
echo "run-h200x2: results in $out (table.md, notes.txt)" >&2
