// kernels/layout.cuh: how a range is cut (head units, 16-byte vectors, tail units) and the loops
// the collectives share: P2P reduce and copy of a span, and the multicast push of a range.

// A range of n units of `unit` bytes at `addr` = head units (before the first 16-byte boundary),
// nv 16-byte vectors, tail units. If `aligned` is false (ranks disagree on alignment modulo 16 or
// the address is not unit-aligned), everything is scalar (head = n).
struct Range {
  u64 head, nv, tail;
};
__device__ __forceinline__ Range split(u64 addr, u64 n, u32 unit, bool aligned) {
  Range r;
  if (!aligned || (addr % unit) != 0) {
    r.head = n;
    r.nv = 0;
    r.tail = 0;
    return r;
  }
  u64 h = ((16 - (addr & 15)) & 15) / unit;
  if (h > n) h = n;
  const u64 rest = (n - h) * unit;
  r.head = h;
  r.nv = rest / 16;
  r.tail = (rest % 16) / unit;
  return r;
}
__device__ __forceinline__ bool same_alignment(const McastArgs& a) {
  u32 m = 0;
  for (u32 p = 0; p < a.nranks; ++p) m |= (u32)(((a.data[p] ^ a.data[0]) | (a.out[p] ^ a.data[0])) & 15);
  return m == 0;
}
// The rank a rank visits at step i (0 <= i < nranks) when it walks the team: rank r takes r + 1,
// r + 2, ... (mod nranks) and itself last, so that at every step each rank reads from (or writes
// to) a different peer and every GPU's NVLink egress is busy (in rank order every rank would
// read rank 0 first, then rank 1, ...: one GPU serving nranks - 1 readers while the others
// idle). Only copies and loads issued before a reduction take this order; reductions stay in
// rank order, so every rank's result is bit-identical.
__device__ __forceinline__ u32 peer_at(const McastArgs& a, u32 i) {
  const u32 q = a.rank + 1 + i;
  return q >= a.nranks ? q - a.nranks : q;
}
__device__ __forceinline__ u64 gtid() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ u64 gthreads() { return (u64)gridDim.x * blockDim.x; }

// ============================== P2P building blocks ==============================
// Reduce element i (scalar) of range at byte offset `off` over all ranks, in rank order 0..N-1.
template <int D, int O>
__device__ __forceinline__ typename Ty<D>::E p2p_reduce_scalar(const McastArgs& a, u64 off) {
  typedef typename Ty<D>::E E;
  typename Ty<D>::A acc = Ty<D>::up(*(const E*)(a.data[0] + off));
  for (u32 p = 1; p < a.nranks; ++p) acc = Op<O>::f(acc, Ty<D>::up(*(const E*)(a.data[p] + off)));
  return Ty<D>::down(acc);
}

// Reduce up to MCAST_UNROLL vectors (byte offsets off[u], valid where u < n) over all ranks in rank
// order, loads too (loading every rank's values at once in the walk order of peer_at would need
// them all in registers: at 512 threads it spilled, up to 7 KB per thread in the two-shot, by
// ptxas -v). Software-pipelined: the loads of rank p + 1 are in flight while rank p's are reduced, so
// two ranks' latencies (one of them remote) overlap instead of adding up.
template <int D, int O>
__device__ __forceinline__ void p2p_reduce_vectors(const McastArgs& a, const u64* off, int n, V16* out) {
  Vec<D> acc[MCAST_UNROLL];
  V16 cur[MCAST_UNROLL], nxt[MCAST_UNROLL];
#pragma unroll
  for (int u = 0; u < MCAST_UNROLL; ++u)
    if (u < n) cur[u] = ld16(a.data[0] + off[u]);
  if (a.nranks > 1) {
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u)
      if (u < n) nxt[u] = ld16(a.data[1] + off[u]);
  }
#pragma unroll
  for (int u = 0; u < MCAST_UNROLL; ++u)
    if (u < n) acc[u].load(cur[u]);
  for (u32 p = 1; p < a.nranks; ++p) {
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u) cur[u] = nxt[u];
    if (p + 1 < a.nranks) {
#pragma unroll
      for (int u = 0; u < MCAST_UNROLL; ++u)
        if (u < n) nxt[u] = ld16(a.data[p + 1] + off[u]);
    }
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u)
      if (u < n) acc[u].template reduce<O>(cur[u]);
  }
#pragma unroll
  for (int u = 0; u < MCAST_UNROLL; ++u)
    if (u < n) out[u] = acc[u].pack();
}

// Reduce vectors [lo, hi) (vector indices relative to byte `base`) from all ranks into out[rank],
// or with ALL into every rank's out (peers in the walk order of peer_at, this rank's last: each
// rank's stores go to a different peer at a time). Vector j is handled by global thread
// (j - lo) % gthreads(): the same on every rank.
template <int D, int O, bool ALL = false>
__device__ void p2p_reduce_span(const McastArgs& a, u64 base, u64 lo, u64 hi) {
  const u64 T = gthreads();
  for (u64 j0 = lo + gtid(); j0 < hi; j0 += T * MCAST_UNROLL) {
    u64 off[MCAST_UNROLL];
    int n = 0;
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u) {
      const u64 j = j0 + (u64)u * T;
      off[u] = base + j * 16;
      if (j < hi) n = u + 1;
    }
    V16 r[MCAST_UNROLL];
    p2p_reduce_vectors<D, O>(a, off, n, r);
    for (u32 i = ALL ? 0 : a.nranks - 1; i < a.nranks; ++i) {
      const u64 dst = a.out[peer_at(a, i)];
#pragma unroll
      for (int u = 0; u < MCAST_UNROLL; ++u)
        if (u < n) st16(dst + off[u], r[u]);
    }
  }
}

