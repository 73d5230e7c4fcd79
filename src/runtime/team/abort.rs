//! A team's failures: the sticky error (a device timeout, here or in a peer), abort
//! (`mcast_team_abort`: every wait ends, here and in peer processes) and the asynchronous error
//! read from the device words.
//!
//! A failure is every rank's. A kernel whose wait times out writes "rank t timed out" into
//! every rank's state word (`record_timeout`, kernels/sync.cuh), so every other rank's waits,
//! and its later kernels, end at once with a timeout too; the host that learns of a timeout
//! ([`Team::timed_out`]: synchronize, `mcast_team_get_error`) tells the peer processes over
//! the connections, as an abort does, so their host waits and calls end too.

use std::fmt;
use std::sync::atomic::Ordering;

use super::Team;
use crate::driver::RelaxedCapture;
use crate::kernels::abi::signature::{describe_record, MISMATCH_BYTES};
use crate::kernels::abi::{
    timed_out_rank, ERROR_INFO_OFFSET, ERROR_WORD_OFFSET, ERR_ABORTED, ERR_INVALID, ERR_MISMATCH, ERR_TIMEOUT,
    MISMATCH_OFFSET, MISSING_OFFSET, MISSING_WORDS, STATE_ABORTED, STATE_MISMATCH, STATE_OFFSET, STATE_OK,
};
use crate::runtime::error::{Error, ErrorKind, Result};

/// How often, at most, a multi-process team's `mcast_team_get_error` reads its rank's device
/// words when its doorbell did not ring (see [`Team::peer_words_due`]).
const PEER_WORDS_MS: u64 = 20;

/// How a timeout message ends.
const STICKY: &str = "every rank must call each collective; every rank of the team reports this error until it is \
                      destroyed: destroy it and make a new one";

impl Team {
    /// The sticky error, if a collective of this team failed on the device, a peer process
    /// told of a failure, or the team was aborted (an abort, here or noticed from a peer, wins
    /// over an earlier timeout). Cheap: it reads only what this process already knows (see
    /// [`Team::async_error`] for more). While the team is healthy it reads three atomic flags
    /// (the third the connections', for a multi-process team) and takes no lock (every
    /// collective call asks, from every rank's thread).
    pub fn error(&self) -> Option<Error> {
        if self.aborted.load(Ordering::Acquire) {
            return Some(self.aborted_error());
        }
        if !self.failed.load(Ordering::Acquire) {
            let (kind, why) = self.comm.as_ref().and_then(|c| c.failure())?;
            self.told(kind, &why);
            return self.error();
        }
        self.error.lock().clone()
    }

    /// Records the failure a peer process told over the connections (an abort, a rank's
    /// timeout; also over connections of a team made of this one).
    pub(crate) fn told(&self, kind: ErrorKind, why: &str) {
        if kind == ErrorKind::Aborted {
            return self.mark_aborted(why);
        }
        let me = self.local_rank().map_or_else(|| "this process".to_string(), |r| format!("rank {r}"));
        self.set_error(Error::new(kind, format!("{me}: {why} (told by a peer process); {STICKY}")));
    }

