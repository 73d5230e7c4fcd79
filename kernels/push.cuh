// kernels/push.cuh: the push protocol the push kernels share (all_reduce/push.cu,
// reduce_scatter/push.cu): every rank stores its parts into its row of every peer's scratch,
// publishes per-step flags, and reduces what its peers stored into its own rows. No kernel of it
// reads a peer's memory.
//
// Three forms (MODE), by what destination p receives from every rank:
//   MCAST_PUSH_ALL       the whole message (the push all-reduce: every rank reduces everything);
//   MCAST_PUSH_RS        block p, at p * P (the reduce-scatter, P = one rank's block);
//   MCAST_PUSH_TWO_SHOT  slice p, at p * P (P = the message's bytes / N, rounded up to 16: the
//                        two-shot all-reduce), the last slices shorter or empty; the rank stores
//                        its reduced slice into every rank's out, and an exit barrier ends the
//                        kernel, whose release carries those stores.
// The P bytes a destination gets are cut into steps of gridDim.x parts of at most a.push_row
// bytes (the host's choice, within a scratch row); in step j block b owns [j*G*R + b*Cj, +Cj)
// with Cj the step's bytes split evenly (16-byte multiples), the same part of every
// destination's bytes (clamped to a shorter slice).
// Per step a block copies its part of each destination's bytes into its row of that peer's
// scratch (slot (push sequence) % MCAST_PUSH_SLOTS), publishes the step's sequence number in its
// flag word of every peer's sync region (st.release), waits until every peer's flag in its own
// region reaches that number (acquire), and reduces the peers' rows and its own bytes, in rank
// order, into its out. Pipelined: step j + 1 is stored before step j is awaited and reduced, and
// published after.
// Scratch reuse: a rank publishes sequence y only after it reduced sequence y - 1 (the first
// step of a kernel after finishing every earlier push kernel), and it stores into slot
// y % MCAST_PUSH_SLOTS (last used by y - 3 or earlier) only after seeing every peer's flag at
// y - 2 or later, which that peer published after reducing y - 3. Flags are per writer (not a
// sum), so they are exact however far apart ranks run. The push sequence lives in the rank's
// local state (MCAST_PUSH_SEQ_OFFSET), apart from the barrier epochs; no barrier kernel touches
// the scratch.
// In place is safe with no entry barrier: a rank reads its own data only, and in the two-shot
// form it stores slice q of rank p's out only after p's flag for that step, which p published
// after loading that part of its slice q.
#define MCAST_PUSH_ALL 0
#define MCAST_PUSH_RS 1
#define MCAST_PUSH_TWO_SHOT 2

__device__ __forceinline__ u64 push_slot_row(const McastArgs& a, u32 p, u32 slot, u32 s, u32 writer) {
  const u32 w = writer_row(p, writer);
  const u64 row = a.nranks <= 2 ? MCAST_PUSH_CHUNK : MCAST_PUSH_CHUNK_WIDE;
  return a.sync[p] + MCAST_SCRATCH_OFFSET + (((u64)slot * MCAST_PUSH_SLOTS + s) * (a.nranks - 1) + w) * row;
}
__device__ __forceinline__ u64 push_flag(const McastArgs& a, u32 p, u32 slot, u32 writer) {
  return a.sync[p] + MCAST_SIGNAL_OFFSET + slot * MCAST_SIGNAL_STRIDE + MCAST_PUSH_FLAG_OFFSET + 4 * writer;
}

// Block blockIdx.x's part [lo, hi) of step j of S bytes, steps of `row` bytes per block.
__device__ __forceinline__ void push_part(u64 S, u64 row, u32 j, u64* lo, u64* hi) {
  const u64 per_step = (u64)gridDim.x * row;
  const u64 base = (u64)j * per_step;
  const u64 len = S - base < per_step ? S - base : per_step;
  const u64 C = ((len + gridDim.x - 1) / gridDim.x + 15) & ~(u64)15;
  const u64 l = (u64)blockIdx.x * C < len ? (u64)blockIdx.x * C : len;
  *lo = base + l;
  *hi = base + (l + C < len ? l + C : len);
}

