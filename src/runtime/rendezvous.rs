//! Rendezvous of the processes of a multi-process team (one process per rank).
//!
//! The ranks meet over an abstract Unix-domain socket named by the unique id
//! (`\0mcast-<hex>`): rank 0 listens and is the hub of a star, every other rank connects to it.
//! Sockets are `SOCK_SEQPACKET`, so one message is one datagram and the file descriptors
//! passed with it (`SCM_RIGHTS`) arrive with it; no ptrace rights are needed.
//!
//! The one primitive is [`Comm::exchange`], an all-gather of a status, bytes and file
//! descriptors labelled with the step it belongs to: every rank sends its part to the hub, the
//! hub replies to every rank with all parts. An exchange in which any rank reports a failure
//! fails on every rank with a message naming the failing rank, so one rank's failure gives
//! every rank an error instead of a hang. Every wait is bounded by `timeout_ms` (poll); a peer
//! that closes its connection (it exited or was killed) is reported at once. After a failed
//! exchange the communicator is broken: every later exchange fails immediately.
//!
//! [`Comm::abort`] breaks the communicator on purpose: it tells the peers (a non-hub rank tells
//! the hub, which tells every other rank), and every rank waiting in an exchange, here or in a
//! peer process, returns [`ErrorKind::Aborted`] within [`ABORT_POLL`]; [`Comm::aborted`] asks
//! without waiting.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::error::{Error, ErrorKind, Result};

/// Bytes of an `mcast_unique_id_t`.
pub const ID_BYTES: usize = 128;
/// Version tag at the start of every unique id.
const MAGIC: &[u8; 8] = b"MCASTID1";
/// Random bytes after the tag.
const NONCE: usize = 16;
/// Largest message.
const MAX_MSG: usize = 1 << 16;
/// Most descriptors in one message.
const MAX_FDS: usize = 64;
/// How often a wait checks whether the team was aborted.
pub const ABORT_POLL: Duration = Duration::from_millis(5);
/// First word of an abort message, in both directions (never a label length or a reply code).
const ABORT_FRAME: u32 = 0xab0a_7ed1;

/// A fresh unique id: the version tag and 16 random bytes (`getrandom`), zero-padded.
pub fn new_unique_id() -> Result<[u8; ID_BYTES]> {
    let mut id = [0u8; ID_BYTES];
    id[..MAGIC.len()].copy_from_slice(MAGIC);
    let nonce = &mut id[MAGIC.len()..MAGIC.len() + NONCE];
    let mut got = 0;
    while got < NONCE {
        // SAFETY: writes at most NONCE - got bytes into the slice.
        let n = unsafe { libc::getrandom(nonce[got..].as_mut_ptr().cast(), NONCE - got, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::internal(format!("getrandom failed: {e}")));
        }
        got += n as usize;
    }
    Ok(id)
}

/// The abstract socket name of `id` (without the leading NUL).
fn socket_name(id: &[u8; ID_BYTES]) -> Result<String> {
    if &id[..MAGIC.len()] != MAGIC {
        return Err(Error::invalid_argument(
            "the unique id was not made by mcast_get_unique_id (or by another version of mcast): every rank must \
             pass the bytes rank 0 got from mcast_get_unique_id",
        ));
    }
    let hex: String = id[MAGIC.len()..MAGIC.len() + NONCE].iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("mcast-{hex}"))
}

/// One rank's part of an exchange.
#[derive(Debug, Default)]
pub struct Part {
    /// The bytes it sent.
    pub bytes: Vec<u8>,
    /// The descriptors it sent (empty for this process's own part).
    pub fds: Vec<OwnedFd>,
}

/// The connection of one rank to the others.
pub struct Comm {
    rank: usize,
    nranks: usize,
    timeout_ms: u32,
    /// Hub: `socks[r]` for every rank r > 0. Other ranks: `socks[0]`, the hub.
    socks: Vec<Option<OwnedFd>>,
    /// Serialises exchanges; holds the error that broke the communicator.
    state: Mutex<Option<Error>>,
    /// Set once the team was aborted (here or by a peer); never cleared.
    aborted: AtomicBool,
    /// Why: who aborted.
    abort_reason: Mutex<String>,
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Comm(rank {} of {})", self.rank, self.nranks)
    }
}

