//! The two kinds of team behind a team handle, and the one place that tells them apart: a
//! *flat* team ([`team::Team`](crate::runtime::team::Team): its ranks in one NVLink domain)
//! and a team across NVLink domains ([`Across`]: a flat domain team, its rails and its layout,
//! `runtime::hier`). Each kind implements its collectives, abort, error and info its own way;
//! [`AnyTeam`] and [`AnyBuffer`] (a buffer with the team whose handle made it) only choose which.
//! A team across domains numbers its ranks in the whole team and maps them to its domain team's
//! at each call; a flat team's ranks are its own.

use std::sync::Arc;

use super::buffer::Buffer;
use super::collective;
use super::device_api::{BufferView, TeamView};
use super::env::Env;
use super::error::{ErrorKind, Result};
use super::hier::{self, Across};
use super::team::{check_colors, split_over, Joined, Team, TeamInfo};
use crate::bootstrap::ID_BYTES;
use crate::driver::{DevicePtr, Stream};
use crate::kernels::Collective;

/// A team, of either kind.
#[derive(Clone)]
pub enum AnyTeam {
    /// Its ranks in one NVLink domain.
    Flat(Arc<Team>),
    /// Its ranks in several NVLink domains.
    Across(Arc<Across>),
}

impl From<Arc<Team>> for AnyTeam {
    fn from(t: Arc<Team>) -> AnyTeam {
        AnyTeam::Flat(t)
    }
}

impl AnyTeam {
    /// Joins the multi-process team named by `id` (see [`Team::join_rank`]): a flat team, or,
    /// where the ranks span several NVLink domains, a team across them ([`Across::create`]).
    pub fn init_rank(env: &Arc<Env>, id: &[u8; ID_BYTES], nranks: i32, rank: i32, device: i32) -> Result<AnyTeam> {
        Self::joined(env, Team::join_rank(env, id, nranks, rank, device)?, device)
    }

    /// Like [`AnyTeam::init_rank`], the processes meeting through the caller's allgather (see
    /// [`Team::join_oob`]).
    pub fn init_oob(
        env: &Arc<Env>,
        allgather: crate::bootstrap::oob::Allgather<'_>,
        nranks: i32,
        rank: i32,
        device: i32,
    ) -> Result<AnyTeam> {
        Self::joined(env, Team::join_oob(env, allgather, nranks, rank, device)?, device)
    }

    fn joined(env: &Arc<Env>, joined: Joined, device: i32) -> Result<AnyTeam> {
        match joined {
            Joined::Team(t) => Ok(AnyTeam::Flat(t)),
            Joined::AcrossDomains { comm, domains, why, .. } => {
                Ok(AnyTeam::Across(Across::create(env, comm, device, &domains, &why)?))
            }
        }
    }

    /// The flat team that holds the team's memory: the team itself, or a team across domains'
    /// domain team (once it has heard the whole team's failures).
    pub fn inner(&self) -> &Arc<Team> {
        match self {
            AnyTeam::Flat(t) => t,
            AnyTeam::Across(a) => a.domain_team(),
        }
    }

    /// The context's shared part.
    pub fn context(&self) -> &Arc<Env> {
        self.inner().context()
    }

