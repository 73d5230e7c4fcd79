// kernels/all_gather.cu: the all-gather kernels (P2P pull, LL, multicast push) and their entry points
// mcast_all_gather_{p2p,ll,mc}.

// All-gather (pull): rank r copies block q (count bytes at q*count) from rank q's data into its
// out (at q*out_stride), for every q != r (and q == r out of place), peers in the walk order of
// peer_at (r + 1 first, its own block last).
__device__ void all_gather_p2p(const McastArgs& a) {
  if (!barrier<false>(a, 0)) return;
  const u64 stride = out_stride(a);
  for (u32 i = 0; i < a.nranks; ++i) {
    const u32 q = peer_at(a, i);
    if (q != a.rank || a.out[a.rank] != a.data[a.rank])
      copy_bytes(a.out[a.rank] + (u64)q * stride, a.data[q] + (u64)q * a.count, a.count);
  }
  barrier<false>(a, 1);
}

// All-gather: rank r multimem.st's its block (count bytes at r*count) into every rank's copy.
__device__ void all_gather_mc(const McastArgs& a) {
  if (!barrier<true>(a, 0)) return;
  mc_push(a, (u64)a.rank * a.count, a.count);
  barrier<true>(a, 1);
}

// Where the pointer form's staged route (src/runtime/collective.rs) does not write recv from
// the collective's kernel itself (the all-reduce, multicast), it copies its results out of the
// staging area with this kernel rather than a memcpy, so that a failed collective (a mismatch, a
// timeout, an abort: this rank's error word) leaves the caller's memory as it was: row k of
// `count` bytes from data[k] to out[k], for every k < nranks with data[k] != 0; nothing when the
// error word is set. No wait, no peer: any grid.
__device__ void copy_out(const McastArgs& a) {
  if (*(volatile u32*)sync_local(a, MCAST_ERROR_OFFSET) != MCAST_ERR_NONE) return;
  for (u32 k = 0; k < a.nranks; ++k)
    if (a.data[k] != 0) copy_bytes(a.out[k], a.data[k], a.count);
}

// A barrier across the team and nothing else (one block, slot 0): the copy-engine forms of the
// collectives (src/runtime/ce.rs) run one before and one after their peer copies.
MCAST_WHEN(MCAST_SEL_all_gather, 1, 1)(
    KERNEL mcast_all_gather_p2p(ARGS) { all_gather_p2p(a); }
    KERNEL mcast_all_gather_mc(ARGS) { all_gather_mc(a); }
    KERNEL mcast_barrier_p2p(ARGS) { barrier<false>(a, 0); }
    KERNEL mcast_copy_out(ARGS) { copy_out(a); }
    MCAST_IF_LL(
    KERNEL mcast_all_gather_ll(ARGS) { ll_copy(a, true); }))
