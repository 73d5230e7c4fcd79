//! Handshake (the listener is the server, and it proves itself first):
//! 1. server → `HELLO` = magic + its fresh 32-byte nonce `ns` + its [`Info`];
//! 2. client → `NONCE` = its fresh 32-byte nonce `nc` + its [`Info`], nothing derived from the
//!    secret;
//! 3. server → `PROOF` = HMAC-SHA256(secret, "mcast bootstrap server proof" | magic | ns | nc |
//!    server info | client info);
//! 4. the client checks it (in constant time) and only if it holds sends `PROOF` = the same with
//!    "mcast bootstrap client proof", which the server checks the same way.
//!
//! Both nonces are fresh on every connection, so a recorded proof is worth nothing on
//! another; the labels keep a server's proof from passing as a client's. SECURITY: a client
//! proves nothing to a listener that has not proved the secret, so a fake listener (or one
//! answering in the real one's place) learns no MAC to test guesses of the secret against.
//! A stranger who connects to a real listener, or who records a handshake, does learn a MAC
//! over known nonces and could test guesses offline; that is acceptable because the secret is
//! not a password: a root-mode id's secret is 256 random bits from the kernel, and the
//! environment mode's secret is stretched from `MCAST_BOOTSTRAP_SECRET` by a slow KDF and must
//! pass a rule against regular values, so no dictionary is worth running.
//!
//! The [`Info`] each side sends (library version, bootstrap protocol revision, and in env mode
//! the job tag and team size) is covered by both proofs. Two ends whose infos disagree (ranks
//! of different versions; a rank of another job that shares the secret and the address; a
//! rank with another nranks) still finish the proofs when both hold the secret, so that each
//! side knows the disagreement is real and not a stranger's claim, and then both refuse with a
//! message naming both sides' values: the connection never carries a frame of the team.
//! Whatever later revisions change, they keep this layout (magic `MCASTBS3`, the nonces, the
//! info's first fields), so that ranks of two versions can tell each other so.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use chacha20poly1305::{ChaCha20Poly1305, KeyInit};
use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use super::super::wire::{Dec, Enc};
use super::sealed::Secured;
use super::{expect_frame, kind, random_bytes, write_frame, Deadline, HANDSHAKE_MS, MAX_HANDSHAKE_FRAME, SECRET_BYTES};

const HELLO_MAGIC: &[u8; 8] = b"MCASTBS3";
pub(super) const NONCE: usize = 32;
const MAC: usize = 32;
const SERVER_PROOF: &[u8] = b"mcast bootstrap server proof";
const CLIENT_PROOF: &[u8] = b"mcast bootstrap client proof";
const CLIENT_TO_SERVER: &[u8] = b"mcast bootstrap key client to server";
const SERVER_TO_CLIENT: &[u8] = b"mcast bootstrap key server to client";

/// The revision of the bootstrap's protocol (the frames after the handshake and what they
/// mean). Ranks of two revisions refuse to form a team.
pub const PROTOCOL: u32 = 4;
/// The library's version, as the handshake names it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Longest version string sent (longer ones are cut).
const VERSION_MAX: usize = 16;
/// Longest job tag sent as it is; a longer one is sent as its start and a digest of it.
const JOB_MAX: usize = 48;

#[cfg(test)]
thread_local! {
    /// Tests only: the protocol revision this thread's ranks advertise (a rank of another
    /// revision, without building one).
    pub(crate) static PROTOCOL_OVERRIDE: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

fn advertised_protocol() -> u32 {
    #[cfg(test)]
    if let Some(p) = PROTOCOL_OVERRIDE.with(|c| c.get()) {
        return p;
    }
    PROTOCOL
}

/// What the two ends of a connection must share besides the secret: in env mode (where every
/// job at one address may derive one secret from one `MCAST_BOOTSTRAP_SECRET`) the job tag and
/// the team size; nothing in the other modes, whose secret is random per team.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bind {
    /// The job tag (see [`job_tag`]); empty when none.
    pub job: String,
    /// The team's size; 0 when not bound.
    pub nranks: u32,
}

/// The job tag of this process: `MCAST_BOOTSTRAP_JOB`, else the launcher's job id where one is
/// set (Slurm's `SLURM_JOB_ID`, then the PMIx namespace or Open MPI's job id), else empty.
pub fn job_tag() -> String {
    job_tag_from(|k| std::env::var(k).ok())
}

