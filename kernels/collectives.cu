// mcast collective kernels: broadcast, all-reduce, reduce-scatter, all-gather over multicast
// (multimem) or P2P (peer loads). Header-free: compiled at run time by NVRTC, no CUDA headers.
//
// Build switch: -DMCAST_EMULATE_MULTIMEM replaces every multimem instruction (mc_* functions
// below) by loops over the peers' unicast pointers, so the MULTICAST kernels run on plain P2P
// mappings. The P2P kernels are the same in both builds.
//
// Conventions (see src/kernels/abi.rs, which mirrors this ABI section and asserts it):
// - data[r]: address (valid on this device) of byte `offset` of rank r's copy of the buffer.
// - all-reduce: count elements at data; reduce-scatter: N blocks of count elements, block r at
//   data + r*count*esize; all-gather: block r of count BYTES at data + r*count; broadcast: count
//   bytes from root.
// - out[r]: where the results for rank r's data go, in the same layout as data (out-of-place
//   collectives read data and write out; in place, out == data). The host may pass bases that
//   are not addresses themselves (out - block offset, data - block offset): only the sums the
//   kernels form are dereferenced, in u64 arithmetic.
// - every rank's data[r] and out[r] have the same alignment modulo 16 (symmetric buffers); if
//   not, the P2P kernels fall back to scalar accesses (the host routes the multicast kernels to
//   P2P when out and data disagree modulo 16).

// ============================== ABI (mirrored in src/kernels/abi.rs) ==============================
#define MCAST_MAX_RANKS 72
#define MCAST_MAX_BLOCKS 64
#define MCAST_THREADS 512
#define MCAST_UNROLL 4

// Sync region of each rank (SYNC_BYTES = 64 KiB, zeroed at team creation).
// [0, 4096): signal words, written by every rank (peers and self): one u32 arrival counter per
//   block slot b at MCAST_SIGNAL_OFFSET + b * MCAST_SIGNAL_STRIDE (own 128-byte line).
// [4096, 8192): local state, written only by this rank's kernels:
//   MCAST_ERROR_OFFSET       u32 error code (0 = none), first error wins (atomic CAS);
//   MCAST_ERROR_INFO_OFFSET  u32 detail of the first error: (block slot + 1) | (barrier index << 8);
//   MCAST_EPOCH_OFFSET + 4b  u32 barriers this rank has completed on slot b;
//   MCAST_PUSH_SEQ_OFFSET + 4b  u32 push all-reduce steps this rank has completed on slot b.
// [8192, 8256): team state: MCAST_STATE_OFFSET u32 (MCAST_STATE_OK, or nonzero once the team
//   was aborted), written by the host (mcast_team_abort, in every rank's region, peers' included)
//   and read by every barrier spin: an abort ends device waits within microseconds.
// [8256, 65536): reserved.
#define MCAST_SIGNAL_OFFSET 0
#define MCAST_SIGNAL_STRIDE 64
#define MCAST_LOCAL_OFFSET 4096
#define MCAST_ERROR_OFFSET 4096
#define MCAST_ERROR_INFO_OFFSET 4100
#define MCAST_EPOCH_OFFSET 4352
#define MCAST_ERR_NONE 0
#define MCAST_ERR_TIMEOUT 1
#define MCAST_ERR_ABORTED 2
#define MCAST_STATE_OFFSET 8192
#define MCAST_STATE_OK 0
// Push all-reduce scratch: after the sync region, per block slot b and slot s (0..PUSH_SLOTS-1),
// one row per writer other than the owner (see push_slot_row): MCAST_PUSH_CHUNK bytes for teams of
// two, MCAST_PUSH_CHUNK_WIDE for three or four.
// Its flags: the u32 at signal slot b + MCAST_PUSH_FLAG_OFFSET + 4 * writer holds the last push
// sequence number that writer published to this rank (words 1..4 of the slot's 64 bytes; word 0
// is the barrier counter). MCAST_PUSH_SEQ_OFFSET + 4b (local state): push sequence numbers this
// rank has completed on slot b.
#define MCAST_SCRATCH_OFFSET 65536
#define MCAST_PUSH_CHUNK 65536
#define MCAST_PUSH_CHUNK_WIDE 32768
#define MCAST_PUSH_MAX_RANKS 4
#define MCAST_PUSH_SLOTS 3
#define MCAST_PUSH_UNROLL 8      // vectors in flight per thread when pushing
#define MCAST_PUSH_RED_UNROLL 4  // per rank when reducing (registers: ranks x this x 16 bytes)
#define MCAST_PUSH_FLAG_OFFSET 4
#define MCAST_PUSH_SEQ_OFFSET 4608

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef unsigned short u16;

// The kernel argument, passed by value: 56 + 24 * MCAST_MAX_RANKS = 1784 bytes, within the 4 KiB
// kernel parameter limit. Mirrors `KernelArgs`.
struct McastArgs {
  u64 data[MCAST_MAX_RANKS];  // 0
  u64 sync[MCAST_MAX_RANKS];  // 8 * MCAST_MAX_RANKS (576)
  u64 data_mc;                // 16 * MCAST_MAX_RANKS (1152): multicast address of data (emulated: data[rank])
  u64 sync_mc;                // 1160: multicast address of the sync region (emulated: sync[rank])
  u64 count;                  // 1168
  u64 timeout_ns;             // 1176: 0 = spin forever
  u32 rank;                   // 1184
  u32 nranks;                 // 1188
  u32 root;                   // 1192: broadcast root
  u32 push_row;               // 1196: push all-reduce: bytes per block and step (<= the row)
  u64 out[MCAST_MAX_RANKS];   // 48 + 16 * MCAST_MAX_RANKS (1200): results, the layout of data (in place: out == data)
  u64 out_mc;                 // 48 + 24 * MCAST_MAX_RANKS (1776): multicast address of out (emulated: out[rank])
};
static_assert(sizeof(McastArgs) == 56 + 24 * MCAST_MAX_RANKS, "McastArgs layout");

// ============================== PTX helpers ==============================
struct alignas(16) V16 {
  u32 x, y, z, w;
};
struct alignas(8) V8 {
  u32 x, y;
};

