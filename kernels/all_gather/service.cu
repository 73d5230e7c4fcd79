// kernels/all_gather/service.cu: the kernels that serve other forms of the collectives, in the
// all-gather's module: the staged route's copy-out (mcast_copy_out) and the copy-engine forms'
// barrier (mcast_barrier_p2p).

// Where the pointer form's staged route (src/runtime/collective/staged.rs) does not write recv from
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
    KERNEL mcast_barrier_p2p(ARGS) { MCAST_ENTRY; barrier<false>(a, 0); }
    KERNEL mcast_copy_out(ARGS) { MCAST_ENTRY; copy_out(a); })