    /// True when `self` and `other` are the same team.
    pub fn same(&self, other: &AnyTeam) -> bool {
        match (self, other) {
            (AnyTeam::Flat(a), AnyTeam::Flat(b)) => Arc::ptr_eq(a, b),
            (AnyTeam::Across(a), AnyTeam::Across(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// Ranks.
    pub fn size(&self) -> usize {
        match self {
            AnyTeam::Flat(t) => t.size(),
            AnyTeam::Across(a) => a.size(),
        }
    }

    /// The rank this process holds in a multi-process team (every team across domains is one).
    pub fn local_rank(&self) -> Option<usize> {
        match self {
            AnyTeam::Flat(t) => t.local_rank(),
            AnyTeam::Across(a) => Some(a.rank),
        }
    }

    /// How many ranks this process holds (the length of the per-rank arrays of split and
    /// register).
    pub fn held(&self) -> usize {
        if self.local_rank().is_some() {
            1
        } else {
            self.size()
        }
    }

    /// The rank the application names (`rank` of a C call) as the flat team takes it: itself,
    /// or for a team across domains this process's index in its domain team (after checking
    /// that `rank` is this process's rank of the whole team).
    pub fn own_index(&self, rank: i32) -> Result<i32> {
        match self {
            AnyTeam::Flat(_) => Ok(rank),
            AnyTeam::Across(a) => {
                // The call that follows on the domain team's memory finds the whole team's failures.
                a.domain_team();
                Ok(a.own(rank, "rank")? as i32)
            }
        }
    }

    /// A peer the application names (`peer` of a C call) as the flat team takes it: itself,
    /// or for a team across domains a rank of this process's domain, as its index there.
    pub fn peer_index(&self, peer: i32) -> Result<i32> {
        match self {
            AnyTeam::Flat(_) => Ok(peer),
            AnyTeam::Across(a) => Ok(a.peer_in_domain(peer)? as i32),
        }
    }

    /// Destroys the team (`mcast_team_destroy`).
    pub fn destroy(&self) -> Result<()> {
        match self {
            AnyTeam::Flat(t) => t.destroy(),
            AnyTeam::Across(a) => a.destroy(),
        }
    }

    /// Aborts the team (`mcast_team_abort`).
    pub fn abort(&self) {
        match self {
            AnyTeam::Flat(t) => t.abort(),
            AnyTeam::Across(a) => a.abort(),
        }
    }

    /// The asynchronous error (`mcast_team_get_error`).
    pub fn async_error(&self) -> Option<ErrorKind> {
        match self {
            AnyTeam::Flat(t) => t.async_error(),
            AnyTeam::Across(a) => a.async_error(),
        }
    }

    /// What `mcast_team_get_info` reports.
    pub fn info(&self) -> TeamInfo {
        match self {
            AnyTeam::Flat(t) => t.info(),
            AnyTeam::Across(a) => a.info(),
        }
    }

    /// The device view for `mcast_team_device_handle` (refused across domains).
    pub fn device_view(&self, rank: i32) -> Result<TeamView> {
        match self {
            AnyTeam::Flat(t) => t.device_view(rank),
            AnyTeam::Across(a) => Err(a.refuse_device_api()),
        }
    }

    /// Waits for rank `rank`'s work on `stream` (`mcast_synchronize`).
    pub fn synchronize(&self, rank: i32, stream: Stream) -> Result<()> {
        match self {
            AnyTeam::Flat(t) => collective::synchronize(t, rank, stream),
            AnyTeam::Across(a) => a.synchronize(rank, stream),
        }
    }

    /// The pointer form of collective `c` (`mcast_team_*`).
    pub fn run_ptr(
        &self,
        rank: i32,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        c: Collective,
        stream: Stream,
    ) -> Result<()> {
        match self {
            AnyTeam::Flat(t) => collective::run_ptr(t, rank, send, recv, count, c, stream),
            AnyTeam::Across(a) => hier::collective::run_ptr(a, rank, send, recv, count, c, stream),
        }
    }

    /// Splits the team (`mcast_team_split`; see [`Team::split`]): a team across domains
    /// splits over the whole team's connections, and a color whose ranks span several domains
    /// makes a team across them.
    pub fn split(&self, colors: &[i32], keys: &[i32]) -> Result<Vec<Option<AnyTeam>>> {
        match self {
            AnyTeam::Flat(t) => Ok(t.split(colors, keys)?.into_iter().map(|t| t.map(AnyTeam::Flat)).collect()),
            AnyTeam::Across(a) => {
                if colors.len() != 1 || keys.len() != 1 {
                    return Err(crate::runtime::Error::internal("split: one color and one key per rank"));
                }
                let valid = check_colors(a.check_usable("splitting the team"), colors);
                let env = a.team.context();
                let device = a.team.devices()[a.local];
                let made = split_over(&a.global, valid, colors[0], keys[0], |id, n, r| {
                    AnyTeam::init_rank(env, id, n, r, device)
                })?;
                Ok(vec![made])
            }
        }
    }

    /// Allocates a buffer of `bytes` per rank (`mcast_buffer_alloc`).
    pub fn alloc(&self, bytes: usize) -> Result<AnyBuffer> {
        let buf = Buffer::alloc(self.inner(), bytes)?;
        Ok(AnyBuffer { buf: Arc::new(buf), team: self.clone() })
    }

    /// Registers the caller's memory (`mcast_buffer_register`; one pointer per rank held).
    pub fn register(&self, ptrs: &[DevicePtr], bytes: usize) -> Result<AnyBuffer> {
        let buf = Buffer::register(self.inner(), ptrs, bytes)?;
        Ok(AnyBuffer { buf: Arc::new(buf), team: self.clone() })
    }
}

/// A buffer and the team whose handle made it.
#[derive(Clone)]
pub struct AnyBuffer {
    /// The buffer (of the flat team that holds the team's memory).
    pub buf: Arc<Buffer>,
    /// The team.
    pub team: AnyTeam,
}

impl AnyBuffer {
    /// Bytes per rank.
    pub fn size(&self) -> usize {
        self.buf.size()
    }

    /// Frees the buffer (`mcast_buffer_free`; refused once the team was aborted).
    pub fn free(&self) -> Result<()> {
        self.team.inner();
        self.buf.free()
    }

    /// Rank `rank`'s copy (`mcast_buffer_local_ptr`).
    pub fn local_ptr(&self, rank: i32) -> Result<DevicePtr> {
        self.buf.local_ptr(self.team.own_index(rank)?)
    }

    /// Rank `peer`'s copy as rank `rank` maps it (`mcast_buffer_peer_ptr`).
    pub fn peer_ptr(&self, rank: i32, peer: i32) -> Result<DevicePtr> {
        self.buf.peer_ptr(self.team.own_index(rank)?, self.team.peer_index(peer)?)
    }

    /// The multicast address on rank `rank`'s device (`mcast_buffer_multicast_ptr`).
    pub fn multicast_ptr(&self, rank: i32) -> Result<DevicePtr> {
        self.buf.multicast_ptr(self.team.own_index(rank)?)
    }

    /// Copies `src` into rank `rank`'s copy at `offset` (`mcast_buffer_write`).
    pub fn write(&self, rank: i32, offset: usize, src: &[u8]) -> Result<()> {
        self.buf.write(self.team.own_index(rank)?, offset, src)
    }

    /// Copies rank `rank`'s copy at `offset` into `dst` (`mcast_buffer_read`).
    pub fn read(&self, rank: i32, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.buf.read(self.team.own_index(rank)?, offset, dst)
    }

    /// The device view for `mcast_buffer_device_handle` (refused across domains).
    pub fn device_view(&self, rank: i32) -> Result<BufferView> {
        match &self.team {
            AnyTeam::Flat(_) => self.buf.device_view(rank),
            AnyTeam::Across(a) => Err(a.refuse_device_api()),
        }
    }

    /// The in-place buffer form of collective `c`.
    pub fn run(&self, rank: i32, offset: usize, count: usize, c: Collective, stream: Stream) -> Result<()> {
        match &self.team {
            AnyTeam::Flat(_) => collective::run(&self.buf, rank, offset, count, c, stream),
            AnyTeam::Across(a) => hier::collective::run(a, &self.buf, rank, offset, count, c, stream),
        }
    }

    /// The `_into` buffer form of collective `c`, from this buffer into `recv`.
    #[allow(clippy::too_many_arguments)]
    pub fn run_into(
        &self,
        send_offset: usize,
        recv: &AnyBuffer,
        recv_offset: usize,
        rank: i32,
        count: usize,
        c: Collective,
        stream: Stream,
    ) -> Result<()> {
        let (s, r) = (&self.buf, &recv.buf);
        match &self.team {
            AnyTeam::Flat(_) => collective::run_into(s, send_offset, r, recv_offset, rank, count, c, stream),
            AnyTeam::Across(a) => hier::collective::run_into(a, s, send_offset, r, recv_offset, rank, count, c, stream),
        }
    }
}