    /// Rank `r`'s device recorded a timeout, or its state word says a rank timed out: records
    /// the team's sticky timeout, naming the rank that timed out first (`r`'s state word; `r`
    /// when it names none) and the ranks it waited for (that rank's missing-rank words, read
    /// through `r`'s peer mapping), and tells the peer processes, so a rank that was paused or
    /// slow learns of it at once. Returns the team's error (the first one recorded).
    pub(crate) fn timed_out(&self, r: usize) -> Error {
        let what = {
            let live = self.sync_live.read();
            let driver = self.env.driver();
            let _relaxed = RelaxedCapture::enter(&**driver);
            let n = self.size();
            let peek = |rank: usize, offset: usize| {
                (*live).then(|| driver.peek_u32(self.devices[r], self.sync[r][rank] + offset as u64).ok()).flatten()
            };
            let first = peek(r, STATE_OFFSET).and_then(timed_out_rank).filter(|&t| t < n).unwrap_or(r);
            let missing: Vec<usize> = (0..MISSING_WORDS)
                .flat_map(|w| {
                    let bits = peek(first, MISSING_OFFSET + 4 * w).unwrap_or(0);
                    (0..32).filter(move |b| bits >> b & 1 == 1).map(move |b| 32 * w + b)
                })
                .filter(|&q| q < n)
                .collect();
            let info = peek(first, ERROR_INFO_OFFSET).unwrap_or(0);
            let who = match missing.as_slice() {
                [] => "a peer rank".to_string(),
                [q] => format!("rank {q}"),
                [init @ .., last] => {
                    let init: Vec<String> = init.iter().map(usize::to_string).collect();
                    format!("ranks {} and {last}", init.join(", "))
                }
            };
            let at = match info {
                0 => String::new(),
                _ => format!(" (wait {} of a collective, block {})", info >> 8, (info & 0xff).saturating_sub(1)),
            };
            let timeout_ms = self.env.config().timeout_ms;
            format!("rank {first} timed out first: {who} did not arrive within timeout_ms = {timeout_ms} ms{at}")
        };
        // One-process teams: who is behind in calls, and the issue-order rule (refusal.rs).
        let hint = self.timeout_hint();
        self.set_error(Error::new(ErrorKind::Timeout, format!("rank {r}: {what}{hint}; {STICKY}")));
        if let Some(c) = &self.comm {
            c.timed_out(&what);
        }
        self.timeout_cause.get_or_init(|| what.clone());
        self.error().expect("a timed-out team has its error")
    }

    /// Rank `r`'s kernel found a peer whose call signature differs from its own
    /// ([`ERR_MISMATCH`]: every rank compares every peer, so every rank finds it, in every
    /// process): records the team's sticky `InvalidArgument`, naming the field, the values and
    /// the ranks from `r`'s mismatch record. Sticky like a timeout: ranks that disagreed may have
    /// run different kernels or grids, whose barrier counts and LL flags no longer agree.
    /// Returns the team's error (the first one recorded).
    pub(crate) fn mismatched(&self, r: usize) -> Error {
        let what = {
            let live = self.sync_live.read();
            let driver = self.env.driver();
            let _relaxed = RelaxedCapture::enter(&**driver);
            let peek = |offset: usize| {
                (*live).then(|| driver.peek_u32(self.devices[r], self.sync[r][r] + offset as u64).ok()).flatten()
            };
            let mut record = [0u8; MISMATCH_BYTES];
            for (i, w) in record.chunks_mut(4).enumerate() {
                w.copy_from_slice(&peek(MISMATCH_OFFSET + 4 * i).unwrap_or(0).to_ne_bytes());
            }
            describe_record(r, peek(ERROR_INFO_OFFSET).unwrap_or(0), &record, |l| l)
        };
        let me = r;
        self.set_error(Error::invalid_argument(format!(
            "rank {me}: {what}: every rank must pass the same collective, count, dtype, op, root and buffer offsets; \
             its kernels found it at their entry and wrote no data; every rank of the team reports this error until \
             it is destroyed (ranks that disagree may have run different kernels, whose barrier counts no longer \
             agree): destroy it and make a new one"
        )));
        if self.comm.is_none() {
            self.end_device_waits_mismatched();
        }
        self.error().expect("a mismatched team has its error")
    }

    /// One process drives every rank: a rank that calls after the team's mismatch is recorded
    /// here is refused on the host and never launches, so the kernels still waiting for it (a
    /// rank whose lines came later than a disagreeing peer's) are told, as a timeout or an abort
    /// tells them: every rank's state word still OK gets [`STATE_MISMATCH`], and their waits end
    /// with the mismatch instead of the timeout (or never, with none).
    fn end_device_waits_mismatched(&self) {
        let live = self.sync_live.read();
        if !*live {
            return;
        }
        let driver = self.env.driver();
        let _relaxed = RelaxedCapture::enter(&**driver);
        for r in self.own_ranks() {
            let (dev, at) = (self.devices[r], self.sync[r][r] + STATE_OFFSET as u64);
            if driver.peek_u32(dev, at).is_ok_and(|w| w == STATE_OK) {
                if let Err(e) = driver.poke_u32(dev, at, STATE_MISMATCH) {
                    tracing::warn!("ending rank {r}'s device waits after a mismatch: {e}");
                }
            }
        }
    }

