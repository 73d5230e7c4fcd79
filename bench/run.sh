#!/usr/bin/env bash
# The same-run comparison on N GPUs of one machine, P2P path only, every peer eager and replayed
# from a CUDA graph, then one table and one plot per op:
#   roofline  the peak peer-copy roofline of GPUs 0 and 1 (bench/p2p_roofline.cu, built with nvcc);
#   first     first use: process start to one bf16 all-reduce of N ranks done, empty kernel cache;
#   mcast     mcast-bench, one process driving the N ranks (--devices 0,...,N-1), eager and -G;
#   procs     mcast-bench, one process per rank (--procs N), eager and -G;
#   nccl      nccl-tests *_perf -g N, eager and -G: from NCCL_TESTS_DIR (built binaries), else
#             built once into $TMPDIR/mcast-nccl-tests from the source tree NCCL_TESTS_SRC against
#             the PyTorch wheel's NCCL (sm_90 only; needs nvcc and make);
#   peers     NCCL and PyTorch symmetric memory through torch.distributed (bench/peers.py under
#             torchrun --nproc_per_node=N), eager and replayed from torch.cuda.CUDAGraph;
#   compare   bench/compare.py over everything in OUT -> OUT/table.md, and bench/plot.py ->
#             OUT/plots/<op>.png (bus bandwidth and latency against size; needs matplotlib).
# Usage (on the GPU machine, from the repository root, with the built binary in $BIN):
#   BIN=target/release/mcast-bench [NCCL_TESTS_DIR=<built>|NCCL_TESTS_SRC=<source>] bench/run.sh N OUT [MAX]
# MAX (third argument, else $MAX, else 1G) is the largest size (K/M/G), so that a quick run fits
# a time limit. Optional: OPS="all_reduce all_gather" MIN=8K GRAPH_LAUNCHES=20 STEPS="mcast peers"
# (a subset of the steps above, default all; several runs may write into one OUT, and a last one
# with STEPS=compare tables everything there), BACKEND=sim (mcast-bench on the simulator: a dry
# run without a GPU; the steps that need one are skipped with a note).
# A missing piece (no nvcc, no nccl-tests, no torch) is named in OUT/notes.txt and the rest runs.
# Multicast stays off: never create a multicast object on a shared machine; the kill switches the
# machine sets stay set (and are re-asserted for every program started here).
set -uo pipefail
export MCAST_MULTICAST=off NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
usage() {
  echo "usage: bench/run.sh N OUT [MAX]   (N >= 2 GPUs; see the comment at the top)" >&2
  exit 2
}
[[ $# -ge 2 && $# -le 3 ]] || usage
n="$1"
out="$2"
[[ "$n" =~ ^[0-9]+$ && "$n" -ge 2 ]] || usage
max="${3:-${MAX:-1G}}"
min="${MIN:-8K}"
mkdir -p "$out"
bin="${BIN:-target/release/mcast-bench}"
ops="${OPS:-all_reduce all_gather reduce_scatter broadcast}"
graph="${GRAPH_LAUNCHES:-20}"
steps="${STEPS:-roofline first mcast procs nccl peers compare}"
backend="${BACKEND:-cuda}"
devices="$(seq -s, 0 $((n - 1)))"
# NVRTC for the kernels: CUDA's, as scripts/gpu-check finds it, unless MCAST_NVRTC_PATH is set.
if [[ -z "${MCAST_NVRTC_PATH:-}" && "$backend" == cuda ]]; then
  MCAST_NVRTC_PATH="$(ls /usr/local/cuda/lib64/libnvrtc.so.* 2>/dev/null | sort | head -n 1)"
  export MCAST_NVRTC_PATH
fi
note() { echo "run.sh: note: $*" | tee -a "$out/notes.txt" >&2; }
want() { [[ " $steps " == *" $1 "* ]]; }
gpu() { [[ "$backend" == cuda ]]; }
# Byte counts as plain numbers (peers.py takes them so).
bytes() { python3 -c "import sys; v=sys.argv[1].upper(); m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(v[:-1])*m[v[-1]] if v[-1] in m else int(v))" "$1"; }
bytes "$min" >/dev/null 2>&1 && bytes "$max" >/dev/null 2>&1 || { echo "run.sh: MIN $min or MAX $max is not a size" >&2; exit 2; }

echo "$n" >"$out/nranks.txt"
date -u +%Y-%m-%dT%H:%M:%SZ | tee -a "$out/date.txt"
if gpu; then
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$out/gpus.txt" ||
    note "nvidia-smi failed"
  nvidia-smi topo -m >"$out/topo.txt" 2>&1 || true
  have="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
  [[ "${have:-0}" -ge "$n" ]] || note "asked for $n GPUs, nvidia-smi lists ${have:-0}"
fi

# Roofline of GPUs 0 and 1, same run.
if want roofline; then
  if ! gpu; then
    note "backend $backend: no roofline"
  elif command -v nvcc >/dev/null; then
    if nvcc -O3 -std=c++17 -arch=sm_90 bench/p2p_roofline.cu -o "$out/p2p_roofline" 2>"$out/p2p_roofline.build.err"; then
      "$out/p2p_roofline" >"$out/roofline.txt" 2>&1 || note "p2p_roofline failed; the roofline targets are not judged"
    else
      note "nvcc could not build bench/p2p_roofline.cu (see p2p_roofline.build.err)"
    fi
  else
    note "no nvcc: no roofline measured"
  fi
fi

if want first || want mcast || want procs; then
  [[ -x "$bin" ]] || note "no mcast-bench binary at $bin (cargo build --release)"
fi

# First use: process start to the end of one bf16 all-reduce of N ranks, empty kernel cache.
if want first && [[ -x "$bin" ]]; then
  cache="$(mktemp -d)"
  t0=$(date +%s.%N)
  if MCAST_CACHE_DIR="$cache" "$bin" --backend "$backend" --devices "$devices" --op all_reduce --dtype bf16 \
    -b 8K -e 8K -n 1 -w 0 -q >"$out/first_use.out" 2>&1; then
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
    echo "first use (empty kernel cache, process start to exit, $n ranks): $secs s" | tee "$out/first_use.txt"
  else
    note "first-use run failed: $(tail -n 3 "$out/first_use.out" | tr '\n' ' ')"
  fi
  rm -rf "$cache"
fi

# mcast-bench, one process (prefix mcast) and one process per rank (prefix mcast-procs).
bench_mcast() {
  local prefix="$1"
  shift
  for op in $ops; do
    for mode in eager graph; do
      local g=0
      [[ $mode == graph ]] && g="$graph"
      local f="$out/${prefix}_${op}_$mode"
      "$bin" --backend "$backend" "$@" --op "$op" --dtype bf16 -b "$min" -e "$max" -f 2 -G "$g" -q \
        --csv "$f.csv" >"$f.txt" 2>"$f.err" ||
        note "$prefix $op ($mode) failed: $(tail -n 3 "$f.err" | tr '\n' ' ')"
    done
  done
}
if want mcast && [[ -x "$bin" ]]; then
  bench_mcast mcast --devices "$devices"
fi
if want procs && [[ -x "$bin" ]]; then
  bench_mcast mcast-procs --procs "$n"
fi

# nccl-tests -g N, eager and graph.
if want nccl; then
  ntd="${NCCL_TESTS_DIR:-}"
  wheel="$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)"
  if ! gpu; then
    note "backend $backend: nccl-tests skipped"
    ntd=""
  elif [[ -z "$ntd" && -n "${NCCL_TESTS_SRC:-}" ]]; then
    # Build from source against the wheel's NCCL (its lib has libnccl.so.2 only: link through a
    # directory with the libnccl.so name), outside OUT, once per machine.
    work="${TMPDIR:-/tmp}/mcast-nccl-tests"
    if [[ -x "$work/build/all_reduce_perf" ]]; then
      ntd="$work/build"
    elif [[ -z "$wheel" ]] || ! command -v nvcc >/dev/null; then
      note "NCCL_TESTS_SRC given but no nvcc or no nvidia.nccl wheel: nccl-tests skipped"
    else
      rm -rf "$work" && mkdir -p "$work/nccl-home/lib"
      ln -sfn "$wheel/include" "$work/nccl-home/include"
      ln -sf "$(ls "$wheel"/lib/libnccl.so* | head -n 1)" "$work/nccl-home/lib/libnccl.so"
      cp -r "$NCCL_TESTS_SRC" "$work/src"
      if make -C "$work/src" -j "$(nproc)" MPI=0 NCCL_HOME="$work/nccl-home" \
        CUDA_HOME="$(dirname "$(dirname "$(command -v nvcc)")")" \
        NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" BUILDDIR="$work/build" >"$out/nccl-tests-build.log" 2>&1; then
        ntd="$work/build"
      else
        note "nccl-tests build failed: $(tail -n 3 "$out/nccl-tests-build.log" | tr '\n' ' ')"
      fi
    fi
  fi
  if [[ -n "$ntd" && -d "$ntd" ]]; then
    [[ -n "$wheel" ]] && export LD_LIBRARY_PATH="$wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    for op in $ops; do
      exe="$ntd/${op}_perf"
      if [[ ! -x "$exe" ]]; then
        note "no $exe"
        continue
      fi
      for mode in eager graph; do
        g=0
        [[ $mode == graph ]] && g="$graph"
        redop=()
        [[ $op == all_reduce || $op == reduce_scatter ]] && redop=(-o sum)
        "$exe" -b "$min" -e "$max" -f 2 -g "$n" -d bfloat16 "${redop[@]}" -n 20 -w 5 -c 1 -G "$g" \
          >"$out/nccl_${op}_$mode.txt" 2>&1 ||
          note "nccl-tests $op ($mode) failed: $(tail -n 3 "$out/nccl_${op}_$mode.txt" | tr '\n' ' ')"
      done
    done
  elif gpu; then
    note "neither NCCL_TESTS_DIR (built binaries) nor NCCL_TESTS_SRC (source) usable: nccl-tests skipped"
  fi
fi

# PyTorch: NCCL and symmetric memory, eager and graph, one process per GPU. One CSV per op set, so
# that split runs do not overwrite each other.
if want peers; then
  if ! gpu; then
    note "backend $backend: PyTorch peers skipped"
  elif python3 -c 'import torch, torch.distributed' 2>/dev/null && command -v torchrun >/dev/null; then
    csv="$out/peers_$(echo $ops | tr ' ' '-').csv"
    PYTHONUNBUFFERED=1 torchrun --nproc_per_node="$n" bench/peers.py --min-bytes "$(bytes "$min")" \
      --max-bytes "$(bytes "$max")" --ops "$(echo $ops | tr ' ' ',')" --modes eager,graph --out "$csv" \
      2>"$out/peers.err" || note "bench/peers.py failed: $(tail -n 5 "$out/peers.err" | tr '\n' ' ')"
    # It writes its CSV before tearing down; a failure after that leaves the measurements.
    grep 'peers: note' "$out/peers.err" >>"$out/notes.txt" 2>/dev/null || true
  else
    note "no torch/torchrun: the PyTorch peers are skipped"
  fi
fi

if want compare; then
  python3 bench/compare.py --dir "$out" --nranks "$n" --md "$out/table.md"
  python3 bench/plot.py --dir "$out" --nranks "$n" --out "$out/plots" ||
    note "bench/plot.py failed (matplotlib missing?): the tables stand without plots"
fi
echo "run.sh: results in $out (table.md, plots/, notes.txt)" >&2