__device__ __forceinline__ u64 globaltimer() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ u32 ld_acquire_sys(u64 addr) {
  u32 v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_sys_add(u64 addr, u32 v) {
  asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ u32 atom_cas_u32(u64 addr, u32 cmp, u32 val) {
  u32 old;
  asm volatile("atom.global.cas.b32 %0, [%1], %2, %3;" : "=r"(old) : "l"(addr), "r"(cmp), "r"(val) : "memory");
  return old;
}
__device__ __forceinline__ float u32_as_f32(u32 x) {
  float f;
  asm("mov.b32 %0, %1;" : "=f"(f) : "r"(x));
  return f;
}
__device__ __forceinline__ u32 f32_as_u32(float f) {
  u32 x;
  asm("mov.b32 %0, %1;" : "=r"(x) : "f"(f));
  return x;
}
__device__ __forceinline__ double u64_as_f64(u64 x) {
  double f;
  asm("mov.b64 %0, %1;" : "=d"(f) : "l"(x));
  return f;
}
__device__ __forceinline__ u64 f64_as_u64(double f) {
  u64 x;
  asm("mov.b64 %0, %1;" : "=l"(x) : "d"(f));
  return x;
}
__device__ __forceinline__ float bf16_to_f32(u16 h) {
#if __CUDA_ARCH__ >= 900
  float f;
  asm("cvt.f32.bf16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  return u32_as_f32(((u32)h) << 16);  // exact, same result
#endif
}
__device__ __forceinline__ u16 f32_to_bf16(float f) {
#if __CUDA_ARCH__ >= 800
  u16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  const u32 u = f32_as_u32(f);  // round to nearest even, as cvt.rn.bf16.f32
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40);
  return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}
__device__ __forceinline__ float f16_to_f32(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ u16 f32_to_f16(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

// Plain (weak) global accesses. Ordering against peers comes from the barriers (release/acquire
// at system scope, plus __syncthreads inside the block).
__device__ __forceinline__ V16 ld16(u64 addr) { return *(const V16*)addr; }
__device__ __forceinline__ void st16(u64 addr, V16 v) { *(V16*)addr = v; }

// ============================== dtypes and operators ==============================
// Dtype codes as mcast_dtype_t; operator codes as mcast_op_t.
#define D_F32 0
#define D_F64 1
#define D_F16 2
#define D_BF16 3
#define D_I32 4
#define D_U32 5
#define D_I64 6
#define D_U64 7
#define O_SUM 0
#define O_MIN 1
#define O_MAX 2

// E: storage type; A: accumulation type (f32 for 16-bit floats).
template <int D>
struct Ty;
template <>
struct Ty<D_F32> {
  typedef float E;
  typedef float A;
  static __device__ __forceinline__ A up(E x) { return x; }
  static __device__ __forceinline__ E down(A x) { return x; }
};
template <>
struct Ty<D_F64> {
  typedef double E;
  typedef double A;
  static __device__ __forceinline__ A up(E x) { return x; }
  static __device__ __forceinline__ E down(A x) { return x; }
};
template <>
struct Ty<D_F16> {
  typedef u16 E;
  typedef float A;
  static __device__ __forceinline__ A up(E x) { return f16_to_f32(x); }
  static __device__ __forceinline__ E down(A x) { return f32_to_f16(x); }
};
template <>
struct Ty<D_BF16> {
  typedef u16 E;
  typedef float A;
  static __device__ __forceinline__ A up(E x) { return bf16_to_f32(x); }
  static __device__ __forceinline__ E down(A x) { return f32_to_bf16(x); }
};
template <>
struct Ty<D_I32> {
  typedef int E;
  typedef int A;
  static __device__ __forceinline__ A up(E x) { return x; }
  static __device__ __forceinline__ E down(A x) { return x; }
};
template <>
struct Ty<D_U32> {
  typedef u32 E;
  typedef u32 A;
  static __device__ __forceinline__ A up(E x) { return x; }
  static __device__ __forceinline__ E down(A x) { return x; }
};
template <>
struct Ty<D_I64> {
  typedef i64 E;
  typedef i64 A;
  static __device__ __forceinline__ A up(E x) { return x; }
  static __device__ __forceinline__ E down(A x) { return x; }
};
template <>
struct Ty<D_U64> {
  typedef u64 E;
  typedef u64 A;
  static __device__ __forceinline__ A up(E x) { return x; }
  static __device__ __forceinline__ E down(A x) { return x; }
};

// Sums of signed integers wrap (two's complement), computed in unsigned arithmetic.
__device__ __forceinline__ float op_sum(float a, float b) { return a + b; }
__device__ __forceinline__ double op_sum(double a, double b) { return a + b; }
__device__ __forceinline__ int op_sum(int a, int b) { return (int)((u32)a + (u32)b); }
__device__ __forceinline__ u32 op_sum(u32 a, u32 b) { return a + b; }
__device__ __forceinline__ i64 op_sum(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }
__device__ __forceinline__ u64 op_sum(u64 a, u64 b) { return a + b; }

template <int O>
struct Op;
template <>
struct Op<O_SUM> {
  template <class A>
  static __device__ __forceinline__ A f(A a, A b) {
    return op_sum(a, b);
  }
};
template <>
struct Op<O_MIN> {
  template <class A>
  static __device__ __forceinline__ A f(A a, A b) {
    return b < a ? b : a;
  }
};
template <>
struct Op<O_MAX> {
  template <class A>
  static __device__ __forceinline__ A f(A a, A b) {
    return a < b ? b : a;
  }
};

// A 16-byte vector unpacked into accumulators.
template <int D>
struct Vec {
  typedef typename Ty<D>::E E;
  typedef typename Ty<D>::A A;
  static const int K = 16 / sizeof(E);
  A a[K];
  __device__ __forceinline__ void load(V16 v) {
    union {
      V16 v;
      E e[K];
    } u;
    u.v = v;
#pragma unroll
    for (int i = 0; i < K; ++i) a[i] = Ty<D>::up(u.e[i]);
  }
  __device__ __forceinline__ V16 pack() const {
    union {
      V16 v;
      E e[K];
    } u;
#pragma unroll
    for (int i = 0; i < K; ++i) u.e[i] = Ty<D>::down(a[i]);
    return u.v;
  }
  template <int O>
  __device__ __forceinline__ void reduce(V16 v) {
    Vec<D> o;
    o.load(v);
#pragma unroll
    for (int i = 0; i < K; ++i) a[i] = Op<O>::f(a[i], o.a[i]);
  }
};

// ============================== barrier ==============================
// Per-block-slot counting barrier across ranks. Block b of every rank adds 1 to the slot-b
// counter of every rank (release), then waits (acquire) until its own slot-b counter reaches
// (barriers completed on slot b) * nranks; that count lives in the rank's local state and is
// advanced here, so graph replays stay correct. Counters only grow (wrap-safe compare); a rank
// is at most one barrier ahead of any other, so ">= target" is exact. Returns false on timeout
// (error recorded); the caller must then return from the kernel (uniformly for the block).
__device__ __forceinline__ u64 sync_local(const McastArgs& a, u32 off) { return a.sync[a.rank] + off; }

__device__ void mc_red_signal(const McastArgs& a, u64 mc_addr);  // defined with the mc_* functions

// Records error `code` with its detail (block slot, barrier index) unless an error came first.
__device__ __forceinline__ void record_error(const McastArgs& a, u32 code, u32 slot, u32 index) {
  if (atom_cas_u32(sync_local(a, MCAST_ERROR_OFFSET), MCAST_ERR_NONE, code) == MCAST_ERR_NONE)
    *(volatile u32*)sync_local(a, MCAST_ERROR_INFO_OFFSET) = (slot + 1) | (index << 8);
}

// One thread waits until the counter at `flag` reaches `target` (wrap-safe: counters only grow
// and no rank runs more than a few arrivals ahead). The acquire load orders the peers' writes
// before the block's later accesses (the other threads through a __syncthreads after this). An
// abort (the team's state word, from the host here or in a peer process) or the timeout ends the
// wait: the error is recorded and the result is false.
__device__ bool wait_count(const McastArgs& a, u64 flag, u32 target, u32 slot, u32 index) {
  u64 start = 0;
  u32 spins = 0;
  while ((int)(ld_acquire_sys(flag) - target) < 0) {
    if ((++spins & 63u) != 0) continue;
    if (*(volatile u32*)sync_local(a, MCAST_STATE_OFFSET) != MCAST_STATE_OK) {
      record_error(a, MCAST_ERR_ABORTED, slot, index);
      return false;
    }
    if (a.timeout_ns != 0) {
      const u64 now = globaltimer();
      if (start == 0) {
        start = now;
      } else if (now - start > a.timeout_ns) {
        record_error(a, MCAST_ERR_TIMEOUT, slot, index);
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
    // An aborted team: record it and end the kernel before signalling anyone.
    if (s_live && *(volatile u32*)sync_local(a, MCAST_STATE_OFFSET) != MCAST_STATE_OK) {
      record_error(a, MCAST_ERR_ABORTED, slot, index);
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
  if (threadIdx.x == 0) s_ok = wait_count(a, sync_local(a, soff), k * a.nranks, slot, index);
  __syncthreads();
#if !defined(MCAST_EMULATE_MULTIMEM)
  if (MC) asm volatile("fence.proxy.alias;" ::: "memory");
#endif
  return s_ok != 0;
}


// ============================== range layout ==============================
// A range of n units of `unit` bytes at `addr` = head units (before the first 16-byte boundary),
// nv 16-byte vectors, tail units. If `aligned` is false (ranks disagree on alignment modulo 16 or
// the address is not unit-aligned), everything is scalar (head = n).
struct Range {
  u64 head, nv, tail;
};
__device__ __forceinline__ Range split(u64 addr, u64 n, u32 unit, bool aligned) {
  Range r;
  if (!aligned || (addr % unit) != 0) {
    r.head = n;
    r.nv = 0;
    r.tail = 0;
    return r;
  }
  u64 h = ((16 - (addr & 15)) & 15) / unit;
  if (h > n) h = n;
  const u64 rest = (n - h) * unit;
  r.head = h;
  r.nv = rest / 16;
  r.tail = (rest % 16) / unit;
  return r;
}
__device__ __forceinline__ bool same_alignment(const McastArgs& a) {
  u32 m = 0;
  for (u32 p = 0; p < a.nranks; ++p) m |= (u32)(((a.data[p] ^ a.data[0]) | (a.out[p] ^ a.data[0])) & 15);
  return m == 0;
}
__device__ __forceinline__ u64 gtid() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ u64 gthreads() { return (u64)gridDim.x * blockDim.x; }

// ============================== P2P building blocks ==============================
// Reduce element i (scalar) of range at byte offset `off` over all ranks, in rank order 0..N-1.
template <int D, int O>
__device__ __forceinline__ typename Ty<D>::E p2p_reduce_scalar(const McastArgs& a, u64 off) {
  typedef typename Ty<D>::E E;
  typename Ty<D>::A acc = Ty<D>::up(*(const E*)(a.data[0] + off));
  for (u32 p = 1; p < a.nranks; ++p) acc = Op<O>::f(acc, Ty<D>::up(*(const E*)(a.data[p] + off)));
  return Ty<D>::down(acc);
}

// Reduce up to MCAST_UNROLL vectors (byte offsets off[u], valid where u < n) over all ranks in rank
// order. Software-pipelined: the loads of rank p + 1 are in flight while rank p's are reduced, so
// two ranks' latencies (one of them remote) overlap instead of adding up.
template <int D, int O>
__device__ __forceinline__ void p2p_reduce_vectors(const McastArgs& a, const u64* off, int n, V16* out) {
  Vec<D> acc[MCAST_UNROLL];
  V16 cur[MCAST_UNROLL], nxt[MCAST_UNROLL];
#pragma unroll
  for (int u = 0; u < MCAST_UNROLL; ++u)
    if (u < n) cur[u] = ld16(a.data[0] + off[u]);
  if (a.nranks > 1) {
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u)
      if (u < n) nxt[u] = ld16(a.data[1] + off[u]);
  }
#pragma unroll
  for (int u = 0; u < MCAST_UNROLL; ++u)
    if (u < n) acc[u].load(cur[u]);
  for (u32 p = 1; p < a.nranks; ++p) {
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u) cur[u] = nxt[u];
    if (p + 1 < a.nranks) {
#pragma unroll
      for (int u = 0; u < MCAST_UNROLL; ++u)
        if (u < n) nxt[u] = ld16(a.data[p + 1] + off[u]);
    }
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u)
      if (u < n) acc[u].template reduce<O>(cur[u]);
  }
#pragma unroll
  for (int u = 0; u < MCAST_UNROLL; ++u)
    if (u < n) out[u] = acc[u].pack();
}

// Reduce vectors [lo, hi) (vector indices relative to byte `base`) from all ranks into out[rank].
// Vector j is handled by global thread (j - lo) % gthreads(): the same on every rank.
template <int D, int O>
__device__ void p2p_reduce_span(const McastArgs& a, u64 base, u64 lo, u64 hi) {
  const u64 T = gthreads();
  for (u64 j0 = lo + gtid(); j0 < hi; j0 += T * MCAST_UNROLL) {
    u64 off[MCAST_UNROLL];
    int n = 0;
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u) {
      const u64 j = j0 + (u64)u * T;
      off[u] = base + j * 16;
      if (j < hi) n = u + 1;
    }
    V16 r[MCAST_UNROLL];
    p2p_reduce_vectors<D, O>(a, off, n, r);
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u)
      if (u < n) st16(a.out[a.rank] + off[u], r[u]);
  }
}

// Copy vectors [lo, hi) at byte `base` from src to dst (same indexing as p2p_reduce_span).
__device__ void copy_span(u64 dst, u64 src, u64 base, u64 lo, u64 hi) {
  const u64 T = gthreads();
  for (u64 j0 = lo + gtid(); j0 < hi; j0 += T * MCAST_UNROLL) {
    V16 v[MCAST_UNROLL];
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u) {
      const u64 j = j0 + (u64)u * T;
      if (j < hi) v[u] = ld16(src + base + j * 16);
    }
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u) {
      const u64 j = j0 + (u64)u * T;
      if (j < hi) st16(dst + base + j * 16, v[u]);
    }
  }
}

// Copy n bytes from src to dst (any alignment; vectors where both agree modulo 16). Head and tail
// bytes are done by block 0.
__device__ void copy_bytes(u64 dst, u64 src, u64 n) {
  const Range r = split(dst, n, 1, ((dst ^ src) & 15) == 0);
  if (blockIdx.x == 0) {
    for (u64 i = threadIdx.x; i < r.head; i += blockDim.x) *(unsigned char*)(dst + i) = *(const unsigned char*)(src + i);
    const u64 t0 = r.head + r.nv * 16;
    for (u64 i = threadIdx.x; i < r.tail; i += blockDim.x)
      *(unsigned char*)(dst + t0 + i) = *(const unsigned char*)(src + t0 + i);
  }
  copy_span(dst, src, r.head, 0, r.nv);
}

// Byte offset of scalar i of a range laid out as head units, nv vectors, tail units.
__device__ __forceinline__ u64 scalar_off(const Range& r, u64 i, u32 unit) {
  return (i < r.head ? i : i + r.nv * (16 / unit)) * unit;
}

// ============================== P2P kernels ==============================
// One-shot all-reduce, in rounds of gthreads()*UNROLL vectors (block 0 also takes the scalars, one
// per thread per round): each round loads and reduces every rank's values into registers in rank
// order, barriers, then stores this rank's copy. In place is safe because no rank stores before
// every rank has loaded; the barrier before the last stores is the exit barrier (nobody reads this
// rank's copy after it). Barriers are per block slot, so block 0 may run more rounds than others.
template <int D, int O>
__device__ void all_reduce_p2p_oneshot(const McastArgs& a) {
  typedef typename Ty<D>::E E;
  const Range r = split(a.data[0], a.count, sizeof(E), same_alignment(a));
  u32 bi = 0;
  if (!barrier<false>(a, bi++)) return;
  const u64 T = gthreads();
  const u64 per_round = T * MCAST_UNROLL;
  const u64 nscalar = r.head + r.tail;
  u64 rounds = (r.nv + per_round - 1) / per_round;
  if (blockIdx.x == 0) {
    const u64 s = (nscalar + blockDim.x - 1) / blockDim.x;
    if (s > rounds) rounds = s;
  }
  for (u64 rd = 0; rd < rounds; ++rd) {
    u64 off[MCAST_UNROLL];
    int n = 0;
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u) {
      const u64 j = rd * per_round + (u64)u * T + gtid();
      off[u] = r.head * sizeof(E) + j * 16;
      if (j < r.nv) n = u + 1;
    }
    V16 res[MCAST_UNROLL];
    p2p_reduce_vectors<D, O>(a, off, n, res);
    const u64 si = rd * blockDim.x + threadIdx.x;
    const bool has = blockIdx.x == 0 && si < nscalar;
    E s = E();
    u64 soff = 0;
    if (has) {
      soff = scalar_off(r, si, sizeof(E));
      s = p2p_reduce_scalar<D, O>(a, soff);
    }
    if (!barrier<false>(a, bi++)) return;
    if (has) *(E*)(a.out[a.rank] + soff) = s;
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u)
      if (u < n) st16(a.out[a.rank] + off[u], res[u]);
  }
}

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
  const u32 w = writer < p ? writer : writer - 1;  // rows of the nranks - 1 writers other than p
  const u64 row = a.nranks <= 2 ? MCAST_PUSH_CHUNK : MCAST_PUSH_CHUNK_WIDE;
  return a.sync[p] + MCAST_SCRATCH_OFFSET + (((u64)slot * MCAST_PUSH_SLOTS + s) * (a.nranks - 1) + w) * row;
}
__device__ __forceinline__ u64 push_flag(const McastArgs& a, u32 p, u32 slot, u32 writer) {
  return a.sync[p] + MCAST_SIGNAL_OFFSET + slot * MCAST_SIGNAL_STRIDE + MCAST_PUSH_FLAG_OFFSET + 4 * writer;
}
__device__ __forceinline__ void st_release_sys(u64 addr, u32 v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(addr), "r"(v) : "memory");
}

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
    s_live = *(volatile u32*)sync_local(a, MCAST_ERROR_OFFSET) == MCAST_ERR_NONE &&
             *(volatile u32*)sync_local(a, MCAST_STATE_OFFSET) == MCAST_STATE_OK;
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
      for (u32 p = 0; p < a.nranks; ++p) {
        if (p == me) continue;
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
      for (u32 p = 0; p < a.nranks; ++p)
        if (p != me) ((E*)push_slot_row(a, p, slot, s, me))[e] = x;
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
  for (u32 j = 0; j < steps; ++j) {
    // Step j + 1's stores drain while step j is awaited and reduced; they are published after.
    if (j + 1 < steps) push(j + 1);
    const u32 y = seq0 + j + 1, s = y % MCAST_PUSH_SLOTS;
    if (threadIdx.x == 0) {
      u32 ok = 1;
      for (u32 p = 0; p < a.nranks && ok; ++p)
        if (p != me) ok = wait_count(a, push_flag(a, me, slot, p), y, slot, j);
      s_ok = ok;
    }
    __syncthreads();
    if (!s_ok) return;
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

// Two-shot all-reduce: entry barrier; reduce-scatter (rank q owns vectors [nv*q/N, nv*(q+1)/N),
// rank 0 also owns the scalars) by peer loads of data into the owner's out; barrier; all-gather
// by loads from the owners' out; exit barrier (so no rank changes its copy while a peer still reads it).
// Vector j of a slice is handled by the same global thread in both phases on every rank, so the
// per-block-slot middle barrier covers exactly the data each block reads.
template <int D, int O>
__device__ void all_reduce_p2p_twoshot(const McastArgs& a) {
  typedef typename Ty<D>::E E;
  const Range r = split(a.data[0], a.count, sizeof(E), same_alignment(a));
  const u64 N = a.nranks, me = a.rank, base = r.head * sizeof(E), nscalar = r.head + r.tail;
  if (!barrier<false>(a, 0)) return;
  p2p_reduce_span<D, O>(a, base, r.nv * me / N, r.nv * (me + 1) / N);
  if (me == 0 && blockIdx.x == 0)
    for (u64 i = threadIdx.x; i < nscalar; i += blockDim.x) {
      const u64 o = scalar_off(r, i, sizeof(E));
      *(E*)(a.out[0] + o) = p2p_reduce_scalar<D, O>(a, o);
    }
  if (!barrier<false>(a, 1)) return;
  for (u64 q = 0; q < N; ++q)
    if (q != me) copy_span(a.out[me], a.out[q], base, r.nv * q / N, r.nv * (q + 1) / N);
  if (me != 0 && blockIdx.x == 0)
    for (u64 i = threadIdx.x; i < nscalar; i += blockDim.x) {
      const u64 o = scalar_off(r, i, sizeof(E));
      *(E*)(a.out[me] + o) = *(const E*)(a.out[0] + o);
    }
  barrier<false>(a, 2);
}

// Reduce-scatter: rank r reduces block r (at r*count*esize) from every rank into its own out.
template <int D, int O>
__device__ void reduce_scatter_p2p(const McastArgs& a) {
  typedef typename Ty<D>::E E;
  const u64 blk = (u64)a.rank * a.count * sizeof(E);
  const Range r = split(a.data[0] + blk, a.count, sizeof(E), same_alignment(a));
  if (!barrier<false>(a, 0)) return;
  p2p_reduce_span<D, O>(a, blk + r.head * sizeof(E), 0, r.nv);
  if (blockIdx.x == 0)
    for (u64 i = threadIdx.x; i < r.head + r.tail; i += blockDim.x) {
      const u64 o = blk + scalar_off(r, i, sizeof(E));
      *(E*)(a.out[a.rank] + o) = p2p_reduce_scalar<D, O>(a, o);
    }
  barrier<false>(a, 1);
}

// Broadcast (pull): every rank copies count bytes from the root's data into its out (the root
// only out of place).
__device__ void broadcast_p2p(const McastArgs& a) {
  if (!barrier<false>(a, 0)) return;
  if (a.out[a.rank] != a.data[a.root]) copy_bytes(a.out[a.rank], a.data[a.root], a.count);
  barrier<false>(a, 1);
}

// All-gather (pull): rank r copies block q (count bytes at q*count) from rank q's data into its
// out, for every q != r (and q == r out of place).
__device__ void all_gather_p2p(const McastArgs& a) {
  if (!barrier<false>(a, 0)) return;
  for (u32 q = 0; q < a.nranks; ++q)
    if (q != a.rank || a.out[a.rank] != a.data[a.rank])
      copy_bytes(a.out[a.rank] + (u64)q * a.count, a.data[q] + (u64)q * a.count, a.count);
  barrier<false>(a, 1);
}

// ============================== multimem primitives ==============================
// mc_ld_reduce_v16<D,O>(a, mc)    16-byte multimem.ld_reduce (vector form or 2/4 scalar forms)
// mc_ld_reduce_unit<D,O>(a, mc)   one scalar unit: 4 bytes (a 16-bit pair, or one 32-bit element)
//                                 or 8 bytes (one 64-bit element); bits in the low end of a u64
// mc_st_v16(a, mc, v)             16-byte multimem.st (.v4.f32 bit copy), mc an out_mc address
// mc_st_unit<U>(a, mc, bits)      4- or 8-byte multimem.st
// mc_red_signal(a, mc)            multimem.red.release.sys add 1 on the multicast sync region
// Not provided (no hardware form): f32/f64 min/max (routed to the P2P kernels by the host), any
// 16-bit scalar (the host routes odd 16-bit counts and non-4-byte-aligned ranges to P2P).
template <int D>
struct McUnit {
  static const u32 bytes = sizeof(typename Ty<D>::E) >= 8 ? 8 : 4;
};

#if defined(MCAST_EMULATE_MULTIMEM)
// Emulation: the multicast offset (mc - data_mc, or mc - sync_mc) applied to every rank's unicast
// address; reductions in rank order with f32 accumulation for 16-bit floats (as .acc::f32).
template <int D, int O>
__device__ __forceinline__ V16 mc_ld_reduce_v16(const McastArgs& a, u64 mc) {
  const u64 off = mc - a.data_mc;
  Vec<D> acc;
  acc.load(ld16(a.data[0] + off));
  for (u32 p = 1; p < a.nranks; ++p) acc.template reduce<O>(ld16(a.data[p] + off));
  return acc.pack();
}
template <int D, int O>
__device__ __forceinline__ u64 mc_ld_reduce_unit(const McastArgs& a, u64 mc) {
  typedef typename Ty<D>::E E;
  const u64 off = mc - a.data_mc;
  const int n = McUnit<D>::bytes / sizeof(E);
  union {
    u64 b;
    E e[8 / sizeof(E)];
  } u;
  u.b = 0;
  for (int i = 0; i < n; ++i) {
    typename Ty<D>::A acc = Ty<D>::up(*(const E*)(a.data[0] + off + i * sizeof(E)));
    for (u32 p = 1; p < a.nranks; ++p) acc = Op<O>::f(acc, Ty<D>::up(*(const E*)(a.data[p] + off + i * sizeof(E))));
    u.e[i] = Ty<D>::down(acc);
  }
  return u.b;
}
// Stores go to out (mc relative to out_mc), loads come from data (mc relative to data_mc).
__device__ __forceinline__ void mc_st_v16(const McastArgs& a, u64 mc, V16 v) {
  const u64 off = mc - a.out_mc;
  for (u32 p = 0; p < a.nranks; ++p) st16(a.out[p] + off, v);
}
template <u32 U>
__device__ __forceinline__ void mc_st_unit(const McastArgs& a, u64 mc, u64 bits) {
  const u64 off = mc - a.out_mc;
  for (u32 p = 0; p < a.nranks; ++p) {
    if (U == 8)
      *(u64*)(a.out[p] + off) = bits;
    else
      *(u32*)(a.out[p] + off) = (u32)bits;
  }
}
__device__ void mc_red_signal(const McastArgs& a, u64 mc) {
  const u64 off = mc - a.sync_mc;
  for (u32 p = 0; p < a.nranks; ++p) red_release_sys_add(a.sync[p] + off, 1);
}
#else
// Real multimem forms (reference/multimem.md, sm_90).
#define MM "multimem.ld_reduce.relaxed.sys.global."
template <int D, int O>
__device__ __forceinline__ u32 mc_ldr32(u64 mc);
template <int D, int O>
__device__ __forceinline__ u64 mc_ldr64(u64 mc);
#define LDR32(D, O, BODY)                                                          \
  template <>                                                                      \
  __device__ __forceinline__ u32 mc_ldr32<D, O>(u64 mc) {                          \
    u32 v;                                                                         \
    asm volatile(BODY : "=r"(v) : "l"(mc) : "memory");                             \
    return v;                                                                      \
  }
#define LDR64(D, O, BODY)                                                          \
  template <>                                                                      \
  __device__ __forceinline__ u64 mc_ldr64<D, O>(u64 mc) {                          \
    u64 v;                                                                         \
    asm volatile(BODY : "=l"(v) : "l"(mc) : "memory");                             \
    return v;                                                                      \
  }
LDR32(D_F32, O_SUM, "{.reg .f32 t; " MM "add.f32 t, [%1]; mov.b32 %0, t;}")
LDR32(D_BF16, O_SUM, MM "add.acc::f32.bf16x2 %0, [%1];")
LDR32(D_BF16, O_MIN, MM "min.bf16x2 %0, [%1];")
LDR32(D_BF16, O_MAX, MM "max.bf16x2 %0, [%1];")
LDR32(D_F16, O_SUM, MM "add.acc::f32.f16x2 %0, [%1];")
LDR32(D_F16, O_MIN, MM "min.f16x2 %0, [%1];")
LDR32(D_F16, O_MAX, MM "max.f16x2 %0, [%1];")
LDR32(D_I32, O_SUM, MM "add.s32 %0, [%1];")
LDR32(D_I32, O_MIN, MM "min.s32 %0, [%1];")
LDR32(D_I32, O_MAX, MM "max.s32 %0, [%1];")
LDR32(D_U32, O_SUM, MM "add.u32 %0, [%1];")
LDR32(D_U32, O_MIN, MM "min.u32 %0, [%1];")
LDR32(D_U32, O_MAX, MM "max.u32 %0, [%1];")
LDR64(D_F64, O_SUM, "{.reg .f64 t; " MM "add.f64 t, [%1]; mov.b64 %0, t;}")
LDR64(D_I64, O_SUM, MM "add.u64 %0, [%1];")  // same bits as s64 add
LDR64(D_I64, O_MIN, MM "min.s64 %0, [%1];")
LDR64(D_I64, O_MAX, MM "max.s64 %0, [%1];")
LDR64(D_U64, O_SUM, MM "add.u64 %0, [%1];")
LDR64(D_U64, O_MIN, MM "min.u64 %0, [%1];")
LDR64(D_U64, O_MAX, MM "max.u64 %0, [%1];")

template <int D, int O>
__device__ __forceinline__ u64 mc_ld_reduce_unit(const McastArgs&, u64 mc) {
  if constexpr (McUnit<D>::bytes == 8) return mc_ldr64<D, O>(mc);
  else return mc_ldr32<D, O>(mc);
}
// Default 16-byte form: 4 (or 2) scalar ld_reduces (integers, f64: no vector forms).
template <int D, int O>
struct McV16 {
  static __device__ __forceinline__ V16 ld(u64 mc) {
    V16 v;
    if constexpr (McUnit<D>::bytes == 8) {
      const u64 lo = mc_ldr64<D, O>(mc), hi = mc_ldr64<D, O>(mc + 8);
      v.x = (u32)lo;
      v.y = (u32)(lo >> 32);
      v.z = (u32)hi;
      v.w = (u32)(hi >> 32);
    } else {
      v.x = mc_ldr32<D, O>(mc);
      v.y = mc_ldr32<D, O>(mc + 4);
      v.z = mc_ldr32<D, O>(mc + 8);
      v.w = mc_ldr32<D, O>(mc + 12);
    }
    return v;
  }
};
#define LDV4(D, O, BODY)                                                                   \
  template <>                                                                              \
  struct McV16<D, O> {                                                                     \
    static __device__ __forceinline__ V16 ld(u64 mc) {                                     \
      V16 v;                                                                               \
      asm volatile(BODY : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(mc) : "memory"); \
      return v;                                                                            \
    }                                                                                      \
  };
LDV4(D_F32, O_SUM,
     "{.reg .f32 a, b, c, d; " MM "add.v4.f32 {a, b, c, d}, [%4]; "
     "mov.b32 %0, a; mov.b32 %1, b; mov.b32 %2, c; mov.b32 %3, d;}")
LDV4(D_BF16, O_SUM, MM "add.acc::f32.v4.bf16x2 {%0, %1, %2, %3}, [%4];")
LDV4(D_BF16, O_MIN, MM "min.v4.bf16x2 {%0, %1, %2, %3}, [%4];")
LDV4(D_BF16, O_MAX, MM "max.v4.bf16x2 {%0, %1, %2, %3}, [%4];")
LDV4(D_F16, O_SUM, MM "add.acc::f32.v4.f16x2 {%0, %1, %2, %3}, [%4];")
LDV4(D_F16, O_MIN, MM "min.v4.f16x2 {%0, %1, %2, %3}, [%4];")
LDV4(D_F16, O_MAX, MM "max.v4.f16x2 {%0, %1, %2, %3}, [%4];")

template <int D, int O>
__device__ __forceinline__ V16 mc_ld_reduce_v16(const McastArgs&, u64 mc) {
  return McV16<D, O>::ld(mc);
}
__device__ __forceinline__ void mc_st_v16(const McastArgs&, u64 mc, V16 v) {
  asm volatile(
      "{.reg .f32 a, b, c, d; mov.b32 a, %1; mov.b32 b, %2; mov.b32 c, %3; mov.b32 d, %4; "
      "multimem.st.relaxed.sys.global.v4.f32 [%0], {a, b, c, d};}" ::"l"(mc),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
      : "memory");
}
template <u32 U>
__device__ __forceinline__ void mc_st_unit(const McastArgs&, u64 mc, u64 bits) {
  if (U == 8)
    asm volatile("multimem.st.relaxed.sys.global.u64 [%0], %1;" ::"l"(mc), "l"(bits) : "memory");
  else
    asm volatile("{.reg .f32 a; mov.b32 a, %1; multimem.st.relaxed.sys.global.f32 [%0], a;}" ::"l"(mc),
                 "r"((u32)bits)
                 : "memory");
}
__device__ void mc_red_signal(const McastArgs&, u64 mc) {
  asm volatile("multimem.red.release.sys.global.add.u32 [%0], %1;" ::"l"(mc), "r"(1u) : "memory");
}
#endif

// ============================== MULTICAST kernels ==============================
// Host preconditions (checked by src/kernels before choosing these): data_mc and the range are
// multiples of the scalar unit (4 bytes; 8 for 64-bit types), (D,O) has a multimem form.

// All-reduce: entry barrier; rank r reduces its 1/N slice of the 16-byte vectors (ld_reduce of
// data, then multimem.st to every rank's out), rank 0 also the head/tail units; exit barrier.
template <int D, int O>
__device__ void all_reduce_mc(const McastArgs& a) {
  typedef typename Ty<D>::E E;
  const u32 U = McUnit<D>::bytes;
  const Range r = split(a.data_mc, a.count * sizeof(E) / U, U, true);
  const u64 N = a.nranks, me = a.rank, base = a.data_mc + r.head * U, obase = a.out_mc + r.head * U;
  if (!barrier<true>(a, 0)) return;
  const u64 lo = r.nv * me / N, hi = r.nv * (me + 1) / N, T = gthreads();
  for (u64 j0 = lo + gtid(); j0 < hi; j0 += T * MCAST_UNROLL) {
    V16 v[MCAST_UNROLL];
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u) {
      const u64 j = j0 + (u64)u * T;
      if (j < hi) v[u] = mc_ld_reduce_v16<D, O>(a, base + j * 16);
    }
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u) {
      const u64 j = j0 + (u64)u * T;
      if (j < hi) mc_st_v16(a, obase + j * 16, v[u]);
    }
  }
  if (me == 0 && blockIdx.x == 0)
    for (u64 i = threadIdx.x; i < r.head + r.tail; i += blockDim.x) {
      const u64 o = scalar_off(r, i, U);
      mc_st_unit<U>(a, a.out_mc + o, mc_ld_reduce_unit<D, O>(a, a.data_mc + o));
    }
  barrier<true>(a, 1);
}

