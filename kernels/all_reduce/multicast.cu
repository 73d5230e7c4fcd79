// kernels/all_reduce/multicast.cu: the multicast all-reduce (multimem.ld_reduce, multimem.st) and
// its entry points mcast_all_reduce_mc_<dtype>_<op>.

// All-reduce: entry barrier; rank r reduces its 1/N slice of the 16-byte vectors (ld_reduce of
// data, then multimem.st to every rank's out), rank 0 also the head/tail units; exit barrier.
template <int D, int O>
__device__ void all_reduce_mc(const McastArgs& a) {
  typedef typename Ty<D>::E E;
  const u32 U = McUnit<D>::bytes;
  const Range r = split(a.data_mc, a.count * sizeof(E) / U, U, true);
  const u64 N = a.nranks, me = a.rank, base = a.data_mc + r.head * U, obase = a.out_mc + r.head * U;
  if (!barrier<true>(a, 0)) return;
  move_vectors(base, obase, r.nv * me / N, r.nv * (me + 1) / N,
               [&](u64 p) { return mc_ld_reduce_v16<D, O>(a, p); }, [&](u64 p, V16 v) { mc_st_v16(a, p, v); });
  if (me == 0 && blockIdx.x == 0)
    for (u64 i = threadIdx.x; i < r.head + r.tail; i += blockDim.x) {
      const u64 o = scalar_off(r, i, U);
      mc_st_unit<U>(a, a.out_mc + o, mc_ld_reduce_unit<D, O>(a, a.data_mc + o));
    }
  barrier<true>(a, 1);
}

#define ALL_REDUCE_MC(DN, D, ON, O)                                  \
  MCAST_WHEN(MCAST_SEL_all_reduce, MCAST_SEL_##DN, MCAST_SEL_##ON)( \
      KERNEL mcast_all_reduce_mc_##DN##_##ON(ARGS) { MCAST_ENTRY; all_reduce_mc<D, O>(a); })
MCAST_EACH_MULTIMEM_REDUCTION(ALL_REDUCE_MC)
