//! Collectives: argument checks, the launch descriptor for one rank, dispatch to the kernels
//! (NVRTC-compiled on CUDA, host execution on the simulator), and `synchronize`, which reports
//! device-side errors.

use std::sync::Arc;

use super::buffer::Buffer;
use super::ce;
use super::error::{Error, ErrorKind, Result};
use super::launch::{launch_kernel, ADMIT_REFUSED};
use super::team::{Team, Transport};
use crate::driver::{DevicePtr, Stream};
use crate::kernels::abi::signature::{signature, Offsets};
use crate::kernels::abi::{ERROR_INFO_OFFSET, ERROR_WORD_OFFSET, ERR_ABORTED, ERR_MISMATCH, ERR_NONE, ERR_TIMEOUT};
use crate::kernels::{Collective, RankPtrs};

mod staged;

use staged::run_staged;

/// Element size, offset alignment and number of per-rank blocks of the symmetric range of
/// `collective` (after checking its root).
fn geometry(team: &Team, collective: Collective) -> Result<(usize, usize, usize)> {
    let n = team.size();
    Ok(match collective {
        Collective::Broadcast { root } => {
            team.check_rank(root as i32, "root")?;
            (1, 1, 1)
        }
        Collective::AllGather => (1, 1, n),
        Collective::AllReduce { dtype, .. } => (dtype.size(), dtype.size().max(4), 1),
        Collective::ReduceScatter { dtype, .. } => (dtype.size(), dtype.size().max(4), n),
    })
}

/// Checks that `[offset, offset + blocks * count * esize)` lies in `buf`, aligned to `align`;
/// returns the extent in bytes. A team across NVLink domains checks its buffer forms with it too.
pub fn check_range(
    buf: &Buffer,
    what: &str,
    offset: usize,
    count: usize,
    esize: usize,
    blocks: usize,
    align: usize,
) -> Result<usize> {
    if !offset.is_multiple_of(align) {
        return Err(Error::invalid_argument(format!("{what}offset {offset} is not a multiple of {align} bytes")));
    }
    let extent = count.checked_mul(esize).and_then(|b| b.checked_mul(blocks));
    match extent.and_then(|e| offset.checked_add(e).map(|end| (e, end))) {
        Some((e, end)) if end <= buf.size() => Ok(e),
        _ => Err(Error::invalid_argument(format!(
            "the collective's {what}range ({blocks} block(s) of {count} x {esize} bytes from offset {offset}) is past \
             the end of the {}-byte buffer",
            buf.size()
        ))),
    }
}

/// Runs rank `rank`'s part of `collective` on `[offset, offset + extent)` of `buf`, on `stream`.
/// `count` is in elements for the reductions and in bytes for broadcast and all-gather, per rank
/// block for reduce-scatter and all-gather. Count 0 is a no-op once the rank (and root) are
/// checked. Returns once enqueued.
pub fn run(buf: &Buffer, rank: i32, offset: usize, count: usize, collective: Collective, stream: Stream) -> Result<()> {
    let team = buf.team();
    let r = team.check_own_rank(rank, "rank")?;
    refusing(team, r, || run_checked(buf, r, offset, count, collective, stream))
}

/// Runs rank `r`'s call `body` as round of the team's refusal record (`team/refusal.rs`): a
/// round refused by another rank of a one-process team is refused here before `body` runs,
/// and an argument error of `body` refuses the round on every rank.
/// The one-stream check ([`admit`](super::launch::admit)) is not such a rule: it names both ranks, and the refused
/// rank completes the round by calling again on its own stream.
fn refusing(team: &Team, r: usize, body: impl FnOnce() -> Result<()>) -> Result<()> {
    let k = team.enter_call(r)?;
    ADMIT_REFUSED.set(false);
    body().inspect_err(|e| if ADMIT_REFUSED.get() { team.give_back_call(r, k) } else { team.end_call(r, k, e) })
}

/// [`run`] once rank `r` is checked.
fn run_checked(
    buf: &Buffer,
    r: usize,
    offset: usize,
    count: usize,
    collective: Collective,
    stream: Stream,
) -> Result<()> {
    let team = buf.team();
    let rank = r as i32;
    team.check_usable(format_args!("rank {rank}'s collective"))?;
    let (esize, align, blocks) = geometry(team, collective)?;
    if count == 0 {
        return Ok(());
    }
    check_range(buf, "", offset, count, esize, blocks, align)?;
    launch(team, buf, offset, r, count, collective, stream)
}

