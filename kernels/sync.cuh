// kernels/sync.cuh: synchronisation across ranks: the device error word, the counter waits (abort
// and timeout aware) and the per-block-slot barrier.

// Per-block-slot counting barrier across ranks. Block b of every rank adds 1 to the slot-b
// counter of every rank (release), then waits (acquire) until its own slot-b counter reaches
// (barriers completed on slot b) * nranks; that count lives in the rank's local state and is
// advanced here, so graph replays stay correct. Counters only grow (wrap-safe compare); a rank
// is at most one barrier ahead of any other, so ">= target" is exact. Returns false on timeout
// (error recorded); the caller must then return from the kernel (uniformly for the block).
__device__ __forceinline__ u64 sync_local(const McastArgs& a, u32 off) { return a.sync[a.rank] + off; }

// Records error `code` with its detail (block slot, barrier index) unless an error came first.
__device__ __forceinline__ void record_error(const McastArgs& a, u32 code, u32 slot, u32 index) {
  if (atom_cas_u32(sync_local(a, MCAST_ERROR_OFFSET), MCAST_ERR_NONE, code) == MCAST_ERR_NONE)
    *(volatile u32*)sync_local(a, MCAST_ERROR_INFO_OFFSET) = (slot + 1) | (index << 8);
}

// The error a wait records when the team's state word is not OK: a rank's timeout
// (MCAST_STATE_TIMEOUT) is a timeout here too, anything else an abort.
__device__ __forceinline__ u32 state_error(u32 state) {
  return (state & 0xffu) == MCAST_STATE_TIMEOUT ? MCAST_ERR_TIMEOUT : MCAST_ERR_ABORTED;
}

// A wait of this rank timed out: records the timeout and the ranks that did not arrive (`peer`,
// or for a barrier (peer < 0) every rank whose barrier count on `slot` is behind this rank's),
// then tells every rank: "rank r timed out" in its state word (this rank's own first; a failure
// already there stays, and a rank told already told the others), so their waits end at once
// instead of each waiting out its own timeout.
__device__ void record_timeout(const McastArgs& a, u32 slot, u32 index, int peer) {
  record_error(a, MCAST_ERR_TIMEOUT, slot, index);
  const u32 mine = *(volatile u32*)sync_local(a, MCAST_EPOCH_OFFSET + 4 * slot);
  for (u32 q = 0; q < a.nranks; ++q) {
    const bool missing =
        peer >= 0 ? q == (u32)peer : (int)(*(volatile u32*)(a.sync[q] + MCAST_EPOCH_OFFSET + 4 * slot) - mine) < 0;
    if (missing) red_or_u32(sync_local(a, MCAST_MISSING_OFFSET + 4 * (q / 32)), 1u << (q % 32));
  }
  asm volatile("membar.sys;" ::: "memory");  // the error and the ranks before the news
  const u32 told = MCAST_STATE_TIMEOUT | (a.rank << 8);
  if (atom_cas_sys_u32(sync_local(a, MCAST_STATE_OFFSET), MCAST_STATE_OK, told) != MCAST_STATE_OK) return;
  for (u32 q = 0; q < a.nranks; ++q)
    if (q != a.rank) atom_cas_sys_u32(a.sync[q] + MCAST_STATE_OFFSET, MCAST_STATE_OK, told);
}

// One thread waits until the counter at `flag` reaches `target` (wrap-safe: counters only grow
// and no rank runs more than a few arrivals ahead). The acquire load orders the peers' writes
// before the block's later accesses (the other threads through a __syncthreads after this). A
// failure in the team's state word (an abort, from the host here or in a peer process; a rank's
// timeout) or the timeout ends the wait: the error is recorded and the result is false. `peer`:
// the rank that writes `flag`, or -1 for a barrier (every rank does).
__device__ bool wait_count(const McastArgs& a, u64 flag, u32 target, u32 slot, u32 index, int peer) {
  u64 start = 0;
  u32 spins = 0;
  while ((int)(ld_acquire_sys(flag) - target) < 0) {
    if ((++spins & 63u) != 0) continue;
    const u32 state = *(volatile u32*)sync_local(a, MCAST_STATE_OFFSET);
    if (state != MCAST_STATE_OK) {
      record_error(a, state_error(state), slot, index);
      return false;
    }
    if (a.timeout_ns != 0) {
      const u64 now = globaltimer();
      if (start == 0) {
        start = now;
      } else if (now - start > a.timeout_ns) {
        record_timeout(a, slot, index, peer);
        return false;
      }
    }
  }
  return true;
}

template <bool MC>
__device__ bool barrier(const McastArgs& a, u32 index) {
  __shared__ int s_live, s_ok;
  __syncthreads();
  const u32 slot = blockIdx.x;
  const u32 soff = MCAST_SIGNAL_OFFSET + slot * MCAST_SIGNAL_STRIDE;
  u32 k = 0;
  if (threadIdx.x == 0) {
    volatile u32* epoch = (volatile u32*)sync_local(a, MCAST_EPOCH_OFFSET + 4 * slot);
    k = *epoch + 1;
    *epoch = k;
    // The first barrier of a kernel also checks the error word: a rank whose previous
    // collective timed out does nothing (and never signals).
    s_live = index != 0 || *(volatile u32*)sync_local(a, MCAST_ERROR_OFFSET) == MCAST_ERR_NONE;
    // A failed team (aborted, a rank timed out): record it and end the kernel before
    // signalling anyone.
    const u32 state = *(volatile u32*)sync_local(a, MCAST_STATE_OFFSET);
    if (s_live && state != MCAST_STATE_OK) {
      record_error(a, state_error(state), slot, index);
      s_live = 0;
    }
  }
  __syncthreads();
  if (!s_live) return false;
  // Signal every rank, one thread per rank (or one multicast reduction). No fence first: the
  // release reduction orders this block's earlier writes (made visible to each signalling
  // thread by __syncthreads; release is cumulative) before the signal.
  if (MC) {
    if (threadIdx.x == 0) mc_red_signal(a, a.sync_mc + soff);
  } else if (threadIdx.x < a.nranks) {
    red_release_sys_add(a.sync[threadIdx.x] + soff, 1);
  }
  if (threadIdx.x == 0) s_ok = wait_count(a, sync_local(a, soff), k * a.nranks, slot, index, -1);
  __syncthreads();
#if !defined(MCAST_EMULATE_MULTIMEM)
  if (MC) asm volatile("fence.proxy.alias;" ::: "memory");
#endif
  return s_ok != 0;
}
