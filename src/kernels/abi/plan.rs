//! The kernel plan: which entry point, grid and push row one [`Launch`] runs, the same choice on
//! every rank, with the size thresholds between the one-shot, push and two-shot all-reduces.

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
/// payloads up to [`LL_MAX_BYTES`] that fit the grid. Depends only on values equal on every
/// rank; the pointer forms route by it (no staging where it holds).
pub fn ll_serves(collective: Collective, nranks: u32, count: u64, max_blocks: u32) -> bool {
    let Some(payload) = ll_payload(collective, count) else { return false };
    (2..=LL_MAX_RANKS).contains(&nranks)
        && payload > 0
        && payload <= LL_MAX_BYTES
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
            let kind = match (mc && fb.is_none() && !l.local_only, ll) {
                (true, _) => KernelKind::BroadcastMc,
                (false, true) => KernelKind::BroadcastLl,
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
    let per_block = match kind {
        KernelKind::AllReduceP2p | KernelKind::AllReduceP2pPush => ONE_SHOT_BYTES_PER_BLOCK,
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
    use super::super::layout::{scratch_bytes, stage_offset, team_reserved_bytes, PUSH_CHUNK, STAGE_BYTES};
    use super::super::test_launch as launch;
    use super::*;
    use crate::kernels::{DType, RedOp, SYNC_BYTES};

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
    fn plan_chooses_ll_for_small_messages_of_teams_that_have_it() {
        let ar = Collective::AllReduce { dtype: DType::BF16, op: RedOp::Sum };
        let rs = Collective::ReduceScatter { dtype: DType::F64, op: RedOp::Max };
        let ll = |c, path, count| {
            let mut l = launch(c, path, count);
            l.ll = true;
            l
        };
        // One block per LL_PART bytes of payload (what each rank sends each peer), up to the
        // landing area's 32 blocks; above, the other kernels.
        for (c, count, kind, blocks) in [
            (ar, 1, KernelKind::AllReduceLl, 1),
            (ar, 4096, KernelKind::AllReduceLl, 1),
            (ar, 4097, KernelKind::AllReduceLl, 2),
            (ar, 128 * 1024, KernelKind::AllReduceLl, 32),
            (ar, 128 * 1024 + 1, KernelKind::AllReduceP2pPush, 0),
            (rs, 1024, KernelKind::ReduceScatterLl, 1),
            (rs, 32 * 1024, KernelKind::ReduceScatterLl, 32),
            (rs, 32 * 1024 + 1, KernelKind::ReduceScatterP2p, 0),
            (Collective::AllGather, 5, KernelKind::AllGatherLl, 1),
            (Collective::AllGather, LL_MAX_BYTES, KernelKind::AllGatherLl, 32),
            (Collective::AllGather, LL_MAX_BYTES + 1, KernelKind::AllGatherP2p, 0),
            (Collective::Broadcast { root: 0 }, 3 * 8192, KernelKind::BroadcastLl, 3),
        ] {
            let p = plan(&ll(c, Path::P2P, count)).unwrap().unwrap();
            assert_eq!(p.kernel.kind, kind, "{c:?} {count}");
            if kind.is_ll() {
                assert_eq!(p.blocks, blocks, "{c:?} {count}");
            }
            // Without LL (a team of CUDA ranks by default), the kernels before it.
            assert!(!plan(&launch(c, Path::P2P, count)).unwrap().unwrap().kernel.kind.is_ll());
        }
        // LL replaces P2P kernels only: the multicast kernels stay, their fallbacks take LL.
        assert_eq!(plan(&ll(ar, Path::Multicast, 64)).unwrap().unwrap().kernel.kind, KernelKind::AllReduceMc);
        let f32_min = Collective::AllReduce { dtype: DType::F32, op: RedOp::Min };
        assert_eq!(plan(&ll(f32_min, Path::Multicast, 64)).unwrap().unwrap().kernel.kind, KernelKind::AllReduceLl);
        // The grid must fit the team's cap (ranks sharing a device), else the other kernels.
        let mut capped = ll(ar, Path::P2P, 8192);
        capped.max_blocks = 1;
        assert_eq!(plan(&capped).unwrap().unwrap().kernel.kind, KernelKind::AllReduceP2pPush);
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
        let mut l = launch(ar, Path::Multicast, 1024);
        l.out = vec![0x5000_0000, 0x6000_0000].into();
        assert_eq!(plan(&l).unwrap().unwrap().kernel.kind, KernelKind::AllReduceMc);
        // recv 4 bytes off send's alignment modulo 16: the multicast kernel cannot pair vectors.
        l.out = vec![0x5000_0004, 0x6000_0004].into();
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
            let kinds: Vec<KernelKind> = (0..2u32)
                .map(|rank| {
                    let mut l = launch(Collective::AllGather, Path::Multicast, count);
                    l.rank = rank;
                    let send = 0x7000_0000u64;
                    l.data = (0..2).map(|p| send.wrapping_sub(p * count)).collect();
                    l.out = vec![0x5000_0000, 0x6000_0000].into();
                    plan(&l).unwrap().unwrap().kernel.kind
                })
                .collect();
            assert_eq!(kinds[0], kinds[1], "count {count}");
            let want = if count % 16 == 0 { KernelKind::AllGatherMc } else { KernelKind::AllGatherP2p };
            assert_eq!(kinds[0], want, "count {count}");
        }
    }
}
