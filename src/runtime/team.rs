//! Teams and their symmetric buffers.
//!
//! A team is an ordered list of ranks, rank `i` on `devices[i]`, with a transport chosen once.
//! Buffers are ranges of segments: small buffers share a segment, freed ranges are reused, an
//! empty segment goes to a bounded cache (trimmed first when memory runs out) or is released.
//! The team's barrier signal words live in the first [`SYNC_BYTES`] of its first segment.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::comm::{Comm, Dec, Enc, ID_BYTES};
use super::config::{HandleTypeMode, MulticastMode};
use super::context::Context;
use super::error::{Error, ErrorKind, Result};
use super::policy;
use super::segment::{External, Segment, Shape};
use crate::bootstrap::{host, Bootstrap};
use crate::driver::Stream;
use crate::driver::{Device, DevicePtr, Granularity, HandleTypes, MulticastProp};
use crate::kernels::abi::{ERROR_WORD_OFFSET, ERR_ABORTED, ERR_TIMEOUT, STATE_ABORTED, STATE_OFFSET};
use crate::kernels::{MAX_RANKS, SYNC_BYTES};

/// The color of a rank that joins no team in [`Team::split`] (`MCAST_SPLIT_NOCOLOR`).
pub const SPLIT_NOCOLOR: i32 = -1;

/// Alignment of every buffer inside its segment.
pub const BUFFER_ALIGN: usize = 256;
/// Most empty segments a team keeps for reuse.
const MAX_CACHED_SEGMENTS: usize = 2;
/// Most bytes per rank a team keeps in empty segments.
const MAX_CACHED_BYTES: usize = 1 << 30;

/// How a team's ranks exchange data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// One multicast object per segment, multimem kernels.
    Multicast,
    /// Peer mappings, load/store kernels.
    P2P,
}

/// A team.
pub struct Team {
    ctx: Arc<Context>,
    devices: Vec<Device>,
    transport: Transport,
    reason: String,
    granularity: usize,
    /// `sync[viewer][rank]`: rank's sync region as mapped on viewer's device.
    sync: Vec<Vec<DevicePtr>>,
    /// Per viewer: the multicast address of the sync regions (multicast transport).
    sync_mc: Vec<Option<DevicePtr>>,
    shape: Shape,
    /// Most blocks per collective kernel (see [`Team::max_blocks`]).
    max_blocks: u32,
    /// The first device-side error (a barrier timeout); sticky until the team is destroyed.
    error: Mutex<Option<Error>>,
    /// Multi-process team: its connections (this process owns rank `comm.rank()` only).
    comm: Option<Arc<Comm>>,
    state: Mutex<State>,
    /// Set by [`Team::abort`] (or when a peer's abort is noticed); never cleared.
    aborted: AtomicBool,
    /// Held (shared) while an abort writes the device state words, and exclusively while
    /// destroy releases the memory that holds them; `false` once released.
    sync_live: RwLock<bool>,
    /// Serialises destroys.
    destroying: Mutex<()>,
    /// The streams of the collectives each rank issued last (see [`Team::claim_stream`]).
    rounds: Mutex<Vec<Rounds>>,
}

/// One rank's collectives, for the one-stream check: how many it issued, and the device and
/// stream of the most recent ones (`(round, stream)`).
#[derive(Default)]
struct Rounds {
    issued: u64,
    recent: std::collections::VecDeque<(u64, Stream)>,
}

/// How many of each rank's most recent collectives the one-stream check remembers.
const ROUNDS_KEPT: usize = 64;

struct SegmentSlot {
    seg: Arc<Segment>,
    /// Free ranges `(offset, len)`, sorted by offset, coalesced.
    free: Vec<(usize, usize)>,
    buffers: usize,
    /// Registered memory: the bytes registered.
    bytes: usize,
}

#[derive(Default)]
struct State {
    segments: Vec<SegmentSlot>,
    cache: Vec<Arc<Segment>>,
    buffers: usize,
    destroyed: bool,
}

/// A range of a segment handed to a buffer.
#[derive(Clone)]
pub struct Allocation {
    /// The segment.
    pub seg: Arc<Segment>,
    /// Offset of the buffer in every rank's memory.
    pub offset: usize,
    /// Bytes the user asked for.
    pub bytes: usize,
    /// Bytes set aside (aligned).
    reserved: usize,
}

/// What `mcast_team_get_info` reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TeamInfo {
    /// Ranks.
    pub size: usize,
    /// Transport.
    pub transport: Transport,
    /// Why P2P was chosen, or empty.
    pub transport_reason: String,
    /// Allocation granularity.
    pub granularity: u64,
    /// Live multicast objects held.
    pub multicast_objects: u64,
    /// Device bytes held per rank.
    pub bytes_reserved: u64,
}

