//! The runtime's view of a multi-process team's [`Bootstrap`]: exchanges whose statuses are
//! runtime errors. The runtime never knows how the bytes and descriptors travel.

use std::os::fd::RawFd;

use super::error::{Error, ErrorKind, Result};
use crate::bootstrap::{BootError, Bootstrap, Kind};
pub use crate::bootstrap::{Dec, Enc, Part, ID_BYTES};

const KINDS: [ErrorKind; 11] = [
    ErrorKind::InvalidArgument,
    ErrorKind::InvalidHandle,
    ErrorKind::OutOfMemory,
    ErrorKind::NotSupported,
    ErrorKind::DriverUnavailable,
    ErrorKind::Driver,
    ErrorKind::SystemNotReady,
    ErrorKind::InUse,
    ErrorKind::Timeout,
    ErrorKind::Internal,
    ErrorKind::Aborted,
];

fn code_of(k: ErrorKind) -> u32 {
    KINDS.iter().position(|&x| x == k).unwrap_or(9) as u32
}

impl From<BootError> for Error {
    fn from(e: BootError) -> Error {
        let kind = match e.kind {
            Kind::InvalidArgument => ErrorKind::InvalidArgument,
            Kind::NotSupported => ErrorKind::NotSupported,
            Kind::Timeout => ErrorKind::Timeout,
            Kind::Aborted => ErrorKind::Aborted,
            Kind::Internal => ErrorKind::Internal,
            Kind::Failed(c) => KINDS.get(c as usize).copied().unwrap_or(ErrorKind::Internal),
        };
        Error::new(kind, e.message)
    }
}

/// A multi-process team's connections.
#[derive(Debug)]
pub struct Comm {
    boot: Bootstrap,
}

impl Comm {
    /// Wraps a formed bootstrap.
    pub fn new(boot: Bootstrap) -> Comm {
        Comm { boot }
    }

    /// The bootstrap (abort, host identities).
    pub fn bootstrap(&self) -> &Bootstrap {
        &self.boot
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.boot.rank()
    }

    /// Ranks in the team.
    pub fn nranks(&self) -> usize {
        self.boot.nranks()
    }

    /// [`Bootstrap::allgather`] with a runtime status: this rank's own failure comes back as
    /// it is, another rank's with its kind and a message naming it.
    pub fn exchange(&self, label: &str, status: Result<()>, bytes: &[u8], fds: &[RawFd]) -> Result<Vec<Part>> {
        let wire = status.as_ref().map(|_| ()).map_err(|e| (code_of(e.kind), e.message.clone()));
        match self.boot.allgather(label, wire, bytes, fds) {
            Ok(parts) => Ok(parts),
            Err(e) => match status {
                Err(own) if e.kind != Kind::Aborted => Err(own),
                _ => Err(e.into()),
            },
        }
    }

    /// Every rank reports `status`; all succeed together or all fail with the first failure.
    pub fn vote(&self, label: &str, status: Result<()>) -> Result<()> {
        self.exchange(label, status, &[], &[]).map(|_| ())
    }

    /// [`Comm::exchange`] confirmed by every rank before any returns
    /// ([`Bootstrap::allgather_confirmed`]): for the agreements that end a team's formation or
    /// a split, so that one rank paused or failing at the end cannot leave the others holding
    /// a team (or a split) it has not.
    pub fn exchange_confirmed(&self, label: &str, status: Result<()>, bytes: &[u8]) -> Result<Vec<Part>> {
        let wire = status.as_ref().map(|_| ()).map_err(|e| (code_of(e.kind), e.message.clone()));
        match self.boot.allgather_confirmed(label, wire, bytes, &[]) {
            Ok(parts) => Ok(parts),
            Err(e) => match status {
                Err(own) if e.kind != Kind::Aborted => Err(own),
                _ => Err(e.into()),
            },
        }
    }

    /// [`Comm::vote`], confirmed ([`Comm::exchange_confirmed`]).
    pub fn vote_confirmed(&self, label: &str, status: Result<()>) -> Result<()> {
        self.exchange_confirmed(label, status, &[]).map(|_| ())
    }
}

impl Comm {
    /// Aborts the team's connections: every peer process is told (through rank 0), and every
    /// wait, here or there, ends with [`ErrorKind::Aborted`] within milliseconds. `reason` says
    /// who aborted. Idempotent.
    pub fn abort(&self, reason: &str) {
        self.boot.abort(reason);
    }

    /// `Some(reason)` once the team was aborted, here or by a peer; never blocks.
    pub fn aborted(&self) -> Option<String> {
        self.boot.aborted().then(|| self.boot.abort_reason())
    }

    /// Tells every peer process (through rank 0) that a rank of the team timed out (`reason`:
    /// which, and whom it waited for): their waits on the connections end with
    /// [`ErrorKind::Timeout`] and [`Comm::failure`] reports it there. Only the first failure
    /// travels.
    pub fn timed_out(&self, reason: &str) {
        self.boot.fail(Kind::Timeout, reason);
    }

    /// Tells every peer process (through rank 0) that the team failed with `kind` (`reason`:
    /// where and why, e.g. an engine's error between NVLink domains): their waits on the
    /// connections end, and [`Comm::failure`] reports it there with that kind. Only the first
    /// failure travels.
    pub fn failed(&self, kind: ErrorKind, reason: &str) {
        self.boot.fail(Kind::Failed(code_of(kind)), reason);
    }

    /// [`Comm::failure`] after taking what already lies on the connections
    /// ([`Bootstrap::failure_now`]): for a rank whose wait elsewhere just failed, to learn
    /// whether a peer aborted or failed first. Never blocks.
    pub fn failure_now(&self) -> Option<(ErrorKind, String)> {
        let (k, why) = self.boot.failure_now()?;
        Some((Error::from(BootError::new(k, "")).kind, why))
    }

    /// [`Comm::failure_now`], waiting up to `timeout_ms` for one ([`Bootstrap::failure_within`]).
    pub fn failure_within(&self, timeout_ms: u32) -> Option<(ErrorKind, String)> {
        let (k, why) = self.boot.failure_within(timeout_ms)?;
        Some((Error::from(BootError::new(k, "")).kind, why))
    }

    /// The team's failure told here or by a peer process ([`Comm::abort`],
    /// [`Comm::timed_out`]): its kind and reason; `None` while healthy. Never blocks; one atomic
    /// load while healthy.
    pub fn failure(&self) -> Option<(ErrorKind, String)> {
        let (k, why) = self.boot.failure()?;
        Some((Error::from(BootError::new(k, "")).kind, why))
    }
}
