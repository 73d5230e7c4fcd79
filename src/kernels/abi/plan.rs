//! The kernel plan: which entry point, grid and push row one [`Launch`] runs, the same choice on
//! every rank, with the size thresholds between the algorithms, from a cost model whose inputs
//! every rank agrees on (collective, bytes, team size, transport, grid cap).
//!
//! # The cost model
//!
//! Per GPU, one NVLink direction carries B = 365 GB/s ([`LINK_BYTES_PER_US`]: SM pushes measured
//! 362-366 GB/s, the copy engine 390, pulls 337, both directions busy, on 2 x H200 (NV18),
//! 2026-11-22; single-pair writes 371-377 on 8 x H100, NVIDIA/nccl issue 1264). An algorithm costs
//! its launch and barriers plus the bytes through the busiest link over B. With S the message:
//!
//! | algorithm | busiest link carries | fixed cost |
//! |---|---|---|
//! | LL one-shot all-reduce (flag beside every 4 payload bytes) | 2(N-1) S | launch + one trip |
//! | push / pull one-shot all-reduce | (N-1) S | + one barrier |
//! | two-shot all-reduce (reduce-scatter, then all-gather) | 2(N-1)/N S | + D = 2 us ([`TWO_SHOT_EXTRA_US`]) |
//! | LL reduce-scatter, all-gather, broadcast (payload P each sender sends each peer) | 2(N-1) P | launch + one trip |
//! | their barrier kernels | (N-1) P | + two barriers (about D) |
//! | broadcast, every rank pulls from the root | (N-1) S (the root's egress) | + two barriers |
//! | broadcast, scatter then all-gather (N-1 slices, pipelined) | S (N-1 slices out of the root, then each owner's slice to the others) | + a barrier per chunk |
//! | multicast all-reduce (NVLink SHARP) | (1 + 1/N) S | + two barriers |
//!
//! Setting two costs equal gives each switch point (D B = 730 KB):
//! - LL all-reduce to the one-shot/two-shot: 2(N-1) S/B = 2(N-1)/N S/B + D, so
//!   S* = D B N / (2 (N-1)^2) ([`ll_max_payload`]);
//! - LL of the other collectives: 2(N-1) P/B = (N-1) P/B + D, so P* = D B / (N-1);
//!   the two-barrier kernels cost about two D more than LL's one trip: P* = 2 D B / (N-1);
//! - one-shot to two-shot all-reduce: (N-1) S/B = 2(N-1)/N S/B + D, so
//!   S* = D B N / ((N-1)(N-2)) ([`one_shot_max_bytes`]); it fits the switch points measured on
//!   Hopper by others: push one-shot to two-shot at 384 KB (4 ranks) and 160 KB (8) in SGLang,
//!   512 KB / 256 KB in vLLM, 256 KB at 8 in TensorRT-LLM;
//! - one-pull broadcast to scatter-then-all-gather (one chunk: S/B (2N-3)/(N-1) + 2 barriers):
//!   (N-1) S/B = (2N-3)/(N-1) S/B + D, so S* = D B (N-1) / (N-2)^2
//!   ([`broadcast_scatter_min_bytes`]);
//! - multicast: each GPU's link carries (1 + 1/N) S against two-shot's 2(N-1)/N S, so its
//!   bandwidth bound is 2(N-1)/(N+1) B: 0.67 B at 2 ranks (never pays), 1.0 B at 3, 1.2 B at 4,
//!   1.56 B at 8; and two barriers lose to LL's one trip wherever LL serves
//!   ([`multicast_pays`]).
//!
//! Two ranks keep the values measured on 2 x H200 (bench/results/2026-11-23-h200x2*), which the
//! model's formulas would not change where they bind (one-shot and two-shot move the same bytes at
//! N = 2; LL's model limits lie above the landing area's [`LL_MAX_BYTES`]).
//!
//! | ranks | LL all-reduce up to | LL RS/AG/BC payload up to | push/one-shot all-reduce up to | broadcast scatters from | multicast (where the team has it) |
//! |---|---|---|---|---|---|
//! | 2 | 256 KiB (landing area) | 256 KiB | push 4 MiB, one-shot 1 MiB (measured) | never (one pull) | never: P2P |
//! | 3 | 256 KiB (model 273,750 B) | 256 KiB (model 730 KB) | 1056 KiB (model 1,095,000 B) | 1440 KiB (model 1,460,000 B) | above LL |
//! | 4 | 152 KiB (model 162,222 B) | 256 KiB (model 486,666 B) | 464 KiB (model 486,666 B) | 544 KiB (model 547,500 B) | above LL |
//! | 5 | 104 KiB (model 114,062 B) | 256 KiB (model 365 KB) | 288 KiB (pull one-shot; model 304,166 B) | 320 KiB (model 324,444 B) | above LL |
//! | 8 | 56 KiB (model 59,591 B) | 200 KiB (model 208,571 B) | 128 KiB (pull one-shot; model 139,047 B) | 144 KiB (model 141,944 B) | above LL |
//!
//! LL limits are rounded down to a whole LL part (8 KiB: one block each), one-shot limits down to
//! 16 KiB, the broadcast's up to 16 KiB. Measured at 4 ranks with the limits before these (4 x
//! H200, 2026-11-28, bf16, CUDA graphs, shared/reference/n-gpu.md): the 256 KB all-reduce ran LL
//! (the landing area's limit) in 10.92 us against PyTorch's two-shot 9.04, where the model puts
//! LL's end near 160 KB; 512 KB ran mcast's two-shot (the one-shot's old 256 KiB limit) in 18.11
//! us, where a push one-shot costs about 256 KB / B x 3 = 2.1 us of wire more than at 256 KB;
//! broadcast from the root alone reached 125 GB/s at 1 GB (the root's egress shared by three
//! readers) against NCCL's 360. These thresholds are to be measured with `bench/run.sh 4` and
//! the table corrected where the measurements say otherwise.
//!
//! Grid: one block per [`BYTES_PER_BLOCK`] of the bytes a rank moves (one block-round of
//! vectors), [`ONE_SHOT_BYTES_PER_BLOCK`] for the one-shot and push all-reduces, half a round for
//! the pulling kernels of teams of three or more (a block reads one peer at a time, so mid-size
//! messages spread over more blocks and more peers at once), up to [`GRID_MAX_BLOCKS`]. The cap
//! is the sync region's block slots ([`MAX_BLOCKS`]: 64 barrier counters, epochs and signature
//! lines, all laid out in the 64 KiB region): a grid of 132 blocks (the H200's SMs) needs a larger
//! region first. Pulls on 2 x H200 are flat from 66 to 528 blocks (p2p-roofline). The LL kernels
//! take one block per 4 KiB of payload (one line per thread) up to the landing's 32 block slots,
//! two lines per thread above: on one H200 shared by teams of 2, 4 and 8 ranks (2026-11-29, bf16,
//! CUDA graphs, with the batched waits of kernels/ll.cuh) the 8 KiB all-reduce went from 4.22,
//! 6.43 and 10.39 us to 3.41, 4.58 and 6.71 us (bench/results/2026-11-29-h200).
//!
//! Every input is the same on every rank, so every rank launches the same kernel and grid.
//! `MCAST_LL` (on/off, the team's `ll`) and `MCAST_CE_MIN_BYTES` (the copy engines, chosen
//! before the plan) stay the only run-time overrides.

