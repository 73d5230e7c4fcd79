//! How the processes of a team meet and talk during setup and agreement. No CUDA, no runtime
//! types: bytes, statuses as numbers, and file descriptors.
//!
//! - [`tcp`]: listeners, authenticated connections, capped frames, interface choice.
//! - [`oob`]: the caller's allgather (`mcast_oob_t`), used once to swap what TCP needs.
//! - [`host`]: host identity (which ranks may pass file descriptors).
//! - [`fdpass`]: `SCM_RIGHTS` between the ranks of one host.
//!
//! A team meets either through a unique id (a root listener in the process that made the id,
//! or at `MCAST_BOOTSTRAP_ADDR` in rank 0, tells every rank where rank 0's hub listens) or
//! through the caller's allgather. Then every rank holds one authenticated TCP connection to
//! rank 0, the hub of a star; [`Bootstrap::allgather`] gathers every rank's labelled part at
//! the hub and sends all parts back. A reader thread per connection turns frames into a queue,
//! so an abort ([`Bootstrap::abort`], relayed by the hub) and a closed connection are seen at
//! once, also while no exchange runs ([`Bootstrap::aborted`]).
//!
//! Where things live: `id.rs` unique ids and the root listener, `join.rs` how a team forms,
//! `exchange.rs` the all-gather and what is built on it; this file holds the errors, the
//! deadline and the [`Bootstrap`] value with its abort.

mod exchange;
pub mod fdpass;
pub mod host;
mod id;
pub mod ifname;
mod join;
pub mod oob;
pub mod tcp;
pub mod wire;

use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

pub use id::{new_unique_id, UniqueId, ID_BYTES};
use tcp::kind;
pub use wire::{Dec, Enc};

/// What went wrong in the bootstrap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Bad arguments or a bad id.
    InvalidArgument,
    /// Something the system lacks.
    NotSupported,
    /// A peer did not arrive within `timeout_ms`, or left.
    Timeout,
    /// The team was aborted, here or in a peer.
    Aborted,
    /// A broken invariant or an unexpected system error.
    Internal,
    /// A rank reported a failure with this caller-defined code.
    Failed(u32),
}

impl Kind {
    fn code(self) -> u32 {
        match self {
            Kind::InvalidArgument => 0,
            Kind::NotSupported => 1,
            Kind::Timeout => 2,
            Kind::Aborted => 3,
            Kind::Internal => 4,
            Kind::Failed(c) => c.saturating_add(100),
        }
    }

    fn from_code(c: u32) -> Kind {
        match c {
            0 => Kind::InvalidArgument,
            1 => Kind::NotSupported,
            2 => Kind::Timeout,
            3 => Kind::Aborted,
            100.. => Kind::Failed(c - 100),
            _ => Kind::Internal,
        }
    }
}

/// A bootstrap error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootError {
    /// What kind.
    pub kind: Kind,
    /// What happened, naming ranks.
    pub message: String,
}

impl BootError {
    /// An error.
    pub fn new(kind: Kind, message: impl Into<String>) -> BootError {
        BootError { kind, message: message.into() }
    }
}

/// A rank's status in an exchange: success, or a caller-defined code and a message.
pub type Status = Result<(), (u32, String)>;

/// A deadline from `timeout_ms` (`None`: none).
#[derive(Clone, Copy, Debug)]
pub struct Deadline(pub Option<Instant>);

impl Deadline {
    /// `timeout_ms` from now; 0 means no deadline.
    pub fn after(timeout_ms: u32) -> Deadline {
        Deadline((timeout_ms != 0).then(|| Instant::now() + Duration::from_millis(u64::from(timeout_ms))))
    }

    /// Whether it passed.
    pub fn passed(self) -> bool {
        self.0.is_some_and(|t| Instant::now() >= t)
    }
}

/// JOIN purposes.
const ASK_ROOT: u32 = 1;
const JOIN_HUB: u32 = 2;

/// One rank's part of an exchange.
#[derive(Debug, Default)]
pub struct Part {
    /// The bytes it sent.
    pub bytes: Vec<u8>,
    /// The descriptors it sent, when it is on this rank's host (this rank's own: none).
    pub fds: Vec<OwnedFd>,
}

struct Conn {
    stream: TcpStream,
    write: Mutex<()>,
}

impl Conn {
    fn send(&self, k: u8, payload: &[u8]) -> std::io::Result<()> {
        let _g = self.write.lock();
        tcp::write_frame(&mut &self.stream, k, payload)
    }
}

#[derive(Default)]
struct Queues {
    frames: Vec<std::collections::VecDeque<(u8, Vec<u8>)>>,
    closed: Vec<bool>,
}

struct Shared {
    q: Mutex<Queues>,
    cv: Condvar,
    aborted: AtomicBool,
    reason: Mutex<String>,
    /// An eventfd made readable by an abort (wakes descriptor-passing waits).
    wake: OwnedFd,
}

impl Shared {
    fn set_aborted(&self, reason: &str) -> bool {
        if self.aborted.swap(true, Ordering::SeqCst) {
            return false;
        }
        *self.reason.lock() = reason.to_string();
        let one: u64 = 1;
        // SAFETY: writes 8 bytes to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
        let _g = self.q.lock();
        self.cv.notify_all();
        true
    }
}

/// The connections of one rank of a team.
pub struct Bootstrap {
    rank: usize,
    nranks: usize,
    timeout_ms: u32,
    hosts: Vec<String>,
    shared: Arc<Shared>,
    /// Hub: `conns[r]` for every rank r > 0. Others: `conns[0]`, the hub.
    conns: Arc<Vec<Option<Arc<Conn>>>>,
    readers: Mutex<Vec<std::thread::JoinHandle<()>>>,
    local: Option<fdpass::Local>,
    /// Serialises exchanges; holds the error that broke the bootstrap.
    broken: Mutex<Option<BootError>>,
}

impl std::fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bootstrap(rank {} of {})", self.rank, self.nranks)
    }
}

fn timeout_err(message: String) -> BootError {
    BootError::new(Kind::Timeout, message)
}

impl Bootstrap {
    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the team.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Every rank's host identity, in rank order.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// Whether ranks `a` and `b` are on one host (may pass descriptors).
    pub fn same_host(&self, a: usize, b: usize) -> bool {
        self.hosts[a] == self.hosts[b]
    }

    /// Aborts the team's bootstrap: tells every peer (through the hub), ends every wait here
    /// and in the peers with [`Kind::Aborted`], and breaks the bootstrap.
    pub fn abort(&self, reason: &str) {
        let msg = format!("rank {} aborted the team: {reason}", self.rank);
        if self.shared.set_aborted(&msg) {
            let mut e = Enc::default();
            e.str(&msg);
            for c in self.conns.iter().flatten() {
                let _ = c.send(kind::ABORT, &e.0);
            }
        }
    }

    /// Whether this rank or a peer aborted the team; never blocks.
    pub fn aborted(&self) -> bool {
        self.shared.aborted.load(Ordering::SeqCst)
    }

    /// Why the team was aborted ("" when it was not).
    pub fn abort_reason(&self) -> String {
        self.shared.reason.lock().clone()
    }

    fn aborted_err(&self) -> BootError {
        BootError::new(Kind::Aborted, format!("rank {}: the team was aborted ({})", self.rank, self.abort_reason()))
    }
}

impl Drop for Bootstrap {
    fn drop(&mut self) {
        for c in self.conns.iter().flatten() {
            let _ = c.stream.shutdown(Shutdown::Both);
        }
        for t in self.readers.lock().drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests;