/// The out-of-place form of [`run`]: reads `send` at `send_offset`, writes `recv` at
/// `recv_offset`, with the layouts of the `_into` functions (reduce-scatter: N blocks in, one
/// out; all-gather: one block in, N out). NCCL's in-place forms (the same buffer, the result's
/// range where [`run`] leaves it) run exactly as [`run`]; any other overlap on this rank, or
/// buffers of different teams, is `INVALID_ARGUMENT`.
#[allow(clippy::too_many_arguments)]
pub fn run_into(
    send: &Buffer,
    send_offset: usize,
    recv: &Buffer,
    recv_offset: usize,
    rank: i32,
    count: usize,
    collective: Collective,
    stream: Stream,
) -> Result<()> {
    let r = send.team().check_own_rank(rank, "rank")?;
    refusing(send.team(), r, || into(send, send_offset, recv, recv_offset, rank, count, collective, stream, false))
}

/// [`run_into`]; `element_aligned`: offsets need only be multiples of the element size (the
/// pointer form's registered route), not of 4 bytes for 16-bit types.
#[allow(clippy::too_many_arguments)]
fn into(
    send: &Buffer,
    send_offset: usize,
    recv: &Buffer,
    recv_offset: usize,
    rank: i32,
    count: usize,
    collective: Collective,
    stream: Stream,
    element_aligned: bool,
) -> Result<()> {
    let team = send.team();
    if !Arc::ptr_eq(team, recv.team()) {
        return Err(Error::invalid_argument(
            "send and recv are buffers of different teams: both must belong to the team running the collective",
        ));
    }
    let r = team.check_own_rank(rank, "rank")?;
    team.check_usable(format_args!("rank {rank}'s collective"))?;
    let n = team.size();
    let (esize, align, blocks) = geometry(team, collective)?;
    let align = if element_aligned { esize } else { align };
    if count == 0 {
        return Ok(());
    }
    let (send_blocks, recv_blocks) = match collective {
        Collective::AllGather => (1, n),
        Collective::ReduceScatter { .. } => (n, 1),
        _ => (1, 1),
    };
    debug_assert_eq!(blocks, send_blocks.max(recv_blocks));
    let send_len = check_range(send, "send ", send_offset, count, esize, send_blocks, align)?;
    let block = count * esize;
    if std::ptr::eq(send, recv) {
        // NCCL's in-place conventions: the result lands where the in-place function leaves it.
        let in_place = match collective {
            Collective::AllGather => r.checked_mul(block).and_then(|b| recv_offset.checked_add(b)) == Some(send_offset),
            // `r * block` fits: the N blocks of send were checked within the buffer.
            Collective::ReduceScatter { .. } => send_offset.checked_add(r * block) == Some(recv_offset),
            _ => send_offset == recv_offset,
        };
        if in_place {
            check_range(recv, "recv ", recv_offset, count, esize, recv_blocks, 1)?;
            let offset = send_offset.min(recv_offset);
            return launch(team, send, offset, r, count, collective, stream);
        }
    }
    let recv_len = check_range(recv, "recv ", recv_offset, count, esize, recv_blocks, align)?;
    // Any other overlap of the two ranges in this rank's memory.
    let (s0, r0) = (send.local_ptr(rank)? + send_offset as u64, recv.local_ptr(rank)? + recv_offset as u64);
    if s0 < r0 + recv_len as u64 && r0 < s0 + send_len as u64 {
        return Err(Error::invalid_argument(format!(
            "send [{send_offset}, +{send_len}) and recv [{recv_offset}, +{recv_len}) overlap on rank {rank} and are not \
             NCCL's in-place form of {collective:?}: use disjoint ranges or the in-place layout"
        )));
    }
    // The kernels add the block offset of the rank they read (all-gather) or write
    // (reduce-scatter) to the bases: shift the bases back by it.
    let shift_in = |p: usize| match collective {
        Collective::AllGather => (p * block) as u64,
        _ => 0,
    };
    let shift_out = match collective {
        Collective::ReduceScatter { .. } => (r * block) as u64,
        _ => 0,
    };
    let out = RankPtrs::try_from_fn(n, |p| {
        recv.peer_ptr(rank, p as i32).map(|a| (a + recv_offset as u64).wrapping_sub(shift_out))
    })?;
    let out_mc = match team.transport() {
        Transport::Multicast => Some((recv.multicast_ptr(rank)? + recv_offset as u64).wrapping_sub(shift_out)),
        Transport::P2P => None,
    };
    let send_base = send_offset as u64;
    let data =
        RankPtrs::try_from_fn(n, |p| send.peer_ptr(rank, p as i32).map(|a| (a + send_base).wrapping_sub(shift_in(p))))?;
    let data_mc = match team.transport() {
        Transport::Multicast => Some((send.multicast_ptr(rank)? + send_base).wrapping_sub(shift_in(r))),
        Transport::P2P => None,
    };
    let offsets = Offsets::Into { send: send_offset as u64, recv: recv_offset as u64 };
    let sig = signature(collective, count as u64, offsets);
    launch_with(team, r, count, collective, stream, data, data_mc, Some((out, out_mc)), false, None, sig)
}

