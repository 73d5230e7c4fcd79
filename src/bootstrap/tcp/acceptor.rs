//! The listener's accept loop: each connection's handshake on its own thread, bounded in time,
//! in number and in threads.

use std::collections::VecDeque;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::droplog::DropLog;
use super::handshake::prove_server;
use super::sealed::Secured;
use super::{kind, Deadline, HANDSHAKE_MS, MAX_HANDSHAKE_FRAME, SECRET_BYTES};

/// Most connections in their handshake at once on one listener: above the largest team (72
/// ranks, which may all reach the root at once). A connection beyond it evicts the oldest one
/// still in its handshake: a stranger holding connections open cannot lock out a rank, whose
/// handshake takes a round trip.
pub const MAX_PENDING: usize = 128;
/// Most handshake threads alive at once (evicted ones take a moment to end); beyond it the
/// connections wait in the kernel's backlog until some have ended.
const MAX_HANDSHAKE_THREADS: usize = MAX_PENDING + MAX_PENDING / 4;
/// How long the accept loop rests while the handshake threads are at their cap.
const THREAD_BACKOFF: Duration = Duration::from_millis(5);
/// Tests only: how long a handshake thread whose connection was cut lingers before it ends, as
/// on a loaded machine where evicted threads are slow to be scheduled (`flood_tests.rs`).
#[cfg(test)]
pub(crate) static CUT_LINGER_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// How long the accept loop rests when the process is out of descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Stack of a handshake thread (a proof, a frame, a log line).
const HANDSHAKE_STACK: usize = 256 << 10;

/// A connection in its handshake, as the accept loop tracks it.
struct Pending {
    since: Instant,
    /// A second handle on the socket, to cut it (`shutdown` wakes the handshake's read).
    stream: TcpStream,
    /// `LIVE` until the handshake thread (`DONE`) or the accept loop (`CUT`) claims it.
    state: Arc<AtomicU8>,
}

const LIVE: u8 = 0;
const DONE: u8 = 1;
const CUT: u8 = 2;

impl Pending {
    /// Cuts the connection unless its handshake already finished; whether it did.
    fn cut(&self) -> bool {
        let won = self.state.compare_exchange(LIVE, CUT, Ordering::AcqRel, Ordering::Acquire).is_ok();
        if won {
            let _ = self.stream.shutdown(Shutdown::Both);
        }
        won
    }
}

