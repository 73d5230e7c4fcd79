// kernels/sync.cuh: synchronisation across ranks: the device error word, the counter waits (abort
// and timeout aware, a timeout told to every rank) and the per-block-slot barrier, all on
// mcast/device.h's implementation.

// The sync regions of a team are evenly spaced in every rank's mapping (one reservation, ranks
// side by side: segment/mod.rs), so rank p's is at sync[0] + p * (sync[1] - sync[0]).
__device__ __forceinline__ u64 sync_local(const McastArgs& a, u32 off) { return a.sync[a.rank] + off; }
__device__ __forceinline__ u64 sync_stride(const McastArgs& a) { return a.nranks > 1 ? a.sync[1] - a.sync[0] : 0; }

// Where rank p keeps per-writer rows (landing rows, signature lines, push scratch rows), the
// nranks - 1 writers other than p in rank order: writer's index among them.
__device__ __forceinline__ u32 writer_row(u32 p, u32 writer) { return writer < p ? writer : writer - 1; }

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

// Flagged lines, the LL protocol's unit (ll.cuh) and the signature lines' (below): 16 bytes = two
// 8-byte lanes {4 payload bytes, 4-byte flag}, each lane written and read in one 64-bit access
// (single-copy atomic), so a lane whose flag is the current one carries the current payload.
// Payload bytes 0-3 with the flag in lane 0, bytes 4-7 with the flag in lane 1.
__device__ __forceinline__ void ll_store(u64 addr, u64 v, u32 flag) {
  const u64 x = (v & 0xffffffffull) | ((u64)flag << 32), y = (v >> 32) | ((u64)flag << 32);
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(addr), "l"(x), "l"(y) : "memory");
}
// A line's two lanes x, y as loaded: true when both carry flag, with the payload in *v.
__device__ __forceinline__ bool ll_lanes(u64 x, u64 y, u32 flag, u64* v) {
  if ((u32)(x >> 32) != flag || (u32)(y >> 32) != flag) return false;
  *v = (x & 0xffffffffull) | (y << 32);
  return true;
}
__device__ __forceinline__ bool ll_load(u64 addr, u32 flag, u64* v) {
  u64 x, y;
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(x), "=l"(y) : "l"(addr) : "memory");
  return ll_lanes(x, y, flag, v);
}

// Ranks whose calls differ so much that they chose different kinds of kernel (the LL kernels on
// one, a barrier kernel or a push kernel on another) wait in words the other never writes.
// A signature thread that has waited MCAST_CROSS_NS for its peer's signature lines (at `at`,
// under `flag`) looks at the peer's signature lines of the other kinds, under the flag each kind
// would give this call (the counts of every kind agree across ranks until calls disagree): one
// that carries it, with another signature, is the peer's call, recorded as a mismatch (true),
// unless the awaited lines have come by then. For a peer may run one call ahead of a rank still
// waiting for the last lines of the call before (the LL kernels wait for no one), and its next
// call's lines carry the flags this call would have; but it stores this call's lines before
// them, so lines of its next call seen (a fence, then the awaited lines read again) mean the
// awaited ones are there too. No timing is assumed (a thread may stall between any two loads).
// Not sooner than MCAST_CROSS_NS: the look costs loads the usual wait does not need. `kind`: the
// kernel's own (MCAST_KIND_*), whose lines the wait already reads. In ll.cuh (it needs the LL
// layout).
#define MCAST_CROSS_NS 100000ull
#define MCAST_KIND_BARRIER 1
#define MCAST_KIND_LL 2
#define MCAST_KIND_PUSH 3
__device__ __noinline__ bool cross_found(const McastArgs& a, u32 writer, u32 kind, u64 at, u32 flag);

// The slow path of a poll of lines stored by rank `writer`, every 256 spins: false once the team
// failed (aborted, a rank timed out), the timeout passes (both recorded, as wait `index` of the
// collective), another thread of this rank recorded an error or, for a signature thread (`kind`
// nonzero) awaiting rank `peer`'s signature lines at `at` under `flag`, cross_found finds that
// peer in another kind of kernel; *start is the thread's first timer reading (0 before).
__device__ bool poll_on(const McastArgs& a, u64* start, u32 writer, u32 index, u32 kind, u32 peer, u64 at,
                        u32 flag) {
  const u32 state = *(volatile u32*)sync_local(a, MCAST_STATE_OFFSET);
  if (state != MCAST_STATE_OK) {
    record_error(a, state_error(state), blockIdx.x, index);
    return false;
  }
  if (*(volatile u32*)sync_local(a, MCAST_ERROR_OFFSET) != MCAST_ERR_NONE) return false;
  if (a.timeout_ns == 0 && kind == 0) return true;
  const u64 now = globaltimer();
  if (*start == 0) {
    *start = now;
    return true;
  }
  if (kind != 0 && now - *start > MCAST_CROSS_NS && cross_found(a, peer, kind, at, flag)) return false;
  if (a.timeout_ns != 0 && now - *start > a.timeout_ns) {
    record_timeout(a, blockIdx.x, index, (int)writer);
    return false;
  }
  return true;
}

