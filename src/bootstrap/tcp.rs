//! TCP transport of the bootstrap: addresses, listeners, length-prefixed frames with a hard
//! size cap, every connect, read and write bounded by a deadline, the handshake that proves
//! the team's secret before any other byte is trusted, and the sealed channel after it.
//!
//! Frame: `u32` payload length (little-endian), `u8` kind, payload. A length above the cap
//! is refused before anything is allocated.
//!
//! Handshake (the listener is the server, and it proves itself first):
//! 1. server → `HELLO` = magic + its fresh 32-byte nonce `ns`;
//! 2. client → `NONCE` = its fresh 32-byte nonce `nc`, nothing derived from the secret;
//! 3. server → `PROOF` = HMAC-SHA256(secret, "mcast bootstrap server proof" | magic | ns | nc);
//! 4. the client checks it (in constant time) and only if it holds sends `PROOF` =
//!    HMAC-SHA256(secret, "mcast bootstrap client proof" | magic | ns | nc), which the server
//!    checks the same way.
//!
//! Both nonces are fresh on every connection, so a recorded proof is worth nothing on
//! another; the labels keep a server's proof from passing as a client's. SECURITY: a client
//! proves nothing to a listener that has not proved the secret, so a fake listener (or one
//! answering in the real one's place) learns no MAC to test guesses of the secret against.
//! A stranger who connects to a real listener, or who records a handshake, does learn a MAC
//! over known nonces and could test guesses offline; that is acceptable because the secret is
//! not a password: a root-mode id's secret is 256 random bits from the kernel, and the
//! environment mode's secret is stretched from `MCAST_BOOTSTRAP_SECRET` by a slow KDF, so no
//! dictionary is worth running.
//!
//! After the handshake every frame either way is sealed ([`Sealer`], [`Opener`]): the payload
//! encrypted and authenticated with ChaCha20-Poly1305, the 5-byte head (length and kind) as
//! associated data, one key per direction from HKDF-SHA256 (key: the secret; salt: `ns | nc`;
//! info: the direction), and the direction's 64-bit frame count as the nonce, so a key never
//! sees a nonce twice and a frame altered, replayed, reordered, dropped before a later one, or
//! made up fails to open. On the wire the length then counts the 16-byte tag after the
//! ciphertext.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::{ChaCha20Poly1305, KeyInit, Nonce, Tag};
use hkdf::Hkdf;
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

const HELLO_MAGIC: &[u8; 8] = b"MCASTBS2";
const NONCE: usize = 32;
const MAC: usize = 32;
/// Bytes of a sealed frame's authentication tag.
pub const TAG: usize = 16;
const SERVER_PROOF: &[u8] = b"mcast bootstrap server proof";
const CLIENT_PROOF: &[u8] = b"mcast bootstrap client proof";
const CLIENT_TO_SERVER: &[u8] = b"mcast bootstrap key client to server";
const SERVER_TO_CLIENT: &[u8] = b"mcast bootstrap key server to client";

/// Frame kinds.
pub mod kind {
    /// Server's challenge: magic + nonce.
    pub const HELLO: u8 = 1;
    /// A proof: a MAC over both nonces (the server's first).
    pub const PROOF: u8 = 2;
    /// A rank announces itself (to the root or the hub).
    pub const JOIN: u8 = 3;
    /// The answer to a join.
    pub const WELCOME: u8 = 4;
    /// Client's nonce.
    pub const NONCE: u8 = 5;
    /// A rank's part of an exchange (to the hub).
    pub const EXCH: u8 = 10;
    /// Every rank's part (from the hub).
    pub const RESULT: u8 = 11;
    /// The exchange failed (from the hub): kind + message.
    pub const FAIL: u8 = 12;
    /// The team was aborted: reason.
    pub const ABORT: u8 = 13;
    /// The team failed (a rank timed out, a connection failed authentication or broke a cap):
    /// kind + reason. Relayed by the hub.
    pub const FAILED: u8 = 14;
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
    /// A sealed frame failed to open: altered, replayed, reordered or not sealed by the peer.
    Auth,
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Closed => write!(f, "connection closed"),
            FrameError::TooLarge(n) => write!(f, "a frame of {n} bytes is above the cap"),
            FrameError::Io(e) => write!(f, "{e}"),
            FrameError::Auth => write!(f, "a frame failed authentication (altered, replayed, reordered or injected)"),
        }
    }
}