/// The pointer form (`mcast_team_*`): rank `rank`'s part of `collective` from the device
/// pointer `send` to `recv` (the layouts of [`run_into`]; `send == recv` and NCCL's other
/// in-place forms work in place). Where both ranges lie in registered buffers of the team it
/// runs zero-copy as [`run_into`]. Otherwise a small message of a team with the LL kernels
/// ([`ll_serves`](crate::kernels::abi::ll_serves)) runs them in one launch, any collective (each
/// rank stores what its peers need from `send` into their landing areas and combines what they
/// stored into `recv`); an all-reduce, or a reduce-scatter of whole 16-byte blocks, of a team of
/// at most [`PUSH_MAX_RANKS`](crate::kernels::abi::PUSH_MAX_RANKS) ranks runs its push kernel in one
/// launch (it copies this rank's `send`, or each peer's block of it, step by step into its
/// peers' scratch and reduces what they pushed into `recv`: the copy-in is fused into the
/// kernel); every other case goes
/// through the team's staging area (`run_staged`). Every rank must take the same route (all
/// registered or none).
#[allow(clippy::too_many_arguments)]
pub fn run_ptr(
    team: &Arc<Team>,
    rank: i32,
    send: DevicePtr,
    recv: DevicePtr,
    count: usize,
    collective: Collective,
    stream: Stream,
) -> Result<()> {
    let r = team.check_own_rank(rank, "rank")?;
    refusing(team, r, || ptr_checked(team, r, send, recv, count, collective, stream))
}

