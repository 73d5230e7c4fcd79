//! TCP transport of the bootstrap: addresses, listeners, length-prefixed frames with a hard
//! size cap, every connect, read and write bounded by a deadline, the handshake that proves
//! the team's secret before any other byte is trusted, and the sealed channel after it.
//!
//! Frame: `u32` payload length (little-endian), `u8` kind, payload. A length above the cap
//! is refused before anything is allocated.
//!
//! The parts: `handshake.rs` (the proof of the secret and the keys it yields), `sealed.rs` (the
//! sealed channel after it), `acceptor.rs` (the listener's accept loop with its bounds); this
//! file holds the frames, addresses and listeners.

pub(crate) mod acceptor;
mod handshake;
mod sealed;

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::{BootError, Deadline};

pub use acceptor::{Acceptor, MAX_PENDING};
pub use handshake::connect;
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
}
