//! The copy-engine (CE) forms of the collectives on the P2P transport, for large messages.
//!
//! An SM kernel moves peer data with SM loads and stores, whose ceiling on 2 x H200 is below the
//! copy engines' (BENCHMARKS.md: 390 GB/s per direction for a peer copy against 362-366 for SM
//! stores and 337 for SM loads, both directions busy). Above [`Config::ce_min_bytes`]
//! (`MCAST_CE_MIN_BYTES`) the buffer forms and registered memory (memory every rank maps)
//! therefore move the bulk with `cuMemcpyDtoDAsync` through the peer mappings the team already
//! holds, all on the caller's stream (so the collective stays CUDA-graph capturable: a capture
//! records the copies as memcpy nodes, on the simulator as on CUDA):
//!
//! - **all-gather**: barrier kernel, then one copy per peer of this rank's block into that
//!   peer's copy (push: local reads, remote writes; out of place also the local copy of the
//!   block from send to recv), then a barrier kernel;
//! - **broadcast**: barrier kernel, the root pushes its range into every other rank's copy (and
//!   its own recv out of place), barrier kernel;
//! - **all-reduce** (two-shot): the SM reduce-scatter kernel leaves the reduction of block r in
//!   rank r's copy (by the end of it every peer has read its block r), each rank pushes its reduced block into
//!   every peer's copy with the copy engine, barrier kernel. A tail of fewer than N 16-byte units
//!   that does not split evenly is reduced first by the ordinary all-reduce kernel.
//!
//! The pointer form's staged plain memory and its push all-reduce keep the kernels (peers cannot
//! address that memory), and so do the MULTICAST transport and `MCAST_EMULATE_MULTIMEM=1`.
//!
//! # Ordering
//!
//! Nothing on the device orders a copy engine's writes against an SM's flag except stream order,
//! so the copies sit between two kernels on the same stream:
//!
//! - **entry**: rank r may write into peer p's memory only once p's earlier work on it (its
//!   previous collective, the caller's kernels that produced or still read the data) is done.
//!   p's barrier kernel starts only after that work (p's stream order) and signals with a
//!   release; r's barrier kernel waits for every peer's signal with an acquire, and r's copies
//!   start only after that kernel has ended (r's stream order).
//! - **exit**: r's exit barrier kernel starts only after r's copies have completed (a kernel
//!   launched after a memcpy on one stream waits for the memcpy to finish, and a finished
//!   peer-to-peer copy has performed its writes at the destination); its release signal to p
//!   therefore follows every byte r wrote into p. p's exit barrier waits for every rank's signal
//!   (acquire), and p's later stream work runs after that kernel ends: it sees all the data.
//!
//! NCCL 2.28's CE collectives (`src/ce_coll.cc`) rest on the same argument with other tools:
//! their "ready" and "complete" flags are themselves 4-byte `cudaMemcpyAsync`s into the peers'
//! flag words, enqueued on the stream after the data copies, and the waits are
//! `cuStreamWaitValue32` stream memory operations; stream order alone puts the data before the
//! flag. Here the flags are the team's barrier words, so aborts and `timeout_ms` end the waits
//! exactly as in every other collective (the barrier kernel is abort and timeout aware).

use std::sync::Arc;

use super::error::{Error, Result};
use super::launch::{admit, kernel_error, kernel_error_at, launch_kernel, p2p_launch, signature_of};
use super::team::{Team, Transport};
use crate::driver::{DevicePtr, Stream};
use crate::kernels::abi::Variant;
use crate::kernels::select::Unit;
use crate::kernels::{self, Collective, RankPtrs};

#[cfg(doc)]
use super::config::Config;

/// Bytes of the message as `mcast-bench` reports its size (the threshold's unit): the whole
/// gathered output of an all-gather (`count` is per rank), the message of a broadcast or
/// all-reduce. `None` for collectives without a copy-engine form.
pub fn message_bytes(collective: Collective, count: usize, nranks: usize) -> Option<u64> {
    match collective {
        Collective::AllGather => (count as u64).checked_mul(nranks as u64),
        Collective::Broadcast { .. } => Some(count as u64),
        Collective::AllReduce { dtype, .. } => (count as u64).checked_mul(dtype.size() as u64),
        Collective::ReduceScatter { .. } => None,
    }
}

/// Elements per 16-byte unit of `dtype`'s all-reduce blocks.
fn unit_elems(esize: usize) -> usize {
    (16 / esize).max(1)
}