    /// Records the first device error; later calls report it until the team is destroyed.
    pub fn set_error(&self, e: Error) {
        if e.kind == ErrorKind::Aborted {
            self.mark_aborted(&e.message);
            return;
        }
        self.error.lock().get_or_insert(e);
        // Published after the error is stored: a reader that sees the flag finds the error.
        self.failed.store(true, Ordering::Release);
    }

    /// Fails with the team's sticky error (aborted, or a device timeout); `what` names the call
    /// and is formatted only on failure.
    pub fn check_usable(&self, what: impl fmt::Display) -> Result<()> {
        match self.error() {
            Some(e) => Err(e.context(what)),
            None => Ok(()),
        }
    }

    /// Fails with [`ErrorKind::Aborted`] once the team was aborted; `what` names the call.
    pub fn check_not_aborted(&self, what: &str) -> Result<()> {
        match self.error() {
            Some(e) if e.kind == ErrorKind::Aborted => Err(e.context(what)),
            _ => Ok(()),
        }
    }

    /// True once the team was aborted (here, or noticed from a peer).
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    fn aborted_error(&self) -> Error {
        let msg = self.error.lock().as_ref().filter(|e| e.kind == ErrorKind::Aborted).map(|e| e.message.clone());
        Error::aborted(msg.unwrap_or_else(|| "the team was aborted".to_string()))
    }

    /// Records an abort (sticky; wins over a timeout).
    fn mark_aborted(&self, why: &str) {
        let mut err = self.error.lock();
        if !self.aborted.swap(true, Ordering::AcqRel) {
            *err = Some(Error::aborted(format!(
                "the team was aborted ({why}); every call on it returns MCAST_ERROR_ABORTED: destroy it and make a new \
                 one"
            )));
            self.failed.store(true, Ordering::Release);
        }
    }

    /// An abort seen in this process's device words (a peer process wrote them): recorded, and
    /// told over the connections too. The aborting process tells the hub itself, but its frame
    /// may reach the hub after this process has seen the words, returned ABORTED and exited;
    /// the hub, waiting for this process in an exchange, would then report its closed
    /// connection instead of the abort. Sent first, on the same connection, the abort is read
    /// before the close.
    fn aborted_on_device(&self, why: &str) {
        self.mark_aborted(why);
        if let Some(c) = &self.comm {
            c.abort(&format!("it saw the team aborted on its device ({why})"));
        }
    }

    /// Aborts the team (`mcast_team_abort`): every wait on it ends promptly, on the device
    /// (the state word of every rank, peers' through the peer mappings, is set and every
    /// barrier spin reads it) and on the host (rendezvous waits poll the abort; peer processes
    /// are told over the rendezvous connections); every later call on the team returns
    /// [`ErrorKind::Aborted`]. Callable from any thread, while others are blocked on the team.
    pub fn abort(&self) {
        let who = match self.local_rank() {
            Some(r) => format!("mcast_team_abort by rank {r}'s process"),
            None => "mcast_team_abort in this process".to_string(),
        };
        self.abort_by(&who);
    }

    /// [`Team::abort`] with `who` saying who aborted (a team across NVLink domains names the
    /// rank of the whole team, not of its domain team).
    pub(crate) fn abort_by(&self, who: &str) {
        let who = who.to_string();
        self.mark_aborted(&who);
        if let Some(c) = &self.comm {
            c.abort(&who);
        }
        self.stop_device_waits(true);
    }

