//! One kernel launch of a rank's part of a collective: the [`Launch`] descriptor from the team,
//! the admission check before anything is enqueued ([`admit`]: the team usable, the one-stream
//! rule), and the error a failed launch reports. Used by `collective.rs` and by the copy-engine
//! forms in `ce.rs` (their barrier kernels); it imports neither.

use std::cell::Cell;
use std::sync::Arc;

use super::error::{Error, ErrorKind, Result};
use super::team::{Team, Transport};
use crate::driver::{Device, DevicePtr, Stream};
use crate::kernels::{self, Collective, KernelError, Launch, Path, RankPtrs};

/// Launches rank `r`'s part of `collective` as one kernel (the [`Launch`] descriptor; `out`
/// `None` in place), after the work `before` enqueues; `sig` the call's signature, compared
/// across ranks at the kernel's entry (`None`: not); `out_stride` as [`Launch::out_stride`].
#[allow(clippy::too_many_arguments)]
pub(super) fn launch_kernel(
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
    sig: Option<[u64; 2]>,
    out_stride: u64,
) -> Result<()> {
    let n = team.size();
    // MCAST_EMULATE_MULTIMEM=1 runs the multicast kernels on a P2P team with their multimem
    // instructions emulated over peer pointers: no multicast object is involved, so the
    // kernels' slicing, vectors, barriers and tails can be verified on any GPU.
    let path = match team.transport() {
        Transport::Multicast => Path::Multicast,
        Transport::P2P if kernels::cuda::emulate_forced() => Path::Multicast,
        Transport::P2P => Path::P2P,
    };
    // The pointer form runs the push all-reduce, a P2P kernel, on any team.
    let path = if local_only { Path::P2P } else { path };
    let (out, out_mc) = out.unwrap_or_default();
    let launch = Launch {
        collective,
        path,
        rank: r as u32,
        nranks: n as u32,
        dev: team.devices()[r],
        stream,
        data,
        data_mc,
        out,
        out_mc,
        sync: RankPtrs::from_slice(team.sync_bases(r)),
        sync_mc: team.sync_multicast(r),
        count: count as u64,
        timeout_ns: u64::from(team.context().config().timeout_ms) * 1_000_000,
        max_blocks: team.max_blocks(),
        local_only,
        ll: team.ll(),
        signature: signature_of(team, sig),
        out_stride,
    };
    let round = admit(team, r, stream)?;
    // Work that must precede the kernel on the stream (the pointer form's copy-in), enqueued
    // only once the launch is admitted.
    if let Some(before) = before {
        if let Err(e) = before() {
            team.unclaim_stream(r, round);
            return Err(e);
        }
    }
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

/// Enqueues rank `r`'s copy-out kernel on `stream` (the pointer form's staged route): `len`
/// bytes from `src[k]` to `dst[k]` for every row k (addresses on this rank's device, at most one
/// row per rank of the team), skipped by the kernel when this rank's error word is set, so that a
/// collective that failed on the device (a mismatch, a timeout, an abort) leaves the caller's
/// memory as it was. Its module is the all-gather one, loaded by the caller before the call's
/// first kernel (README, "One thread driving several ranks").
pub(super) fn launch_copy_out(
    team: &Arc<Team>,
    r: usize,
    collective: Collective,
    stream: Stream,
    dst: &RankPtrs,
    src: &RankPtrs,
    len: usize,
) -> Result<()> {
    let n = team.size();
    debug_assert!(dst.len() == src.len() && src.len() <= n && src.iter().all(|&s| s != 0));
    // The kernel takes one slot per rank of the team; the empty ones (source 0) are no rows.
    let pad = |rows: &RankPtrs| {
        let mut a = RankPtrs::zeroed(n);
        a[..rows.len()].copy_from_slice(rows);
        a
    };
    let launch = p2p_launch(team, r, collective, stream, pad(src), pad(dst), len as u64, 0, None);
    let driver = team.context().driver();
    let result = match driver.as_sim() {
        Some(sim) => kernels::sim::launch_copy_out(sim, &launch),
        None => kernels::cuda::launch_copy_out(driver.as_ref(), &launch),
    };
    result.map_err(|e| kernel_error(e, &launch))
}

/// The descriptor of one of rank `r`'s own kernels beside the collectives' (the copy-engine
/// forms' barrier, the staged route's copy-out): the P2P path, no multicast address, the team's
/// sync regions and grid cap, `data`, `out`, `count`, `timeout_ns` and `signature` as given.
#[allow(clippy::too_many_arguments)]
pub(super) fn p2p_launch(
    team: &Team,
    r: usize,
    collective: Collective,
    stream: Stream,
    data: RankPtrs,
    out: RankPtrs,
    count: u64,
    timeout_ns: u64,
    signature: Option<[u64; 2]>,
) -> Launch {
    Launch {
        collective,
        path: Path::P2P,
        rank: r as u32,
        nranks: team.size() as u32,
        dev: team.devices()[r],
        stream,
        data,
        data_mc: None,
        out,
        out_mc: None,
        sync: RankPtrs::from_slice(team.sync_bases(r)),
        sync_mc: None,
        count,
        timeout_ns,
        max_blocks: team.max_blocks(),
        local_only: false,
        ll: team.ll(),
        signature,
        out_stride: 0,
    }
}

thread_local! {
    /// The user call's signature while a team across NVLink domains issues its domain stages
    /// (see [`signed_as`]).
    static CALL_SIGNATURE: Cell<Option<[u64; 2]>> = const { Cell::new(None) };
}

/// Runs `f` with `sig` as the signature of every collective it issues on this thread: the domain
/// stages of a team across NVLink domains, whose ranks legitimately pass different counts,
/// forms and offsets (each its own shard) to each stage, but issue the same stages for the same
/// user call. Each stage's kernels then compare the user call's signature (its collective,
/// count, dtype, op, root and offsets), so ranks of one domain that disagree are caught at their
/// first stage, named by their fields and values as the user passed them.
pub fn signed_as<T>(sig: [u64; 2], f: impl FnOnce() -> T) -> T {
    /// Puts the previous signature back however `f` ends (a panic caught at the C boundary
    /// included), so no later call of this thread carries this one.
    struct Restore(Option<[u64; 2]>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CALL_SIGNATURE.set(self.0);
        }
    }
    let _restore = Restore(CALL_SIGNATURE.replace(Some(sig)));
    f()
}