// Bytes each destination gets from each rank (P) in MODE, for a message of `bytes` (the
// all-reduce's) or a block of `bytes` (the reduce-scatter's).
template <int MODE>
__device__ __forceinline__ u64 push_bytes(const McastArgs& a, u64 bytes) {
  return MODE == MCAST_PUSH_TWO_SHOT ? ((bytes + a.nranks - 1) / a.nranks + 15) & ~(u64)15 : bytes;
}
// Where destination p's bytes start in the data (and in out): 0 when every rank gets the whole
// message, else p * P.
template <int MODE>
__device__ __forceinline__ u64 push_at(u32 p, u64 P) {
  return MODE == MCAST_PUSH_ALL ? 0 : (u64)p * P;
}
// How many bytes of a two-shot's slice p exist: P, less at the end of the message's `total`
// (every other form's destinations get all P).
__device__ __forceinline__ u64 slice_len(u32 p, u64 P, u64 total) {
  const u64 at = (u64)p * P;
  return at >= total ? 0 : (total - at < P ? total - at : P);
}

// This block's threads copy bytes [0, len) at src to dst(i) for every i < n: 16-byte vectors
// where `vec` (MCAST_PUSH_UNROLL loads in flight, each stored n times), elements of E after.
template <class E, class Dst>
__device__ __forceinline__ void push_copy(u64 src, u64 len, bool vec, u32 n, Dst dst) {
  const u64 nv = vec ? len / 16 : 0;
  // Loads first, then stores: the compiler cannot move a load past a store that may alias it.
  for (u64 v0 = threadIdx.x; v0 < nv; v0 += (u64)blockDim.x * MCAST_PUSH_UNROLL) {
    V16 x[MCAST_PUSH_UNROLL];
#pragma unroll
    for (int u = 0; u < MCAST_PUSH_UNROLL; ++u) {
      const u64 v = v0 + (u64)u * blockDim.x;
      if (v < nv) x[u] = ld16(src + v * 16);
    }
    for (u32 i = 0; i < n; ++i) {
      const u64 to = dst(i);
#pragma unroll
      for (int u = 0; u < MCAST_PUSH_UNROLL; ++u) {
        const u64 v = v0 + (u64)u * blockDim.x;
        if (v < nv) st16(to + v * 16, x[u]);
      }
    }
  }
  for (u64 e = nv * 16 / sizeof(E) + threadIdx.x; e < len / sizeof(E); e += blockDim.x) {
    const E x = ((const E*)src)[e];
    for (u32 i = 0; i < n; ++i) ((E*)dst(i))[e] = x;
  }
}

