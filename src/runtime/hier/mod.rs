//! Teams across NVLink domains (API.md, "Teams across NVLink domains"): a kind of team of its
//! own ([`Across`]), above the flat team (`runtime::team`), served hierarchically: inside each
//! domain by a flat team over that domain's ranks (the *domain team*, which it composes),
//! between domains by an engine ([`crate::runtime::net`]) over *rails*: rail `j` is the ranks
//! with local index `j` inside their domain. The flat team knows nothing of it.
//!
//! - `mod.rs` (this file): what a team across domains holds ([`Across`]: the domain team, the
//!   whole team's connections, the rank layout, the engine and this rank's rail communicator)
//!   and the steps of its creation that need no team (the engine vote, the rank layout, the rail
//!   communicator).
//! - `create.rs`: its creation ([`Across::create`]: the domain team, then the rails).
//! - `team.rs`: what it does its own way besides the collectives: rank mapping, error, abort,
//!   synchronize, info, destroy (the flat team's, plus the whole team's connections and rails).
//! - `collective.rs`: the four collectives composed from the domain team's pointer-form
//!   collectives and the rail communicator; the pipelined all-reduce uses this rank's [`Pipe`].
//! - `agree.rs`: the comparison of a call's signature across the domains, before the first
//!   stage (through the engine where the rail calls run stage by stage, over the bootstrap
//!   where they are stream-ordered).
//!
//! Imports: this folder imports the flat team, its buffers and its collectives; nothing below it
//! imports this folder (`runtime/teams.rs`, above both, tells a handle's two kinds apart).

mod agree;
pub mod collective;
mod create;
mod team;

use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::driver::{Device, DevicePtr, Driver, Event, Stream};
use crate::runtime::comm::{Comm, Dec, Enc};
use crate::runtime::env::Env;
use crate::runtime::error::{Error, Result};
use crate::runtime::net::{Engine, RailComm, RailOob};
use crate::runtime::team::Team;

/// Where the ranks of a team across domains are: domain `d`'s ranks in team order (a rank's
/// local index is its position there).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Global ranks of each domain, ascending; every domain has the same number.
    pub members: Vec<Vec<usize>>,
    /// `(domain, local index)` of each global rank.
    pub place: Vec<(usize, usize)>,
}

impl Layout {
    /// The layout of `of_rank` (each rank's domain, domains numbered by their first rank).
    /// Domains of different sizes are refused (`NotSupported`, naming the sizes): the rails
    /// need one member per domain.
    pub fn new(of_rank: &[usize], names: &[String]) -> Result<Layout> {
        let count = of_rank.iter().max().map_or(0, |&d| d + 1);
        let mut members = vec![Vec::new(); count];
        let mut place = Vec::with_capacity(of_rank.len());
        for (g, &d) in of_rank.iter().enumerate() {
            place.push((d, members[d].len()));
            members[d].push(g);
        }
        if members.windows(2).any(|w| w[0].len() != w[1].len()) {
            let sizes: Vec<String> =
                members.iter().enumerate().map(|(d, m)| format!("{} has {}", names[d], m.len())).collect();
            return Err(Error::not_supported(format!(
                "the team spans {count} NVLink domains of different sizes ({}): a team across domains needs the \
                 same number of ranks in every domain (one rail member per domain)",
                sizes.join(", ")
            )));
        }
        Ok(Layout { members, place })
    }

    /// Domains.
    pub fn domains(&self) -> usize {
        self.members.len()
    }

    /// Ranks per domain.
    pub fn domain_size(&self) -> usize {
        self.members[0].len()
    }

    /// Ranks.
    pub fn size(&self) -> usize {
        self.place.len()
    }

    /// The global rank at `(domain, local)`.
    pub fn rank_of(&self, domain: usize, local: usize) -> usize {
        self.members[domain][local]
    }

