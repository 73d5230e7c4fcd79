// kernels/all_reduce/push.cu: the push all-reduce (every rank stores its data into its peers'
// scratch rows) and its entry points mcast_all_reduce_p2p_push_<dtype>_<op>.

// Push all-reduce (nranks <= MCAST_PUSH_MAX_RANKS): reads nothing but this rank's own data, so
// it serves the pointer form on memory no peer can map, at any size, in one launch.
// The message is cut into steps of gridDim.x parts of at most a.push_row bytes (the host's choice,
// within a scratch row); in step j block b owns [j*G*R + b*Cj, +Cj) with Cj the step's bytes
// split evenly (16-byte multiples).
// Per step a block copies its part of this rank's data into its row of every peer's scratch
// (slot (push sequence) % MCAST_PUSH_SLOTS), publishes the step's sequence number in its flag word
// of every peer's sync region (st.release), waits until every peer's flag in its own region
// reaches that number (acquire), and reduces the peers' rows and its own data, in rank order,
// into its out. Pipelined: step j + 1 is stored before step j is awaited and reduced, and
// published after.
// Scratch reuse: a rank publishes sequence y only after it reduced sequence y - 1 (the first
// step of a kernel after finishing every earlier push kernel), and it stores into slot
// y % MCAST_PUSH_SLOTS (last used by y - 3 or earlier) only after seeing every peer's flag at
// y - 2 or later, which that peer published after reducing y - 3. Flags are per writer (not a
// sum), so they are exact however far apart ranks run. The push sequence lives in the rank's local state (MCAST_PUSH_SEQ_OFFSET), apart
// from the barrier epochs; no barrier kernel touches the scratch.
__device__ __forceinline__ u64 push_slot_row(const McastArgs& a, u32 p, u32 slot, u32 s, u32 writer) {
  const u32 w = writer_row(p, writer);
  const u64 row = a.nranks <= 2 ? MCAST_PUSH_CHUNK : MCAST_PUSH_CHUNK_WIDE;
  return a.sync[p] + MCAST_SCRATCH_OFFSET + (((u64)slot * MCAST_PUSH_SLOTS + s) * (a.nranks - 1) + w) * row;
}
__device__ __forceinline__ u64 push_flag(const McastArgs& a, u32 p, u32 slot, u32 writer) {
  return a.sync[p] + MCAST_SIGNAL_OFFSET + slot * MCAST_SIGNAL_STRIDE + MCAST_PUSH_FLAG_OFFSET + 4 * writer;
}
__device__ __forceinline__ void st_release_sys(u64 addr, u32 v) { mcast_dev__st_release(addr, v); }

// Block blockIdx.x's part [lo, hi) of step j of a message of S bytes, steps of `row` bytes per block.
__device__ __forceinline__ void push_part(u64 S, u64 row, u32 j, u64* lo, u64* hi) {
  const u64 per_step = (u64)gridDim.x * row;
  const u64 base = (u64)j * per_step;
  const u64 len = S - base < per_step ? S - base : per_step;
  const u64 C = ((len + gridDim.x - 1) / gridDim.x + 15) & ~(u64)15;
  const u64 l = (u64)blockIdx.x * C < len ? (u64)blockIdx.x * C : len;
  *lo = base + l;
  *hi = base + (l + C < len ? l + C : len);
}

