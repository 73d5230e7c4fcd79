//! The kernel plan: which entry point, grid and push row one [`Launch`] runs, the same choice on
//! every rank.
//!
//! The rooms: [`cost`] is the cost model (B, D, the switch-point formulas and their derivation);
//! each collective has a file that opens with its table (algorithm, size range at 2, 3, 4, 5 and
//! 8 ranks, grid) and holds the function that chooses its kernel and grid: [`all_reduce`],
//! [`reduce_scatter`], [`all_gather`], [`broadcast`]. [`plan`] here keeps what every collective
//! shares: the checks of ranks and addresses, the element alignment, the multicast fallbacks (why
//! a multicast team runs a P2P kernel) and the grid rule. A test parses the four tables and
//! compares each row with the plan, so a table cannot go stale.
//!
//! Reading a table: the rows are tried in order; the first whose condition holds and whose range
//! holds the size runs. The conditions: *LL team* (the team runs the LL kernels, `MCAST_LL`; the
//! grid within the team's cap), *multicast team* (the team's transport is MULTICAST and no
//! fallback applies), *16-byte aligned* (this rank's data and out), *16-byte aligned blocks*
//! (this rank's data, and S a multiple of 16), *always*. The tables are the
//! buffer forms' choices; the pointer form's one-launch route (`local_only`) runs LL where it
//! serves, else the push kernels where [`push_serves_local`] (the all-reduce, and the
//! reduce-scatter of whole 16-byte blocks, of at most [`PUSH_MAX_RANKS`] ranks) at any size, and
//! is refused otherwise.
//!
//! Grid: `⌈X / P⌉` blocks for X bytes, one block per P: one block-round of vectors
//! ([`BYTES_PER_BLOCK`]), [`ONE_SHOT_BYTES_PER_BLOCK`] for the one-shot and push all-reduces,
//! half a round for the pulling kernels of teams of three or more (a block reads one peer at a
//! time, so mid-size messages spread over more blocks and more peers at once), up to
//! [`GRID_MAX_BLOCKS`] (or the team's cap). The cap is the sync region's block slots
//! ([`MAX_BLOCKS`]: 64 barrier counters, epochs and signature lines, all laid out in the 64 KiB
//! region): a grid of 132 blocks (the H200's SMs) needs a larger region first. Pulls on 2 x H200
//! are flat from 66 to 528 blocks (p2p-roofline). The LL kernels take one block per 4 KiB of
//! payload (one line per thread) up to the landing's 32 block slots, two lines per thread above
//! (at least one block per 8 KiB part where the team's cap is lower): on one H200 shared by teams
//! of 2, 4 and 8 ranks (2026-11-29, bf16, CUDA graphs, with the batched waits of kernels/ll.cuh)
//! the 8 KiB all-reduce went from 4.22, 6.43 and 10.39 us to 3.41, 4.58 and 6.71 us against one
//! block per 8 KiB (bench/results/2026-11-29-h200).
//!
//! Every input is the same on every rank, so every rank launches the same kernel and grid.
//! `MCAST_LL` (on/off, the team's `ll`) and `MCAST_CE_MIN_BYTES` (the copy engines, chosen
//! before the plan) stay the only run-time overrides.

pub mod all_gather;
pub mod all_reduce;
pub mod broadcast;
pub mod cost;
pub mod reduce_scatter;
#[cfg(test)]
mod tables;

pub use cost::*;

use super::entry::{multimem_has_reduction, KernelId, KernelKind};
use super::layout::{push_row_capacity, MAX_BLOCKS, PUSH_MAX_RANKS, THREADS, UNROLL};
use crate::kernels::{Collective, Launch, Path, MAX_RANKS};

/// The most blocks the launcher uses (<= [`MAX_BLOCKS`]). To be tuned on hardware: NCCL uses
/// about 16 blocks x 512 threads for NVLS on Hopper. Must not depend on the device or the rank:
/// every rank of a collective must launch the same grid (block b pairs with block b).
pub const GRID_MAX_BLOCKS: u32 = 64;
/// Bytes of work per block before another block is added (one block-round of vectors).
pub const BYTES_PER_BLOCK: u64 = THREADS as u64 * 16 * UNROLL as u64;
/// Bytes per block of a one-shot all-reduce: small, so that mid-size messages get many blocks
/// and many remote loads in flight (measured on 2 x H200: bench/results).
pub const ONE_SHOT_BYTES_PER_BLOCK: u64 = 8 * 1024;

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

