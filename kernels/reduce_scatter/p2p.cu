// kernels/reduce_scatter/p2p.cu: the reduce-scatter by pulls (every rank reduces its own block from
// every peer's data) and its entry points mcast_reduce_scatter_p2p_<dtype>_<op>.

// Reduce-scatter: rank r reduces block r (at r*count*esize) from every rank into its own out.
template <int D, int O>
__device__ void reduce_scatter_p2p(const McastArgs& a) {
  typedef typename Ty<D>::E E;
  const u64 blk = (u64)a.rank * a.count * sizeof(E);
  const Range r = split(a.data[0] + blk, a.count, sizeof(E), same_alignment(a));
  if (!barrier<false>(a, 0)) return;
  p2p_reduce_span<D, O>(a, blk + r.head * sizeof(E), 0, r.nv);
  if (blockIdx.x == 0)
    for (u64 i = threadIdx.x; i < r.head + r.tail; i += blockDim.x) {
      const u64 o = blk + scalar_off(r, i, sizeof(E));
      *(E*)(a.out[a.rank] + o) = p2p_reduce_scalar<D, O>(a, o);
    }
  barrier<false>(a, 1);
}

#define REDUCE_SCATTER_P2P(DN, D, ON, O)                                 \
  MCAST_WHEN(MCAST_SEL_reduce_scatter, MCAST_SEL_##DN, MCAST_SEL_##ON)( \
      KERNEL mcast_reduce_scatter_p2p_##DN##_##ON(ARGS) { MCAST_ENTRY; reduce_scatter_p2p<D, O>(a); })
MCAST_EACH_REDUCTION(REDUCE_SCATTER_P2P)
