// kernels/all_gather/push.cu: the all-gather by pushes (every rank stores its block into every
// rank's out) and its entry point mcast_all_gather_p2p_push.

// All-gather (push): after the entry barrier (every peer is in this call, so its out is free),
// rank r stores its block (count bytes at r*count of its data) into every rank's out at
// r*out_stride, peers in the walk order of peer_at (r + 1 first, its own out last, skipped in
// place); the exit barrier's release carries the stores, so every rank's out is whole when its
// kernel ends. Each vector is loaded once and stored to every rank. NVLink carries SM pushes
// faster than pulls (362-366 against 337 GB/s on 2 x H200, shared/reference/p2p-roofline.md). It
// needs every out to be its rank's result: the plan runs the pull (pull.cu) where the outs of
// the peers are not (the pointer form's staged route, out_stride set).
__device__ void all_gather_p2p_push(const McastArgs& a) {
  if (!barrier<false>(a, 0)) return;
  const u32 N = a.nranks, me = a.rank;
  const u64 src = a.data[me] + (u64)me * a.count, off = (u64)me * out_stride(a);
  u64 m = 0;
  for (u32 q = 0; q < N; ++q) m |= (a.out[q] + off) ^ src;
  if ((m & 15) != 0) {
    // Some rank's out disagrees with this block modulo 16: byte-exact copies, one per rank.
    for (u32 i = 0; i < N; ++i) {
      const u64 dst = a.out[peer_at(a, i)] + off;
      if (dst != src) copy_bytes(dst, src, a.count);
    }
    barrier<false>(a, 1);
    return;
  }
  const Range r = split(src, a.count, 1, true);
  fan_out_vectors(src + r.head, 0, r.nv, N, [&](u32 i) {
    const u64 dst = a.out[peer_at(a, i)] + off;
    return dst == src ? 0 : dst + r.head;
  });
  if (blockIdx.x == 0)
    for (u32 q = 0; q < N; ++q) {
      const u64 dst = a.out[q] + off;
      if (dst != src) copy_edges(dst, src, r);
    }
  barrier<false>(a, 1);
}

MCAST_WHEN(MCAST_SEL_all_gather, 1, 1)(
    KERNEL mcast_all_gather_p2p_push(ARGS) { MCAST_ENTRY; all_gather_p2p_push(a); })
