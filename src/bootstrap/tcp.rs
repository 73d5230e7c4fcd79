//! TCP transport of the bootstrap: addresses, listeners, length-prefixed frames with a hard
//! size cap, every connect, read and write bounded by a deadline, and the mutual
//! challenge/response that proves the team's secret before any other byte is trusted.
//!
//! Frame: `u32` payload length (little-endian), `u8` kind, payload. A length above the cap
//! is refused before anything is allocated.
//!
//! Handshake (the listener is the server): server sends `HELLO` = magic + 32-byte nonce `ns`;
//! client sends `PROOF` = its nonce `nc` + HMAC-SHA256(secret, "mcast client" | ns | nc);
//! server checks it and sends `PROOF` = HMAC-SHA256(secret, "mcast server" | nc | ns); the
//! client checks that. Only then does either side read a frame of any other kind.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::droplog::DropLog;
use super::{BootError, Deadline};

/// Bytes of the team secret.
pub const SECRET_BYTES: usize = 32;
/// Largest frame payload between authenticated members.
pub const MAX_FRAME: usize = 1 << 20;
/// Largest frame payload before authentication.
pub const MAX_HANDSHAKE_FRAME: usize = 128;
/// How long a connection may take to prove the secret.
pub const HANDSHAKE_MS: u64 = 2000;

const HELLO_MAGIC: &[u8; 8] = b"MCASTBS1";
const NONCE: usize = 32;
const MAC: usize = 32;

/// Frame kinds.
pub mod kind {
    /// Server's challenge.
    pub const HELLO: u8 = 1;
    /// A proof (client: nonce + mac; server: mac).
    pub const PROOF: u8 = 2;
    /// A rank announces itself (to the root or the hub).
    pub const JOIN: u8 = 3;
    /// The answer to a join.
    pub const WELCOME: u8 = 4;
    /// A rank's part of an exchange (to the hub).
    pub const EXCH: u8 = 10;
    /// Every rank's part (from the hub).
    pub const RESULT: u8 = 11;
    /// The exchange failed (from the hub): kind + message.
    pub const FAIL: u8 = 12;
    /// The team was aborted: reason.
    pub const ABORT: u8 = 13;
}

/// Why a frame could not be read.
#[derive(Debug)]
pub enum FrameError {
    /// The peer closed the connection cleanly between frames.
    Closed,
    /// The length prefix is above the cap.
    TooLarge(usize),
    /// A read failed (timeout, reset, short frame).
    Io(io::Error),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Closed => write!(f, "connection closed"),
            FrameError::TooLarge(n) => write!(f, "a frame of {n} bytes is above the cap"),
            FrameError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// Reads one frame of at most `cap` payload bytes: `(kind, payload)`. Allocates at most `cap`
/// bytes, whatever the stream holds.
pub fn read_frame(r: &mut impl Read, cap: usize) -> Result<(u8, Vec<u8>), FrameError> {
    let mut head = [0u8; 5];
    let mut got = 0;
    while got < head.len() {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Err(FrameError::Closed),
            Ok(0) => return Err(FrameError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
    if len > cap {
        return Err(FrameError::TooLarge(len));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).map_err(FrameError::Io)?;
    Ok((head[4], payload))
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, kind: u8, payload: &[u8]) -> io::Result<()> {
    let mut buf = Vec::with_capacity(5 + payload.len());
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.push(kind);
    buf.extend_from_slice(payload);
    w.write_all(&buf)
}

/// A stream whose every read waits at most the time left before one deadline: a peer that
/// sends a byte at a time is cut at the deadline instead of getting a fresh timeout per byte.
struct UntilDeadline<'a> {
    s: &'a TcpStream,
    deadline: Deadline,
}

impl Read for UntilDeadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.remaining_or(Duration::from_secs(3600));
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the deadline passed"));
        }
        self.s.set_read_timeout(Some(left))?;
        (&mut &*self.s).read(buf).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                io::Error::new(io::ErrorKind::TimedOut, "no complete frame before the deadline")
            }
            _ => e,
        })
    }
}