/// True when rank parts of `collective` with `count` run in their copy-engine form: the P2P
/// transport (not emulated multimem), the threshold on (non-zero) and reached, and for the
/// all-reduce at least one 16-byte unit per rank. Depends only on values equal on every rank
/// (team, configuration, collective, count), so every rank takes the same route.
pub fn wanted(team: &Team, collective: Collective, count: usize) -> bool {
    let min = team.ce_min_bytes();
    if min == 0 || team.transport() != Transport::P2P || kernels::cuda::emulate_forced() {
        return false;
    }
    let n = team.size();
    let Some(bytes) = message_bytes(collective, count, n) else { return false };
    if bytes < min {
        return false;
    }
    match collective {
        Collective::AllReduce { dtype, .. } => count / n >= unit_elems(dtype.size()),
        _ => true,
    }
}

/// Rank `r`'s part of `collective` in its copy-engine form (see the module doc). `data` and
/// `out` are the [`Launch`](crate::kernels::Launch) addresses (per rank, valid on this rank's device; `out` empty in
/// place; all-gather `data` bases shifted back by each rank's block, as the kernels take them).
/// `sig` is the call's signature: the entry barrier kernel (all-gather, broadcast) or the tail
/// and reduce-scatter kernels (all-reduce) compare it across ranks; the exit barrier kernel does
/// not (a writer's next signature must not land before every rank read this one).
#[allow(clippy::too_many_arguments)]
pub fn run(
    team: &Arc<Team>,
    r: usize,
    count: usize,
    collective: Collective,
    stream: Stream,
    data: &[DevicePtr],
    out: &[DevicePtr],
    sig: [u64; 2],
) -> Result<()> {
    let n = team.size();
    tracing::debug!("rank {r}: {collective:?} of count {count} runs its copy-engine form (MCAST_CE_MIN_BYTES)");
    load_modules(team, r, collective)?;
    let out_of = |p: usize| if out.is_empty() { data[p] } else { out[p] };
    match collective {
        Collective::AllGather => {
            let block = count as u64;
            let mine = data[r].wrapping_add(r as u64 * block);
            let copies: Vec<PeerCopy> = (0..n)
                .map(|p| PeerCopy { dst: out_of(p).wrapping_add(r as u64 * block), src: mine, len: count, to: p })
                .filter(|c| c.dst != c.src)
                .collect();
            fenced(team, r, stream, Some(sig), &copies, collective)
        }
        Collective::Broadcast { root } => {
            let root = root as usize;
            let copies: Vec<PeerCopy> = if r == root {
                (0..n)
                    .map(|p| PeerCopy { dst: out_of(p), src: data[root], len: count, to: p })
                    .filter(|c| c.dst != c.src)
                    .collect()
            } else {
                vec![]
            };
            fenced(team, r, stream, Some(sig), &copies, collective)
        }
        Collective::AllReduce { dtype, op } => {
            let es = dtype.size();
            let unit = unit_elems(es);
            let per = count / n / unit * unit;
            let main = per * n;
            debug_assert!(per > 0, "wanted() checks one unit per rank");
            // The tail first, by the ordinary kernel (fewer than N units: the one-shot or push).
            if main < count {
                let shift = (main * es) as u64;
                let tail_data: RankPtrs = data.iter().map(|a| a + shift).collect();
                let tail_out = (!out.is_empty()).then(|| (out.iter().map(|a| a + shift).collect(), None));
                launch_kernel(
                    team,
                    r,
                    count - main,
                    collective,
                    stream,
                    tail_data,
                    None,
                    tail_out,
                    false,
                    None,
                    Some(sig),
                    0,
                )?;
            }
            // Reduce-scatter in the SM kernel: the reduction of block q lands in rank q's out at
            // q * per elements (the all-reduce layout), between the kernel's own barriers.
            let rs = Collective::ReduceScatter { dtype, op };
            let rs_out = (!out.is_empty()).then(|| (RankPtrs::from_slice(out), None));
            launch_kernel(
                team,
                r,
                per,
                rs,
                stream,
                RankPtrs::from_slice(data),
                None,
                rs_out,
                false,
                None,
                Some(sig),
                0,
            )?;
            // Every peer has read block r of its copy when this rank's reduce-scatter kernel
            // ends (the pull's exit barrier; the push kernel reduces each part of block r only
            // after every peer's flag for it, which that peer stores after loading the part), so
            // the copies of block r into the peers need no entry barrier.
            let block = (per * es) as u64;
            let mine = out_of(r).wrapping_add(r as u64 * block);
            let copies: Vec<PeerCopy> = (0..n)
                .filter(|&p| p != r)
                .map(|p| PeerCopy { dst: out_of(p).wrapping_add(r as u64 * block), src: mine, len: per * es, to: p })
                .collect();
            fenced(team, r, stream, None, &copies, collective)
        }
        Collective::ReduceScatter { .. } => {
            Err(Error::internal(format!("{collective:?} has no copy-engine form (wanted() refuses it)")))
        }
    }
}

