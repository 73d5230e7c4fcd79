//! The listener's event loop: one thread serves every connection in its handshake, whatever
//! their number, with `poll(2)` over non-blocking sockets; bounded in time, in number, by
//! source and by the process's descriptors.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use zeroize::Zeroizing;

use super::super::droplog::DropLog;
use super::handshake::{Bind, Info, Proven, Server};
use super::sealed::{Opener, Sealer, Secured, TAG};
use super::{kind, HANDSHAKE_MS, MAX_HANDSHAKE_FRAME, SECRET_BYTES};

/// Most connections in their handshake at once on one listener: above the largest team (72
/// ranks, which may all reach the root at once). A connection beyond it evicts another that
/// has not proved the secret: one of the source address with the most connections in their
/// handshake, the oldest that has not sent its nonce yet, else its oldest. A flood from one
/// address then only evicts its own connections, and a rank, whose handshake takes a round
/// trip, gets through.
pub const MAX_PENDING: usize = 128;
/// How long the loop rests when the process is out of descriptors and nothing can be shed.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Descriptors the listener leaves to the rest of the process once it ran out: its cap of
/// pending handshakes drops to what it held less these (the ranks of this process need
/// descriptors too), but never below [`FD_FLOOR`].
const FD_RESERVE: usize = 16;
const FD_FLOOR: usize = 8;
/// Most connections accepted in one turn of the loop (the others wait in the backlog until the
/// handshakes in flight were served once).
const ACCEPT_BURST: usize = MAX_PENDING;
/// Cap of the sealed `JOIN` that ends a handshake.
const JOIN_CAP: usize = MAX_HANDSHAKE_FRAME * 4;

/// What arrives from a listener: an authenticated connection and its `JOIN`, or why a holder
/// of the secret was refused (another version, job or team size).
pub type Arrival = Result<(Secured, Vec<u8>), String>;

/// Connections a listener closed before they proved the secret, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shed {
    /// Evicted at the cap of pending handshakes.
    pub cap: u64,
    /// Shed because the process was out of descriptors.
    pub descriptors: u64,
    /// Past the handshake deadline.
    pub deadline: u64,
    /// Failed the handshake (wrong secret, malformed frames).
    pub failed: u64,
}

impl Shed {
    /// All of them.
    pub fn total(&self) -> u64 {
        self.cap + self.descriptors + self.deadline + self.failed
    }

    /// For a message: empty when nothing was shed.
    pub fn describe(&self, what: &str) -> String {
        if self.total() == 0 {
            return String::new();
        }
        format!(
            "; {what} was under load: it closed {} connection(s) that had not proved the secret ({} evicted at the \
             cap of {MAX_PENDING} pending handshakes, {} out of descriptors, {} past the {HANDSHAKE_MS} ms handshake \
             deadline, {} failed the handshake)",
            self.total(),
            self.cap,
            self.descriptors,
            self.deadline,
            self.failed
        )
    }
}

enum Stage {
    /// `HELLO` sent; waiting for the client's nonce.
    Nonce(Server),
    /// The server's proof sent; waiting for the client's.
    Proof(Server),
    /// The client proved the secret; waiting for its sealed `JOIN`.
    Join(Sealer, Opener),
}

/// A connection in its handshake.
struct Pending {
    stream: TcpStream,
    peer: SocketAddr,
    since: Instant,
    stage: Option<Stage>,
    /// The frame being read (head, then payload).
    buf: Vec<u8>,
}

/// What one turn did to a connection.
enum Step {
    Keep,
    Drop(&'static str, String),
    Done(Arrival),
}

impl Pending {
    /// Sent its nonce: a peer that speaks the protocol (a rank's first round trip).
    fn progressed(&self) -> bool {
        !matches!(self.stage, Some(Stage::Nonce(_)))
    }

    /// Proved the secret: never evicted, only cut at the deadline.
    fn member(&self) -> bool {
        matches!(self.stage, Some(Stage::Join(..)))
    }