use super::entry::{multimem_has_reduction, KernelId, KernelKind};
use super::layout::{
    push_row_capacity, LL_MAX_BLOCKS, LL_MAX_RANKS, LL_PART, MAX_BLOCKS, PUSH_MAX_RANKS, THREADS, UNROLL,
};
use crate::kernels::{Collective, Launch, Path, MAX_RANKS};

/// The most blocks the launcher uses (<= [`MAX_BLOCKS`]). To be tuned on hardware: NCCL uses
/// about 16 blocks x 512 threads for NVLS on Hopper. Must not depend on the device or the rank:
/// every rank of a collective must launch the same grid (block b pairs with block b).
pub const GRID_MAX_BLOCKS: u32 = 64;
/// Bytes of work per block before another block is added (one block-round of vectors).
pub const BYTES_PER_BLOCK: u64 = THREADS as u64 * 16 * UNROLL as u64;
/// B of the cost model: bytes per microsecond one NVLink direction of a Hopper GPU carries
/// (365 GB/s).
pub const LINK_BYTES_PER_US: u64 = 365_000;
/// D of the cost model: what a two-shot all-reduce (or a kernel with barriers against LL's one
/// trip) costs beyond the one-shot, in microseconds (1-3 us measured on Hopper by others; 2).
pub const TWO_SHOT_EXTRA_US: u64 = 2;
/// D x B: bytes the link carries in the time of the extra fixed cost.
const DB: u64 = TWO_SHOT_EXTRA_US * LINK_BYTES_PER_US;
/// Bytes per block of a one-shot all-reduce: small, so that mid-size messages get many blocks
/// and many remote loads in flight (measured on 2 x H200: bench/results).
pub const ONE_SHOT_BYTES_PER_BLOCK: u64 = 8 * 1024;

