// kernels/broadcast/pull.cu: the broadcast by pulls (every rank copies the root's data) and its
// entry point mcast_broadcast_p2p.

// Broadcast (pull): every rank copies count bytes from the root's data into its out (the root
// only out of place).
__device__ void broadcast_p2p(const McastArgs& a) {
  if (!barrier<false>(a, 0)) return;
  if (a.out[a.rank] != a.data[a.root]) copy_bytes(a.out[a.rank], a.data[a.root], a.count);
  barrier<false>(a, 1);
}

MCAST_WHEN(MCAST_SEL_broadcast, 1, 1)(
    KERNEL mcast_broadcast_p2p(ARGS) { MCAST_ENTRY; broadcast_p2p(a); })