/// What the shared checks found, for a collective's choice.
struct Call<'a> {
    l: &'a Launch,
    /// The LL kernels serve the call (the team runs them and [`ll_serves`]).
    ll: bool,
    /// This rank's data address.
    me: u64,
    /// This rank's out address (its data in place).
    out_me: u64,
    /// The multicast kernels run: a multicast team, the cost model says they pay, no fallback.
    mc: bool,
    /// The bytes the grid counts: the message (all-reduce, broadcast), one rank's block
    /// (reduce-scatter), every rank's blocks (all-gather).
    bytes: u64,
}

/// A collective's choice: the kernel, its grid and (push all-reduce) its row.
struct Choice {
    kind: KernelKind,
    blocks: u32,
    push_row: u32,
}

impl Call<'_> {
    /// `⌈bytes / per_block⌉` blocks within the launch's cap (the same on every rank).
    fn grid(&self, per_block: u64) -> u32 {
        self.bytes.div_ceil(per_block).clamp(1, grid_cap(self.l.max_blocks)) as u32
    }

    /// The grid of an LL kernel: one block per half LL part of payload where the landing and
    /// the cap allow ([`ll_blocks`]), never more blocks than 4 KiB parts, so no block's part is
    /// empty (every block exchanges lines with every peer in every call: the landing's reuse
    /// relies on it).
    fn ll_grid(&self) -> u32 {
        let cap = grid_cap(self.l.max_blocks);
        ll_payload(self.l.collective, self.l.count).map_or(1, |p| ll_blocks(p, cap)) as u32
    }

    /// The grid of a pulling kernel: a block per round, per half round from three ranks on.
    fn pull_grid(&self) -> u32 {
        self.grid(if self.l.nranks >= 3 { BYTES_PER_BLOCK / 2 } else { BYTES_PER_BLOCK })
    }

    fn choice(&self, kind: KernelKind, blocks: u32) -> Choice {
        Choice { kind, blocks, push_row: 0 }
    }

    /// True when the push kernels serve a call whose addresses or-ed are `bits`, in the buffer
    /// forms: a team they keep scratch for and 16-byte aligned vectors (they would run element by
    /// element otherwise, where the pulling kernels run vectors).
    fn push_fits(&self, bits: u64) -> bool {
        self.l.nranks <= PUSH_MAX_RANKS && bits.is_multiple_of(16)
    }

    /// A push kernel (kernels/push.cuh) moving `per_dest` bytes to each destination: a block per
    /// [`ONE_SHOT_BYTES_PER_BLOCK`] of the bytes the grid counts, and its row.
    fn push_choice(&self, kind: KernelKind, per_dest: u64) -> Choice {
        let blocks = self.grid(ONE_SHOT_BYTES_PER_BLOCK);
        Choice { kind, blocks, push_row: push_row_bytes(per_dest, blocks.into(), self.l.nranks) }
    }
}

/// Bytes per block and step of a push kernel moving `bytes` to each destination on `blocks`
/// blocks (`KernelArgs::push_row`): a multiple of 16 within a scratch row.
pub fn push_row_bytes(bytes: u64, blocks: u64, nranks: u32) -> u32 {
    // A full row per block once the bytes fill the grid's rows; below that they are split evenly
    // over the blocks in one step.
    let cap = push_row_capacity(nranks);
    bytes.div_ceil(blocks.max(1)).div_ceil(16).saturating_mul(16).clamp(16, cap) as u32
}

/// Bytes of each rank's slice in the pushing two-shot all-reduce of a `bytes` message on
/// `nranks` ranks: the message over N in whole 16-byte vectors, the last slices shorter or empty
/// (`push_bytes` in kernels/push.cuh; the simulator's model uses it too).
pub fn two_shot_slice_bytes(bytes: u64, nranks: u32) -> u64 {
    bytes.div_ceil(u64::from(nranks.max(1))).div_ceil(16) * 16
}

