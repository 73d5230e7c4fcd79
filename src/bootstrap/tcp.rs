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

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

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

/// Reads a frame of `want` kind before `deadline`.
pub fn expect_frame(s: &mut TcpStream, want: u8, cap: usize, deadline: Deadline) -> Result<Vec<u8>, String> {
    s.set_read_timeout(Some(deadline.remaining_or(Duration::from_secs(3600)).max(Duration::from_millis(1))))
        .map_err(|e| e.to_string())?;
    let (k, p) = read_frame(s, cap).map_err(|e| e.to_string())?;
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

/// A listener whose accepted connections are authenticated on their own threads (a stranger
/// that stays silent, knows no secret, sends garbage or an oversized frame is dropped and
/// logged without delaying anyone); authenticated connections with their first frame, a
/// `JOIN`, arrive on a channel.
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
        let thread = std::thread::Builder::new().name("mcast-accept".into()).spawn(move || {
            use std::os::fd::AsRawFd;
            // The sender lives as long as the thread: dropping it could free the channel
            // (an allocator call) just when the caller forks.
            let _ = ready_tx.send(());
            while !flag.load(Ordering::Relaxed) {
                let mut p = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut p, 1, 50) };
                let (mut s, peer) = match listener.accept() {
                    Ok(x) => x,
                    Err(_) => continue,
                };
                let tx = tx.clone();
                let _ = std::thread::Builder::new().name("mcast-handshake".into()).spawn(move || {
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_nodelay(true);
                    let deadline = Deadline::after_ms(HANDSHAKE_MS);
                    let r = prove_server(&mut s, &secret, deadline)
                        .and_then(|()| expect_frame(&mut s, kind::JOIN, MAX_HANDSHAKE_FRAME * 4, deadline));
                    match r {
                        Ok(join) => {
                            let _ = tx.send((s, join));
                        }
                        Err(e) => {
                            tracing::warn!("{what} at {addr}: dropped a connection from {peer}: {e}");
                            let _ = s.shutdown(Shutdown::Both);
                        }
                    }
                });
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
        write_frame(&mut s, kind::JOIN, b"hi").unwrap();
        let (_, join) = acc.next(Deadline::after_ms(3000)).unwrap();
        assert_eq!(join, b"hi");
        assert!(acc.next(Deadline::after_ms(50)).is_none());
    }
}
