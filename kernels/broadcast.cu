// kernels/broadcast.cu: the broadcast kernels (P2P pull, LL, multicast push) and their entry points
// mcast_broadcast_{p2p,ll,mc}.

// Broadcast (pull): every rank copies count bytes from the root's data into its out (the root
// only out of place).
__device__ void broadcast_p2p(const McastArgs& a) {
  if (!barrier<false>(a, 0)) return;
  if (a.out[a.rank] != a.data[a.root]) copy_bytes(a.out[a.rank], a.data[a.root], a.count);
  barrier<false>(a, 1);
}

// Broadcast: the root multimem.st's its range (out of place too: its own out is one of the
// targets); the others take part in the barriers only.
__device__ void broadcast_mc(const McastArgs& a) {
  if (!barrier<true>(a, 0)) return;
  if (a.rank == a.root) mc_push(a, 0, a.count);
  barrier<true>(a, 1);
}

MCAST_WHEN(MCAST_SEL_broadcast, 1, 1)(
    KERNEL mcast_broadcast_p2p(ARGS) { broadcast_p2p(a); }
    KERNEL mcast_broadcast_mc(ARGS) { broadcast_mc(a); }
    MCAST_IF_LL(
    KERNEL mcast_broadcast_ll(ARGS) { ll_copy(a, false); }))
