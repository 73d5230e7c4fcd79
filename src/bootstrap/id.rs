//! Unique ids: the 128 bytes every rank passes (address, mode, secret), how a fresh one is made,
//! and the root listener that tells the ranks of an id where rank 0's hub listens.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use zeroize::Zeroizing;

use super::ifname;
use super::tcp::{self, kind, Acceptor, Bind, Secured, SECRET_BYTES};
use super::{BootError, Deadline, Dec, Enc, Kind, ASK_ROOT, DEFAULT_TIMEOUT_MS};

/// Bytes of a unique id.
pub const ID_BYTES: usize = 128;
pub(super) const ID_MAGIC: &[u8; 8] = b"MCASTID2";
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

impl Drop for UniqueId {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.secret);
    }
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

pub(super) fn fresh_secret() -> Result<[u8; SECRET_BYTES], BootError> {
    let mut s = [0u8; SECRET_BYTES];
    tcp::random_bytes(&mut s).map_err(|e| BootError::new(Kind::Internal, format!("getrandom failed: {e}")))?;
    Ok(s)
}

/// The variable naming rank 0's address in env mode.
pub const ADDR_ENV: &str = "MCAST_BOOTSTRAP_ADDR";
/// The variable holding env mode's shared secret.
pub const SECRET_ENV: &str = "MCAST_BOOTSTRAP_SECRET";
/// The fewest hex digits `MCAST_BOOTSTRAP_SECRET` may have: 32 digits are 128 bits.
pub const SECRET_MIN_HEX_DIGITS: usize = 32;
/// PBKDF2-HMAC-SHA256 rounds that stretch `MCAST_BOOTSTRAP_SECRET` into the id's secret (OWASP's
/// figure for this PRF): 65 ms of CPU once per process on an x86 core with the SHA extensions,
/// a few times that without, seconds in an unoptimised (debug) build, so that guessing a weak secret offline
/// from a captured handshake costs as much per guess.
const SECRET_KDF_ROUNDS: u32 = 600_000;
/// The salt's prefix (the address follows): ties a derived secret to this use and address.
const SECRET_KDF_SALT: &[u8] = b"mcast bootstrap env secret v2\0";

/// How to make a secret that meets the rule, for the error messages.
const SECRET_HOW: &str = "it must be at least 32 hex digits (0-9, a-f: 128 bits) and nothing else, from a random \
                          source and fresh for each job, shared by the job's processes: for example \
                          MCAST_BOOTSTRAP_SECRET=$(openssl rand -hex 32) or $(head -c32 /dev/urandom | xxd -p -c64)";

/// Fewest distinct digits a secret may hold: 32 random hex digits hold fewer than 8 with a
/// probability of 4e-8.
const SECRET_MIN_DISTINCT: usize = 8;

/// Why the hex digits `v` (lower case) are too regular to be a secret made at random, if they
/// are: one digit repeated, a short pattern repeated (a period of at most half the length), a
/// sequence (steps between digits that repeat with a period of at most 4: `0123...`,
/// `fedc...`, `00112233...`, `02468ace...`), or fewer than [`SECRET_MIN_DISTINCT`] distinct
/// digits. A secret from a random source fails these with a probability below 1e-7.
pub(super) fn weak_secret(v: &str) -> Option<String> {
    let d: Vec<u8> = v.bytes().map(|b| (b as char).to_digit(16).expect("hex digits") as u8).collect();
    let n = d.len();
    if d.iter().all(|&x| x == d[0]) {
        return Some("one digit repeated".into());
    }
    let periodic = |s: &[u8], max: usize| (1..=max).find(|&p| (p..s.len()).all(|i| s[i] == s[i - p]));
    if let Some(p) = periodic(&d, n / 2) {
        return Some(format!("a pattern of {p} digits repeated"));
    }
    let steps: Vec<u8> = d.windows(2).map(|w| w[1].wrapping_sub(w[0]) & 15).collect();
    if periodic(&steps, 4).is_some() {
        return Some("a sequence".into());
    }
    let mut seen = [false; 16];
    for &x in &d {
        seen[x as usize] = true;
    }
    let distinct = seen.iter().filter(|&&b| b).count();
    if distinct < SECRET_MIN_DISTINCT {
        return Some(format!("only {distinct} distinct digits"));
    }
    None
}

/// `MCAST_BOOTSTRAP_ADDR`, parsed (`value` is the variable's value, if set).
fn parse_bootstrap_addr(value: Option<&str>) -> Result<Option<SocketAddr>, BootError> {
    match value.map(str::trim) {
        Some(v) if !v.is_empty() => v.parse().map(Some).map_err(|_| {
            BootError::new(
                Kind::InvalidArgument,
                format!("{ADDR_ENV}={v} is not ip:port (for example 10.0.0.1:29500 or [fd00::1]:29500)"),
            )
        }),
        _ => Ok(None),
    }
}

