//! How the processes of a team meet and talk during setup and agreement. No CUDA, no runtime
//! types: bytes, statuses as numbers, and file descriptors.
//!
//! - [`tcp`]: listeners, authenticated connections, capped frames, interface choice.
//! - [`oob`]: the caller's allgather (`mcast_oob_t`), used once to swap what TCP needs.
//! - [`host`]: host identity (which ranks may pass file descriptors).
//! - [`fdpass`]: `SCM_RIGHTS` between the ranks of one host.
//!
//! A team meets either through a unique id (a root listener in the process that made the id,
//! or at `MCAST_BOOTSTRAP_ADDR` in rank 0, tells every rank where rank 0's hub listens) or
//! through the caller's allgather. Then every rank holds one authenticated TCP connection to
//! rank 0, the hub of a star; [`Bootstrap::allgather`] gathers every rank's labelled part at
//! the hub and sends all parts back. A reader thread per connection turns frames into a queue,
//! so an abort ([`Bootstrap::abort`], relayed by the hub) and a closed connection are seen at
//! once, also while no exchange runs ([`Bootstrap::aborted`]).

pub mod fdpass;
pub mod host;
pub mod oob;
pub mod tcp;
pub mod wire;

use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use tcp::{kind, Acceptor, SECRET_BYTES};
pub use wire::{Dec, Enc};

/// What went wrong in the bootstrap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Bad arguments or a bad id.
    InvalidArgument,
    /// Something the system lacks.
    NotSupported,
    /// A peer did not arrive within `timeout_ms`, or left.
    Timeout,
    /// The team was aborted, here or in a peer.
    Aborted,
    /// A broken invariant or an unexpected system error.
    Internal,
    /// A rank reported a failure with this caller-defined code.
    Failed(u32),
}

impl Kind {
    fn code(self) -> u32 {
        match self {
            Kind::InvalidArgument => 0,
            Kind::NotSupported => 1,
            Kind::Timeout => 2,
            Kind::Aborted => 3,
            Kind::Internal => 4,
            Kind::Failed(c) => c.saturating_add(100),
        }
    }

    fn from_code(c: u32) -> Kind {
        match c {
            0 => Kind::InvalidArgument,
            1 => Kind::NotSupported,
            2 => Kind::Timeout,
            3 => Kind::Aborted,
            100.. => Kind::Failed(c - 100),
            _ => Kind::Internal,
        }
    }
}

/// A bootstrap error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootError {
    /// What kind.
    pub kind: Kind,
    /// What happened, naming ranks.
    pub message: String,
}

impl BootError {
    /// An error.
    pub fn new(kind: Kind, message: impl Into<String>) -> BootError {
        BootError { kind, message: message.into() }
    }
}

/// A rank's status in an exchange: success, or a caller-defined code and a message.
pub type Status = Result<(), (u32, String)>;

/// A deadline from `timeout_ms` (`None`: none).
#[derive(Clone, Copy, Debug)]
pub struct Deadline(pub Option<Instant>);

impl Deadline {
    /// `timeout_ms` from now; 0 means no deadline.
    pub fn after(timeout_ms: u32) -> Deadline {
        Deadline((timeout_ms != 0).then(|| Instant::now() + Duration::from_millis(u64::from(timeout_ms))))
    }

    /// Whether it passed.
    pub fn passed(self) -> bool {
        self.0.is_some_and(|t| Instant::now() >= t)
    }
}

/// Bytes of a unique id.
pub const ID_BYTES: usize = 128;
const ID_MAGIC: &[u8; 8] = b"MCASTID2";
const OLD_MAGIC: &[u8; 7] = b"MCASTID";
/// Id mode: a root listener runs at the address.
const MODE_ROOT: u8 = 1;
/// Id mode: rank 0 listens at the address (`MCAST_BOOTSTRAP_ADDR`).
const MODE_RANK0: u8 = 2;

/// What a unique id carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UniqueId {
    /// Where the root listens.
    pub addr: SocketAddr,
    /// The team secret.
    pub secret: [u8; SECRET_BYTES],
    /// Rank 0 starts the root (`MCAST_BOOTSTRAP_ADDR`), else it runs in the id's maker.
    pub rank0_listens: bool,
}

impl UniqueId {
    /// The 128 bytes: magic, mode, address family, port, address, secret, zeros.
    pub fn encode(&self) -> [u8; ID_BYTES] {
        let mut b = [0u8; ID_BYTES];
        b[..8].copy_from_slice(ID_MAGIC);
        b[8] = if self.rank0_listens { MODE_RANK0 } else { MODE_ROOT };
        match self.addr.ip() {
            IpAddr::V4(ip) => {
                b[9] = 4;
                b[12..16].copy_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                b[9] = 6;
                b[12..28].copy_from_slice(&ip.octets());
            }
        }
        b[10..12].copy_from_slice(&self.addr.port().to_le_bytes());
        b[28..28 + SECRET_BYTES].copy_from_slice(&self.secret);
        b
    }

