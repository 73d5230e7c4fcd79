//! Collectives: argument checks, the launch descriptor for one rank, dispatch to the kernels
//! (NVRTC-compiled on CUDA, host execution on the simulator), and `synchronize`, which reports
//! device-side errors.

use super::buffer::Buffer;
use super::error::{Error, ErrorKind, Result};
use super::team::{Team, Transport};
use crate::driver::Stream;
use crate::kernels::abi::{ERROR_INFO_OFFSET, ERROR_WORD_OFFSET, ERR_ABORTED, ERR_NONE, ERR_TIMEOUT};
use crate::kernels::{self, Collective, KernelError, Launch, Path};

/// Runs rank `rank`'s part of `collective` on `[offset, offset + extent)` of `buf`, on `stream`.
/// `count` is in elements for the reductions and in bytes for broadcast and all-gather, per rank
/// block for reduce-scatter and all-gather. Returns once enqueued.
pub fn run(buf: &Buffer, rank: i32, offset: usize, count: usize, collective: Collective, stream: Stream) -> Result<()> {
    let team = buf.team();
    let r = team.check_own_rank(rank, "rank")?;
    team.check_usable(&format!("rank {rank}'s collective"))?;
    let n = team.size();
    let (esize, align, blocks) = match collective {
        Collective::Broadcast { root } => {
            team.check_rank(root as i32, "root")?;
            (1, 1, 1)
        }
        Collective::AllGather => (1, 1, n),
        Collective::AllReduce { dtype, .. } => (dtype.size(), dtype.size().max(4), 1),
        Collective::ReduceScatter { dtype, .. } => (dtype.size(), dtype.size().max(4), n),
    };
    if count == 0 {
        return Err(Error::invalid_argument("count is 0: a collective needs at least one element or byte"));
    }
    if offset % align != 0 {
        return Err(Error::invalid_argument(format!("offset {offset} is not a multiple of {align} bytes")));
    }
    let extent = count.checked_mul(esize).and_then(|b| b.checked_mul(blocks));
    match extent.and_then(|e| offset.checked_add(e)) {
        Some(end) if end <= buf.size() => {}
        _ => {
            return Err(Error::invalid_argument(format!(
            "the collective's range ({blocks} block(s) of {count} x {esize} bytes from offset {offset}) is past the \
                 end of the {}-byte buffer",
            buf.size()
        )))
        }
    }
    // MCAST_EMULATE_MULTIMEM=1 runs the multicast kernels on a P2P team with their multimem
    // instructions emulated over peer pointers: no multicast object is involved, so the
    // kernels' slicing, vectors, barriers and tails can be verified on any GPU.
    let path = match team.transport() {
        Transport::Multicast => Path::Multicast,
        Transport::P2P if kernels::cuda::emulate_forced() => Path::Multicast,
        Transport::P2P => Path::P2P,
    };
    let data = (0..n as i32).map(|p| buf.peer_ptr(rank, p).map(|a| a + offset as u64)).collect::<Result<Vec<_>>>()?;
    let data_mc = match team.transport() {
        Transport::Multicast => Some(buf.multicast_ptr(rank)? + offset as u64),
        Transport::P2P => None,
    };
    let launch = Launch {
        collective,
        path,
        rank: r as u32,
        nranks: n as u32,
        dev: team.devices()[r],
        stream,
        data,
        data_mc,
        sync: team.sync_bases(r).to_vec(),
        sync_mc: team.sync_multicast(r),
        count: count as u64,
        timeout_ns: u64::from(team.context().config().timeout_ms) * 1_000_000,
        max_blocks: team.max_blocks(),
    };
    let round = admit(team, r, stream)?;
    let driver = team.context().driver();
    let result = match driver.as_sim() {
        Some(sim) => kernels::sim::launch(sim, &launch),
        None => kernels::launch(driver.as_ref(), &launch),
    };
    result.map_err(|e| {
        team.unclaim_stream(r, round);
        kernel_error(e, &launch)
    })
}

/// The last check before any collective form enqueues rank `r`'s part on `stream`: the team
/// must not have failed (aborted, timed out), and no other rank of the team on the same device
/// may have been given `stream` for the same collective (the one-stream deadlock, caught on the
/// host: see [`Team::claim_stream`]). Returns the round claimed; a launch that then fails gives
/// it back with [`Team::unclaim_stream`].
pub fn admit(team: &Team, r: usize, stream: Stream) -> Result<u64> {
    team.check_usable(&format!("rank {r}'s collective"))?;
    team.claim_stream(r, stream)
}

fn kernel_error(e: KernelError, l: &Launch) -> Error {
    let what = format!("launching rank {}'s part of {:?} on device {}", l.rank, l.collective, l.dev);
    match e {
        KernelError::NvrtcUnavailable(_) => Error::new(ErrorKind::DriverUnavailable, format!("{what}: {e}")),
        KernelError::Driver(d) => Error::driver(d, what),
        KernelError::Compile { .. } => Error::internal(format!("{what}: {e}")),
        KernelError::Unsupported(_) => Error::not_supported(format!("{what}: {e}")),
    }
}

/// Waits for rank `rank`'s work on `stream`, then reports the first device-side error of the
/// team (a barrier timeout), which stays reported until the team is destroyed.
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
    let mut words = [0u8; 8];
    driver
        .memcpy_dtoh(dev, &mut words, team.sync_base(r, r) + ERROR_WORD_OFFSET as u64)
        .map_err(|e| Error::driver(e, format_args!("reading rank {rank}'s device error word")))?;
    const _: () = assert!(ERROR_INFO_OFFSET == ERROR_WORD_OFFSET + 4);
    let code = u32::from_ne_bytes(words[..4].try_into().expect("4 bytes"));
    let info = u32::from_ne_bytes(words[4..].try_into().expect("4 bytes"));
    if code != ERR_NONE {
        let timeout_ms = team.context().config().timeout_ms;
        if code == ERR_ABORTED {
            team.set_error(Error::aborted(format!(
                "rank {rank}: a collective ended in barrier {} because the team was aborted (by mcast_team_abort here \
                 or in a peer process)",
                info >> 8
            )));
            return Err(team.error().expect("an aborted team has its error"));
        }
        let detail = if code == ERR_TIMEOUT {
            format!(
                "rank {rank}: a peer rank did not arrive within timeout_ms = {timeout_ms} ms (barrier {} of the \
                 collective, block {}); every rank must call each collective; the team reports this error until it \
                 is destroyed",
                info >> 8,
                (info & 0xff).saturating_sub(1)
            )
        } else {
            format!("rank {rank}: device error code {code} (info {info:#x}); the team is unusable")
        };
        team.set_error(Error::new(ErrorKind::Timeout, detail));
    }
    match team.error() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