/// [`run_ptr`] once rank `r` is checked.
fn ptr_checked(
    team: &Arc<Team>,
    r: usize,
    send: DevicePtr,
    recv: DevicePtr,
    count: usize,
    collective: Collective,
    stream: Stream,
) -> Result<()> {
    let rank = r as i32;
    team.check_usable(format_args!("rank {rank}'s collective"))?;
    let n = team.size();
    // Element-aligned pointers for every dtype, as NCCL takes them (an in-place reduce-scatter
    // or all-gather of a 16-bit type with an odd count puts some ranks' blocks at 2 bytes mod
    // 4): every route handles them (the kernels' scalar heads and tails, the staging copies).
    let (esize, _, _) = geometry(team, collective)?;
    let align = esize;
    if count == 0 {
        return Ok(());
    }
    let block = count
        .checked_mul(esize)
        .filter(|b| b.checked_mul(n).is_some())
        .ok_or_else(|| Error::invalid_argument(format!("count {count} is too large")))?;
    let (send_len, recv_len) = match collective {
        Collective::AllGather => (block, n * block),
        Collective::ReduceScatter { .. } => (n * block, block),
        _ => (block, block),
    };
    let dev = team.devices()[r];
    let driver = team.context().driver();
    for (what, p, len) in [("send", send, send_len), ("recv", recv, recv_len)] {
        if p == 0 {
            return Err(Error::invalid_argument(format!("{what} is NULL")));
        }
        if p % align as u64 != 0 {
            return Err(Error::invalid_argument(format!("{what} = {p:#x} is not a multiple of {align} bytes")));
        }
        if p.checked_add(len as u64).is_none() {
            return Err(Error::invalid_argument(format!("{what} + {len} bytes overflows")));
        }
        // In place (`recv == send`, the same length): send's answers hold for recv, so the
        // driver is asked once, not twice.
        if what == "recv" && p == send && len == send_len {
            continue;
        }
        let asking = || format!("asking which device {what} belongs to");
        team.context().check_pointer_device(p, rank as usize, dev, format_args!("{what} = {p:#x}"), "pass", &asking)?;
        // The whole range in one allocation: checked on the simulator, where a copy or kernel
        // past the end would otherwise fail in the driver (on CUDA it costs one more driver
        // call per pointer and call, left to the caller as NCCL does).
        if driver.as_sim().is_some() {
            match driver.mem_address_range(p) {
                Ok((base, size)) if p + len as u64 <= base + size as u64 => {}
                Ok((base, size)) => {
                    return Err(Error::invalid_argument(format!(
                        "{what} = {p:#x} + {len} bytes is not device memory: it runs past the end of its allocation \
                         [{base:#x}, +{size})"
                    )))
                }
                Err(e) => return Err(Error::driver(e, format_args!("asking where {what}'s allocation ends"))),
            }
        }
    }
    let in_place = match collective {
        Collective::AllGather => recv.checked_add((r * block) as u64) == Some(send),
        Collective::ReduceScatter { .. } => send.checked_add((r * block) as u64) == Some(recv),
        _ => send == recv,
    };
    if !in_place && send < recv + recv_len as u64 && recv < send + send_len as u64 {
        return Err(Error::invalid_argument(format!(
            "send {send:#x} + {send_len} and recv {recv:#x} + {recv_len} overlap and are not NCCL's in-place form of \
             {collective:?}"
        )));
    }
    // Zero-copy: both ranges in registered buffers of the team.
    if let (Some((sa, so)), Some((ra, ro))) =
        (team.find_registered(r, send, send_len), team.find_registered(r, recv, recv_len))
    {
        let same = Arc::ptr_eq(&sa.seg, &ra.seg);
        let sv = Buffer::view(team, sa);
        if same {
            return into(&sv, so, &sv, ro, rank, count, collective, stream, true);
        }
        let rv = Buffer::view(team, ra);
        return into(&sv, so, &rv, ro, rank, count, collective, stream, true);
    }
    // The LL kernels (small messages, any collective) and the push all-reduce and reduce-scatter
    // (any size, teams of up to PUSH_MAX_RANKS; the reduce-scatter's blocks whole 16-byte
    // vectors) read nothing but this rank's own memory (peers see only their landing rows or
    // scratch): they run in one launch at any alignment, the copy-in fused into the kernel. The
    // route depends only on values equal on every rank (collective, count, team).
    let ll = team.ll() && crate::kernels::abi::ll_serves(collective, n as u32, count as u64, team.max_blocks());
    let push = crate::kernels::abi::push_serves_local(collective, n as u32, count as u64);
    if !ll && !push {
        return run_staged(team, r, send, recv, collective, stream, block, in_place);
    }
    // This rank's addresses in the kernels' layout: all-gather's data and reduce-scatter's out
    // are bases the kernel adds this rank's block offset to.
    let shift = (r * block) as u64;
    let (me_data, me_out) = match collective {
        Collective::AllGather => (send.wrapping_sub(shift), recv),
        Collective::ReduceScatter { .. } => (send, recv.wrapping_sub(shift)),
        _ => (send, recv),
    };
    let mut data = RankPtrs::zeroed(n);
    let mut out = RankPtrs::zeroed(n);
    data[r] = me_data;
    out[r] = me_out;
    // Each rank's own memory: only the collective and count must agree.
    let sig = signature(collective, count as u64, Offsets::Free);
    launch_with(team, r, count, collective, stream, data, None, Some((out, None)), true, None, sig)
}

/// Launches in place on `buf` at `offset`.
fn launch(
    team: &Arc<Team>,
    buf: &Buffer,
    offset: usize,
    r: usize,
    count: usize,
    collective: Collective,
    stream: Stream,
) -> Result<()> {
    let n = team.size();
    let rank = r as i32;
    let data = RankPtrs::try_from_fn(n, |p| buf.peer_ptr(rank, p as i32).map(|a| a + offset as u64))?;
    let data_mc = match team.transport() {
        Transport::Multicast => Some(buf.multicast_ptr(rank)? + offset as u64),
        Transport::P2P => None,
    };
    let sig = signature(collective, count as u64, Offsets::InPlace(offset as u64));
    launch_with(team, r, count, collective, stream, data, data_mc, None, false, None, sig)
}