    /// Reads an id; ids of other versions and garbage are refused with a clear message.
    pub fn decode(b: &[u8; ID_BYTES]) -> Result<UniqueId, BootError> {
        let bad = |why: &str| {
            BootError::new(
                Kind::InvalidArgument,
                format!(
                    "the unique id {why}: every rank must pass the bytes rank 0 got from mcast_get_unique_id of this \
                     version of mcast"
                ),
            )
        };
        if &b[..8] != ID_MAGIC {
            if &b[..7] == OLD_MAGIC {
                return Err(bad(&format!(
                    "was made by another version of mcast (tag {:?}, this version reads MCASTID2)",
                    String::from_utf8_lossy(&b[..8])
                )));
            }
            return Err(bad("was not made by mcast_get_unique_id"));
        }
        let port = u16::from_le_bytes([b[10], b[11]]);
        let ip = match b[9] {
            4 => IpAddr::from(<[u8; 4]>::try_from(&b[12..16]).expect("4")),
            6 => IpAddr::from(<[u8; 16]>::try_from(&b[12..28]).expect("16")),
            _ => return Err(bad("holds no valid address")),
        };
        if port == 0 || !(b[8] == MODE_ROOT || b[8] == MODE_RANK0) || b[28 + SECRET_BYTES..].iter().any(|&x| x != 0) {
            return Err(bad("is damaged"));
        }
        let mut secret = [0u8; SECRET_BYTES];
        secret.copy_from_slice(&b[28..28 + SECRET_BYTES]);
        Ok(UniqueId { addr: SocketAddr::new(ip, port), secret, rank0_listens: b[8] == MODE_RANK0 })
    }
}

fn fresh_secret() -> Result<[u8; SECRET_BYTES], BootError> {
    let mut s = [0u8; SECRET_BYTES];
    tcp::random_bytes(&mut s).map_err(|e| BootError::new(Kind::Internal, format!("getrandom failed: {e}")))?;
    Ok(s)
}

/// `MCAST_BOOTSTRAP_ADDR`, parsed.
fn env_bootstrap_addr() -> Result<Option<SocketAddr>, BootError> {
    match std::env::var("MCAST_BOOTSTRAP_ADDR") {
        Ok(v) if !v.trim().is_empty() => v.trim().parse().map(Some).map_err(|_| {
            BootError::new(
                Kind::InvalidArgument,
                format!("MCAST_BOOTSTRAP_ADDR={v} is not ip:port (for example 10.0.0.1:29500 or [fd00::1]:29500)"),
            )
        }),
        _ => Ok(None),
    }
}

/// A fresh unique id. With `MCAST_BOOTSTRAP_ADDR` set, the id names that address, no listener
/// starts (rank 0 will listen there) and every process makes the same id (its secret derived
/// from the address and `MCAST_BOOTSTRAP_SECRET`); otherwise a root listener starts in this
/// process on the interface [`tcp::pick_ip`] chooses, and serves the team until every rank
/// asked it where the hub is.
pub fn new_unique_id() -> Result<[u8; ID_BYTES], BootError> {
    if let Some(addr) = env_bootstrap_addr()? {
        // Every process makes the same id from the environment, as with NCCL_COMM_ID: the
        // secret is derived from the address and MCAST_BOOTSTRAP_SECRET (a token the launcher
        // shares with the job's processes; without it, anyone who knows the address can join).
        use sha2::{Digest, Sha256};
        let shared = std::env::var("MCAST_BOOTSTRAP_SECRET").unwrap_or_default();
        let mut h = Sha256::new();
        h.update(b"mcast bootstrap secret\0");
        h.update(addr.to_string().as_bytes());
        h.update(b"\0");
        h.update(shared.as_bytes());
        let secret: [u8; SECRET_BYTES] = h.finalize().into();
        return Ok(UniqueId { addr, secret, rank0_listens: true }.encode());
    }
    let secret = fresh_secret()?;
    let ip = tcp::pick_ip()?;
    let listener = tcp::listen(SocketAddr::new(ip, 0))?;
    let addr = listener.local_addr().map_err(|e| BootError::new(Kind::Internal, e.to_string()))?;
    spawn_root(listener, secret)?;
    Ok(UniqueId { addr, secret, rank0_listens: false }.encode())
}

/// The status code of a rank whose descriptor channel could not be formed.
const LOCAL_SETUP: u32 = 0xffff;

