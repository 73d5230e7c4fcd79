// kernels/ll.cuh: the low-latency (LL) one-shot protocol shared by the four collectives' small-
// message kernels: no barrier, no fence, no flag word of its own; the flag travels with the data.
//
// Every rank stores what each peer needs from it (its whole vector for all-reduce, the peer's
// block for reduce-scatter, its own block for all-gather, the root's range for broadcast) straight
// into that peer's LL landing area, as LL lines: 16 bytes = two 8-byte lanes {4 payload bytes,
// 4-byte flag}, each lane written and read in one 64-bit access (single-copy atomic), so a lane
// whose flag is the current one carries the current payload. The receiver polls its own landing
// (local memory) until every lane it needs carries the flag, and combines (reduces or copies)
// into its out. It reads nothing of the peers' memory: the pointer forms on plain memory run it
// as they are.
//
// Landing of rank p (after its sync region, push scratch and staging area; see ll_row): per
// block slot b (< MCAST_LL_MAX_BLOCKS), parity s (0, 1), and writer w (the nranks - 1 ranks other
// than p), one row of MCAST_LL_ROW bytes: the LL lines of the writer's part for block b
// (at most MCAST_LL_PART payload bytes, MCAST_LL_LINES lines per thread).
//
// Flags: per block slot, the local-state word MCAST_LL_SEQ_OFFSET + 4b counts this rank's LL
// calls on slot b (every rank makes the same calls with the same grid, so the counts agree). A
// call's flag is the next count in 1..0xfffffffe (never 0, the value of a line never written; the
// cycle has even length, so the parity alternates across the wrap), its parity flag & 1.
// Reuse: in every LL call every rank stores at least one line into every peer's landing, for
// every block slot of the call, at its start, and waits for the peers' (broadcast's other ranks
// send acknowledgement lines, see ll_copy). So a rank writes parity s of a peer's landing in call
// k + 2 only after it finished call k + 1, which needed a line the peer stored at the start of
// its call k + 1, after its call k (the last to read parity s) had completed on its stream. Two
// parities suffice, whatever mix of LL collectives runs, and no line is ever reset. Stale lines carry an older flag, never the current one
// (unless a line of a slot stays untouched for 2^32 - 2 calls on that slot).

#define MCAST_LL_MAX_RANKS 8
#define MCAST_LL_MAX_BLOCKS 32
#define MCAST_LL_LINES 2
#define MCAST_LL_PART 8192
#define MCAST_LL_ROW 16384
#define MCAST_LL_SEQ_OFFSET 4864
#define MCAST_STAGE_BYTES 1048576
static_assert(MCAST_LL_PART == MCAST_THREADS * MCAST_LL_LINES * 8, "LL part: lines per thread x 8 payload bytes");
static_assert(MCAST_LL_ROW == 2 * MCAST_LL_PART, "an LL line carries 8 payload bytes in 16");
static_assert(MCAST_LL_MAX_BLOCKS <= MCAST_MAX_BLOCKS, "LL slots are block slots");

// Bytes of the push scratch of a team of n (scratch_bytes in src/kernels/abi/layout.rs).
__device__ __forceinline__ u64 push_scratch_bytes(u32 n) {
  if (n < 2 || n > MCAST_PUSH_MAX_RANKS) return 0;
  return (u64)MCAST_PUSH_SLOTS * (n - 1) * (n <= 2 ? MCAST_PUSH_CHUNK : MCAST_PUSH_CHUNK_WIDE) * MCAST_MAX_BLOCKS;
}

// Row of `writer` in rank p's landing, block slot b, parity s (ll_offset in layout.rs).
__device__ __forceinline__ u64 ll_row(const McastArgs& a, u32 p, u32 b, u32 s, u32 writer) {
  const u32 w = writer_row(p, writer);
  return a.sync[p] + MCAST_SCRATCH_OFFSET + push_scratch_bytes(a.nranks) + MCAST_STAGE_BYTES +
         (((u64)b * 2 + s) * (a.nranks - 1) + w) * MCAST_LL_ROW;
}