// Reduce-scatter: rank r reduces all of block r with ld_reduce and stores it to its own out.
template <int D, int O>
__device__ void reduce_scatter_mc(const McastArgs& a) {
  typedef typename Ty<D>::E E;
  const u32 U = McUnit<D>::bytes;
  const u64 blk = (u64)a.rank * a.count * sizeof(E);
  const Range r = split(a.data_mc + blk, a.count * sizeof(E) / U, U, true);
  const u64 mbase = a.data_mc + blk + r.head * U, lbase = a.out[a.rank] + blk + r.head * U;
  if (!barrier<true>(a, 0)) return;
  const u64 T = gthreads();
  for (u64 j0 = gtid(); j0 < r.nv; j0 += T * MCAST_UNROLL) {
    V16 v[MCAST_UNROLL];
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u) {
      const u64 j = j0 + (u64)u * T;
      if (j < r.nv) v[u] = mc_ld_reduce_v16<D, O>(a, mbase + j * 16);
    }
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u) {
      const u64 j = j0 + (u64)u * T;
      if (j < r.nv) st16(lbase + j * 16, v[u]);
    }
  }
  if (blockIdx.x == 0)
    for (u64 i = threadIdx.x; i < r.head + r.tail; i += blockDim.x) {
      const u64 o = blk + scalar_off(r, i, U);
      const u64 bits = mc_ld_reduce_unit<D, O>(a, a.data_mc + o);
      if (U == 8)
        *(u64*)(a.out[a.rank] + o) = bits;
      else
        *(u32*)(a.out[a.rank] + o) = (u32)bits;
    }
  barrier<true>(a, 1);
}

