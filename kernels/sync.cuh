// kernels/sync.cuh: synchronisation across ranks: the device error word, the counter waits (abort
// and timeout aware, a timeout told to every rank) and the per-block-slot barrier, all on
// mcast/device.h's implementation.

// The sync regions of a team are evenly spaced in every rank's mapping (one reservation, ranks
// side by side: segment/mod.rs), so rank p's is at sync[0] + p * (sync[1] - sync[0]).
__device__ __forceinline__ u64 sync_local(const McastArgs& a, u32 off) { return a.sync[a.rank] + off; }
__device__ __forceinline__ u64 sync_stride(const McastArgs& a) { return a.nranks > 1 ? a.sync[1] - a.sync[0] : 0; }

// Records error `code` with its detail (block slot, barrier index) unless an error came first:
// mcast/device.h's recording, the one the device API uses.
__device__ __forceinline__ u32 error_info(u32 slot, u32 index) { return (slot + 1) | (index << 8); }
__device__ __forceinline__ void record_error(const McastArgs& a, u32 code, u32 slot, u32 index) {
  mcast_dev__record(sync_local(a, 0), code, error_info(slot, index));
}

// The error a wait records when the team's state word is not OK: a rank's timeout
// (MCAST_STATE_TIMEOUT) is a timeout here too, anything else an abort.
__device__ __forceinline__ u32 state_error(u32 state) { return mcast_dev__state_error(state); }

// A wait of this rank for rank `peer` timed out: records the timeout and tells every rank
// (mcast_dev__timed_out: the missing rank in this rank's missing words, "rank r timed out" in
// every rank's state word), so their waits end at once instead of each waiting out its own
// timeout.
__device__ void record_timeout(const McastArgs& a, u32 slot, u32 index, int peer) {
  record_error(a, MCAST_ERR_TIMEOUT, slot, index);
  mcast_dev__timed_out(sync_local(a, 0), a.sync[0], sync_stride(a), a.nranks, a.rank, peer, 0);
}

// One thread waits until the counter at `flag`, written by rank `peer`, reaches `target`
// (wrap-safe: counters only grow and no rank runs more than a few arrivals ahead), with acquire
// loads: mcast/device.h's wait, so a failure in the team's state word (an abort, a rank's
// timeout) or the timeout ends it the same way (error recorded, false); a timeout here is told
// to every rank.
__device__ __forceinline__ bool wait_count(const McastArgs& a, u64 flag, u32 target, u32 slot, u32 index, int peer) {
  const u32 code = mcast_dev__wait_count(sync_local(a, 0), flag, target, 1, a.timeout_ns, error_info(slot, index));
  if (code == MCAST_ERR_TIMEOUT && *(volatile u32*)sync_local(a, MCAST_STATE_OFFSET) == MCAST_STATE_OK)
    mcast_dev__timed_out(sync_local(a, 0), a.sync[0], sync_stride(a), a.nranks, a.rank, peer, 0);
  return code == MCAST_ERR_NONE;
}

// The barrier of block slot `blockIdx.x`: mcast/device.h's counting barrier (mcast_dev__barrier_cta,
// the protocol of mcast_dev_barrier) on the library's own slots; returns false on a failure (error
// recorded; a timeout told to every rank, naming the ranks whose barrier count is behind); the
// caller must then return from the kernel (uniformly for the block). Its first barrier in a kernel
// also checks the error word: a rank whose previous collective failed does nothing (and never
// signals). MC: one multimem.red on the multicast sync region (emulated builds: a red per rank).
template <bool MC>
__device__ bool barrier(const McastArgs& a, u32 index) {
  const u32 slot = blockIdx.x;
  const u64 soff = MCAST_SIGNAL_OFFSET + slot * MCAST_SIGNAL_STRIDE;
#if defined(MCAST_EMULATE_MULTIMEM)
  const u64 mc = 0;
#else
  const u64 mc = MC ? a.sync_mc : 0;
#endif
  return mcast_dev__barrier_cta(sync_local(a, 0), sync_local(a, MCAST_EPOCH_OFFSET + 4 * slot), soff, a.sync[0],
                                sync_stride(a), a.nranks, mc, 1, 1, a.timeout_ns, index == 0,
                                error_info(slot, index)) == MCAST_DEV_ERR_NONE;
}