/// The variables [`job_tag`] reads, in order.
pub const JOB_VARS: [&str; 5] =
    ["MCAST_BOOTSTRAP_JOB", "SLURM_JOB_ID", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid", "OMPI_MCA_ess_base_jobid"];

/// [`job_tag`] from a lookup of the variables.
pub fn job_tag_from(get: impl Fn(&str) -> Option<String>) -> String {
    for k in JOB_VARS {
        if let Some(v) = get(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty()) {
            let v = if k == JOB_VARS[0] { v } else { format!("{}={v}", k) };
            return short_tag(&v);
        }
    }
    String::new()
}

/// A job tag as sent: as it is up to [`JOB_MAX`] bytes, else its start, `~` and a digest.
fn short_tag(v: &str) -> String {
    if v.len() <= JOB_MAX {
        return v.to_string();
    }
    let mut cut = 28;
    while !v.is_char_boundary(cut) {
        cut -= 1;
    }
    let d = Sha256::digest(v.as_bytes());
    let hex: String = d[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{}~{hex}", &v[..cut])
}

/// What each end of a handshake says of itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Info {
    /// Bootstrap protocol revision.
    pub protocol: u32,
    /// Library version.
    pub version: String,
    /// What the connection binds.
    pub bind: Bind,
}

impl Info {
    /// This side's info for `bind`.
    pub fn local(bind: &Bind) -> Info {
        let mut version = VERSION.to_string();
        version.truncate(VERSION_MAX);
        Info { protocol: advertised_protocol(), version, bind: Bind { job: short_tag(&bind.job), nranks: bind.nranks } }
    }

    fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.u32(self.protocol).str(&self.version).str(&self.bind.job).u32(self.bind.nranks);
        e.0
    }

    fn decode(b: &[u8]) -> Option<Info> {
        let mut d = Dec(b);
        let protocol = d.u32().ok()?;
        let version = d.str().ok()?;
        let job = d.str().ok()?;
        let nranks = d.u32().ok()?;
        Some(Info { protocol, version, bind: Bind { job, nranks } })
    }

    fn versions(&self) -> String {
        format!("mcast {} (bootstrap protocol {})", self.version, self.protocol)
    }

    fn job(&self) -> String {
        match self.bind.job.as_str() {
            "" => "no job tag".to_string(),
            j => format!("job {j:?}"),
        }
    }
}

/// Why ends with infos `mine` and `theirs` may not form a team, `None` when they may. `listener`:
/// this side is the listener; `peer` names the other end.
pub fn mismatch(mine: &Info, theirs: &Info, listener: bool, peer: &str) -> Option<String> {
    let (me, them) = if listener {
        ("this rank 0".to_string(), format!("the rank connecting from {peer}"))
    } else {
        ("this rank".to_string(), format!("the bootstrap listener at {peer}"))
    };
    if mine.protocol != theirs.protocol || mine.version != theirs.version {
        return Some(format!(
            "{them} runs {} but {me} runs {}: every rank of a team must run the same version of mcast",
            theirs.versions(),
            mine.versions()
        ));
    }
    if mine.bind.job != theirs.bind.job {
        return Some(format!(
            "{them} belongs to {} but {me} to {}, and both hold one secret at one address: two jobs share \
             MCAST_BOOTSTRAP_SECRET and MCAST_BOOTSTRAP_ADDR, and are kept apart; give each job its own secret \
             (MCAST_BOOTSTRAP_SECRET=$(openssl rand -hex 32)) or address",
            theirs.job(),
            mine.job()
        ));
    }
    if mine.bind.nranks != theirs.bind.nranks {
        return Some(format!(
            "{them} is in a team of {} ranks but {me} in one of {} ({}): every rank must pass the same nranks, and two \
             jobs must not share MCAST_BOOTSTRAP_SECRET and MCAST_BOOTSTRAP_ADDR",
            theirs.bind.nranks,
            mine.bind.nranks,
            mine.job()
        ));
    }
    None
}

fn mac(secret: &[u8; SECRET_BYTES], label: &[u8], ns: &[u8], nc: &[u8], si: &[u8], ci: &[u8]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
    m.update(label);
    m.update(HELLO_MAGIC);
    m.update(ns);
    m.update(nc);
    for part in [si, ci] {
        m.update(&(part.len() as u32).to_le_bytes());
        m.update(part);
    }
    m
}