/// `MCAST_BOOTSTRAP_SECRET` checked against the rule: surrounding whitespace removed, at least
/// [`SECRET_MIN_HEX_DIGITS`] hex digits and nothing else, not too regular ([`weak_secret`]);
/// returned in lower case (one value
/// whatever the case the launcher wrote). The messages never repeat the value.
pub(super) fn checked_secret(value: Option<&str>) -> Result<String, BootError> {
    let bad = |what: String| BootError::new(Kind::InvalidArgument, format!("{what}; {SECRET_HOW}"));
    let v = value.map(str::trim).unwrap_or("");
    if v.is_empty() {
        return Err(bad(format!(
            "{ADDR_ENV} is set but {SECRET_ENV} is not (without it anyone who knows the address could join the team)"
        )));
    }
    if !v.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad(format!("{SECRET_ENV} holds characters other than hex digits")));
    }
    if v.len() < SECRET_MIN_HEX_DIGITS {
        return Err(bad(format!("{SECRET_ENV} has {} hex digits ({} bits), too few", v.len(), v.len() * 4)));
    }
    let v = v.to_ascii_lowercase();
    if let Some(why) = weak_secret(&v) {
        return Err(bad(format!(
            "{SECRET_ENV} is too regular to have come from a random source ({why}): anyone could guess it"
        )));
    }
    Ok(v)
}

/// The id's secret in env mode: `secret` (checked) stretched by PBKDF2-HMAC-SHA256 salted with
/// `addr`. Every process derives the same bytes from the same pair; the last pair is cached,
/// so a process pays for the derivation once.
pub(super) fn derive_env_secret(addr: SocketAddr, secret: &str) -> [u8; SECRET_BYTES] {
    // Wiped when replaced (the last pair stays for the process's life).
    type Cached = (SocketAddr, Zeroizing<String>, Zeroizing<[u8; SECRET_BYTES]>);
    static LAST: parking_lot::Mutex<Option<Cached>> = parking_lot::Mutex::new(None);
    let mut last = LAST.lock();
    if let Some((a, s, out)) = last.as_ref() {
        if *a == addr && s.as_str() == secret {
            return **out;
        }
    }
    let mut salt = SECRET_KDF_SALT.to_vec();
    salt.extend_from_slice(addr.to_string().as_bytes());
    let mut out = [0u8; SECRET_BYTES];
    pbkdf2::pbkdf2_hmac::<sha2::Sha256>(secret.as_bytes(), &salt, SECRET_KDF_ROUNDS, &mut out);
    *last = Some((addr, Zeroizing::new(secret.to_string()), Zeroizing::new(out)));
    out
}

/// The env-mode id from the values of `MCAST_BOOTSTRAP_ADDR` and `MCAST_BOOTSTRAP_SECRET`:
/// `None` when the address is unset or empty; refused when the secret breaks the rule.
pub(super) fn env_mode_id(addr: Option<&str>, secret: Option<&str>) -> Result<Option<UniqueId>, BootError> {
    let Some(addr) = parse_bootstrap_addr(addr)? else { return Ok(None) };
    let secret = Zeroizing::new(checked_secret(secret)?);
    Ok(Some(UniqueId { addr, secret: derive_env_secret(addr, &secret), rank0_listens: true }))
}

/// Refuses to join an env-mode id in a process whose environment sets `MCAST_BOOTSTRAP_ADDR`
/// without a secret that meets the rule (the id would have been made from that environment).
pub(super) fn check_env_mode() -> Result<(), BootError> {
    let addr = std::env::var(ADDR_ENV).ok();
    if parse_bootstrap_addr(addr.as_deref())?.is_some() {
        checked_secret(std::env::var(SECRET_ENV).ok().as_deref())?;
    }
    Ok(())
}

/// A fresh unique id. With `MCAST_BOOTSTRAP_ADDR` set, the id names that address, no listener
/// starts (rank 0 will listen there) and every process makes the same id, its secret derived
/// from the address and `MCAST_BOOTSTRAP_SECRET` (refused when missing or shorter than 32 hex
/// digits); otherwise as [`new_root_id`].
pub fn new_unique_id() -> Result<[u8; ID_BYTES], BootError> {
    let addr = std::env::var(ADDR_ENV).ok();
    let secret = std::env::var(SECRET_ENV).ok();
    match env_mode_id(addr.as_deref(), secret.as_deref())? {
        Some(id) => Ok(id.encode()),
        None => new_root_id(),
    }
}

