//! Making a team: in one process over a list of devices ([`Team::create`]), or one rank per
//! process meeting over the bootstrap ([`Team::init_rank`], [`Team::init_oob`]); both choose the
//! transport, the granularity and the grid cap, then build the first segment and assemble the
//! team the same way.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLock};

use super::domains::{self, Domains};
use super::pool::Pool;
use super::streams::Claims;
use super::transport::{self, handle_type_label, Transport};
use super::Team;
use crate::bootstrap::{host, Bootstrap};
use crate::driver::{uuid_string, Device, HandleTypes};
use crate::kernels::abi::{device_bytes, device_offset, ll_bytes, ll_offset, DOORBELL_OFFSET};
use crate::kernels::{MAX_RANKS, SYNC_BYTES};
use crate::runtime::comm::{Comm, Dec, Enc, ID_BYTES};
use crate::runtime::config::{MulticastMode, MAX_DEVICE_SLOTS};
use crate::runtime::doorbell::Doorbell;
use crate::runtime::env::{lcm, Env, Leftover};
use crate::runtime::error::{Error, ErrorKind, Result};
use crate::runtime::policy;
use crate::runtime::segment::{Segment, Shape};

/// What [`Team::join_rank`] gave.
pub enum Joined {
    /// The team.
    Team(Arc<Team>),
    /// The ranks span several NVLink domains, which a flat team does not: their connections
    /// (for a team across domains, `runtime::hier`, or the caller's own exchanges), the domains
    /// and the refusal [`Team::init_rank`] returns.
    AcrossDomains {
        /// The team's connections, formed.
        comm: Arc<Comm>,
        /// `NotSupported`, naming the domains.
        refusal: Error,
        /// The domains, the same on every rank.
        domains: Domains,
        /// Why the ranks are not one domain (ends the messages).
        why: String,
    },
}

impl Joined {
    /// The flat team, or the refusal of ranks in several NVLink domains.
    pub fn flat(self) -> Result<Arc<Team>> {
        match self {
            Joined::Team(team) => Ok(team),
            Joined::AcrossDomains { refusal, .. } => Err(refusal),
        }
    }
}

impl Team {
    /// Creates a team over `devices` in `env` (a context: `&ctx`).
    pub fn create(env: &Arc<Env>, devices: &[i32]) -> Result<Arc<Team>> {
        static SERIAL: AtomicU64 = AtomicU64::new(1);
        if devices.is_empty() {
            return Err(Error::invalid_argument("a team needs at least one device (ndevices was 0)"));
        }
        if devices.len() > MAX_RANKS {
            return Err(Error::invalid_argument(format!(
                "a team has at most {MAX_RANKS} ranks; {} devices were given",
                devices.len()
            )));
        }
        for (rank, &d) in devices.iter().enumerate() {
            env.check_device(d, &format!("devices[{rank}] ="))?;
        }
        let reasons = devices.iter().map(|&d| env.multicast_reason(d)).collect::<Result<Vec<_>>>()?;
        let gpus = devices.iter().map(|&d| env.props(d).map(|p| p.uuid)).collect::<Result<Vec<_>>>()?;
        let reason = policy::team_reason(devices, &gpus, &reasons);
        let peer_problem = transport::peer_problem(env, devices)?;
        let required = (env.config().multicast == MulticastMode::Require).then_some("");
        let (transport, reason) = transport::choose(reason, peer_problem, required, devices)?;
        let granularity = env.granularity(devices, HandleTypes::NONE, transport == Transport::Multicast)?;
        let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
        let shape = Shape {
            devices: devices.to_vec(),
            multicast: transport == Transport::Multicast,
            owner: format!("team {serial} (devices {devices:?})"),
            alignment: granularity,
            comm: None,
            handle_type: HandleTypes::NONE,
        };
        let ll = env.ll_wanted() && ll_bytes(devices.len() as u32) > 0;
        let slots = env.config().device_slots;
        let (seg, reserved, bell) = first_segment(env, &shape, ll, slots)?;
        let max_blocks = match transport::block_cap(env, devices) {
            Ok(m) => m,
            Err(e) => {
                abandon(env, seg);
                for undo in bell.release(env) {
                    tracing::error!("rolling back team creation: {undo}");
                }
                return Err(e);
            }
        };
        let ce = env.ce_min_bytes();
        let agreed = (max_blocks, ll, ce, slots, env.config().check_calls);
        let team =
            Team::assemble(env, shape, transport, reason, agreed, Domains::one(devices.len()), (seg, reserved, bell));
        tracing::debug!("team {serial} on devices {devices:?}: {transport:?} {}, LL {ll}", team.reason);
        Ok(team)
    }