/// The two directions' keys of a connection: (client to server, server to client).
pub(super) fn keys(secret: &[u8; SECRET_BYTES], ns: &[u8], nc: &[u8]) -> (ChaCha20Poly1305, ChaCha20Poly1305) {
    let mut salt = [0u8; 2 * NONCE];
    salt[..NONCE].copy_from_slice(ns);
    salt[NONCE..].copy_from_slice(nc);
    let hk = Hkdf::<Sha256>::new(Some(&salt), secret);
    let key = |info: &[u8]| {
        let mut k = Zeroizing::new([0u8; 32]);
        hk.expand(info, &mut k[..]).expect("32 bytes is a valid HKDF-SHA256 length");
        ChaCha20Poly1305::new((&*k).into())
    };
    (key(CLIENT_TO_SERVER), key(SERVER_TO_CLIENT))
}

/// How a server-side handshake ended well: the sealed halves, or, when the client proved the
/// secret but its info disagrees, why it may not join.
pub enum Proven {
    /// A member: (sealer of what the server sends, opener of what the client sends).
    Keys(super::Sealer, super::Opener),
    /// A holder of the secret that may not join this team (another version, job or nranks).
    Refused(String),
}

/// The server's side of one handshake, driven by the listener's event loop: [`Server::hello`]
/// makes the first frame, [`Server::on_nonce`] answers the client's nonce with the server's
/// proof, [`Server::on_proof`] checks the client's.
pub struct Server {
    ns: [u8; NONCE],
    info: Vec<u8>,
    mine: Info,
    nc: Vec<u8>,
    theirs: Vec<u8>,
}

impl Server {
    /// A fresh server side for `mine`, and its `HELLO` payload.
    pub fn hello(mine: &Info) -> io::Result<(Server, Vec<u8>)> {
        let mut ns = [0u8; NONCE];
        random_bytes(&mut ns)?;
        let info = mine.encode();
        let mut hello = HELLO_MAGIC.to_vec();
        hello.extend_from_slice(&ns);
        hello.extend_from_slice(&info);
        Ok((Server { ns, info, mine: mine.clone(), nc: Vec::new(), theirs: Vec::new() }, hello))
    }

    /// The client's `NONCE` payload: the server's `PROOF` payload to send.
    pub fn on_nonce(&mut self, secret: &[u8; SECRET_BYTES], payload: &[u8]) -> Result<Vec<u8>, String> {
        if payload.len() < NONCE || Info::decode(&payload[NONCE..]).is_none() {
            return Err(format!("a malformed nonce frame of {} bytes", payload.len()));
        }
        self.nc = payload[..NONCE].to_vec();
        self.theirs = payload[NONCE..].to_vec();
        Ok(mac(secret, SERVER_PROOF, &self.ns, &self.nc, &self.info, &self.theirs).finalize().into_bytes().to_vec())
    }

    /// The client's `PROOF` payload: the keys, or why a holder of the secret may not join
    /// (`peer` names it); `Err` when it does not prove the secret.
    pub fn on_proof(&self, secret: &[u8; SECRET_BYTES], payload: &[u8], peer: &str) -> Result<Proven, String> {
        if payload.len() != MAC {
            return Err(format!("a proof of {} bytes (expected {MAC})", payload.len()));
        }
        mac(secret, CLIENT_PROOF, &self.ns, &self.nc, &self.info, &self.theirs)
            .verify_slice(payload)
            .map_err(|_| "the connection does not know the team's secret".to_string())?;
        let theirs = Info::decode(&self.theirs).expect("checked in on_nonce");
        if let Some(why) = mismatch(&self.mine, &theirs, true, peer) {
            return Ok(Proven::Refused(why));
        }
        let (c2s, s2c) = keys(secret, &self.ns, &self.nc);
        Ok(Proven::Keys(super::Sealer::new(s2c), super::Opener::new(c2s)))
    }
}

/// Why a client's handshake failed.
#[derive(Debug)]
pub enum HsError {
    /// The connection was cut, or went silent, before the listener proved the secret (a listener
    /// under load sheds connections): worth another try.
    Cut(String),
    /// The listener does not hold the secret, speaks another protocol, or belongs to another
    /// version, job or team size: final.
    Refused(String),
}