// n (<= 8) payload bytes at p, little-endian in a u64 (zero-padded); one load when aligned.
__device__ __forceinline__ u64 ld_payload(u64 p, u32 n) {
  if (n == 8 && (p & 7) == 0) return *(const u64*)p;
  u64 v = 0;
  for (u32 i = 0; i < n; ++i) v |= (u64)(*(const unsigned char*)(p + i)) << (8 * i);
  return v;
}
__device__ __forceinline__ void st_payload(u64 p, u64 v, u32 n) {
  if (n == 8 && (p & 7) == 0) {
    *(u64*)p = v;
    return;
  }
  for (u32 i = 0; i < n; ++i) *(unsigned char*)(p + i) = (unsigned char)(v >> (8 * i));
}

// One block's share of an LL call: payload bytes [lo, hi) of the S each writer sends (parts
// are multiples of 8 bytes, so no LL line straddles two blocks), the flag and
// its parity. live is false when this rank must not take part (an earlier error, or an aborted
// team, recorded here).
struct LlPart {
  u64 lo, hi;
  u32 flag, parity;
  bool live;
};
__device__ LlPart ll_begin(const McastArgs& a, u64 S) {
  __shared__ u32 s_flag, s_live;
  if (threadIdx.x == 0) {
    volatile u32* seq = (volatile u32*)sync_local(a, MCAST_LL_SEQ_OFFSET + 4 * blockIdx.x);
    const u32 f = *seq >= 0xfffffffeu ? 1u : *seq + 1u;
    s_flag = f;
    s_live = *(volatile u32*)sync_local(a, MCAST_ERROR_OFFSET) == MCAST_ERR_NONE;
    const u32 state = *(volatile u32*)sync_local(a, MCAST_STATE_OFFSET);
    if (s_live && state != MCAST_STATE_OK) {
      record_error(a, state_error(state), blockIdx.x, 0);
      s_live = 0;
    }
    if (s_live) *seq = f;
  }
  __syncthreads();
  LlPart p;
  const u64 C = ((S + gridDim.x - 1) / gridDim.x + 7) & ~(u64)7;
  p.lo = (u64)blockIdx.x * C < S ? (u64)blockIdx.x * C : S;
  p.hi = p.lo + C < S ? p.lo + C : S;
  p.flag = s_flag;
  p.parity = s_flag & 1u;
  p.live = s_live != 0;
  return p;
}

// The signature lines of `writer` in rank p's region, block slot b, parity s (LL_SIG_OFFSET in
// layout.rs): two LL lines carrying the writer's call signature with the call's flag.
__device__ __forceinline__ u64 ll_sig(const McastArgs& a, u32 p, u32 b, u32 s, u32 writer) {
  const u32 w = writer_row(p, writer);
  return a.sync[p] + MCAST_LL_SIG_OFFSET + 32ull * ((b * 2 + s) * (MCAST_LL_MAX_RANKS - 1) + w);
}

// With a.check, the last warp's thread t (< nranks, not this rank: sig_thread) stores this
// rank's signature into rank t's signature lines; before its data lines.
__device__ __forceinline__ void ll_sig_send(const McastArgs& a, const LlPart& p) {
  u32 q;
  if (a.check != 0 && sig_thread(a, &q)) sig_lines_store(a, ll_sig(a, q, blockIdx.x, p.parity, a.rank), p.flag);
}