template <int D, int O, int MODE>
__device__ void p2p_push(const McastArgs& a) {
  typedef typename Ty<D>::E E;
  typedef typename Ty<D>::A A;
  __shared__ u32 s_seq, s_live, s_ok;
  const u32 slot = blockIdx.x, me = a.rank, N = a.nranks;
  const u64 total = a.count * sizeof(E);
  const u64 P = push_bytes<MODE>(a, total);
  const u64 per_step = (u64)gridDim.x * a.push_row;
  const u32 steps = (u32)((P + per_step - 1) / per_step);
  const u64 src = a.data[me];
  // Vectors where the addresses are 16-byte aligned (rows always are), elements otherwise: the
  // pushes and the loads of this rank's own bytes where its data and every destination's start
  // are, the reduction's stores where its outs are too (the push all-reduce: one choice for
  // both, its data and out). The choice is this rank's alone: peers only see its rows (and, in
  // the two-shot, its stores into their outs, vectors or elements alike), so an out of this
  // rank's own alignment (the pointer form's recv) costs only its own stores.
  u64 om = a.out[me];
  if (MODE == MCAST_PUSH_TWO_SHOT)
    for (u32 q = 0; q < N; ++q) om |= a.out[q];
  const bool vec = ((src | (MODE == MCAST_PUSH_ALL ? om : P)) & 15) == 0;
  const bool vec_out = MODE == MCAST_PUSH_ALL ? vec : vec && (om & 15) == 0;
  if (threadIdx.x == 0) {
    s_seq = *(volatile u32*)sync_local(a, MCAST_PUSH_SEQ_OFFSET + 4 * slot);
    const u32 state = *(volatile u32*)sync_local(a, MCAST_STATE_OFFSET);
    s_live = *(volatile u32*)sync_local(a, MCAST_ERROR_OFFSET) == MCAST_ERR_NONE;
    // A failed team (aborted, a rank timed out): record it and push nothing.
    if (s_live && state != MCAST_STATE_OK) {
      record_error(a, state_error(state), slot, 0);
      s_live = 0;
    }
  }
  __syncthreads();
  if (!s_live) return;
  const u32 seq0 = s_seq;
  // This block's part of step j of destination p's bytes: [*lo, *hi) from the start of them.
  auto part = [&](u32 j, u32 p, u64* lo, u64* hi) {
    push_part(P, a.push_row, j, lo, hi);
    if (MODE == MCAST_PUSH_TWO_SHOT) {
      const u64 len = slice_len(p, P, total);
      if (*lo > len) *lo = len;
      if (*hi > len) *hi = len;
    }
  };
  // Store this rank's part of step j (sequence seq0 + j + 1) into its row of every peer's scratch:
  // one load for every peer where they all get the same bytes, a copy per peer otherwise.
  auto push = [&](u32 j) {
    const u32 s = (seq0 + j + 1) % MCAST_PUSH_SLOTS;
    u64 lo, hi;
    if (MODE == MCAST_PUSH_ALL) {
      part(j, me, &lo, &hi);
      push_copy<E>(src + lo, hi - lo, vec, N - 1, [&](u32 i) { return push_slot_row(a, peer_at(a, i), slot, s, me); });
    } else {
      for (u32 i = 0; i + 1 < N; ++i) {
        const u32 p = peer_at(a, i);
        part(j, p, &lo, &hi);
        const u64 row = push_slot_row(a, p, slot, s, me);
        push_copy<E>(src + push_at<MODE>(p, P) + lo, hi - lo, vec, 1, [&](u32) { return row; });
      }
    }
  };
  // Publish step j to every peer: __syncthreads makes the block's stores visible to the
  // publishing threads, and their release stores are cumulative.
  auto publish = [&](u32 j) {
    __syncthreads();
    if (threadIdx.x < N && threadIdx.x != me) mcast_dev__st_release(push_flag(a, threadIdx.x, slot, me), seq0 + j + 1);
  };
  push(0);
  publish(0);
  // The call's signature, as two flagged lines (flag: its first sequence number y0) after the
  // first publish, in parity y0 & 1 of the block slot's lines: the last warp stores them and polls
  // its peers' while thread 0 waits for step 0, and the block votes before it reduces. Reuse: a
  // writer's next call of the same parity starts after it saw every peer's flag past y0, which
  // a peer publishes only after step 0 of this call, after reading the lines (a one-step call
  // moves to the other parity).
  const u32 y0 = seq0 + 1;
  u32 sq;
  const bool sig = a.check != 0 && sig_thread(a, &sq);
  if (sig) sig_lines_store(a, push_sig(a, sq, slot, y0, me), y0);
  // Where this rank's reduced bytes go: its out, at its block or slice; in the two-shot every
  // rank's out, in the walk order of peer_at (this rank's last).
  const u64 at = push_at<MODE>(me, P);
  const u32 nout = MODE == MCAST_PUSH_TWO_SHOT ? N : 1;
  // Vectors per rank in flight while reducing: the push all-reduce's measured MCAST_PUSH_RED_UNROLL
  // (it spills 76 bytes a thread at 4, by ptxas -v for sm_90); two in the other forms, which then
  // spill nothing (at 4: 88 bytes in the reduce-scatter, 168 in the two-shot).
  constexpr int RU = MODE == MCAST_PUSH_ALL ? MCAST_PUSH_RED_UNROLL : 2;
  auto out_at = [&](u32 i) { return (MODE == MCAST_PUSH_TWO_SHOT ? a.out[peer_at(a, i)] : a.out[me]) + at; };
  for (u32 j = 0; j < steps; ++j) {
    // Step j + 1's stores drain while step j is awaited and reduced; they are published after.
    if (j + 1 < steps) push(j + 1);
    const u32 y = seq0 + j + 1, s = y % MCAST_PUSH_SLOTS;
    if (threadIdx.x == 0) {
      u32 ok = 1;
      for (u32 p = 0; p < N && ok; ++p)
        if (p != me) ok = wait_count(a, push_flag(a, me, slot, p), y, slot, j, (int)p);
      s_ok = ok;
    }
    bool bad = false;
    if (j == 0 && sig) {
      u64 s0 = 0, s1 = 0;
      const bool failed = !sig_lines_wait(a, push_sig(a, me, slot, y0, sq), y0, &s0, &s1, sq, 0, MCAST_KIND_PUSH);
      bad = sig_bad(a, failed, true, sq, s0, s1);
    }
    if (__syncthreads_or(bad) || !s_ok) return;
    u64 lo, hi;
    part(j, me, &lo, &hi);
    const u64 own = src + at + lo, nv = vec_out ? (hi - lo) / 16 : 0;
    for (u64 v0 = threadIdx.x; v0 < nv; v0 += (u64)blockDim.x * RU) {
      V16 x[MCAST_PUSH_MAX_RANKS][RU];
#pragma unroll
      for (u32 q = 0; q < MCAST_PUSH_MAX_RANKS; ++q) {
        if (q >= N) break;
        const u64 base = q == me ? own : push_slot_row(a, me, slot, s, q);
#pragma unroll
        for (int u = 0; u < RU; ++u) {
          const u64 v = v0 + (u64)u * blockDim.x;
          if (v < nv) x[q][u] = ld16(base + v * 16);
        }
      }
#pragma unroll
      for (int u = 0; u < RU; ++u) {
        const u64 v = v0 + (u64)u * blockDim.x;
        if (v >= nv) break;
        Vec<D> acc;
        acc.load(x[0][u]);
#pragma unroll
        for (u32 q = 1; q < MCAST_PUSH_MAX_RANKS; ++q)
          if (q < N) acc.template reduce<O>(x[q][u]);
        const V16 r = acc.pack();
        for (u32 i = 0; i < nout; ++i) st16(out_at(i) + lo + v * 16, r);
      }
    }
    for (u64 e = nv * 16 / sizeof(E) + threadIdx.x; e < (hi - lo) / sizeof(E); e += blockDim.x) {
      A acc = A();
      for (u32 q = 0; q < N; ++q) {
        const E x = q == me ? ((const E*)own)[e] : ((const E*)push_slot_row(a, me, slot, s, q))[e];
        acc = q == 0 ? Ty<D>::up(x) : Op<O>::f(acc, Ty<D>::up(x));
      }
      const E r = Ty<D>::down(acc);
      for (u32 i = 0; i < nout; ++i) ((E*)(out_at(i) + lo))[e] = r;
    }
    if (j + 1 < steps) publish(j + 1);
  }
  if (threadIdx.x == 0) *(volatile u32*)sync_local(a, MCAST_PUSH_SEQ_OFFSET + 4 * slot) = seq0 + steps;
  if (MODE == MCAST_PUSH_TWO_SHOT) barrier<false>(a, 1);
}