/// Client side of the handshake, bounded by `deadline`: the client sends its proof only after
/// the server's checked out. `peer` names the listener in messages.
pub fn prove_client(
    mut s: TcpStream,
    secret: &[u8; SECRET_BYTES],
    mine: &Info,
    peer: &str,
    hello_within: Duration,
    deadline: Deadline,
) -> Result<Secured, HsError> {
    let cut = |e: String| HsError::Cut(e);
    s.set_write_timeout(Some(deadline.remaining_or(Duration::from_secs(5)).max(Duration::from_millis(1))))
        .map_err(|e| cut(e.to_string()))?;
    // The listener greets every connection it accepts at once: no greeting soon means the
    // connection is stuck in a full queue of the listener's kernel (a flood), and a fresh one
    // does better than a long wait.
    let hello = expect_frame(&mut s, kind::HELLO, MAX_HANDSHAKE_FRAME, deadline.min(hello_within)).map_err(cut)?;
    let theirs = (hello.len() > HELLO_MAGIC.len() + NONCE && &hello[..HELLO_MAGIC.len()] == HELLO_MAGIC)
        .then(|| Info::decode(&hello[HELLO_MAGIC.len() + NONCE..]))
        .flatten()
        .ok_or_else(|| {
            HsError::Refused(format!(
                "the listener at {peer} is not an mcast bootstrap of a version this one can talk to (this rank runs \
                 mcast {VERSION}, bootstrap protocol {PROTOCOL}; an mcast before 0.1 sends another greeting)"
            ))
        })?;
    let ns = &hello[HELLO_MAGIC.len()..HELLO_MAGIC.len() + NONCE];
    let si = &hello[HELLO_MAGIC.len() + NONCE..];
    let mut nonce = vec![0u8; NONCE];
    random_bytes(&mut nonce).map_err(|e| cut(e.to_string()))?;
    let ci = mine.encode();
    let nc = nonce.clone();
    nonce.extend_from_slice(&ci);
    write_frame(&mut s, kind::NONCE, &nonce).map_err(|e| cut(e.to_string()))?;
    let proof = expect_frame(&mut s, kind::PROOF, MAX_HANDSHAKE_FRAME, deadline).map_err(cut)?;
    mac(secret, SERVER_PROOF, ns, &nc, si, &ci).verify_slice(&proof).map_err(|_| {
        HsError::Refused(format!("the listener at {peer} does not know the team's secret (a stale or foreign id?)"))
    })?;
    let mine_proof = mac(secret, CLIENT_PROOF, ns, &nc, si, &ci).finalize().into_bytes();
    write_frame(&mut s, kind::PROOF, &mine_proof).map_err(|e| cut(e.to_string()))?;
    if let Some(why) = mismatch(mine, &theirs, false, peer) {
        return Err(HsError::Refused(why));
    }
    let (c2s, s2c) = keys(secret, ns, &nc);
    Ok(Secured::new(s, c2s, s2c))
}