template <int D, int O>
__device__ void all_reduce_p2p_push(const McastArgs& a) {
  typedef typename Ty<D>::E E;
  typedef typename Ty<D>::A A;
  __shared__ u32 s_seq, s_live, s_ok;
  const u32 slot = blockIdx.x, me = a.rank;
  const u64 S = a.count * sizeof(E);
  const u64 per_step = (u64)gridDim.x * a.push_row;
  const u32 steps = (u32)((S + per_step - 1) / per_step);
  const u64 src = a.data[me], dst = a.out[me];
  // Vectors where both of this rank's sides are 16-byte aligned (rows always are); elements
  // otherwise. The choice is this rank's alone: peers only see its rows.
  const bool vec = ((src | dst) & 15) == 0;
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
  // Store this rank's part of step j (sequence seq0 + j + 1) into its row of every peer's scratch.
  auto push = [&](u32 j) {
    const u32 s = (seq0 + j + 1) % MCAST_PUSH_SLOTS;
    u64 lo, hi;
    push_part(S, a.push_row, j, &lo, &hi);
    const u64 nv = vec ? (hi - lo) / 16 : 0;
    // Loads first, then stores: the compiler cannot move a load past a store that may alias it.
    for (u64 v0 = threadIdx.x; v0 < nv; v0 += (u64)blockDim.x * MCAST_PUSH_UNROLL) {
      V16 x[MCAST_PUSH_UNROLL];
#pragma unroll
      for (int u = 0; u < MCAST_PUSH_UNROLL; ++u) {
        const u64 v = v0 + (u64)u * blockDim.x;
        if (v < nv) x[u] = ld16(src + lo + v * 16);
      }
      for (u32 i = 0; i + 1 < a.nranks; ++i) {
        const u32 p = peer_at(a, i);
        const u64 row = push_slot_row(a, p, slot, s, me);
#pragma unroll
        for (int u = 0; u < MCAST_PUSH_UNROLL; ++u) {
          const u64 v = v0 + (u64)u * blockDim.x;
          if (v < nv) st16(row + v * 16, x[u]);
        }
      }
    }
    for (u64 e = nv * 16 / sizeof(E) + threadIdx.x; e < (hi - lo) / sizeof(E); e += blockDim.x) {
      const E x = ((const E*)(src + lo))[e];
      for (u32 i = 0; i + 1 < a.nranks; ++i) ((E*)push_slot_row(a, peer_at(a, i), slot, s, me))[e] = x;
    }
  };
  // Publish step j to every peer: __syncthreads makes the block's stores visible to the
  // publishing threads, and their release stores are cumulative.
  auto publish = [&](u32 j) {
    __syncthreads();
    if (threadIdx.x < a.nranks && threadIdx.x != me) st_release_sys(push_flag(a, threadIdx.x, slot, me), seq0 + j + 1);
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
  for (u32 j = 0; j < steps; ++j) {
    // Step j + 1's stores drain while step j is awaited and reduced; they are published after.
    if (j + 1 < steps) push(j + 1);
    const u32 y = seq0 + j + 1, s = y % MCAST_PUSH_SLOTS;
    if (threadIdx.x == 0) {
      u32 ok = 1;
      for (u32 p = 0; p < a.nranks && ok; ++p)
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
    push_part(S, a.push_row, j, &lo, &hi);
    const u64 nv = vec ? (hi - lo) / 16 : 0;
    for (u64 v0 = threadIdx.x; v0 < nv; v0 += (u64)blockDim.x * MCAST_PUSH_RED_UNROLL) {
      V16 x[MCAST_PUSH_MAX_RANKS][MCAST_PUSH_RED_UNROLL];
#pragma unroll
      for (u32 q = 0; q < MCAST_PUSH_MAX_RANKS; ++q) {
        if (q >= a.nranks) break;
        const u64 base = q == me ? src + lo : push_slot_row(a, me, slot, s, q);
#pragma unroll
        for (int u = 0; u < MCAST_PUSH_RED_UNROLL; ++u) {
          const u64 v = v0 + (u64)u * blockDim.x;
          if (v < nv) x[q][u] = ld16(base + v * 16);
        }
      }
#pragma unroll
      for (int u = 0; u < MCAST_PUSH_RED_UNROLL; ++u) {
        const u64 v = v0 + (u64)u * blockDim.x;
        if (v >= nv) break;
        Vec<D> acc;
        acc.load(x[0][u]);
#pragma unroll
        for (u32 q = 1; q < MCAST_PUSH_MAX_RANKS; ++q)
          if (q < a.nranks) acc.template reduce<O>(x[q][u]);
        st16(dst + lo + v * 16, acc.pack());
      }
    }
    for (u64 e = nv * 16 / sizeof(E) + threadIdx.x; e < (hi - lo) / sizeof(E); e += blockDim.x) {
      A acc = A();
      for (u32 q = 0; q < a.nranks; ++q) {
        const E x = q == me ? ((const E*)(src + lo))[e] : ((const E*)push_slot_row(a, me, slot, s, q))[e];
        acc = q == 0 ? Ty<D>::up(x) : Op<O>::f(acc, Ty<D>::up(x));
      }
      ((E*)(dst + lo))[e] = Ty<D>::down(acc);
    }
    if (j + 1 < steps) publish(j + 1);
  }
  if (threadIdx.x == 0) *(volatile u32*)sync_local(a, MCAST_PUSH_SEQ_OFFSET + 4 * slot) = seq0 + steps;
}

#define ALL_REDUCE_PUSH(DN, D, ON, O)                                  \
  MCAST_WHEN(MCAST_SEL_all_reduce, MCAST_SEL_##DN, MCAST_SEL_##ON)( \
      KERNEL mcast_all_reduce_p2p_push_##DN##_##ON(ARGS) { all_reduce_p2p_push<D, O>(a); })
MCAST_EACH_REDUCTION(ALL_REDUCE_PUSH)
