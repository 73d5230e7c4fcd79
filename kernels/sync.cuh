// kernels/sync.cuh: synchronisation across ranks: the device error word, the counter waits (abort
// and timeout aware) and the per-block-slot barrier.

// Per-block-slot counting barrier across ranks (see barrier below): returns false on timeout or
// abort (error recorded); the caller must then return from the kernel (uniformly for the block).
// The sync regions of a team are evenly spaced in every rank's mapping (one reservation, ranks
// side by side: segment/mod.rs), so rank p's is at sync[0] + p * (sync[1] - sync[0]).
__device__ __forceinline__ u64 sync_local(const McastArgs& a, u32 off) { return a.sync[a.rank] + off; }

// Records error `code` with its detail (block slot, barrier index) unless an error came first:
// mcast/device.h's recording, the one the device API uses.
__device__ __forceinline__ u32 error_info(u32 slot, u32 index) { return (slot + 1) | (index << 8); }
__device__ __forceinline__ void record_error(const McastArgs& a, u32 code, u32 slot, u32 index) {
  mcast_dev__record(sync_local(a, 0), code, error_info(slot, index));
}

// One thread waits until the counter at `flag` reaches `target` (wrap-safe: counters only grow
// and no rank runs more than a few arrivals ahead), with acquire loads: mcast/device.h's wait, so
// an abort (the team's state word) or the timeout ends it the same way (error recorded, false).
__device__ __forceinline__ bool wait_count(const McastArgs& a, u64 flag, u32 target, u32 slot, u32 index) {
  return mcast_dev__wait_count(sync_local(a, 0), flag, target, 1, a.timeout_ns, error_info(slot, index)) ==
         MCAST_DEV_ERR_NONE;
}

// The barrier of block slot `blockIdx.x`: mcast/device.h's counting barrier (mcast_dev__barrier_cta,
// the protocol of mcast_dev_barrier) on the library's own slots. Its first barrier in a kernel
// also checks the error word: a rank whose previous collective failed does nothing (and never
// signals). MC: one multimem.red on the multicast sync region (emulated builds: a red per rank).
template <bool MC>
__device__ bool barrier(const McastArgs& a, u32 index) {
  const u32 slot = blockIdx.x;
  const u64 soff = MCAST_SIGNAL_OFFSET + slot * MCAST_SIGNAL_STRIDE;
  const u64 stride = a.nranks > 1 ? a.sync[1] - a.sync[0] : 0;
#if defined(MCAST_EMULATE_MULTIMEM)
  const u64 mc = 0;
#else
  const u64 mc = MC ? a.sync_mc : 0;
#endif
  return mcast_dev__barrier_cta(sync_local(a, 0), sync_local(a, MCAST_EPOCH_OFFSET + 4 * slot), soff, a.sync[0], stride,
                                a.nranks, mc, 1, 1, a.timeout_ns, index == 0, error_info(slot, index)) ==
         MCAST_DEV_ERR_NONE;
}