/// The largest all-reduce that runs one-shot for `nranks` ranks. With two ranks one-shot moves
/// the same remote bytes as two-shot with one barrier fewer, so it wins up to one round of the
/// full grid (measured on 2 x H200: 13.7 us two-shot vs one-shot at 512 KiB, bench/results).
/// With more, the cost model's S* = D B N / ((N-1)(N-2)), rounded down to 16 KiB (464 KiB at 4
/// ranks, 128 KiB at 8; see the module's table).
pub fn one_shot_max_bytes(nranks: u32) -> u64 {
    if nranks <= 2 {
        1 << 20
    } else {
        let n = u64::from(nranks);
        (DB * n / ((n - 1) * (n - 2))) / (16 << 10) * (16 << 10)
    }
}

/// The smallest broadcast that runs scatter-then-all-gather (`mcast_broadcast_p2p_scatter`)
/// for `nranks` ranks, `None` where it never does (two ranks: the scatter adds a barrier and
/// moves nothing less). The cost model's S* = D B (N-1) / (N-2)^2, rounded up to 16 KiB (544
/// KiB at 4 ranks, 144 KiB at 8).
pub fn broadcast_scatter_min_bytes(nranks: u32) -> Option<u64> {
    (nranks >= 3).then(|| {
        let n = u64::from(nranks);
        (DB * (n - 1) / ((n - 2) * (n - 2))).div_ceil(16 << 10) * (16 << 10)
    })
}

/// The scatter-then-all-gather broadcast's chunk (bytes moved into every rank per round): a
/// sixteenth of the message, at least 4 MiB, in 16-byte vectors (kernels/broadcast.cu,
/// bcast_chunk_vectors: MCAST_BCAST_CHUNK_MIN, MCAST_BCAST_ROUNDS_MAX). Below 4 MiB one round
/// scatters and the next gathers; above, round k gathers chunk k - 1 while it scatters chunk k.
pub fn broadcast_chunk_bytes(count: u64) -> u64 {
    ((count / 16).div_ceil(16) * 16).max(4 << 20)
}

/// The largest all-reduce the buffer forms run with the push kernel for `nranks` ranks (when
/// `push_fits`). With two ranks push moves the same bytes as two-shot, at the push rate and with
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

/// Bytes per block and step of the push all-reduce for a message of `bytes` on `blocks` blocks
/// (`KernelArgs::push_row`): a multiple of 16 within a scratch row.
pub fn push_row_bytes(bytes: u64, blocks: u64, nranks: u32) -> u32 {
    // A full row per block once the message fills the grid's rows; below that the message split
    // evenly over the blocks in one step.
    let cap = push_row_capacity(nranks);
    bytes.div_ceil(blocks.max(1)).div_ceil(16).saturating_mul(16).clamp(16, cap) as u32
}