/// Counts a live handshake thread; the count drops when the thread ends.
struct Live(Arc<AtomicUsize>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

/// A listener whose accepted connections are authenticated on their own threads (a stranger
/// that stays silent, trickles bytes, knows no secret, sends garbage or an oversized frame is
/// dropped without delaying anyone); authenticated connections with their first (sealed)
/// frame, a `JOIN`, arrive on a channel.
///
/// Bounds: a handshake (proof and `JOIN`) gets [`HANDSHAKE_MS`] in all, after which the accept
/// loop cuts it whatever its reads do; at most [`MAX_PENDING`] handshakes run at once (a new
/// connection evicts the oldest); when the process is out of descriptors, or evicted handshakes
/// have not ended yet and the threads are at their cap, the loop rests instead of spinning, and
/// the connections wait in the kernel's backlog. Drops are logged as one line per interval with
/// counts (`droplog.rs`).
pub struct Acceptor {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    rx: mpsc::Receiver<(Secured, Vec<u8>)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Acceptor {
    /// Starts accepting on `listener`.
    pub fn start(listener: TcpListener, secret: [u8; SECRET_BYTES], what: &'static str) -> io::Result<Acceptor> {
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let flag = stop.clone();
        let (ready_tx, ready_rx) = mpsc::channel::<()>();
        // Allocated here: the loop allocates nothing until a connection arrives (see below).
        let log = Arc::new(DropLog::new(format!("{what} at {addr}")));
        let threads = Arc::new(AtomicUsize::new(0));
        let thread = std::thread::Builder::new().name("mcast-accept".into()).spawn(move || {
            use std::os::fd::AsRawFd;
            // The sender lives as long as the thread: dropping it could free the channel
            // (an allocator call) just when the caller forks.
            let _ = ready_tx.send(());
            // Oldest first. Empty, it holds no allocation.
            let mut pending: VecDeque<Pending> = VecDeque::new();
            let handshake = Duration::from_millis(HANDSHAKE_MS);
            while !flag.load(Ordering::Relaxed) {
                for p in &pending {
                    if p.since.elapsed() >= handshake && p.cut() {
                        log.note("past the handshake deadline", format!("{HANDSHAKE_MS} ms"));
                    }
                }
                pending.retain(|p| p.state.load(Ordering::Acquire) == LIVE);
                log.flush_if_due();
                let mut p = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut p, 1, 50) };
                // Drain the backlog (a burst must not overflow it), then look at the deadlines.
                for _ in 0..MAX_PENDING {
                    if threads.load(Ordering::Acquire) >= MAX_HANDSHAKE_THREADS {
                        // Evicted handshakes are still ending (on a loaded machine, a while):
                        // the connections wait in the kernel's backlog until they have, as when
                        // out of descriptors. Closing them instead closed a rank that connected
                        // behind a flood, which eviction exists to let through.
                        std::thread::sleep(THREAD_BACKOFF);
                        break;
                    }
                    let (s, peer) = match listener.accept() {
                        Ok(x) => x,
                        Err(e) if out_of_descriptors(&e) => {
                            // The connection stays in the backlog and is served once descriptors
                            // free up; closing it instead would fail a rank's connect outright.
                            log.note("not accepted while the process is out of descriptors", e.to_string());
                            std::thread::sleep(ACCEPT_BACKOFF);
                            break;
                        }
                        // Nothing waiting (`WouldBlock`), or a connection reset before it was
                        // accepted.
                        Err(_) => break,
                    };
                    if pending.len() >= MAX_PENDING {
                        if let Some(old) = pending.pop_front() {
                            if old.cut() {
                                log.note("evicted at the cap of pending handshakes", format!("for {peer}"));
                            }
                        }
                    }
                    let watch = match s.try_clone() {
                        Ok(w) => w,
                        Err(e) => {
                            log.note("closed at once (out of descriptors)", e.to_string());
                            std::thread::sleep(ACCEPT_BACKOFF);
                            break;
                        }
                    };
                    let state = Arc::new(AtomicU8::new(LIVE));
                    pending.push_back(Pending { since: Instant::now(), stream: watch, state: state.clone() });
                    threads.fetch_add(1, Ordering::AcqRel);
                    let live = Live(threads.clone());
                    let (tx, hs_log) = (tx.clone(), log.clone());
                    let spawned = std::thread::Builder::new()
                        .name("mcast-handshake".into())
                        .stack_size(HANDSHAKE_STACK)
                        .spawn(move || {
                            let _live = live;
                            let _ = s.set_nonblocking(false);
                            let _ = s.set_nodelay(true);
                            let deadline = Deadline::after_ms(HANDSHAKE_MS);
                            // On failure the stream is dropped, which closes it.
                            let r = prove_server(s, &secret, deadline).and_then(|mut c| {
                                let join = c.expect(kind::JOIN, MAX_HANDSHAKE_FRAME * 4, deadline)?;
                                Ok((c, join))
                            });
                            let mine = state.compare_exchange(LIVE, DONE, Ordering::AcqRel, Ordering::Acquire).is_ok();
                            #[cfg(test)]
                            if !mine {
                                std::thread::sleep(Duration::from_millis(CUT_LINGER_MS.load(Ordering::Relaxed)));
                            }
                            match r {
                                Ok(joined) if mine => {
                                    let _ = tx.send(joined);
                                }
                                Ok(_) => {}
                                Err(e) => {
                                    if mine {
                                        hs_log.note("failed the handshake", format!("{peer}: {e}"));
                                    }
                                }
                            }
                        });
                    if let Err(e) = spawned {
                        // The closure, and with it the connection, was dropped.
                        if let Some(p) = pending.pop_back() {
                            p.cut();
                        }
                        log.note("closed at once (no thread for the handshake)", e.to_string());
                        std::thread::sleep(ACCEPT_BACKOFF);
                        break;
                    }
                }
            }
            for p in &pending {
                p.cut();
            }
        })?;
        // Return only once the thread runs its loop, which allocates nothing until a
        // connection arrives: a process that forks right after making a unique id (a common
        // way to start ranks) then never forks while this thread holds an allocator lock.
        let _ = ready_rx.recv();
        Ok(Acceptor { addr, stop, rx, thread: Some(thread) })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The next authenticated connection and its `JOIN`, or `None` at the deadline.
    pub fn next(&self, deadline: Deadline) -> Option<(Secured, Vec<u8>)> {
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
