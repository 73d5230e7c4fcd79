//! The ABI between the host and `kernels/collectives.cu`: the kernel argument struct, the sync
//! region layout, launch geometry and kernel names. Everything here mirrors a `#define` or struct
//! of the ABI section of the CUDA source; a test parses the source and compares.

use super::{Collective, DType, Launch, Path, RedOp, MAX_RANKS, SYNC_BYTES};

/// The kernel source (header-free CUDA C++, compiled with NVRTC).
pub const SOURCE: &str = include_str!("../../kernels/collectives.cu");
/// Name given to the source in NVRTC messages.
pub const SOURCE_NAME: &str = "collectives.cu";

/// Threads per block of every collective kernel (`MCAST_THREADS`).
pub const THREADS: u32 = 512;
/// 16-byte accesses in flight per thread (`MCAST_UNROLL`).
pub const UNROLL: u32 = 4;
/// Barrier slots in the sync region: the most blocks any kernel may use (`MCAST_MAX_BLOCKS`).
pub const MAX_BLOCKS: u32 = 64;
/// The most blocks the launcher uses (<= [`MAX_BLOCKS`]). To be tuned on hardware: NCCL uses
/// about 16 blocks x 512 threads for NVLS on Hopper. Must not depend on the device or the rank:
/// every rank of a collective must launch the same grid (block b pairs with block b).
pub const GRID_MAX_BLOCKS: u32 = 64;
/// Bytes of work per block before another block is added (one block-round of vectors).
pub const BYTES_PER_BLOCK: u64 = THREADS as u64 * 16 * UNROLL as u64;
/// P2P all-reduce with more than two ranks: one-shot up to this many bytes, two-shot above
/// (one-shot reads (N-1) x the message from peers, two-shot 2(N-1)/N x; PyTorch and vLLM switch
/// at 256-512 KiB; to be measured on 4 and 8 GPUs).
pub const ONE_SHOT_MAX_BYTES: u64 = 256 * 1024;
/// Bytes per block of a one-shot all-reduce: small, so that mid-size messages get many blocks
/// and many remote loads in flight (measured on 2 x H200: bench/results).
pub const ONE_SHOT_BYTES_PER_BLOCK: u64 = 8 * 1024;

/// The largest all-reduce that runs one-shot for `nranks` ranks. With two ranks one-shot moves
/// the same remote bytes as two-shot with one barrier fewer, so it wins up to one round of the
/// full grid (measured on 2 x H200: 13.7 us two-shot vs one-shot at 512 KiB, bench/results).
pub fn one_shot_max_bytes(nranks: u32) -> u64 {
    if nranks <= 2 {
        1 << 20
    } else {
        ONE_SHOT_MAX_BYTES
    }
}

/// Sync region layout (per rank, [`SYNC_BYTES`] bytes, zeroed at team creation).
///
/// `[SIGNAL_OFFSET, LOCAL_OFFSET)`: signal words written by every rank of the team (by peers
/// through peer mappings or `multimem.red`, and by the rank itself): one `u32` arrival counter per
/// block slot `b` at `SIGNAL_OFFSET + b * SIGNAL_STRIDE`.
pub const SIGNAL_OFFSET: usize = 0;
/// Stride of the per-slot signal counters (one 128-byte line each).
pub const SIGNAL_STRIDE: usize = 64;
/// Start of the local state: written only by this rank's own kernels (never by peers).
pub const LOCAL_OFFSET: usize = 4096;
/// `u32` device error word: [`ERR_NONE`] or the first error code (set atomically, sticky). The
/// runtime reads it after `cuStreamSynchronize`; while it is set every collective kernel of this
/// rank returns at once without touching data (the barrier counters are no longer consistent:
/// the runtime must quiesce all ranks and zero their sync regions, or drop the team).
pub const ERROR_WORD_OFFSET: usize = 4096;
/// `u32` detail of the first error: `(block slot + 1) | (barrier index in the kernel << 8)`.
pub const ERROR_INFO_OFFSET: usize = 4100;
/// `u32` per block slot `b` at `EPOCH_OFFSET + 4 * b`: barriers this rank has completed on slot
/// `b` (the target of slot `b`'s counter is that number times `nranks`).
pub const EPOCH_OFFSET: usize = 4352;
/// `u32` team state word ([`STATE_OK`] or [`STATE_ABORTED`]): written by the host (an abort
/// writes it in every rank's sync region, through the peer mappings for ranks of other
/// processes) and read by every barrier spin, so an abort ends device waits within
/// microseconds. Outside the local state: peers write it.
pub const STATE_OFFSET: usize = 8192;
/// End of the used part of the sync region; the rest is reserved.
pub const SYNC_USED_BYTES: usize = 8256;
/// Start of the push all-reduce scratch, from a rank's sync region (`MCAST_SCRATCH_OFFSET`): the
/// scratch follows the sync region in the team's first segment.
pub const SCRATCH_OFFSET: usize = 65536;
/// Bytes of one scratch row of a team of two: the most one block of the push all-reduce moves per
/// step (`MCAST_PUSH_CHUNK`). Large, because each block waits once per step for its stores to
/// reach the peer: measured on 2 x H200 (pointer form, bf16, CUDA graph), 16/32/64 KiB rows took
/// 366/278/239 us at 64 MiB (before the loads were batched; after, 32/64 KiB: 219/214 us).
pub const PUSH_CHUNK: u64 = 65536;
/// Bytes of one scratch row of a team of three or four (`MCAST_PUSH_CHUNK_WIDE`): its scratch
/// holds a row per peer.
pub const PUSH_CHUNK_WIDE: u64 = 32768;