/// The largest payload (bytes each rank sends each peer) the LL kernels carry: the whole landing
/// area (256 KiB). LL moves twice the bytes (a flag beside every 4 payload bytes) with no
/// barrier, so it wins where latency dominates; on 2 x H100 it still won at this limit for every
/// collective (BENCHMARKS.md, "LL on by default, copy engines measured").
pub const LL_MAX_BYTES: u64 = LL_MAX_BLOCKS as u64 * LL_PART;

/// The largest LL payload of `collective` on `nranks` ranks: the cost model's switch point
/// (all-reduce S* = D B N / (2 (N-1)^2); the others P* = 2 D B / (N-1)), rounded down to whole
/// LL parts, within the landing area ([`LL_MAX_BYTES`], which binds at two ranks).
pub fn ll_max_payload(collective: Collective, nranks: u32) -> u64 {
    let n = u64::from(nranks.max(2));
    let model = match collective {
        Collective::AllReduce { .. } => DB * n / (2 * (n - 1) * (n - 1)),
        _ => 2 * DB / (n - 1),
    };
    (model / LL_PART * LL_PART).clamp(LL_PART, LL_MAX_BYTES)
}

/// True when the cost model calls the multicast kernels faster than the P2P ones for
/// `collective` of `count` on `nranks` ranks (`ll`: the team runs the LL kernels): never at two
/// ranks (multicast's bandwidth bound 2(N-1)/(N+1) B is 0.67 B there, P2P's B), and not where the
/// LL kernels serve the call (one trip against two barriers); above, from three ranks, it is.
pub fn multicast_pays(collective: Collective, nranks: u32, count: u64, ll: bool, max_blocks: u32) -> bool {
    nranks >= 3 && !(ll && ll_serves(collective, nranks, count, max_blocks))
}
/// The payload of `collective` with `count`: the bytes each sender sends each peer.
fn ll_payload(collective: Collective, count: u64) -> Option<u64> {
    match collective {
        Collective::AllReduce { dtype, .. } | Collective::ReduceScatter { dtype, .. } => {
            count.checked_mul(dtype.size() as u64)
        }
        Collective::AllGather | Collective::Broadcast { .. } => Some(count),
    }
}

/// The fewest blocks an LL launch of `payload` bytes may use: one per [`LL_PART`] (a landing
/// row holds one part).
fn ll_min_blocks(payload: u64) -> u64 {
    payload.div_ceil(LL_PART).max(1)
}

/// Blocks of an LL launch of `payload` bytes with a grid cap of `cap`: one line per thread (half
/// a part per block) where the landing's block slots and the cap allow, so that no thread awaits
/// a second round of lines and each block's stores to its N - 1 peers are spread over twice the
/// SMs; at least [`ll_min_blocks`].
fn ll_blocks(payload: u64, cap: u64) -> u64 {
    let slots = cap.min(u64::from(LL_MAX_BLOCKS));
    payload.div_ceil(LL_PART / 2).min(slots).max(ll_min_blocks(payload))
}

/// True when the LL kernels serve `collective` of `count` on a team of `nranks` whose launches
/// may use `max_blocks` blocks: teams of 2..=[`LL_MAX_RANKS`] (they keep an LL landing area),
/// payloads up to [`ll_max_payload`] (the landing area's [`LL_MAX_BYTES`] at two ranks) that fit
/// the grid. Depends only on values equal on every
/// rank; the pointer forms route by it (no staging where it holds).
pub fn ll_serves(collective: Collective, nranks: u32, count: u64, max_blocks: u32) -> bool {
    let Some(payload) = ll_payload(collective, count) else { return false };
    (2..=LL_MAX_RANKS).contains(&nranks)
        && payload > 0
        && payload <= ll_max_payload(collective, nranks)
        && ll_min_blocks(payload) <= GRID_MAX_BLOCKS.min(max_blocks.max(1)) as u64
}

