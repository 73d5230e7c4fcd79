//! The cost model the plan's thresholds come from, and the switch points it gives: every input
//! is one every rank agrees on (collective, bytes, team size, transport, grid cap).
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
//! | two-shot all-reduce (a reduce-scatter by loads, each slice pushed to every rank) | 2(N-1)/N S | + D = 2 us ([`TWO_SHOT_EXTRA_US`]) |
//! | two-shot all-reduce on the push protocol (each slice pushed into its owner's scratch, reduced there, pushed to every rank) | 2(N-1)/N S, all stores | + one barrier (the exit) |
//! | reduce-scatter on the push protocol (block p pushed into rank p's scratch) | (N-1) S, all stores | launch + one trip |
//! | reduce-scatter by loads | (N-1) S, all loads | + two barriers |
//! | LL reduce-scatter, all-gather, broadcast (payload P each sender sends each peer) | 2(N-1) P | launch + one trip |
//! | their barrier kernels | (N-1) P | + two barriers (about D) |
//! | broadcast, every rank pulls from the root | (N-1) S (the root's egress) | + two barriers |
//! | broadcast, scatter then all-gather (each of N-1 owners forwards its slice) | S (N-1 slices out of the root; into each rank) | + D (the forwarding hop) |
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
//! - one-pull broadcast to scatter-then-all-gather (both two barriers; the scatter's owners
//!   forward what they load, a second hop): (N-1) S/B = S/B + D, so S* = D B / (N-2)
//!   ([`broadcast_scatter_min_bytes`]);
//! - multicast: each GPU's link carries (1 + 1/N) S against two-shot's 2(N-1)/N S, so its
//!   bandwidth bound is 2(N-1)/(N+1) B: 0.67 B at 2 ranks (never pays), 1.0 B at 3, 1.2 B at 4,
//!   1.56 B at 8; and two barriers lose to LL's one trip wherever LL serves
//!   ([`multicast_pays`]).
//!
//! Loads and stores cost alike here; measured, SM stores cross NVLink at 362-366 GB/s where loads
//! reach 337 (shared/reference/p2p-roofline.md), so where a team keeps the push scratch (at most
//! [`PUSH_MAX_RANKS`] ranks) the reductions past LL and the one-shot run on the push protocol: the
//! reduce-scatter with no barrier at all, the two-shot with one. Its bytes are the same, so the
//! switch points above do not move.
//!
//! Teams of 8 (modelled, not measured: no machine with 8 GPUs was at hand): LL carries the
//! all-reduce up to S* = D B 8 / (2 49) = 59 KB, rounded down to 56 KiB, and the other
//! collectives' payloads up to P* = 2 D B / 7 = 208 KB, 200 KiB; the one-shot ends at
//! D B 8 / (7 6) = 139 KB, 128 KiB, where the two-shot takes over; the broadcast scatters from
//! D B / 6 = 122 KB, 128 KiB. Grids as at 4 ranks (the tables' cells): one block per 8 KiB for
//! the one-shot, per 16 KiB for the pulls, up to [`GRID_MAX_BLOCKS`]. The push protocol would
//! need 3 x 7 x 32 KiB x 64 = 42 MiB of scratch per rank at 8 ranks (or half with 16 KiB rows),
//! and its reduction holds a vector per rank in registers (at 4 ranks, 8 vectors a thread), so
//! teams of 5 to 8 keep the pulling reduce-scatter and two-shot: the reduce-scatter at the pull
//! rate, 337 of the 365 GB/s of the model's B, and the two-shot, half its bytes loaded and half
//! stored, near 350 GB/s (0.96 B).
//!
//! Two ranks keep the values measured on 2 x H200 (bench/results/2026-11-23-h200x2*), which the
//! model's formulas would not change where they bind (one-shot and two-shot move the same bytes at
//! N = 2; LL's model limits lie above the landing area's [`LL_MAX_BYTES`]).
//!
//! LL limits are rounded down to a whole LL part (8 KiB: one block each), one-shot limits down to
//! 16 KiB, the broadcast's up to 16 KiB; the values each team size gets are in each collective's
//! table (`all_reduce.rs`, `reduce_scatter.rs`, `all_gather.rs`, `broadcast.rs`). Measured at 4
//! ranks with the limits before these (4 x H200, 2026-11-28, bf16, CUDA graphs,
//! shared/reference/n-gpu.md): the 256 KB all-reduce ran LL (the landing area's limit) in 10.92
//! us against PyTorch's two-shot 9.04, where the model puts LL's end near 160 KB; 512 KB ran
//! mcast's two-shot (the one-shot's old 256 KiB limit) in 18.11 us, where a push one-shot costs
//! about 256 KB / B x 3 = 2.1 us of wire more than at 256 KB; broadcast from the root alone
//! reached 125 GB/s at 1 GB (the root's egress shared by three readers) against NCCL's 360. These
//! thresholds are to be measured with `bench/run.sh 4` and the tables corrected where the
//! measurements say otherwise.

