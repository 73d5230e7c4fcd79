// kernels/broadcast/multicast.cu: the multicast broadcast (the root's multimem.st) and its entry
// point mcast_broadcast_mc.

// Broadcast: the root multimem.st's its range (out of place too: its own out is one of the
// targets); the others take part in the barriers only.
__device__ void broadcast_mc(const McastArgs& a) {
  if (!barrier<true>(a, 0)) return;
  if (a.rank == a.root) mc_push(a, 0, a.count);
  barrier<true>(a, 1);
}

MCAST_WHEN(MCAST_SEL_broadcast, 1, 1)(
    KERNEL mcast_broadcast_mc(ARGS) { MCAST_ENTRY; broadcast_mc(a); })