    /// True when every domain's ranks are consecutive in team order, domain by domain
    /// (`rank = domain * L + local`).
    pub fn contiguous(&self) -> bool {
        let l = self.domain_size();
        self.place.iter().enumerate().all(|(g, &(d, j))| g == d * l + j)
    }
}

/// A team across NVLink domains: one rank of it in this process.
pub struct Across {
    /// The domain team: this rank's domain's ranks, in local order.
    pub team: Arc<Team>,
    /// The whole team's connections (split, the votes of the hierarchical steps, failures told
    /// by ranks of other domains).
    pub global: Arc<Comm>,
    /// Where every rank is.
    pub layout: Layout,
    /// This process's rank in the whole team.
    pub rank: usize,
    /// This rank's domain and local index (its rail).
    pub domain: usize,
    /// This rank's local index.
    pub local: usize,
    /// The NVLink domains' names, for messages.
    pub names: Vec<String>,
    engine: Arc<dyn Engine>,
    /// This rank's rail communicator; `None` once destroyed.
    rail: RwLock<Option<Box<dyn RailComm>>>,
    /// Device scratch of the composed collectives (grown on demand, freed at destroy).
    scratch: Mutex<Scratch>,
    /// The rail stream and events of the pipelined all-reduce: made with the team when the
    /// rail calls enqueue on streams (`rails_on_streams`); `None` otherwise and once destroyed.
    pipe: Mutex<Option<Pipe>>,
    device: Device,
}

/// A rank's second stream and its events, for the pipelined all-reduce
/// (`collective.rs`): the rail calls of the chunks run on `stream` while the caller's stream
/// runs the domain stages, ordered by events. Made with the team, destroyed with it.
pub struct Pipe {
    /// The rail stream (non-blocking, like NCCL's internal streams).
    pub stream: Stream,
    /// Recorded on the caller's stream at entry; the rail stream waits on it first (fork).
    pub fork: Event,
    /// Recorded on the rail stream last; the caller's stream waits on it at the end (join).
    pub join: Event,
    /// `reduced[k]`: recorded on the caller's stream after chunk k's domain reduce-scatter.
    pub reduced: Vec<Event>,
    /// `railed[k]`: recorded on the rail stream after chunk k's rail all-reduce.
    pub railed: Vec<Event>,
}

impl Pipe {
    /// A stream and `2 + 2 * collective::MAX_CHUNKS` untimed events on `dev` (all or none).
    fn create(driver: &dyn Driver, dev: Device) -> Result<Pipe> {
        let stream = driver
            .stream_create(dev)
            .map_err(|e| Error::driver(e, format_args!("creating the rail stream on device {dev}")))?;
        let mut events = Vec::with_capacity(2 + 2 * collective::MAX_CHUNKS);
        while events.len() < events.capacity() {
            match driver.event_create_untimed(dev) {
                Ok(e) => events.push(e),
                Err(e) => {
                    for undo in Pipe::from_parts(stream, events).destroy(driver, dev) {
                        tracing::error!("rolling back the rail stream: {undo}");
                    }
                    return Err(Error::driver(e, format_args!("creating the rail stream's events on device {dev}")));
                }
            }
        }
        Ok(Pipe::from_parts(stream, events))
    }

    /// Destroys what `create` made; returns the errors.
    fn destroy(self, driver: &dyn Driver, dev: Device) -> Vec<Error> {
        let mut errors = Vec::new();
        let events = [self.fork, self.join].into_iter().chain(self.reduced).chain(self.railed);
        for e in events.filter(|e| e.0 != 0) {
            if let Err(err) = driver.event_destroy(dev, e) {
                errors.push(Error::driver(err, "destroying an event of the rail stream"));
            }
        }
        if let Err(err) = driver.stream_destroy(dev, self.stream) {
            errors.push(Error::driver(err, "destroying the rail stream"));
        }
        errors
    }