    /// Joins a multi-process team as `rank` of `nranks` on `device`: the processes meet through
    /// the unique id `id` (see [`crate::bootstrap`]: TCP, on one host or many), agree on the
    /// transport from every rank's capabilities and on how memory travels between them (see
    /// [`Team::handle_type`]), and build the first segment together. Every step ends with a
    /// vote, so a failure on one rank is an error on every rank; every wait is bounded by
    /// `timeout_ms`.
    /// Ranks in several NVLink domains fail with `NotSupported` on every rank, naming the
    /// domains: [`Team::join_rank`] gives their connections for a team across them.
    pub fn init_rank(env: &Arc<Env>, id: &[u8; ID_BYTES], nranks: i32, rank: i32, device: i32) -> Result<Arc<Team>> {
        Self::join_rank(env, id, nranks, rank, device)?.flat()
    }

    fn boot_rank(env: &Env, id: &[u8; ID_BYTES], nranks: i32, rank: i32) -> Result<Bootstrap> {
        Ok(Bootstrap::init_id(
            id,
            i64::from(nranks),
            i64::from(rank),
            MAX_RANKS,
            env.config().timeout_ms,
            host::host_id(),
        )?)
    }

    /// [`Team::init_rank`], but a team whose ranks span several NVLink domains gives back the
    /// formed connections with a refusal, the same on every rank, for a caller that serves such
    /// a team another way (a team across domains, `runtime::hier`; `libmcast_nccl` hands it to
    /// NCCL).
    pub fn join_rank(env: &Arc<Env>, id: &[u8; ID_BYTES], nranks: i32, rank: i32, device: i32) -> Result<Joined> {
        let comm = Arc::new(Comm::new(Self::boot_rank(env, id, nranks, rank)?));
        Self::init_with(env, comm, device)
    }

    /// Like [`Team::init_rank`], but the processes meet through the caller's allgather
    /// (`allgather(send, recv)` gathers `send` from every rank into `recv` in rank order),
    /// called exactly once on every rank whatever fails locally (a local failure travels in
    /// the record, so every rank fails together); afterwards only the team's own connections
    /// are used. Ranks in several NVLink domains: as [`Team::join_rank`].
    pub fn join_oob(
        env: &Arc<Env>,
        allgather: crate::bootstrap::oob::Allgather<'_>,
        nranks: i32,
        rank: i32,
        device: i32,
    ) -> Result<Joined> {
        let problem = env.check_device(device, "device").err().map(|e| e.message);
        let boot = Bootstrap::init_oob(
            allgather,
            i64::from(nranks),
            i64::from(rank),
            MAX_RANKS,
            env.config().timeout_ms,
            host::host_id(),
            problem,
        )?;
        Self::init_with(env, Arc::new(Comm::new(boot)), device)
    }

