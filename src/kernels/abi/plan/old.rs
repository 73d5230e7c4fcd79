//! The plan before its split into rooms, kept while a test compares the two on a sweep.
#![allow(dead_code)]

use super::super::entry::{multimem_has_reduction, KernelId, KernelKind};
use super::super::layout::{
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

/// Blocks of an LL launch of `payload` bytes.
fn ll_blocks(payload: u64) -> u64 {
    payload.div_ceil(LL_PART).max(1)
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
        && ll_blocks(payload) <= GRID_MAX_BLOCKS.min(max_blocks.max(1)) as u64
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
    // LL: one block per LL_PART of payload, so that no block's part is empty (every block
    // exchanges lines with every peer in every call: the landing's reuse relies on it).
    let blocks = match kind {
        k if k.is_ll() => ll_payload(l.collective, l.count).map_or(1, ll_blocks) as u32,
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
    use super::super::super::test_launch as launch;
    use crate::kernels::{Collective, DType, Launch, Path, RankPtrs, RedOp};

    /// A small deterministic generator (xorshift), so the sweep is the same every run.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn pick<T: Copy>(&mut self, v: &[T]) -> T {
            v[(self.next() % v.len() as u64) as usize]
        }
    }

    #[test]
    fn the_new_plan_makes_every_choice_of_the_old_one() {
        let mut counts: Vec<u64> =
            vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 15, 16, 17, 31, 33, 1000, 1023, 1024, 4095, 4096, 4097];
        let mut edges: Vec<u64> = Vec::new();
        for n in 1..=10u32 {
            edges.push(super::one_shot_max_bytes(n));
            edges.push(super::push_max_bytes(n));
            edges.extend(super::broadcast_scatter_min_bytes(n));
            for c in [Collective::AllGather, Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum }] {
                edges.push(super::ll_max_payload(c, n));
            }
        }
        for p in 0..34 {
            edges.push(1u64 << p);
            edges.push(3u64 << p);
        }
        edges.extend([super::LL_MAX_BYTES, 8192 * 33, u64::MAX / 2, u64::MAX / 8 + 1, u64::MAX]);
        for e in edges {
            for d in [1u64, 2, 4, 8, 16] {
                counts.extend([e, e / d, (e / d).wrapping_add(1), (e / d).saturating_sub(1)]);
            }
        }
        counts.sort();
        counts.dedup();
        let collectives: Vec<Collective> = {
            let mut v = vec![Collective::AllGather];
            for root in 0..10 {
                v.push(Collective::Broadcast { root });
            }
            for dtype in DType::ALL {
                for op in RedOp::ALL {
                    v.push(Collective::AllReduce { dtype, op });
                    v.push(Collective::ReduceScatter { dtype, op });
                }
            }
            v
        };
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let offsets = [0u64, 2, 4, 8, 12, 16, 1];
        let mut compared = 0u64;
        let mut seen = std::collections::BTreeSet::new();
        for &count in &counts {
            for &collective in &collectives {
                for _ in 0..48 {
                    let n = rng.pick(&[0u32, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 7, 8, 8, 9, 16, 72, 73]);
                    let mut l: Launch = launch(collective, rng.pick(&[Path::P2P, Path::Multicast]), count);
                    l.nranks = n;
                    l.rank = rng.pick(&[0, 1, n.saturating_sub(1), n, 2]);
                    let nn = if rng.next() % 16 == 0 { n as usize + 1 } else { n as usize }.min(72);
                    let base = 0x1000_0000u64 + rng.pick(&offsets);
                    let (obase, with_out) = (0x5000_0000u64 + rng.pick(&offsets), rng.next() % 3 == 0);
                    let stride = rng.pick(&[0u64, count, 1 << 28]);
                    l.data = RankPtrs::from(
                        (0..nn as u64).map(|r| base.wrapping_add(r.wrapping_mul(stride))).collect::<Vec<_>>(),
                    );
                    l.sync = RankPtrs::from((0..n.min(72) as u64).map(|r| 0x3000_0000 + (r << 20)).collect::<Vec<_>>());
                    if with_out {
                        l.out = RankPtrs::from(
                            (0..n.min(72) as u64)
                                .map(|r| obase.wrapping_add(r.wrapping_mul(stride)))
                                .collect::<Vec<_>>(),
                        );
                    }
                    if rng.next() % 2 == 0 {
                        l.data_mc = Some(0x9000_0000 + rng.pick(&offsets));
                    }
                    if rng.next() % 3 == 0 {
                        l.out_mc = Some(0xa000_0000 + rng.pick(&offsets));
                    }
                    l.max_blocks = rng.pick(&[0u32, 1, 2, 4, 32, 64, 128]);
                    l.local_only = rng.next() % 4 == 0;
                    l.ll = rng.next() % 2 == 0;
                    let old = super::plan(&l).map(|p| p.map(|p| (p.kernel, p.blocks, p.fallback, p.push_row)));
                    let new = super::super::plan(&l).map(|p| p.map(|p| (p.kernel, p.blocks, p.fallback, p.push_row)));
                    assert_eq!(new, old, "{l:?}");
                    compared += 1;
                    if let Ok(Some((k, ..))) = new {
                        seen.insert(format!("{:?}", k.kind));
                    }
                }
            }
        }
        assert!(compared > 1_000_000, "{compared}");
        // Every kernel the plan picks was picked somewhere in the sweep.
        assert_eq!(seen.len(), 15, "{seen:?}");
        eprintln!("{compared} launches compared; kernels chosen: {seen:?}");
    }
}