    /// The pipe of `stream` and `events` (missing events are `Event(0)`, skipped by `destroy`).
    fn from_parts(stream: Stream, mut events: Vec<Event>) -> Pipe {
        events.resize(2 + 2 * collective::MAX_CHUNKS, Event(0));
        let railed = events.split_off(2 + collective::MAX_CHUNKS);
        let reduced = events.split_off(2);
        Pipe { stream, fork: events[0], join: events[1], reduced, railed }
    }
}

/// A device allocation of the composed collectives.
#[derive(Default)]
struct Scratch {
    ptr: DevicePtr,
    bytes: usize,
}

impl std::fmt::Debug for Across {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Across(rank {}, domain {}, local {}, engine {})",
            self.rank,
            self.domain,
            self.local,
            self.engine.name()
        )
    }
}

/// The rail allgather handed to an engine's `comm_create`: an exchange over the whole team's
/// connections of which each rank keeps its rail's parts (so every rail's `comm_create` must
/// call it the same number of times, as an engine's symmetric setup does).
struct Oob<'a> {
    global: &'a Comm,
    layout: &'a Layout,
    local: usize,
}

impl RailOob for Oob<'_> {
    fn allgather(&self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let n = self.layout.domains();
        if recv.len() != n * send.len() {
            return Err(Error::invalid_argument(format!(
                "the rail allgather's receive buffer holds {} bytes, not {n} x {}",
                recv.len(),
                send.len()
            )));
        }
        let mut e = Enc::default();
        e.bytes(send);
        let parts = self.global.exchange("rail oob allgather", Ok(()), &e.0, &[])?;
        for (d, chunk) in recv.chunks_mut(send.len().max(1)).enumerate().take(n) {
            let g = self.layout.rank_of(d, self.local);
            let bytes = Dec(&parts[g].bytes).bytes()?;
            if bytes.len() != chunk.len() {
                return Err(Error::invalid_argument(format!(
                    "the rail allgather was given {} bytes by rank {g} and {} here: every rail member passes the same \
                     size",
                    bytes.len(),
                    chunk.len()
                )));
            }
            chunk.copy_from_slice(&bytes);
        }
        Ok(())
    }
}

/// True when `engine`'s calls enqueue on the stream they are given, on `driver`: a
/// stream-ordered engine on CUDA, or on the simulator one that enqueues there.
fn rails_on_streams(engine: &dyn Engine, driver: &dyn Driver) -> bool {
    engine.stream_ordered() && (driver.as_sim().is_none() || engine.enqueues_on_sim())
}

impl Across {
    /// The first steps of a team across domains, on every rank of `global`: the engine (every
    /// rank must have one: one rank's failure is every rank's `NotSupported`, naming the
    /// engines tried) and the layout (equal domain sizes). `spanning` begins the messages
    /// ("the team spans 2 NVLink domains: ..."), `why` ends them (why not one domain).
    /// Returns the engine and the layout.
    pub fn prepare(
        env: &Env,
        global: &Comm,
        of_rank: &[usize],
        names: &[String],
        spanning: &str,
        why: &str,
    ) -> Result<(Arc<dyn Engine>, Layout)> {
        let layout = Layout::new(of_rank, names);
        let sim = env.driver().backend_name() == "sim";
        let engine = crate::runtime::net::choose(env.registered_net(), env.config(), sim).map_err(|tried| {
            Error::not_supported(format!("{spanning}; rank {} has no engine between them: {tried}{why}", global.rank()))
        });
        let status = match (&layout, &engine) {
            (Err(e), _) | (_, Err(e)) => Err(e.clone()),
            _ => Ok(()),
        };
        global.vote("engine between NVLink domains", status)?;
        Ok((engine?, layout?))
    }

