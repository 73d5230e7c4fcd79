//! TCP transport of the bootstrap: addresses, listeners, length-prefixed frames with a hard
//! size cap, every connect, read and write bounded by a deadline, the handshake that proves
//! the team's secret before any other byte is trusted, and the sealed channel after it.
//!
//! Frame: `u32` payload length (little-endian), `u8` kind, payload. A length above the cap
//! is refused before anything is allocated.
//!
//! The parts: `handshake.rs` (the proof of the secret, what it binds, and the keys it yields),
//! `sealed.rs` (the sealed channel after it), `acceptor.rs` (the listener's event loop with its
//! bounds); this file holds the frames and listeners. Which address to listen on is
//! [`super::ifname`]'s.

pub(crate) mod acceptor;
mod handshake;
mod sealed;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::{BootError, Deadline};

pub use acceptor::{Acceptor, Arrival, Shed, MAX_PENDING};
#[cfg(test)]
pub(crate) use handshake::PROTOCOL_OVERRIDE;
pub use handshake::{connect, job_tag, Bind, PROTOCOL, VERSION};
pub use sealed::{Opener, Sealer, Secured, TAG};

/// Bytes of the team secret.
pub const SECRET_BYTES: usize = 32;
/// Largest frame payload between authenticated members.
pub const MAX_FRAME: usize = 1 << 20;
/// Largest frame payload before authentication.
pub const MAX_HANDSHAKE_FRAME: usize = 128;
/// How long a connection may take to prove the secret.
pub const HANDSHAKE_MS: u64 = 2000;

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
    /// A member holds the result of a confirmed exchange (to the hub).
    pub const ACK: u8 = 15;
    /// Every member acknowledged: the confirmed exchange succeeded (from the hub).
    pub const COMMIT: u8 = 16;
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

/// Binds a listener on `ip` (port 0: any).
pub fn listen(addr: SocketAddr) -> Result<TcpListener, BootError> {
    let l = TcpListener::bind(addr).map_err(|e| {
        BootError::new(
            super::Kind::InvalidArgument,
            format!(
                "cannot listen on {addr} for the bootstrap: {e} (check MCAST_BOOTSTRAP_ADDR / MCAST_SOCKET_IFNAME)"
            ),
        )
    })?;
    // A longer queue of connections not yet accepted than the standard library's 128 (the
    // kernel caps it at net.core.somaxconn): when the queue is full the kernel drops the last
    // packet of a connection's opening, and that connection (a rank behind a flood, maybe)
    // waits a second or more for it to be sent again while its peer thinks it connected.
    // SAFETY: listen(2) on a listening socket this function owns; it only sets the backlog.
    unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(&l), LISTEN_BACKLOG) };
    Ok(l)
}

/// The backlog asked of the kernel for the bootstrap's listeners.
const LISTEN_BACKLOG: libc::c_int = 4096;

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