    /// The rest of [`Team::join_rank`] once the ranks are connected.
    fn init_with(env: &Arc<Env>, comm: Arc<Comm>, device: i32) -> Result<Joined> {
        static SERIAL: AtomicU64 = AtomicU64::new(1);
        let (n, r) = (comm.nranks(), comm.rank());
        comm.vote("arguments", env.check_device(device, "device").map(|_| ()))?;
        // NVLink domains first (the same on every rank).
        let (domains, why) = domains::decide(env, &comm, device)?;
        if domains.count() > 1 {
            let refusal = domains::refusal(&domains, &why);
            return Ok(Joined::AcrossDomains { comm, refusal, domains, why });
        }
        // Capabilities: every rank's device, its GPU's UUID, why it cannot use multicast, and
        // its mode. Ordinals are the ranks' own (each process may see other GPUs, in another
        // order); "the same GPU?" is decided by UUID.
        let reason = env.multicast_reason(device);
        let mine = env.props(device).map(|p| p.uuid);
        let require = env.config().multicast == MulticastMode::Require;
        let mut e = Enc::default();
        e.u32(device as u32);
        e.bytes(mine.as_ref().unwrap_or(&[0; 16]));
        match &reason {
            Ok(Some(why)) => e.u32(1).str(why),
            _ => e.u32(0),
        };
        e.u32(u32::from(require));
        let ok = reason.as_ref().map(|_| ()).map_err(Clone::clone).and(mine.as_ref().map(|_| ()).map_err(Clone::clone));
        let parts = comm.exchange("capabilities", ok, &e.0, &[])?;
        let mut devices = Vec::with_capacity(n);
        let mut gpus = Vec::with_capacity(n);
        let mut reasons = Vec::with_capacity(n);
        let mut requiring = None;
        for (q, p) in parts.iter().enumerate() {
            let mut d = Dec(&p.bytes);
            devices.push(d.u32()? as Device);
            gpus.push(<[u8; 16]>::try_from(d.bytes()?).map_err(|_| Error::internal("a GPU UUID is not 16 bytes"))?);
            let has = d.u32()? != 0;
            reasons.push(if has { Some(format!("rank {q}: {}", d.str()?)) } else { None });
            if d.u32()? != 0 && requiring.is_none() {
                requiring = Some(q);
            }
        }
        // Peer access from this rank's GPU to every other GPU of its host (ranks on other hosts
        // reach each other through fabric handles, decided with the handle type).
        let (problem, unseen) = peer_access(env, &comm, device, &gpus);
        let mut e = Enc::default();
        match &problem {
            Ok(Some(why)) => e.u32(1).str(why),
            _ => e.u32(0),
        };
        let parts = comm.exchange("peer access", problem.as_ref().map(|_| ()).map_err(Clone::clone), &e.0, &[])?;
        let mut peer_problem = None;
        for p in &parts {
            let mut d = Dec(&p.bytes);
            if d.u32()? != 0 && peer_problem.is_none() {
                peer_problem = Some(d.str()?);
            }
        }
        // Every rank decides the same from the same facts.
        let reason = policy::team_reason(&devices, &gpus, &reasons);
        let required = requiring.map(|q| format!(" by rank {q}"));
        let (transport, reason) = transport::choose(reason, peer_problem, required.as_deref(), &devices)?;
        let handle_type = transport::agree_handle_type(env, &comm, device, &devices, transport)?;
        let local = env.granularity(&[device], handle_type, transport == Transport::Multicast);
        let sms = env.props(device).map(|p| p.sm_count.max(1) as u32);
        let mut e = Enc::default();
        e.u64(*local.as_ref().unwrap_or(&1) as u64);
        e.u32(*sms.as_ref().unwrap_or(&1));
        e.u32(u32::from(env.ll_wanted()));
        e.u64(env.ce_min_bytes());
        e.u32(env.config().device_slots);
        e.u32(u32::from(env.config().check_calls));
        let ok = local.as_ref().map(|_| ()).map_err(Clone::clone).and(sms.as_ref().map(|_| ()).map_err(Clone::clone));
        let parts = comm.exchange("granularity", ok, &e.0, &[])?;
        let mut granularity = 1usize;
        // The grid cap must be the same on every rank: the smallest share of SMs any rank's
        // device gives each of the ranks it hosts.
        let mut max_blocks = u32::MAX;
        // LL only where every rank has it on (the ranks must pick the same kernels).
        let mut ll = ll_bytes(n as u32) > 0;
        // The copy-engine threshold: off if any rank has it off, else the largest.
        let mut ce = Some(0u64);
        // Device-API slots: the most any rank asks for (the layout must be the same everywhere).
        let mut slots = 1u32;
        // Call signatures: checked where any rank has the check on (every rank must send them
        // where any rank reads them).
        let mut check_calls = false;
        for (q, p) in parts.iter().enumerate() {
            let mut d = Dec(&p.bytes);
            granularity = lcm(granularity, (d.u64()? as usize).max(1));
            let sharing = gpus.iter().filter(|&&g| g == gpus[q]).count() as u32;
            max_blocks = max_blocks.min(d.u32()?.max(1) / sharing);
            ll &= d.u32()? != 0;
            ce = match (ce, d.u64()?) {
                (_, 0) | (None, _) => None,
                (Some(a), b) => Some(a.max(b)),
            };
            slots = slots.max(d.u32()?.clamp(1, MAX_DEVICE_SLOTS));
            check_calls |= d.u32()? != 0;
        }
        let ce = ce.unwrap_or(0);
        let max_blocks = max_blocks.max(1);
        if !granularity.is_power_of_two() {
            return Err(Error::internal(format!(
                "the ranks' granularities combine to {granularity}, not a power of two"
            )));
        }
        let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
        let shape = Shape {
            devices: devices.clone(),
            multicast: transport == Transport::Multicast,
            owner: format!("multi-process team {serial} (rank {r} of {n}, devices {devices:?})"),
            alignment: granularity,
            comm: Some(comm),
            handle_type,
        };
        let first = first_segment(env, &shape, ll, slots).map_err(|e| match unseen {
            // A peer's GPU this process does not see: peer access was left to the import and
            // mapping of its memory, and that failed.
            Some(q) if e.kind == ErrorKind::Driver => Error::not_supported(format!(
                "no peer access: rank {r}'s GPU ({}) could not import and map the memory of GPUs it does not see \
                 (rank {q}'s {}): {}",
                uuid_string(&gpus[r]),
                uuid_string(&gpus[q]),
                e.message
            )),
            _ => e,
        })?;
        let team =
            Team::assemble(env, shape, transport, reason, (max_blocks, ll, ce, slots, check_calls), domains, first);
        tracing::debug!(
            "multi-process team {serial}, rank {r} of {n} on devices {devices:?}: {transport:?} {}, {} handles, LL {ll}",
            team.reason,
            handle_type_label(handle_type)
        );
        Ok(Joined::Team(team))
    }