// Polls the LL line at addr, stored by rank `writer`, until it carries flag (false as poll_on,
// as wait 1 of the collective).
__device__ bool ll_wait(const McastArgs& a, u64 addr, u32 flag, u64* v, u64* start, u32 writer) {
  u32 spins = 0;
  while (!ll_load(addr, flag, v))
    if ((++spins & 255u) == 0 && !poll_on(a, start, writer, 1, 0, 0, 0, 0)) return false;
  return true;
}

// Call signatures (src/kernels/abi/signature.rs: collective, dtype, op, root, count, offsets in
// a.sig). With a.check every kernel publishes this rank's at its entry in the words its peers
// read there (signature lines at the entry barrier here; beside the LL lines, ll.cuh; the push
// kernels' first step, kernels/push.cuh) and compares every peer's with its own before it
// touches any data (before it reads a peer's memory or writes its own out). Every rank compares
// every peer, so every rank finds a disagreement. Where the lines carry their own flag (teams of
// at most MCAST_BAR_SIG_MAX_RANKS; the LL kernels) no signal waits for them. At the barrier and
// in the push kernels the threads of the block's last warp read them while the others wait for
// the call's own signals, and only the vote before the first write is added to the critical
// path; the LL reductions and all-gather read them with each thread's first data wait (ll.cuh).

// The signature is two lines; lane t (< nranks, not this rank) of the block's last warp carries
// rank t's (measured: lanes of warp 0 cost the LL kernels 0.3 us where thread 0 also waits for
// data, and the barrier's thread 0 waits for the signal count).
__device__ __forceinline__ bool sig_thread(const McastArgs& a, u32* peer) {
  const u32 q = threadIdx.x - (blockDim.x - 32);
  *peer = q;
  return threadIdx.x >= blockDim.x - 32 && q < a.nranks && q != a.rank;
}
__device__ __forceinline__ void sig_lines_store(const McastArgs& a, u64 at, u32 flag) {
  ll_store(at, a.sig[0], flag);
  ll_store(at + 16, a.sig[1], flag);
}
// Polls both signature lines at `at` (from rank `writer`) until they carry flag: false as
// poll_on (wait `index`, in a kernel of `kind`).
__device__ bool sig_lines_wait(const McastArgs& a, u64 at, u32 flag, u64* s0, u64* s1, u32 writer, u32 index,
                               u32 kind) {
  u32 spins = 0;
  u64 start = 0;
  while (true) {
    const bool h0 = ll_load(at, flag, s0), h1 = ll_load(at + 16, flag, s1);
    if (h0 && h1) return true;
    if ((++spins & 255u) == 0 && !poll_on(a, &start, writer, index, kind, writer, at, flag)) return false;
  }
}

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
    mcast_dev__ring(own);
  }
  mcast_dev__cas_sys(own + MCAST_STATE_OFFSET, MCAST_STATE_OK, MCAST_STATE_MISMATCH);
}

// This thread's verdict on rank `peer`'s signature (s0, s1), read unless `failed` (its wait
// failed, recorded): true when it differs from this rank's (recorded) or the wait failed.
__device__ __forceinline__ bool sig_bad(const McastArgs& a, bool failed, bool have, u32 peer, u64 s0, u64 s1) {
  const bool bad = !failed && have && (s0 != a.sig[0] || s1 != a.sig[1]);
  if (bad) record_mismatch(a, peer, s0, s1);
  return failed || bad;
}

// Called by every thread of the block; the thread with `have` holds rank threadIdx.x's
// signature (s0, s1), and `failed` is set where its wait for it failed (recorded). True, on
// every thread, when every signature equals this rank's and no wait failed; otherwise the
// mismatch is recorded and the block must return without touching data.
__device__ bool sig_agree(const McastArgs& a, bool failed, bool have, u64 s0, u64 s1) {
  return __syncthreads_or(sig_bad(a, failed, have, threadIdx.x, s0, s1)) == 0;
}

// Rank p's signature lines from `writer` for block slot b (teams of at most
// MCAST_BAR_SIG_MAX_RANKS): two lines flagged with slot b's barrier epoch of the entry barrier.
__device__ __forceinline__ u64 bar_sig(const McastArgs& a, u32 p, u32 b, u32 writer) {
  const u32 w = writer_row(p, writer);
  return a.sync[p] + MCAST_BAR_SIG_OFFSET + 32ull * ((u64)b * (MCAST_BAR_SIG_MAX_RANKS - 1) + w);
}

// Rank p's signature lines from `writer` for block slot b of the push kernel's call whose first
// sequence number is y0 (kernels/push.cuh): parity y0 & 1, flagged with y0.
__device__ __forceinline__ u64 push_sig(const McastArgs& a, u32 p, u32 b, u32 y0, u32 writer) {
  const u32 w = writer_row(p, writer);
  return a.sync[p] + MCAST_PUSH_SIG_OFFSET + 32ull * (((u64)b * 2 + (y0 & 1)) * (MCAST_PUSH_MAX_RANKS - 1) + w);
}