/// Why [`connect`] failed.
#[derive(Debug)]
pub struct ConnectError {
    /// The listener was reached and refused this rank (it does not hold the secret, or belongs
    /// to another version, job or team size): nothing a longer wait would change.
    pub refused: bool,
    /// What happened, naming the listener.
    pub message: String,
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// First wait between two tries of a cut handshake; it doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(20);
const RETRY_MAX: Duration = Duration::from_millis(500);
/// How long the first try waits for the listener's greeting; it doubles with each try, up to
/// [`HANDSHAKE_MS`].
const HELLO_FIRST: Duration = Duration::from_millis(250);

/// Connects to `addr` and runs the handshake for `bind`, until `deadline`: a refused
/// connection (the listener may not be up yet) or a handshake cut before the listener proved
/// itself (a listener under load sheds connections) is tried again, with a growing wait; a
/// listener that fails its proof or belongs to another version, job or team ends it at once.
pub fn connect(
    addr: SocketAddr,
    secret: &[u8; SECRET_BYTES],
    bind: &Bind,
    deadline: Deadline,
) -> Result<Secured, ConnectError> {
    let fail = |refused, message| ConnectError { refused, message };
    let mine = Info::local(bind);
    let mut last = String::new();
    let (mut cuts, mut wait, mut hello_within) = (0u32, RETRY_FIRST, HELLO_FIRST);
    loop {
        let left = deadline.remaining_or(Duration::from_secs(10));
        if deadline.passed() || left.is_zero() {
            if cuts > 0 {
                return Err(fail(
                    false,
                    format!(
                    "the bootstrap listener at {addr} cut this rank's handshake {cuts} time(s) and the timeout passed \
                     (the listener is under load, e.g. a flood of connections; last: {last})"
                ),
                ));
            }
            return Err(fail(false, format!("cannot reach the bootstrap at {addr}: {last}")));
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                let hs = deadline.min(Duration::from_millis(HANDSHAKE_MS * 2));
                match prove_client(s, secret, &mine, &addr.to_string(), hello_within, hs) {
                    Ok(c) => return Ok(c),
                    Err(HsError::Refused(e)) => {
                        return Err(fail(true, format!("bootstrap handshake with {addr}: {e}")))
                    }
                    Err(HsError::Cut(e)) => {
                        cuts += 1;
                        last = e;
                        let nap = wait.min(deadline.remaining_or(wait));
                        std::thread::sleep(nap);
                        wait = (wait * 2).min(RETRY_MAX);
                        hello_within = (hello_within * 2).min(Duration::from_millis(HANDSHAKE_MS));
                        continue;
                    }
                }
            }
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::TcpListener;

    use super::super::Acceptor;
    use super::*;

    fn acceptor(secret: [u8; SECRET_BYTES], bind: Bind) -> (Acceptor, SocketAddr) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        (Acceptor::start(l, secret, bind, "test").unwrap(), addr)
    }

    #[test]
    fn handshake_accepts_the_secret_and_refuses_others() {
        let (acc, addr) = acceptor([7; SECRET_BYTES], Bind::default());
        // Wrong secret: the client sees the server's proof fail.
        let e = connect(addr, &[8; SECRET_BYTES], &Bind::default(), Deadline::after_ms(3000)).err().unwrap().message;
        assert!(e.contains("does not know the team's secret"), "{e}");
        let mut s = connect(addr, &[7; SECRET_BYTES], &Bind::default(), Deadline::after_ms(3000)).unwrap();
        s.send(kind::JOIN, b"hi").unwrap();
        let (_, join) = acc.next(Deadline::after_ms(3000)).unwrap().unwrap();
        assert_eq!(join, b"hi");
        assert!(acc.next(Deadline::after_ms(50)).is_none());
    }

    /// The listener proves the secret first: a client that sends nothing but its nonce after
    /// HELLO gets the server's proof (and nothing an offline guess could use is asked of it).
    #[test]
    fn the_server_proves_first() {
        let secret = [7; SECRET_BYTES];
        let (_acc, addr) = acceptor(secret, Bind::default());
        let mut s = TcpStream::connect(addr).unwrap();
        let hello = expect_frame(&mut s, kind::HELLO, MAX_HANDSHAKE_FRAME, Deadline::after_ms(3000)).unwrap();
        assert_eq!(&hello[..8], HELLO_MAGIC);
        let ns = &hello[8..8 + NONCE];
        let si = &hello[8 + NONCE..];
        assert_eq!(Info::decode(si).unwrap(), Info::local(&Bind::default()));
        let ci = Info::local(&Bind::default()).encode();
        let mut nonce = vec![3u8; NONCE];
        nonce.extend_from_slice(&ci);
        write_frame(&mut s, kind::NONCE, &nonce).unwrap();
        let theirs = expect_frame(&mut s, kind::PROOF, MAX_HANDSHAKE_FRAME, Deadline::after_ms(3000))
            .expect("the server sent its proof before asking for the client's");
        let want = mac(&secret, b"mcast bootstrap server proof", ns, &[3u8; NONCE], si, &ci).finalize().into_bytes();
        assert_eq!(theirs, want.to_vec());
    }

    /// A client whose listener fails its proof sends nothing more (no MAC to test guesses on).
    #[test]
    fn a_client_never_proves_to_a_server_that_failed() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let client = std::thread::spawn(move || {
            connect(addr, &[7; SECRET_BYTES], &Bind::default(), Deadline::after_ms(3000))
                .map(|_| ())
                .map_err(|e| e.message)
        });
        let (mut s, _) = l.accept().unwrap();
        let mut hello = HELLO_MAGIC.to_vec();
        hello.extend_from_slice(&[1u8; NONCE]);
        hello.extend_from_slice(&Info::local(&Bind::default()).encode());
        write_frame(&mut s, kind::HELLO, &hello).unwrap();
        let first = expect_frame(&mut s, kind::NONCE, MAX_HANDSHAKE_FRAME, Deadline::after_ms(3000)).unwrap();
        assert_eq!(Info::decode(&first[NONCE..]).unwrap(), Info::local(&Bind::default()), "a nonce and an info");
        // A server that does not know the secret.
        write_frame(&mut s, kind::PROOF, &[0u8; MAC]).unwrap();
        let e = client.join().unwrap().unwrap_err();
        assert!(e.contains("does not know the team's secret"), "{e}");
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "the client sent {} more bytes after a failed server proof", rest.len());
    }

    /// Ranks of two protocol revisions (or versions) refuse each other, and each side's message
    /// names both; the listener hears it as an authenticated refusal, not a member.
    #[test]
    fn two_protocol_revisions_refuse_each_other_naming_both() {
        let secret = [9; SECRET_BYTES];
        let (acc, addr) = acceptor(secret, Bind::default());
        let client = std::thread::spawn(move || {
            PROTOCOL_OVERRIDE.with(|c| c.set(Some(PROTOCOL + 1)));
            connect(addr, &secret, &Bind::default(), Deadline::after_ms(3000)).map(|_| ()).map_err(|e| e.message)
        });
        let e = client.join().unwrap().unwrap_err();
        let (this, listener) =
            (format!("bootstrap protocol {}", PROTOCOL + 1), format!("bootstrap protocol {PROTOCOL}"));
        assert!(e.contains(&this) && e.contains(&listener) && e.contains("same version of mcast"), "{e}");
        let refused = acc.next(Deadline::after_ms(3000)).expect("the listener heard of it").err().unwrap();
        assert!(refused.contains(&this) && refused.contains(&listener), "{refused}");
        // A stranger claiming another revision without the secret is no refusal, only a drop.
        let stranger = std::thread::spawn(move || {
            PROTOCOL_OVERRIDE.with(|c| c.set(Some(PROTOCOL + 1)));
            connect(addr, &[1; SECRET_BYTES], &Bind::default(), Deadline::after_ms(3000))
                .map(|_| ())
                .map_err(|e| e.message)
        });
        assert!(stranger.join().unwrap().unwrap_err().contains("does not know the team's secret"));
        assert!(acc.next(Deadline::after_ms(200)).is_none());
    }

    /// Two jobs with one secret at one address: a rank of the other job (or of another team
    /// size) is refused on both sides, naming both jobs.
    #[test]
    fn another_job_or_team_size_is_refused_naming_both() {
        let secret = [4; SECRET_BYTES];
        let a = Bind { job: "SLURM_JOB_ID=100".into(), nranks: 4 };
        let (acc, addr) = acceptor(secret, a.clone());
        let b = Bind { job: "SLURM_JOB_ID=200".into(), nranks: 4 };
        let e = connect(addr, &secret, &b, Deadline::after_ms(3000)).err().unwrap().message;
        assert!(e.contains("SLURM_JOB_ID=100") && e.contains("SLURM_JOB_ID=200") && e.contains("two jobs"), "{e}");
        let r = acc.next(Deadline::after_ms(3000)).unwrap().err().unwrap();
        assert!(r.contains("SLURM_JOB_ID=100") && r.contains("SLURM_JOB_ID=200"), "{r}");
        let e =
            connect(addr, &secret, &Bind { nranks: 8, ..a.clone() }, Deadline::after_ms(3000)).err().unwrap().message;
        assert!(e.contains("team of 4 ranks") && e.contains("one of 8"), "{e}");
        assert!(acc.next(Deadline::after_ms(3000)).unwrap().is_err());
        // The same job and size join.
        let mut s = connect(addr, &secret, &a, Deadline::after_ms(3000)).unwrap();
        s.send(kind::JOIN, b"a").unwrap();
        assert_eq!(acc.next(Deadline::after_ms(3000)).unwrap().unwrap().1, b"a");
    }

    #[test]
    fn the_job_tag_comes_from_the_first_variable_set_and_long_ones_are_shortened() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|p| p.0 == k).map(|p| p.1.to_string())
        };
        assert_eq!(job_tag_from(env(&[])), "");
        assert_eq!(job_tag_from(env(&[("SLURM_JOB_ID", "77"), ("PMIX_NAMESPACE", "x")])), "SLURM_JOB_ID=77");
        assert_eq!(job_tag_from(env(&[("MCAST_BOOTSTRAP_JOB", " run-3 "), ("SLURM_JOB_ID", "77")])), "run-3");
        assert_eq!(job_tag_from(env(&[("OMPI_MCA_orte_ess_jobid", "123456")])), "OMPI_MCA_orte_ess_jobid=123456");
        let long = "prterun-node0042-1234567@1-and-a-long-suffix-here";
        let a = job_tag_from(move |k: &str| (k == "PMIX_NAMESPACE").then(|| long.to_string()));
        let b = job_tag_from(move |k: &str| (k == "PMIX_NAMESPACE").then(|| format!("{long}2")));
        assert!(a.len() <= JOB_MAX && a.starts_with("PMIX_NAMESPACE=prte"), "{a}");
        assert_ne!(a, b, "two long tags that differ at the end stay apart");
    }
}
