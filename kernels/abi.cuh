// kernels/abi.cuh: the ABI shared with the host (sync-region layout, launch constants,
// McastArgs), mirrored in src/kernels/abi/ and checked there by parsing this file.
//
// The kernel source is header-free CUDA C++ compiled at run time by NVRTC (no CUDA headers, no
// #include): src/kernels/source.rs concatenates include/mcast/device.h (the device API: its
// barrier, wait, error recording, memory-order primitives and multimem instructions are the ones
// these kernels use) and
// the pieces of kernels/ in this order:
//   abi.cuh ptx.cuh dtype.cuh multimem.cuh sync.cuh layout.cuh ll.cuh entry.cuh   (shared)
//   all_reduce/ reduce_scatter/ broadcast/ all_gather/   (one folder per collective: a file per
//                                                         algorithm family, src/kernels/source.rs)
// and a module of one collective (src/kernels/select.rs) compiles the shared part and its files.
//
// Build switch: -DMCAST_EMULATE_MULTIMEM replaces every multimem instruction (mc_* functions of
// multimem.cuh) by loops over the peers' unicast pointers, so the MULTICAST kernels run on plain
// P2P mappings. The P2P kernels are the same in both builds.
//
// Conventions (see src/kernels/abi/, which mirrors this ABI section and asserts it):
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

// ============================== ABI (mirrored in src/kernels/abi/) ==============================
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
//   MCAST_MISSING_OFFSET     MCAST_MISSING_WORDS u32: bit q (word q / 32) set when rank q did not
//                            arrive in a wait of this rank that timed out;
//   MCAST_DOORBELL_OFFSET    u64 address of the team's doorbell in host memory (written by the
//                            host at team creation): rung after an error is recorded;
//   MCAST_EPOCH_OFFSET + 4b  u32 barriers this rank has completed on slot b;
//   MCAST_PUSH_SEQ_OFFSET + 4b  u32 push steps this rank has completed on slot b;
//   MCAST_LL_SEQ_OFFSET + 4b    u32 LL calls this rank has made on slot b (ll.cuh);
//   MCAST_MISMATCH_OFFSET    4 u64: after MCAST_ERR_MISMATCH (error detail: the peer's rank), the
//                            peer's call signature, then this rank's (record_mismatch).
// [8192, 8256): team state: MCAST_STATE_OFFSET u32, read by every wait: anything but
//   MCAST_STATE_OK ends it within microseconds. MCAST_STATE_TIMEOUT | (t << 8) once rank t timed
//   out (its kernel writes it in every rank's region, its own included, first failure wins:
//   record_timeout), MCAST_STATE_ABORTED once the team was aborted (the host: mcast_team_abort,
//   in every rank's region, peers' included), MCAST_STATE_MISMATCH once this rank found a
//   mismatch (its own region only: every rank compares every peer).
// [8448, 51200): call signatures, written by peers (sync.cuh): MCAST_SIG_OFFSET + 16w (entry
//   barriers of teams larger than MCAST_BAR_SIG_MAX_RANKS), MCAST_LL_SIG_OFFSET (LL lines,
//   ll.cuh), MCAST_PUSH_SIG_OFFSET (push kernels), MCAST_BAR_SIG_OFFSET (entry barriers'
//   signature lines: per block slot b and writer row w, 32 bytes at + 32 * (b * 7 + w); bar_sig).
// [51200, 65536): reserved.
#define MCAST_SIGNAL_OFFSET 0
#define MCAST_SIGNAL_STRIDE 64
#define MCAST_LOCAL_OFFSET 4096
#define MCAST_ERROR_OFFSET 4096
#define MCAST_ERROR_INFO_OFFSET 4100
#define MCAST_MISSING_OFFSET 4104
#define MCAST_MISSING_WORDS 3
#define MCAST_DOORBELL_OFFSET 4120
#define MCAST_EPOCH_OFFSET 4352
#define MCAST_MISMATCH_OFFSET 5120
#define MCAST_SIG_OFFSET 8448
#define MCAST_LL_SIG_OFFSET 9728
#define MCAST_PUSH_SIG_OFFSET 24576
#define MCAST_BAR_SIG_OFFSET 36864
#define MCAST_BAR_SIG_MAX_RANKS 8
#define MCAST_ERR_MISMATCH 4
#define MCAST_STATE_MISMATCH 3
#define MCAST_ERR_NONE 0
#define MCAST_ERR_TIMEOUT 1
#define MCAST_ERR_ABORTED 2
#define MCAST_STATE_OFFSET 8192
#define MCAST_STATE_OK 0
#define MCAST_STATE_TIMEOUT 1
#define MCAST_STATE_ABORTED 2
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

// The words the library shares with mcast/device.h (compiled first: src/kernels/source.rs).
static_assert(MCAST_ERROR_OFFSET == MCAST_DEV_ERROR_OFFSET && MCAST_ERROR_INFO_OFFSET == MCAST_DEV_ERROR_INFO_OFFSET &&
                  MCAST_DOORBELL_OFFSET == MCAST_DEV_DOORBELL_OFFSET &&
                  MCAST_STATE_OFFSET == MCAST_DEV_STATE_OFFSET,
              "sync region words shared with mcast/device.h");
static_assert(MCAST_ERR_NONE == MCAST_DEV_ERR_NONE && MCAST_ERR_TIMEOUT == MCAST_DEV_ERR_TIMEOUT &&
                  MCAST_ERR_ABORTED == MCAST_DEV_ERR_ABORTED && MCAST_ERR_MISMATCH == MCAST_DEV_ERR_MISMATCH &&
                  MCAST_STATE_MISMATCH == MCAST_DEV_STATE_MISMATCH,
              "error codes shared with mcast/device.h");

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef unsigned short u16;

// The kernel argument, passed by value: 88 + 24 * MCAST_MAX_RANKS = 1816 bytes, within the 4 KiB
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
  u32 push_row;               // 1196: push kernels: bytes per block and step (<= the row)
  u64 out[MCAST_MAX_RANKS];   // 48 + 16 * MCAST_MAX_RANKS (1200): results, the layout of data (in place: out == data)
  u64 out_mc;                 // 48 + 24 * MCAST_MAX_RANKS (1776): multicast address of out (emulated: out[rank])
  u64 sig[2];                 // 1784: this rank's call signature (src/kernels/abi/signature.rs)
  u32 check;                  // 1800: 1: publish sig at the entry and compare every peer's (sync.cuh)
  u32 pad;                    // 1804
  u64 out_stride;             // 1808: all-gather: bytes from one rank's block of out to the next (0: count)
};
static_assert(sizeof(McastArgs) == 88 + 24 * MCAST_MAX_RANKS, "McastArgs layout");

// Bytes from one rank's block of an all-gather's out to the next: out_stride, or count (the
// layout of data) where it is 0.
__device__ __forceinline__ u64 out_stride(const McastArgs& a) { return a.out_stride != 0 ? a.out_stride : a.count; }