fn io_err(what: &str) -> Error {
    Error::internal(format!("{what}: {}", std::io::Error::last_os_error()))
}

fn seqpacket() -> Result<OwnedFd> {
    // SAFETY: plain socket(2); the result is checked.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Error::not_supported(format!(
            "cannot create a Unix-domain socket for the rendezvous: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn abstract_addr(name: &str) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain old data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // sun_path[0] = 0: the abstract namespace.
    for (i, b) in name.bytes().enumerate() {
        addr.sun_path[i + 1] = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    (addr, len as libc::socklen_t)
}

/// A deadline from `timeout_ms` (0 = none).
#[derive(Clone, Copy)]
struct Deadline(Option<Instant>);

impl Deadline {
    fn after(timeout_ms: u32) -> Deadline {
        Deadline((timeout_ms != 0).then(|| Instant::now() + Duration::from_millis(u64::from(timeout_ms))))
    }

    /// Milliseconds left for poll(2): -1 for forever, 0 when passed.
    fn poll_ms(self) -> i32 {
        match self.0 {
            None => -1,
            Some(t) => t.saturating_duration_since(Instant::now()).as_millis().min(i32::MAX as u128) as i32,
        }
    }

    fn passed(self) -> bool {
        self.0.is_some_and(|t| Instant::now() >= t)
    }
}

/// Waits until `fd` is readable. `Ok(false)` on timeout.
fn wait_readable(fd: RawFd, deadline: Deadline) -> Result<bool> {
    loop {
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, deadline.poll_ms()) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(io_err("poll on the rendezvous socket"));
        }
        return Ok(n > 0);
    }
}

/// Sends one message with `fds` attached.
fn send_msg(sock: RawFd, bytes: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8).max(1)];
    // SAFETY: msghdr is plain old data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer holds one header with room for `fds`.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast::<RawFd>(), fds.len());
        }
    }
    loop {
        // SAFETY: msg points at live buffers; MSG_NOSIGNAL: a dead peer gives EPIPE, not SIGPIPE.
        let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// What a receive found.
enum Recv {
    Msg(Vec<u8>, Vec<OwnedFd>),
    Closed,
    TimedOut,
}

fn recv_msg(sock: RawFd, deadline: Deadline) -> Result<Recv> {
    if !wait_readable(sock, deadline)? {
        return Ok(Recv::TimedOut);
    }
    let mut buf = vec![0u8; MAX_MSG];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    // SAFETY: msghdr is plain old data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    let n = loop {
        // SAFETY: msg points at live buffers of the stated sizes.
        let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::Interrupted => continue,
            std::io::ErrorKind::ConnectionReset => return Ok(Recv::Closed),
            _ => return Err(io_err("receiving from the rendezvous socket")),
        }
    };
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into cbuf.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n == 0 && fds.is_empty() {
        return Ok(Recv::Closed);
    }
    if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
        return Err(Error::internal("a rendezvous message was truncated"));
    }
    buf.truncate(n);
    Ok(Recv::Msg(buf, fds))
}

/// The reason of an abort message waiting on `sock`, left in place; `None` if the next message
/// is something else or nothing is there.
fn peek_abort(sock: RawFd) -> Option<String> {
    // The frame's start is enough (a longer message is cut short in the copy only).
    let mut buf = [0u8; 1024];
    // SAFETY: `buf` is writable for its length; MSG_PEEK leaves the message queued (and a
    // message carrying descriptors keeps them: no control buffer is given for a peek).
    let n = unsafe { libc::recv(sock, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    if n < 4 {
        return None;
    }
    let mut d = Dec(&buf[..n as usize]);
    (d.u32().ok() == Some(ABORT_FRAME)).then(|| d.str().unwrap_or_default())
}

/// Little-endian encoder / decoder of the messages.
#[derive(Default)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    /// Appends a u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a u64.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends length-prefixed bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
        self
    }
    /// Appends a length-prefixed string.
    pub fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }
}

