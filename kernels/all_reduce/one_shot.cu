// kernels/all_reduce/one_shot.cu: the one-shot all-reduce (every rank pulls every peer's data) and
// its entry points mcast_all_reduce_p2p_<dtype>_<op>.

// One-shot all-reduce, in rounds of gthreads()*UNROLL vectors (block 0 also takes the scalars, one
// per thread per round): each round loads and reduces every rank's values into registers in rank
// order, barriers, then stores this rank's copy. In place is safe because no rank stores before
// every rank has loaded; the barrier before the last stores is the exit barrier (nobody reads this
// rank's copy after it). Barriers are per block slot, so block 0 may run more rounds than others.
template <int D, int O>
__device__ void all_reduce_p2p_oneshot(const McastArgs& a) {
  typedef typename Ty<D>::E E;
  const Range r = split(a.data[0], a.count, sizeof(E), same_alignment(a));
  u32 bi = 0;
  if (!barrier<false>(a, bi++)) return;
  const u64 T = gthreads();
  const u64 per_round = T * MCAST_UNROLL;
  const u64 nscalar = r.head + r.tail;
  u64 rounds = (r.nv + per_round - 1) / per_round;
  if (blockIdx.x == 0) {
    const u64 s = (nscalar + blockDim.x - 1) / blockDim.x;
    if (s > rounds) rounds = s;
  }
  for (u64 rd = 0; rd < rounds; ++rd) {
    u64 off[MCAST_UNROLL];
    int n = 0;
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u) {
      const u64 j = rd * per_round + (u64)u * T + gtid();
      off[u] = r.head * sizeof(E) + j * 16;
      if (j < r.nv) n = u + 1;
    }
    V16 res[MCAST_UNROLL];
    p2p_reduce_vectors<D, O>(a, off, n, res);
    const u64 si = rd * blockDim.x + threadIdx.x;
    const bool has = blockIdx.x == 0 && si < nscalar;
    E s = E();
    u64 soff = 0;
    if (has) {
      soff = scalar_off(r, si, sizeof(E));
      s = p2p_reduce_scalar<D, O>(a, soff);
    }
    if (!barrier<false>(a, bi++)) return;
    if (has) *(E*)(a.out[a.rank] + soff) = s;
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u)
      if (u < n) st16(a.out[a.rank] + off[u], res[u]);
  }
}

#define ALL_REDUCE_ONE_SHOT(DN, D, ON, O)                              \
  MCAST_WHEN(MCAST_SEL_all_reduce, MCAST_SEL_##DN, MCAST_SEL_##ON)( \
      KERNEL mcast_all_reduce_p2p_##DN##_##ON(ARGS) { MCAST_ENTRY; all_reduce_p2p_oneshot<D, O>(a); })
MCAST_EACH_REDUCTION(ALL_REDUCE_ONE_SHOT)
