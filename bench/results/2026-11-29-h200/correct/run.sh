#!/usr/bin/env bash
# Correctness of every collective, form and layout on one GPU shared by teams of N ranks, eager and
# from graphs, 1000 B - 32 MB, with the build at HEAD.
export MCAST_MULTICAST=off NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export MCAST_NVRTC_PATH="$(ls /usr/local/cuda/lib64/libnvrtc.so.* 2>/dev/null | sort | head -n 1)"
export MCAST_CACHE_DIR=/tmp/mcast-cache MCAST_TIMEOUT_MS=30000
mkdir -p /tmp/mcast-cache && chmod 700 /tmp/mcast-cache
bin=.dev/bins/M
out=$OUT/c; mkdir -p $out
for n in 4 8 2 3; do
  devs=$(python3 -c "print(','.join(['0']*$n))")
  for op in all_reduce all_gather reduce_scatter broadcast; do
    for mem in buffer pointer; do
      for ip in 1 0; do
        for g in 0 2; do
          tag="n${n}_${op}_${mem}_ip${ip}_g${g}"
          gflag=(); [ "$g" = 0 ] || gflag=(-G $g)
          timeout 60 $bin --backend cuda --devices $devs --op $op --memory $mem --inplace $ip -d bf16 \
            -b 1000 -e 32M -f 8 -n 2 -w 1 -c 1 "${gflag[@]}" > $out/$tag.txt 2>&1
          echo "$tag exit $?" >> $out/exit-codes.txt
          [ $SECONDS -gt 540 ] && break 5
        done
      done
    done
  done
done
echo "runs: $(wc -l < $out/exit-codes.txt), failed: $(grep -vc 'exit 0' $out/exit-codes.txt), wrong: $(cat $out/n*.txt | awk '/^# wrong elements/{w+=$4} END{print w+0}'), seconds $SECONDS"
cd $OUT && tar czf c.tgz c