// Reading them. The lines are reused with the landing's parities, by the same argument.
// - The reductions and the all-gather (every thread that writes out awaits lines from every
//   peer): a thread's first wait polls every peer's signature lines with its data lines, all the
//   loads in flight together (ll_wait_peers), so every thread that writes has compared every
//   peer's signature itself; no vote. Measured on 2 x H100 (BENCHMARKS.md), polling them with the
//   data beat the vote below by 0.1 us at 8 bytes and up to 1 us in the all-gather at 32 KiB;
//   loads whose flags are looked at one after the other (separate ll_loads) cost 0.3 us.
// - The broadcast (a rank hears from the root only): the last warp's thread t polls rank t's
//   lines (SigPoll) with its first data wait (ll_wait_sig) or alone at the end (ll_sig_done),
//   and the block votes on the verdict (with the data waits' failures) before anything of out
//   is written.
struct SigPoll {
  u64 at, s0, s1;
  u32 peer;
  bool pending;
};
// `voted`: the kernel reads the signature lines this way (the broadcast; else nothing is pending).
__device__ __forceinline__ SigPoll ll_sig_poll(const McastArgs& a, const LlPart& p, bool voted) {
  SigPoll sp;
  sp.pending = voted && a.check != 0 && sig_thread(a, &sp.peer);
  sp.at = sp.pending ? ll_sig(a, a.rank, blockIdx.x, p.parity, sp.peer) : 0;
  sp.s0 = sp.s1 = 0;
  return sp;
}
// The signature lines have come: false, with the mismatch recorded, where they differ.
__device__ __forceinline__ bool sig_arrived(const McastArgs& a, SigPoll& sp) {
  sp.pending = false;
  return !sig_bad(a, false, true, sp.peer, sp.s0, sp.s1);
}
// ll_wait, polling sp's signature lines in the same loop while they are pending: false also where
// they came and differ (recorded), so a line a disagreeing peer never sends is not waited for.
__device__ bool ll_wait_sig(const McastArgs& a, u64 addr, u32 flag, u64* v, u64* start, u32 writer, SigPoll& sp) {
  if (!sp.pending) return ll_wait(a, addr, flag, v, start, writer);
  u32 spins = 0;
  while (true) {
    const bool d = ll_load(addr, flag, v);
    const bool h0 = ll_load(sp.at, flag, &sp.s0), h1 = ll_load(sp.at + 16, flag, &sp.s1);
    if (h0 && h1) {
      if (!sig_arrived(a, sp)) return false;
      return d || ll_wait(a, addr, flag, v, start, writer);
    }
    if (d) return true;
    if ((++spins & 255u) == 0 && !poll_on(a, start, writer, 1, MCAST_KIND_LL, sp.peer, sp.at, flag)) return false;
  }
}
// ll_wait that also polls rank `writer`'s signature lines at `sat` until they come, in the same
// loop: false also where they differ (recorded). A thread's first wait on each peer whose lines
// it reduces or copies in a team of two (ll_wait_peers).
__device__ bool ll_wait_signed(const McastArgs& a, u64 addr, u32 flag, u64* v, u64* start, u32 writer, u64 sat) {
  u32 spins = 0;
  while (true) {
    // One asm: the three loads are in flight together (separate ll_loads wait for each other
    // where one's flag decides whether the next runs).
    u64 x0, y0, x1, y1, x2, y2;
    asm volatile(
        "ld.volatile.global.v2.u64 {%0, %1}, [%6];\n\t"
        "ld.volatile.global.v2.u64 {%2, %3}, [%7];\n\t"
        "ld.volatile.global.v2.u64 {%4, %5}, [%7+16];"
        : "=l"(x0), "=l"(y0), "=l"(x1), "=l"(y1), "=l"(x2), "=l"(y2)
        : "l"(addr), "l"(sat)
        : "memory");
    u64 s0, s1;
    if (ll_lanes(x1, y1, flag, &s0) && ll_lanes(x2, y2, flag, &s1)) {
      if (s0 != a.sig[0] || s1 != a.sig[1]) {
        record_mismatch(a, writer, s0, s1);
        return false;
      }
      return ll_lanes(x0, y0, flag, v) || ll_wait(a, addr, flag, v, start, writer);
    }
    if ((++spins & 255u) == 0 && !poll_on(a, start, writer, 1, MCAST_KIND_LL, writer, sat, flag)) return false;
  }
}