/// Decoder over a message; every read fails cleanly on a short message.
pub struct Dec<'a>(pub &'a [u8]);

impl Dec<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        if self.0.len() < n {
            return Err(Error::internal("a rendezvous message is shorter than its contents"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    /// Reads a u32.
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    /// Reads a u64.
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    /// Reads length-prefixed bytes.
    pub fn bytes(&mut self) -> Result<Vec<u8>> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    /// Reads a length-prefixed string.
    pub fn str(&mut self) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.bytes()?).into_owned())
    }
}

fn kind_code(k: ErrorKind) -> u32 {
    k as u32
}

fn kind_from(code: u32) -> ErrorKind {
    use ErrorKind::*;
    [
        InvalidArgument,
        InvalidHandle,
        OutOfMemory,
        NotSupported,
        DriverUnavailable,
        Driver,
        SystemNotReady,
        InUse,
        Timeout,
        Internal,
        Aborted,
    ]
    .into_iter()
    .find(|k| *k as u32 == code)
    .unwrap_or(Internal)
}

/// A rank's status as carried in an exchange.
fn encode_status(e: &mut Enc, status: &std::result::Result<(), Error>) {
    match status {
        Ok(()) => {
            e.u32(0);
        }
        Err(err) => {
            e.u32(1).u32(kind_code(err.kind)).str(&err.message);
        }
    }
}

const HELLO: u32 = 0x4d43_4831;
const REPLY_OK: u32 = 0;
const REPLY_ABORT: u32 = 1;