/// Loads every module rank `r`'s part of `collective` launches from ([`kernels::load_module`]:
/// on the simulator its simulated load, which waits like CUDA's), before its first kernel: CUDA
/// loads a module only once the device's running kernels are done (README, "One thread driving
/// several ranks"), and this call's own first kernel waits for the peers. Loaded between two of its launches, the all-reduce's barrier module waited
/// for the reduce-scatter kernel, which waited for ranks that the same thread had yet to issue:
/// on one H200 the first copy-engine all-reduce of a thread driving two ranks timed out.
fn load_modules(team: &Arc<Team>, r: usize, collective: Collective) -> Result<()> {
    let driver = team.context().driver();
    let (dev, ll) = (team.devices()[r], team.ll());
    // The barrier kernel lives in the all-gather module; the all-reduce also launches its own
    // kernel (the tail) and the reduce-scatter kernel.
    let barrier = Unit::of_collective(Collective::AllGather, ll);
    let (all_reduce, reduce_scatter) = match collective {
        Collective::AllReduce { dtype, op } => (
            Some(Unit::of_collective(collective, ll)),
            Some(Unit::of_collective(Collective::ReduceScatter { dtype, op }, ll)),
        ),
        _ => (None, None),
    };
    for unit in [Some(barrier), all_reduce, reduce_scatter].into_iter().flatten() {
        kernels::load_module(driver.as_ref(), dev, Variant::Emulated, unit)
            .map_err(|e| kernel_error_at(e, r, collective, dev))?;
    }
    Ok(())
}

/// One peer copy: `len` bytes from `src` to `dst` (addresses on this rank's device), into rank
/// `to`'s memory.
struct PeerCopy {
    dst: DevicePtr,
    src: DevicePtr,
    len: usize,
    to: usize,
}

/// Enqueues on `stream`: the entry barrier kernel (when `entry`, the call's signature it
/// compares across ranks), the copies, the exit barrier kernel. Once the entry barrier is enqueued the exit barrier is always enqueued, even after a
/// copy failed to enqueue, so no peer waits for this rank until its timeout; the first error is
/// returned.
fn fenced(
    team: &Arc<Team>,
    r: usize,
    stream: Stream,
    entry: Option<[u64; 2]>,
    copies: &[PeerCopy],
    collective: Collective,
) -> Result<()> {
    let dev = team.devices()[r];
    let driver = team.context().driver().clone();
    if let Some(sig) = entry {
        barrier(team, r, stream, collective, Some(sig))?;
    }
    let mut first = None;
    for c in copies {
        if let Err(e) = driver.memcpy_dtod_async(dev, c.dst, c.src, c.len, stream) {
            first = Some(Error::driver(
                e,
                format_args!(
                    "copying rank {r}'s {} bytes of {collective:?} into rank {}'s memory with the copy engine",
                    c.len, c.to
                ),
            ));
            break;
        }
    }
    let exit = barrier(team, r, stream, collective, None);
    match (first, exit) {
        (Some(e), _) => Err(e),
        (None, res) => res,
    }
}

/// Enqueues rank `r`'s barrier kernel on `stream` (one round of the one-stream check); with
/// `sig`, the kernel compares the call's signature across ranks.
fn barrier(team: &Arc<Team>, r: usize, stream: Stream, collective: Collective, sig: Option<[u64; 2]>) -> Result<()> {
    let sync = RankPtrs::from_slice(team.sync_bases(r));
    let timeout_ns = u64::from(team.context().config().timeout_ms) * 1_000_000;
    let launch = p2p_launch(team, r, collective, stream, sync, RankPtrs::EMPTY, 0, timeout_ns, signature_of(team, sig));
    let round = admit(team, r, stream)?;
    let driver = team.context().driver();
    let result = match driver.as_sim() {
        Some(sim) => kernels::sim::launch_barrier(sim, &launch),
        None => kernels::cuda::launch_barrier(driver.as_ref(), &launch),
    };
    result.map_err(|e| {
        team.unclaim_stream(r, round);
        kernel_error(e, &launch)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{DType, RedOp};

    #[test]
    fn message_bytes_counts_what_the_benchmark_reports() {
        assert_eq!(message_bytes(Collective::AllGather, 100, 4), Some(400));
        assert_eq!(message_bytes(Collective::Broadcast { root: 1 }, 100, 4), Some(100));
        let ar = Collective::AllReduce { dtype: DType::BF16, op: RedOp::Sum };
        assert_eq!(message_bytes(ar, 100, 4), Some(200));
        let rs = Collective::ReduceScatter { dtype: DType::F32, op: RedOp::Sum };
        assert_eq!(message_bytes(rs, 100, 4), None);
        assert_eq!(unit_elems(2), 8);
        assert_eq!(unit_elems(8), 2);
    }
}