// Line `line` (bytes from a row's start) of this block's landing rows from every peer in `need`
// (bit q: rank q), into v[q]. W (wide): teams of three or more. The peers are taken
// MCAST_LL_WAIT_GROUP at a time, and the loads of every peer of the group still pending are
// issued together on each pass and only then looked at: once the lines are there a thread waits
// about one load's latency per group, where waiting on one peer after another costs one per peer
// (the LL kernels' growth with the team: on one H200 shared by teams of 4 and 8, 2026-11-29,
// the all-reduce of 8 bytes from graphs went from 4.21 to 3.93 us and from 5.98 to 5.02 us). A
// group bounds the registers the loads in flight take (seven peers at once spilled). Teams of two (not W) wait on their one
// peer as ll_wait_signed does, in kernels of their own (ll_reduce, ll_copy): the wide code in the
// same kernel cost them 0.15 us. With `sign` (a thread's first line, a.check), each peer's
// signature lines are polled in the same passes until they come: false, recorded, where one
// differs (no vote: every thread that writes out compared every peer itself). False as poll_on,
// every 256 passes, naming the lowest peer still awaited.
#define MCAST_LL_WAIT_GROUP 4
template <bool W>
__device__ __forceinline__ bool ll_wait_peers(const McastArgs& a, const LlPart& p, u64 line, u32 need, bool sign,
                                              u64 v[MCAST_LL_MAX_RANKS], u64* start) {
  const u32 me = a.rank, b = blockIdx.x, G = MCAST_LL_WAIT_GROUP;
  if constexpr (!W) {
    const u32 q = me ^ 1u;
    const u64 at = ll_row(a, me, b, p.parity, q) + line;
    u64 x = 0;
    const bool ok = sign ? ll_wait_signed(a, at, p.flag, &x, start, q, ll_sig(a, me, b, p.parity, q))
                         : ll_wait(a, at, p.flag, &x, start, q);
    v[0] = v[1] = x;  // v[q]; v[me] is not read
    return ok;
  } else {
#pragma unroll
    for (u32 g = 0; g < MCAST_LL_MAX_RANKS; g += G) {
      u32 data = need & (((1u << G) - 1u) << g), sig = sign ? data : 0u, spins = 0;
      while (data | sig) {
        u64 x[G], y[G], s[G][4];
#pragma unroll
        for (u32 j = 0; j < G; ++j) {
          const u32 q = g + j;
          if (data & (1u << q))
            asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];"
                         : "=l"(x[j]), "=l"(y[j])
                         : "l"(ll_row(a, me, b, p.parity, q) + line)
                         : "memory");
          if (sig & (1u << q))
            asm volatile(
                "ld.volatile.global.v2.u64 {%0, %1}, [%4];\n\t"
                "ld.volatile.global.v2.u64 {%2, %3}, [%4+16];"
                : "=l"(s[j][0]), "=l"(s[j][1]), "=l"(s[j][2]), "=l"(s[j][3])
                : "l"(ll_sig(a, me, b, p.parity, q))
                : "memory");
        }
#pragma unroll
        for (u32 j = 0; j < G; ++j) {
          const u32 q = g + j;
          if ((data & (1u << q)) && ll_lanes(x[j], y[j], p.flag, &v[q])) data &= ~(1u << q);
          u64 s0, s1;
          if ((sig & (1u << q)) && ll_lanes(s[j][0], s[j][1], p.flag, &s0) && ll_lanes(s[j][2], s[j][3], p.flag, &s1)) {
            if (s0 != a.sig[0] || s1 != a.sig[1]) {
              record_mismatch(a, q, s0, s1);
              return false;
            }
            sig &= ~(1u << q);
          }
        }
        if ((data | sig) != 0 && (++spins & 255u) == 0) {
          const u32 w = __ffs(data | sig) - 1;
          const bool signed_w = (sig >> w) & 1u;
          if (!poll_on(a, start, w, 1, signed_w ? MCAST_KIND_LL : 0u, w, signed_w ? ll_sig(a, me, b, p.parity, w) : 0,
                       signed_w ? p.flag : 0u))
            return false;
        }
      }
    }
    return true;
  }
}