#[cfg(doc)]
use super::super::layout::PUSH_MAX_RANKS;
use super::super::layout::{LL_MAX_BLOCKS, LL_MAX_RANKS, LL_PART};
use super::GRID_MAX_BLOCKS;
use crate::kernels::Collective;

/// B of the cost model: bytes per microsecond one NVLink direction of a Hopper GPU carries
/// (365 GB/s).
pub const LINK_BYTES_PER_US: u64 = 365_000;
/// D of the cost model: what a two-shot all-reduce (or a kernel with barriers against LL's one
/// trip) costs beyond the one-shot, in microseconds (1-3 us measured on Hopper by others; 2).
/// Ours has two barriers, as the pulling one-shot has, since its all-gather half pushes
/// (kernels/all_reduce/two_shot.cu): what it adds is the reduced slice's trip to the peers
/// before the exit barrier, so D may be lower for it; to be measured on 4 GPUs.
pub const TWO_SHOT_EXTRA_US: u64 = 2;
/// D x B: bytes the link carries in the time of the extra fixed cost.
const DB: u64 = TWO_SHOT_EXTRA_US * LINK_BYTES_PER_US;

/// The largest all-reduce that runs one-shot for `nranks` ranks. With two ranks one-shot moves
/// the same remote bytes as two-shot with one barrier fewer, so it wins up to one round of the
/// full grid (measured on 2 x H200: 13.7 us two-shot vs one-shot at 512 KiB, bench/results).
/// With more, the cost model's S* = D B N / ((N-1)(N-2)), rounded down to 16 KiB (464 KiB at 4
/// ranks, 128 KiB at 8; see the all-reduce's table).
pub fn one_shot_max_bytes(nranks: u32) -> u64 {
    if nranks <= 2 {
        1 << 20
    } else {
        let n = u64::from(nranks);
        (DB * n / ((n - 1) * (n - 2))) / (16 << 10) * (16 << 10)
    }
}

/// The smallest broadcast that runs scatter-then-all-gather (`mcast_broadcast_p2p_scatter`)
/// for `nranks` ranks, `None` where it never does (two ranks: the one owner would forward to no
/// one, a hop for nothing). The cost model's S* = D B / (N-2), rounded up to 16 KiB (368 KiB at
/// 4 ranks, 128 KiB at 8).
pub fn broadcast_scatter_min_bytes(nranks: u32) -> Option<u64> {
    (nranks >= 3).then(|| (DB / (u64::from(nranks) - 2)).div_ceil(16 << 10) * (16 << 10))
}

/// The largest all-reduce the buffer forms run with the push kernel for `nranks` ranks (when
/// the message fits it: see the all-reduce's table). With two ranks push moves the same bytes as
/// two-shot, at the push rate and with no barrier: measured on 2 x H200 (bf16, CUDA graph, us)
/// 12.2 vs 16.3 at 2 MiB, 19.2 vs 22.2 at 4 MiB, 35.2 vs 34.2 at 8 MiB. With more ranks push
/// moves (N-1) x the message, so it stops where one-shot does.
pub fn push_max_bytes(nranks: u32) -> u64 {
    if nranks <= 2 {
        4 << 20
    } else {
        one_shot_max_bytes(nranks)
    }
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
pub(super) fn ll_payload(collective: Collective, count: u64) -> Option<u64> {
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
pub(super) fn ll_blocks(payload: u64, cap: u64) -> u64 {
    let slots = cap.min(u64::from(LL_MAX_BLOCKS));
    payload.div_ceil(LL_PART / 2).min(slots).max(ll_min_blocks(payload))
}

/// The most blocks a launch of a team whose launches may use `max_blocks` blocks runs:
/// [`GRID_MAX_BLOCKS`] or the team's cap (the same on every rank).
pub(super) fn grid_cap(max_blocks: u32) -> u64 {
    GRID_MAX_BLOCKS.min(max_blocks.max(1)) as u64
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
        && ll_min_blocks(payload) <= grid_cap(max_blocks)
}
