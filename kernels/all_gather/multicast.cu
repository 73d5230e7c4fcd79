// kernels/all_gather/multicast.cu: the multicast all-gather (each rank's multimem.st of its block)
// and its entry point mcast_all_gather_mc.

// All-gather: rank r multimem.st's its block (count bytes at r*count) into every rank's copy.
__device__ void all_gather_mc(const McastArgs& a) {
  if (!barrier<true>(a, 0)) return;
  mc_push(a, (u64)a.rank * a.count, a.count);
  barrier<true>(a, 1);
}

MCAST_WHEN(MCAST_SEL_all_gather, 1, 1)(
    KERNEL mcast_all_gather_mc(ARGS) { MCAST_ENTRY; all_gather_mc(a); })