// The thread's verdict on its signature lines once its data waits are done: true where they
// differ (recorded) or a wait failed (`failed`, or its own).
__device__ bool ll_sig_done(const McastArgs& a, SigPoll& sp, u32 flag, bool failed) {
  if (failed) return true;
  if (!sp.pending) return false;
  if (!sig_lines_wait(a, sp.at, flag, &sp.s0, &sp.s1, sp.peer, 1, MCAST_KIND_LL)) return true;
  return !sig_arrived(a, sp);
}

// sync.cuh's cross_found: rank `writer`'s signature lines of the kinds other than `kind`, for
// this block slot, under the flag each would give this call, while its lines at `at` under
// `flag` are awaited.
__device__ __noinline__ bool cross_found(const McastArgs& a, u32 writer, u32 kind, u64 at, u32 flag) {
  const u32 b = blockIdx.x, n = a.nranks;
  u64 s0 = 0, s1 = 0;
  const auto seen = [&](u64 at, u32 flag) {
    return ll_load(at, flag, &s0) && ll_load(at + 16, flag, &s1) && (s0 != a.sig[0] || s1 != a.sig[1]);
  };
  const auto local = [&](u32 off) { return *(volatile u32*)sync_local(a, off + 4 * b); };
  bool found = false;
  if (kind != MCAST_KIND_BARRIER && n <= MCAST_BAR_SIG_MAX_RANKS)
    found = seen(bar_sig(a, a.rank, b, writer), local(MCAST_EPOCH_OFFSET) + 1);
  if (!found && kind != MCAST_KIND_LL && n <= MCAST_LL_MAX_RANKS && b < MCAST_LL_MAX_BLOCKS) {
    const u32 seq = local(MCAST_LL_SEQ_OFFSET), f = seq >= 0xfffffffeu ? 1u : seq + 1u;
    found = seen(ll_sig(a, a.rank, b, f & 1u, writer), f);
  }
  if (!found && kind != MCAST_KIND_PUSH && n <= MCAST_PUSH_MAX_RANKS) {
    const u32 y0 = local(MCAST_PUSH_SEQ_OFFSET) + 1;
    found = seen(push_sig(a, a.rank, b, y0, writer), y0);
  }
  if (!found) return false;
  // The writer stored the awaited lines before any of a later call: there by now, they were this
  // call's, and what was found its next call's.
  __threadfence_system();
  u64 t0, t1;
  if (ll_load(at, flag, &t0) && ll_load(at + 16, flag, &t1)) return false;
  record_mismatch(a, writer, s0, s1);
  return true;
}

// Whether the block stops before writing out, `bad` this thread's verdict: with a.check the
// block's vote (no thread writes unless every signature agreed), without it the thread's own
// (a thread whose wait failed writes nothing; no barrier is needed). a.check is the same on
// every thread.
__device__ __forceinline__ bool ll_stop(const McastArgs& a, bool bad) {
  return a.check != 0 ? __syncthreads_or(bad) != 0 : bad;
}

// Payload bytes of line i of part p (8 but for the last line of the message).
__device__ __forceinline__ u32 ll_line_bytes(const LlPart& p, u64 i) {
  const u64 left = p.hi - p.lo - i * 8;
  return left < 8 ? (u32)left : 8u;
}
__device__ __forceinline__ u64 ll_lines(const LlPart& p) { return (p.hi - p.lo + 7) / 8; }

// Accumulators for the elements of 8 payload bytes (reduced in rank order, rounded once).
template <int D>
struct Acc8 {
  typedef typename Ty<D>::E E;
  typedef typename Ty<D>::A A;
  static const int K = 8 / sizeof(E);
  union U {
    u64 v;
    E e[K];
  };
  A a[K];
  __device__ __forceinline__ void load(u64 v) {
    U u;
    u.v = v;
#pragma unroll
    for (int i = 0; i < K; ++i) a[i] = Ty<D>::up(u.e[i]);
  }
  template <int O>
  __device__ __forceinline__ void reduce(u64 v) {
    U u;
    u.v = v;
#pragma unroll
    for (int i = 0; i < K; ++i) a[i] = Op<O>::f(a[i], Ty<D>::up(u.e[i]));
  }
  __device__ __forceinline__ u64 pack() const {
    U u;
#pragma unroll
    for (int i = 0; i < K; ++i) u.e[i] = Ty<D>::down(a[i]);
    return u.v;
  }
};

