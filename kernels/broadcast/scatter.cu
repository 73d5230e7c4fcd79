// kernels/broadcast/scatter.cu: the broadcast as scatter then all-gather, each owner forwarding
// its slice, and its entry point mcast_broadcast_p2p_scatter.

// Broadcast, teams of three or more, large messages (the plan's choice: src/kernels/abi/plan/
// broadcast.rs, from broadcast_scatter_min_bytes in plan/cost.rs). The one-pull form has every
// rank read the whole message from the root, whose NVLink egress then carries it N - 1 times; here
// it carries it once. The message's 16-byte vectors are cut into N - 1 slices owned by the ranks
// other than the root (slice s: the rank in row s of writer_row(root, .)); after the entry barrier
// each owner loads its slice from the root's data and stores each vector into every owner's out
// (peers in the walk order of peer_at, its own last): a scatter by pulls and an all-gather by
// pushes in one pass, the root's egress carrying each slice once and every owner's carrying its
// slice to the N - 2 others, with no barrier between. The head and tail bytes come from the root
// (block 0 of each owner); the root, out of place, copies its message into its own out. The exit
// barrier's release carries the stores, so every rank's out is whole when its kernel ends, and no
// rank changes its data while a peer still reads it. Every out written is its rank's result (the
// pointer form's staged route gives this kernel the peers' staging areas and copies out:
// src/runtime/collective/staged.rs). Where the ranks' buffers disagree modulo 16, it runs as
// broadcast_p2p (every rank alike).
__device__ void broadcast_p2p_scatter(const McastArgs& a) {
  const u32 N = a.nranks, me = a.rank, root = a.root;
  if (N < 3 || !same_alignment(a)) {
    broadcast_p2p(a);
    return;
  }
  const u64 src = a.data[root], dst = a.out[me];
  const Range r = split(src, a.count, 1, true);
  if (!barrier<false>(a, 0)) return;
  if (me == root) {
    if (dst != src) copy_bytes(dst, src, a.count);
  } else {
    if (blockIdx.x == 0) copy_edges(dst, src, r);
    const u32 s = writer_row(root, me);
    fan_out_vectors(src + r.head, r.nv * s / (N - 1), r.nv * (s + 1) / (N - 1), N, [&](u32 i) {
      const u32 q = peer_at(a, i);
      return q == root ? 0 : a.out[q] + r.head;
    });
  }
  barrier<false>(a, 1);
}

MCAST_WHEN(MCAST_SEL_broadcast, 1, 1)(
    KERNEL mcast_broadcast_p2p_scatter(ARGS) { MCAST_ENTRY; broadcast_p2p_scatter(a); })
