//! File descriptors between the ranks of one host: `SCM_RIGHTS` over an abstract
//! `SOCK_SEQPACKET` Unix socket (host identity includes the network namespace, so every rank
//! of a host can reach it). The host's lowest rank is the local hub; every other rank of the
//! host connects to it; the two prove the team's secret to each other (see [`Local::form`]).

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::droplog::DropLog;
use super::tcp::SECRET_BYTES;
use super::{BootError, Deadline, Kind};

/// Largest message.
const MAX_MSG: usize = 1 << 12;
/// Most descriptors in one message (the kernel's SCM_MAX_FD is 253).
pub const MAX_FDS: usize = 250;

fn io_err(what: &str) -> BootError {
    BootError::new(Kind::Internal, format!("{what}: {}", std::io::Error::last_os_error()))
}

pub(super) fn seqpacket() -> Result<OwnedFd, BootError> {
    // SAFETY: plain socket(2); the result is checked.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io_err("creating a Unix-domain socket for descriptor passing"));
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(super) fn abstract_addr(name: &str) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain old data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (i, b) in name.bytes().take(100).enumerate() {
        addr.sun_path[i + 1] = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len().min(100);
    (addr, len as libc::socklen_t)
}

/// What a wait for a readable descriptor found.
#[derive(Debug, PartialEq, Eq)]
pub enum Ready {
    /// The descriptor is readable.
    Readable,
    /// The deadline passed.
    TimedOut,
    /// The wake descriptor fired (an abort).
    Woken,
}

/// Waits until `fd` is readable, or `wake` is, or the deadline.
pub fn wait_readable(fd: RawFd, wake: Option<RawFd>, deadline: Deadline) -> Ready {
    loop {
        let mut p = [
            libc::pollfd { fd, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: wake.unwrap_or(-1), events: libc::POLLIN, revents: 0 },
        ];
        let ms = match deadline.0 {
            None => -1,
            Some(_) => deadline.remaining_or(Duration::ZERO).as_millis().min(i32::MAX as u128) as i32,
        };
        // SAFETY: two valid pollfds (a negative fd is ignored).
        let n = unsafe { libc::poll(p.as_mut_ptr(), 2, ms) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Ready::TimedOut;
        }
        if p[1].revents != 0 {
            return Ready::Woken;
        }
        return if n > 0 { Ready::Readable } else { Ready::TimedOut };
    }
}

/// Sends one message with `fds` attached.
pub fn send_msg(sock: RawFd, bytes: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
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

/// A message and the descriptors that came with it.
pub type Msg = (Vec<u8>, Vec<OwnedFd>);

/// Receives one message and its descriptors; `None` when the peer closed the socket.
pub fn recv_msg(sock: RawFd) -> Result<Option<Msg>, BootError> {
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
            std::io::ErrorKind::ConnectionReset => return Ok(None),
            _ => return Err(io_err("receiving descriptors")),
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
        return Ok(None);
    }
    if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
        return Err(BootError::new(Kind::Internal, "a descriptor message was truncated"));
    }
    buf.truncate(n);
    Ok(Some((buf, fds)))
}

/// The hub's challenge: magic + nonce.
pub(super) const CHALLENGE_MAGIC: &[u8; 8] = b"MCASTFD2";
pub(super) const NONCE: usize = 32;
const MAC: usize = 32;
/// A rank's answer: rank (`u32`) + its nonce + its proof.
const ANSWER: usize = 4 + NONCE + MAC;
/// Most connections in their handshake at once at a hub (above the largest team); a new one
/// evicts the oldest.
const MAX_PENDING: usize = 128;
/// How long the hub's accept rests when the process is out of descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// HMAC-SHA256 under the team's secret of `label` (which side proves), the socket's name, the
/// rank, and the two nonces in the order the label gives.
fn mac(secret: &[u8; SECRET_BYTES], label: &[u8], name: &str, rank: u32, a: &[u8], b: &[u8]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("any key length");
    m.update(label);
    m.update(&(name.len() as u32).to_le_bytes());
    m.update(name.as_bytes());
    m.update(&rank.to_le_bytes());
    m.update(a);
    m.update(b);
    m
}