// Reducing LL call (all-reduce: block = 0, S = the whole vector; reduce-scatter: block = the
// bytes of one block, S = block): rank r sends bytes [lo, hi) of block p of its data to every
// peer p (all-reduce: the one vector), then reduces block r of every rank, in rank order, into
// block r of its out.
template <int D, int O, bool W>
__device__ void ll_reduce_in(const McastArgs& a, u64 block, u64 S) {
  const LlPart p = ll_begin(a, S);
  if (!p.live) return;
  const u32 me = a.rank, b = blockIdx.x;
  const u64 src = a.data[me], nl = ll_lines(p);
  ll_sig_send(a, p);
  u64 mine[MCAST_LL_LINES];
#pragma unroll
  for (int k = 0; k < MCAST_LL_LINES; ++k) {
    const u64 i = threadIdx.x + (u64)k * blockDim.x;
    if (i >= nl) break;
    const u64 off = p.lo + i * 8;
    const u32 n = ll_line_bytes(p, i);
    mine[k] = ld_payload(src + (u64)me * block + off, n);
    for (u32 j = 0; j + 1 < a.nranks; ++j) {
      const u32 q = peer_at(a, j);
      ll_store(ll_row(a, q, b, p.parity, me) + i * 16, block ? ld_payload(src + (u64)q * block + off, n) : mine[k], p.flag);
    }
  }
  // Every line is awaited from every peer at once (ll_wait_peers) and reduced into registers in
  // rank order; with a.check a thread's first wait also awaits every peer's signature lines, so a
  // thread writes its lines of out only where every peer agreed, with no vote.
  bool bad = false;
  u64 start = 0, res[MCAST_LL_LINES];
  const u32 need = ((1u << a.nranks) - 1u) & ~(1u << me);
#pragma unroll
  for (int k = 0; k < MCAST_LL_LINES; ++k) {
    const u64 i = threadIdx.x + (u64)k * blockDim.x;
    if (i >= nl) break;
    u64 v[MCAST_LL_MAX_RANKS];
    if (!ll_wait_peers<W>(a, p, i * 16, need, k == 0 && a.check != 0, v, &start)) {
      bad = true;
      break;
    }
    Acc8<D> acc;
#pragma unroll
    for (u32 q = 0; q < (W ? MCAST_LL_MAX_RANKS : 2u); ++q) {
      if (q >= a.nranks) break;
      const u64 x = q == me ? mine[k] : v[q];
      if (q == 0)
        acc.load(x);
      else
        acc.template reduce<O>(x);
    }
    res[k] = acc.pack();
  }
  if (bad) return;
#pragma unroll
  for (int k = 0; k < MCAST_LL_LINES; ++k) {
    const u64 i = threadIdx.x + (u64)k * blockDim.x;
    if (i >= nl) break;
    st_payload(a.out[me] + (u64)me * block + p.lo + i * 8, res[k], ll_line_bytes(p, i));
  }
}
template <int D, int O>
__device__ void ll_reduce(const McastArgs& a, u64 block, u64 S) {
  if (a.nranks == 2)
    ll_reduce_in<D, O, false>(a, block, S);
  else
    ll_reduce_in<D, O, true>(a, block, S);
}

