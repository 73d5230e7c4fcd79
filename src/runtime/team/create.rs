//! Making a team: in one process over a list of devices ([`Team::create`]), or one rank per
//! process meeting over the bootstrap ([`Team::init_rank`], [`Team::init_oob`]); both choose the
//! transport, the granularity and the grid cap, then build the first segment and assemble the
//! team the same way.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::pool::Pool;
use super::streams::Claims;
use super::transport::{self, handle_type_label, Transport};
use super::Team;
use crate::bootstrap::{host, Bootstrap};
use crate::driver::{Device, HandleTypes};
use crate::kernels::abi::{ll_bytes, ll_offset};
use crate::kernels::{MAX_RANKS, SYNC_BYTES};
use crate::runtime::comm::{Comm, Dec, Enc, ID_BYTES};
use crate::runtime::config::MulticastMode;
use crate::runtime::env::{lcm, Env};
use crate::runtime::error::{Error, Result};
use crate::runtime::policy;
use crate::runtime::segment::{Segment, Shape};

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
        let reason = policy::team_reason(devices, &reasons);
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
        let (seg, reserved) = first_segment(env, &shape, ll)?;
        let max_blocks = match transport::block_cap(env, devices) {
            Ok(m) => m,
            Err(e) => {
                abandon(env, seg);
                return Err(e);
            }
        };
        let ce = env.ce_min_bytes();
        let team = Team::assemble(env, shape, transport, reason, (max_blocks, ll, ce), seg, reserved);
        tracing::debug!("team {serial} on devices {devices:?}: {transport:?} {}, LL {ll}", team.reason);
        Ok(team)
    }

    /// Joins a multi-process team as `rank` of `nranks` on `device`: the processes meet through
    /// the unique id `id` (see [`crate::bootstrap`]: TCP, on one host or many), agree on the
    /// transport from every rank's capabilities and on how memory travels between them (see
    /// [`Team::handle_type`]), and build the first segment together. Every step ends with a
    /// vote, so a failure on one rank is an error on every rank; every wait is bounded by
    /// `timeout_ms`.
    pub fn init_rank(env: &Arc<Env>, id: &[u8; ID_BYTES], nranks: i32, rank: i32, device: i32) -> Result<Arc<Team>> {
        let boot = Bootstrap::init_id(
            id,
            i64::from(nranks),
            i64::from(rank),
            MAX_RANKS,
            env.config().timeout_ms,
            host::host_id(),
        )?;
        Self::init_with(env, Arc::new(Comm::new(boot)), device)
    }

    /// Like [`Team::init_rank`], but the processes meet through the caller's allgather
    /// (`allgather(send, recv)` gathers `send` from every rank into `recv` in rank order),
    /// called exactly once on every rank whatever fails locally (a local failure travels in
    /// the record, so every rank fails together); afterwards only the team's own connections
    /// are used.
    pub fn init_oob(
        env: &Arc<Env>,
        allgather: crate::bootstrap::oob::Allgather<'_>,
        nranks: i32,
        rank: i32,
        device: i32,
    ) -> Result<Arc<Team>> {
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

    /// The rest of [`Team::init_rank`] once the ranks are connected.
    fn init_with(env: &Arc<Env>, comm: Arc<Comm>, device: i32) -> Result<Arc<Team>> {
        static SERIAL: AtomicU64 = AtomicU64::new(1);
        let (n, r) = (comm.nranks(), comm.rank());
        comm.vote("arguments", env.check_device(device, "device").map(|_| ()))?;
        // Capabilities: every rank's device, why it cannot use multicast, and its mode.
        let reason = env.multicast_reason(device);
        let require = env.config().multicast == MulticastMode::Require;
        let mut e = Enc::default();
        e.u32(device as u32);
        match &reason {
            Ok(Some(why)) => e.u32(1).str(why),
            _ => e.u32(0),
        };
        e.u32(u32::from(require));
        let parts = comm.exchange("capabilities", reason.as_ref().map(|_| ()).map_err(Clone::clone), &e.0, &[])?;
        let mut devices = Vec::with_capacity(n);
        let mut reasons = Vec::with_capacity(n);
        let mut requiring = None;
        for (q, p) in parts.iter().enumerate() {
            let mut d = Dec(&p.bytes);
            devices.push(d.u32()? as Device);
            let has = d.u32()? != 0;
            reasons.push(if has { Some(format!("rank {q}: {}", d.str()?)) } else { None });
            if d.u32()? != 0 && requiring.is_none() {
                requiring = Some(q);
            }
        }
        // Peer access from this rank's device to every other rank's.
        let mut problem = Ok(None);
        for &other in &devices {
            if other != device {
                match env.can_access_peer(device, other) {
                    Ok(true) => {}
                    Ok(false) => {
                        problem = Ok(Some(format!("device {device} cannot access device {other}'s memory")));
                        break;
                    }
                    Err(e) => {
                        problem = Err(e);
                        break;
                    }
                }
            }
        }
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
        let reason = policy::team_reason(&devices, &reasons);
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
        for (q, p) in parts.iter().enumerate() {
            let mut d = Dec(&p.bytes);
            granularity = lcm(granularity, (d.u64()? as usize).max(1));
            let sharing = devices.iter().filter(|&&x| x == devices[q]).count() as u32;
            max_blocks = max_blocks.min(d.u32()?.max(1) / sharing);
            ll &= d.u32()? != 0;
            ce = match (ce, d.u64()?) {
                (_, 0) | (None, _) => None,
                (Some(a), b) => Some(a.max(b)),
            };
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
        let (seg, reserved) = first_segment(env, &shape, ll)?;
        let team = Team::assemble(env, shape, transport, reason, (max_blocks, ll, ce), seg, reserved);
        tracing::debug!(
            "multi-process team {serial}, rank {r} of {n} on devices {devices:?}: {transport:?}, {} handles, LL {ll}",
            handle_type_label(handle_type)
        );
        Ok(team)
    }

    /// The team over `shape` with its first segment `seg` (the first `reserved` bytes of it the
    /// sync regions and scratch), registered with its context.
    /// `agreed`: the grid cap, whether LL runs, the copy-engine threshold.
    fn assemble(
        env: &Arc<Env>,
        shape: Shape,
        transport: Transport,
        reason: String,
        agreed: (u32, bool, u64),
        seg: Segment,
        reserved: usize,
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
            error: Mutex::new(None),
            failed: AtomicBool::new(false),
            state: RwLock::new(state),
            aborted: AtomicBool::new(false),
            sync_live: RwLock::new(true),
            destroying: Mutex::new(()),
            claims,
        });
        env.join(team.clone());
        team
    }
}