/// Reads a frame of `want` kind before `deadline` (the whole frame, not each read).
pub fn expect_frame(s: &mut TcpStream, want: u8, cap: usize, deadline: Deadline) -> Result<Vec<u8>, String> {
    let (k, p) = read_frame(&mut UntilDeadline { s, deadline }, cap).map_err(|e| e.to_string())?;
    if k != want {
        return Err(format!("expected a frame of kind {want}, got kind {k}"));
    }
    Ok(p)
}

fn mac(secret: &[u8; SECRET_BYTES], who: &[u8], a: &[u8], b: &[u8]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
    m.update(who);
    m.update(a);
    m.update(b);
    m
}

/// `n` random bytes from the kernel.
pub fn random_bytes(out: &mut [u8]) -> io::Result<()> {
    let mut got = 0;
    while got < out.len() {
        // SAFETY: writes at most len - got bytes into the slice.
        let n = unsafe { libc::getrandom(out[got..].as_mut_ptr().cast(), out.len() - got, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        got += n as usize;
    }
    Ok(())
}

/// Server side of the handshake on a fresh connection, bounded by `deadline`.
pub fn prove_server(s: &mut TcpStream, secret: &[u8; SECRET_BYTES], deadline: Deadline) -> Result<(), String> {
    s.set_write_timeout(Some(deadline.remaining_or(Duration::from_secs(5)).max(Duration::from_millis(1))))
        .map_err(|e| e.to_string())?;
    let mut ns = [0u8; NONCE];
    random_bytes(&mut ns).map_err(|e| e.to_string())?;
    let mut hello = HELLO_MAGIC.to_vec();
    hello.extend_from_slice(&ns);
    write_frame(s, kind::HELLO, &hello).map_err(|e| e.to_string())?;
    let p = expect_frame(s, kind::PROOF, MAX_HANDSHAKE_FRAME, deadline)?;
    if p.len() != NONCE + MAC {
        return Err(format!("a proof of {} bytes (expected {})", p.len(), NONCE + MAC));
    }
    let (nc, their) = p.split_at(NONCE);
    mac(secret, b"mcast client", &ns, nc)
        .verify_slice(their)
        .map_err(|_| "the connection does not know the team's secret".to_string())?;
    let mine = mac(secret, b"mcast server", nc, &ns).finalize().into_bytes();
    write_frame(s, kind::PROOF, &mine).map_err(|e| e.to_string())
}

/// Client side of the handshake, bounded by `deadline`.
pub fn prove_client(s: &mut TcpStream, secret: &[u8; SECRET_BYTES], deadline: Deadline) -> Result<(), String> {
    s.set_write_timeout(Some(deadline.remaining_or(Duration::from_secs(5)).max(Duration::from_millis(1))))
        .map_err(|e| e.to_string())?;
    let hello = expect_frame(s, kind::HELLO, MAX_HANDSHAKE_FRAME, deadline)?;
    if hello.len() != HELLO_MAGIC.len() + NONCE || &hello[..HELLO_MAGIC.len()] != HELLO_MAGIC {
        return Err("the listener is not an mcast bootstrap of this version".into());
    }
    let ns = &hello[HELLO_MAGIC.len()..];
    let mut nc = [0u8; NONCE];
    random_bytes(&mut nc).map_err(|e| e.to_string())?;
    let mut proof = nc.to_vec();
    proof.extend_from_slice(&mac(secret, b"mcast client", ns, &nc).finalize().into_bytes());
    write_frame(s, kind::PROOF, &proof).map_err(|e| e.to_string())?;
    let theirs = expect_frame(s, kind::PROOF, MAX_HANDSHAKE_FRAME, deadline)?;
    mac(secret, b"mcast server", &nc, ns)
        .verify_slice(&theirs)
        .map_err(|_| "the listener does not know the team's secret (a stale or foreign id?)".to_string())
}

/// Connects to `addr` and proves the secret, retrying refused connections (the listener may
/// not be up yet) until `deadline`.
pub fn connect(addr: SocketAddr, secret: &[u8; SECRET_BYTES], deadline: Deadline) -> Result<TcpStream, String> {
    let mut last = String::new();
    loop {
        let left = deadline.remaining_or(Duration::from_secs(10));
        if deadline.passed() || left.is_zero() {
            return Err(format!("cannot reach the bootstrap at {addr}: {last}"));
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
            Ok(mut s) => {
                let _ = s.set_nodelay(true);
                let hs = deadline.min(Duration::from_millis(HANDSHAKE_MS * 5));
                match prove_client(&mut s, secret, hs) {
                    Ok(()) => return Ok(s),
                    Err(e) => return Err(format!("bootstrap handshake with {addr}: {e}")),
                }
            }
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Most connections in their handshake at once on one listener: above the largest team (72
/// ranks, which may all reach the root at once). A connection beyond it evicts the oldest one
/// still in its handshake: a stranger holding connections open cannot lock out a rank, whose
/// handshake takes a round trip.
pub const MAX_PENDING: usize = 128;
/// Most handshake threads alive at once (evicted ones take a moment to end); a connection
/// beyond it is closed at once.
const MAX_HANDSHAKE_THREADS: usize = MAX_PENDING + MAX_PENDING / 4;
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
/// dropped without delaying anyone); authenticated connections with their first frame, a
/// `JOIN`, arrive on a channel.
///
/// Bounds: a handshake (proof and `JOIN`) gets [`HANDSHAKE_MS`] in all, after which the accept
/// loop cuts it whatever its reads do; at most [`MAX_PENDING`] handshakes run at once (a new
/// connection evicts the oldest); when the process is out of descriptors the loop rests instead
/// of spinning, and the connections wait in the kernel's backlog. Drops are logged as one line
/// per interval with counts ([`super::droplog`]).
pub struct Acceptor {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    rx: mpsc::Receiver<(TcpStream, Vec<u8>)>,
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
                    if threads.load(Ordering::Acquire) >= MAX_HANDSHAKE_THREADS {
                        log.note("closed at once (too many handshake threads)", peer.to_string());
                        continue;
                    }
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
                            let mut s = s;
                            let _ = s.set_nonblocking(false);
                            let _ = s.set_nodelay(true);
                            let deadline = Deadline::after_ms(HANDSHAKE_MS);
                            let r = prove_server(&mut s, &secret, deadline)
                                .and_then(|()| expect_frame(&mut s, kind::JOIN, MAX_HANDSHAKE_FRAME * 4, deadline));
                            let mine = state.compare_exchange(LIVE, DONE, Ordering::AcqRel, Ordering::Acquire).is_ok();
                            match r {
                                Ok(join) if mine => {
                                    let _ = tx.send((s, join));
                                }
                                Ok(_) => {}
                                Err(e) => {
                                    if mine {
                                        hs_log.note("failed the handshake", format!("{peer}: {e}"));
                                    }
                                    let _ = s.shutdown(Shutdown::Both);
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
    pub fn next(&self, deadline: Deadline) -> Option<(TcpStream, Vec<u8>)> {
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

/// Binds a listener on `ip` (port 0: any).
pub fn listen(addr: SocketAddr) -> Result<TcpListener, BootError> {
    TcpListener::bind(addr).map_err(|e| {
        BootError::new(
            super::Kind::InvalidArgument,
            format!(
                "cannot listen on {addr} for the bootstrap: {e} (check MCAST_BOOTSTRAP_ADDR / MCAST_SOCKET_IFNAME)"
            ),
        )
    })
}

/// One interface address.
#[derive(Clone, Debug)]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// Its address.
    pub ip: IpAddr,
    /// `IFF_LOOPBACK`.
    pub loopback: bool,
}

/// Every address of every interface that is up (IPv4 and IPv6, no link-local IPv6).
pub fn interfaces() -> Vec<Interface> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` or fails; freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut p = head;
    while !p.is_null() {
        // SAFETY: a node of the list getifaddrs returned.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: a NUL-terminated name.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        // SAFETY: the family field of a valid sockaddr.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let ip = if family == libc::AF_INET {
            // SAFETY: an AF_INET sockaddr is a sockaddr_in.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
        } else if family == libc::AF_INET6 {
            // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6.
            let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            if ip.segments()[0] & 0xffc0 == 0xfe80 {
                continue;
            }
            IpAddr::V6(ip)
        } else {
            continue;
        };
        out.push(Interface { name, ip, loopback: ifa.ifa_flags & libc::IFF_LOOPBACK as u32 != 0 });
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// The address to listen on: the interface named by `MCAST_SOCKET_IFNAME` (a name or a
/// prefix; IPv4 preferred over IPv6), else the first non-loopback interface that is up, else
/// loopback.
pub fn pick_ip() -> Result<IpAddr, BootError> {
    pick_ip_from(&interfaces(), std::env::var("MCAST_SOCKET_IFNAME").ok().as_deref())
}

/// [`pick_ip`] over a given interface list.
pub fn pick_ip_from(ifs: &[Interface], wanted: Option<&str>) -> Result<IpAddr, BootError> {
    let best = |c: Vec<&Interface>| c.iter().find(|i| i.ip.is_ipv4()).or_else(|| c.first()).map(|i| i.ip);
    if let Some(w) = wanted.filter(|w| !w.is_empty()) {
        let m: Vec<&Interface> = ifs.iter().filter(|i| i.name.starts_with(w)).collect();
        return best(m).ok_or_else(|| {
            let names: Vec<&str> = ifs.iter().map(|i| i.name.as_str()).collect();
            BootError::new(
                super::Kind::InvalidArgument,
                format!("MCAST_SOCKET_IFNAME={w} matches no interface that is up with an address (up: {names:?})"),
            )
        });
    }
    Ok(best(ifs.iter().filter(|i| !i.loopback).collect())
        .or_else(|| best(ifs.iter().filter(|i| i.loopback).collect()))
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)))
}

impl Deadline {
    /// A deadline `ms` from now.
    pub fn after_ms(ms: u64) -> Deadline {
        Deadline(Some(Instant::now() + Duration::from_millis(ms)))
    }

    /// The earlier of this deadline and `d` from now.
    pub fn min(self, d: Duration) -> Deadline {
        let t = Instant::now() + d;
        Deadline(Some(self.0.map_or(t, |x| x.min(t))))
    }

    /// Time left, or `forever` for no deadline.
    pub fn remaining_or(self, forever: Duration) -> Duration {
        self.0.map_or(forever, |t| t.saturating_duration_since(Instant::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_choice() {
        let ifs = vec![
            Interface { name: "lo".into(), ip: "127.0.0.1".parse().unwrap(), loopback: true },
            Interface { name: "eth0".into(), ip: "fd00::1".parse().unwrap(), loopback: false },
            Interface { name: "eth0".into(), ip: "10.0.0.1".parse().unwrap(), loopback: false },
            Interface { name: "ib0".into(), ip: "10.1.0.1".parse().unwrap(), loopback: false },
        ];
        assert_eq!(pick_ip_from(&ifs, None).unwrap(), "10.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(pick_ip_from(&ifs, Some("ib")).unwrap(), "10.1.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(pick_ip_from(&ifs, Some("lo")).unwrap(), "127.0.0.1".parse::<IpAddr>().unwrap());
        assert!(pick_ip_from(&ifs, Some("wlan")).unwrap_err().message.contains("wlan"));
        assert_eq!(pick_ip_from(&ifs[..1], None).unwrap(), "127.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(pick_ip_from(&[], None).unwrap(), "127.0.0.1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn handshake_accepts_the_secret_and_refuses_others() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let acc = Acceptor::start(l, [7; SECRET_BYTES], "test").unwrap();
        // Wrong secret: the client sees the server's proof fail or the connection close.
        assert!(connect(addr, &[8; SECRET_BYTES], Deadline::after_ms(3000)).is_err());
        let mut s = connect(addr, &[7; SECRET_BYTES], Deadline::after_ms(3000)).unwrap();
        write_frame(&mut s, kind::JOIN, b"hi").unwrap();
        let (_, join) = acc.next(Deadline::after_ms(3000)).unwrap();
        assert_eq!(join, b"hi");
        assert!(acc.next(Deadline::after_ms(50)).is_none());
    }
}
