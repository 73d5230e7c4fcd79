// kernels/broadcast/scatter.cu: the broadcast as scatter then all-gather, pipelined by chunks, and
// its entry point mcast_broadcast_p2p_scatter.

// Broadcast, teams of three or more, large messages (the plan's choice: src/kernels/abi/plan/
// broadcast.rs, from broadcast_scatter_min_bytes in plan/cost.rs): scatter then all-gather,
// pipelined by chunks. The one-pull form has every rank read the whole message from the root, whose
// NVLink egress then carries it N - 1 times; here it carries it once. The message's 16-byte vectors
// are cut into K chunks of C vectors (bcast_chunk_vectors), each chunk into N - 1 slices owned by
// the ranks other than the root (slice s of a chunk: the rank in row s of writer_row(root, .)). In
// round k (0..K) a rank other than the root pulls its slice of chunk k from the root's data into
// its out, and the other owners' slices of chunk k - 1 from their outs (peers in the walk order of
// peer_at), then all ranks pass a barrier; so each round moves one chunk into every rank, every
// rank's egress serving one slice to each of the others at once. The head and tail bytes come from
// the root in round 0 (block 0); the root, out of place, copies its message into its own out (no
// rank reads it). Vector j of a slice is moved by the same global thread in both rounds that touch
// it, on every rank (copy_span), so the per-block-slot barrier covers exactly the data each block
// reads. The last barrier is the exit barrier: no rank changes its copy while a peer reads. Where
// the ranks' buffers disagree modulo 16, it runs as broadcast_p2p (every rank alike).
#define MCAST_BCAST_CHUNK_MIN 4194304
#define MCAST_BCAST_ROUNDS_MAX 16
__device__ __forceinline__ u64 bcast_chunk_vectors(u64 count) {
  const u64 c = (count / MCAST_BCAST_ROUNDS_MAX + 15) / 16, floor = MCAST_BCAST_CHUNK_MIN / 16;
  return c > floor ? c : floor;
}
// Vectors [lo, hi) of slice s (of m) of chunk k (chunks of C vectors of nv).
__device__ __forceinline__ void bcast_slice(u64 nv, u64 C, u64 k, u32 s, u32 m, u64* lo, u64* hi) {
  const u64 c0 = k * C, len = nv - c0 < C ? nv - c0 : C;
  *lo = c0 + len * s / m;
  *hi = c0 + len * (s + 1) / m;
}
__device__ void broadcast_p2p_scatter(const McastArgs& a) {
  const u32 N = a.nranks, me = a.rank, root = a.root;
  if (N < 3 || !same_alignment(a)) {
    broadcast_p2p(a);
    return;
  }
  const u64 src = a.data[root], dst = a.out[me];
  const Range r = split(src, a.count, 1, true);
  const u64 C = bcast_chunk_vectors(a.count), K = (r.nv + C - 1) / C;
  if (!barrier<false>(a, 0)) return;
  if (me == root) {
    if (dst != src) copy_bytes(dst, src, a.count);
  } else if (blockIdx.x == 0) {
    const u64 t0 = r.head + r.nv * 16;
    for (u64 i = threadIdx.x; i < r.head; i += blockDim.x) *(unsigned char*)(dst + i) = *(const unsigned char*)(src + i);
    for (u64 i = threadIdx.x; i < r.tail; i += blockDim.x)
      *(unsigned char*)(dst + t0 + i) = *(const unsigned char*)(src + t0 + i);
  }
  for (u64 k = 0; k <= K; ++k) {
    if (me != root) {
      u64 lo, hi;
      if (k < K) {
        bcast_slice(r.nv, C, k, writer_row(root, me), N - 1, &lo, &hi);
        copy_span(dst, src, r.head, lo, hi);
      }
      if (k > 0)
        for (u32 i = 0; i + 1 < N; ++i) {
          const u32 q = peer_at(a, i);
          if (q == root) continue;
          bcast_slice(r.nv, C, k - 1, writer_row(root, q), N - 1, &lo, &hi);
          copy_span(dst, a.out[q], r.head, lo, hi);
        }
    }
    if (!barrier<false>(a, (u32)k + 1)) return;
  }
}

MCAST_WHEN(MCAST_SEL_broadcast, 1, 1)(
    KERNEL mcast_broadcast_p2p_scatter(ARGS) { broadcast_p2p_scatter(a); })