/// JOIN purposes.
const ASK_ROOT: u32 = 1;
const JOIN_HUB: u32 = 2;

/// The root of a unique id: tells every rank where rank 0's hub listens, then ends once every
/// rank has asked.
fn spawn_root(listener: std::net::TcpListener, secret: [u8; SECRET_BYTES]) -> Result<(), BootError> {
    let acceptor = Acceptor::start(listener, secret, "bootstrap root")
        .map_err(|e| BootError::new(Kind::Internal, format!("starting the bootstrap root: {e}")))?;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("mcast-root".into())
        .spawn(move || {
            // A first, timed-out wait sets up this thread's channel waiting state (which
            // allocates once); the waits after the ready signal allocate nothing.
            let mut early = acceptor.next(Deadline::after_ms(1));
            // The sender lives as long as the thread (see `Acceptor::start`).
            let _ = ready_tx.send(());
            let mut waiting: Vec<(TcpStream, u32, u32)> = Vec::new();
            let mut hub: Option<(String, u32)> = None;
            let mut served = std::collections::BTreeSet::new();
            loop {
                if let Some((_, n)) = &hub {
                    if served.len() >= *n as usize {
                        break;
                    }
                }
                let Some((s, join)) = early.take().or_else(|| acceptor.next(Deadline(None))) else { break };
                let mut d = Dec(&join);
                let (Ok(ASK_ROOT), Ok(rank), Ok(nranks), Ok(addr)) = (d.u32(), d.u32(), d.u32(), d.str()) else {
                    tracing::warn!("bootstrap root: dropped a malformed request");
                    continue;
                };
                if rank == 0 {
                    hub = Some((addr, nranks));
                }
                waiting.push((s, rank, nranks));
                if let Some((addr, n)) = &hub {
                    for (mut w, rank, their_n) in waiting.drain(..) {
                        let mut e = Enc::default();
                        if their_n == *n {
                            e.u32(0).str(addr);
                        } else {
                            e.u32(1).str(&format!(
                                "rank {rank} says nranks = {their_n} but rank 0 says nranks = {n}; every rank must \
                                 pass the same nranks"
                            ));
                        }
                        let _ = tcp::write_frame(&mut w, kind::WELCOME, &e.0);
                        served.insert(rank);
                    }
                }
            }
            drop(acceptor);
        })
        .map_err(|e| BootError::new(Kind::Internal, format!("starting the bootstrap root thread: {e}")))?;
    // As in `Acceptor::start`: the thread is parked in its loop before the id is handed out.
    let _ = ready_rx.recv();
    Ok(())
}

/// One rank's part of an exchange.
#[derive(Debug, Default)]
pub struct Part {
    /// The bytes it sent.
    pub bytes: Vec<u8>,
    /// The descriptors it sent, when it is on this rank's host (this rank's own: none).
    pub fds: Vec<OwnedFd>,
}

struct Conn {
    stream: TcpStream,
    write: Mutex<()>,
}

impl Conn {
    fn send(&self, k: u8, payload: &[u8]) -> std::io::Result<()> {
        let _g = self.write.lock();
        tcp::write_frame(&mut &self.stream, k, payload)
    }
}

#[derive(Default)]
struct Queues {
    frames: Vec<std::collections::VecDeque<(u8, Vec<u8>)>>,
    closed: Vec<bool>,
}

struct Shared {
    q: Mutex<Queues>,
    cv: Condvar,
    aborted: AtomicBool,
    reason: Mutex<String>,
    /// An eventfd made readable by an abort (wakes descriptor-passing waits).
    wake: OwnedFd,
}

impl Shared {
    fn set_aborted(&self, reason: &str) -> bool {
        if self.aborted.swap(true, Ordering::SeqCst) {
            return false;
        }
        *self.reason.lock() = reason.to_string();
        let one: u64 = 1;
        // SAFETY: writes 8 bytes to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
        let _g = self.q.lock();
        self.cv.notify_all();
        true
    }
}

/// The connections of one rank of a team.
pub struct Bootstrap {
    rank: usize,
    nranks: usize,
    timeout_ms: u32,
    hosts: Vec<String>,
    shared: Arc<Shared>,
    /// Hub: `conns[r]` for every rank r > 0. Others: `conns[0]`, the hub.
    conns: Arc<Vec<Option<Arc<Conn>>>>,
    readers: Mutex<Vec<std::thread::JoinHandle<()>>>,
    local: Option<fdpass::Local>,
    /// Serialises exchanges; holds the error that broke the bootstrap.
    broken: Mutex<Option<BootError>>,
}

impl std::fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bootstrap(rank {} of {})", self.rank, self.nranks)
    }
}

