#!/usr/bin/env bash
# The comparison of calls across NVLink domains with a stream-ordered engine (the real NCCL on
# the rails): two mcast-bench builds, A and B with the check on and C = B with the check off
# (MCAST_CHECK_CALLS=off), in the order A B C A B C on one warm machine. B - A is the change,
# B - C what the comparison costs. Two NVLink domains on one two-GPU host, one rank each: rank 0
# on GPU 0 (MCAST_DOMAIN=A), rank 1 on GPU 1 (B). (Two processes sharing a GPU, as in
# bench/run-two-domains.sh's four-rank runs, take turns on it in slices of about 2 ms, which
# hides any microsecond.) The rails run on NVLink (NCCL's P2P path, the fastest rail there is, where a per-call cost shows
# most) and on sockets over lo (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, NCCL's network path, as
# between hosts). bf16 all-reduce, 8 B to 32 KiB, eager and from CUDA graphs.
#   bench/check-across-ab.sh BIN_A BIN_B OUT
# Multicast stays off (the safety rule).
set -uo pipefail
export MCAST_MULTICAST=off NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
a="$1" b="$2" out="$3"
mkdir -p "$out"
nccl="$("$(dirname "$0")/../scripts/find-nccl")"
echo "NCCL: $nccl" | tee "$out/nccl.txt"
export MCAST_NET_NCCL="$nccl" NCCL_SOCKET_IFNAME=lo MCAST_SOCKET_IFNAME=lo
if [ -z "${MCAST_NVRTC_PATH:-}" ]; then
  MCAST_NVRTC_PATH="$(ls /usr/local/cuda/lib64/libnvrtc.so.* 2>/dev/null | sort | head -n 1)"
  export MCAST_NVRTC_PATH
fi
common=(--backend cuda --procs 2 --visible 0,1 --domains A,B --net nccl --op all_reduce -d bf16
  -b 8 -e 32K -f 8 -q)
for rails in nvlink socket; do
  extra=()
  [ "$rails" = socket ] && extra=(env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)
  for round in 1 2; do
    for which in A B C; do
      bin="$a" check=on
      [ "$which" != A ] && bin="$b"
      [ "$which" = C ] && check=off
      for mode in eager graph; do
        g=0 n=(-n 50 -w 10)
        [ "$mode" = graph ] && g=20 n=(-n 10 -w 3)
        MCAST_CHECK_CALLS=$check timeout 300 "${extra[@]}" "$bin" "${common[@]}" -G "$g" "${n[@]}" \
          >"$out/$which${round}_${rails}_$mode.txt" 2>&1
        echo "$which$round $rails $mode: exit $?"
      done
    done
  done
done
"$(dirname "$0")/abc-table.sh" "$out" nvlink_eager nvlink_graph socket_eager socket_graph