// multimem.st of this rank's data bytes [off, off + n) (n and off multiples of 4) to every rank's
// out.
__device__ void mc_push(const McastArgs& a, u64 off, u64 n) {
  const Range r = split(a.out_mc + off, n / 4, 4, true);
  const u64 src = a.data[a.rank] + off + r.head * 4, dst = a.out_mc + off + r.head * 4, T = gthreads();
  for (u64 j0 = gtid(); j0 < r.nv; j0 += T * MCAST_UNROLL) {
    V16 v[MCAST_UNROLL];
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u) {
      const u64 j = j0 + (u64)u * T;
      if (j < r.nv) v[u] = ld16(src + j * 16);
    }
#pragma unroll
    for (int u = 0; u < MCAST_UNROLL; ++u) {
      const u64 j = j0 + (u64)u * T;
      if (j < r.nv) mc_st_v16(a, dst + j * 16, v[u]);
    }
  }
  if (blockIdx.x == 0)
    for (u64 i = threadIdx.x; i < r.head + r.tail; i += blockDim.x) {
      const u64 o = off + scalar_off(r, i, 4);
      mc_st_unit<4>(a, a.out_mc + o, *(const u32*)(a.data[a.rank] + o));
    }
}

// Broadcast: the root multimem.st's its range (out of place too: its own out is one of the
// targets); the others take part in the barriers only.
__device__ void broadcast_mc(const McastArgs& a) {
  if (!barrier<true>(a, 0)) return;
  if (a.rank == a.root) mc_push(a, 0, a.count);
  barrier<true>(a, 1);
}