fn timeout_err(message: String) -> BootError {
    BootError::new(Kind::Timeout, message)
}

fn check_ranks(nranks: i64, rank: i64, max: usize) -> Result<(usize, usize), BootError> {
    if nranks < 1 || nranks as u64 > max as u64 {
        return Err(BootError::new(Kind::InvalidArgument, format!("nranks is {nranks}; a team has 1 to {max} ranks")));
    }
    if rank < 0 || rank >= nranks {
        return Err(BootError::new(
            Kind::InvalidArgument,
            format!("rank {rank} is out of range for nranks = {nranks}"),
        ));
    }
    Ok((nranks as usize, rank as usize))
}

impl Bootstrap {
    /// Joins the team of unique id `id` as `rank` of `nranks` (at most `max_ranks`), this
    /// process on host `host` (see [`host::host_id`]). Bounded by `timeout_ms`.
    pub fn init_id(
        id: &[u8; ID_BYTES],
        nranks: i64,
        rank: i64,
        max_ranks: usize,
        timeout_ms: u32,
        host: String,
    ) -> Result<Bootstrap, BootError> {
        let (n, r) = check_ranks(nranks, rank, max_ranks)?;
        let id = UniqueId::decode(id)?;
        let deadline = Deadline::after(timeout_ms);
        let hub = if r == 0 {
            if id.rank0_listens {
                spawn_root(tcp::listen(id.addr)?, id.secret)?;
            }
            Some(Self::hub_acceptor(&id.secret, id.rank0_listens.then_some(id.addr.ip()))?)
        } else {
            None
        };
        // Ask the root where the hub is (rank 0 tells it).
        let mut s = tcp::connect(id.addr, &id.secret, deadline).map_err(|e| {
            timeout_err(format!(
                "rank {r}: {e}; the process that made the id must stay alive until every rank joined (or, with \
                 MCAST_BOOTSTRAP_ADDR, rank 0 must start within timeout_ms = {timeout_ms} ms)"
            ))
        })?;
        let mut e = Enc::default();
        e.u32(ASK_ROOT)
            .u32(r as u32)
            .u32(n as u32)
            .str(&hub.as_ref().map(|h| h.addr().to_string()).unwrap_or_default());
        tcp::write_frame(&mut s, kind::JOIN, &e.0)
            .map_err(|e| timeout_err(format!("rank {r}: bootstrap root: {e}")))?;
        let w = tcp::expect_frame(&mut s, kind::WELCOME, 4096, deadline).map_err(|e| {
            timeout_err(format!(
                "rank {r}: rank 0 did not join the team within timeout_ms = {timeout_ms} ms ({e}); every rank must call \
                 mcast_team_init_rank with the same id"
            ))
        })?;
        let mut d = Dec(&w);
        let ok = d.u32()?;
        let msg = d.str()?;
        if ok != 0 {
            return Err(BootError::new(Kind::InvalidArgument, format!("rank {r}: {msg}")));
        }
        let hub_addr: SocketAddr =
            msg.parse().map_err(|_| BootError::new(Kind::Internal, format!("rank {r}: a bad hub address {msg}")))?;
        Self::form(r, n, id.secret, hub, hub_addr, host, timeout_ms, deadline)
    }

    fn hub_acceptor(secret: &[u8; SECRET_BYTES], ip: Option<IpAddr>) -> Result<Acceptor, BootError> {
        let ip = match ip {
            Some(ip) => ip,
            None => tcp::pick_ip()?,
        };
        let l = tcp::listen(SocketAddr::new(ip, 0))?;
        Acceptor::start(l, *secret, "bootstrap hub")
            .map_err(|e| BootError::new(Kind::Internal, format!("starting the bootstrap hub: {e}")))
    }