// Move vectors [lo, hi) (16 bytes each, numbered from the byte addresses src and dst): vector j
// by global thread (j - lo) % gthreads() (the indexing of p2p_reduce_span), MCAST_UNROLL loads
// (ld(src + 16j) -> V16) in flight before their stores (st(dst + 16j, V16)).
template <class Ld, class St>
__device__ __forceinline__ void move_vectors(u64 src, u64 dst, u64 lo, u64 hi, Ld ld, St st) {
  const u64 T = gthreads();
  for (u64 j0 = lo + gtid(); j0 < hi; j0 += T * MCAST_UNROLL) {
    V16 v[MCAST_UNROLL];
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u) {
      const u64 j = j0 + (u64)u * T;
      if (j < hi) v[u] = ld(src + j * 16);
    }
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u) {
      const u64 j = j0 + (u64)u * T;
      if (j < hi) st(dst + j * 16, v[u]);
    }
  }
}

// Vectors [lo, hi) numbered from byte address src, each loaded once (MCAST_UNROLL in flight) and
// stored at dst(i) + 16j for every i < n where dst(i) is not 0 (same indexing as
// p2p_reduce_span): one block of data pushed to several ranks.
template <class Dst>
__device__ __forceinline__ void fan_out_vectors(u64 src, u64 lo, u64 hi, u32 n, Dst dst) {
  const u64 T = gthreads();
  for (u64 j0 = lo + gtid(); j0 < hi; j0 += T * MCAST_UNROLL) {
    V16 v[MCAST_UNROLL];
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u) {
      const u64 j = j0 + (u64)u * T;
      if (j < hi) v[u] = ld16(src + j * 16);
    }
    for (u32 i = 0; i < n; ++i) {
      const u64 to = dst(i);
      if (to == 0) continue;
#pragma unroll
      for (int u = 0; u < MCAST_UNROLL; ++u) {
        const u64 j = j0 + (u64)u * T;
        if (j < hi) st16(to + j * 16, v[u]);
      }
    }
  }
}

// Copy vectors [lo, hi) at byte `base` from src to dst (same indexing as p2p_reduce_span).
__device__ void copy_span(u64 dst, u64 src, u64 base, u64 lo, u64 hi) {
  move_vectors(src + base, dst + base, lo, hi, [](u64 p) { return ld16(p); }, [](u64 p, V16 v) { st16(p, v); });
}

// Copy the head and tail bytes of r (a range of bytes: split with unit 1) from src to dst, by the
// calling block's threads; the vectors between are the caller's.
__device__ __forceinline__ void copy_edges(u64 dst, u64 src, const Range& r) {
  for (u64 i = threadIdx.x; i < r.head; i += blockDim.x) *(unsigned char*)(dst + i) = *(const unsigned char*)(src + i);
  const u64 t0 = r.head + r.nv * 16;
  for (u64 i = threadIdx.x; i < r.tail; i += blockDim.x)
    *(unsigned char*)(dst + t0 + i) = *(const unsigned char*)(src + t0 + i);
}

// Copy n bytes from src to dst (any alignment; vectors where both agree modulo 16). Head and tail
// bytes are done by block 0.
__device__ void copy_bytes(u64 dst, u64 src, u64 n) {
  const Range r = split(dst, n, 1, ((dst ^ src) & 15) == 0);
  if (blockIdx.x == 0) copy_edges(dst, src, r);
  copy_span(dst, src, r.head, 0, r.nv);
}

// Byte offset of scalar i of a range laid out as head units, nv vectors, tail units.
__device__ __forceinline__ u64 scalar_off(const Range& r, u64 i, u32 unit) {
  return (i < r.head ? i : i + r.nv * (16 / unit)) * unit;
}

// multimem.st of this rank's data bytes [off, off + n) (n and off multiples of 4) to every rank's
// out.
__device__ void mc_push(const McastArgs& a, u64 off, u64 n) {
  const Range r = split(a.out_mc + off, n / 4, 4, true);
  const u64 src = a.data[a.rank] + off + r.head * 4, dst = a.out_mc + off + r.head * 4;
  move_vectors(src, dst, 0, r.nv, [](u64 p) { return ld16(p); }, [&](u64 p, V16 v) { mc_st_v16(a, p, v); });
  if (blockIdx.x == 0)
    for (u64 i = threadIdx.x; i < r.head + r.tail; i += blockDim.x) {
      const u64 o = off + scalar_off(r, i, 4);
      mc_st_unit<4>(a, a.out_mc + o, *(const u32*)(a.data[a.rank] + o));
    }
}
