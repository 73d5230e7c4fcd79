//! The pointer form's staged route: a chunk at a time through the team's staging area, for
//! calls whose memory no peer can map and that no one-launch kernel serves.

use std::sync::Arc;

use super::super::error::{Error, Result};
use super::super::launch::{kernel_error_at, launch_copy_out, launch_kernel};
use super::super::team::Team;
use crate::driver::{DevicePtr, Stream};
use crate::kernels::abi::signature::{signature, Offsets};
use crate::kernels::abi::{KernelId, KernelKind, Variant};
use crate::kernels::select::Unit;
use crate::kernels::{self, Collective, RankPtrs};

/// The pointer form through the team's staging area (see [`crate::kernels::abi::STAGE_BYTES`]):
/// per chunk, this rank's part of `send` is copied into its own staging slot
/// (`cuMemcpyDtoDAsync` on `stream`, enqueued after the one-stream check), the kernel runs on
/// the staging area of every rank (any algorithm and transport, multicast included: the staging
/// area is symmetric), and this rank's result reaches `recv`: written there by the kernel itself
/// where the P2P kernels pull (all-gather, its blocks `block` apart in `recv`
/// ([`Launch::out_stride`](crate::kernels::Launch::out_stride)); broadcast; reduce-scatter),
/// else copied out by the copy-out kernel; neither writes after a failure. Every kernel ends
/// with a barrier that every peer crosses only after its last access to this rank's staging
/// area, so the next chunk's copy-in (stream-ordered after this rank's kernel) never overwrites
/// bytes a peer may still read. `block` is the per-rank block in bytes (the whole message for
/// broadcast and all-reduce).
#[allow(clippy::too_many_arguments)]
pub(super) fn run_staged(
    team: &Arc<Team>,
    r: usize,
    send: DevicePtr,
    recv: DevicePtr,
    collective: Collective,
    stream: Stream,
    block: usize,
    in_place: bool,
) -> Result<()> {
    use crate::kernels::abi::{stage_offset, STAGE_BYTES};
    let n = team.size();
    let dev = team.devices()[r];
    let driver = team.context().driver().clone();
    let off = stage_offset(n as u32) as u64;
    let stage: RankPtrs = team.sync_bases(r).iter().map(|b| b + off).collect();
    let stage_mc = team.sync_multicast(r).map(|b| b + off);
    let me = stage[r];
    let esize = match collective {
        Collective::AllReduce { dtype, .. } | Collective::ReduceScatter { dtype, .. } => dtype.size(),
        _ => 1,
    };
    // Bytes of one block's chunk: the whole staging area for one block, a 16-byte multiple of
    // 1/N of it for N blocks (16 is a multiple of every element size).
    let blocks = match collective {
        Collective::AllGather | Collective::ReduceScatter { .. } => n,
        _ => 1,
    };
    let chunk = (STAGE_BYTES / blocks) / 16 * 16;
    debug_assert!(chunk >= 16);
    // Where the P2P kernels pull (all-gather, broadcast, reduce-scatter) they write this rank's
    // result straight into `recv`; elsewhere (the all-reduce, multicast) a copy-out kernel
    // follows, whose module (the all-gather one) is loaded before this call's first kernel:
    // loaded after it, it would wait for that kernel, which waits for ranks this thread may not
    // have issued yet (README, "One thread driving several ranks").
    let pulls = stage_mc.is_none() && !kernels::cuda::emulate_forced();
    // The broadcast of three or more ranks may scatter then gather (plan/broadcast.rs), reading the peers'
    // slices from their outs: those must be the staging areas, so its results leave through
    // the copy-out kernel too.
    let bcast_direct = n < 3;
    if !pulls || matches!(collective, Collective::AllReduce { .. }) || (!bcast_direct && is_broadcast(collective)) {
        let copy_out_unit = Unit::of(KernelId { kind: KernelKind::CopyOut, red: None }, team.ll());
        kernels::load_module(driver.as_ref(), dev, Variant::Emulated, copy_out_unit)
            .map_err(|e| kernel_error_at(e, r, collective, dev))?;
    }
    let copy = |dst: DevicePtr, src: DevicePtr, len: usize, what: &str| -> Result<()> {
        driver
            .memcpy_dtod_async(dev, dst, src, len, stream)
            .map_err(|e| Error::driver(e, format_args!("copying rank {r}'s {what} through the team's staging area")))
    };
    let mut o = 0usize;
    while o < block {
        let len = chunk.min(block - o);
        let whole = len == block;
        let copy_in = || -> Result<()> {
            match collective {
                Collective::AllReduce { .. } => copy(me, send + o as u64, len, "send chunk"),
                Collective::Broadcast { root } if root as usize == r => copy(me, send + o as u64, len, "send chunk"),
                Collective::Broadcast { .. } => Ok(()),
                Collective::AllGather => copy(me + (r * len) as u64, send + o as u64, len, "send chunk"),
                Collective::ReduceScatter { .. } if whole => copy(me, send, n * block, "send"),
                Collective::ReduceScatter { .. } => (0..n)
                    .try_for_each(|q| copy(me + (q * len) as u64, send + (q * block + o) as u64, len, "send block")),
            }
        };
        let sig = signature(collective, (block / esize) as u64, Offsets::Free);
        // Where the P2P kernels write only this rank's own out (they pull from the peers'
        // staging areas: all-gather, broadcast, reduce-scatter, LL or not), this rank's result
        // goes straight into `recv` (the kernel's out: the layout of its data, but for the
        // all-gather's blocks, `block` apart in `recv` where they are `len` apart in the staging
        // area); a failed kernel writes nothing.
        let direct = match collective {
            _ if !pulls => None,
            Collective::Broadcast { root } if root as usize == r && in_place => None,
            Collective::Broadcast { .. } if bcast_direct => Some(recv + o as u64),
            Collective::Broadcast { .. } => None,
            Collective::ReduceScatter { .. } => Some((recv + o as u64).wrapping_sub((r * len) as u64)),
            Collective::AllGather => Some(recv + o as u64),
            Collective::AllReduce { .. } => None,
        };
        let out = direct.map(|at| {
            let mut out = stage;
            out[r] = at;
            (out, None)
        });
        // The stride also tells the plan that the peers' outs here are their staging areas, so
        // the all-gather pulls (writing this rank's out alone) where it would push.
        let stride = if matches!(collective, Collective::AllGather) && direct.is_some() { block as u64 } else { 0 };
        let sig = Some(sig);
        launch_kernel(
            team,
            r,
            len / esize,
            collective,
            stream,
            stage,
            stage_mc,
            out,
            false,
            Some(&copy_in),
            sig,
            stride,
        )?;
        if direct.is_some() {
            o += len;
            continue;
        }
        // Elsewhere the results leave the staging area through the copy-out kernel, which
        // writes nothing where the collective failed on the device (a mismatch, a timeout, an
        // abort): rows of `row` bytes, from `src[k]` to `dst[k]`.
        let (mut dst, mut src) = (RankPtrs::EMPTY, RankPtrs::EMPTY);
        let mut add = |d: DevicePtr, s: DevicePtr| {
            dst.push(d);
            src.push(s);
        };
        let row = match collective {
            Collective::Broadcast { root } if root as usize == r && in_place => 0,
            Collective::AllReduce { .. } | Collective::Broadcast { .. } => {
                add(recv + o as u64, me);
                len
            }
            Collective::ReduceScatter { .. } => {
                add(recv + o as u64, me + (r * len) as u64);
                len
            }
            Collective::AllGather if whole => {
                add(recv, me);
                n * block
            }
            Collective::AllGather => {
                for q in (0..n).filter(|&q| !(in_place && q == r)) {
                    add(recv + (q * block + o) as u64, me + (q * len) as u64);
                }
                len
            }
        };
        if !dst.is_empty() {
            launch_copy_out(team, r, collective, stream, &dst, &src, row)?;
        }
        o += len;
    }
    Ok(())
}

fn is_broadcast(c: Collective) -> bool {
    matches!(c, Collective::Broadcast { .. })
}