/// Bytes of one push scratch row for a team of `nranks`.
pub fn push_row_capacity(nranks: u32) -> u64 {
    if nranks <= 2 {
        PUSH_CHUNK
    } else {
        PUSH_CHUNK_WIDE
    }
}

/// Bytes per block and step of the push all-reduce for a message of `bytes` on `blocks` blocks
/// (`KernelArgs::push_row`): a multiple of 16 within a scratch row.
pub fn push_row_bytes(bytes: u64, blocks: u64, nranks: u32) -> u32 {
    // A full row per block once the message fills the grid's rows; below that the message split
    // evenly over the blocks in one step.
    let cap = push_row_capacity(nranks);
    bytes.div_ceil(blocks.max(1)).div_ceil(16).saturating_mul(16).clamp(16, cap) as u32
}
/// Most ranks the push all-reduce serves (`MCAST_PUSH_MAX_RANKS`): its scratch grows with the team.
pub const PUSH_MAX_RANKS: u32 = 4;
/// Scratch slots per block slot (`MCAST_PUSH_SLOTS`): a rank stores step y + 1 while a peer may
/// still reduce step y - 1, so three slots keep every row untouched until its reader is done.
pub const PUSH_SLOTS: usize = 3;
/// Offset, within a block slot's signal words, of the push flags: the `u32` at
/// `SIGNAL_OFFSET + b * SIGNAL_STRIDE + PUSH_FLAG_OFFSET + 4 * writer` is the last push step
/// `writer` published to this rank (`MCAST_PUSH_FLAG_OFFSET`).
pub const PUSH_FLAG_OFFSET: usize = 4;
/// `u32` per block slot `b` at `PUSH_SEQ_OFFSET + 4 * b` (local state): push steps this rank has
/// completed on slot `b` (`MCAST_PUSH_SEQ_OFFSET`).
pub const PUSH_SEQ_OFFSET: usize = 4608;

/// The largest all-reduce the buffer forms run with the push kernel for `nranks` ranks (when
/// [`push_fits`]). With two ranks push moves the same bytes as two-shot, at the push rate and with
/// no barrier: measured on 2 x H200 (bf16, CUDA graph, us) 12.2 vs 16.3 at 2 MiB, 19.2 vs 22.2
/// at 4 MiB, 35.2 vs 34.2 at 8 MiB. With more ranks push moves (N-1) x the message, so it stops
/// where one-shot does.
pub fn push_max_bytes(nranks: u32) -> u64 {
    if nranks <= 2 {
        4 << 20
    } else {
        one_shot_max_bytes(nranks)
    }
}

/// Bytes of a team's scratch per rank: [`PUSH_SLOTS`] slots of one row per peer for every block
/// slot, for teams the push all-reduce serves; none otherwise.
pub fn scratch_bytes(nranks: u32) -> usize {
    if (2..=PUSH_MAX_RANKS).contains(&nranks) {
        PUSH_SLOTS * (nranks as usize - 1) * push_row_capacity(nranks) as usize * MAX_BLOCKS as usize
    } else {
        0
    }
}

/// Bytes per rank of a team's staging area: where the pointer form (`mcast_team_*`) copies the
/// caller's plain device memory before running the in-place kernels on it, in chunks of at most
/// this size. 1 MiB keeps the first segment within the same multiple of a 2 MiB granularity for
/// every team size.
pub const STAGE_BYTES: usize = 1 << 20;

/// Offset of the staging area from a rank's sync region: after the push scratch.
pub fn stage_offset(nranks: u32) -> usize {
    SCRATCH_OFFSET + scratch_bytes(nranks)
}

/// Bytes a team reserves per rank at the start of its first segment: the sync region, the push
/// scratch, then the staging area.
pub fn team_reserved_bytes(nranks: u32) -> usize {
    stage_offset(nranks) + STAGE_BYTES
}

/// Error word value: no error.
pub const ERR_NONE: u32 = 0;
/// Error word value: a barrier wait exceeded `timeout_ns` (maps to `MCAST_ERROR_TIMEOUT`).
pub const ERR_TIMEOUT: u32 = 1;
/// Error word value: a barrier wait ended because the team was aborted (maps to
/// `MCAST_ERROR_ABORTED`).
pub const ERR_ABORTED: u32 = 2;
/// State word value: the team is usable.
pub const STATE_OK: u32 = 0;
/// State word value: the team was aborted; every barrier returns at once.
pub const STATE_ABORTED: u32 = 2;

const _: () = assert!(EPOCH_OFFSET + 4 * MAX_BLOCKS as usize <= PUSH_SEQ_OFFSET);
const _: () = assert!(PUSH_SEQ_OFFSET + 4 * MAX_BLOCKS as usize <= STATE_OFFSET);
const _: () = assert!(PUSH_FLAG_OFFSET >= 4 && PUSH_FLAG_OFFSET + 4 * PUSH_MAX_RANKS as usize <= SIGNAL_STRIDE);
const _: () = assert!(STATE_OFFSET + 4 <= SYNC_USED_BYTES);
const _: () = assert!(SIGNAL_OFFSET + SIGNAL_STRIDE * MAX_BLOCKS as usize <= LOCAL_OFFSET);
const _: () = assert!(SYNC_USED_BYTES <= SYNC_BYTES);
const _: () = assert!(SCRATCH_OFFSET == SYNC_BYTES);
const _: () = assert!(GRID_MAX_BLOCKS <= MAX_BLOCKS);