/// Reads one frame of at most `cap` payload bytes: `(kind, payload)`. Allocates at most `cap`
/// bytes, whatever the stream holds.
pub fn read_frame(r: &mut impl Read, cap: usize) -> Result<(u8, Vec<u8>), FrameError> {
    let head = read_head(r)?;
    let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
    if len > cap {
        return Err(FrameError::TooLarge(len));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).map_err(FrameError::Io)?;
    Ok((head[4], payload))
}

/// A frame's 5-byte head; [`FrameError::Closed`] when the stream ends before it.
fn read_head(r: &mut impl Read) -> Result<[u8; 5], FrameError> {
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
    Ok(head)
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

/// Reads a plain (handshake) frame of `want` kind before `deadline` (the whole frame, not each
/// read).
pub fn expect_frame(s: &mut TcpStream, want: u8, cap: usize, deadline: Deadline) -> Result<Vec<u8>, String> {
    let (k, p) = read_frame(&mut UntilDeadline { s, deadline }, cap).map_err(|e| e.to_string())?;
    if k != want {
        return Err(format!("expected a frame of kind {want}, got kind {k}"));
    }
    Ok(p)
}

fn mac(secret: &[u8; SECRET_BYTES], label: &[u8], ns: &[u8], nc: &[u8]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
    m.update(label);
    m.update(HELLO_MAGIC);
    m.update(ns);
    m.update(nc);
    m
}

/// The two directions' keys of a connection: (client to server, server to client).
fn keys(secret: &[u8; SECRET_BYTES], ns: &[u8], nc: &[u8]) -> (ChaCha20Poly1305, ChaCha20Poly1305) {
    let mut salt = [0u8; 2 * NONCE];
    salt[..NONCE].copy_from_slice(ns);
    salt[NONCE..].copy_from_slice(nc);
    let hk = Hkdf::<Sha256>::new(Some(&salt), secret);
    let key = |info: &[u8]| {
        let mut k = [0u8; 32];
        hk.expand(info, &mut k).expect("32 bytes is a valid HKDF-SHA256 length");
        ChaCha20Poly1305::new(&k.into())
    };
    (key(CLIENT_TO_SERVER), key(SERVER_TO_CLIENT))
}

/// The AEAD nonce of frame `seq` of a direction.
fn nonce_of(seq: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&seq.to_le_bytes());
    n.into()
}

/// The sending half of a sealed channel: one direction's key and frame count.
pub struct Sealer {
    aead: ChaCha20Poly1305,
    seq: u64,
}

impl Sealer {
    /// `payload` as a sealed frame of `kind`, under the next frame number.
    pub fn seal(&mut self, kind: u8, payload: &[u8]) -> io::Result<Vec<u8>> {
        let len = payload.len() + TAG;
        let len32 = u32::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("a frame of {len} bytes")))?;
        let seq = self.seq;
        // A number is used once: the connection ends before the count would wrap.
        self.seq = seq.checked_add(1).ok_or_else(|| io::Error::other("the frame count of a connection ran out"))?;
        let mut buf = Vec::with_capacity(5 + len);
        buf.extend_from_slice(&len32.to_le_bytes());
        buf.push(kind);
        buf.extend_from_slice(payload);
        let (head, body) = buf.split_at_mut(5);
        let tag = self
            .aead
            .encrypt_in_place_detached(&nonce_of(seq), head, body)
            .map_err(|_| io::Error::other("sealing a bootstrap frame failed"))?;
        buf.extend_from_slice(&tag);
        Ok(buf)
    }

    /// Seals and writes one frame.
    pub fn send(&mut self, w: &mut impl Write, kind: u8, payload: &[u8]) -> io::Result<()> {
        let frame = self.seal(kind, payload)?;
        w.write_all(&frame)
    }
}

/// The receiving half of a sealed channel.
pub struct Opener {
    aead: ChaCha20Poly1305,
    seq: u64,
}

impl Opener {
    /// Reads and opens the next frame of at most `cap` payload bytes: `(kind, payload)`.
    /// Allocates at most `cap` + [`TAG`] bytes, whatever the stream holds. A frame that does
    /// not open under the next frame number is [`FrameError::Auth`]; the connection is then
    /// worth nothing and its owner drops it.
    pub fn open(&mut self, r: &mut impl Read, cap: usize) -> Result<(u8, Vec<u8>), FrameError> {
        let head = read_head(r)?;
        let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
        if len > cap.saturating_add(TAG) {
            return Err(FrameError::TooLarge(len - TAG));
        }
        if len < TAG {
            return Err(FrameError::Auth);
        }
        let mut body = vec![0u8; len];
        r.read_exact(&mut body).map_err(FrameError::Io)?;
        let (text, tag) = body.split_at_mut(len - TAG);
        let tag = Tag::clone_from_slice(tag);
        self.aead.decrypt_in_place_detached(&nonce_of(self.seq), &head, text, &tag).map_err(|_| FrameError::Auth)?;
        self.seq = self.seq.checked_add(1).ok_or(FrameError::Auth)?;
        body.truncate(len - TAG);
        Ok((head[4], body))
    }
}