// Copying LL call (all-gather: every rank sends its block r of S = count bytes; broadcast: the
// root sends its S = count bytes, block 0): every receiver stores each sender's part into the
// sender's block of its out; a sender out of place also copies its own part. Broadcast's other
// ranks send each peer one acknowledgement line (payload 0) and wait for theirs: every rank
// hears from every peer in every call, which the reuse of the landing relies on.
template <bool W>
__device__ void ll_copy_in(const McastArgs& a, bool gather) {
  const u64 S = a.count;
  const LlPart p = ll_begin(a, S);
  if (!p.live) return;
  const u32 me = a.rank, b = blockIdx.x, t = threadIdx.x;
  const u64 nl = ll_lines(p);
  const bool sends = gather || me == a.root;
  const u64 blk = gather ? (u64)me * S : 0, ostride = gather ? out_stride(a) : 0;
  ll_sig_send(a, p);
  if (!sends && t < a.nranks && t != me) ll_store(ll_row(a, t, b, p.parity, me), 0, p.flag);
  u64 mine[MCAST_LL_LINES];
#pragma unroll
  for (int k = 0; k < MCAST_LL_LINES; ++k) {
    const u64 i = t + (u64)k * blockDim.x;
    if (i >= nl || !sends) break;
    const u64 off = blk + p.lo + i * 8;
    mine[k] = ld_payload(a.data[me] + off, ll_line_bytes(p, i));
    for (u32 j = 0; j + 1 < a.nranks; ++j) ll_store(ll_row(a, peer_at(a, j), b, p.parity, me) + i * 16, mine[k], p.flag);
  }
  // Every line is awaited into registers. In an all-gather, from every peer at once, as in
  // ll_reduce (with a.check a thread's first wait also awaits every peer's signature lines); in a
  // broadcast (a rank hears from the root only) the signature threads poll them (SigPoll) and the
  // block votes before anything of out is written.
  SigPoll sp = ll_sig_poll(a, p, !gather);
  bool bad = false;
  u64 start = 0, v = 0;
  if (!gather && t < a.nranks && t != me && t != a.root &&
      !ll_wait_sig(a, ll_row(a, me, b, p.parity, t), p.flag, &v, &start, t, sp))
    bad = true;
  const u32 need = ((1u << a.nranks) - 1u) & ~(1u << me);
  u64 got[MCAST_LL_LINES][MCAST_LL_MAX_RANKS];
#pragma unroll
  for (int k = 0; k < MCAST_LL_LINES; ++k) {
    const u64 i = t + (u64)k * blockDim.x;
    if (i >= nl || bad) break;
    if (gather) {
      bad = !ll_wait_peers<W>(a, p, i * 16, need, k == 0 && a.check != 0, got[k], &start);
      continue;
    }
#pragma unroll
    for (u32 q = 0; q < (W ? MCAST_LL_MAX_RANKS : 2u); ++q) {
      if (q >= a.nranks || bad) break;
      if (q == me || q != a.root) continue;
      bad = !ll_wait_sig(a, ll_row(a, me, b, p.parity, q) + i * 16, p.flag, &v, &start, q, sp);
      got[k][q] = v;
    }
  }
  if (gather ? bad : ll_stop(a, ll_sig_done(a, sp, p.flag, bad))) return;
#pragma unroll
  for (int k = 0; k < MCAST_LL_LINES; ++k) {
    const u64 i = t + (u64)k * blockDim.x;
    if (i >= nl) break;
    const u32 n = ll_line_bytes(p, i);
    // A sender out of place copies its own part.
    if (sends && a.out[me] != a.data[me]) st_payload(a.out[me] + (u64)me * ostride + p.lo + i * 8, mine[k], n);
#pragma unroll
    for (u32 q = 0; q < (W ? MCAST_LL_MAX_RANKS : 2u); ++q) {
      if (q >= a.nranks) break;
      if (q == me || (!gather && q != a.root)) continue;
      st_payload(a.out[me] + (u64)q * ostride + p.lo + i * 8, got[k][q], n);
    }
  }
}
__device__ void ll_copy(const McastArgs& a, bool gather) {
  if (a.nranks == 2)
    ll_copy_in<false>(a, gather);
  else
    ll_copy_in<true>(a, gather);
}