/// The kernel argument (`struct McastArgs`), passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelArgs {
    /// Per rank: byte `offset` of that rank's copy, valid on this device (unused ranks 0).
    pub data: [u64; MAX_RANKS],
    /// Per rank: its sync region, valid on this device.
    pub sync: [u64; MAX_RANKS],
    /// Multicast address of `data` (emulated build: `data[rank]`; P2P: 0).
    pub data_mc: u64,
    /// Multicast address of the sync region (emulated build: `sync[rank]`; P2P: 0).
    pub sync_mc: u64,
    /// Elements or bytes, as [`Launch::count`].
    pub count: u64,
    /// Barrier spin bound, 0 = forever.
    pub timeout_ns: u64,
    /// This rank.
    pub rank: u32,
    /// Team size.
    pub nranks: u32,
    /// Broadcast root (0 otherwise).
    pub root: u32,
    /// The push all-reduce's bytes per block and step ([`Plan::push_row`]); 0 otherwise.
    pub push_row: u32,
    /// Per rank: where the results for that rank's `data` go, in the layout of `data` (in place:
    /// equal to `data`).
    pub out: [u64; MAX_RANKS],
    /// Multicast address of `out` (emulated build: `out[rank]`; P2P: 0).
    pub out_mc: u64,
}

/// Size of [`KernelArgs`] (`sizeof(McastArgs)`).
pub const KERNEL_ARGS_SIZE: usize = 56 + 24 * MAX_RANKS;
const _: () = assert!(std::mem::size_of::<KernelArgs>() == KERNEL_ARGS_SIZE);
const _: () = assert!(std::mem::align_of::<KernelArgs>() == 8);

/// Which build of the source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Variant {
    /// Real `multimem` instructions (sm_90+).
    Multimem,
    /// `-DMCAST_EMULATE_MULTIMEM`: multimem replaced by loops over peer pointers (any sm_75+).
    Emulated,
}

impl Variant {
    /// Both variants.
    pub const ALL: [Variant; 2] = [Variant::Multimem, Variant::Emulated];

    /// Short name used in cache keys and messages.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Multimem => "multimem",
            Variant::Emulated => "emulated",
        }
    }

    /// The NVRTC define selecting this variant.
    pub fn define(self) -> Option<&'static str> {
        match self {
            Variant::Multimem => None,
            Variant::Emulated => Some("-DMCAST_EMULATE_MULTIMEM"),
        }
    }
}

/// The kind of a kernel entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelKind {
    /// `mcast_all_reduce_p2p_<d>_<op>` (one-shot, pulling from peers).
    AllReduceP2p,
    /// `mcast_all_reduce_p2p_push_<d>_<op>` (one-shot, pushing into peers' scratch: one barrier).
    AllReduceP2pPush,
    /// `mcast_all_reduce_p2p_twoshot_<d>_<op>`.
    AllReduceP2pTwoShot,
    /// `mcast_reduce_scatter_p2p_<d>_<op>`.
    ReduceScatterP2p,
    /// `mcast_all_reduce_mc_<d>_<op>`.
    AllReduceMc,
    /// `mcast_reduce_scatter_mc_<d>_<op>`.
    ReduceScatterMc,
    /// `mcast_broadcast_p2p`.
    BroadcastP2p,
    /// `mcast_broadcast_mc`.
    BroadcastMc,
    /// `mcast_all_gather_p2p`.
    AllGatherP2p,
    /// `mcast_all_gather_mc`.
    AllGatherMc,
}

const REDUCING: [KernelKind; 6] = [
    KernelKind::AllReduceP2p,
    KernelKind::AllReduceP2pPush,
    KernelKind::AllReduceP2pTwoShot,
    KernelKind::ReduceScatterP2p,
    KernelKind::AllReduceMc,
    KernelKind::ReduceScatterMc,
];
const COPYING: [KernelKind; 4] =
    [KernelKind::BroadcastP2p, KernelKind::BroadcastMc, KernelKind::AllGatherP2p, KernelKind::AllGatherMc];

/// Number of kernel ids (some reducing ids have no entry point, see [`KernelId::exists`]).
pub const KERNEL_IDS: usize = REDUCING.len() * 24 + COPYING.len();

/// One kernel entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelId {
    /// Which kernel.
    pub kind: KernelKind,
    /// Element type and operator, for the reducing kinds.
    pub red: Option<(DType, RedOp)>,
}

/// True when `multimem.ld_reduce` has a form for `dtype` and `op` (f32/f64 min/max have none).
pub fn multimem_has_reduction(dtype: DType, op: RedOp) -> bool {
    !matches!((dtype, op), (DType::F32 | DType::F64, RedOp::Min | RedOp::Max))
}

impl KernelId {
    /// Every id, in [`KernelId::index`] order.
    pub fn all() -> Vec<KernelId> {
        let mut v = Vec::with_capacity(KERNEL_IDS);
        for kind in REDUCING {
            for dtype in DType::ALL {
                for op in RedOp::ALL {
                    v.push(KernelId { kind, red: Some((dtype, op)) });
                }
            }
        }
        for kind in COPYING {
            v.push(KernelId { kind, red: None });
        }
        v
    }

    /// Dense index in `0..KERNEL_IDS`.
    pub fn index(self) -> usize {
        match (REDUCING.iter().position(|k| *k == self.kind), self.red) {
            (Some(k), Some((d, o))) => k * 24 + d as usize * 3 + o as usize,
            _ => REDUCING.len() * 24 + COPYING.iter().position(|k| *k == self.kind).unwrap_or(0),
        }
    }