/// True when a push kernel (kernels/push.cuh) serves `collective` of `count` on a team of
/// `nranks` in one launch on memory only the rank itself maps (the pointer form's `local_only`
/// route): the all-reduce, and the reduce-scatter whose blocks are whole 16-byte vectors, of a
/// team of at most [`PUSH_MAX_RANKS`] ranks (they keep the push scratch). A block that is not
/// would put every rank's push on single elements (its peers' blocks start off the vector grid),
/// where the staged route copies vectors. Depends only on values equal on every rank.
pub fn push_serves_local(collective: Collective, nranks: u32, count: u64) -> bool {
    let fits = match collective {
        Collective::AllReduce { .. } => true,
        Collective::ReduceScatter { dtype, .. } => count.saturating_mul(dtype.size() as u64).is_multiple_of(16),
        _ => false,
    };
    fits && nranks <= PUSH_MAX_RANKS
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
    if l.local_only && !ll && !push_serves_local(l.collective, l.nranks, l.count) {
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
    // The bytes the grid counts and why a multicast team runs a P2P kernel, collective by
    // collective, after its own checks.
    let (red, bytes, fallback) = match l.collective {
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
            (None, l.count, fb)
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
            (None, total, fb)
        }
        Collective::AllReduce { dtype, op } | Collective::ReduceScatter { dtype, op } => {
            let es = dtype.size() as u64;
            let bytes = l.count.checked_mul(es).ok_or_else(too_big)?;
            if matches!(l.collective, Collective::ReduceScatter { .. }) {
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
            (Some((dtype, op)), bytes, fb)
        }
    };
    let call = Call { l, ll, me, out_me, mc: mc && fallback.is_none(), bytes };
    let choice = match l.collective {
        Collective::AllReduce { .. } => all_reduce::choose(&call),
        Collective::ReduceScatter { .. } => reduce_scatter::choose(&call),
        Collective::AllGather => all_gather::choose(&call),
        Collective::Broadcast { .. } => broadcast::choose(&call),
    };
    let fallback = fallback.or((l.path == Path::Multicast && !mc_model).then_some(NOT_PAYING));
    Ok(Some(Plan {
        kernel: KernelId { kind: choice.kind, red },
        blocks: choice.blocks,
        fallback,
        push_row: choice.push_row,
    }))
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
        // Two ranks push up to 4 MiB, in one step of full rows at the limit; the pushing
        // two-shot above, each rank's slice half the message (rounded up to 16 bytes) in rows of
        // its even split over the grid; the pulling two-shot where the data is not aligned.
        let p = plan(&launch(ar(DType::F32, RedOp::Sum), Path::P2P, 1 << 20)).unwrap().unwrap();
        assert_eq!((p.kernel.kind, p.blocks, p.push_row as u64), (KernelKind::AllReduceP2pPush, 64, PUSH_CHUNK));
        let p = plan(&launch(ar(DType::F32, RedOp::Sum), Path::P2P, (1 << 20) + 4)).unwrap().unwrap();
        assert_eq!((p.kernel.kind, p.blocks), (KernelKind::AllReduceP2pTwoShotPush, GRID_MAX_BLOCKS));
        assert_eq!(p.push_row as u64, ((2 << 20) + 16u64).div_ceil(16 * 64) * 16);
        let mut l = launch(ar(DType::F32, RedOp::Sum), Path::P2P, (1 << 20) + 4);
        l.data = l.data.iter().map(|a| a + 4).collect();
        let p = plan(&l).unwrap().unwrap();
        assert_eq!((p.kernel.kind, p.push_row, p.blocks), (KernelKind::AllReduceP2pTwoShot, 0, GRID_MAX_BLOCKS));
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
        assert_eq!(p.kernel.kind, KernelKind::AllGatherP2pPush);
        // The staged route's all-gather (an out stride: the peers' outs are their staging areas)
        // pulls, writing this rank's out alone.
        let mut staged = three(launch(Collective::AllGather, Path::P2P, 1 << 20));
        staged.out_stride = 4 << 20;
        assert_eq!(plan(&staged).unwrap().unwrap().kernel.kind, KernelKind::AllGatherP2p);
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
            (Collective::AllGather, LL_MAX_BYTES + 1, KernelKind::AllGatherP2pPush, 0),
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
        // Past LL the reduce-scatter of whole 16-byte blocks pushes (at any alignment), as the
        // all-reduce does; one of other blocks, and the other copies, are refused.
        l.count = 1 << 20;
        assert_eq!(plan(&l).unwrap().unwrap().kernel.kind, KernelKind::ReduceScatterP2pPush);
        l.count = (1 << 20) + 1;
        assert!(plan(&l).is_err());
        let mut l = ll(Collective::AllGather, Path::P2P, 1 << 20);
        l.local_only = true;
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
            let want = if count % 16 == 0 { KernelKind::AllGatherMc } else { KernelKind::AllGatherP2pPush };
            assert_eq!(kinds[0], want, "count {count}");
        }
        // A reduce-scatter whose out is each rank's own memory (the pointer form's staged route
        // writes each chunk's result straight into the caller's recv, of any element-aligned
        // address): the same choice on every rank, the push where the data and blocks allow.
        let rs = Collective::ReduceScatter { dtype: DType::F32, op: RedOp::Min };
        let kinds: Vec<KernelKind> = (0..3u32)
            .map(|rank| {
                let mut l = three(launch(rs, Path::P2P, 1 << 16));
                l.rank = rank;
                l.out = l.data;
                l.out[rank as usize] = 0x5000_0000 + 4 * u64::from(rank);
                plan(&l).unwrap().unwrap().kernel.kind
            })
            .collect();
        assert_eq!(kinds, [KernelKind::ReduceScatterP2pPush; 3]);
    }
}