impl Comm {
    /// Joins the team named by `id` as `rank` of `nranks`: rank 0 listens and waits for the
    /// others, the others connect (retrying while rank 0 is not listening yet). Bounded by
    /// `timeout_ms`.
    pub fn connect(id: &[u8; ID_BYTES], nranks: usize, rank: usize, timeout_ms: u32) -> Result<Comm> {
        let name = socket_name(id)?;
        let deadline = Deadline::after(timeout_ms);
        let mut socks: Vec<Option<OwnedFd>> = (0..nranks).map(|_| None).collect();
        if nranks == 1 {
            return Ok(Comm::new(rank, nranks, timeout_ms, socks));
        }
        if rank == 0 {
            let listener = seqpacket()?;
            let (addr, len) = abstract_addr(&name);
            // SAFETY: addr is a valid sockaddr_un of `len` bytes.
            if unsafe { libc::bind(listener.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) } != 0 {
                let e = std::io::Error::last_os_error();
                return Err(if e.raw_os_error() == Some(libc::EADDRINUSE) {
                    Error::invalid_argument(format!(
                        "the unique id ({name}) is in use by another team: get a fresh one with mcast_get_unique_id \
                         for each team"
                    ))
                } else {
                    Error::internal(format!("binding the rendezvous socket {name}: {e}"))
                });
            }
            // SAFETY: a bound socket.
            if unsafe { libc::listen(listener.as_raw_fd(), nranks as i32) } != 0 {
                return Err(io_err("listening on the rendezvous socket"));
            }
            let mut joined = 1;
            let mut failure = None;
            while joined < nranks && failure.is_none() {
                if !wait_readable(listener.as_raw_fd(), deadline)? {
                    let missing: Vec<usize> = (1..nranks).filter(|&r| socks[r].is_none()).collect();
                    failure = Some(Error::new(
                        ErrorKind::Timeout,
                        format!(
                            "rank 0: rank(s) {missing:?} did not join the team within timeout_ms = {timeout_ms} ms; \
                             every rank must call mcast_team_init_rank with the same id and nranks"
                        ),
                    ));
                    break;
                }
                // SAFETY: accept on a listening socket; the result is checked.
                let c = unsafe {
                    libc::accept4(listener.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC)
                };
                if c < 0 {
                    continue;
                }
                // SAFETY: a fresh descriptor.
                let conn = unsafe { OwnedFd::from_raw_fd(c) };
                let hello = match recv_msg(conn.as_raw_fd(), deadline)? {
                    Recv::Msg(b, _) => b,
                    _ => continue,
                };
                let mut d = Dec(&hello);
                let (magic, their_rank, their_n) = (d.u32()?, d.u32()? as usize, d.u32()? as usize);
                if magic != HELLO {
                    continue;
                }
                if their_n != nranks || their_rank == 0 || their_rank >= nranks || socks[their_rank].is_some() {
                    failure = Some(Error::invalid_argument(format!(
                        "a process joined as rank {their_rank} of {their_n} while rank 0 expects ranks 1..{} of \
                         {nranks} each exactly once",
                        nranks - 1
                    )));
                    socks[0] = Some(conn);
                    break;
                }
                socks[their_rank] = Some(conn);
                joined += 1;
            }
            let comm = Comm::new(rank, nranks, timeout_ms, socks);
            if let Some(e) = failure {
                comm.fail_all(&e.message);
                return Err(e);
            }
            Ok(comm)
        } else {
            let sock = loop {
                let s = seqpacket()?;
                let (addr, len) = abstract_addr(&name);
                // SAFETY: addr is a valid sockaddr_un of `len` bytes.
                if unsafe { libc::connect(s.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) } == 0 {
                    break s;
                }
                if deadline.passed() {
                    return Err(Error::new(
                        ErrorKind::Timeout,
                        format!(
                            "rank {rank}: rank 0 did not open the team's rendezvous within timeout_ms = {timeout_ms} \
                             ms; every rank must call mcast_team_init_rank with the same id"
                        ),
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
            };
            let mut hello = Enc::default();
            hello.u32(HELLO).u32(rank as u32).u32(nranks as u32);
            send_msg(sock.as_raw_fd(), &hello.0, &[]).map_err(|e| Error::internal(format!("rendezvous hello: {e}")))?;
            socks[0] = Some(sock);
            Ok(Comm::new(rank, nranks, timeout_ms, socks))
        }
    }

    fn new(rank: usize, nranks: usize, timeout_ms: u32, socks: Vec<Option<OwnedFd>>) -> Comm {
        Comm {
            rank,
            nranks,
            timeout_ms,
            socks,
            state: Mutex::new(None),
            aborted: AtomicBool::new(false),
            abort_reason: Mutex::new(String::new()),
        }
    }

    /// Aborts the team: tells the peers (the hub tells every rank; another rank tells the hub,
    /// which passes it on), and every exchange, in progress or later, here or in a peer,
    /// returns [`ErrorKind::Aborted`]. `reason` says who aborted. Callable from any thread,
    /// also while another thread waits in an exchange. Idempotent.
    pub fn abort(&self, reason: &str) {
        if !self.mark_aborted(reason) {
            return;
        }
        let mut e = Enc::default();
        e.u32(ABORT_FRAME).str(reason);
        for s in self.socks.iter().flatten() {
            // A peer that is gone needs no telling.
            let _ = send_msg(s.as_raw_fd(), &e.0, &[]);
        }
    }

    /// Records the abort; false if it was recorded before.
    fn mark_aborted(&self, reason: &str) -> bool {
        let mut why = self.abort_reason.lock();
        if self.aborted.load(Ordering::Acquire) {
            return false;
        }
        *why = reason.to_string();
        self.aborted.store(true, Ordering::Release);
        true
    }

    /// Whether the team was aborted, here or by a peer, without waiting: `Some(reason)`. When
    /// no exchange is in progress it also looks (without consuming anything else) for an abort
    /// message a peer sent.
    pub fn aborted(&self) -> Option<String> {
        if !self.aborted.load(Ordering::Acquire) {
            if let Some(_idle) = self.state.try_lock() {
                for (q, s) in self.socks.iter().enumerate() {
                    if let Some(s) = s {
                        if let Some(reason) = peek_abort(s.as_raw_fd()) {
                            self.received_abort(q, &reason);
                            break;
                        }
                    }
                }
            }
        }
        self.aborted.load(Ordering::Acquire).then(|| self.abort_reason.lock().clone())
    }

    /// An abort message arrived from rank `from`: record it; the hub passes it on.
    fn received_abort(&self, from: usize, reason: &str) {
        if self.mark_aborted(reason) && self.rank == 0 {
            let mut e = Enc::default();
            e.u32(ABORT_FRAME).str(reason);
            for (q, s) in self.socks.iter().enumerate() {
                if let (Some(s), true) = (s, q != from) {
                    let _ = send_msg(s.as_raw_fd(), &e.0, &[]);
                }
            }
        }
    }

    /// The error every call on an aborted communicator returns.
    fn aborted_error(&self, label: &str) -> Error {
        let why = self.abort_reason.lock().clone();
        Error::aborted(format!(
            "rank {}: the team was aborted ({why}) at \"{label}\"; it can only be destroyed",
            self.rank
        ))
    }

    /// Receives one message from `sock`, in slices of [`ABORT_POLL`]: an abort (this process's
    /// flag, an abort message on `sock`, or, on the hub, on any connection) ends the wait with
    /// [`ErrorKind::Aborted`].
    fn recv_abortable(&self, sock: RawFd, deadline: Deadline, label: &str) -> Result<Recv> {
        loop {
            if self.aborted.load(Ordering::Acquire) {
                return Err(self.aborted_error(label));
            }
            let slice = Instant::now() + ABORT_POLL;
            let until = match deadline.0 {
                Some(t) if t < slice => Deadline(Some(t)),
                _ => Deadline(Some(slice)),
            };
            if wait_readable(sock, until)? {
                let got = recv_msg(sock, deadline)?;
                if let Recv::Msg(b, _) = &got {
                    let mut d = Dec(b);
                    if d.u32().ok() == Some(ABORT_FRAME) {
                        let from = self.socks.iter().position(|s| s.as_ref().is_some_and(|s| s.as_raw_fd() == sock));
                        let reason = d.str().unwrap_or_default();
                        self.received_abort(from.unwrap_or(0), &reason);
                        return Err(self.aborted_error(label));
                    }
                }
                // A peer that left after an abort (here, or one another peer sent that is
                // still queued) left because of the abort.
                if !matches!(got, Recv::Msg(..)) {
                    self.scan_for_abort(sock);
                    if self.aborted.load(Ordering::Acquire) {
                        return Err(self.aborted_error(label));
                    }
                }
                return Ok(got);
            }
            if deadline.passed() {
                self.scan_for_abort(sock);
                if self.aborted.load(Ordering::Acquire) {
                    return Err(self.aborted_error(label));
                }
                return Ok(Recv::TimedOut);
            }
            self.scan_for_abort(sock);
        }
    }

    /// Hub: looks for an abort message queued on any connection but `busy` (the one being read).
    fn scan_for_abort(&self, busy: RawFd) {
        if self.rank != 0 {
            return;
        }
        for (q, s) in self.socks.iter().enumerate() {
            if let Some(s) = s.as_ref().filter(|s| s.as_raw_fd() != busy) {
                if let Some(reason) = peek_abort(s.as_raw_fd()) {
                    self.received_abort(q, &reason);
                    return;
                }
            }
        }
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the team.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Hub only: tells every connected rank that the team failed.
    fn fail_all(&self, message: &str) {
        let mut e = Enc::default();
        e.u32(REPLY_ABORT).str(message);
        for s in self.socks.iter().flatten() {
            let _ = send_msg(s.as_raw_fd(), &e.0, &[]);
        }
    }

    /// All-gather: every rank contributes `status`, `bytes` and `fds` for the step `label`;
    /// returns every rank's part (this rank's own with no descriptors). When any rank reports
    /// a failure, the labels disagree, a rank does not arrive within `timeout_ms` or leaves,
    /// every rank gets an error naming the first failing rank, and the communicator is broken.
    pub fn exchange(
        &self,
        label: &str,
        status: std::result::Result<(), Error>,
        bytes: &[u8],
        fds: &[RawFd],
    ) -> Result<Vec<Part>> {
        let mut broken = self.state.lock();
        if self.aborted.load(Ordering::Acquire) {
            return Err(self.aborted_error(label));
        }
        if let Some(e) = broken.as_ref() {
            return Err(e.clone().context(format!("rank {}: the team's rendezvous failed earlier", self.rank)));
        }
        let own_status = status.clone();
        let mut mine = Enc::default();
        mine.str(label);
        encode_status(&mut mine, &status);
        mine.bytes(bytes);
        let result = if self.nranks == 1 {
            Ok(vec![(mine.0.clone(), Vec::new())])
        } else if self.rank == 0 {
            self.hub_exchange(label, mine.0.clone(), fds)
        } else {
            self.peer_exchange(label, &mine.0, fds)
        };
        let result = result.and_then(|raw| self.decode(label, raw));
        match (result, own_status) {
            (Ok(parts), _) => Ok(parts),
            // This rank's own failure is reported as it is.
            (Err(e), Err(own)) => {
                *broken = Some(e);
                Err(own)
            }
            (Err(e), Ok(())) => {
                *broken = Some(e.clone());
                Err(e)
            }
        }
    }

    /// Checks every part: same label, success; returns the payloads.
    fn decode(&self, label: &str, raw: Vec<(Vec<u8>, Vec<OwnedFd>)>) -> Result<Vec<Part>> {
        let mut parts = Vec::with_capacity(raw.len());
        let mut first_err: Option<Error> = None;
        for (r, (msg, fds)) in raw.into_iter().enumerate() {
            let mut d = Dec(&msg);
            let their_label = d.str()?;
            if their_label != label && first_err.is_none() {
                first_err = Some(Error::invalid_argument(format!(
                    "rank {}: the ranks disagree: rank {r} is at \"{their_label}\" while this rank is at \"{label}\"; \
                     every rank must make the same calls (buffer allocations and frees in the same order and sizes)",
                    self.rank
                )));
            }
            if d.u32()? != 0 && first_err.is_none() {
                let kind = kind_from(d.u32()?);
                let message = d.str()?;
                first_err = Some(Error::new(kind, format!("rank {r} failed at \"{label}\": {message}")));
                continue;
            }
            let bytes = if first_err.is_none() { d.bytes()? } else { Vec::new() };
            parts.push(Part { bytes, fds });
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(parts),
        }
    }

    fn gone(&self, who: usize, label: &str, why: Recv) -> Error {
        let timeout_ms = self.timeout_ms;
        let what = match why {
            Recv::TimedOut => format!("did not arrive within timeout_ms = {timeout_ms} ms"),
            _ => "closed its connection (the process exited or was killed)".to_string(),
        };
        Error::new(ErrorKind::Timeout, format!("rank {}: rank {who} {what} at \"{label}\"", self.rank))
    }

    fn hub_exchange(&self, label: &str, mine: Vec<u8>, fds: &[RawFd]) -> Result<Vec<(Vec<u8>, Vec<OwnedFd>)>> {
        let deadline = Deadline::after(self.timeout_ms);
        let mut raw: Vec<(Vec<u8>, Vec<OwnedFd>)> = vec![(mine, Vec::new())];
        for r in 1..self.nranks {
            let sock = self.socks[r].as_ref().expect("the hub holds every rank's connection").as_raw_fd();
            match self.recv_abortable(sock, deadline, label) {
                Ok(Recv::Msg(b, f)) => raw.push((b, f)),
                Err(e) if e.kind == ErrorKind::Aborted => return Err(e),
                Ok(why) => {
                    let e = self.gone(r, label, why);
                    self.fail_all(&e.message);
                    return Err(e);
                }
                Err(e) => {
                    self.fail_all(&e.message);
                    return Err(e);
                }
            }
        }
        // Reply: every part, and every rank's descriptors (the hub's own included) in rank order.
        let mut reply = Enc::default();
        reply.u32(REPLY_OK).u32(self.nranks as u32);
        let mut all_fds: Vec<RawFd> = Vec::new();
        for (r, (b, f)) in raw.iter().enumerate() {
            let n = if r == 0 { fds.len() } else { f.len() };
            reply.u32(n as u32).bytes(b);
            if r == 0 {
                all_fds.extend_from_slice(fds);
            } else {
                all_fds.extend(f.iter().map(|x| x.as_raw_fd()));
            }
        }
        if all_fds.len() > MAX_FDS || reply.0.len() > MAX_MSG {
            let e = Error::internal("a rendezvous exchange is too large");
            self.fail_all(&e.message);
            return Err(e);
        }
        for r in 1..self.nranks {
            let sock = self.socks[r].as_ref().expect("connected").as_raw_fd();
            if let Err(io) = send_msg(sock, &reply.0, &all_fds) {
                let e = Error::new(
                    ErrorKind::Timeout,
                    format!("rank 0: rank {r} closed its connection at \"{label}\" ({io})"),
                );
                self.fail_all(&e.message);
                return Err(e);
            }
        }
        // The hub keeps the descriptors it received (they are the peers' parts).
        Ok(raw)
    }

    fn peer_exchange(&self, label: &str, mine: &[u8], fds: &[RawFd]) -> Result<Vec<(Vec<u8>, Vec<OwnedFd>)>> {
        let sock = self.socks[0].as_ref().expect("connected to the hub").as_raw_fd();
        if let Err(io) = send_msg(sock, mine, fds) {
            return Err(Error::new(
                ErrorKind::Timeout,
                format!("rank {}: rank 0 closed its connection at \"{label}\" ({io})", self.rank),
            ));
        }
        let (reply, mut got) = match self.recv_abortable(sock, Deadline::after(self.timeout_ms), label)? {
            Recv::Msg(b, f) => (b, f),
            why => return Err(self.gone(0, label, why)),
        };
        let mut d = Dec(&reply);
        if d.u32()? == REPLY_ABORT {
            return Err(Error::new(ErrorKind::Timeout, d.str()?));
        }
        let n = d.u32()? as usize;
        let mut raw = Vec::with_capacity(n);
        got.reverse();
        for r in 0..n {
            let nf = d.u32()? as usize;
            let b = d.bytes()?;
            let mut f = Vec::with_capacity(nf);
            for _ in 0..nf {
                f.push(got.pop().ok_or_else(|| Error::internal("a rendezvous reply lacks its descriptors"))?);
            }
            if r == self.rank {
                f.clear();
            }
            raw.push((b, f));
        }
        Ok(raw)
    }

    /// Every rank reports `status`; all succeed together or all fail with the first failure.
    pub fn vote(&self, label: &str, status: std::result::Result<(), Error>) -> Result<()> {
        self.exchange(label, status, &[], &[]).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_tagged_and_distinct() {
        let a = new_unique_id().unwrap();
        let b = new_unique_id().unwrap();
        assert_ne!(a, b);
        assert!(socket_name(&a).unwrap().starts_with("mcast-"));
        assert!(socket_name(&[0u8; ID_BYTES]).is_err());
    }

    #[test]
    fn exchange_between_threads_passes_bytes_and_fds() {
        let id = new_unique_id().unwrap();
        let n = 3;
        let handles: Vec<_> = (0..n)
            .map(|r| {
                std::thread::spawn(move || {
                    let c = Comm::connect(&id, n, r, 5000).unwrap();
                    let file = std::fs::File::open("/dev/null").unwrap();
                    let parts = c.exchange("x", Ok(()), &[r as u8; 3], &[file.as_raw_fd()]).unwrap();
                    assert_eq!(parts.len(), n);
                    for (q, p) in parts.iter().enumerate() {
                        assert_eq!(p.bytes, vec![q as u8; 3]);
                        assert_eq!(p.fds.len(), usize::from(q != r));
                    }
                    let bad = if r == 2 { Err(Error::invalid_argument("boom")) } else { Ok(()) };
                    let e = c.vote("v", bad).unwrap_err();
                    assert!(e.message.contains("boom"), "{}", e.message);
                    // Broken afterwards.
                    assert!(c.vote("w", Ok(())).is_err());
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn a_missing_rank_times_out() {
        let id = new_unique_id().unwrap();
        let t = Instant::now();
        let e = Comm::connect(&id, 2, 0, 200).err().unwrap();
        assert_eq!(e.kind, ErrorKind::Timeout);
        assert!(t.elapsed() < Duration::from_secs(2));
    }
}