    /// True when the source defines this entry point (the multicast f32/f64 min/max do not).
    pub fn exists(self) -> bool {
        match (self.kind, self.red) {
            (KernelKind::AllReduceMc | KernelKind::ReduceScatterMc, Some((d, o))) => multimem_has_reduction(d, o),
            (k, red) => REDUCING.contains(&k) == red.is_some(),
        }
    }

    /// The entry point name, e.g. `mcast_all_reduce_p2p_bf16_sum`.
    pub fn name(self) -> String {
        let stem = match self.kind {
            KernelKind::AllReduceP2p => "all_reduce_p2p",
            KernelKind::AllReduceP2pPush => "all_reduce_p2p_push",
            KernelKind::AllReduceP2pTwoShot => "all_reduce_p2p_twoshot",
            KernelKind::ReduceScatterP2p => "reduce_scatter_p2p",
            KernelKind::AllReduceMc => "all_reduce_mc",
            KernelKind::ReduceScatterMc => "reduce_scatter_mc",
            KernelKind::BroadcastP2p => "broadcast_p2p",
            KernelKind::BroadcastMc => "broadcast_mc",
            KernelKind::AllGatherP2p => "all_gather_p2p",
            KernelKind::AllGatherMc => "all_gather_mc",
        };
        match self.red {
            Some((d, o)) => format!("mcast_{stem}_{}_{}", d.name(), o.name()),
            None => format!("mcast_{stem}"),
        }
    }
}

/// What to launch for one [`Launch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The entry point.
    pub kernel: KernelId,
    /// Blocks (same on every rank).
    pub blocks: u32,
    /// Why a multicast request runs a P2P kernel, when it does.
    pub fallback: Option<&'static str>,
    /// The push all-reduce's bytes per block and step ([`push_row_bytes`]); 0 for other kernels.
    pub push_row: u32,
}

/// The grid cap of a launch (the same on every rank).
fn block_cap(l: &Launch) -> u64 {
    GRID_MAX_BLOCKS.min(l.max_blocks.max(1)) as u64
}

/// True when the push all-reduce serves a message at address `me` (this rank's data and out
/// or-ed) in the buffer forms: a team it keeps scratch for and 16-byte aligned vectors (it
/// would run element by element otherwise, where the pulling one-shot runs vectors).
fn push_fits(l: &Launch, me: u64) -> bool {
    l.nranks <= PUSH_MAX_RANKS && me % 16 == 0
}