    /// This rank's rail communicator (`engine.comm_create` over the rail of `local`), voted
    /// over the whole team: one rank's failure is every rank's, and a communicator made here
    /// is destroyed when another rank failed.
    ///
    /// When the rail calls enqueue on streams (a stream-ordered engine on CUDA) it also makes
    /// this rank's [`Pipe`] (voted with the communicator). `team`: the domain team, made.
    pub fn connect(
        team: Arc<Team>,
        global: Arc<Comm>,
        engine: Arc<dyn Engine>,
        layout: Layout,
        names: Vec<String>,
        device: Device,
    ) -> Result<Across> {
        let env = team.context().clone();
        let rank = global.rank();
        let (domain, local) = layout.place[rank];
        let oob = Oob { global: &global, layout: &layout, local };
        let driver = &**env.driver();
        let made = engine
            .comm_create(local, domain, layout.domains(), &oob)
            .map_err(|e| {
                e.context(format!("rank {rank} making the communicator of rail {local} (engine \"{}\")", engine.name()))
            })
            .and_then(|comm| {
                if !rails_on_streams(&*engine, driver) {
                    return Ok((comm, None));
                }
                match Pipe::create(driver, device) {
                    Ok(pipe) => Ok((comm, Some(pipe))),
                    Err(e) => {
                        if let Err(undo) = comm.destroy() {
                            tracing::error!("rolling back a rail communicator: {undo}");
                        }
                        Err(e.context(format!("rank {rank}")))
                    }
                }
            });
        let status = made.as_ref().map(|_| ()).map_err(Clone::clone);
        // The last agreement of the formation: confirmed (see `Comm::vote_confirmed`).
        if let Err(e) = global.vote_confirmed("rail communicators", status) {
            if let Ok((comm, pipe)) = made {
                if let Err(undo) = comm.destroy() {
                    tracing::error!("rolling back a rail communicator: {undo}");
                }
                for undo in pipe.map(|p| p.destroy(driver, device)).unwrap_or_default() {
                    tracing::error!("rolling back the rail stream: {undo}");
                }
            }
            return Err(e);
        }
        let (rail, pipe) = made.expect("voted");
        Ok(Across {
            team,
            global,
            layout,
            rank,
            domain,
            local,
            names,
            engine,
            rail: RwLock::new(Some(rail)),
            scratch: Mutex::new(Scratch::default()),
            pipe: Mutex::new(pipe),
            device,
        })
    }

    /// The engine's name (`mcast_team_info_t.net_engine`).
    pub fn engine_name(&self) -> &str {
        self.engine.name()
    }

    /// True when the engine's calls enqueue on the stream they are given, on `driver`.
    pub fn rails_on_streams(&self, driver: &dyn Driver) -> bool {
        rails_on_streams(&*self.engine, driver)
    }

    /// Checks that `rank` is this process's rank of the whole team; returns its local index
    /// (its rank in the domain team).
    pub fn own(&self, rank: i32, what: &str) -> Result<usize> {
        let p = self.layout.size();
        if rank < 0 || rank as usize >= p {
            return Err(Error::invalid_argument(format!("{what} {rank} is out of range: the team has {p} rank(s)")));
        }
        if rank as usize != self.rank {
            return Err(Error::invalid_argument(format!(
                "{what} {rank} belongs to another process: this process is rank {} of a multi-process team",
                self.rank
            )));
        }
        Ok(self.local)
    }

    /// The domain team's index of `peer`, a rank of the whole team in this rank's domain
    /// (buffers of a team across domains are symmetric inside the domain only).
    pub fn peer_in_domain(&self, peer: i32) -> Result<usize> {
        let p = self.layout.size();
        if peer < 0 || peer as usize >= p {
            return Err(Error::invalid_argument(format!("peer {peer} is out of range: the team has {p} rank(s)")));
        }
        let (d, j) = self.layout.place[peer as usize];
        if d != self.domain {
            return Err(Error::invalid_argument(format!(
                "peer {peer} is in NVLink domain {} and rank {} in {}: a buffer of a team across domains is mapped \
                 only inside each domain",
                self.names[d], self.rank, self.names[self.domain]
            )));
        }
        Ok(j)
    }