fn round_up(n: usize, to: usize) -> Option<usize> {
    n.checked_add(to - 1).map(|v| v / to * to)
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Team {
    /// Creates a team over `devices` in `ctx`.
    pub fn create(ctx: &Arc<Context>, devices: &[i32]) -> Result<Arc<Team>> {
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
            ctx.check_device(d, &format!("devices[{rank}] ="))?;
        }
        let reasons = devices.iter().map(|&d| ctx.multicast_reason(d)).collect::<Result<Vec<_>>>()?;
        let mut reason = policy::team_reason(devices, &reasons);
        let peer_problem = Self::peer_problem(ctx, devices)?;
        if reason.is_none() {
            reason = peer_problem.clone();
        }
        let transport = match (&reason, ctx.config().multicast) {
            (None, _) => Transport::Multicast,
            (Some(why), MulticastMode::Require) => {
                return Err(Error::not_supported(format!("multicast is required (MCAST_MULTICAST=require) but {why}")))
            }
            (Some(_), _) => match &peer_problem {
                None => Transport::P2P,
                Some(why) => {
                    return Err(Error::not_supported(format!(
                        "neither multicast ({}) nor peer-to-peer ({why}) is possible for devices {devices:?}",
                        reason.as_deref().unwrap_or("")
                    )))
                }
            },
        };
        let granularity = Self::granularity(ctx, devices, transport, HandleTypes::NONE)?;
        let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
        let shape = Shape {
            devices: devices.to_vec(),
            multicast: transport == Transport::Multicast,
            owner: format!("team {serial} (devices {devices:?})"),
            alignment: granularity,
            comm: None,
            handle_type: HandleTypes::NONE,
        };
        // The first segment holds the sync regions (zeroed) and the push all-reduce's scratch.
        let reserved = crate::kernels::abi::team_reserved_bytes(devices.len() as u32);
        let size = round_up(reserved, granularity).expect("small");
        let seg = Segment::create(ctx, &shape, size, &mut || 0)?;
        for (rank, &dev) in devices.iter().enumerate() {
            let zeroed = ctx
                .driver()
                .memset_d8(dev, seg.peer_base(rank, rank), 0, SYNC_BYTES)
                .map_err(|e| Error::driver(e, format_args!("zeroing rank {rank}'s sync region")));
            if let Err(e) = zeroed {
                Self::abandon(ctx, seg);
                return Err(e);
            }
        }
        let n = devices.len();
        let max_blocks = Self::block_cap(ctx, devices)?;
        let team = Arc::new(Team {
            ctx: ctx.clone(),
            devices: devices.to_vec(),
            transport,
            reason: reason.unwrap_or_default(),
            granularity,
            sync: (0..n).map(|viewer| (0..n).map(|q| seg.peer_base(viewer, q)).collect()).collect(),
            sync_mc: (0..n).map(|viewer| seg.multicast_base(viewer)).collect(),
            shape,
            max_blocks,
            error: Mutex::new(None),
            comm: None,
            state: Mutex::new(State::default()),
            aborted: AtomicBool::new(false),
            sync_live: RwLock::new(true),
            destroying: Mutex::new(()),
            rounds: Mutex::new((0..n).map(|_| Rounds::default()).collect()),
        });
        team.install_first_segment(seg, size, reserved);
        tracing::debug!("team {serial} on devices {devices:?}: {transport:?} {}", team.reason);
        Ok(team)
    }

    /// Rolls back a first segment whose team could not be completed; what a failing release step
    /// kept goes to the context, which retries it when destroyed.
    fn abandon(ctx: &Context, seg: Segment) {
        for undo in seg.teardown(ctx) {
            tracing::error!("rolling back team creation: {undo}");
        }
        if !seg.is_released() {
            ctx.park(Arc::new(seg));
        }
    }

    /// Makes `seg` (of `size` bytes per rank, the first `reserved` of them the sync regions and
    /// scratch) the team's first segment and registers the team with its context.
    fn install_first_segment(self: &Arc<Self>, seg: Segment, size: usize, reserved: usize) {
        self.state.lock().segments.push(SegmentSlot {
            free: if size > reserved { vec![(reserved, size - reserved)] } else { vec![] },
            seg: Arc::new(seg),
            buffers: 0,
            bytes: 0,
        });
        self.ctx.add_team(self.clone());
    }

    /// Every block of every rank on one device must be resident at once (blocks wait for their
    /// peers in barriers): at worst one block per SM, so the SMs are shared out among the ranks
    /// the busiest device hosts.
    fn block_cap(ctx: &Context, devices: &[i32]) -> Result<u32> {
        let mut cap = u32::MAX;
        for &d in devices {
            let sms = ctx.props(d)?.sm_count.max(1) as u32;
            let sharing = devices.iter().filter(|&&x| x == d).count() as u32;
            cap = cap.min(sms / sharing);
        }
        Ok(cap.max(1))
    }

    /// Most blocks a collective kernel of this team may launch (see [`Team::block_cap`]).
    pub fn max_blocks(&self) -> u32 {
        self.max_blocks
    }

    /// Joins a multi-process team as `rank` of `nranks` on `device`: the processes meet through
    /// the unique id `id` (see [`crate::bootstrap`]: TCP, on one host or many), agree on the
    /// transport from every rank's capabilities and on how memory travels between them (see
    /// [`Team::handle_type`]), and build the first segment together. Every step ends with a
    /// vote, so a failure on one rank is an error on every rank; every wait is bounded by
    /// `timeout_ms`.
    pub fn init_rank(
        ctx: &Arc<Context>,
        id: &[u8; ID_BYTES],
        nranks: i32,
        rank: i32,
        device: i32,
    ) -> Result<Arc<Team>> {
        let boot = Bootstrap::init_id(
            id,
            i64::from(nranks),
            i64::from(rank),
            MAX_RANKS,
            ctx.config().timeout_ms,
            host::host_id(),
        )?;
        Self::init_with(ctx, Arc::new(Comm::new(boot)), device)
    }

    /// Like [`Team::init_rank`], but the processes meet through the caller's allgather
    /// (`allgather(send, recv)` gathers `send` from every rank into `recv` in rank order),
    /// called exactly once on every rank whatever fails locally (a local failure travels in
    /// the record, so every rank fails together); afterwards only the team's own connections
    /// are used.
    pub fn init_oob(
        ctx: &Arc<Context>,
        allgather: crate::bootstrap::oob::Allgather<'_>,
        nranks: i32,
        rank: i32,
        device: i32,
    ) -> Result<Arc<Team>> {
        let problem = ctx.check_device(device, "device").err().map(|e| e.message);
        let boot = Bootstrap::init_oob(
            allgather,
            i64::from(nranks),
            i64::from(rank),
            MAX_RANKS,
            ctx.config().timeout_ms,
            host::host_id(),
            problem,
        )?;
        Self::init_with(ctx, Arc::new(Comm::new(boot)), device)
    }

    /// The rest of [`Team::init_rank`] once the ranks are connected.
    fn init_with(ctx: &Arc<Context>, comm: Arc<Comm>, device: i32) -> Result<Arc<Team>> {
        static SERIAL: AtomicU64 = AtomicU64::new(1);
        let (n, r) = (comm.nranks(), comm.rank());
        comm.vote("arguments", ctx.check_device(device, "device").map(|_| ()))?;
        // Capabilities: every rank's device, why it cannot use multicast, and its mode.
        let reason = ctx.multicast_reason(device);
        let require = ctx.config().multicast == MulticastMode::Require;
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
                match ctx.can_access_peer(device, other) {
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
        let mut reason = policy::team_reason(&devices, &reasons);
        if reason.is_none() {
            reason = peer_problem.clone();
        }
        let transport = match (&reason, requiring) {
            (None, _) => Transport::Multicast,
            (Some(why), Some(q)) => {
                return Err(Error::not_supported(format!(
                    "multicast is required by rank {q} (MCAST_MULTICAST=require) but {why}"
                )))
            }
            (Some(_), None) => match &peer_problem {
                None => Transport::P2P,
                Some(why) => {
                    return Err(Error::not_supported(format!(
                        "neither multicast ({}) nor peer-to-peer ({why}) is possible for devices {devices:?}",
                        reason.as_deref().unwrap_or("")
                    )))
                }
            },
        };
        let handle_type = Self::agree_handle_type(ctx, &comm, device, &devices, transport)?;
        let local = Self::granularity(ctx, &[device], transport, handle_type);
        let sms = ctx.props(device).map(|p| p.sm_count.max(1) as u32);
        let mut e = Enc::default();
        e.u64(*local.as_ref().unwrap_or(&1) as u64);
        e.u32(*sms.as_ref().unwrap_or(&1));
        let ok = local.as_ref().map(|_| ()).map_err(Clone::clone).and(sms.as_ref().map(|_| ()).map_err(Clone::clone));
        let parts = comm.exchange("granularity", ok, &e.0, &[])?;
        let mut granularity = 1usize;
        // The grid cap must be the same on every rank: the smallest share of SMs any rank's
        // device gives each of the ranks it hosts.
        let mut max_blocks = u32::MAX;
        for (q, p) in parts.iter().enumerate() {
            let mut d = Dec(&p.bytes);
            let g = (d.u64()? as usize).max(1);
            granularity = granularity / gcd(granularity, g) * g;
            let sharing = devices.iter().filter(|&&x| x == devices[q]).count() as u32;
            max_blocks = max_blocks.min(d.u32()?.max(1) / sharing);
        }
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
            comm: Some(comm.clone()),
            handle_type,
        };
        let reserved = crate::kernels::abi::team_reserved_bytes(n as u32);
        let size = round_up(reserved, granularity).expect("small");
        let seg = Segment::create(ctx, &shape, size, &mut || 0)?;
        let zeroed = ctx
            .driver()
            .memset_d8(device, seg.peer_base(r, r), 0, SYNC_BYTES)
            .map_err(|e| Error::driver(e, format_args!("zeroing rank {r}'s sync region")));
        if let Err(e) = comm.vote("zero sync regions", zeroed) {
            Self::abandon(ctx, seg);
            return Err(e);
        }
        let team = Arc::new(Team {
            ctx: ctx.clone(),
            devices: devices.clone(),
            transport,
            reason: reason.unwrap_or_default(),
            granularity,
            sync: (0..n).map(|viewer| (0..n).map(|q| seg.peer_base(viewer, q)).collect()).collect(),
            sync_mc: (0..n).map(|viewer| seg.multicast_base(viewer)).collect(),
            shape,
            max_blocks,
            error: Mutex::new(None),
            comm: Some(comm),
            state: Mutex::new(State::default()),
            aborted: AtomicBool::new(false),
            sync_live: RwLock::new(true),
            destroying: Mutex::new(()),
            rounds: Mutex::new((0..n).map(|_| Rounds::default()).collect()),
        });
        team.install_first_segment(seg, size, reserved);
        tracing::debug!(
            "multi-process team {serial}, rank {r} of {n} on devices {devices:?}: {transport:?}, {} handles",
            handle_type_label(handle_type)
        );
        Ok(team)
    }

    /// Splits the team (`mcast_team_split`, MPI_Comm_split semantics): the ranks with the same
    /// color form a new team, ordered by key, then by rank in this team; [`SPLIT_NOCOLOR`]
    /// joins none. `colors[i]` and `keys[i]` belong to the i-th rank this process holds (every
    /// rank of a single-process team, the one rank of a multi-process team); the result has the
    /// new team of each of them (`None` for no color), the same `Arc` for ranks of one color.
    /// Each new team is made afresh (its own transport, memory, state words and, for processes,
    /// its own rendezvous whose id the new rank 0 sends over this team's), so a failure of one
    /// never reaches another or this one. Collective over every rank of the team.
    pub fn split(self: &Arc<Self>, colors: &[i32], keys: &[i32]) -> Result<Vec<Option<Arc<Team>>>> {
        let mine = match self.local_rank() {
            Some(r) => vec![r],
            None => (0..self.size()).collect(),
        };
        if colors.len() != mine.len() || keys.len() != mine.len() {
            return Err(Error::internal("split: one color and one key per rank this process holds"));
        }
        let mut valid = self.check_usable("splitting the team");
        for (i, &c) in colors.iter().enumerate() {
            if c < 0 && c != SPLIT_NOCOLOR && valid.is_ok() {
                valid = Err(Error::invalid_argument(format!(
                    "colors[{i}] is {c}: a color is >= 0, or MCAST_SPLIT_NOCOLOR ({SPLIT_NOCOLOR})"
                )));
            }
        }
        // Every rank's (color, key): local, or gathered over the rendezvous (where a bad
        // argument on one rank fails every rank).
        let all: Vec<(i32, i32)> = match &self.comm {
            None => {
                valid?;
                colors.iter().copied().zip(keys.iter().copied()).collect()
            }
            Some(comm) => {
                let mut e = Enc::default();
                e.u32(colors[0] as u32).u32(keys[0] as u32);
                let parts = comm.exchange("split: colors and keys", valid, &e.0, &[])?;
                let mut all = Vec::with_capacity(parts.len());
                for p in &parts {
                    let mut d = Dec(&p.bytes);
                    all.push((d.u32()? as i32, d.u32()? as i32));
                }
                all
            }
        };
        // Each color's members, in new-rank order.
        let mut groups: std::collections::BTreeMap<i32, Vec<usize>> = Default::default();
        for (r, &(c, _)) in all.iter().enumerate() {
            if c != SPLIT_NOCOLOR {
                groups.entry(c).or_default().push(r);
            }
        }
        for members in groups.values_mut() {
            members.sort_by_key(|&r| (all[r].1, r));
        }
        match &self.comm {
            None => {
                let mut made: Vec<(i32, Arc<Team>)> = Vec::new();
                for (&c, members) in &groups {
                    let devices: Vec<i32> = members.iter().map(|&r| self.devices[r]).collect();
                    match Team::create(&self.ctx, &devices) {
                        Ok(t) => made.push((c, t)),
                        Err(e) => {
                            for (_, t) in made {
                                if let Err(undo) = t.destroy() {
                                    tracing::error!("rolling back a split: {undo}");
                                }
                            }
                            return Err(e.context(format!("making the team of color {c} (devices {devices:?})")));
                        }
                    }
                }
                Ok(all.iter().map(|&(c, _)| made.iter().find(|(mc, _)| *mc == c).map(|(_, t)| t.clone())).collect())
            }
            Some(comm) => {
                let r = comm.rank();
                let color = all[r].0;
                let members = groups.get(&color);
                let new_rank = members.and_then(|m| m.iter().position(|&q| q == r));
                // The new rank 0 of each color makes its team's id; it travels over this team.
                let id = if new_rank == Some(0) {
                    Some(crate::bootstrap::new_unique_id().map_err(Error::from))
                } else {
                    None
                };
                let mut e = Enc::default();
                if let Some(Ok(id)) = &id {
                    e.bytes(id);
                } else {
                    e.bytes(&[]);
                }
                let status = match &id {
                    Some(Err(err)) => Err(err.clone()),
                    _ => Ok(()),
                };
                let parts = comm.exchange("split: team ids", status, &e.0, &[])?;
                let (Some(members), Some(new_rank)) = (members, new_rank) else { return Ok(vec![None]) };
                let bytes = Dec(&parts[members[0]].bytes).bytes()?;
                let id: [u8; ID_BYTES] =
                    bytes.try_into().map_err(|_| Error::internal("split: a team id of the wrong size"))?;
                let team = Team::init_rank(&self.ctx, &id, members.len() as i32, new_rank as i32, self.devices[r])
                    .map_err(|e| e.context(format!("joining the team of color {color} as rank {new_rank}")))?;
                Ok(vec![Some(team)])
            }
        }
    }

    fn peer_problem(ctx: &Context, devices: &[i32]) -> Result<Option<String>> {
        for &a in devices {
            for &b in devices {
                if a != b && !ctx.can_access_peer(a, b)? {
                    return Ok(Some(format!("device {a} cannot access device {b}'s memory")));
                }
            }
        }
        Ok(None)
    }

    /// Every rank says whether it can share memory through fabric handles (its device reports
    /// support and a probe allocation exports; on the multicast transport rank 0 also probes a
    /// multicast object) and how `MCAST_HANDLE_TYPE` is set on it; every rank decides the same:
    /// fabric handles when every rank can and none asks for POSIX descriptors; POSIX
    /// descriptors otherwise, unless a rank asks for fabric handles, which is an error naming
    /// the ranks that cannot use them. Ranks on different hosts (see
    /// [`crate::bootstrap::host`]) cannot pass descriptors, so a team that spans hosts uses
    /// fabric handles for every rank, or fails with `NotSupported` naming the rank, its host
    /// and the reason (also when a rank forces `MCAST_HANDLE_TYPE=posix`).
    fn agree_handle_type(
        ctx: &Context,
        comm: &Comm,
        device: Device,
        devices: &[Device],
        transport: Transport,
    ) -> Result<HandleTypes> {
        let r = comm.rank();
        let mode = ctx.config().handle_type;
        let probe = match mode {
            HandleTypeMode::Posix => Err("MCAST_HANDLE_TYPE=posix".to_string()),
            _ => {
                Self::probe_fabric(ctx, device, (r == 0 && transport == Transport::Multicast).then_some(devices.len()))
            }
        };
        if let Err(why) = &probe {
            tracing::debug!("rank {r}: no fabric handles: {why}");
        }
        let mut e = Enc::default();
        e.u32(match mode {
            HandleTypeMode::Auto => 0,
            HandleTypeMode::Posix => 1,
            HandleTypeMode::Fabric => 2,
        });
        match &probe {
            Ok(()) => e.u32(1),
            Err(why) => e.u32(0).str(why),
        };
        let parts = comm.exchange("handle type", Ok(()), &e.0, &[])?;
        let (mut cannot, mut posix, mut fabric) = (Vec::new(), None, None);
        let hosts = comm.bootstrap().hosts();
        let mut cannot_hosted = Vec::new();
        for (q, p) in parts.iter().enumerate() {
            let mut d = Dec(&p.bytes);
            match d.u32()? {
                1 => posix = posix.or(Some(q)),
                2 => fabric = fabric.or(Some(q)),
                _ => {}
            }
            if d.u32()? == 0 {
                let why = d.str()?;
                cannot_hosted.push(format!("rank {q} on host {}: {why}", hosts[q]));
                cannot.push(format!("rank {q}: {why}"));
            }
        }
        // Ranks on different hosts cannot pass descriptors: fabric handles or nothing.
        if let Some(q) = (1..hosts.len()).find(|&q| hosts[q] != hosts[0]) {
            let span = format!("the team spans hosts (rank 0 on host {}, rank {q} on host {})", hosts[0], hosts[q]);
            if let Some(p) = posix {
                return Err(Error::not_supported(format!(
                    "rank {p} on host {} forces MCAST_HANDLE_TYPE=posix, but POSIX file descriptors only travel \
                     between ranks of one host and {span}; use MCAST_HANDLE_TYPE=auto or fabric",
                    hosts[p]
                )));
            }
            if !cannot_hosted.is_empty() {
                return Err(Error::not_supported(format!(
                    "{span}, so memory must travel as fabric handles, but {}; a multi-node NVLink system needs the \
                     fabric manager and an IMEX channel (/dev/nvidia-caps-imex-channels/channel0, IMEX daemon \
                     running) on every node",
                    cannot_hosted.join("; ")
                )));
            }
            return Ok(HandleTypes::FABRIC);
        }
        match (fabric, posix) {
            (Some(q), _) if !cannot.is_empty() => Err(Error::not_supported(format!(
                "fabric handles are required by rank {q} (MCAST_HANDLE_TYPE=fabric) but {}",
                cannot.join("; ")
            ))),
            _ if cannot.is_empty() && posix.is_none() => Ok(HandleTypes::FABRIC),
            _ => Ok(HandleTypes::POSIX_FD),
        }
    }

    /// Whether `dev` can share memory through fabric handles: it reports support, and an
    /// allocation of one granularity (and, with `multicast` devices, a multicast object)
    /// created with the fabric type exports; the probes are released at once.
    fn probe_fabric(ctx: &Context, dev: Device, multicast: Option<usize>) -> std::result::Result<(), String> {
        let driver = ctx.driver();
        let props = ctx.props(dev).map_err(|e| e.message)?;
        if !props.fabric_supported {
            return Err(format!("device {dev} does not report fabric handle support"));
        }
        let ht = HandleTypes::FABRIC;
        let size = driver.mem_granularity(dev, Granularity::Minimum, ht).map_err(|e| e.to_string())?;
        let mut objects = vec![driver.mem_create(dev, size, ht).map_err(|e| e.to_string())?];
        let mut outcome = driver.mem_export_fabric(objects[0]).map(drop);
        if let (Ok(()), Some(n)) = (&outcome, multicast) {
            let prop = MulticastProp { num_devices: n as u32, size: 0, handle_types: ht, flags: 0 };
            outcome = driver
                .multicast_granularity(&prop, Granularity::Minimum)
                .and_then(|size| driver.multicast_create(&MulticastProp { size, ..prop }))
                .and_then(|mc| {
                    objects.push(mc);
                    driver.mem_export_fabric(mc).map(drop)
                });
        }
        for h in objects {
            if let Err(e) = driver.mem_release(h) {
                tracing::error!("releasing a fabric handle probe on device {dev}: {e}");
            }
        }
        outcome.map_err(|e| e.to_string())
    }

    /// How multi-process ranks share memory: [`HandleTypes::FABRIC`] or
    /// [`HandleTypes::POSIX_FD`]; `NONE` for a single-process team.
    pub fn handle_type(&self) -> HandleTypes {
        self.shape.handle_type
    }

    fn granularity(ctx: &Context, devices: &[i32], transport: Transport, ht: HandleTypes) -> Result<usize> {
        let driver = ctx.driver();
        let mut g = 1usize;
        let mut lcm = |x: usize| g = g / gcd(g, x) * x;
        for &d in devices {
            let m = driver
                .mem_granularity(d, Granularity::Minimum, ht)
                .map_err(|e| Error::driver(e, format_args!("asking the allocation granularity of device {d}")))?;
            lcm(m.max(1));
        }
        if transport == Transport::Multicast {
            let prop = MulticastProp { num_devices: devices.len() as u32, size: 0, handle_types: ht, flags: 0 };
            let m = driver
                .multicast_granularity(&prop, Granularity::Minimum)
                .map_err(|e| Error::driver(e, "asking the multicast granularity"))?;
            lcm(m.max(1));
        }
        Ok(g)
    }

    /// The granularity of the team's segments (allocation and, on the multicast transport,
    /// multicast).
    pub fn alloc_granularity(&self) -> usize {
        self.granularity
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Ranks.
    pub fn size(&self) -> usize {
        self.devices.len()
    }

    /// Device of each rank.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// The transport.
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// Checks `rank` is a rank of this team.
    pub fn check_rank(&self, rank: i32, what: &str) -> Result<usize> {
        if rank < 0 || rank as usize >= self.devices.len() {
            return Err(Error::invalid_argument(format!(
                "{what} {rank} is out of range: the team has {} rank(s)",
                self.devices.len()
            )));
        }
        Ok(rank as usize)
    }

    /// Checks `rank` is a rank of this team that this process owns (every rank in a
    /// single-process team; only its own in a multi-process team).
    pub fn check_own_rank(&self, rank: i32, what: &str) -> Result<usize> {
        let r = self.check_rank(rank, what)?;
        match &self.comm {
            Some(c) if c.rank() != r => Err(Error::invalid_argument(format!(
                "{what} {rank} belongs to another process: this process is rank {} of a multi-process team",
                c.rank()
            ))),
            _ => Ok(r),
        }
    }

    /// Multi-process team: its connections.
    pub fn comm(&self) -> Option<&Arc<Comm>> {
        self.comm.as_ref()
    }

    /// The rank this process owns in a multi-process team.
    pub fn local_rank(&self) -> Option<usize> {
        self.comm.as_ref().map(|c| c.rank())
    }

    /// Address of rank `rank`'s sync region as seen by rank `viewer`.
    pub fn sync_base(&self, viewer: usize, rank: usize) -> DevicePtr {
        self.sync[viewer][rank]
    }

    /// Every rank's sync region as seen by rank `viewer`.
    pub fn sync_bases(&self, viewer: usize) -> &[DevicePtr] {
        &self.sync[viewer]
    }

    /// The multicast address of the sync regions on rank `viewer`'s device (multicast transport).
    pub fn sync_multicast(&self, viewer: usize) -> Option<DevicePtr> {
        self.sync_mc[viewer]
    }

    /// The sticky error, if a collective of this team failed on the device or the team was
    /// aborted (an abort, here or noticed from a peer, wins over an earlier timeout). Cheap: it
    /// reads only what this process already knows (see [`Team::async_error`] for more).
    pub fn error(&self) -> Option<Error> {
        if self.aborted.load(Ordering::Acquire) {
            return Some(self.aborted_error());
        }
        self.error.lock().clone()
    }

    /// Records the first device error; later calls report it until the team is destroyed.
    pub fn set_error(&self, e: Error) {
        if e.kind == ErrorKind::Aborted {
            self.mark_aborted(&e.message);
            return;
        }
        self.error.lock().get_or_insert(e);
    }

    /// Fails with the team's sticky error (aborted, or a device timeout); `what` names the call.
    pub fn check_usable(&self, what: &str) -> Result<()> {
        match self.error() {
            Some(e) => Err(e.context(what)),
            None => Ok(()),
        }
    }

    /// Fails with [`ErrorKind::Aborted`] once the team was aborted; `what` names the call.
    pub fn check_not_aborted(&self, what: &str) -> Result<()> {
        match self.error() {
            Some(e) if e.kind == ErrorKind::Aborted => Err(e.context(what)),
            _ => Ok(()),
        }
    }

    /// True once the team was aborted (here, or noticed from a peer).
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    fn aborted_error(&self) -> Error {
        let msg = self.error.lock().as_ref().filter(|e| e.kind == ErrorKind::Aborted).map(|e| e.message.clone());
        Error::aborted(msg.unwrap_or_else(|| "the team was aborted".to_string()))
    }

    /// Records an abort (sticky; wins over a timeout).
    fn mark_aborted(&self, why: &str) {
        let mut err = self.error.lock();
        if !self.aborted.swap(true, Ordering::AcqRel) {
            *err = Some(Error::aborted(format!(
                "the team was aborted ({why}); every call on it returns MCAST_ERROR_ABORTED: destroy it and make a new \
                 one"
            )));
        }
    }

    /// Aborts the team (`mcast_team_abort`): every wait on it ends promptly, on the device
    /// (the state word of every rank, peers' through the peer mappings, is set and every
    /// barrier spin reads it) and on the host (rendezvous waits poll the abort; peer processes
    /// are told over the rendezvous connections); every later call on the team returns
    /// [`ErrorKind::Aborted`]. Callable from any thread, while others are blocked on the team.
    pub fn abort(&self) {
        let who = match self.local_rank() {
            Some(r) => format!("mcast_team_abort by rank {r}'s process"),
            None => "mcast_team_abort in this process".to_string(),
        };
        self.mark_aborted(&who);
        if let Some(c) = &self.comm {
            c.abort(&who);
        }
        self.stop_device_waits(true);
    }

    /// Sets the device state word of this process's ranks (and, with `peers`, of every rank
    /// through this rank's peer mappings) to aborted, so that every barrier spin ends.
    /// Writes nothing once the team's memory was released.
    fn stop_device_waits(&self, peers: bool) {
        let live = self.sync_live.read();
        if !*live {
            return;
        }
        let driver = self.ctx.driver();
        let n = self.devices.len();
        let own: Vec<usize> = match self.local_rank() {
            Some(r) => vec![r],
            None => (0..n).collect(),
        };
        for &r in &own {
            let targets: Vec<usize> = if peers && self.comm.is_some() { (0..n).collect() } else { vec![r] };
            for q in targets {
                let at = self.sync[r][q] + STATE_OFFSET as u64;
                if let Err(e) = driver.poke_u32(self.devices[r], at, STATE_ABORTED) {
                    tracing::warn!("aborting: writing rank {q}'s state word from rank {r}: {e}");
                }
            }
        }
    }

    /// The team's asynchronous error without waiting (`mcast_team_get_error`): `None`,
    /// [`ErrorKind::Timeout`] or [`ErrorKind::Aborted`]. Besides the host's sticky error it
    /// reads this process's ranks' device words (a peer process's abort, a barrier timeout)
    /// without waiting for any stream.
    pub fn async_error(&self) -> Option<ErrorKind> {
        if let Some(e) = self.error() {
            return Some(e.kind);
        }
        // A peer process's abort message, not consumed (rendezvous waits see it too).
        if let Some(why) = self.comm.as_ref().and_then(|c| c.aborted()) {
            self.mark_aborted(&why);
            return Some(ErrorKind::Aborted);
        }
        let live = self.sync_live.read();
        if !*live {
            return None;
        }
        let driver = self.ctx.driver();
        let own: Vec<usize> = match self.local_rank() {
            Some(r) => vec![r],
            None => (0..self.devices.len()).collect(),
        };
        for r in own {
            let (dev, base) = (self.devices[r], self.sync[r][r]);
            if driver.peek_u32(dev, base + STATE_OFFSET as u64).is_ok_and(|w| w == STATE_ABORTED) {
                drop(live);
                self.mark_aborted("by a peer process: its rank wrote this rank's state word");
                return Some(ErrorKind::Aborted);
            }
            match driver.peek_u32(dev, base + ERROR_WORD_OFFSET as u64) {
                Ok(ERR_TIMEOUT) => {
                    let timeout_ms = self.ctx.config().timeout_ms;
                    self.set_error(Error::new(
                        ErrorKind::Timeout,
                        format!(
                            "rank {r}: a peer rank did not arrive within timeout_ms = {timeout_ms} ms; the team \
                             reports this error until it is destroyed"
                        ),
                    ));
                    return Some(ErrorKind::Timeout);
                }
                Ok(ERR_ABORTED) => {
                    drop(live);
                    self.mark_aborted("seen on the device");
                    return Some(ErrorKind::Aborted);
                }
                _ => {}
            }
        }
        None
    }

    /// The one-stream check (every collective form calls it before enqueuing): ranks of one
    /// team on one device given the same stream for the same collective cannot make progress
    /// (each waits in a barrier for the other, behind it on the stream). Records that rank `r`
    /// issues its next collective on `stream`, or fails with `InvalidArgument` naming both ranks
    /// when another rank on the same device issued the same collective (by count) on that
    /// stream. The NULL stream is one stream per device. Returns the round to pass to
    /// [`Team::unclaim_stream`] if the launch then fails.
    pub fn claim_stream(&self, r: usize, stream: Stream) -> Result<u64> {
        let mut rounds = self.rounds.lock();
        let round = rounds[r].issued;
        let dev = self.devices[r];
        for (q, other) in rounds.iter().enumerate() {
            if q == r || self.devices[q] != dev {
                continue;
            }
            if other.recent.iter().any(|&(k, s)| k == round && s == stream) {
                let name =
                    if stream.0 == 0 { "the NULL stream".to_string() } else { format!("stream {:#x}", stream.0) };
                return Err(Error::invalid_argument(format!(
                    "ranks {q} and {r} are both on device {dev} and were given the same stream ({name}) for the same \
                     collective: neither could make progress (each would wait for the other behind it on the \
                     stream); give each rank on a device its own stream. Nothing was enqueued for rank {r}"
                )));
            }
        }
        let mine = &mut rounds[r];
        mine.issued += 1;
        mine.recent.push_back((round, stream));
        if mine.recent.len() > ROUNDS_KEPT {
            mine.recent.pop_front();
        }
        Ok(round)
    }

    /// Forgets rank `r`'s claim of `round` (its launch failed: nothing was enqueued).
    pub fn unclaim_stream(&self, r: usize, round: u64) {
        let mut rounds = self.rounds.lock();
        let mine = &mut rounds[r];
        if mine.issued == round + 1 {
            mine.issued = round;
            mine.recent.retain(|&(k, _)| k != round);
        }
    }

    /// Waits for all work on every device of the team (as `cudaFree` does), so memory is not
    /// released under a kernel still using it.
    pub fn quiesce(&self) -> Result<()> {
        let mut devices = match self.local_rank() {
            Some(r) => vec![self.devices[r]],
            None => self.devices.clone(),
        };
        devices.sort_unstable();
        devices.dedup();
        for dev in devices {
            self.ctx
                .driver()
                .device_synchronize(dev)
                .map_err(|e| Error::driver(e, format_args!("waiting for work in flight on device {dev}")))?;
        }
        Ok(())
    }

    /// Buffers alive.
    pub fn live_buffers(&self) -> usize {
        self.state.lock().buffers
    }

    /// What `mcast_team_get_info` reports.
    pub fn info(&self) -> TeamInfo {
        let st = self.state.lock();
        let segs = st.segments.iter().map(|s| &s.seg).chain(st.cache.iter());
        let (mut mc, mut bytes) = (0u64, 0u64);
        for s in segs {
            mc += u64::from(s.has_multicast());
            if !s.is_registered() {
                bytes += s.size as u64;
            }
        }
        TeamInfo {
            size: self.devices.len(),
            transport: self.transport,
            transport_reason: self.reason.clone(),
            granularity: self.granularity as u64,
            multicast_objects: mc,
            bytes_reserved: bytes,
        }
    }

    /// Sets aside `bytes` on every rank.
    pub fn alloc(&self, bytes: usize) -> Result<Allocation> {
        if bytes == 0 {
            return Err(Error::invalid_argument("bytes is 0: a buffer needs at least one byte"));
        }
        let reserved = round_up(bytes, BUFFER_ALIGN)
            .filter(|r| round_up(*r, self.granularity).is_some())
            .ok_or_else(|| Error::invalid_argument(format!("bytes = {bytes} is too large")))?;
        self.check_not_aborted("allocating a buffer")?;
        let mut st = self.state.lock();
        if st.destroyed {
            return Err(Error::invalid_handle("the team was destroyed"));
        }
        if let Some(a) = Self::carve(&mut st, bytes, reserved) {
            return Ok(a);
        }
        if let Some(i) = st.cache.iter().position(|s| s.size >= reserved) {
            let seg = st.cache.swap_remove(i);
            let size = seg.size;
            st.segments.push(SegmentSlot { seg, free: vec![(0, size)], buffers: 0, bytes: 0 });
            return Ok(Self::carve(&mut st, bytes, reserved).expect("a fresh segment fits"));
        }
        let size = round_up(reserved, self.granularity).expect("checked above");
        let mut spare = std::mem::take(&mut st.cache);
        let ctx = &self.ctx;
        let mut trim = || {
            let freed: usize = spare.iter().map(|s| s.size).sum();
            for s in spare.drain(..) {
                for e in s.teardown(ctx) {
                    tracing::error!("trimming the segment cache: {e}");
                }
                if !s.is_released() {
                    ctx.park(s);
                }
            }
            freed as u64
        };
        let created = Segment::create(ctx, &self.shape, size, &mut trim);
        st.cache = spare;
        let seg = created
            .map_err(|e| e.context(format!("allocating a buffer of {bytes} bytes on devices {:?}", self.devices)))?;
        st.segments.push(SegmentSlot { seg: Arc::new(seg), free: vec![(0, size)], buffers: 0, bytes: 0 });
        Ok(Self::carve(&mut st, bytes, reserved).expect("a fresh segment fits"))
    }

    /// Makes a buffer of memory the application owns (see [`Segment::register`]): a segment of
    /// its own, released when the buffer is freed. Single-process teams.
    pub fn register(&self, ext: Vec<External>, bytes: usize, size: usize, mc_size: usize) -> Result<Allocation> {
        let mut st = self.state.lock();
        if st.destroyed {
            for e in ext {
                let _ = self.ctx.driver().mem_release(e.handle);
            }
            return Err(Error::invalid_handle("the team was destroyed"));
        }
        let ctx = &self.ctx;
        let mut trim = || ctx.trim_caches();
        let seg = Arc::new(Segment::register(ctx, &self.shape, ext, size, mc_size, &mut trim)?);
        st.segments.push(SegmentSlot { seg: seg.clone(), free: Vec::new(), buffers: 1, bytes });
        st.buffers += 1;
        Ok(Allocation { seg, offset: 0, bytes, reserved: 0 })
    }

    /// A registered buffer of a multi-process team (see [`Segment::register_mp`]): this
    /// process's rank registers `own`; `skews` and `ptrs` are every rank's offset into its
    /// allocation and pointer. Collective; voted, so a destroyed team on one rank fails every
    /// rank. Takes the retained handle (released on failure).
    #[allow(clippy::too_many_arguments)]
    pub fn register_mp(
        &self,
        own: External,
        skews: Vec<u64>,
        ptrs: Vec<DevicePtr>,
        bytes: usize,
        size: usize,
        mc_size: usize,
    ) -> Result<Allocation> {
        let comm = self.comm.as_ref().ok_or_else(|| Error::internal("register_mp on a single-process team"))?;
        let mut st = self.state.lock();
        let live = if st.destroyed { Err(Error::invalid_handle("the team was destroyed")) } else { Ok(()) };
        if let Err(e) = comm.vote("registration: team state", live) {
            if let Err(u) = self.ctx.driver().mem_release(own.handle) {
                tracing::error!("mcast_buffer_register: releasing a retained handle: {u}");
            }
            return Err(e);
        }
        let ctx = &self.ctx;
        let mut trim = || ctx.trim_caches();
        let seg = Segment::register_mp(ctx, &self.shape, comm, own, skews, ptrs, size, mc_size, &mut trim)?;
        let seg = Arc::new(seg);
        st.segments.push(SegmentSlot { seg: seg.clone(), free: Vec::new(), buffers: 1, bytes });
        st.buffers += 1;
        Ok(Allocation { seg, offset: 0, bytes, reserved: 0 })
    }

    /// The registered buffer of this team holding `[ptr, ptr + len)` of rank `rank`'s own
    /// memory, as an allocation, with the offset of `ptr` in it.
    pub fn find_registered(&self, rank: usize, ptr: DevicePtr, len: usize) -> Option<(Allocation, usize)> {
        let st = self.state.lock();
        st.segments.iter().find_map(|slot| {
            let base = slot.seg.user_ptr(rank)?;
            let bytes = slot.bytes;
            (ptr >= base && ptr.checked_add(len as u64)? <= base + bytes as u64)
                .then(|| (Allocation { seg: slot.seg.clone(), offset: 0, bytes, reserved: 0 }, (ptr - base) as usize))
        })
    }

    fn carve(st: &mut State, bytes: usize, reserved: usize) -> Option<Allocation> {
        for slot in st.segments.iter_mut() {
            if let Some(i) = slot.free.iter().position(|&(_, len)| len >= reserved) {
                let (off, len) = slot.free[i];
                if len == reserved {
                    slot.free.remove(i);
                } else {
                    slot.free[i] = (off + reserved, len - reserved);
                }
                slot.buffers += 1;
                st.buffers += 1;
                return Some(Allocation { seg: slot.seg.clone(), offset: off, bytes, reserved });
            }
        }
        None
    }

    /// Returns a buffer's range. An empty segment other than the first goes to the cache or is
    /// released.
    pub fn free(&self, a: &Allocation) -> Result<()> {
        let mut st = self.state.lock();
        let index = st
            .segments
            .iter()
            .position(|s| Arc::ptr_eq(&s.seg, &a.seg))
            .ok_or_else(|| Error::internal("a buffer's segment is not in its team"))?;
        if st.segments[index].seg.is_registered() {
            let seg = st.segments.remove(index).seg;
            st.buffers -= 1;
            let errors = self.release_segment(seg);
            return match errors.into_iter().next() {
                Some(e) => Err(e.context("unbinding and unmapping registered memory")),
                None => Ok(()),
            };
        }
        let slot = &mut st.segments[index];
        let at = slot.free.partition_point(|&(off, _)| off < a.offset);
        slot.free.insert(at, (a.offset, a.reserved));
        // Coalesce with the neighbours.
        if at + 1 < slot.free.len() && slot.free[at].0 + slot.free[at].1 == slot.free[at + 1].0 {
            slot.free[at].1 += slot.free[at + 1].1;
            slot.free.remove(at + 1);
        }
        if at > 0 && slot.free[at - 1].0 + slot.free[at - 1].1 == slot.free[at].0 {
            slot.free[at - 1].1 += slot.free[at].1;
            slot.free.remove(at);
        }
        slot.buffers -= 1;
        st.buffers -= 1;
        if index > 0 && st.segments[index].buffers == 0 {
            let seg = st.segments.remove(index).seg;
            let cached: usize = st.cache.iter().map(|s| s.size).sum();
            if st.cache.len() < MAX_CACHED_SEGMENTS && cached + seg.size <= MAX_CACHED_BYTES {
                st.cache.push(seg);
            } else {
                let errors = self.release_segment(seg);
                if let Some(e) = errors.into_iter().next() {
                    return Err(e.context("releasing an empty segment"));
                }
            }
        }
        Ok(())
    }

    /// Releases every cached empty segment; returns the bytes per rank freed. Skips a team
    /// that is busy (its own allocation trims its cache itself).
    pub fn trim_cache(&self) -> u64 {
        let Some(mut st) = self.state.try_lock() else { return 0 };
        let mut freed = 0u64;
        for s in std::mem::take(&mut st.cache) {
            freed += s.size as u64;
            for e in self.release_segment(s) {
                tracing::error!("trimming the segment cache: {e}");
            }
        }
        freed
    }

    /// Destroys the team: refused while buffers live, unless the team was aborted (then they go
    /// with it). After a failure (aborted, timed out) its device waits are ended first (this
    /// process's state words), so the wait for work in flight never waits on peers. A second
    /// destroy (racing threads) gets `InvalidHandle`.
    pub fn destroy(self: &Arc<Self>) -> Result<()> {
        let _one = self.destroying.lock();
        if self.state.lock().destroyed {
            return Err(Error::invalid_handle("the team was destroyed (by another call)"));
        }
        // What the host knows (no driver call: a device timeout nobody synchronized on is
        // found by mcast_team_get_error, which makes it known here).
        let failed = self.error().is_some() || self.comm.as_ref().and_then(|c| c.aborted()).is_some();
        // An aborted team goes with its buffers (they can no longer be freed one by one); a
        // timed-out one frees them first, as a healthy one.
        let aborted = self.is_aborted();
        let waited = if failed {
            self.stop_device_waits(false);
            self.quiesce()
        } else if self.live_buffers() == 0 {
            self.quiesce()
        } else {
            Ok(())
        };
        let errors = {
            let mut st = self.state.lock();
            if st.buffers > 0 && !aborted {
                return Err(Error::in_use(format!(
                    "the team still has {} live buffer(s); free them with mcast_buffer_free first",
                    st.buffers
                )));
            }
            self.release_locked(&mut st)
        };
        self.ctx.remove_team(self);
        match errors.into_iter().next() {
            Some(e) => Err(e.context("destroying the team")),
            // After a failure the wait's error is not news: the team's error was reported.
            None if failed => Ok(()),
            None => waited,
        }
    }

    /// Releases every segment, live buffers or not; returns the teardown errors.
    pub fn release_all(&self) -> Vec<Error> {
        if self.error().is_some() {
            self.stop_device_waits(false);
        }
        if let Err(e) = self.quiesce() {
            tracing::error!("releasing a team: {e}");
        }
        self.release_locked(&mut self.state.lock())
    }

    fn release_locked(&self, st: &mut State) -> Vec<Error> {
        *self.sync_live.write() = false;
        st.destroyed = true;
        st.buffers = 0;
        let segments = st.segments.drain(..).map(|slot| slot.seg).chain(st.cache.drain(..));
        let mut errors = Vec::new();
        for seg in segments.collect::<Vec<_>>() {
            errors.extend(self.release_segment(seg));
        }
        errors
    }

    /// Tears `seg` down; what a failing step kept is handed to the context, which retries it
    /// when it is destroyed.
    fn release_segment(&self, seg: Arc<Segment>) -> Vec<Error> {
        let errors = seg.teardown(&self.ctx);
        if !seg.is_released() {
            self.ctx.park(seg);
        }
        errors
    }
}

/// `"fabric"`, `"POSIX fd"` or `"no shareable"`.
fn handle_type_label(ht: HandleTypes) -> &'static str {
    if ht == HandleTypes::FABRIC {
        "fabric"
    } else if ht == HandleTypes::POSIX_FD {
        "POSIX fd"
    } else {
        "no shareable"
    }
}