/// Checks `l` and chooses the kernel and grid; `Ok(None)` when there is nothing to do (count 0).
/// Depends only on values that are equal on every rank (collective, path, count, nranks and the
/// alignment of the symmetric address), so every rank makes the same choice.
pub fn plan(l: &Launch) -> Result<Option<Plan>, String> {
    let n = l.nranks as usize;
    if n == 0 || n > MAX_RANKS {
        return Err(format!("nranks {} outside 1..={MAX_RANKS}", l.nranks));
    }
    if l.rank >= l.nranks {
        return Err(format!("rank {} >= nranks {}", l.rank, l.nranks));
    }
    if l.data.len() != n || l.sync.len() != n || !(l.out.is_empty() || l.out.len() == n) {
        return Err(format!(
            "{} data, {} out and {} sync addresses for {n} ranks",
            l.data.len(),
            l.out.len(),
            l.sync.len()
        ));
    }
    if l.local_only && !(matches!(l.collective, Collective::AllReduce { .. }) && l.nranks <= PUSH_MAX_RANKS) {
        return Err(format!(
            "{:?} of {} ranks needs the peers' memory, which this launch cannot address",
            l.collective, l.nranks
        ));
    }
    if l.count == 0 {
        return Ok(None);
    }
    let too_big = || format!("count {} overflows the address space", l.count);
    let me = l.data[l.rank as usize];
    let mc = l.path == Path::Multicast;
    // Address whose alignment the multicast kernel sees (the multicast address, or in emulation
    // this rank's copy: both have the same alignment modulo 16 as every rank's copy).
    let mc_addr = l.data_mc.unwrap_or(me);
    // Out of place: the multicast kernels move 16-byte vectors from data to out, so both must
    // agree modulo 16 (they do on every rank alike: symmetric layouts).
    let out_me = l.out.get(l.rank as usize).copied().unwrap_or(me);
    // All-gather and reduce-scatter bases are shifted by this rank's block: compare the real
    // addresses of rank 0's layout, and require whole 16-byte blocks, so that every rank makes
    // the same choice.
    let block = match l.collective {
        Collective::AllGather => l.count,
        Collective::ReduceScatter { dtype, .. } => l.count.saturating_mul(dtype.size() as u64),
        _ => 0,
    };
    let shift = block.wrapping_mul(u64::from(l.rank));
    let skewed = match l.collective {
        _ if l.out.is_empty() => false,
        Collective::AllGather => ((me.wrapping_add(shift) ^ out_me) & 15 != 0) || block % 16 != 0,
        Collective::ReduceScatter { .. } => ((out_me.wrapping_add(shift) ^ me) & 15 != 0) || block % 16 != 0,
        _ => (out_me ^ me) & 15 != 0,
    };
    const SKEW: &str = "send and recv disagree in alignment modulo 16";
    let (kind, red, bytes, fallback) = match l.collective {
        Collective::Broadcast { root } => {
            if root >= l.nranks {
                return Err(format!("broadcast root {root} >= nranks {}", l.nranks));
            }
            let fb = if !mc {
                None
            } else if l.count % 4 != 0 || mc_addr % 4 != 0 || l.out_mc.unwrap_or(mc_addr) % 4 != 0 {
                Some("multimem.st needs 4-byte aligned ranges")
            } else if skewed {
                Some(SKEW)
            } else {
                None
            };
            let kind = if mc && fb.is_none() { KernelKind::BroadcastMc } else { KernelKind::BroadcastP2p };
            (kind, None, l.count, fb)
        }
        Collective::AllGather => {
            let total = l.count.checked_mul(l.nranks as u64).ok_or_else(too_big)?;
            let fb = if !mc {
                None
            } else if l.count % 4 != 0 || l.out_mc.unwrap_or(out_me) % 4 != 0 {
                Some("multimem.st needs 4-byte aligned blocks")
            } else if skewed {
                Some(SKEW)
            } else {
                None
            };
            let kind = if mc && fb.is_none() { KernelKind::AllGatherMc } else { KernelKind::AllGatherP2p };
            (kind, None, total, fb)
        }
        Collective::AllReduce { dtype, op } | Collective::ReduceScatter { dtype, op } => {
            let es = dtype.size() as u64;
            let bytes = l.count.checked_mul(es).ok_or_else(too_big)?;
            let rs = matches!(l.collective, Collective::ReduceScatter { .. });
            if rs {
                bytes.checked_mul(l.nranks as u64).ok_or_else(too_big)?;
            }
            if me % es != 0 || out_me % es != 0 {
                return Err(format!("address {me:#x} or {out_me:#x} not aligned to the {}-byte element", es));
            }
            let unit = es.max(4);
            let fb = if !mc {
                None
            } else if !multimem_has_reduction(dtype, op) {
                Some("multimem.ld_reduce has no min/max for f32/f64")
            } else if bytes % unit != 0 || mc_addr % unit != 0 || out_me % unit != 0 {
                Some("multimem has no 16-bit scalar forms (odd 16-bit count or 2-byte aligned start)")
            } else if skewed {
                Some(SKEW)
            } else {
                None
            };
            let kind = match (rs, mc && fb.is_none()) {
                (false, _) if l.local_only => KernelKind::AllReduceP2pPush,
                (true, true) => KernelKind::ReduceScatterMc,
                (true, false) => KernelKind::ReduceScatterP2p,
                (false, true) => KernelKind::AllReduceMc,
                (false, false) if bytes <= push_max_bytes(l.nranks) && push_fits(l, me | out_me) => {
                    KernelKind::AllReduceP2pPush
                }
                (false, false) if bytes <= one_shot_max_bytes(l.nranks) => KernelKind::AllReduceP2p,
                (false, false) => KernelKind::AllReduceP2pTwoShot,
            };
            (kind, Some((dtype, op)), bytes, fb)
        }
    };
    let per_block = match kind {
        KernelKind::AllReduceP2p | KernelKind::AllReduceP2pPush => ONE_SHOT_BYTES_PER_BLOCK,
        _ => BYTES_PER_BLOCK,
    };
    let blocks = bytes.div_ceil(per_block).clamp(1, block_cap(l)) as u32;
    let push_row = match kind {
        KernelKind::AllReduceP2pPush => push_row_bytes(bytes, blocks.into(), l.nranks),
        _ => 0,
    };
    Ok(Some(Plan { kernel: KernelId { kind, red }, blocks, fallback, push_row }))
}