// All-gather: rank r multimem.st's its block (count bytes at r*count) into every rank's copy.
__device__ void all_gather_mc(const McastArgs& a) {
  if (!barrier<true>(a, 0)) return;
  mc_push(a, (u64)a.rank * a.count, a.count);
  barrier<true>(a, 1);
}

// ============================== entry points ==============================
// Names: mcast_<collective>_<path>[_twoshot][_<dtype>_<op>]; see kernel_name() in src/kernels/abi.rs.
#define KERNEL extern "C" __global__ void __launch_bounds__(MCAST_THREADS)
#define ARGS const __grid_constant__ McastArgs a

// Selection (src/kernels/select.rs): with -DMCAST_SELECT the host compiles only the entry points
// of one module, one collective for one dtype and operator (every algorithm of it: P2P one-shot,
// push, two-shot and multicast), and defines each MCAST_SEL_<collective|dtype|op> to 1 or 0.
// Without it every entry point is compiled (what scripts/check-kernels checks).
#ifndef MCAST_SELECT
#define MCAST_SEL_all_reduce 1
#define MCAST_SEL_reduce_scatter 1
#define MCAST_SEL_broadcast 1
#define MCAST_SEL_all_gather 1
#define MCAST_SEL_f32 1
#define MCAST_SEL_f64 1
#define MCAST_SEL_f16 1
#define MCAST_SEL_bf16 1
#define MCAST_SEL_i32 1
#define MCAST_SEL_u32 1
#define MCAST_SEL_i64 1
#define MCAST_SEL_u64 1
#define MCAST_SEL_sum 1
#define MCAST_SEL_min 1
#define MCAST_SEL_max 1
#endif
// MCAST_WHEN(c, d, o)(definitions...) keeps the definitions when all three flags are 1. The
// flags are expanded before MCAST_PASTE4 pastes them (they are not operands of ## here).
#define MCAST_PASTE4(a, b, c, d) a##b##c##d
#define MCAST_WHEN(c, d, o) MCAST_PASTE4(MCAST_WHEN_, c, d, o)
#define MCAST_WHEN_111(...) __VA_ARGS__
#define MCAST_WHEN_110(...)
#define MCAST_WHEN_101(...)
#define MCAST_WHEN_100(...)
#define MCAST_WHEN_011(...)
#define MCAST_WHEN_010(...)
#define MCAST_WHEN_001(...)
#define MCAST_WHEN_000(...)

