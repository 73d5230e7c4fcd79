//! How a team forms: a rank joins through a unique id or the caller's allgather, then every
//! rank connects to rank 0's hub (a star), the hosts' descriptor channels form, and one reader
//! thread per connection starts. Every frame after a handshake is sealed (see `tcp/sealed.rs`).

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::id::{check_env_mode, fresh_secret, spawn_root_until, Refusal, UniqueId, ID_BYTES};
use super::ifname;
use super::tcp::{self, kind, Acceptor, Bind, Secured, SECRET_BYTES};
use super::{
    fdpass, oob, timeout_err, BootError, Bootstrap, Conn, Deadline, Dec, Enc, Kind, Queues, Shared, ASK_ROOT, JOIN_HUB,
};

/// The status code of a rank whose descriptor channel could not be formed.
const LOCAL_SETUP: u32 = 0xffff;

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
    /// process on host `host` (see [`host::host_id`](super::host::host_id)). Bounded by `timeout_ms`.
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
        if id.rank0_listens {
            check_env_mode()?;
        }
        let deadline = Deadline::after(timeout_ms);
        // Env mode: every job at one address may derive one secret from one
        // MCAST_BOOTSTRAP_SECRET, so the handshake binds the job and the team's size too.
        let bind = if id.rank0_listens { Bind { job: tcp::job_tag(), nranks: n as u32 } } else { Bind::default() };
        let mut refusal = None;
        let hub = if r == 0 {
            if id.rank0_listens {
                refusal = Some(spawn_root_until(tcp::listen(id.addr)?, id.secret, bind.clone(), timeout_ms)?.1);
            }
            Some(Self::hub_acceptor(&id.secret, id.rank0_listens.then_some(id.addr.ip()), &bind)?)
        } else {
            None
        };
        // Ask the root where the hub is (rank 0 tells it).
        let mut s = tcp::connect(id.addr, &id.secret, &bind, deadline).map_err(|e| {
            if e.refused {
                return BootError::new(Kind::InvalidArgument, format!("rank {r}: {e}"));
            }
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
        s.send(kind::JOIN, &e.0).map_err(|e| timeout_err(format!("rank {r}: bootstrap root: {e}")))?;
        let w = s.expect(kind::WELCOME, 4096, deadline).map_err(|e| {
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
        Self::form(r, n, id.secret, &bind, hub.map(|h| (h, refusal)), hub_addr, host, timeout_ms, deadline)
    }

    fn hub_acceptor(secret: &[u8; SECRET_BYTES], ip: Option<IpAddr>, bind: &Bind) -> Result<Acceptor, BootError> {
        let ip = match ip {
            Some(ip) => ip,
            None => ifname::pick_ip()?,
        };
        let l = tcp::listen(SocketAddr::new(ip, 0))?;
        Acceptor::start(l, *secret, bind.clone(), "bootstrap hub")
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
            let hub = if r == 0 { Some(Self::hub_acceptor(&secret, None, &Bind::default())?) } else { None };
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
        Self::form(r, n, secret, &Bind::default(), hub.map(|h| (h, None)), hub_addr, host, timeout_ms, deadline)
    }

    /// Builds the star around rank 0's hub and the hosts' descriptor channels.
    #[allow(clippy::too_many_arguments)]
    fn form(
        r: usize,
        n: usize,
        secret: [u8; SECRET_BYTES],
        bind: &Bind,
        hub: Option<(Acceptor, Option<Refusal>)>,
        hub_addr: SocketAddr,
        host: String,
        timeout_ms: u32,
        deadline: Deadline,
    ) -> Result<Bootstrap, BootError> {
        // Wiped when formation ends, as the copies in the listeners are.
        let secret = zeroize::Zeroizing::new(secret);
        let mut conns: Vec<Option<Arc<Conn>>> = (0..n).map(|_| None).collect();
        let mut hosts = vec![String::new(); n];
        hosts[r] = host.clone();
        let nonce;
        if r == 0 {
            let (hub, refusal) = hub.expect("rank 0 holds the hub");
            let mut streams: Vec<Option<Secured>> = (0..n).map(|_| None).collect();
            let mut failure = None;
            let mut joined = 1;
            while joined < n {
                // Env mode: the root in this process may refuse a holder of the secret (another
                // version or job), which then never reaches the hub: look at it now and then.
                let arrival = match &refusal {
                    None => hub.next(deadline),
                    Some(slot) => loop {
                        if let Some(why) = slot.lock().clone() {
                            break Some(Err(why));
                        }
                        match hub.next(deadline.min(Duration::from_millis(20))) {
                            None if !deadline.passed() => {}
                            a => break a,
                        }
                    },
                };
                let (s, join) = match arrival {
                    Some(Ok(joined)) => joined,
                    Some(Err(why)) => {
                        failure = Some(BootError::new(Kind::InvalidArgument, format!("rank 0: {why}")));
                        break;
                    }
                    None => {
                        let missing: Vec<usize> = (1..n).filter(|&q| streams[q].is_none()).collect();
                        failure = Some(timeout_err(format!(
                            "rank 0: rank(s) {missing:?} did not join the team within timeout_ms = {timeout_ms} ms; \
                             every rank must join with the same id (or allgather) and nranks{}",
                            hub.shed().describe("rank 0's hub listener")
                        )));
                        break;
                    }
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
            let late = n - 1 - streams.iter().flatten().count();
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
                let _ = s.stream.set_write_timeout(Some(Duration::from_secs(5)));
                let _ = s.send(kind::WELCOME, &e.0);
            }
            if let Some(f) = failure {
                if late > 0 && !deadline.passed() {
                    tell_late_ranks(hub, e.0, late, deadline);
                }
                return Err(f);
            }
            drop(hub);
            for (q, s) in streams.into_iter().enumerate() {
                if let Some(s) = s {
                    conns[q] = Some(Arc::new(Conn::new(s)));
                }
            }
        } else {
            let mut s = tcp::connect(hub_addr, &secret, bind, deadline).map_err(|e| {
                let k = if e.refused { Kind::InvalidArgument } else { Kind::Timeout };
                BootError::new(k, format!("rank {r}: rank 0's hub: {e}"))
            })?;
            let mut e = Enc::default();
            e.u32(JOIN_HUB).u32(r as u32).u32(n as u32).str(&host);
            s.send(kind::JOIN, &e.0).map_err(|e| timeout_err(format!("rank {r}: hub: {e}")))?;
            let w = s.expect(kind::WELCOME, tcp::MAX_FRAME, deadline).map_err(|e| {
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
            conns[0] = Some(Arc::new(Conn::new(s)));
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
            q: Mutex::new(Queues { frames: vec![Default::default(); n], bytes: vec![0; n], closed: vec![false; n] }),
            cv: Condvar::new(),
            failed: AtomicBool::new(false),
            aborted: AtomicBool::new(false),
            failure: Mutex::new(None),
            // SAFETY: a fresh descriptor.
            wake: unsafe { OwnedFd::from_raw_fd(wake) },
            on_abort: Mutex::new(None),
            #[cfg(test)]
            readers_paused: AtomicBool::new(false),
            #[cfg(test)]
            pauses: Mutex::new(Vec::new()),
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
}

/// After a formation failed on rank 0 before its deadline (a refusal, a bad join), the ranks
/// that have not joined yet still hear why: a thread keeps the hub listening until they have
/// or the deadline passes, and answers each with the failure (`welcome`).
fn tell_late_ranks(hub: Acceptor, welcome: Vec<u8>, late: usize, deadline: Deadline) {
    let spawned = std::thread::Builder::new().name("mcast-hub-late".into()).spawn(move || {
        let mut told = 0;
        while told < late {
            match hub.next(deadline) {
                Some(Ok((mut s, _))) => {
                    let _ = s.stream.set_write_timeout(Some(Duration::from_secs(5)));
                    let _ = s.send(kind::WELCOME, &welcome);
                    told += 1;
                }
                Some(Err(_)) => {}
                None => break,
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("bootstrap hub: no thread to tell the late ranks why the team failed: {e}");
    }
}