    /// Joins a team through the caller's allgather (see [`oob`]).
    pub fn init_oob(
        allgather: oob::Allgather<'_>,
        nranks: i64,
        rank: i64,
        max_ranks: usize,
        timeout_ms: u32,
        host: String,
        problem: Option<String>,
    ) -> Result<Bootstrap, BootError> {
        // A bad team size is the same on every rank: fail before calling the allgather at all.
        // A bad rank or a local problem still takes part, so every rank fails together.
        if nranks < 1 || nranks as u64 > max_ranks as u64 {
            return Err(BootError::new(
                Kind::InvalidArgument,
                format!("nranks is {nranks}; a team has 1 to {max_ranks} ranks"),
            ));
        }
        let n = nranks as usize;
        let rank_problem = check_ranks(nranks, rank, max_ranks).err().map(|e| e.message);
        let problem = problem.or(rank_problem);
        let r = if (0..nranks).contains(&rank) { rank as usize } else { n };
        let deadline = Deadline::after(timeout_ms);
        // Rank 0's listener, before the allgather, so the address can travel in it.
        let prepared = (|| -> Result<_, BootError> {
            let secret = fresh_secret()?;
            let hub = if r == 0 { Some(Self::hub_acceptor(&secret, None)?) } else { None };
            Ok((secret, hub))
        })();
        let (secret, hub, local_err) = match prepared {
            Ok((s, h)) => (s, h, problem.map(|m| BootError::new(Kind::InvalidArgument, m))),
            Err(e) => ([0; SECRET_BYTES], None, Some(e)),
        };
        let addr = hub.as_ref().map(|h| h.addr().to_string()).unwrap_or_default();
        let mine = oob::record(n, rank.max(0) as usize, &secret, &addr, local_err.as_ref().map(|e| e.message.as_str()));
        let mut all = vec![0u8; oob::RECORD * n];
        allgather(&mine, &mut all).map_err(|m| BootError::new(Kind::InvalidArgument, format!("rank {rank}: {m}")))?;
        if let Some(e) = local_err {
            return Err(e);
        }
        let (secret, hub_addr) = oob::read_records(&all, n, r)?;
        Self::form(r, n, secret, hub, hub_addr, host, timeout_ms, deadline)
    }