/// A fresh root-mode id, whatever the environment: a random secret, and a root listener started
/// in this process on the interface [`ifname::pick_ip`](super::ifname::pick_ip) chooses, serving the team until every rank
/// asked it where the hub is (or `MCAST_TIMEOUT_MS` passes with no rank asking). Teams made
/// inside a job (split) use it: they never share the
/// job's env-mode address and secret.
pub fn new_root_id() -> Result<[u8; ID_BYTES], BootError> {
    let secret = fresh_secret()?;
    let ip = ifname::pick_ip()?;
    let listener = tcp::listen(SocketAddr::new(ip, 0))?;
    let addr = listener.local_addr().map_err(|e| BootError::new(Kind::Internal, e.to_string()))?;
    spawn_root(listener, secret)?;
    Ok(UniqueId { addr, secret, rank0_listens: false }.encode())
}

/// How long a root listener made by [`new_unique_id`] waits for the next rank:
/// `MCAST_TIMEOUT_MS` (0: for ever), else [`DEFAULT_TIMEOUT_MS`]. The id's maker has no
/// context, so the variable is read here; a malformed value counts as unset.
fn root_timeout_ms() -> u32 {
    std::env::var("MCAST_TIMEOUT_MS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(DEFAULT_TIMEOUT_MS)
}

/// The root of a unique id made by [`new_unique_id`]: [`spawn_root_until`] with
/// `MCAST_TIMEOUT_MS`.
pub(super) fn spawn_root(listener: std::net::TcpListener, secret: [u8; SECRET_BYTES]) -> Result<(), BootError> {
    spawn_root_until(listener, secret, Bind::default(), root_timeout_ms()).map(drop)
}

/// Most ranks the root keeps waiting for rank 0 (each a distinct rank below its nranks).
const ROOT_MAX_WAITING: usize = 4096;

/// The root of a unique id: tells every rank where rank 0's hub listens. It checks every
/// claim: rank 0 is taken once (a second claim is refused and logged and never replaces the
/// hub), every rank is below nranks and served once, at most [`ROOT_MAX_WAITING`] wait for
/// rank 0. It ends, closing its listener and its threads, once every rank of the team has
/// asked, or when `timeout_ms` passes (0: never) without a rank asking; the ranks still
/// waiting for rank 0 are then told so. A holder of the secret that may not join (another
/// version, job or team size) is refused, and so is every rank after it. Returns the root
/// thread and where it writes why it refused one (rank 0 of env mode, in this process, watches
/// it while its hub waits).
pub(super) fn spawn_root_until(
    listener: std::net::TcpListener,
    secret: [u8; SECRET_BYTES],
    bind: Bind,
    timeout_ms: u32,
) -> Result<(std::thread::JoinHandle<()>, Refusal), BootError> {
    let acceptor = Acceptor::start(listener, secret, bind, "bootstrap root")
        .map_err(|e| BootError::new(Kind::Internal, format!("starting the bootstrap root: {e}")))?;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let refusal = Refusal::default();
    let told = refusal.clone();
    let thread = std::thread::Builder::new()
        .name("mcast-root".into())
        .spawn(move || {
            // A first, timed-out wait sets up this thread's channel waiting state (which
            // allocates once); the waits after the ready signal allocate nothing.
            let mut early = acceptor.next(Deadline::after_ms(1));
            // The sender lives as long as the thread (see `Acceptor::start`).
            let _ = ready_tx.send(());
            let mut root = Root::default();
            let mut until = Deadline::after(timeout_ms);
            while !root.formed() {
                let (s, join) = match early.take().or_else(|| acceptor.next(until)) {
                    Some(Ok(joined)) => joined,
                    Some(Err(why)) => {
                        let why = root.refuse(why);
                        told.lock().get_or_insert(why);
                        continue;
                    }
                    None => {
                        root.expire(timeout_ms, &acceptor.shed().describe("the root listener"));
                        break;
                    }
                };
                let mut d = Dec(&join);
                let (Ok(ASK_ROOT), Ok(rank), Ok(nranks), Ok(addr)) = (d.u32(), d.u32(), d.u32(), d.str()) else {
                    tracing::warn!("bootstrap root: dropped a malformed request");
                    continue;
                };
                if root.ask(s, rank, nranks, addr) {
                    until = Deadline::after(timeout_ms);
                }
            }
            drop(acceptor);
        })
        .map_err(|e| BootError::new(Kind::Internal, format!("starting the bootstrap root thread: {e}")))?;
    // As in `Acceptor::start`: the thread is parked in its loop before the id is handed out.
    let _ = ready_rx.recv();
    Ok((thread, refusal))
}

/// Why a root refused a holder of the team's secret, once it did.
pub(super) type Refusal = std::sync::Arc<parking_lot::Mutex<Option<String>>>;

/// What the root knows: rank 0's hub, the ranks waiting for it, the ranks served, and why a
/// holder of the secret was refused (another version, job or team size), if one was.
#[derive(Default)]
struct Root {
    hub: Option<(String, u32)>,
    waiting: Vec<(Secured, u32, u32)>,
    served: BTreeSet<u32>,
    refused: Option<String>,
}

/// Sends a rank its answer: `Ok(hub address)` or `Err(why)`.
fn answer(mut s: Secured, reply: Result<&str, &str>) {
    let mut e = Enc::default();
    match reply {
        Ok(addr) => e.u32(0).str(addr),
        Err(why) => e.u32(1).str(why),
    };
    let _ = s.stream.set_write_timeout(Some(Duration::from_secs(5)));
    let _ = s.send(kind::WELCOME, &e.0);
}

impl Root {
    fn formed(&self) -> bool {
        self.hub.as_ref().is_some_and(|(_, n)| self.served.len() >= *n as usize)
    }

    /// A holder of the secret was refused: the team cannot be trusted to form (two versions,
    /// or two jobs sharing a secret and an address), so every rank waiting, and every rank that
    /// asks from now on, rank 0 included, hears why.
    fn refuse(&mut self, why: String) -> String {
        let why = format!("the bootstrap root refused a process that holds this team's secret: {why}");
        for (w, rank, _) in self.waiting.drain(..) {
            answer(w, Err(&why));
            self.served.insert(rank);
        }
        self.refused.get_or_insert(why).clone()
    }

    /// Takes `rank`'s question; `true` when it was a valid one (the root then waits longer).
    fn ask(&mut self, s: Secured, rank: u32, nranks: u32, addr: String) -> bool {
        let n = self.hub.as_ref().map_or(nranks, |h| h.1);
        let refusal = if let Some(why) = &self.refused {
            Some(why.clone())
        } else if rank >= nranks {
            Some(format!("rank {rank} is out of range for nranks = {nranks}: every rank must be below nranks"))
        } else if rank >= n {
            Some(format!("rank {rank} is out of range for nranks = {n} (rank 0's): every rank must be below nranks"))
        } else if rank == 0 && self.hub.is_some() {
            Some(
                "a second process claims rank 0 of this id; the first one's hub stays (every rank must pass a \
                 distinct rank)"
                    .to_string(),
            )
        } else if self.served.contains(&rank) || self.waiting.iter().any(|w| w.1 == rank) {
            Some(format!("rank {rank} asked the bootstrap root twice: every rank must pass a distinct rank"))
        } else if self.waiting.len() >= ROOT_MAX_WAITING {
            Some(format!("more than {ROOT_MAX_WAITING} ranks wait for rank 0 of this id"))
        } else {
            None
        };
        if let Some(why) = refusal {
            tracing::warn!("bootstrap root: refused a request: {why}");
            answer(s, Err(&why));
            return false;
        }
        if rank == 0 {
            self.hub = Some((addr, nranks));
        }
        self.waiting.push((s, rank, nranks));
        let Some((addr, n)) = &self.hub else { return true };
        for (w, rank, their_n) in self.waiting.drain(..) {
            if rank >= *n {
                answer(w, Err(&format!("rank {rank} is out of range for nranks = {n} (rank 0's)")));
                continue;
            }
            if their_n == *n {
                answer(w, Ok(addr));
            } else {
                answer(
                    w,
                    Err(&format!(
                        "rank {rank} says nranks = {their_n} but rank 0 says nranks = {n}; every rank must pass the \
                         same nranks"
                    )),
                );
            }
            self.served.insert(rank);
        }
        true
    }

    /// The root's time ran out: the ranks still waiting hear why.
    fn expire(&mut self, timeout_ms: u32, load: &str) {
        for (w, rank, _) in self.waiting.drain(..) {
            answer(
                w,
                Err(&format!(
                    "rank {rank}: rank 0 did not ask the id's bootstrap root within timeout_ms = {timeout_ms} ms of the \
                     last rank (MCAST_TIMEOUT_MS of the process that made the id); the root closed{load}"
                )),
            );
        }
        if self.hub.is_some() {
            tracing::warn!("bootstrap root: closed after {timeout_ms} ms without every rank");
        }
    }
}
