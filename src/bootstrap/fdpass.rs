//! File descriptors between the ranks of one host: `SCM_RIGHTS` over an abstract
//! `SOCK_SEQPACKET` Unix socket (host identity includes the network namespace, so every rank
//! of a host can reach it). The host's lowest rank is the local hub; every other rank of the
//! host connects to it and proves the team's secret with its first message.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::tcp::SECRET_BYTES;
use super::{BootError, Deadline, Kind};

/// Largest message.
const MAX_MSG: usize = 1 << 12;
/// Most descriptors in one message (the kernel's SCM_MAX_FD is 253).
pub const MAX_FDS: usize = 250;

fn io_err(what: &str) -> BootError {
    BootError::new(Kind::Internal, format!("{what}: {}", std::io::Error::last_os_error()))
}

fn seqpacket() -> Result<OwnedFd, BootError> {
    // SAFETY: plain socket(2); the result is checked.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io_err("creating a Unix-domain socket for descriptor passing"));
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn abstract_addr(name: &str) -> (libc::sockaddr_un, libc::socklen_t) {
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

fn proof(secret: &[u8; SECRET_BYTES], name: &str, rank: usize) -> Vec<u8> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("any key length");
    m.update(b"mcast fdpass");
    m.update(name.as_bytes());
    m.update(&(rank as u32).to_le_bytes());
    let mut out = (rank as u32).to_le_bytes().to_vec();
    out.extend_from_slice(&m.finalize().into_bytes());
    out
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
    pub fn form(
        name: &str,
        members: Vec<usize>,
        me: usize,
        secret: &[u8; SECRET_BYTES],
        deadline: Deadline,
    ) -> Result<Local, BootError> {
        let timeout = |what: String| BootError::new(Kind::Timeout, what);
        if members[0] == me {
            let listener = seqpacket()?;
            let (addr, len) = abstract_addr(name);
            // SAFETY: addr is a valid sockaddr_un of `len` bytes.
            if unsafe { libc::bind(listener.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) } != 0 {
                return Err(io_err("binding the host's descriptor socket"));
            }
            // SAFETY: a bound socket.
            if unsafe { libc::listen(listener.as_raw_fd(), 128) } != 0 {
                return Err(io_err("listening on the host's descriptor socket"));
            }
            let mut socks: Vec<Option<OwnedFd>> = members.iter().map(|_| None).collect();
            let mut joined = 1;
            while joined < members.len() {
                if wait_readable(listener.as_raw_fd(), None, deadline) != Ready::Readable {
                    let missing: Vec<usize> =
                        members.iter().zip(&socks).skip(1).filter(|(_, s)| s.is_none()).map(|(m, _)| *m).collect();
                    return Err(timeout(format!(
                        "rank {me}: rank(s) {missing:?} of this host did not open descriptor passing in time"
                    )));
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
                let short = deadline.min(Duration::from_millis(super::tcp::HANDSHAKE_MS));
                if wait_readable(conn.as_raw_fd(), None, short) != Ready::Readable {
                    tracing::warn!("rank {me}: dropped a silent connection to the descriptor socket");
                    continue;
                }
                let Ok(Some((hello, _))) = recv_msg(conn.as_raw_fd()) else { continue };
                let Some(rank) = hello.get(..4).map(|b| u32::from_le_bytes(b.try_into().expect("4")) as usize) else {
                    continue;
                };
                let slot = members.iter().position(|&m| m == rank);
                match slot {
                    Some(i) if i > 0 && socks[i].is_none() && hello == proof(secret, name, rank) => {
                        socks[i] = Some(conn);
                        joined += 1;
                    }
                    _ => tracing::warn!("rank {me}: dropped a connection to the descriptor socket without the proof"),
                }
            }
            Ok(Local { members, me, socks: socks.into_iter().flatten().collect() })
        } else {
            let sock = loop {
                let s = seqpacket()?;
                let (addr, len) = abstract_addr(name);
                // SAFETY: addr is a valid sockaddr_un of `len` bytes.
                if unsafe { libc::connect(s.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len) } == 0 {
                    break s;
                }
                if deadline.passed() {
                    return Err(timeout(format!(
                        "rank {me}: rank {} (this host's first rank) did not open descriptor passing in time",
                        members[0]
                    )));
                }
                std::thread::sleep(Duration::from_millis(5));
            };
            send_msg(sock.as_raw_fd(), &proof(secret, name, me), &[])
                .map_err(|e| BootError::new(Kind::Timeout, format!("rank {me}: descriptor socket: {e}")))?;
            Ok(Local { members, me, socks: vec![sock] })
        }
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