/// A rank's answer to the hub's challenge `nh` (see [`Local::form`]), with its fresh nonce `nc`.
pub(super) fn answer(secret: &[u8; SECRET_BYTES], name: &str, rank: u32, nh: &[u8], nc: &[u8; NONCE]) -> Vec<u8> {
    let mut out = rank.to_le_bytes().to_vec();
    out.extend_from_slice(nc);
    out.extend_from_slice(&mac(secret, b"mcast fdpass rank", name, rank, nh, nc).finalize().into_bytes());
    out
}

/// The hub's proof for `rank`, whose nonce was `nc`, after challenging it with `nh`.
fn hub_proof(secret: &[u8; SECRET_BYTES], name: &str, rank: u32, nc: &[u8], nh: &[u8]) -> Hmac<Sha256> {
    mac(secret, b"mcast fdpass hub", name, rank, nc, nh)
}

/// The effective user id of the process at the other end of a Unix socket (`SO_PEERCRED`:
/// as it was when the socket was connected).
fn peer_uid(fd: RawFd) -> Result<u32, BootError> {
    // SAFETY: ucred is plain old data.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let rc = unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len)
    };
    if rc != 0 {
        return Err(io_err("reading the peer's credentials (SO_PEERCRED)"));
    }
    Ok(cred.uid)
}

/// A connection to the hub that has not yet answered its challenge.
struct Pending {
    fd: OwnedFd,
    since: Instant,
    nh: [u8; NONCE],
}

/// The descriptor channel of the ranks of one host.
pub struct Local {
    /// The host's ranks, in rank order; `members[0]` is the local hub.
    pub members: Vec<usize>,
    me: usize,
    /// Hub: one socket per other member (index 1..). Others: `socks[0]`, the hub.
    socks: Vec<OwnedFd>,
}

impl Local {
    /// Connects the ranks `members` (sorted, this rank among them) of one host; `name` is the
    /// team's abstract socket name for this host.
    ///
    /// The socket's name can be seen by every user of the host (`/proc/net/unix`), so the hub
    /// trusts nothing about a connection until it proved itself, and serves all connections at
    /// once: one that stays silent delays no one. A connection from another user
    /// (`SO_PEERCRED`) is closed at once. The hub sends a challenge (magic + fresh nonce
    /// `nh`); the rank answers with its rank, its own fresh nonce `nc` and HMAC(secret,
    /// "mcast fdpass rank" | name | rank | nh | nc); the hub checks it in constant time and
    /// answers HMAC(secret, "mcast fdpass hub" | name | rank | nc | nh), which the rank checks
    /// (and that the hub runs as its user). A recorded answer is worth nothing against a new
    /// challenge. A connection that has not answered within [`HANDSHAKE_MS`](super::tcp::HANDSHAKE_MS)
    /// is closed; drops are logged as one line per interval with counts.
    pub fn form(
        name: &str,
        members: Vec<usize>,
        me: usize,
        secret: &[u8; SECRET_BYTES],
        deadline: Deadline,
    ) -> Result<Local, BootError> {
        if members[0] == me {
            Self::serve(name, members, me, secret, deadline)
        } else {
            Self::join(name, members, me, secret, deadline)
        }
    }

