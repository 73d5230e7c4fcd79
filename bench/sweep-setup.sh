# Sourced by bench/ll-sweep.sh and bench/ce-sweep.sh: the kill switches, the arguments (OUT
# DEVICES, $BIN, $BACKEND), the run's date and GPUs in OUT, and `wrong`, which turns mcast-bench's
# output into its #wrong column (exit 1 where any is not 0 or the run failed).
export MCAST_MULTICAST=off NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out="${1:-$default_out}"
devices="${2:-0,1}"
bin="${BIN:-target/release/mcast-bench}"
backend="${BACKEND:-cuda}" # sim: to try a script itself without a GPU
mkdir -p "$out"
date -u +%Y-%m-%dT%H:%M:%SZ | tee "$out/date.txt"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>/dev/null | tee "$out/gpus.txt"
status=0
wrong() { awk '/^ +[0-9]/ {w = w " " $NF; if ($NF != 0) bad = 1} /mcast-bench:/ {w = w " ERROR: " $0; bad = 1}
               END {print w; exit bad}'; }
first="${devices%%,*}"