/// A connection that passed the handshake: the stream and both directions' keys. Every frame
/// after the handshake goes through [`Secured::send`] / [`Secured::expect`] (or the halves,
/// once split between a writer and a reader thread).
pub struct Secured {
    /// The connection.
    pub stream: TcpStream,
    /// Seals what this side sends.
    pub tx: Sealer,
    /// Opens what the peer sends.
    pub rx: Opener,
}

impl Secured {
    fn new(stream: TcpStream, tx: ChaCha20Poly1305, rx: ChaCha20Poly1305) -> Secured {
        Secured { stream, tx: Sealer { aead: tx, seq: 0 }, rx: Opener { aead: rx, seq: 0 } }
    }

    /// Seals and writes one frame.
    pub fn send(&mut self, kind: u8, payload: &[u8]) -> io::Result<()> {
        self.tx.send(&mut &self.stream, kind, payload)
    }

    /// Reads and opens a frame of `want` kind before `deadline`.
    pub fn expect(&mut self, want: u8, cap: usize, deadline: Deadline) -> Result<Vec<u8>, String> {
        let (k, p) = self.rx.open(&mut UntilDeadline { s: &self.stream, deadline }, cap).map_err(|e| e.to_string())?;
        if k != want {
            return Err(format!("expected a frame of kind {want}, got kind {k}"));
        }
        Ok(p)
    }
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

/// Server side of the handshake on a fresh connection, bounded by `deadline`: the server
/// proves the secret first, then checks the client's proof.
pub fn prove_server(mut s: TcpStream, secret: &[u8; SECRET_BYTES], deadline: Deadline) -> Result<Secured, String> {
    s.set_write_timeout(Some(deadline.remaining_or(Duration::from_secs(5)).max(Duration::from_millis(1))))
        .map_err(|e| e.to_string())?;
    let mut ns = [0u8; NONCE];
    random_bytes(&mut ns).map_err(|e| e.to_string())?;
    let mut hello = HELLO_MAGIC.to_vec();
    hello.extend_from_slice(&ns);
    write_frame(&mut s, kind::HELLO, &hello).map_err(|e| e.to_string())?;
    let nc = expect_frame(&mut s, kind::NONCE, MAX_HANDSHAKE_FRAME, deadline)?;
    if nc.len() != NONCE {
        return Err(format!("a nonce of {} bytes (expected {NONCE})", nc.len()));
    }
    let mine = mac(secret, SERVER_PROOF, &ns, &nc).finalize().into_bytes();
    write_frame(&mut s, kind::PROOF, &mine).map_err(|e| e.to_string())?;
    let theirs = expect_frame(&mut s, kind::PROOF, MAX_HANDSHAKE_FRAME, deadline)?;
    if theirs.len() != MAC {
        return Err(format!("a proof of {} bytes (expected {MAC})", theirs.len()));
    }
    mac(secret, CLIENT_PROOF, &ns, &nc)
        .verify_slice(&theirs)
        .map_err(|_| "the connection does not know the team's secret".to_string())?;
    let (c2s, s2c) = keys(secret, &ns, &nc);
    Ok(Secured::new(s, s2c, c2s))
}

/// Client side of the handshake, bounded by `deadline`: the client sends its proof only after
/// the server's checked out.
pub fn prove_client(mut s: TcpStream, secret: &[u8; SECRET_BYTES], deadline: Deadline) -> Result<Secured, String> {
    s.set_write_timeout(Some(deadline.remaining_or(Duration::from_secs(5)).max(Duration::from_millis(1))))
        .map_err(|e| e.to_string())?;
    let hello = expect_frame(&mut s, kind::HELLO, MAX_HANDSHAKE_FRAME, deadline)?;
    if hello.len() != HELLO_MAGIC.len() + NONCE || &hello[..HELLO_MAGIC.len()] != HELLO_MAGIC {
        return Err("the listener is not an mcast bootstrap of this version".into());
    }
    let ns = &hello[HELLO_MAGIC.len()..];
    let mut nc = [0u8; NONCE];
    random_bytes(&mut nc).map_err(|e| e.to_string())?;
    write_frame(&mut s, kind::NONCE, &nc).map_err(|e| e.to_string())?;
    let theirs = expect_frame(&mut s, kind::PROOF, MAX_HANDSHAKE_FRAME, deadline)?;
    mac(secret, SERVER_PROOF, ns, &nc)
        .verify_slice(&theirs)
        .map_err(|_| "the listener does not know the team's secret (a stale or foreign id?)".to_string())?;
    let mine = mac(secret, CLIENT_PROOF, ns, &nc).finalize().into_bytes();
    write_frame(&mut s, kind::PROOF, &mine).map_err(|e| e.to_string())?;
    let (c2s, s2c) = keys(secret, ns, &nc);
    Ok(Secured::new(s, c2s, s2c))
}

/// Connects to `addr` and runs the handshake, retrying refused connections (the listener may
/// not be up yet) until `deadline`.
pub fn connect(addr: SocketAddr, secret: &[u8; SECRET_BYTES], deadline: Deadline) -> Result<Secured, String> {
    let mut last = String::new();
    loop {
        let left = deadline.remaining_or(Duration::from_secs(10));
        if deadline.passed() || left.is_zero() {
            return Err(format!("cannot reach the bootstrap at {addr}: {last}"));
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                let hs = deadline.min(Duration::from_millis(HANDSHAKE_MS * 5));
                match prove_client(s, secret, hs) {
                    Ok(c) => return Ok(c),
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
/// dropped without delaying anyone); authenticated connections with their first (sealed)
/// frame, a `JOIN`, arrive on a channel.
///
/// Bounds: a handshake (proof and `JOIN`) gets [`HANDSHAKE_MS`] in all, after which the accept
/// loop cuts it whatever its reads do; at most [`MAX_PENDING`] handshakes run at once (a new
/// connection evicts the oldest); when the process is out of descriptors the loop rests instead
/// of spinning, and the connections wait in the kernel's backlog. Drops are logged as one line
/// per interval with counts (`droplog.rs`).
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
                            let _ = s.set_nonblocking(false);
                            let _ = s.set_nodelay(true);
                            let deadline = Deadline::after_ms(HANDSHAKE_MS);
                            // On failure the stream is dropped, which closes it.
                            let r = prove_server(s, &secret, deadline).and_then(|mut c| {
                                let join = c.expect(kind::JOIN, MAX_HANDSHAKE_FRAME * 4, deadline)?;
                                Ok((c, join))
                            });
                            let mine = state.compare_exchange(LIVE, DONE, Ordering::AcqRel, Ordering::Acquire).is_ok();
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

/// The address to listen on: the interface `MCAST_SOCKET_IFNAME` selects (by
/// `NCCL_SOCKET_IFNAME`'s rules, see [`super::ifname`]), else the first that is up but for
/// loopback, `docker*` and `veth*`, else loopback.
pub fn pick_ip() -> Result<IpAddr, BootError> {
    pick_ip_from(&interfaces(), std::env::var("MCAST_SOCKET_IFNAME").ok().as_deref())
}

/// [`pick_ip`] over a given interface list.
pub fn pick_ip_from(ifs: &[Interface], wanted: Option<&str>) -> Result<IpAddr, BootError> {
    super::ifname::choose(ifs, wanted).map_err(|why| BootError::new(super::Kind::InvalidArgument, why))
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
        s.send(kind::JOIN, b"hi").unwrap();
        let (_, join) = acc.next(Deadline::after_ms(3000)).unwrap();
        assert_eq!(join, b"hi");
        assert!(acc.next(Deadline::after_ms(50)).is_none());
    }

    /// The two ends of one direction of a connection.
    fn direction() -> (Sealer, Opener) {
        let (tx, _) = keys(&[1; SECRET_BYTES], &[2; NONCE], &[3; NONCE]);
        let (rx, _) = keys(&[1; SECRET_BYTES], &[2; NONCE], &[3; NONCE]);
        (Sealer { aead: tx, seq: 0 }, Opener { aead: rx, seq: 0 })
    }

    fn open(rx: &mut Opener, frame: &[u8]) -> Result<(u8, Vec<u8>), FrameError> {
        rx.open(&mut std::io::Cursor::new(frame), 64)
    }

    #[test]
    fn sealed_frames_open_once_and_in_order() {
        let (mut tx, mut rx) = direction();
        let f0 = tx.seal(kind::EXCH, b"secret zero").unwrap();
        let f1 = tx.seal(kind::EXCH, b"secret one").unwrap();
        assert!(!f0.windows(6).any(|w| w == b"secret"), "the payload travels in the clear");
        assert_eq!(open(&mut rx, &f0).unwrap(), (kind::EXCH, b"secret zero".to_vec()));
        // Replayed.
        assert!(matches!(open(&mut rx, &f0), Err(FrameError::Auth)));
        // Reordered.
        let (_, mut rx) = direction();
        assert!(matches!(open(&mut rx, &f1), Err(FrameError::Auth)));
        // The kind and the length are authenticated too.
        for at in [0, 4, 5, f0.len() - 1] {
            let (_, mut rx) = direction();
            let mut bad = f0.clone();
            bad[at] ^= 1;
            assert!(open(&mut rx, &bad).is_err(), "byte {at} altered");
        }
        // The other direction's key, and a frame too short to hold a tag.
        let (_, s2c) = keys(&[1; SECRET_BYTES], &[2; NONCE], &[3; NONCE]);
        let mut other = Opener { aead: s2c, seq: 0 };
        assert!(matches!(open(&mut other, &f0), Err(FrameError::Auth)));
        let (_, mut rx) = direction();
        assert!(matches!(open(&mut rx, &[3, 0, 0, 0, kind::EXCH, 1, 2, 3]), Err(FrameError::Auth)));
        // A length above the cap is refused before anything is read or allocated.
        assert!(matches!(open(&mut rx, &[0xff, 0xff, 0xff, 0xff, kind::EXCH]), Err(FrameError::TooLarge(_))));
    }

    /// Any change to a sealed frame (bytes altered, cut short, or random input) fails to open.
    #[test]
    fn fuzz_the_opener() {
        let (mut tx, _) = direction();
        let frame = tx.seal(kind::RESULT, &[0x5a; 40]).unwrap();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..5000 {
            let input: Vec<u8> = if i % 2 == 0 {
                (0..next() % 80).map(|_| next() as u8).collect()
            } else {
                let mut v = frame.clone();
                let at = next() as usize % v.len();
                v[at] ^= 1 + (next() % 255) as u8;
                v.truncate(v.len() - next() as usize % 2);
                v
            };
            let (_, mut rx) = direction();
            assert!(open(&mut rx, &input).is_err(), "input {i} opened");
        }
        let (_, mut rx) = direction();
        assert_eq!(open(&mut rx, &frame).unwrap(), (kind::RESULT, vec![0x5a; 40]));
    }

    fn proof_of(label: &[u8], secret: &[u8; SECRET_BYTES], ns: &[u8], nc: &[u8]) -> Vec<u8> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).unwrap();
        m.update(label);
        m.update(HELLO_MAGIC);
        m.update(ns);
        m.update(nc);
        m.finalize().into_bytes().to_vec()
    }

    /// The listener proves the secret first: a client that sends nothing but its nonce after
    /// HELLO gets the server's proof (and nothing an offline guess could use is asked of it).
    #[test]
    fn the_server_proves_first() {
        let secret = [7; SECRET_BYTES];
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let _acc = Acceptor::start(l, secret, "test").unwrap();
        let mut s = TcpStream::connect(addr).unwrap();
        let hello = expect_frame(&mut s, kind::HELLO, MAX_HANDSHAKE_FRAME, Deadline::after_ms(3000)).unwrap();
        assert_eq!(hello.len(), HELLO_MAGIC.len() + NONCE);
        let ns = &hello[HELLO_MAGIC.len()..];
        let nc = [3u8; NONCE];
        write_frame(&mut s, kind::NONCE, &nc).unwrap();
        let theirs = expect_frame(&mut s, kind::PROOF, MAX_HANDSHAKE_FRAME, Deadline::after_ms(3000))
            .expect("the server sent its proof before asking for the client's");
        assert_eq!(theirs, proof_of(b"mcast bootstrap server proof", &secret, ns, &nc));
    }

    /// A client whose listener fails its proof sends nothing more (no MAC to test guesses on).
    #[test]
    fn a_client_never_proves_to_a_server_that_failed() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let client =
            std::thread::spawn(move || connect(addr, &[7; SECRET_BYTES], Deadline::after_ms(3000)).map(|_| ()));
        let (mut s, _) = l.accept().unwrap();
        let mut hello = HELLO_MAGIC.to_vec();
        hello.extend_from_slice(&[1u8; NONCE]);
        write_frame(&mut s, kind::HELLO, &hello).unwrap();
        let first = expect_frame(&mut s, kind::NONCE, MAX_HANDSHAKE_FRAME, Deadline::after_ms(3000)).unwrap();
        assert_eq!(first.len(), NONCE, "the client's first frame holds only its nonce");
        // A server that does not know the secret.
        write_frame(&mut s, kind::PROOF, &[0u8; MAC]).unwrap();
        let e = client.join().unwrap().unwrap_err();
        assert!(e.contains("does not know the team's secret"), "{e}");
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "the client sent {} more bytes after a failed server proof", rest.len());
    }
}