    /// Runs `f` on the rail communicator (`Aborted` once destroyed).
    pub fn with_rail<T>(&self, f: impl FnOnce(&dyn RailComm) -> Result<T>) -> Result<T> {
        match self.rail.read().as_deref() {
            Some(c) => f(c),
            None => Err(Error::aborted("the team's rail communicator was destroyed")),
        }
    }

    /// Aborts the rail communicator and tells every rank of the whole team (`mcast_team_abort`).
    fn abort_rails(&self, who: &str) {
        self.global.abort(who);
        if let Some(c) = self.rail.read().as_deref() {
            if let Err(e) = c.abort() {
                tracing::warn!("aborting the rail communicator: {e}");
            }
        }
    }

    /// Runs `f` with this rank's [`Pipe`] (`None`: the all-reduce runs unpipelined), held for
    /// the collective's issue.
    pub fn with_pipe<T>(&self, f: impl FnOnce(Option<&Pipe>) -> Result<T>) -> Result<T> {
        f(self.pipe.lock().as_ref())
    }

    /// Destroys the rail communicator, the rail stream and its events, and frees the scratch
    /// (team destroy); idempotent.
    fn release_rails(&self) -> Vec<Error> {
        let env = self.team.context();
        let mut errors = Vec::new();
        if let Some(c) = self.rail.write().take() {
            if let Err(e) = c.destroy() {
                errors.push(e.context("destroying the rail communicator"));
            }
        }
        if let Some(p) = self.pipe.lock().take() {
            errors.extend(p.destroy(&**env.driver(), self.device));
        }
        let mut s = self.scratch.lock();
        if s.bytes > 0 {
            if let Err(e) = env.driver().mem_free(self.device, s.ptr) {
                errors.push(Error::driver(e, "freeing the team's scratch between domains"));
            }
            *s = Scratch::default();
        }
        errors
    }

    /// Device scratch of at least `bytes` bytes on this rank's device, for work about to be
    /// enqueued on `stream` (which is first synchronised when the scratch must grow, so no
    /// earlier call still uses the old one). The scratch is held until `f` returns.
    pub fn with_scratch<T>(
        &self,
        env: &Env,
        bytes: usize,
        stream: crate::driver::Stream,
        f: impl FnOnce(DevicePtr) -> Result<T>,
    ) -> Result<T> {
        let mut s = self.scratch.lock();
        if s.bytes < bytes {
            let driver = env.driver();
            driver
                .stream_synchronize(self.device, stream)
                .map_err(|e| Error::driver(e, "waiting for the stream before growing the scratch between domains"))?;
            if s.bytes > 0 {
                driver
                    .mem_free(self.device, s.ptr)
                    .map_err(|e| Error::driver(e, "freeing the scratch between domains"))?;
                *s = Scratch::default();
            }
            let size = bytes.next_power_of_two().max(4096);
            let ptr = driver
                .mem_alloc(self.device, size)
                .map_err(|e| Error::driver(e, format_args!("allocating {size} bytes of scratch between domains")))?;
            *s = Scratch { ptr, bytes: size };
        }
        f(s.ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_place_ranks_by_order_of_appearance() {
        let names: Vec<String> = vec!["A".into(), "B".into(), "C".into()];
        let l = Layout::new(&[0, 1, 0, 1], &names).unwrap();
        assert_eq!(l.members, vec![vec![0, 2], vec![1, 3]]);
        assert_eq!(l.place, vec![(0, 0), (1, 0), (0, 1), (1, 1)]);
        assert!(!l.contiguous());
        let l = Layout::new(&[0, 0, 1, 1, 2, 2], &names).unwrap();
        assert!(l.contiguous());
        assert_eq!((l.domains(), l.domain_size(), l.rank_of(2, 1)), (3, 2, 5));
        let e = Layout::new(&[0, 0, 1], &names).unwrap_err();
        assert_eq!(e.kind, crate::runtime::ErrorKind::NotSupported);
        assert!(e.message.contains("A has 2, B has 1"), "{}", e.message);
    }
}
