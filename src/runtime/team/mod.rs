//! Teams: an ordered list of ranks, rank `i` on `devices[i]`, with a transport chosen once,
//! within one NVLink domain (a *flat* team; a team across domains, `runtime::hier`, is made of
//! one and this module knows nothing of it).
//! This file holds what a team is and its accessors; `create.rs` makes one (`split.rs` splits
//! one), `transport.rs` chooses how its ranks talk, `buffers.rs` and `pool.rs` carve its
//! buffers from segments, `abort.rs` keeps its failures, `streams.rs` the one-stream check,
//! `device_view.rs` what the device API's kernels see of it.
//! The team's barrier signal words live in the first [`SYNC_BYTES`](crate::kernels::SYNC_BYTES)
//! of its first segment.

mod abort;
mod buffers;
mod create;
mod device_view;
mod domains;
mod pool;
mod refusal;
mod split;
mod streams;
#[cfg(test)]
mod tests;
mod transport;

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLock};

pub use create::Joined;
pub use domains::{spanning, spans_domains, Domains};
pub use pool::Allocation;
pub use split::{check_colors, split_over};
pub use transport::Transport;

use super::comm::Comm;
use super::doorbell::Doorbell;
use super::env::Env;
use super::error::{Error, Result};
use super::segment::Shape;
use crate::driver::{Device, DevicePtr, HandleTypes, Stream};
use pool::Pool;
use streams::Claims;

/// The color of a rank that joins no team in [`Team::split`] (`MCAST_SPLIT_NOCOLOR`).
pub const SPLIT_NOCOLOR: i32 = -1;

/// Alignment of every buffer inside its segment.
pub const BUFFER_ALIGN: usize = 256;

/// A team.
pub struct Team {
    env: Arc<Env>,
    devices: Vec<Device>,
    transport: Transport,
    reason: String,
    granularity: usize,
    /// `sync[viewer][rank]`: rank's sync region as mapped on viewer's device.
    sync: Vec<Vec<DevicePtr>>,
    /// Per viewer: the multicast address of the sync regions (multicast transport).
    sync_mc: Vec<Option<DevicePtr>>,
    shape: Shape,
    /// Most blocks per collective kernel (see [`Team::max_blocks`]).
    max_blocks: u32,
    /// The team runs the LL kernels for small messages (see [`Team::ll`]).
    ll: bool,
    /// The copy-engine threshold the ranks agreed on (see [`Team::ce_min_bytes`]).
    ce_min_bytes: u64,
    /// Device-API slots reserved per rank (see [`Team::device_slots`]).
    device_slots: u32,
    /// The ranks compare their calls' signatures (see [`Team::check_calls`]).
    check_calls: bool,
    /// Offset of the device-API slots from each rank's sync region.
    device_offset: usize,
    /// The first device-side error (a barrier timeout); sticky until the team is destroyed.
    /// Read only once `failed` is set, so a healthy team's collectives never take this lock.
    error: Mutex<Option<Error>>,
    /// Set once `error` holds an error (never cleared).
    failed: AtomicBool,
    /// Multi-process team: its connections (this process owns rank `comm.rank()` only).
    comm: Option<Arc<Comm>>,
    /// Its segments and buffers. Read-locked by the pointer-form collectives (looking for
    /// registered memory), so the ranks' calls never wait for each other; written by alloc,
    /// register, free and destroy.
    state: RwLock<Pool>,
    /// Set by [`Team::abort`] (or when a peer's abort is noticed); never cleared.
    aborted: AtomicBool,
    /// Held (shared) while an abort writes the device state words, and exclusively while
    /// destroy releases the memory that holds them; `false` once released.
    sync_live: RwLock<bool>,
    /// Serialises destroys.
    destroying: Mutex<()>,
    /// The streams of the collectives each rank issued last (see [`Team::claim_stream`]).
    claims: Claims,
    /// The NVLink domains its ranks are in.
    domains: Domains,
    /// One-process teams of several ranks: the refused rounds (see `refusal.rs`).
    refusals: Option<refusal::Refusals>,
    /// What the first timeout this process found says (see [`Team::timeout_cause`]).
    timeout_cause: OnceLock<String>,
    /// Rung by this process's ranks' kernels once they record an error (see
    /// `runtime::doorbell`): what `mcast_team_get_error` polls, with no driver call.
    doorbell: Arc<Doorbell>,
    /// When (`clock_ms`) `mcast_team_get_error` last read the device words unrung.
    words_read_at: AtomicU64,
}