    /// The team over `shape` with its first segment `seg` (the first `reserved` bytes of it the
    /// sync regions and scratch), registered with its context.
    /// `agreed`: the grid cap, whether LL runs, the copy-engine threshold, the device-API slots.
    #[allow(clippy::too_many_arguments)]
    fn assemble(
        env: &Arc<Env>,
        shape: Shape,
        transport: Transport,
        reason: String,
        agreed: (u32, bool, u64, u32, bool),
        domains: Domains,
        (seg, reserved, doorbell): (Segment, usize, Arc<Doorbell>),
    ) -> Arc<Team> {
        let n = shape.devices.len();
        let mut state = Pool::default();
        let seg = Arc::new(seg);
        state.add(seg.clone(), reserved);
        let claims = Claims::new(&shape.devices);
        let team = Arc::new(Team {
            env: env.clone(),
            devices: shape.devices.clone(),
            transport,
            reason,
            granularity: shape.alignment,
            sync: (0..n).map(|viewer| (0..n).map(|q| seg.peer_base(viewer, q)).collect()).collect(),
            sync_mc: (0..n).map(|viewer| seg.multicast_base(viewer)).collect(),
            comm: shape.comm.clone(),
            refusals: (shape.comm.is_none() && n > 1).then(|| super::refusal::Refusals::new(n)),
            shape,
            max_blocks: agreed.0,
            ll: agreed.1,
            ce_min_bytes: agreed.2,
            device_slots: agreed.3,
            check_calls: agreed.4,
            device_offset: device_offset(n as u32, agreed.1),
            error: Mutex::new(None),
            failed: AtomicBool::new(false),
            state: RwLock::new(state),
            aborted: AtomicBool::new(false),
            sync_live: RwLock::new(true),
            destroying: Mutex::new(()),
            claims,
            domains,
            timeout_cause: OnceLock::new(),
            doorbell,
            words_read_at: AtomicU64::new(0),
        });
        env.join(team.clone());
        team
    }
}

/// Whether rank `comm.rank()`'s `device` can reach the memory of every other GPU of its host
/// (`gpus`: every rank's UUID): a GPU this process sees is asked with `cuDeviceCanAccessPeer`
/// on its ordinal here; one it does not see (`CUDA_VISIBLE_DEVICES` differs per process) is
/// left to the import and mapping of its memory. Returns the problem, if any, and the first
/// rank whose GPU this process does not see.
fn peer_access(env: &Env, comm: &Comm, device: Device, gpus: &[[u8; 16]]) -> (Result<Option<String>>, Option<usize>) {
    let r = comm.rank();
    let boot = comm.bootstrap();
    let mut unseen = None;
    for (q, g) in gpus.iter().enumerate() {
        if q == r || *g == gpus[r] || !boot.same_host(r, q) {
            continue;
        }
        let local = (0..env.device_count() as Device).find(|&o| env.props(o).is_ok_and(|p| p.uuid == *g));
        match local.map(|o| (o, env.can_access_peer(device, o))) {
            None => unseen = unseen.or(Some(q)),
            Some((_, Ok(true))) => {}
            Some((o, Ok(false))) => {
                let why = format!(
                    "rank {r}'s device {device} ({}) cannot access the memory of rank {q}'s GPU ({}, device {o} here)",
                    uuid_string(&gpus[r]),
                    uuid_string(g)
                );
                return (Ok(Some(why)), unseen);
            }
            Some((_, Err(e))) => return (Err(e), unseen),
        }
    }
    (Ok(None), unseen)
}

