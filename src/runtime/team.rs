//! Teams and their symmetric buffers.
//!
//! A team is an ordered list of ranks, rank `i` on `devices[i]`, with a transport chosen once.
//! Buffers are ranges of segments: small buffers share a segment, freed ranges are reused, an
//! empty segment goes to a bounded cache (trimmed first when memory runs out) or is released.
//! The team's barrier signal words live in the first [`SYNC_BYTES`] of its first segment.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::comm::{Comm, Dec, Enc, ID_BYTES};
use super::config::{HandleTypeMode, MulticastMode};
use super::context::Context;
use super::error::{Error, Result};
use super::policy;
use super::segment::{Segment, Shape};
use crate::bootstrap::{host, Bootstrap};
use crate::driver::{Device, DevicePtr, Granularity, HandleTypes, MulticastProp};
use crate::kernels::{MAX_RANKS, SYNC_BYTES};

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
}

struct SegmentSlot {
    seg: Arc<Segment>,
    /// Free ranges `(offset, len)`, sorted by offset, coalesced.
    free: Vec<(usize, usize)>,
    buffers: usize,
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
        // The first segment holds the sync regions (zeroed) and the push one-shot's scratch.
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
        });
        team.install_first_segment(seg, size, reserved);
        tracing::debug!(
            "multi-process team {serial}, rank {r} of {n} on devices {devices:?}: {transport:?}, {} handles",
            handle_type_label(handle_type)
        );
        Ok(team)
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

    /// The sticky device error, if a collective of this team failed on the device.
    pub fn error(&self) -> Option<Error> {
        self.error.lock().clone()
    }

    /// Records the first device error; later calls report it until the team is destroyed.
    pub fn set_error(&self, e: Error) {
        self.error.lock().get_or_insert(e);
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
            bytes += s.size as u64;
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
            st.segments.push(SegmentSlot { seg, free: vec![(0, size)], buffers: 0 });
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
        st.segments.push(SegmentSlot { seg: Arc::new(seg), free: vec![(0, size)], buffers: 0 });
        Ok(Self::carve(&mut st, bytes, reserved).expect("a fresh segment fits"))
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

    /// Destroys the team: refused while buffers live.
    pub fn destroy(self: &Arc<Self>) -> Result<()> {
        let waited = if self.live_buffers() == 0 { self.quiesce() } else { Ok(()) };
        let errors = {
            let mut st = self.state.lock();
            if st.buffers > 0 {
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
            None => waited,
        }
    }

    /// Releases every segment, live buffers or not; returns the teardown errors.
    pub fn release_all(&self) -> Vec<Error> {
        if let Err(e) = self.quiesce() {
            tracing::error!("releasing a team: {e}");
        }
        self.release_locked(&mut self.state.lock())
    }

    fn release_locked(&self, st: &mut State) -> Vec<Error> {
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