    /// Sets the device state word of this process's ranks (and, with `peers`, of every rank
    /// through this rank's peer mappings) to aborted, so that every barrier spin ends.
    /// Writes nothing once the team's memory was released.
    pub(super) fn stop_device_waits(&self, peers: bool) {
        let live = self.sync_live.read();
        if !*live {
            return;
        }
        let driver = self.env.driver();
        let _relaxed = RelaxedCapture::enter(&**driver);
        let n = self.devices.len();
        for r in self.own_ranks() {
            let targets: Vec<usize> = if peers && self.comm.is_some() { (0..n).collect() } else { vec![r] };
            for q in targets {
                let at = self.sync[r][q] + STATE_OFFSET as u64;
                if let Err(e) = driver.poke_u32(self.devices[r], at, STATE_ABORTED) {
                    tracing::warn!("aborting: writing rank {q}'s state word from rank {r}: {e}");
                }
            }
        }
    }

    /// True at most every [`PEER_WORDS_MS`] for a team with ranks in other processes: the
    /// device words of this process's rank are then read even though its doorbell did not
    /// ring. A peer process writes this rank's state word through its mapping when it aborts or
    /// one of its kernels times out, with no kernel of this rank running to see it; its frame
    /// over the connections normally says the same, but may come later (or never, if it died).
    /// The read runs in relaxed capture mode, so it disturbs no capture either.
    fn peer_words_due(&self) -> bool {
        if self.comm.is_none() {
            return false;
        }
        let now = crate::runtime::team::clock_ms();
        let last = self.words_read_at.load(Ordering::Relaxed);
        now.saturating_sub(last) >= PEER_WORDS_MS
            && self.words_read_at.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }

    /// The team's asynchronous error without waiting (`mcast_team_get_error`): `None`,
    /// [`ErrorKind::Timeout`] or [`ErrorKind::Aborted`]. Besides the host's sticky error (with
    /// what peer processes told) it reads this process's ranks' device words (a peer process's
    /// abort, a rank's timeout in the state word, a wait's timeout) without waiting for any
    /// stream.
    pub fn async_error(&self) -> Option<ErrorKind> {
        if let Some(e) = self.error() {
            return Some(e.kind);
        }
        // A healthy team: one load of host memory, no driver call (see `runtime::doorbell`); a
        // multi-process team also reads its rank's words now and then (`peer_words_due`).
        if !self.doorbell.rang() && !self.peer_words_due() {
            return None;
        }
        let live = self.sync_live.read();
        if !*live {
            return None;
        }
        let driver = self.env.driver();
        let _relaxed = RelaxedCapture::enter(&**driver);
        for r in self.own_ranks() {
            let (dev, base) = (self.devices[r], self.sync[r][r]);
            let state = driver.peek_u32(dev, base + STATE_OFFSET as u64);
            if state.as_ref().is_ok_and(|&w| w == STATE_ABORTED) {
                drop(live);
                self.aborted_on_device("by a peer process: its rank wrote this rank's state word");
                return Some(ErrorKind::Aborted);
            }
            if state.is_ok_and(|w| timed_out_rank(w).is_some()) {
                drop(live);
                return Some(self.timed_out(r).kind);
            }
            match driver.peek_u32(dev, base + ERROR_WORD_OFFSET as u64) {
                Ok(ERR_TIMEOUT) => {
                    drop(live);
                    return Some(self.timed_out(r).kind);
                }
                Ok(ERR_INVALID) => {
                    let info = driver.peek_u32(dev, base + ERROR_INFO_OFFSET as u64).unwrap_or(0);
                    let timeout_ms = self.env.config().timeout_ms;
                    if let Some(e) = crate::runtime::device_api::device_error(r as i32, ERR_INVALID, info, timeout_ms) {
                        let kind = e.kind;
                        self.set_error(e);
                        return Some(kind);
                    }
                }
                Ok(ERR_MISMATCH) => {
                    drop(live);
                    return Some(self.mismatched(r).kind);
                }
                Ok(ERR_ABORTED) => {
                    drop(live);
                    self.aborted_on_device("seen on the device");
                    return Some(ErrorKind::Aborted);
                }
                _ => {}
            }
        }
        None
    }
}
