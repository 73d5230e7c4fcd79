//! How the processes of a team meet and talk during setup and agreement. No CUDA, no runtime
//! types: bytes, statuses as numbers, and file descriptors.
//!
//! - [`tcp`]: listeners, authenticated connections, capped frames, interface choice.
//! - [`oob`]: the caller's allgather (`mcast_oob_t`), used once to swap what TCP needs.
//! - [`host`]: host identity (which ranks may pass file descriptors).
//! - [`fdpass`]: `SCM_RIGHTS` between the ranks of one host.
//! - `droplog`: rate-limited warnings about connections a listener closed.
//!
//! A team meets either through a unique id (a root listener in the process that made the id,
//! or at `MCAST_BOOTSTRAP_ADDR` in rank 0, tells every rank where rank 0's hub listens) or
//! through the caller's allgather. Then every rank holds one authenticated TCP connection to
//! rank 0, the hub of a star; [`Bootstrap::allgather`] gathers every rank's labelled part at
//! the hub and sends all parts back. A reader thread per connection turns frames into a queue
//! (a rank waiting in an exchange may read its peer's next frame itself, `reader.rs`), so an
//! abort ([`Bootstrap::abort`], relayed by the hub), a rank's failure ([`Bootstrap::fail`]: a
//! timeout) and a closed connection are seen at once, also while no exchange runs
//! ([`Bootstrap::aborted`], [`Bootstrap::failure`]).
//!
//! Every frame after a connection's handshake (the root's answer, the hub's join and welcome,
//! every exchange, abort and failure) is sealed ([`tcp::Sealer`]): nothing a team sends, the
//! ids of a split's new teams included, travels in the clear, and a frame altered, replayed,
//! reordered or injected on the way fails to open. The reader that sees that (or a peer
//! breaking a cap: an oversized frame, more queued frames than [`QUEUE_FRAMES`] or bytes than
//! [`QUEUE_BYTES`]) fails the whole team: every wait on this rank ends with [`Kind::Timeout`]
//! (the status of a lost connection) and a message naming the connection, and a `FAILED`
//! frame carries the message to the peers (relayed by the hub like an abort).
//!
//! Every rank of an exchange ends with one outcome, as strongly as timeouts allow (protocol 4,
//! `exchange.rs`): a hub past its deadline sends no more results and fails the exchange; a
//! rank at its deadline takes a result already on its socket; a rank that fails after the
//! result may have gone out tells every rank ([`Bootstrap::fail`] through the hub), so a rank
//! that succeeded finds its bootstrap failed ([`Bootstrap::failure`]); and
//! [`Bootstrap::allgather_confirmed`] (acknowledge, then commit) makes the call's own result the
//! same on every rank but where the hub pauses past its deadline between two commits.
//!
//! Where things live: `id.rs` unique ids and the root listener, `join.rs` how a team forms,
//! `reader.rs` the reading of its connections, `exchange.rs` the all-gather and what is built
//! on it; this file holds the errors, the deadline and the [`Bootstrap`] value with its abort.

mod droplog;
mod exchange;
pub mod fdpass;
pub mod host;
mod id;
pub mod ifname;
mod join;
pub mod oob;
mod reader;
pub mod tcp;
pub mod wire;

use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

pub use id::{new_root_id, new_unique_id, UniqueId, ADDR_ENV, ID_BYTES, SECRET_ENV, SECRET_MIN_HEX_DIGITS};
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

/// The default of `MCAST_TIMEOUT_MS`: how long the bootstrap waits for a peer, and how long a
/// unique id's root listener waits for the next rank.
pub const DEFAULT_TIMEOUT_MS: u32 = 30_000;

/// Most frames queued from one peer that no exchange has taken yet (a member keeps at most
/// one in flight); more fails the team.
pub const QUEUE_FRAMES: usize = 16;
/// Most payload bytes queued from one peer.
pub const QUEUE_BYTES: usize = 4 * tcp::MAX_FRAME;

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

/// A connection: its sending half, and its reading half, which its reader thread and a rank
/// waiting in an exchange share (`reader.rs`).
struct Conn {
    stream: TcpStream,
    tx: Mutex<tcp::Sealer>,
    rx: Mutex<tcp::Opener>,
}

impl Conn {
    /// A handshaken connection.
    fn new(c: tcp::Secured) -> Conn {
        Conn { stream: c.stream, tx: Mutex::new(c.tx), rx: Mutex::new(c.rx) }
    }

    fn send(&self, k: u8, payload: &[u8]) -> std::io::Result<()> {
        // Sealed and written under one lock: frame numbers reach the wire in order.
        self.tx.lock().send(&mut &self.stream, k, payload)
    }
}

#[derive(Default)]
struct Queues {
    frames: Vec<std::collections::VecDeque<(u8, Vec<u8>)>>,
    /// Payload bytes in `frames`, per peer.
    bytes: Vec<usize>,
    closed: Vec<bool>,
}

struct Shared {
    q: Mutex<Queues>,
    cv: Condvar,
    /// Set once the team failed, here or in a peer (aborted, a rank timed out, a connection
    /// failed authentication or broke a cap): every wait ends.
    failed: AtomicBool,
    /// Set once the team was aborted.
    aborted: AtomicBool,
    /// The failure and why; an abort replaces an earlier failure of another kind.
    failure: Mutex<Option<(Kind, String)>>,
    /// An eventfd made readable by a failure (wakes descriptor-passing waits).
    wake: OwnedFd,
    /// Called once when the team is aborted ([`Bootstrap::on_abort`]).
    on_abort: Mutex<Option<OnAbort>>,
    /// Tests only: the reader threads leave the connections alone (`reader.rs`'s tests).
    #[cfg(test)]
    readers_paused: AtomicBool,
    /// Tests only: where this rank pauses (each once) and for how many milliseconds, as a
    /// stopped process does (`exchange.rs`'s `pause_at`).
    #[cfg(test)]
    pauses: Mutex<Vec<(exchange::Step, u64)>>,
}