#define P2P_RED(DN, D, ON, O)                                                                 \
  MCAST_WHEN(MCAST_SEL_all_reduce, MCAST_SEL_##DN, MCAST_SEL_##ON)(                           \
      KERNEL mcast_all_reduce_p2p_##DN##_##ON(ARGS) { all_reduce_p2p_oneshot<D, O>(a); }       \
      KERNEL mcast_all_reduce_p2p_push_##DN##_##ON(ARGS) { all_reduce_p2p_push<D, O>(a); }     \
      KERNEL mcast_all_reduce_p2p_twoshot_##DN##_##ON(ARGS) { all_reduce_p2p_twoshot<D, O>(a); }) \
  MCAST_WHEN(MCAST_SEL_reduce_scatter, MCAST_SEL_##DN, MCAST_SEL_##ON)(                       \
      KERNEL mcast_reduce_scatter_p2p_##DN##_##ON(ARGS) { reduce_scatter_p2p<D, O>(a); })
#define MC_RED(DN, D, ON, O)                                                       \
  MCAST_WHEN(MCAST_SEL_all_reduce, MCAST_SEL_##DN, MCAST_SEL_##ON)(                \
      KERNEL mcast_all_reduce_mc_##DN##_##ON(ARGS) { all_reduce_mc<D, O>(a); })     \
  MCAST_WHEN(MCAST_SEL_reduce_scatter, MCAST_SEL_##DN, MCAST_SEL_##ON)(            \
      KERNEL mcast_reduce_scatter_mc_##DN##_##ON(ARGS) { reduce_scatter_mc<D, O>(a); })
#define P2P_OPS(DN, D) \
  P2P_RED(DN, D, sum, O_SUM) P2P_RED(DN, D, min, O_MIN) P2P_RED(DN, D, max, O_MAX)
#define MC_OPS(DN, D) MC_RED(DN, D, sum, O_SUM) MC_RED(DN, D, min, O_MIN) MC_RED(DN, D, max, O_MAX)

P2P_OPS(f32, D_F32)
P2P_OPS(f64, D_F64)
P2P_OPS(f16, D_F16)
P2P_OPS(bf16, D_BF16)
P2P_OPS(i32, D_I32)
P2P_OPS(u32, D_U32)
P2P_OPS(i64, D_I64)
P2P_OPS(u64, D_U64)

MC_RED(f32, D_F32, sum, O_SUM)  // f32/f64 min/max: no multimem form, the host uses P2P
MC_RED(f64, D_F64, sum, O_SUM)
MC_OPS(f16, D_F16)
MC_OPS(bf16, D_BF16)
MC_OPS(i32, D_I32)
MC_OPS(u32, D_U32)
MC_OPS(i64, D_I64)
MC_OPS(u64, D_U64)

MCAST_WHEN(MCAST_SEL_broadcast, 1, 1)(
    KERNEL mcast_broadcast_p2p(ARGS) { broadcast_p2p(a); }
    KERNEL mcast_broadcast_mc(ARGS) { broadcast_mc(a); })
MCAST_WHEN(MCAST_SEL_all_gather, 1, 1)(
    KERNEL mcast_all_gather_p2p(ARGS) { all_gather_p2p(a); }
    KERNEL mcast_all_gather_mc(ARGS) { all_gather_mc(a); })