    fn serve(
        name: &str,
        members: Vec<usize>,
        me: usize,
        secret: &[u8; SECRET_BYTES],
        deadline: Deadline,
    ) -> Result<Local, BootError> {
        let listener = seqpacket()?;
        let lfd = listener.as_raw_fd();
        // SAFETY: fcntl on our descriptor: accepts below never block.
        if unsafe { libc::fcntl(lfd, libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
            return Err(io_err("making the host's descriptor socket non-blocking"));
        }
        let (addr, len) = abstract_addr(name);
        // SAFETY: addr is a valid sockaddr_un of `len` bytes.
        if unsafe { libc::bind(lfd, (&addr as *const libc::sockaddr_un).cast(), len) } != 0 {
            return Err(io_err("binding the host's descriptor socket"));
        }
        // SAFETY: a bound socket.
        if unsafe { libc::listen(lfd, 128) } != 0 {
            return Err(io_err("listening on the host's descriptor socket"));
        }
        // SAFETY: geteuid cannot fail.
        let uid = unsafe { libc::geteuid() };
        let log = DropLog::new(format!("rank {me}: the host's descriptor socket"));
        let handshake = Duration::from_millis(super::tcp::HANDSHAKE_MS);
        let mut socks: Vec<Option<OwnedFd>> = members.iter().map(|_| None).collect();
        let mut pending: VecDeque<Pending> = VecDeque::new();
        let mut rest_until: Option<Instant> = None;
        let mut joined = 1;
        while joined < members.len() {
            if deadline.passed() {
                let missing: Vec<usize> =
                    members.iter().zip(&socks).skip(1).filter(|(_, s)| s.is_none()).map(|(m, _)| *m).collect();
                return Err(BootError::new(
                    Kind::Timeout,
                    format!("rank {me}: rank(s) {missing:?} of this host did not open descriptor passing in time"),
                ));
            }
            pending.retain(|p| {
                let live = p.since.elapsed() < handshake;
                if !live {
                    log.note("silent past the handshake deadline", String::new());
                }
                live
            });
            if rest_until.is_some_and(|t| Instant::now() >= t) {
                rest_until = None;
            }
            // Wake for the first of: the deadline, a pending handshake's end, the end of a rest.
            let mut wake = deadline.remaining_or(Duration::from_secs(1)).min(Duration::from_secs(1));
            if let Some(p) = pending.front() {
                wake = wake.min(handshake.saturating_sub(p.since.elapsed()));
            }
            if let Some(t) = rest_until {
                wake = wake.min(t.saturating_duration_since(Instant::now()));
            }
            let listen_fd = if rest_until.is_some() { -1 } else { lfd };
            let mut fds: Vec<libc::pollfd> = std::iter::once(listen_fd)
                .chain(pending.iter().map(|p| p.fd.as_raw_fd()))
                .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
                .collect();
            let ms = wake.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: a valid array of pollfds (a negative fd is ignored).
            if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) } < 0 {
                continue;
            }
            // Answers first (indices of `pending` are those of `fds[1..]`), newest first so
            // removals keep the other indices.
            for i in (0..pending.len()).rev() {
                if fds[i + 1].revents == 0 {
                    continue;
                }
                let p = pending.remove(i).expect("in range");
                match Self::check_answer(&p, name, &members, &socks, secret) {
                    Ok((slot, rank, nc)) => {
                        let proof = hub_proof(secret, name, rank, &nc, &p.nh).finalize().into_bytes();
                        match send_msg(p.fd.as_raw_fd(), &proof, &[]) {
                            Ok(()) => {
                                socks[slot] = Some(p.fd);
                                joined += 1;
                            }
                            Err(e) => log.note("left during the handshake", format!("rank {rank}: {e}")),
                        }
                    }
                    Err(why) => log.note("refused", why),
                }
            }
            if fds[0].revents != 0 {
                Self::accept_all(lfd, uid, &log, &mut pending, &mut rest_until);
            }
        }
        Ok(Local { members, me, socks: socks.into_iter().flatten().collect() })
    }

    /// Accepts every waiting connection: another user's is closed at once, the others get a
    /// challenge and join `pending`.
    fn accept_all(
        lfd: RawFd,
        uid: u32,
        log: &DropLog,
        pending: &mut VecDeque<Pending>,
        rest_until: &mut Option<Instant>,
    ) {
        for _ in 0..MAX_PENDING {
            // SAFETY: accept on a listening socket; the result is checked.
            let c = unsafe { libc::accept4(lfd, std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC) };
            if c < 0 {
                let e = std::io::Error::last_os_error();
                if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)) {
                    // Leave the connection in the backlog and rest instead of spinning.
                    log.note("not accepted while the process is out of descriptors", e.to_string());
                    *rest_until = Some(Instant::now() + ACCEPT_BACKOFF);
                }
                return;
            }
            // SAFETY: a fresh descriptor.
            let fd = unsafe { OwnedFd::from_raw_fd(c) };
            match peer_uid(fd.as_raw_fd()) {
                Ok(u) if u == uid => {}
                Ok(u) => {
                    log.note("from another user", format!("uid {u}"));
                    continue;
                }
                Err(e) => {
                    log.note("refused", e.message);
                    continue;
                }
            }
            let mut nh = [0u8; NONCE];
            if let Err(e) = super::tcp::random_bytes(&mut nh) {
                log.note("refused", format!("getrandom: {e}"));
                continue;
            }
            let mut challenge = CHALLENGE_MAGIC.to_vec();
            challenge.extend_from_slice(&nh);
            if let Err(e) = send_msg(fd.as_raw_fd(), &challenge, &[]) {
                log.note("left during the handshake", e.to_string());
                continue;
            }
            if pending.len() >= MAX_PENDING {
                pending.pop_front();
                log.note("evicted at the cap of pending handshakes", String::new());
            }
            pending.push_back(Pending { fd, since: Instant::now(), nh });
        }
    }

    /// Reads and checks the answer on a pending connection: the member's slot, its rank and
    /// nonce; or why it is refused.
    fn check_answer(
        p: &Pending,
        name: &str,
        members: &[usize],
        socks: &[Option<OwnedFd>],
        secret: &[u8; SECRET_BYTES],
    ) -> Result<(usize, u32, [u8; NONCE]), String> {
        // Descriptors a stranger attached are closed with the message.
        let msg = match recv_msg(p.fd.as_raw_fd()) {
            Ok(Some((m, _))) => m,
            Ok(None) => return Err("closed before answering".into()),
            Err(e) => return Err(e.message),
        };
        if msg.len() != ANSWER {
            return Err(format!("an answer of {} bytes (expected {ANSWER})", msg.len()));
        }
        let rank = u32::from_le_bytes(msg[..4].try_into().expect("4"));
        let nc: [u8; NONCE] = msg[4..4 + NONCE].try_into().expect("NONCE");
        mac(secret, b"mcast fdpass rank", name, rank, &p.nh, &nc)
            .verify_slice(&msg[4 + NONCE..])
            .map_err(|_| format!("a connection claiming rank {rank} does not know the team's secret"))?;
        match members.iter().position(|&m| m == rank as usize) {
            Some(i) if i > 0 && socks[i].is_none() => Ok((i, rank, nc)),
            _ => Err(format!("rank {rank} is not a rank of this host still to join")),
        }
    }

    fn join(
        name: &str,
        members: Vec<usize>,
        me: usize,
        secret: &[u8; SECRET_BYTES],
        deadline: Deadline,
    ) -> Result<Local, BootError> {
        let hub = members[0];
        let fail = |kind: Kind, what: String| {
            BootError::new(kind, format!("rank {me}: descriptor socket of rank {hub}: {what}"))
        };
        let sock = loop {
            let s = seqpacket()?;
            let (addr, len) = abstract_addr(name);
            // SAFETY: addr is a valid sockaddr_un of `len` bytes.
            if unsafe { libc::connect(s.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) } == 0 {
                break s;
            }
            if deadline.passed() {
                return Err(BootError::new(
                    Kind::Timeout,
                    format!("rank {me}: rank {hub} (this host's first rank) did not open descriptor passing in time"),
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        // SAFETY: geteuid cannot fail.
        let uid = unsafe { libc::geteuid() };
        let theirs = peer_uid(sock.as_raw_fd())?;
        if theirs != uid {
            return Err(fail(Kind::Internal, format!("it is held by uid {theirs}, not this process's uid {uid}")));
        }
        let recv = |what: &str| -> Result<Vec<u8>, BootError> {
            if wait_readable(sock.as_raw_fd(), None, deadline) != Ready::Readable {
                return Err(fail(Kind::Timeout, format!("no {what} within timeout_ms")));
            }
            match recv_msg(sock.as_raw_fd())? {
                Some((m, _)) => Ok(m),
                None => Err(fail(Kind::Timeout, format!("closed before its {what}"))),
            }
        };
        let challenge = recv("challenge")?;
        if challenge.len() != CHALLENGE_MAGIC.len() + NONCE || &challenge[..CHALLENGE_MAGIC.len()] != CHALLENGE_MAGIC {
            return Err(fail(Kind::Internal, "not an mcast descriptor socket of this version".into()));
        }
        let nh = &challenge[CHALLENGE_MAGIC.len()..];
        let mut nc = [0u8; NONCE];
        super::tcp::random_bytes(&mut nc).map_err(|e| fail(Kind::Internal, format!("getrandom: {e}")))?;
        let rank = me as u32;
        send_msg(sock.as_raw_fd(), &answer(secret, name, rank, nh, &nc), &[])
            .map_err(|e| fail(Kind::Timeout, e.to_string()))?;
        let proof = recv("proof")?;
        hub_proof(secret, name, rank, &nc, nh)
            .verify_slice(&proof)
            .map_err(|_| fail(Kind::Internal, "it does not know the team's secret".into()))?;
        Ok(Local { members, me, socks: vec![sock] })
    }

    /// All-gather of descriptors among the host's ranks: `counts[i]` descriptors from
    /// `members[i]` (known to all from the exchange), `mine` this rank's. Returns each
    /// member's descriptors (this rank's own: none).
    pub fn allgather(
        &self,
        mine: &[RawFd],
        counts: &[usize],
        deadline: Deadline,
        wake: RawFd,
    ) -> Result<Vec<Vec<OwnedFd>>, BootError> {
        let me = self.me;
        let total: usize = counts.iter().sum();
        if total > MAX_FDS {
            return Err(BootError::new(
                Kind::Internal,
                format!("{total} descriptors in one exchange (most {MAX_FDS})"),
            ));
        }
        let aborted = || BootError::new(Kind::Aborted, format!("rank {me}: the team was aborted"));
        let gone = |who: usize, timed_out: bool| {
            BootError::new(
                Kind::Timeout,
                if timed_out {
                    format!("rank {me}: rank {who} did not pass its descriptors within timeout_ms")
                } else {
                    format!("rank {me}: rank {who} closed its descriptor socket (the process exited or was killed)")
                },
            )
        };
        let recv = |sock: &OwnedFd, who: usize| -> Result<Vec<OwnedFd>, BootError> {
            match wait_readable(sock.as_raw_fd(), Some(wake), deadline) {
                Ready::Woken => return Err(aborted()),
                Ready::TimedOut => return Err(gone(who, true)),
                Ready::Readable => {}
            }
            match recv_msg(sock.as_raw_fd())? {
                Some((_, f)) => Ok(f),
                None => Err(gone(who, false)),
            }
        };
        let mut out: Vec<Vec<OwnedFd>> = self.members.iter().map(|_| Vec::new()).collect();
        if self.members[0] == me {
            for (i, sock) in self.socks.iter().enumerate() {
                let f = recv(sock, self.members[i + 1])?;
                if f.len() != counts[i + 1] {
                    return Err(BootError::new(Kind::Internal, "descriptors lost in passing"));
                }
                out[i + 1] = f;
            }
            let mut all: Vec<RawFd> = mine.to_vec();
            for f in &out[1..] {
                all.extend(f.iter().map(|x| x.as_raw_fd()));
            }
            for (i, sock) in self.socks.iter().enumerate() {
                send_msg(sock.as_raw_fd(), b"fds", &all).map_err(|e| {
                    BootError::new(Kind::Timeout, format!("rank {me}: rank {} left: {e}", self.members[i + 1]))
                })?;
            }
        } else {
            send_msg(self.socks[0].as_raw_fd(), b"fds", mine)
                .map_err(|e| BootError::new(Kind::Timeout, format!("rank {me}: rank {} left: {e}", self.members[0])))?;
            let mut all = recv(&self.socks[0], self.members[0])?;
            if all.len() != total {
                return Err(BootError::new(Kind::Internal, "descriptors lost in passing"));
            }
            all.reverse();
            for (i, &c) in counts.iter().enumerate() {
                for _ in 0..c {
                    let f = all.pop().expect("counted");
                    if self.members[i] != me {
                        out[i].push(f);
                    }
                }
            }
        }
        Ok(out)
    }
}