// The entry barrier with the call signature, teams of at most MCAST_BAR_SIG_MAX_RANKS: the
// barrier's two halves (mcast_dev__barrier_arrive, _await); between them the last warp's thread
// t stores this rank's signature lines into rank t (flagged with the epoch k the barrier just
// took: every rank's k agrees, as its counter's target does) and polls rank t's, and the
// await's vote carries the verdict. The lines need no order with the signal, so it waits for no
// extra store. A writer stores a slot's next lines only in a later call's entry barrier, after
// every rank passed this call's exit barrier on that slot (every checked kernel has one), so a
// line read carries this call's flag or an older one.
template <bool MC>
__device__ bool checked_barrier(const McastArgs& a, u64 mc) {
  const u32 slot = blockIdx.x;
  const u64 own = sync_local(a, 0), epoch = sync_local(a, MCAST_EPOCH_OFFSET + 4 * slot);
  const u64 soff = MCAST_SIGNAL_OFFSET + slot * MCAST_SIGNAL_STRIDE;
  const u32 info = error_info(slot, 0);
  u32 k = 0;
  if (mcast_dev__barrier_arrive(own, epoch, soff, a.sync[0], sync_stride(a), a.nranks, mc, 1, 1, info, &k) !=
      MCAST_DEV_ERR_NONE)
    return false;
  u32 q;
  const bool have = sig_thread(a, &q);
  bool failed = false;
  u64 s0 = 0, s1 = 0;
  if (have) {
    sig_lines_store(a, bar_sig(a, q, slot, a.rank), k);
    failed = !sig_lines_wait(a, bar_sig(a, a.rank, slot, q), k, &s0, &s1, q, 0, MCAST_KIND_BARRIER);
  }
  int any = 0;
  const u32 done = mcast_dev__barrier_await(own, epoch, soff, a.sync[0], sync_stride(a), a.nranks, mc, 1, a.timeout_ns,
                                            info, k, sig_bad(a, failed, have, q, s0, s1), &any);
  return done == MCAST_DEV_ERR_NONE && any == 0;
}

// The barrier of block slot `blockIdx.x`: mcast/device.h's counting barrier (mcast_dev__barrier_cta,
// the protocol of mcast_dev_barrier) on the library's own slots; returns false on a failure (error
// recorded; a timeout told to every rank, naming the ranks whose barrier count is behind); the
// caller must then return from the kernel (uniformly for the block). Its first barrier in a kernel
// also checks the error word: a rank whose previous collective failed does nothing (and never
// signals). MC: one multimem.red on the multicast sync region (emulated builds: a red per rank).
// The first barrier (index 0) with a.check also carries the call signature: checked_barrier for
// teams of at most MCAST_BAR_SIG_MAX_RANKS; in larger ones thread p stores it into rank p's
// MCAST_SIG_OFFSET slot of this rank before the barrier's release signal, and after the barrier
// thread t compares rank t's (sig_agree). A writer stores its next signature only at a later
// kernel's entry, after every rank passed this kernel's last barrier (the copy-engine forms'
// exit barrier kernel runs with check 0), so the slot read is this call's.
template <bool MC>
__device__ bool barrier(const McastArgs& a, u32 index) {
  const u32 slot = blockIdx.x, t = threadIdx.x;
  const u64 soff = MCAST_SIGNAL_OFFSET + slot * MCAST_SIGNAL_STRIDE;
  const bool sig = index == 0 && a.check != 0;
#if defined(MCAST_EMULATE_MULTIMEM)
  const u64 mc = 0;
#else
  const u64 mc = MC ? a.sync_mc : 0;
#endif
  if (sig && a.nranks <= MCAST_BAR_SIG_MAX_RANKS) return checked_barrier<MC>(a, mc);
  const bool peer = t < a.nranks && t != a.rank;
  if (sig && peer) {
    sig_store(a, a.sync[t] + MCAST_SIG_OFFSET + 16 * a.rank);
#if !defined(MCAST_EMULATE_MULTIMEM)
    // Unicast stores before a multimem.red signal: different proxies.
    if (MC) asm volatile("fence.proxy.alias;" ::: "memory");
#endif
  }
  if (mcast_dev__barrier_cta(sync_local(a, 0), sync_local(a, MCAST_EPOCH_OFFSET + 4 * slot), soff, a.sync[0],
                             sync_stride(a), a.nranks, mc, 1, 1, a.timeout_ns, index == 0,
                             error_info(slot, index)) != MCAST_DEV_ERR_NONE)
    return false;
  if (!sig) return true;
  u64 s0 = 0, s1 = 0;
  if (peer) sig_load(sync_local(a, MCAST_SIG_OFFSET + 16 * t), &s0, &s1);
  return sig_agree(a, false, peer, s0, s1);
}