/// The signature a collective of `team` issued now carries: none with the check off
/// (`MCAST_CHECK_CALLS=off`) or where the launch compares none (`sig` `None`), else the user
/// call's inside [`signed_as`], else `sig`.
pub fn signature_of(team: &Team, sig: Option<[u64; 2]>) -> Option<[u64; 2]> {
    sig.filter(|_| team.check_calls()).map(|s| CALL_SIGNATURE.get().unwrap_or(s))
}

/// The last check before any collective form enqueues rank `r`'s part on `stream`: the team
/// must not have failed (aborted, timed out), and no other rank of the team on the same device
/// may have been given `stream` for the same collective (the one-stream deadlock, caught on the
/// host: see [`Team::claim_stream`]). Returns the round claimed; a launch that then fails gives
/// it back with [`Team::unclaim_stream`].
pub fn admit(team: &Team, r: usize, stream: Stream) -> Result<u64> {
    team.check_usable(format_args!("rank {r}'s collective"))?;
    team.claim_stream(r, stream).inspect_err(|_| ADMIT_REFUSED.set(true))
}

pub(super) fn kernel_error(e: KernelError, l: &Launch) -> Error {
    kernel_error_at(e, l.rank as usize, l.collective, l.dev)
}

/// [`kernel_error`] for rank `rank`'s part of `collective` on `dev`.
pub(super) fn kernel_error_at(e: KernelError, rank: usize, collective: Collective, dev: Device) -> Error {
    let what = format!("launching rank {rank}'s part of {collective:?} on device {dev}");
    match e {
        KernelError::NvrtcUnavailable(_) => Error::new(ErrorKind::DriverUnavailable, format!("{what}: {e}")),
        KernelError::Driver(d) => Error::driver(d, what),
        KernelError::Compile { .. } => Error::internal(format!("{what}: {e}")),
        KernelError::Unsupported(_) => Error::not_supported(format!("{what}: {e}")),
    }
}

thread_local! {
    /// Set when this thread's last [`admit`] failed (see `collective.rs`'s `refusing`).
    pub(super) static ADMIT_REFUSED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The user call's signature holds inside `signed_as` only, nested or not, and a panic
    /// inside it (caught at the C boundary) does not leave it on the thread.
    #[test]
    fn the_call_signature_holds_inside_signed_as_only() {
        assert_eq!(CALL_SIGNATURE.get(), None);
        signed_as([1, 2], || {
            assert_eq!(CALL_SIGNATURE.get(), Some([1, 2]));
            signed_as([3, 4], || assert_eq!(CALL_SIGNATURE.get(), Some([3, 4])));
            assert_eq!(CALL_SIGNATURE.get(), Some([1, 2]));
        });
        assert_eq!(CALL_SIGNATURE.get(), None);
        let caught = std::panic::catch_unwind(|| signed_as([5, 6], || panic!("a stage panicked")));
        assert!(caught.is_err());
        assert_eq!(CALL_SIGNATURE.get(), None);
    }
}