/// The first segment of a team over `shape`: the sync regions (zeroed; by every rank of a
/// multi-process team, voted), the push all-reduce's scratch, the staging area and, with `ll`,
/// the LL landing area (zeroed), rounded up to the granularity. Returns it with the bytes
/// reserved at its start.
fn first_segment(env: &Env, shape: &Shape, ll: bool) -> Result<(Segment, usize)> {
    let n = shape.devices.len();
    let reserved = crate::kernels::abi::team_reserved_bytes(n as u32, ll);
    let size = reserved.checked_next_multiple_of(shape.alignment).expect("small");
    let seg = Segment::create(env, shape, size, &mut || 0)?;
    let own: Vec<usize> = match &shape.comm {
        Some(c) => vec![c.rank()],
        None => (0..n).collect(),
    };
    // The LL landing area too: a line left there by an earlier owner of the memory could carry
    // the flag of this team's first calls.
    let landing = if ll { Some((ll_offset(n as u32), ll_bytes(n as u32))) } else { None };
    let zero = |r: usize| {
        let base = seg.peer_base(r, r);
        env.driver()
            .memset_d8(shape.devices[r], base, 0, SYNC_BYTES)
            .map_err(|e| Error::driver(e, format_args!("zeroing rank {r}'s sync region")))?;
        match landing {
            Some((off, len)) => env
                .driver()
                .memset_d8(shape.devices[r], base + off as u64, 0, len)
                .map_err(|e| Error::driver(e, format_args!("zeroing rank {r}'s LL landing area"))),
            None => Ok(()),
        }
    };
    let mut zeroed = own.into_iter().try_for_each(zero);
    if let Some(comm) = &shape.comm {
        zeroed = comm.vote("zero sync regions", zeroed);
    }
    match zeroed {
        Ok(()) => Ok((seg, reserved)),
        Err(e) => {
            abandon(env, seg);
            Err(e)
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