/// The first segment of a team over `shape`: the sync regions (zeroed; by every rank of a
/// multi-process team, voted), the push all-reduce's scratch, the staging area, with `ll` the LL
/// landing area (zeroed), and `slots` device-API slots (zeroed), rounded up to the granularity.
/// Returns it with the bytes reserved at its start.
fn first_segment(env: &Env, shape: &Shape, ll: bool, slots: u32) -> Result<(Segment, usize, Arc<Doorbell>)> {
    let n = shape.devices.len();
    let reserved = crate::kernels::abi::team_reserved_bytes(n as u32, ll, slots);
    let device = (device_offset(n as u32, ll), device_bytes(n as u32, slots));
    let size = reserved.checked_next_multiple_of(shape.alignment).expect("small");
    let seg = Segment::create(env, shape, size, &mut || 0)?;
    let own: Vec<usize> = match &shape.comm {
        Some(c) => vec![c.rank()],
        None => (0..n).collect(),
    };
    // The LL landing area too: a line left there by an earlier owner of the memory could carry
    // the flag of this team's first calls.
    let landing = if ll { Some((ll_offset(n as u32), ll_bytes(n as u32))) } else { None };
    // The doorbell of this process's ranks, made in the first one's context (portable).
    let bell = Doorbell::create(env, shape.devices[own[0]], &shape.owner);
    let zero = |r: usize, bell: &Doorbell| {
        let base = seg.peer_base(r, r);
        env.driver()
            .memset_d8(shape.devices[r], base, 0, SYNC_BYTES)
            .map_err(|e| Error::driver(e, format_args!("zeroing rank {r}'s sync region")))?;
        env.driver()
            .memcpy_htod(shape.devices[r], base + DOORBELL_OFFSET as u64, &bell.address().to_ne_bytes())
            .map_err(|e| Error::driver(e, format_args!("writing the doorbell's address in rank {r}'s sync region")))?;
        if let Some((off, len)) = landing {
            env.driver()
                .memset_d8(shape.devices[r], base + off as u64, 0, len)
                .map_err(|e| Error::driver(e, format_args!("zeroing rank {r}'s LL landing area")))?;
        }
        env.driver()
            .memset_d8(shape.devices[r], base + device.0 as u64, 0, device.1)
            .map_err(|e| Error::driver(e, format_args!("zeroing rank {r}'s device-API slots")))
    };
    let mut zeroed = match &bell {
        Ok(b) => own.into_iter().try_for_each(|r| zero(r, b)),
        Err(e) => Err(e.clone()),
    };
    if let Some(comm) = &shape.comm {
        // The last agreement of a formation: confirmed, so that no rank holds a team another
        // gave up on.
        zeroed = comm.vote_confirmed("zero sync regions", zeroed);
    }
    match (zeroed, bell) {
        (Ok(()), Ok(bell)) => Ok((seg, reserved, Arc::new(bell))),
        (zeroed, bell) => {
            abandon(env, seg);
            match bell {
                Ok(b) => {
                    for undo in b.release(env) {
                        tracing::error!("rolling back team creation: {undo}");
                    }
                    Err(zeroed.expect_err("the other arm took success"))
                }
                Err(e) => Err(zeroed.err().unwrap_or(e)),
            }
        }
    }
}

/// Rolls back a first segment whose team could not be completed; what a failing release step
/// kept goes to the context, which retries it when destroyed.
fn abandon(env: &Env, seg: Segment) {
    for undo in seg.teardown(env) {
        tracing::error!("rolling back team creation: {undo}");
    }
    if !seg.is_released() {
        env.park(Arc::new(seg));
    }
}