impl Shared {
    fn set_aborted(&self, reason: &str) -> bool {
        self.set_failed(Kind::Aborted, reason)
    }

    /// Records that the team failed (`kind`, `reason`): the first failure, or an abort after
    /// another one. True when it is news (to relay); false when already known.
    fn set_failed(&self, kind: Kind, reason: &str) -> bool {
        {
            let mut f = self.failure.lock();
            if f.as_ref().is_some_and(|(k, _)| kind != Kind::Aborted || *k == Kind::Aborted) {
                return false;
            }
            *f = Some((kind, reason.to_string()));
            if kind == Kind::Aborted {
                self.aborted.store(true, Ordering::SeqCst);
            }
            self.failed.store(true, Ordering::SeqCst);
        }
        let one: u64 = 1;
        // SAFETY: writes 8 bytes to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
        {
            let _g = self.q.lock();
            self.cv.notify_all();
        }
        if kind == Kind::Aborted {
            if let Some(f) = self.on_abort.lock().take() {
                f(reason);
            }
        }
        true
    }
}

/// What a rank does when its team is aborted, here or by a peer: called once, with the reason,
/// on the thread that learned it (a reader thread, or the one aborting).
pub type OnAbort = Box<dyn FnOnce(&str) + Send>;

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

    /// Tells every peer (through the hub) that the team failed with `kind` (a rank timed out:
    /// [`Kind::Timeout`]; `reason` says which rank and why), and ends every wait here and in the
    /// peers with `kind`, as [`Bootstrap::abort`] does (which is `fail` with [`Kind::Aborted`]).
    /// Only the first failure travels (an abort still does after another one).
    pub fn fail(&self, what: Kind, reason: &str) {
        if what == Kind::Aborted {
            return self.abort(reason);
        }
        if self.shared.set_failed(what, reason) {
            let mut e = Enc::default();
            e.u32(what.code()).str(reason);
            for c in self.conns.iter().flatten() {
                let _ = c.send(kind::FAILED, &e.0);
            }
        }
    }

    /// Calls `f` with the reason once the team is aborted, here or by a peer (at once when it
    /// was already), on the thread that learns it: even while no exchange runs. For a team
    /// whose abort must also reach waits that are not on these connections (a team across NVLink
    /// domains aborts its domain team's device waits so). Replaces an earlier `f` not yet called.
    pub fn on_abort(&self, f: OnAbort) {
        let mut slot = self.shared.on_abort.lock();
        if self.aborted() {
            drop(slot);
            f(&self.abort_reason());
        } else {
            *slot = Some(f);
            drop(slot);
            // An abort recorded between the check and the store finds no hook: call it here.
            if self.aborted() {
                if let Some(f) = self.shared.on_abort.lock().take() {
                    f(&self.abort_reason());
                }
            }
        }
    }

    /// Whether this rank or a peer aborted the team; never blocks.
    pub fn aborted(&self) -> bool {
        self.shared.aborted.load(Ordering::SeqCst)
    }

    /// The team's failure (aborted, or told by [`Bootstrap::fail`], here or by a peer) and its
    /// reason; `None` while healthy. Never blocks; one atomic load while healthy.
    pub fn failure(&self) -> Option<(Kind, String)> {
        if !self.shared.failed.load(Ordering::SeqCst) {
            return None;
        }
        self.shared.failure.lock().clone()
    }

    /// [`Bootstrap::failure`] after taking the frames that already lie whole on this rank's
    /// connections (an abort or a failure a peer sent just before a wait elsewhere failed,
    /// which the reader threads may not have read yet). Never blocks.
    pub fn failure_now(&self) -> Option<(Kind, String)> {
        for src in 0..self.conns.len() {
            for _ in 0..QUEUE_FRAMES {
                if !self.pump(src) {
                    break;
                }
            }
        }
        self.failure()
    }

    /// [`Bootstrap::failure_now`], waiting up to `timeout_ms` for one: for a rank that has
    /// evidence that a peer aborted or failed (a connection elsewhere said so) whose frame here
    /// comes the longer way, through the hub.
    pub fn failure_within(&self, timeout_ms: u32) -> Option<(Kind, String)> {
        if let Some(f) = self.failure_now() {
            return Some(f);
        }
        let until = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
        let mut q = self.shared.q.lock();
        while !self.shared.failed.load(Ordering::SeqCst) {
            if self.shared.cv.wait_until(&mut q, until).timed_out() {
                break;
            }
        }
        drop(q);
        self.failure()
    }

    /// Why the team was aborted ("" when it was not).
    pub fn abort_reason(&self) -> String {
        match self.failure() {
            Some((Kind::Aborted, why)) => why,
            _ => String::new(),
        }
    }

    fn aborted_err(&self) -> BootError {
        BootError::new(Kind::Aborted, format!("rank {}: the team was aborted ({})", self.rank, self.abort_reason()))
    }

    /// The error that ends every wait once the team failed.
    fn failed_err(&self) -> Option<BootError> {
        match self.failure()? {
            (Kind::Aborted, _) => Some(self.aborted_err()),
            (k, why) => Some(BootError::new(k, format!("rank {}: the team failed: {why}", self.rank))),
        }
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
mod agree_tests;
#[cfg(test)]
mod env_tests;
#[cfg(test)]
mod flood_tests;
#[cfg(test)]
mod net_tests;
#[cfg(test)]
mod stop_tests;
#[cfg(test)]
mod tests;
