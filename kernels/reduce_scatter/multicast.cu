// kernels/reduce_scatter/multicast.cu: the multicast reduce-scatter (multimem.ld_reduce) and its
// entry points mcast_reduce_scatter_mc_<dtype>_<op>.

// Reduce-scatter: rank r reduces all of block r with ld_reduce and stores it to its own out.
template <int D, int O>
__device__ void reduce_scatter_mc(const McastArgs& a) {
  typedef typename Ty<D>::E E;
  const u32 U = McUnit<D>::bytes;
  const u64 blk = (u64)a.rank * a.count * sizeof(E);
  const Range r = split(a.data_mc + blk, a.count * sizeof(E) / U, U, true);
  const u64 mbase = a.data_mc + blk + r.head * U, lbase = a.out[a.rank] + blk + r.head * U;
  if (!barrier<true>(a, 0)) return;
  move_vectors(mbase, lbase, 0, r.nv, [&](u64 p) { return mc_ld_reduce_v16<D, O>(a, p); },
               [](u64 p, V16 v) { st16(p, v); });
  if (blockIdx.x == 0)
    for (u64 i = threadIdx.x; i < r.head + r.tail; i += blockDim.x) {
      const u64 o = blk + scalar_off(r, i, U);
      const u64 bits = mc_ld_reduce_unit<D, O>(a, a.data_mc + o);
      if (U == 8)
        *(u64*)(a.out[a.rank] + o) = bits;
      else
        *(u32*)(a.out[a.rank] + o) = (u32)bits;
    }
  barrier<true>(a, 1);
}

#define REDUCE_SCATTER_MC(DN, D, ON, O)                                  \
  MCAST_WHEN(MCAST_SEL_reduce_scatter, MCAST_SEL_##DN, MCAST_SEL_##ON)( \
      KERNEL mcast_reduce_scatter_mc_##DN##_##ON(ARGS) { MCAST_ENTRY; reduce_scatter_mc<D, O>(a); })
MCAST_EACH_MULTIMEM_REDUCTION(REDUCE_SCATTER_MC)