    /// Builds the star around rank 0's hub and the hosts' descriptor channels.
    #[allow(clippy::too_many_arguments)]
    fn form(
        r: usize,
        n: usize,
        secret: [u8; SECRET_BYTES],
        hub: Option<Acceptor>,
        hub_addr: SocketAddr,
        host: String,
        timeout_ms: u32,
        deadline: Deadline,
    ) -> Result<Bootstrap, BootError> {
        let mut conns: Vec<Option<Arc<Conn>>> = (0..n).map(|_| None).collect();
        let mut hosts = vec![String::new(); n];
        hosts[r] = host.clone();
        let nonce;
        if r == 0 {
            let hub = hub.expect("rank 0 holds the hub");
            let mut streams: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
            let mut failure = None;
            let mut joined = 1;
            while joined < n {
                let Some((s, join)) = hub.next(deadline) else {
                    let missing: Vec<usize> = (1..n).filter(|&q| streams[q].is_none()).collect();
                    failure = Some(timeout_err(format!(
                        "rank 0: rank(s) {missing:?} did not join the team within timeout_ms = {timeout_ms} ms; every \
                         rank must join with the same id (or allgather) and nranks"
                    )));
                    break;
                };
                let mut d = Dec(&join);
                let parsed = (|| Ok::<_, BootError>((d.u32()?, d.u32()? as usize, d.u32()? as usize, d.str()?)))();
                let Ok((JOIN_HUB, q, their_n, their_host)) = parsed else {
                    tracing::warn!("bootstrap hub: dropped a malformed join");
                    continue;
                };
                if their_n != n || q == 0 || q >= n || streams[q].is_some() {
                    failure = Some(BootError::new(
                        Kind::InvalidArgument,
                        format!(
                            "a process joined as rank {q} of {their_n} while rank 0 expects ranks 1..{} of {n} each \
                             exactly once",
                            n - 1
                        ),
                    ));
                    streams[q.min(n - 1).max(1)].get_or_insert(s);
                    break;
                }
                hosts[q] = their_host;
                streams[q] = Some(s);
                joined += 1;
            }
            drop(hub);
            let mut nb = [0u8; 16];
            tcp::random_bytes(&mut nb).map_err(|e| BootError::new(Kind::Internal, e.to_string()))?;
            nonce = nb.iter().map(|b| format!("{b:02x}")).collect::<String>();
            let mut e = Enc::default();
            match &failure {
                Some(f) => e.u32(1).u32(f.kind.code()).str(&f.message),
                None => {
                    e.u32(0).str(&nonce).u32(n as u32);
                    for h in &hosts {
                        e.str(h);
                    }
                    &mut e
                }
            };
            for s in streams.iter_mut().flatten() {
                let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
                let _ = tcp::write_frame(s, kind::WELCOME, &e.0);
            }
            if let Some(f) = failure {
                return Err(f);
            }
            for (q, s) in streams.into_iter().enumerate() {
                conns[q] = s.map(|stream| Arc::new(Conn { stream, write: Mutex::new(()) }));
            }
        } else {
            let mut s = tcp::connect(hub_addr, &secret, deadline)
                .map_err(|e| timeout_err(format!("rank {r}: rank 0's hub: {e}")))?;
            let mut e = Enc::default();
            e.u32(JOIN_HUB).u32(r as u32).u32(n as u32).str(&host);
            tcp::write_frame(&mut s, kind::JOIN, &e.0).map_err(|e| timeout_err(format!("rank {r}: hub: {e}")))?;
            let w = tcp::expect_frame(&mut s, kind::WELCOME, tcp::MAX_FRAME, deadline).map_err(|e| {
                timeout_err(format!("rank {r}: the team did not form within timeout_ms = {timeout_ms} ms ({e})"))
            })?;
            let mut d = Dec(&w);
            if d.u32()? != 0 {
                let k = Kind::from_code(d.u32()?);
                return Err(BootError::new(k, d.str()?));
            }
            nonce = d.str()?;
            if d.u32()? as usize != n {
                return Err(BootError::new(Kind::Internal, "the hub's host table has the wrong size"));
            }
            for h in hosts.iter_mut() {
                *h = d.str()?;
            }
            conns[0] = Some(Arc::new(Conn { stream: s, write: Mutex::new(()) }));
        }
        for c in conns.iter().flatten() {
            let _ = c.stream.set_read_timeout(None);
            let _ = c.stream.set_nodelay(true);
            let wt = (timeout_ms != 0).then(|| Duration::from_millis(u64::from(timeout_ms)));
            let _ = c.stream.set_write_timeout(wt);
        }
        // SAFETY: eventfd(2); checked.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if wake < 0 {
            return Err(BootError::new(Kind::Internal, "eventfd failed"));
        }
        let shared = Arc::new(Shared {
            q: Mutex::new(Queues { frames: vec![Default::default(); n], closed: vec![false; n] }),
            cv: Condvar::new(),
            aborted: AtomicBool::new(false),
            reason: Mutex::new(String::new()),
            // SAFETY: a fresh descriptor.
            wake: unsafe { OwnedFd::from_raw_fd(wake) },
        });
        let conns = Arc::new(conns);
        let mut b = Bootstrap {
            rank: r,
            nranks: n,
            timeout_ms,
            hosts,
            shared,
            conns,
            readers: Mutex::new(Vec::new()),
            local: None,
            broken: Mutex::new(None),
        };
        b.start_readers();
        // Descriptor passing among the ranks of this host, then a vote so every rank agrees.
        let members: Vec<usize> = (0..n).filter(|&q| b.hosts[q] == b.hosts[r]).collect();
        let local = if members.len() > 1 {
            let name = format!("mcast-fd-{nonce}-{}", members[0]);
            fdpass::Local::form(&name, members, r, &secret, deadline).map(Some)
        } else {
            Ok(None)
        };
        let status = match local {
            Ok(l) => {
                b.local = l;
                Ok(())
            }
            Err(e) => Err((LOCAL_SETUP, e.message)),
        };
        b.allgather("bootstrap", status, &[], &[]).map_err(|e| match e.kind {
            Kind::Failed(LOCAL_SETUP) => BootError::new(Kind::Timeout, e.message),
            _ => e,
        })?;
        Ok(b)
    }

    fn start_readers(&mut self) {
        let mut readers = self.readers.lock();
        for (src, c) in self.conns.iter().enumerate() {
            let Some(c) = c.clone() else { continue };
            let shared = self.shared.clone();
            let conns = self.conns.clone();
            let hub = self.rank == 0;
            let me = self.rank;
            let t = std::thread::Builder::new().name("mcast-boot-rx".into()).spawn(move || loop {
                match tcp::read_frame(&mut &c.stream, tcp::MAX_FRAME) {
                    Ok((kind::ABORT, p)) => {
                        let reason = Dec(&p).str().unwrap_or_default();
                        if shared.set_aborted(&reason) && hub {
                            for (q, other) in conns.iter().enumerate() {
                                if let (Some(o), true) = (other, q != src) {
                                    let _ = o.send(kind::ABORT, &p);
                                }
                            }
                        }
                    }
                    Ok(frame) => {
                        let mut q = shared.q.lock();
                        q.frames[src].push_back(frame);
                        shared.cv.notify_all();
                    }
                    Err(e) => {
                        if let tcp::FrameError::TooLarge(_) = e {
                            tracing::warn!("rank {me}: rank {src} sent an oversized frame; connection dropped");
                        }
                        let mut q = shared.q.lock();
                        q.closed[src] = true;
                        shared.cv.notify_all();
                        break;
                    }
                }
            });
            if let Ok(t) = t {
                readers.push(t);
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

    /// Every rank's host identity, in rank order.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// Whether ranks `a` and `b` are on one host (may pass descriptors).
    pub fn same_host(&self, a: usize, b: usize) -> bool {
        self.hosts[a] == self.hosts[b]
    }

    /// Aborts the team's bootstrap: tells every peer (through the hub), ends every wait here
    /// and in the peers with [`Kind::Aborted`], and breaks the bootstrap.
    pub fn abort(&self, reason: &str) {
        let msg = format!("rank {} aborted the team: {reason}", self.rank);
        if self.shared.set_aborted(&msg) {
            let mut e = Enc::default();
            e.str(&msg);
            for c in self.conns.iter().flatten() {
                let _ = c.send(kind::ABORT, &e.0);
            }
        }
    }

    /// Whether this rank or a peer aborted the team; never blocks.
    pub fn aborted(&self) -> bool {
        self.shared.aborted.load(Ordering::SeqCst)
    }

    /// Why the team was aborted ("" when it was not).
    pub fn abort_reason(&self) -> String {
        self.shared.reason.lock().clone()
    }

    fn aborted_err(&self) -> BootError {
        BootError::new(Kind::Aborted, format!("rank {}: the team was aborted ({})", self.rank, self.abort_reason()))
    }

    /// Waits for the next frame from `src`: `Err` on abort, close or deadline.
    fn next_frame(&self, src: usize, label: &str, deadline: Deadline) -> Result<(u8, Vec<u8>), BootError> {
        let mut q = self.shared.q.lock();
        loop {
            if self.aborted() {
                return Err(self.aborted_err());
            }
            if let Some(f) = q.frames[src].pop_front() {
                return Ok(f);
            }
            if q.closed[src] {
                return Err(timeout_err(format!(
                    "rank {}: rank {src} closed its connection at \"{label}\" (the process exited or was killed)",
                    self.rank
                )));
            }
            match deadline.0 {
                None => self.shared.cv.wait(&mut q),
                Some(t) => {
                    if self.shared.cv.wait_until(&mut q, t).timed_out() && q.frames[src].is_empty() {
                        if self.aborted() {
                            return Err(self.aborted_err());
                        }
                        return Err(timeout_err(format!(
                            "rank {}: rank {src} did not arrive within timeout_ms = {} ms at \"{label}\"",
                            self.rank, self.timeout_ms
                        )));
                    }
                }
            }
        }
    }

    /// All-gather: every rank contributes `status`, `bytes` and `fds` for the step `label`;
    /// returns every rank's part (descriptors only from ranks of this host; this rank's own
    /// part has none). When a rank reports a failure, the labels disagree, a rank does not
    /// arrive within `timeout_ms` or leaves, or the team is aborted, every rank gets an error
    /// (a rank's failure: [`Kind::Failed`] with its code, the message naming it) and the
    /// bootstrap is broken. This rank's own failure is returned as it is.
    pub fn allgather(&self, label: &str, status: Status, bytes: &[u8], fds: &[RawFd]) -> Result<Vec<Part>, BootError> {
        let mut broken = self.broken.lock();
        if let Some(e) = broken.as_ref() {
            let mut e = e.clone();
            e.message = format!("rank {}: the team's bootstrap failed earlier: {}", self.rank, e.message);
            return Err(e);
        }
        let own = status.clone();
        let result = self.exchange(label, status, bytes, fds);
        match (result, own) {
            (Ok(parts), _) => Ok(parts),
            (Err(e), Err((code, msg))) if e.kind != Kind::Aborted => {
                *broken = Some(e);
                Err(BootError::new(Kind::Failed(code), msg))
            }
            (Err(e), _) => {
                *broken = Some(e.clone());
                Err(e)
            }
        }
    }

    fn exchange(&self, label: &str, status: Status, bytes: &[u8], fds: &[RawFd]) -> Result<Vec<Part>, BootError> {
        if self.aborted() {
            return Err(self.aborted_err());
        }
        let deadline = Deadline::after(self.timeout_ms);
        let mut mine = Enc::default();
        mine.str(label);
        match &status {
            Ok(()) => mine.u32(0),
            Err((code, msg)) => mine.u32(1).u32(*code).str(msg),
        };
        mine.bytes(bytes).u32(fds.len() as u32);
        let raw: Vec<Vec<u8>> = if self.nranks == 1 {
            vec![mine.0]
        } else if self.rank == 0 {
            let mut raw = vec![mine.0];
            let mut failure = None;
            for q in 1..self.nranks {
                match self.next_frame(q, label, deadline) {
                    Ok((kind::EXCH, p)) => raw.push(p),
                    Ok((k, _)) => {
                        failure = Some(BootError::new(
                            Kind::Internal,
                            format!("rank 0: rank {q} sent a frame of kind {k} at \"{label}\""),
                        ));
                        break;
                    }
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
            if let Some(f) = failure {
                let mut e = Enc::default();
                e.u32(f.kind.code()).str(&f.message);
                for c in self.conns.iter().flatten() {
                    let _ = c.send(kind::FAIL, &e.0);
                }
                return Err(f);
            }
            let mut reply = Enc::default();
            reply.u32(self.nranks as u32);
            for p in &raw {
                reply.bytes(p);
            }
            for (q, c) in self.conns.iter().enumerate() {
                if let Some(c) = c {
                    if let Err(io) = c.send(kind::RESULT, &reply.0) {
                        let f = timeout_err(format!("rank 0: rank {q} closed its connection at \"{label}\" ({io})"));
                        let mut e = Enc::default();
                        e.u32(f.kind.code()).str(&f.message);
                        for c in self.conns.iter().flatten() {
                            let _ = c.send(kind::FAIL, &e.0);
                        }
                        return Err(f);
                    }
                }
            }
            raw
        } else {
            let hub = self.conns[0].as_ref().expect("connected to the hub");
            if let Err(io) = hub.send(kind::EXCH, &mine.0) {
                return Err(timeout_err(format!(
                    "rank {}: rank 0 closed its connection at \"{label}\" ({io})",
                    self.rank
                )));
            }
            match self.next_frame(0, label, deadline)? {
                (kind::RESULT, p) => {
                    let mut d = Dec(&p);
                    let n = d.u32()? as usize;
                    if n != self.nranks {
                        return Err(BootError::new(Kind::Internal, "a result of the wrong size"));
                    }
                    (0..n).map(|_| d.bytes()).collect::<Result<Vec<_>, _>>()?
                }
                (kind::FAIL, p) => {
                    let mut d = Dec(&p);
                    let k = Kind::from_code(d.u32()?);
                    let message = d.str()?;
                    if k == Kind::Aborted {
                        // The relayed abort may still be on its way: the hub's word is enough.
                        self.shared.set_aborted(&message);
                    }
                    return Err(BootError::new(k, message));
                }
                (k, _) => {
                    return Err(BootError::new(Kind::Internal, format!("rank 0 sent a frame of kind {k}")));
                }
            }
        };
        // Every rank decodes the same parts the same way.
        let mut parts = Vec::with_capacity(self.nranks);
        let mut counts = Vec::with_capacity(self.nranks);
        let mut first_err: Option<BootError> = None;
        for (q, msg) in raw.iter().enumerate() {
            let mut d = Dec(msg);
            let their_label = d.str()?;
            if their_label != label && first_err.is_none() {
                first_err = Some(BootError::new(
                    Kind::InvalidArgument,
                    format!(
                        "rank {}: the ranks disagree: rank {q} is at \"{their_label}\" while this rank is at \
                         \"{label}\"; every rank must make the same calls (buffer allocations and frees in the same \
                         order and sizes)",
                        self.rank
                    ),
                ));
            }
            if d.u32()? != 0 {
                let code = d.u32()?;
                let message = d.str()?;
                if first_err.is_none() {
                    first_err =
                        Some(BootError::new(Kind::Failed(code), format!("rank {q} failed at \"{label}\": {message}")));
                }
            }
            let b = d.bytes()?;
            counts.push(d.u32()? as usize);
            parts.push(Part { bytes: b, fds: Vec::new() });
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        if let Some(local) = &self.local {
            let local_counts: Vec<usize> = local.members.iter().map(|&m| counts[m]).collect();
            if local_counts.iter().sum::<usize>() > 0 {
                let got = local.allgather(fds, &local_counts, deadline, self.shared.wake.as_raw_fd());
                let got = match got {
                    Err(e) if e.kind == Kind::Aborted => return Err(self.aborted_err()),
                    x => x?,
                };
                for (i, f) in got.into_iter().enumerate() {
                    parts[local.members[i]].fds = f;
                }
            }
        }
        Ok(parts)
    }

    /// Every rank reports `status`; all succeed together or all fail with the first failure.
    pub fn agree(&self, label: &str, status: Status) -> Result<(), BootError> {
        self.allgather(label, status, &[], &[]).map(|_| ())
    }

    /// Rank `root`'s `bytes` (other ranks' are ignored), on every rank.
    pub fn broadcast(&self, label: &str, root: usize, bytes: &[u8]) -> Result<Vec<u8>, BootError> {
        let mine = if self.rank == root { bytes } else { &[] };
        let mut parts = self.allgather(label, Ok(()), mine, &[])?;
        Ok(std::mem::take(&mut parts[root].bytes))
    }
}

impl Drop for Bootstrap {
    fn drop(&mut self) {
        for c in self.conns.iter().flatten() {
            let _ = c.stream.shutdown(Shutdown::Both);
        }
        for t in self.readers.lock().drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests;