/// The argument struct for `l` built for `variant` (no allocation).
pub fn kernel_args(l: &Launch, variant: Variant) -> KernelArgs {
    let mut a = KernelArgs {
        data: [0; MAX_RANKS],
        sync: [0; MAX_RANKS],
        data_mc: 0,
        sync_mc: 0,
        count: l.count,
        timeout_ns: l.timeout_ns,
        rank: l.rank,
        nranks: l.nranks,
        root: match l.collective {
            Collective::Broadcast { root } => root,
            _ => 0,
        },
        push_row: 0,
        out: [0; MAX_RANKS],
        out_mc: 0,
    };
    for (i, (d, s)) in l.data.iter().zip(&l.sync).take(MAX_RANKS).enumerate() {
        a.data[i] = *d;
        a.sync[i] = *s;
        a.out[i] = l.out.get(i).copied().unwrap_or(*d);
    }
    let me = (l.rank as usize).min(MAX_RANKS - 1);
    match variant {
        Variant::Emulated => {
            a.data_mc = a.data[me];
            a.sync_mc = a.sync[me];
            a.out_mc = a.out[me];
        }
        Variant::Multimem => {
            a.data_mc = l.data_mc.unwrap_or(0);
            a.sync_mc = l.sync_mc.unwrap_or(0);
            a.out_mc = l.out_mc.or(l.data_mc).unwrap_or(0);
        }
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::Stream;
    use std::collections::HashSet;
    use std::mem::offset_of;

    fn define(name: &str) -> u64 {
        let prefix = format!("#define {name} ");
        let line = SOURCE.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("{name} not in source"));
        line[prefix.len()..].trim().parse().unwrap_or_else(|_| panic!("{name}: {line}"))
    }

    #[test]
    fn source_defines_match_rust_consts() {
        assert_eq!(define("MCAST_MAX_RANKS"), MAX_RANKS as u64);
        assert_eq!(define("MCAST_MAX_BLOCKS"), MAX_BLOCKS as u64);
        assert_eq!(define("MCAST_THREADS"), THREADS as u64);
        assert_eq!(define("MCAST_UNROLL"), UNROLL as u64);
        assert_eq!(define("MCAST_SIGNAL_OFFSET"), SIGNAL_OFFSET as u64);
        assert_eq!(define("MCAST_SIGNAL_STRIDE"), SIGNAL_STRIDE as u64);
        assert_eq!(define("MCAST_SCRATCH_OFFSET"), SCRATCH_OFFSET as u64);
        assert_eq!(define("MCAST_PUSH_CHUNK"), PUSH_CHUNK);
        assert_eq!(define("MCAST_PUSH_CHUNK_WIDE"), PUSH_CHUNK_WIDE);
        assert_eq!(define("MCAST_PUSH_MAX_RANKS"), PUSH_MAX_RANKS as u64);
        assert_eq!(define("MCAST_PUSH_SLOTS"), PUSH_SLOTS as u64);
        assert_eq!(define("MCAST_PUSH_FLAG_OFFSET"), PUSH_FLAG_OFFSET as u64);
        assert_eq!(define("MCAST_PUSH_SEQ_OFFSET"), PUSH_SEQ_OFFSET as u64);
        assert_eq!(define("MCAST_LOCAL_OFFSET"), LOCAL_OFFSET as u64);
        assert_eq!(define("MCAST_ERROR_OFFSET"), ERROR_WORD_OFFSET as u64);
        assert_eq!(define("MCAST_ERROR_INFO_OFFSET"), ERROR_INFO_OFFSET as u64);
        assert_eq!(define("MCAST_EPOCH_OFFSET"), EPOCH_OFFSET as u64);
        assert_eq!(define("MCAST_ERR_NONE"), ERR_NONE as u64);
        assert_eq!(define("MCAST_ERR_TIMEOUT"), ERR_TIMEOUT as u64);
        assert_eq!(define("MCAST_ERR_ABORTED"), ERR_ABORTED as u64);
        assert_eq!(define("MCAST_STATE_OFFSET"), STATE_OFFSET as u64);
        assert_eq!(define("MCAST_STATE_OK"), STATE_OK as u64);
        assert!(SOURCE.contains("sizeof(McastArgs) == 56 + 24 * MCAST_MAX_RANKS"));
    }

    #[test]
    fn kernel_args_layout() {
        assert_eq!(std::mem::size_of::<KernelArgs>(), 56 + 24 * MAX_RANKS);
        assert_eq!(std::mem::size_of::<KernelArgs>(), 1784);
        assert_eq!(offset_of!(KernelArgs, data), 0);
        assert_eq!(offset_of!(KernelArgs, sync), 576);
        assert_eq!(offset_of!(KernelArgs, data_mc), 1152);
        assert_eq!(offset_of!(KernelArgs, sync_mc), 1160);
        assert_eq!(offset_of!(KernelArgs, count), 1168);
        assert_eq!(offset_of!(KernelArgs, timeout_ns), 1176);
        assert_eq!(offset_of!(KernelArgs, rank), 1184);
        assert_eq!(offset_of!(KernelArgs, nranks), 1188);
        assert_eq!(offset_of!(KernelArgs, root), 1192);
        assert_eq!(offset_of!(KernelArgs, push_row), 1196);
        assert_eq!(offset_of!(KernelArgs, out), 48 + 16 * MAX_RANKS);
        assert_eq!(offset_of!(KernelArgs, out_mc), 48 + 24 * MAX_RANKS);
        // CUDA's kernel parameter limit (4 KiB before 12.1's large-argument support).
        assert!(std::mem::size_of::<KernelArgs>() <= 4096);
        // The C struct states the same offsets in comments; check they are there.
        for (field, off) in [("data_mc", 1152), ("count", 1168), ("rank", 1184), ("root", 1192)] {
            assert!(
                SOURCE.lines().any(|l| l.contains(&format!("u64 {field};"))
                    || l.contains(&format!("u32 {field};")) && l.contains(&format!("// {off}"))),
                "{field}"
            );
        }
    }

    #[test]
    fn kernel_names_every_combination() {
        let all = KernelId::all();
        assert_eq!(all.len(), KERNEL_IDS);
        let mut names = HashSet::new();
        for (i, id) in all.iter().enumerate() {
            assert_eq!(id.index(), i, "{id:?}");
            assert!(names.insert(id.name()), "duplicate {}", id.name());
        }
        let existing: Vec<KernelId> = all.iter().copied().filter(|k| k.exists()).collect();
        assert_eq!(existing.len(), 4 * 24 + 2 * 20 + 4);
        let name = |kind, d, o| KernelId { kind, red: Some((d, o)) }.name();
        assert_eq!(name(KernelKind::AllReduceP2p, DType::BF16, RedOp::Sum), "mcast_all_reduce_p2p_bf16_sum");
        assert_eq!(
            name(KernelKind::AllReduceP2pTwoShot, DType::F32, RedOp::Max),
            "mcast_all_reduce_p2p_twoshot_f32_max"
        );
        assert_eq!(name(KernelKind::ReduceScatterMc, DType::I64, RedOp::Min), "mcast_reduce_scatter_mc_i64_min");
        assert_eq!(KernelId { kind: KernelKind::AllGatherMc, red: None }.name(), "mcast_all_gather_mc");
        assert!(!KernelId { kind: KernelKind::AllReduceMc, red: Some((DType::F64, RedOp::Min)) }.exists());
        assert!(KernelId { kind: KernelKind::AllReduceMc, red: Some((DType::F16, RedOp::Min)) }.exists());
    }

    #[test]
    fn source_defines_exactly_the_existing_entry_points() {
        // Expand the entry-point macros of the source textually: P2P_OPS for every dtype, MC_OPS or
        // MC_RED lines for the multicast ones, and the four copy kernels.
        let mut defined = HashSet::new();
        for line in SOURCE.lines() {
            let line = line.trim();
            let args = |s: &str| -> Vec<String> {
                s[s.find('(').unwrap() + 1..s.find(')').unwrap()].split(',').map(|x| x.trim().to_string()).collect()
            };
            if line.starts_with("P2P_OPS(") {
                let d = &args(line)[0];
                for o in ["sum", "min", "max"] {
                    for s in ["all_reduce_p2p", "all_reduce_p2p_push", "all_reduce_p2p_twoshot", "reduce_scatter_p2p"] {
                        defined.insert(format!("mcast_{s}_{d}_{o}"));
                    }
                }
            } else if line.starts_with("MC_OPS(") || line.starts_with("MC_RED(") {
                let a = args(line);
                let ops = if line.starts_with("MC_OPS(") { vec!["sum", "min", "max"] } else { vec![a[2].as_str()] };
                for o in ops {
                    for s in ["all_reduce_mc", "reduce_scatter_mc"] {
                        defined.insert(format!("mcast_{s}_{}_{o}", a[0]));
                    }
                }
            } else if let Some(rest) = line.strip_prefix("KERNEL mcast_").filter(|r| !r.contains("##")) {
                defined.insert(format!("mcast_{}", &rest[..rest.find('(').unwrap()]));
            }
        }
        let expected: HashSet<String> = KernelId::all().into_iter().filter(|k| k.exists()).map(|k| k.name()).collect();
        assert_eq!(defined, expected);
    }

    fn launch(collective: Collective, path: Path, count: u64) -> Launch {
        Launch {
            collective,
            path,
            rank: 1,
            nranks: 2,
            dev: 0,
            stream: Stream::DEFAULT,
            data: vec![0x1000_0000, 0x2000_0000],
            data_mc: None,
            out: vec![],
            out_mc: None,
            sync: vec![0x3000_0000, 0x4000_0000],
            sync_mc: None,
            count,
            timeout_ns: 5,
            max_blocks: GRID_MAX_BLOCKS,
            local_only: false,
        }
    }

    #[test]
    fn plan_chooses_kernels_and_fallbacks() {
        let ar = |d, o| Collective::AllReduce { dtype: d, op: o };
        let p = plan(&launch(ar(DType::BF16, RedOp::Sum), Path::P2P, 1000)).unwrap().unwrap();
        assert_eq!(p.kernel.kind, KernelKind::AllReduceP2pPush);
        assert_eq!(p.blocks, 1);
        // The buffer forms push a 16-byte aligned message of a team of at most PUSH_MAX_RANKS;
        // otherwise the pulling one-shot runs.
        let mut unaligned = launch(ar(DType::BF16, RedOp::Sum), Path::P2P, 1000);
        unaligned.data = unaligned.data.iter().map(|a| a + 4).collect();
        assert_eq!(plan(&unaligned).unwrap().unwrap().kernel.kind, KernelKind::AllReduceP2p);
        // The pointer form (local_only) pushes at any alignment and size, and refuses what
        // push cannot run.
        unaligned.local_only = true;
        assert_eq!(plan(&unaligned).unwrap().unwrap().kernel.kind, KernelKind::AllReduceP2pPush);
        let mut huge = launch(ar(DType::F32, RedOp::Sum), Path::Multicast, 1 << 28);
        huge.local_only = true;
        assert_eq!(plan(&huge).unwrap().unwrap().kernel.kind, KernelKind::AllReduceP2pPush);
        let mut gather = launch(Collective::AllGather, Path::P2P, 64);
        gather.local_only = true;
        assert!(plan(&gather).is_err());
        let mut big_team = launch(ar(DType::F32, RedOp::Sum), Path::P2P, 100);
        big_team.nranks = 5;
        big_team.data = vec![0x1000_0000; 5];
        big_team.sync = vec![0x3000_0000; 5];
        assert_eq!(plan(&big_team).unwrap().unwrap().kernel.kind, KernelKind::AllReduceP2p);
        assert_eq!(scratch_bytes(5), 0);
        assert_eq!(team_reserved_bytes(2), SYNC_BYTES + 3 * 65536 * 64 + STAGE_BYTES);
        assert_eq!(scratch_bytes(4), 3 * 3 * 32768 * 64);
        assert_eq!(scratch_bytes(1), 0);
        assert_eq!(stage_offset(5) % 16, 0);
        // Two ranks push up to 4 MiB, in one step of full rows at the limit; two-shot above.
        let p = plan(&launch(ar(DType::F32, RedOp::Sum), Path::P2P, 1 << 20)).unwrap().unwrap();
        assert_eq!((p.kernel.kind, p.blocks, p.push_row as u64), (KernelKind::AllReduceP2pPush, 64, PUSH_CHUNK));
        let p = plan(&launch(ar(DType::F32, RedOp::Sum), Path::P2P, (1 << 20) + 4)).unwrap().unwrap();
        assert_eq!((p.kernel.kind, p.push_row), (KernelKind::AllReduceP2pTwoShot, 0));
        assert_eq!(p.blocks, GRID_MAX_BLOCKS);
        // A small message is split evenly over its blocks (16-byte parts); the pointer form's
        // large ones take full rows, several steps.
        let p = plan(&launch(ar(DType::BF16, RedOp::Sum), Path::P2P, 50_000)).unwrap().unwrap();
        assert_eq!((p.blocks, p.push_row), (13, 7696));
        huge.path = Path::P2P;
        let p = plan(&huge).unwrap().unwrap();
        assert_eq!((p.blocks, p.push_row as u64), (GRID_MAX_BLOCKS, PUSH_CHUNK));
        let p = plan(&launch(ar(DType::F32, RedOp::Min), Path::Multicast, 1024)).unwrap().unwrap();
        assert_eq!(p.kernel.kind, KernelKind::AllReduceP2pPush);
        assert!(p.fallback.is_some());
        let p = plan(&launch(ar(DType::F16, RedOp::Max), Path::Multicast, 1024)).unwrap().unwrap();
        assert_eq!((p.kernel.kind, p.fallback), (KernelKind::AllReduceMc, None));
        let p = plan(&launch(ar(DType::F16, RedOp::Sum), Path::Multicast, 1023)).unwrap().unwrap();
        assert_eq!(p.kernel.kind, KernelKind::AllReduceP2pPush);
        let rs = Collective::ReduceScatter { dtype: DType::I64, op: RedOp::Sum };
        assert_eq!(plan(&launch(rs, Path::Multicast, 7)).unwrap().unwrap().kernel.kind, KernelKind::ReduceScatterMc);
        let p = plan(&launch(Collective::AllGather, Path::Multicast, 6)).unwrap().unwrap();
        assert_eq!(p.kernel.kind, KernelKind::AllGatherP2p);
        let p = plan(&launch(Collective::Broadcast { root: 0 }, Path::Multicast, 8)).unwrap().unwrap();
        assert_eq!(p.kernel.kind, KernelKind::BroadcastMc);
        assert!(plan(&launch(Collective::Broadcast { root: 2 }, Path::P2P, 8)).is_err());
        assert_eq!(plan(&launch(Collective::AllGather, Path::P2P, 0)).unwrap(), None);
        let mut l = launch(Collective::AllGather, Path::P2P, 8);
        l.data.pop();
        assert!(plan(&l).is_err());
    }

    #[test]
    fn kernel_args_from_launch() {
        let mut l = launch(Collective::Broadcast { root: 1 }, Path::Multicast, 64);
        let a = kernel_args(&l, Variant::Emulated);
        assert_eq!((a.data[0], a.data[1], a.data[2]), (0x1000_0000, 0x2000_0000, 0));
        assert_eq!((a.data_mc, a.sync_mc), (0x2000_0000, 0x4000_0000));
        assert_eq!((a.rank, a.nranks, a.root, a.count, a.timeout_ns), (1, 2, 1, 64, 5));
        assert_eq!((a.out[0], a.out[1], a.out_mc), (0x1000_0000, 0x2000_0000, 0x2000_0000), "in place: out == data");
        l.data_mc = Some(0x9000_0000);
        l.sync_mc = Some(0xa000_0000);
        let a = kernel_args(&l, Variant::Multimem);
        assert_eq!((a.data_mc, a.sync_mc, a.out_mc), (0x9000_0000, 0xa000_0000, 0x9000_0000));
        l.out = vec![0x5000_0000, 0x6000_0000];
        l.out_mc = Some(0xb000_0000);
        let a = kernel_args(&l, Variant::Multimem);
        assert_eq!((a.out[0], a.out[1], a.out_mc), (0x5000_0000, 0x6000_0000, 0xb000_0000));
        let a = kernel_args(&l, Variant::Emulated);
        assert_eq!((a.out_mc, a.data_mc), (0x6000_0000, 0x2000_0000));
    }

    #[test]
    fn plan_out_of_place() {
        let ar = Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum };
        let mut l = launch(ar, Path::Multicast, 1024);
        l.out = vec![0x5000_0000, 0x6000_0000];
        assert_eq!(plan(&l).unwrap().unwrap().kernel.kind, KernelKind::AllReduceMc);
        // recv 4 bytes off send's alignment modulo 16: the multicast kernel cannot pair vectors.
        l.out = vec![0x5000_0004, 0x6000_0004];
        let p = plan(&l).unwrap().unwrap();
        assert_eq!(
            (p.kernel.kind, p.fallback),
            (KernelKind::AllReduceP2p, Some("send and recv disagree in alignment modulo 16"))
        );
        // The push all-reduce needs 16-byte aligned recv too.
        let mut l = launch(ar, Path::P2P, 1024);
        l.out = vec![0x5000_0004, 0x6000_0004];
        assert_eq!(plan(&l).unwrap().unwrap().kernel.kind, KernelKind::AllReduceP2p);
        l.out = vec![0x5000_0002, 0x6000_0002];
        assert!(plan(&l).is_err(), "recv not aligned to the element");
        l.out = vec![0x5000_0000];
        assert!(plan(&l).is_err(), "one out address for two ranks");
        // All-gather out of place: the same choice on every rank, whatever its block's offset.
        for count in [340u64, 352] {
            let kinds: Vec<KernelKind> = (0..2u32)
                .map(|rank| {
                    let mut l = launch(Collective::AllGather, Path::Multicast, count);
                    l.rank = rank;
                    let send = 0x7000_0000u64;
                    l.data = (0..2).map(|p| send.wrapping_sub(p * count)).collect();
                    l.out = vec![0x5000_0000, 0x6000_0000];
                    plan(&l).unwrap().unwrap().kernel.kind
                })
                .collect();
            assert_eq!(kinds[0], kinds[1], "count {count}");
            let want = if count % 16 == 0 { KernelKind::AllGatherMc } else { KernelKind::AllGatherP2p };
            assert_eq!(kinds[0], want, "count {count}");
        }
    }
}