    /// Reads what the socket holds of the current frame; a whole frame (head and payload) when
    /// it is complete. Never buffers more than one frame of at most `cap` payload bytes.
    fn read_frame(&mut self, cap: usize) -> Result<Option<Vec<u8>>, String> {
        loop {
            let want = if self.buf.len() < 5 {
                5
            } else {
                let len = u32::from_le_bytes(self.buf[..4].try_into().expect("4 bytes")) as usize;
                if len > cap {
                    return Err(format!("a frame of {len} bytes is above the cap"));
                }
                5 + len
            };
            if self.buf.len() >= 5 && self.buf.len() == want {
                return Ok(Some(std::mem::take(&mut self.buf)));
            }
            let have = self.buf.len();
            self.buf.resize(want, 0);
            match self.stream.read(&mut self.buf[have..]) {
                Ok(0) => return Err("connection closed".into()),
                Ok(n) => self.buf.truncate(have + n),
                Err(e) => {
                    self.buf.truncate(have);
                    match e.kind() {
                        io::ErrorKind::WouldBlock => return Ok(None),
                        io::ErrorKind::Interrupted => {}
                        _ => return Err(e.to_string()),
                    }
                }
            }
        }
    }

    /// Writes a whole handshake frame on the non-blocking socket (a few dozen bytes into a
    /// fresh socket's buffer: a peer that cannot take them is dropped).
    fn write_frame(&mut self, k: u8, payload: &[u8]) -> Result<(), String> {
        let mut f = Vec::with_capacity(5 + payload.len());
        f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        f.push(k);
        f.extend_from_slice(payload);
        match self.stream.write(&f) {
            Ok(n) if n == f.len() => Ok(()),
            Ok(_) => Err("the peer does not read".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Serves what arrived.
    fn step(&mut self, secret: &[u8; SECRET_BYTES]) -> Step {
        loop {
            let cap = if self.member() { JOIN_CAP + TAG } else { MAX_HANDSHAKE_FRAME };
            let frame = match self.read_frame(cap) {
                Ok(Some(f)) => f,
                Ok(None) => return Step::Keep,
                Err(e) => return Step::Drop("failed the handshake", format!("{}: {e}", self.peer)),
            };
            let (k, payload) = (frame[4], &frame[5..]);
            let peer = self.peer.to_string();
            let stage = self.stage.take().expect("a stage between turns");
            let bad = |e: String| Step::Drop("failed the handshake", format!("{peer}: {e}"));
            match stage {
                Stage::Nonce(mut hs) => {
                    if k != kind::NONCE {
                        return bad(format!("expected a frame of kind {}, got kind {k}", kind::NONCE));
                    }
                    let proof = match hs.on_nonce(secret, payload) {
                        Ok(p) => p,
                        Err(e) => return bad(e),
                    };
                    if let Err(e) = self.write_frame(kind::PROOF, &proof) {
                        return bad(e);
                    }
                    self.stage = Some(Stage::Proof(hs));
                }
                Stage::Proof(hs) => {
                    if k != kind::PROOF {
                        return bad(format!("expected a frame of kind {}, got kind {k}", kind::PROOF));
                    }
                    match hs.on_proof(secret, payload, &peer) {
                        Ok(Proven::Keys(tx, rx)) => self.stage = Some(Stage::Join(tx, rx)),
                        Ok(Proven::Refused(why)) => return Step::Done(Err(why)),
                        Err(e) => return bad(e),
                    }
                }
                Stage::Join(tx, mut rx) => {
                    let join = match rx.open(&mut io::Cursor::new(&frame), JOIN_CAP) {
                        Ok((kind::JOIN, join)) => join,
                        Ok((k, _)) => return bad(format!("expected a frame of kind {}, got kind {k}", kind::JOIN)),
                        Err(e) => return bad(e.to_string()),
                    };
                    let Ok(stream) = self.stream.try_clone() else {
                        return Step::Drop("closed at once (out of descriptors)", peer);
                    };
                    if stream.set_nonblocking(false).is_err() {
                        return bad("the socket cannot block".into());
                    }
                    return Step::Done(Ok((Secured { stream, tx, rx }, join)));
                }
            }
        }
    }
}

fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

/// The connection to evict: among those that have not proved the secret, one of the source
/// address holding the most of them, the oldest that has not sent its nonce, else its oldest.
fn victim(pending: &[Pending]) -> Option<usize> {
    let mut sources: Vec<(IpAddr, usize)> = Vec::new();
    for p in pending.iter().filter(|p| !p.member()) {
        match sources.iter_mut().find(|s| s.0 == p.peer.ip()) {
            Some(s) => s.1 += 1,
            None => sources.push((p.peer.ip(), 1)),
        }
    }
    let (ip, _) = *sources.iter().max_by_key(|s| s.1)?;
    let of_ip = |p: &&Pending| !p.member() && p.peer.ip() == ip;
    let pick = pending.iter().position(|p| of_ip(&p) && !p.progressed());
    pick.or_else(|| pending.iter().position(|p| of_ip(&p)))
}

/// A listener whose accepted connections are authenticated by one event-loop thread (a
/// stranger that stays silent, trickles bytes, knows no secret, sends garbage or an oversized
/// frame is dropped without delaying anyone); authenticated connections with their first
/// (sealed) frame, a `JOIN`, arrive on a channel, and so does the refusal of a holder of the
/// secret that may not join (another version, job or team size).
///
/// Bounds: a handshake (proof and `JOIN`) gets [`HANDSHAKE_MS`] in all, then it is cut; at most
/// [`MAX_PENDING`] handshakes at once (beyond, one is evicted, fairly by source, see
/// `victim`); out of descriptors, the loop sheds pending connections that have not proved the
/// secret (the idle ones first) so that a rank in the backlog gets in, lowers its cap so the
/// process keeps a few descriptors, and rests when there is nothing to shed. One thread,
/// whatever the number of connections. Drops are logged as one line per interval with counts
/// (`droplog.rs`).
pub struct Acceptor {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    rx: mpsc::Receiver<Arrival>,
    shed: Arc<Mutex<Shed>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Acceptor {
    /// Starts accepting on `listener` the ranks of `bind` that hold `secret`.
    pub fn start(
        listener: TcpListener,
        secret: [u8; SECRET_BYTES],
        bind: Bind,
        what: &'static str,
    ) -> io::Result<Acceptor> {
        // Its warnings must be seen also in a process that only makes an id (nothing else
        // there starts the logging; a subscriber the host program set wins).
        crate::logging::init();
        let secret = Zeroizing::new(secret);
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let flag = stop.clone();
        let (ready_tx, ready_rx) = mpsc::channel::<()>();
        // Allocated here: the loop allocates nothing until a connection arrives (see below).
        let log = DropLog::new(format!("{what} at {addr}"));
        let info = Info::local(&bind);
        let shed = Arc::new(Mutex::new(Shed::default()));
        let counts = shed.clone();
        let thread = std::thread::Builder::new().name("mcast-accept".into()).spawn(move || {
            // The sender lives as long as the thread: dropping it could free the channel
            // (an allocator call) just when the caller forks.
            let _ = ready_tx.send(());
            // Oldest first. Empty, it holds no allocation.
            let mut pending: Vec<Pending> = Vec::new();
            let mut fds: Vec<libc::pollfd> = Vec::new();
            let mut cap = MAX_PENDING;
            let handshake = Duration::from_millis(HANDSHAKE_MS);
            let note = |reason: &'static str, detail: String| {
                {
                    let mut c = counts.lock();
                    match reason {
                        "evicted at the cap of pending handshakes" => c.cap += 1,
                        "shed (out of descriptors)" => c.descriptors += 1,
                        "past the handshake deadline" => c.deadline += 1,
                        _ => c.failed += 1,
                    }
                }
                log.note(reason, detail);
            };
            while !flag.load(Ordering::Relaxed) {
                pending.retain(|p| {
                    let late = p.since.elapsed() >= handshake;
                    if late {
                        note("past the handshake deadline", format!("{}, {HANDSHAKE_MS} ms", p.peer));
                    }
                    !late
                });
                log.flush_if_due();
                let next_deadline = pending.iter().map(|p| handshake.saturating_sub(p.since.elapsed())).min();
                let wait = next_deadline.unwrap_or(Duration::from_millis(50)).min(Duration::from_millis(50));
                let ms = wait.as_millis().max(1) as libc::c_int;
                let listen = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                let readable = if pending.is_empty() {
                    let mut p = listen;
                    // SAFETY: one valid pollfd.
                    unsafe { libc::poll(&mut p, 1, ms) };
                    p.revents != 0
                } else {
                    fds.clear();
                    fds.push(listen);
                    fds.extend(pending.iter().map(|p| libc::pollfd {
                        fd: p.stream.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    }));
                    // SAFETY: `fds` holds fds.len() valid pollfds.
                    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
                    // Serve what arrived on the connections (indices as polled).
                    let mut i = 0;
                    let mut k = 1;
                    while i < pending.len() {
                        let ready = fds[k].revents != 0;
                        k += 1;
                        if !ready {
                            i += 1;
                            continue;
                        }
                        match pending[i].step(&secret) {
                            Step::Keep => i += 1,
                            Step::Drop(reason, detail) => {
                                pending.remove(i);
                                note(reason, detail);
                            }
                            Step::Done(arrival) => {
                                let p = pending.remove(i);
                                if let Err(why) = &arrival {
                                    tracing::warn!("{what} at {addr}: refused {}: {why}", p.peer);
                                }
                                let _ = tx.send(arrival);
                            }
                        }
                    }
                    fds[0].revents != 0
                };
                if !readable {
                    continue;
                }
                let mut rest = false;
                for _ in 0..ACCEPT_BURST {
                    match listener.accept() {
                        Ok((s, peer)) => {
                            let _ = s.set_nodelay(true);
                            let hello = Server::hello(&info);
                            let mut p =
                                Pending { stream: s, peer, since: Instant::now(), stage: None, buf: Vec::new() };
                            let sent = match hello {
                                Ok((hs, hello)) => {
                                    p.stage = Some(Stage::Nonce(hs));
                                    match p.stream.set_nonblocking(true) {
                                        Ok(()) => p.write_frame(kind::HELLO, &hello),
                                        Err(e) => Err(e.to_string()),
                                    }
                                }
                                Err(e) => Err(e.to_string()),
                            };
                            if let Err(e) = sent {
                                note("failed the handshake", format!("{peer}: {e}"));
                                continue;
                            }
                            pending.push(p);
                            while pending.len() > cap {
                                let Some(v) = victim(&pending) else { break };
                                let p = pending.remove(v);
                                note("evicted at the cap of pending handshakes", format!("{}", p.peer));
                            }
                        }
                        Err(e) if out_of_descriptors(&e) => {
                            // Leave the process a few descriptors, and shed an idle handshake
                            // so that the connection waiting in the backlog (a rank's, maybe)
                            // can be accepted.
                            cap = cap.min(pending.len().saturating_sub(FD_RESERVE).max(FD_FLOOR));
                            let mut freed = false;
                            while pending.len() > cap || !freed {
                                let Some(v) = victim(&pending) else { break };
                                let p = pending.remove(v);
                                note("shed (out of descriptors)", format!("{}: {e}", p.peer));
                                freed = true;
                            }
                            if !freed {
                                note("closed at once (out of descriptors)", e.to_string());
                                rest = true;
                                break;
                            }
                        }
                        // Nothing waiting (`WouldBlock`), or a connection reset before it was
                        // accepted.
                        Err(_) => break,
                    }
                }
                if rest {
                    std::thread::sleep(ACCEPT_BACKOFF);
                }
            }
        })?;
        // Return only once the thread runs its loop, which allocates nothing until a
        // connection arrives: a process that forks right after making a unique id (a common
        // way to start ranks) then never forks while this thread holds an allocator lock.
        let _ = ready_rx.recv();
        Ok(Acceptor { addr, stop, rx, shed, thread: Some(thread) })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The connections it closed so far before they proved the secret, by reason.
    pub fn shed(&self) -> Shed {
        *self.shed.lock()
    }

    /// The next arrival (an authenticated connection and its `JOIN`, or an authenticated
    /// refusal), or `None` at the deadline.
    pub fn next(&self, deadline: super::Deadline) -> Option<Arrival> {
        match deadline.0 {
            None => self.rx.recv().ok(),
            Some(_) => self.rx.recv_timeout(deadline.remaining_or(Duration::ZERO)).ok(),
        }
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