/// Launches rank `r`'s part: with the copy engines ([`ce`]) when the team, the collective and
/// its size ask for them and every rank's memory is addressable (not the pointer form's push
/// all-reduce or staging area), else the kernel ([`launch_kernel`]). `sig` is the call's
/// signature, compared across ranks at the kernels' entry.
#[allow(clippy::too_many_arguments)]
fn launch_with(
    team: &Arc<Team>,
    r: usize,
    count: usize,
    collective: Collective,
    stream: Stream,
    data: RankPtrs,
    data_mc: Option<DevicePtr>,
    out: Option<(RankPtrs, Option<DevicePtr>)>,
    local_only: bool,
    before: Option<&dyn Fn() -> Result<()>>,
    sig: [u64; 2],
) -> Result<()> {
    if !local_only && before.is_none() && ce::wanted(team, collective, count) {
        let out = out.map(|(o, _)| o).unwrap_or_default();
        return ce::run(team, r, count, collective, stream, &data, &out, sig);
    }
    launch_kernel(team, r, count, collective, stream, data, data_mc, out, local_only, before, Some(sig), 0)
}

/// Waits for rank `rank`'s work on `stream`, then reports the first device-side error of the
/// team (a wait that timed out, here or in another rank), which stays reported until the team
/// is destroyed.
pub fn synchronize(team: &Team, rank: i32, stream: Stream) -> Result<()> {
    let r = team.check_own_rank(rank, "rank")?;
    let dev = team.devices()[r];
    let driver = team.context().driver();
    // An abort ends the kernels on the stream within microseconds (they read the team's state
    // word), so this wait ends too.
    driver
        .stream_synchronize(dev, stream)
        .map_err(|e| Error::driver(e, format_args!("waiting for rank {rank}'s stream")))?;
    if team.is_aborted() {
        return Err(team.error().expect("an aborted team has its error"));
    }
    // A refused call ended the waits of the ranks issued before it (team/refusal.rs): their
    // device words say aborted, the team's error says why.
    if let Some(e) = team.error().filter(|e| e.kind == ErrorKind::InvalidArgument) {
        return Err(e);
    }
    let mut words = [0u8; 8];
    driver
        .memcpy_dtoh(dev, &mut words, team.sync_base(r, r) + ERROR_WORD_OFFSET as u64)
        .map_err(|e| Error::driver(e, format_args!("reading rank {rank}'s device error word")))?;
    const _: () = assert!(ERROR_INFO_OFFSET == ERROR_WORD_OFFSET + 4);
    let code = u32::from_ne_bytes(words[..4].try_into().expect("4 bytes"));
    let info = u32::from_ne_bytes(words[4..].try_into().expect("4 bytes"));
    if code != ERR_NONE {
        let timeout_ms = team.context().config().timeout_ms;
        if code == ERR_MISMATCH {
            // A peer's call differed from this rank's (kernels/sync.cuh): every rank finds it.
            return Err(team.mismatched(r));
        }
        if code == ERR_ABORTED {
            team.set_error(Error::aborted(format!(
                "rank {rank}: a collective ended in barrier {} because the team was aborted (by mcast_team_abort here \
                 or in a peer process)",
                info >> 8
            )));
            return Err(team.error().expect("an aborted team has its error"));
        }
        if let Some(e) = super::device_api::device_error(rank, code, info, timeout_ms) {
            // A device-API call's failure (an application kernel), with its detail.
            team.set_error(e);
            return Err(team.error().expect("just set"));
        }
        if code == ERR_TIMEOUT {
            // This rank's wait timed out, or it ended because another rank's did (the state
            // word): the error names the rank that timed out first and whom it waited for, and
            // the peer processes are told.
            return Err(team.timed_out(r));
        }
        team.set_error(Error::new(
            ErrorKind::Timeout,
            format!(
                "rank {rank}: device error code {code} (info {info:#x}) after waiting up to timeout_ms = {timeout_ms} \
                 ms; the team is unusable"
            ),
        ));
    }
    match team.error() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
