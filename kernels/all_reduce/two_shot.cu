// kernels/all_reduce/two_shot.cu: the two-shot all-reduce (a reduce-scatter by loads whose results
// are pushed to every rank) and its entry points mcast_all_reduce_p2p_twoshot_<dtype>_<op>.

// Two-shot all-reduce: entry barrier; rank q owns vectors [nv*q/N, nv*(q+1)/N) (rank 0 also the
// scalars), reduces them by loads of every rank's data and stores the result into every rank's out
// (the all-gather half as pushes, peers in the walk order of peer_at); exit barrier, whose release
// carries each block's stores to its peers, so every rank's out is whole when its kernel ends.
// Between the two barriers vector j of every rank's data and out is touched by one thread only:
// the owner's global thread (j - lo) % gthreads(), which loads it from every rank before it stores
// it anywhere. So in place is safe with no barrier between the halves, and the halves overlap:
// a thread's stores drain while it loads its next vectors.
template <int D, int O>
__device__ void all_reduce_p2p_twoshot(const McastArgs& a) {
  typedef typename Ty<D>::E E;
  const Range r = split(a.data[0], a.count, sizeof(E), same_alignment(a));
  const u64 N = a.nranks, me = a.rank, base = r.head * sizeof(E), nscalar = r.head + r.tail;
  if (!barrier<false>(a, 0)) return;
  p2p_reduce_span<D, O, true>(a, base, r.nv * me / N, r.nv * (me + 1) / N);
  if (me == 0 && blockIdx.x == 0)
    for (u64 i = threadIdx.x; i < nscalar; i += blockDim.x) {
      const u64 o = scalar_off(r, i, sizeof(E));
      const E x = p2p_reduce_scalar<D, O>(a, o);
      for (u32 q = 0; q < N; ++q) *(E*)(a.out[q] + o) = x;
    }
  barrier<false>(a, 1);
}

#define ALL_REDUCE_TWO_SHOT(DN, D, ON, O)                              \
  MCAST_WHEN(MCAST_SEL_all_reduce, MCAST_SEL_##DN, MCAST_SEL_##ON)( \
      KERNEL mcast_all_reduce_p2p_twoshot_##DN##_##ON(ARGS) { MCAST_ENTRY; all_reduce_p2p_twoshot<D, O>(a); })
MCAST_EACH_REDUCTION(ALL_REDUCE_TWO_SHOT)