/// Milliseconds since the first call in this process: a clock for rate limits.
pub(crate) fn clock_ms() -> u64 {
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64
}

/// What `mcast_team_get_info` reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TeamInfo {
    /// Ranks.
    pub size: usize,
    /// Transport.
    pub transport: Transport,
    /// Why P2P was chosen, or empty.
    pub transport_reason: String,
    /// Allocation granularity.
    pub granularity: u64,
    /// Live multicast objects held.
    pub multicast_objects: u64,
    /// Device bytes held per rank.
    pub bytes_reserved: u64,
    /// NVLink domains the team spans.
    pub domains: usize,
    /// Ranks per domain; 0 when the domains differ in size.
    pub domain_size: usize,
    /// The engine between domains, or empty.
    pub net_engine: String,
}

impl Team {
    /// Most blocks a collective kernel of this team may launch: every block of every rank on
    /// one device must be resident at once, so the SMs are shared out among the ranks the
    /// busiest device hosts.
    pub fn max_blocks(&self) -> u32 {
        self.max_blocks
    }

    /// True when the team runs the LL kernels for small messages on the P2P path: every rank
    /// wanted them at creation (`MCAST_LL`) and the team keeps their landing area (2..=8 ranks).
    pub fn ll(&self) -> bool {
        self.ll
    }

    /// The smallest message the team moves with the copy engines (`MCAST_CE_MIN_BYTES`, see
    /// `runtime::ce`), 0 = never: agreed at creation (off if any rank has it off, else the
    /// largest of the ranks' thresholds), so every rank takes the same route.
    pub fn ce_min_bytes(&self) -> u64 {
        self.ce_min_bytes
    }

    /// True when the collectives' kernels compare the ranks' call signatures and refuse a
    /// disagreement (`MCAST_CHECK_CALLS`): agreed at creation, on where any rank has it on.
    pub fn check_calls(&self) -> bool {
        self.check_calls
    }

    /// Barrier and signal slots the team reserved for the device API (`mcast/device.h`): the
    /// same on every rank.
    pub fn device_slots(&self) -> u32 {
        self.device_slots
    }

    /// Offset of the device-API slots from each rank's sync region (after everything the
    /// library's own kernels use).
    pub fn device_offset(&self) -> usize {
        self.device_offset
    }

    /// How multi-process ranks share memory: [`HandleTypes::FABRIC`] or
    /// [`HandleTypes::POSIX_FD`]; `NONE` for a single-process team.
    pub fn handle_type(&self) -> HandleTypes {
        self.shape.handle_type
    }

    /// The granularity of the team's segments (allocation and, on the multicast transport,
    /// multicast).
    pub fn alloc_granularity(&self) -> usize {
        self.granularity
    }

    /// What the team uses of its context (the driver, the configuration, the ledger).
    pub fn context(&self) -> &Arc<Env> {
        &self.env
    }

    /// Ranks.
    pub fn size(&self) -> usize {
        self.devices.len()
    }

    /// Device of each rank.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// The transport.
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// Checks `rank` is a rank of this team.
    pub fn check_rank(&self, rank: i32, what: &str) -> Result<usize> {
        if rank < 0 || rank as usize >= self.devices.len() {
            return Err(Error::invalid_argument(format!(
                "{what} {rank} is out of range: the team has {} rank(s)",
                self.devices.len()
            )));
        }
        Ok(rank as usize)
    }

    /// What the first timeout this process found says (which rank timed out first, whom it
    /// waited for), as told to the peer processes; `None` before one. A team made of this one
    /// tells its own peers (`runtime::hier`).
    pub fn timeout_cause(&self) -> Option<&str> {
        self.timeout_cause.get().map(String::as_str)
    }