const _: () = assert!(GRID_MAX_BLOCKS <= MAX_BLOCKS);

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
    l.nranks <= PUSH_MAX_RANKS && me.is_multiple_of(16)
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
    let ll = l.ll && ll_serves(l.collective, l.nranks, l.count, l.max_blocks);
    if l.local_only && !ll && !(matches!(l.collective, Collective::AllReduce { .. }) && l.nranks <= PUSH_MAX_RANKS) {
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
    // A multicast team runs the multicast kernels only where the cost model says they pay
    // (multicast_pays); otherwise the P2P kernels, with the model as the reason.
    let mc_model = l.path != Path::Multicast
        || l.local_only
        || multicast_pays(l.collective, l.nranks, l.count, l.ll, l.max_blocks);
    const NOT_PAYING: &str = "the cost model: multicast does not pay for this call (two ranks, or LL serves it)";
    let mc = l.path == Path::Multicast && mc_model;
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
            } else if !l.count.is_multiple_of(4)
                || !mc_addr.is_multiple_of(4)
                || !l.out_mc.unwrap_or(mc_addr).is_multiple_of(4)
            {
                Some("multimem.st needs 4-byte aligned ranges")
            } else if skewed {
                Some(SKEW)
            } else {
                None
            };
            let scatter = broadcast_scatter_min_bytes(l.nranks).is_some_and(|min| l.count >= min);
            let kind = match (mc && fb.is_none() && !l.local_only, ll) {
                (true, _) => KernelKind::BroadcastMc,
                (false, true) => KernelKind::BroadcastLl,
                (false, false) if scatter => KernelKind::BroadcastP2pScatter,
                (false, false) => KernelKind::BroadcastP2p,
            };
            (kind, None, l.count, fb)
        }
        Collective::AllGather => {
            let total = l.count.checked_mul(l.nranks as u64).ok_or_else(too_big)?;
            let fb = if !mc {
                None
            } else if !l.count.is_multiple_of(4) || !l.out_mc.unwrap_or(out_me).is_multiple_of(4) {
                Some("multimem.st needs 4-byte aligned blocks")
            } else if skewed {
                Some(SKEW)
            } else {
                None
            };
            let kind = match (mc && fb.is_none() && !l.local_only, ll) {
                (true, _) => KernelKind::AllGatherMc,
                (false, true) => KernelKind::AllGatherLl,
                (false, false) => KernelKind::AllGatherP2p,
            };
            (kind, None, total, fb)
        }
        Collective::AllReduce { dtype, op } | Collective::ReduceScatter { dtype, op } => {
            let es = dtype.size() as u64;
            let bytes = l.count.checked_mul(es).ok_or_else(too_big)?;
            let rs = matches!(l.collective, Collective::ReduceScatter { .. });
            if rs {
                bytes.checked_mul(l.nranks as u64).ok_or_else(too_big)?;
            }
            if !me.is_multiple_of(es) || !out_me.is_multiple_of(es) {
                return Err(format!("address {me:#x} or {out_me:#x} not aligned to the {}-byte element", es));
            }
            let unit = es.max(4);
            let fb = if !mc {
                None
            } else if !multimem_has_reduction(dtype, op) {
                Some("multimem.ld_reduce has no min/max for f32/f64")
            } else if !bytes.is_multiple_of(unit) || !mc_addr.is_multiple_of(unit) || !out_me.is_multiple_of(unit) {
                Some("multimem has no 16-bit scalar forms (odd 16-bit count or 2-byte aligned start)")
            } else if skewed {
                Some(SKEW)
            } else {
                None
            };
            let kind = match (rs, mc && fb.is_none()) {
                (true, false) if ll => KernelKind::ReduceScatterLl,
                (false, false) if ll => KernelKind::AllReduceLl,
                (false, _) if l.local_only && ll => KernelKind::AllReduceLl,
                (false, _) if l.local_only => KernelKind::AllReduceP2pPush,
                (true, _) if l.local_only => KernelKind::ReduceScatterLl,
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
    let fallback = fallback.or((l.path == Path::Multicast && !mc_model).then_some(NOT_PAYING));
    // Teams of three or more: the pulling kernels get a block per half round (module doc).
    let per_block = match kind {
        KernelKind::AllReduceP2p | KernelKind::AllReduceP2pPush => ONE_SHOT_BYTES_PER_BLOCK,
        KernelKind::AllReduceP2pTwoShot
        | KernelKind::ReduceScatterP2p
        | KernelKind::AllGatherP2p
        | KernelKind::BroadcastP2p
        | KernelKind::BroadcastP2pScatter
            if l.nranks >= 3 =>
        {
            BYTES_PER_BLOCK / 2
        }
        _ => BYTES_PER_BLOCK,
    };
    // LL: one block per half LL_PART of payload where the landing and the cap allow (ll_blocks),
    // never more blocks than 4 KiB parts, so no block's part is empty (every block exchanges lines
    // with every peer in every call: the landing's reuse relies on it).
    let blocks = match kind {
        k if k.is_ll() => ll_payload(l.collective, l.count).map_or(1, |p| ll_blocks(p, block_cap(l))) as u32,
        _ => bytes.div_ceil(per_block).clamp(1, block_cap(l)) as u32,
    };
    let push_row = match kind {
        KernelKind::AllReduceP2pPush => push_row_bytes(bytes, blocks.into(), l.nranks),
        _ => 0,
    };
    Ok(Some(Plan { kernel: KernelId { kind, red }, blocks, fallback, push_row }))
}

#[cfg(test)]
mod tests {
    use super::super::layout::{scratch_bytes, stage_offset, team_reserved_bytes, PUSH_CHUNK, STAGE_BYTES};
    use super::super::test_launch as launch;
    use super::*;
    use crate::kernels::{DType, RedOp, SYNC_BYTES};

    /// `l` on a team of three ranks (multicast pays from three ranks on: the cost model).
    fn three(mut l: Launch) -> Launch {
        l.nranks = 3;
        l.data = [0x1000_0000, 0x2000_0000, 0x7000_0000].into();
        l.sync = [0x3000_0000, 0x4000_0000, 0x8000_0000].into();
        l
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
        big_team.data = vec![0x1000_0000; 5].into();
        big_team.sync = vec![0x3000_0000; 5].into();
        assert_eq!(plan(&big_team).unwrap().unwrap().kernel.kind, KernelKind::AllReduceP2p);
        assert_eq!(scratch_bytes(5), 0);
        assert_eq!(team_reserved_bytes(2, false, 0), SYNC_BYTES + 3 * 65536 * 64 + STAGE_BYTES);
        assert_eq!(team_reserved_bytes(2, true, 0), SYNC_BYTES + 3 * 65536 * 64 + STAGE_BYTES + 32 * 2 * 16384);
        assert_eq!(team_reserved_bytes(8, true, 0), SYNC_BYTES + STAGE_BYTES + 32 * 2 * 7 * 16384);
        assert_eq!(team_reserved_bytes(9, true, 0), team_reserved_bytes(9, false, 0));
        // The device-API slots come last: 256 slots of a team of two, 8 + 8 * 2 bytes each.
        assert_eq!(team_reserved_bytes(2, true, 256), team_reserved_bytes(2, true, 0) + 256 * 24);
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
        let p = plan(&three(launch(ar(DType::F16, RedOp::Max), Path::Multicast, 1024))).unwrap().unwrap();
        assert_eq!((p.kernel.kind, p.fallback), (KernelKind::AllReduceMc, None));
        // Two ranks: the P2P kernels, the cost model the reason.
        let p = plan(&launch(ar(DType::F16, RedOp::Max), Path::Multicast, 1024)).unwrap().unwrap();
        assert_eq!(p.kernel.kind, KernelKind::AllReduceP2pPush);
        assert!(p.fallback.is_some_and(|f| f.contains("cost model")));
        let p = plan(&three(launch(ar(DType::F16, RedOp::Sum), Path::Multicast, 1023))).unwrap().unwrap();
        assert_eq!(p.kernel.kind, KernelKind::AllReduceP2pPush);
        let rs = Collective::ReduceScatter { dtype: DType::I64, op: RedOp::Sum };
        assert_eq!(
            plan(&three(launch(rs, Path::Multicast, 7))).unwrap().unwrap().kernel.kind,
            KernelKind::ReduceScatterMc
        );
        let p = plan(&three(launch(Collective::AllGather, Path::Multicast, 6))).unwrap().unwrap();
        assert_eq!(p.kernel.kind, KernelKind::AllGatherP2p);
        let p = plan(&three(launch(Collective::Broadcast { root: 0 }, Path::Multicast, 8))).unwrap().unwrap();
        assert_eq!(p.kernel.kind, KernelKind::BroadcastMc);
        assert!(plan(&launch(Collective::Broadcast { root: 2 }, Path::P2P, 8)).is_err());
        assert_eq!(plan(&launch(Collective::AllGather, Path::P2P, 0)).unwrap(), None);
        let mut l = launch(Collective::AllGather, Path::P2P, 8);
        l.data.pop();
        assert!(plan(&l).is_err());
    }

    #[test]
    fn plan_chooses_ll_for_small_messages_of_teams_that_have_it() {
        let ar = Collective::AllReduce { dtype: DType::BF16, op: RedOp::Sum };
        let rs = Collective::ReduceScatter { dtype: DType::F64, op: RedOp::Max };
        let ll = |c, path, count| {
            let mut l = launch(c, path, count);
            l.ll = true;
            l
        };
        // One block per half LL_PART of payload (what each rank sends each peer: one line per
        // thread), up to the landing area's 32 blocks; above, the other kernels.
        for (c, count, kind, blocks) in [
            (ar, 1, KernelKind::AllReduceLl, 1),
            (ar, 2048, KernelKind::AllReduceLl, 1),
            (ar, 2049, KernelKind::AllReduceLl, 2),
            (ar, 4096, KernelKind::AllReduceLl, 2),
            (ar, 4097, KernelKind::AllReduceLl, 3),
            (ar, 64 * 1024, KernelKind::AllReduceLl, 32),
            (ar, 128 * 1024, KernelKind::AllReduceLl, 32),
            (ar, 128 * 1024 + 1, KernelKind::AllReduceP2pPush, 0),
            (rs, 512, KernelKind::ReduceScatterLl, 1),
            (rs, 1024, KernelKind::ReduceScatterLl, 2),
            (rs, 32 * 1024, KernelKind::ReduceScatterLl, 32),
            (rs, 32 * 1024 + 1, KernelKind::ReduceScatterP2p, 0),
            (Collective::AllGather, 5, KernelKind::AllGatherLl, 1),
            (Collective::AllGather, LL_MAX_BYTES, KernelKind::AllGatherLl, 32),
            (Collective::AllGather, LL_MAX_BYTES + 1, KernelKind::AllGatherP2p, 0),
            (Collective::Broadcast { root: 0 }, 3 * 8192, KernelKind::BroadcastLl, 6),
        ] {
            let p = plan(&ll(c, Path::P2P, count)).unwrap().unwrap();
            assert_eq!(p.kernel.kind, kind, "{c:?} {count}");
            if kind.is_ll() {
                assert_eq!(p.blocks, blocks, "{c:?} {count}");
            }
            // Without LL (a team of CUDA ranks by default), the kernels before it.
            assert!(!plan(&launch(c, Path::P2P, count)).unwrap().unwrap().kernel.kind.is_ll());
        }
        // Where LL serves, it beats the multicast kernels (the cost model): they run above it,
        // from three ranks on; their fallbacks take LL too.
        assert_eq!(plan(&three(ll(ar, Path::Multicast, 64))).unwrap().unwrap().kernel.kind, KernelKind::AllReduceLl);
        assert_eq!(
            plan(&three(ll(ar, Path::Multicast, 1 << 20))).unwrap().unwrap().kernel.kind,
            KernelKind::AllReduceMc
        );
        let f32_min = Collective::AllReduce { dtype: DType::F32, op: RedOp::Min };
        assert_eq!(plan(&ll(f32_min, Path::Multicast, 64)).unwrap().unwrap().kernel.kind, KernelKind::AllReduceLl);
        // The grid must fit the team's cap (ranks sharing a device), else the other kernels;
        // under the cap, two lines per thread (a whole part per block) before the other kernels.
        let mut capped = ll(ar, Path::P2P, 8192);
        capped.max_blocks = 1;
        assert_eq!(plan(&capped).unwrap().unwrap().kernel.kind, KernelKind::AllReduceP2pPush);
        capped.max_blocks = 2;
        let p = plan(&capped).unwrap().unwrap();
        assert_eq!((p.kernel.kind, p.blocks), (KernelKind::AllReduceLl, 2));
        capped.max_blocks = 3;
        assert_eq!(plan(&capped).unwrap().unwrap().blocks, 3);
        capped.max_blocks = 64;
        assert_eq!(plan(&capped).unwrap().unwrap().blocks, 4);
        // Teams of 2..=8 ranks.
        let mut big = ll(ar, Path::P2P, 64);
        big.nranks = 9;
        big.data = vec![0x1000_0000; 9].into();
        big.sync = vec![0x3000_0000; 9].into();
        assert_eq!(plan(&big).unwrap().unwrap().kernel.kind, KernelKind::AllReduceP2p);
        // The pointer form (local_only) runs LL for every collective it serves, and refuses the
        // copies LL cannot carry.
        let mut l = ll(Collective::AllGather, Path::Multicast, 100);
        l.local_only = true;
        assert_eq!(plan(&l).unwrap().unwrap().kernel.kind, KernelKind::AllGatherLl);
        let mut l = ll(rs, Path::P2P, 3);
        l.local_only = true;
        assert_eq!(plan(&l).unwrap().unwrap().kernel.kind, KernelKind::ReduceScatterLl);
        l.count = 1 << 20;
        assert!(plan(&l).is_err());
        let mut l = ll(ar, Path::P2P, 1 << 20);
        l.local_only = true;
        assert_eq!(plan(&l).unwrap().unwrap().kernel.kind, KernelKind::AllReduceP2pPush);
        assert!(ll_serves(ar, 2, 1, 64) && !ll_serves(ar, 1, 1, 64) && !ll_serves(ar, 2, 0, 64));
    }

    #[test]
    fn plan_out_of_place() {
        let ar = Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum };
        let mut l = three(launch(ar, Path::Multicast, 1024));
        l.out = vec![0x5000_0000, 0x6000_0000, 0x9000_0000].into();
        assert_eq!(plan(&l).unwrap().unwrap().kernel.kind, KernelKind::AllReduceMc);
        // recv 4 bytes off send's alignment modulo 16: the multicast kernel cannot pair vectors.
        l.out = vec![0x5000_0004, 0x6000_0004, 0x9000_0004].into();
        let p = plan(&l).unwrap().unwrap();
        assert_eq!(
            (p.kernel.kind, p.fallback),
            (KernelKind::AllReduceP2p, Some("send and recv disagree in alignment modulo 16"))
        );
        // The push all-reduce needs 16-byte aligned recv too.
        let mut l = launch(ar, Path::P2P, 1024);
        l.out = vec![0x5000_0004, 0x6000_0004].into();
        assert_eq!(plan(&l).unwrap().unwrap().kernel.kind, KernelKind::AllReduceP2p);
        l.out = vec![0x5000_0002, 0x6000_0002].into();
        assert!(plan(&l).is_err(), "recv not aligned to the element");
        l.out = vec![0x5000_0000].into();
        assert!(plan(&l).is_err(), "one out address for two ranks");
        // All-gather out of place: the same choice on every rank, whatever its block's offset.
        for count in [340u64, 352] {
            let kinds: Vec<KernelKind> = (0..3u32)
                .map(|rank| {
                    let mut l = three(launch(Collective::AllGather, Path::Multicast, count));
                    l.rank = rank;
                    let send = 0x7000_0000u64;
                    l.data = (0..3).map(|p| send.wrapping_sub(p * count)).collect();
                    l.out = vec![0x5000_0000, 0x6000_0000, 0x9000_0000].into();
                    plan(&l).unwrap().unwrap().kernel.kind
                })
                .collect();
            assert!(kinds.iter().all(|k| *k == kinds[0]), "count {count}");
            let want = if count % 16 == 0 { KernelKind::AllGatherMc } else { KernelKind::AllGatherP2p };
            assert_eq!(kinds[0], want, "count {count}");
        }
    }
}
