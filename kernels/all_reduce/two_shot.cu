// kernels/all_reduce/two_shot.cu: the two-shot all-reduce (reduce-scatter, then all-gather, by
// pulls) and its entry points mcast_all_reduce_p2p_twoshot_<dtype>_<op>.

// Two-shot all-reduce: entry barrier; reduce-scatter (rank q owns vectors [nv*q/N, nv*(q+1)/N),
// rank 0 also owns the scalars) by peer loads of data into the owner's out; barrier; all-gather
// by loads from the owners' out; exit barrier (so no rank changes its copy while a peer still reads it).
// Vector j of a slice is handled by the same global thread in both phases on every rank, so the
// per-block-slot middle barrier covers exactly the data each block reads.
template <int D, int O>
__device__ void all_reduce_p2p_twoshot(const McastArgs& a) {
  typedef typename Ty<D>::E E;
  const Range r = split(a.data[0], a.count, sizeof(E), same_alignment(a));
  const u64 N = a.nranks, me = a.rank, base = r.head * sizeof(E), nscalar = r.head + r.tail;
  if (!barrier<false>(a, 0)) return;
  p2p_reduce_span<D, O>(a, base, r.nv * me / N, r.nv * (me + 1) / N);
  if (me == 0 && blockIdx.x == 0)
    for (u64 i = threadIdx.x; i < nscalar; i += blockDim.x) {
      const u64 o = scalar_off(r, i, sizeof(E));
      *(E*)(a.out[0] + o) = p2p_reduce_scalar<D, O>(a, o);
    }
  if (!barrier<false>(a, 1)) return;
  // The owners' slices in the walk order of peer_at (every owner serves one reader per step).
  for (u32 i = 0; i + 1 < N; ++i) {
    const u64 q = peer_at(a, i);
    copy_span(a.out[me], a.out[q], base, r.nv * q / N, r.nv * (q + 1) / N);
  }
  if (me != 0 && blockIdx.x == 0)
    for (u64 i = threadIdx.x; i < nscalar; i += blockDim.x) {
      const u64 o = scalar_off(r, i, sizeof(E));
      *(E*)(a.out[me] + o) = *(const E*)(a.out[0] + o);
    }
  barrier<false>(a, 2);
}

#define ALL_REDUCE_TWO_SHOT(DN, D, ON, O)                              \
  MCAST_WHEN(MCAST_SEL_all_reduce, MCAST_SEL_##DN, MCAST_SEL_##ON)( \
      KERNEL mcast_all_reduce_p2p_twoshot_##DN##_##ON(ARGS) { all_reduce_p2p_twoshot<D, O>(a); })
MCAST_EACH_REDUCTION(ALL_REDUCE_TWO_SHOT)