    /// True once the team has its sticky error (a failure or an abort) recorded.
    pub fn is_failed(&self) -> bool {
        self.failed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Checks `rank` is a rank of this team that this process owns (every rank in a
    /// single-process team; only its own in a multi-process team).
    pub fn check_own_rank(&self, rank: i32, what: &str) -> Result<usize> {
        let r = self.check_rank(rank, what)?;
        match &self.comm {
            Some(c) if c.rank() != r => Err(Error::invalid_argument(format!(
                "{what} {rank} belongs to another process: this process is rank {} of a multi-process team",
                c.rank()
            ))),
            _ => Ok(r),
        }
    }

    /// Multi-process team: its connections.
    pub fn comm(&self) -> Option<&Arc<Comm>> {
        self.comm.as_ref()
    }

    /// The rank this process owns in a multi-process team.
    pub fn local_rank(&self) -> Option<usize> {
        self.comm.as_ref().map(|c| c.rank())
    }

    /// Address of rank `rank`'s sync region as seen by rank `viewer`.
    pub fn sync_base(&self, viewer: usize, rank: usize) -> DevicePtr {
        self.sync[viewer][rank]
    }

    /// Every rank's sync region as seen by rank `viewer`.
    pub fn sync_bases(&self, viewer: usize) -> &[DevicePtr] {
        &self.sync[viewer]
    }

    /// The multicast address of the sync regions on rank `viewer`'s device (multicast transport).
    pub fn sync_multicast(&self, viewer: usize) -> Option<DevicePtr> {
        self.sync_mc[viewer]
    }

    /// The ranks this process holds: every rank of a single-process team, its own of a
    /// multi-process team.
    pub fn own_ranks(&self) -> Vec<usize> {
        match self.local_rank() {
            Some(r) => vec![r],
            None => (0..self.devices.len()).collect(),
        }
    }

    /// The one-stream check (every collective form calls it before enqueuing): ranks of one
    /// team on one device given the same stream for the same collective cannot make progress
    /// (each waits in a barrier for the other, behind it on the stream). Records that rank `r`
    /// issues its next collective on `stream`, or fails with `InvalidArgument` naming both ranks
    /// when another rank on the same device issued the same collective (by count) on that
    /// stream. The NULL stream is one stream per device. Returns the round to pass to
    /// [`Team::unclaim_stream`] if the launch then fails.
    pub fn claim_stream(&self, r: usize, stream: Stream) -> Result<u64> {
        self.claims.claim(r, stream)
    }

    /// Forgets rank `r`'s claim of `round` (its launch failed: nothing was enqueued).
    pub fn unclaim_stream(&self, r: usize, round: u64) {
        self.claims.unclaim(r, round)
    }

    /// Waits for all work on every device of the team (as `cudaFree` does), so memory is not
    /// released under a kernel still using it.
    pub fn quiesce(&self) -> Result<()> {
        let mut devices: Vec<Device> = self.own_ranks().into_iter().map(|r| self.devices[r]).collect();
        devices.sort_unstable();
        devices.dedup();
        for dev in devices {
            self.env
                .driver()
                .device_synchronize(dev)
                .map_err(|e| Error::driver(e, format_args!("waiting for work in flight on device {dev}")))?;
        }
        Ok(())
    }

    /// Buffers alive.
    pub fn live_buffers(&self) -> usize {
        self.state.read().buffers
    }

    /// What `mcast_team_get_info` reports.
    pub fn info(&self) -> TeamInfo {
        let (mc, bytes) = self.state.read().holdings();
        TeamInfo {
            size: self.devices.len(),
            transport: self.transport,
            transport_reason: self.reason.clone(),
            granularity: self.granularity as u64,
            multicast_objects: mc,
            bytes_reserved: bytes,
            domains: self.domains.count(),
            domain_size: self.domains.size(),
            net_engine: String::new(),
        }
    }
}
