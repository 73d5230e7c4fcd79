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

// Call signatures (src/kernels/abi/signature.rs: collective, dtype, op, root, count, offsets in
// a.sig). With a.check every kernel publishes this rank's at its entry in the words its peers
// read there (the entry barrier's MCAST_SIG_OFFSET slots here; LL lines, ll.cuh; the push
// all-reduce's first step, all_reduce.cu) and compares every peer's with its own before it
// touches any data. Every rank compares every peer, so every rank finds a disagreement.

// A 16-byte store of this rank's signature at `at` (a peer's sync region).
__device__ __forceinline__ void sig_store(const McastArgs& a, u64 at) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(at), "l"(a.sig[0]), "l"(a.sig[1]) : "memory");
}
__device__ __forceinline__ void sig_load(u64 at, u64* s0, u64* s1) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(*s0), "=l"(*s1) : "l"(at) : "memory");
}

// Rank `peer`'s signature (s0, s1) differs from this rank's: records MCAST_ERR_MISMATCH (first
// error wins) with the peer's rank as detail and both signatures at MCAST_MISMATCH_OFFSET, then
// MCAST_STATE_MISMATCH in this rank's own state word, which ends its other blocks' waits (a
// larger grid than a peer's leaves blocks no peer pairs with).
__device__ void record_mismatch(const McastArgs& a, u32 peer, u64 s0, u64 s1) {
  const u64 own = sync_local(a, 0);
  if (mcast_dev__cas(own + MCAST_ERROR_OFFSET, MCAST_ERR_NONE, MCAST_ERR_MISMATCH) == MCAST_ERR_NONE) {
    volatile u64* d = (volatile u64*)(own + MCAST_MISMATCH_OFFSET);
    d[0] = s0;
    d[1] = s1;
    d[2] = a.sig[0];
    d[3] = a.sig[1];
    *(volatile u32*)(own + MCAST_ERROR_INFO_OFFSET) = peer;
  }
  mcast_dev__cas_sys(own + MCAST_STATE_OFFSET, MCAST_STATE_OK, MCAST_STATE_MISMATCH);
}

// Called by every thread of the block; the thread with `have` holds rank threadIdx.x's
// signature (s0, s1), and `failed` is set where its wait for it failed (recorded). True, on
// every thread, when every signature equals this rank's and no wait failed; otherwise the
// mismatch is recorded and the block must return without touching data.
__device__ bool sig_agree(const McastArgs& a, bool failed, bool have, u64 s0, u64 s1) {
  const bool bad = !failed && have && (s0 != a.sig[0] || s1 != a.sig[1]);
  if (bad) record_mismatch(a, threadIdx.x, s0, s1);
  return __syncthreads_or(failed || bad) == 0;
}

// The barrier of block slot `blockIdx.x`: mcast/device.h's counting barrier (mcast_dev__barrier_cta,
// the protocol of mcast_dev_barrier) on the library's own slots; returns false on a failure (error
// recorded; a timeout told to every rank, naming the ranks whose barrier count is behind); the
// caller must then return from the kernel (uniformly for the block). Its first barrier in a kernel
// also checks the error word: a rank whose previous collective failed does nothing (and never
// signals). MC: one multimem.red on the multicast sync region (emulated builds: a red per rank).
// The first barrier (index 0) with a.check also carries the call signature: thread p stores it
// into rank p's MCAST_SIG_OFFSET slot of this rank before the barrier's release signal, and after
// the barrier thread t compares rank t's (sig_agree). A writer stores its next signature only at
// a later kernel's entry, after every rank passed this kernel's last barrier (the copy-engine
// forms' exit barrier kernel runs with check 0), so the slot read is this call's.
template <bool MC>
__device__ bool barrier(const McastArgs& a, u32 index) {
  const u32 slot = blockIdx.x, t = threadIdx.x;
  const u64 soff = MCAST_SIGNAL_OFFSET + slot * MCAST_SIGNAL_STRIDE;
  const bool sig = index == 0 && a.check != 0;
  const bool peer = t < a.nranks && t != a.rank;
  if (sig && peer) {
    sig_store(a, a.sync[t] + MCAST_SIG_OFFSET + 16 * a.rank);
#if !defined(MCAST_EMULATE_MULTIMEM)
    // Unicast stores before a multimem.red signal: different proxies.
    if (MC) asm volatile("fence.proxy.alias;" ::: "memory");
#endif
  }
#if defined(MCAST_EMULATE_MULTIMEM)
  const u64 mc = 0;
#else
  const u64 mc = MC ? a.sync_mc : 0;
#endif
  if (mcast_dev__barrier_cta(sync_local(a, 0), sync_local(a, MCAST_EPOCH_OFFSET + 4 * slot), soff, a.sync[0],
                             sync_stride(a), a.nranks, mc, 1, 1, a.timeout_ns, index == 0,
                             error_info(slot, index)) != MCAST_DEV_ERR_NONE)
    return false;
  if (!sig) return true;
  u64 s0 = 0, s1 = 0;
  if (peer) sig_load(sync_local(a, MCAST_SIG_OFFSET + 16 * t), &s0, &s1);
  return sig_agree(a, false, peer, s0, s1);
}
