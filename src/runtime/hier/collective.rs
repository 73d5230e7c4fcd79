//! The collectives of a team across NVLink domains, composed from the domain team's
//! pointer-form collectives (`runtime::collective::run_ptr`: zero-copy where the memory is a
//! registered buffer of the domain team, staged otherwise) and the rail communicator. The
//! buffer and `_into` forms become the pointer form on the rank's copy of the buffer. With N
//! domains of L ranks (rank g at domain d, local index l), each rank's part:
//!
//! - **all-reduce**: up to [`SMALL_BYTES`] (or fewer elements than L): domain all-reduce, then
//!   rail all-reduce of the whole message (two steps, the shortest path). Larger: domain
//!   reduce-scatter of the first `L * (count / L)` elements (rank l keeps shard l, in `recv`),
//!   rail all-reduce of the shard, domain all-gather of the shards into `recv`; the
//!   `count % L` elements left go the short way. From 32 MiB on, that part is cut into K
//!   chunks ([`Chunks`]: K = sqrt(bytes / [`DEPTH_BYTES`]), at most [`MAX_CHUNKS`], each a
//!   multiple of L elements) and pipelined: with a stream-ordered engine on CUDA, chunk k's rail
//!   call runs on the rank's rail stream ([`super::Pipe`]) while the caller's stream runs chunk
//!   k+1's reduce-scatter; elsewhere the same chunks run in the same order, stage by stage.
//! - **reduce-scatter**: `send`'s P blocks are ordered by (local index, domain) so that a
//!   domain reduce-scatter leaves rank l the N blocks of its rail's ranks reduced over the
//!   domain; a rail reduce-scatter then gives domain d's member block g's reduction. When each
//!   domain's ranks are consecutive in team order, N domain reduce-scatters read `send`
//!   directly (no reordering copy).
//! - **all-gather**: domain all-gather into scratch (the domain's L blocks), rail all-gather of
//!   that (as 32-bit words, padded: the engine needs a dtype and mcast has no 8-bit one), then
//!   each block copied to its rank's place in `recv`.
//! - **broadcast**: the root's rail broadcasts the message (padded to 32-bit words) from the
//!   root's domain, then every domain broadcasts from its member of that rail.
//!
//! Results are the same on every rank: each reduced element is reduced once, on one rail (or,
//! the short way, by the same deterministic steps on every rail from equal inputs). With an
//! engine that is not stream-ordered (MPI), and on the simulator with an engine that cannot
//! enqueue on its streams (NCCL; `Engine::enqueues_on_sim`), the stages run one after the
//! other: the stream is synchronised before each rail call, which completes before it returns,
//! and a collective that used the scratch synchronises the stream before returning. With a
//! stream-ordered engine every stage is enqueued on the caller's stream (the pipelined
//! all-reduce's rail calls on the rail stream, forked from and joined to it by events); a
//! rank's collectives on one team share one scratch, so they must be issued on one stream.
//! Reduce-scatter, all-gather and broadcast are not pipelined.

use std::cell::Cell;
use std::sync::Arc;

use super::{Across, Pipe};
use crate::driver::{DevicePtr, Stream};
use crate::kernels::abi::signature::{signature, Offsets};
use crate::kernels::{Collective, DType};
use crate::runtime::buffer::Buffer;
use crate::runtime::collective as domain;
use crate::runtime::error::{Error, ErrorKind, Result};
use crate::runtime::net::RailComm;
use crate::runtime::team::Team;

/// Largest all-reduce (bytes) that takes the short way: domain all-reduce, then rail
/// all-reduce of the whole message.
pub const SMALL_BYTES: usize = 64 * 1024;

/// The pipeline depth of an all-reduce of B bytes through the rails is K = floor(sqrt(B /
/// `DEPTH_BYTES`)), at most [`MAX_CHUNKS`]: the depth that the cost model (BENCHMARKS.md, "Teams
/// across NVLink domains: the cost model") finds best, within 1% up to 1 GiB on 2 to 64 domains
/// (deeper, each chunk's latency costs more than the overlap gains). Pipelined (K >= 2) from 4 x
/// this (32 MiB), chunks of 16 MiB or more.
pub const DEPTH_BYTES: usize = 8 << 20;

/// Most chunks of a pipelined all-reduce (within 4% of the model's best depth at 4 GiB).
pub const MAX_CHUNKS: usize = 16;

/// How an all-reduce of `count` elements splits: the first `main` elements (a multiple of the
/// domain size L) take the way through the rails in `k` chunks; the rest, the short way.
/// Derived from the count, the element size and L only, so equal on every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunks {
    /// Elements through the rails (0: all of the message takes the short way).
    pub main: usize,
    /// Chunks: the largest K in `1..=MAX_CHUNKS` with K² x `DEPTH_BYTES` <= the bytes of `main`.
    pub k: usize,
    /// Elements of every chunk but the last (a multiple of L); the last has the rest of `main`.
    pub len: usize,
}

impl Chunks {
    /// The split of an all-reduce of `count` elements of `es` bytes over domains of `l` ranks.
    pub fn of(count: usize, es: usize, l: usize) -> Chunks {
        let main = if count * es <= SMALL_BYTES { 0 } else { count / l * l };
        let bytes = main * es;
        let k = (2..=MAX_CHUNKS).take_while(|k| k * k * DEPTH_BYTES <= bytes).last().unwrap_or(1);
        Chunks { main, k, len: main / l / k * l }
    }

    /// Chunk `i`'s first element and length.
    pub fn chunk(&self, i: usize) -> (usize, usize) {
        let at = i * self.len;
        (at, if i + 1 == self.k { self.main - at } else { self.len })
    }
}

/// The in-place buffer form on a team across domains (see `runtime::collective::run`): `buf`
/// is a buffer of `h` (of its domain team).
pub fn run(
    h: &Across,
    buf: &Buffer,
    rank: i32,
    offset: usize,
    count: usize,
    c: Collective,
    stream: Stream,
) -> Result<()> {
    h.own(rank, "rank")?;
    let p = h.layout.size();
    let (esize, blocks) = geometry(h, c)?;
    if count == 0 {
        return Ok(());
    }
    // The flat form's check, over the whole team's blocks (no alignment: the domain stages take
    // the pointer form).
    let block = domain::check_range(buf, "", offset, count, esize, blocks, 1)? / blocks;
    let base = buf.local_ptr(h.local as i32)? + offset as u64;
    let g = h.rank as u64;
    let (send, recv) = match c {
        Collective::AllGather => (base + g * block as u64, base),
        Collective::ReduceScatter { .. } => (base, base + g * block as u64),
        _ => (base, base),
    };
    debug_assert!(blocks == 1 || blocks == p);
    let sig = signature(c, count as u64, Offsets::InPlace(offset as u64));
    composed(h, send, recv, count, c, stream, sig)
}

/// The `_into` buffer form on a team across domains (see `runtime::collective::run_into`):
/// `send` and `recv` are buffers of `h` (of its domain team).
#[allow(clippy::too_many_arguments)]
pub fn run_into(
    h: &Across,
    send: &Buffer,
    send_offset: usize,
    recv: &Buffer,
    recv_offset: usize,
    rank: i32,
    count: usize,
    c: Collective,
    stream: Stream,
) -> Result<()> {
    if !Arc::ptr_eq(send.team(), recv.team()) {
        return Err(Error::invalid_argument("send and recv are buffers of different teams"));
    }
    h.own(rank, "rank")?;
    let (esize, blocks) = geometry(h, c)?;
    if count == 0 {
        return Ok(());
    }
    let (sb, rb) = match c {
        Collective::AllGather => (1, blocks),
        Collective::ReduceScatter { .. } => (blocks, 1),
        _ => (1, 1),
    };
    // The flat form's checks, as in `run`.
    domain::check_range(send, "send ", send_offset, count, esize, sb, 1)?;
    domain::check_range(recv, "recv ", recv_offset, count, esize, rb, 1)?;
    let s = send.local_ptr(h.local as i32)? + send_offset as u64;
    let r = recv.local_ptr(h.local as i32)? + recv_offset as u64;
    let sig = signature(c, count as u64, Offsets::Into { send: send_offset as u64, recv: recv_offset as u64 });
    composed(h, s, r, count, c, stream, sig)
}

/// The pointer form on a team across domains (see `runtime::collective::run_ptr`).
pub fn run_ptr(
    h: &Across,
    rank: i32,
    send: DevicePtr,
    recv: DevicePtr,
    count: usize,
    c: Collective,
    stream: Stream,
) -> Result<()> {
    h.own(rank, "rank")?;
    let (esize, blocks) = geometry(h, c)?;
    if count == 0 {
        return Ok(());
    }
    let block = bytes_of(count, esize)?;
    let total = bytes_of(block, blocks)?;
    let (sl, rl) = match c {
        Collective::AllGather => (block, total),
        Collective::ReduceScatter { .. } => (total, block),
        _ => (block, block),
    };
    for (what, p, len) in [("send", send, sl), ("recv", recv, rl)] {
        if p == 0 {
            return Err(Error::invalid_argument(format!("{what} is NULL")));
        }
        if p % esize as u64 != 0 {
            return Err(Error::invalid_argument(format!("{what} = {p:#x} is not a multiple of {esize} bytes")));
        }
        if p.checked_add(len as u64).is_none() {
            return Err(Error::invalid_argument(format!("{what} + {len} bytes overflows")));
        }
    }
    composed(h, send, recv, count, c, stream, signature(c, count as u64, Offsets::Free))
}

/// Element size and the number of per-rank blocks of the symmetric range (root checked).
fn geometry(h: &Across, c: Collective) -> Result<(usize, usize)> {
    let p = h.layout.size();
    Ok(match c {
        Collective::Broadcast { root } => {
            if root as usize >= p {
                return Err(Error::invalid_argument(format!("root {root} is out of range: the team has {p} rank(s)")));
            }
            (1, 1)
        }
        Collective::AllGather => (1, p),
        Collective::AllReduce { dtype, .. } => (dtype.size(), 1),
        Collective::ReduceScatter { dtype, .. } => (dtype.size(), p),
    })
}

fn bytes_of(count: usize, size: usize) -> Result<usize> {
    count.checked_mul(size).ok_or_else(|| Error::invalid_argument(format!("count {count} is too large")))
}

/// One rank's composed collective (arguments checked); `sig` the user call's signature, which
/// every domain stage's kernels compare across the domain (see [`Steps::domain`]) and, with the
/// check on, every rank compares across the domains first (`super::agree`: through the engine
/// where the rail calls run stage by stage, over the team's bootstrap where they are
/// stream-ordered).
#[allow(clippy::too_many_arguments)]
fn composed(
    h: &Across,
    send: DevicePtr,
    recv: DevicePtr,
    count: usize,
    c: Collective,
    stream: Stream,
    sig: [u64; 2],
) -> Result<()> {
    h.check_usable(format_args!("rank {}'s collective", h.rank))?;
    let team = &h.team;
    let steps = Steps { team, h, stream, g: h.rank as i32, rail_failed: Cell::new(false), sig };
    let agreed = if !team.check_calls() {
        Ok(())
    } else if steps.blocking() {
        super::agree::across_domains(h, stream, sig, |send, recv, words| {
            steps.rail("signature all-gather", |r| r.all_gather(send, recv, words, DType::U32, stream))
        })
    } else {
        super::agree::over_bootstrap(h, sig)
    };
    let result = agreed.and_then(|()| match c {
        Collective::AllReduce { .. } => steps.all_reduce(send, recv, count, c),
        Collective::ReduceScatter { dtype, .. } => steps.reduce_scatter(send, recv, count, dtype, c),
        Collective::AllGather => steps.all_gather(send, recv, count),
        Collective::Broadcast { root } => steps.broadcast(send, recv, count, root as usize),
    });
    // A stage that failed because a rank aborted (a rail engine's own abort, a rail peer that
    // left) reports the team's abort, which may lie unread on the whole team's connections
    // still, or (a rail engine that says it was aborted: the aborting rank told the whole team
    // first, through the hub) be on its way.
    let heard = |e: &Error| match e.kind {
        ErrorKind::Aborted => h.global.failure_within(team.context().config().timeout_ms),
        _ => h.global.failure_now(),
    };
    let result = result.map_err(|e| match heard(&e) {
        Some((ErrorKind::Aborted, why)) => {
            team.told(ErrorKind::Aborted, &why);
            team.error().unwrap_or(e)
        }
        _ => e,
    });
    result.inspect_err(|e| {
        // A rail engine's failure is every rank's: the team keeps it, and every rank of the
        // whole team is told (their later calls fail with it). Recorded only now, once this
        // rank's domain stages of the collective are issued, so its domain peers never wait
        // for a stage it skipped.
        if steps.rail_failed.get() && e.kind != ErrorKind::Aborted {
            team.set_error(e.clone());
            h.global.failed(e.kind, &e.message);
        }
    })
}

/// The stages of one rank's composed collective.
struct Steps<'a> {
    team: &'a Arc<Team>,
    h: &'a Across,
    stream: Stream,
    /// This rank in the whole team (for messages).
    g: i32,
    /// A rail call failed (the collective's error is then the team's, see `composed`).
    rail_failed: Cell<bool>,
    /// The user call's signature.
    sig: [u64; 2],
}

impl Steps<'_> {
    /// A domain stage: the domain team's pointer form, its kernels comparing the user call's
    /// signature (every rank of the domain issues the same stages for the same call, each its own
    /// shard), so ranks of this domain that disagree are caught at their first stage. Ranks of
    /// different domains meet only on the rails, which do not compare calls: `super::agree`
    /// compares them before the first stage.
    fn domain(&self, send: DevicePtr, recv: DevicePtr, count: usize, c: Collective) -> Result<()> {
        // What ranks of other domains told since the last stage stops this one, as the domain's
        // own failures do.
        self.h.hear();
        crate::runtime::launch::signed_as(self.sig, || {
            domain::run_ptr(self.team, self.h.local as i32, send, recv, count, c, self.stream)
        })
    }

    /// True when the rail calls run stage by stage: the engine is not stream-ordered, or the
    /// driver is the simulator and the engine cannot enqueue on its streams (a stream-ordered
    /// engine's call then runs when called, after the stream's earlier work).
    fn blocking(&self) -> bool {
        !self.h.rails_on_streams(&**self.team.context().driver())
    }

    /// A rail call: after the stream's work when the rail calls run stage by stage. It runs
    /// whatever this rank has heard of the team's failure: a blocking engine's peers would wait
    /// forever for a rail member that skipped its call.
    fn rail(&self, what: &str, f: impl FnOnce(&dyn RailComm) -> Result<()>) -> Result<()> {
        let dev = self.team.devices()[self.h.local];
        if self.blocking() {
            self.team.context().driver().stream_synchronize(dev, self.stream).map_err(|e| {
                Error::driver(e, format_args!("waiting for rank {}'s stream before the rail {what}", self.g))
            })?;
        }
        self.h.with_rail(f).map_err(|e| {
            self.rail_failed.set(true);
            e.context(format!("rank {}'s rail {what}", self.g))
        })
    }

    /// The end of a collective that used the scratch (see the module doc).
    fn done_with_scratch(&self) -> Result<()> {
        if !self.blocking() {
            return Ok(());
        }
        let dev = self.team.devices()[self.h.local];
        self.team
            .context()
            .driver()
            .stream_synchronize(dev, self.stream)
            .map_err(|e| Error::driver(e, format_args!("waiting for rank {}'s stream", self.g)))
    }

    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        let dev = self.team.devices()[self.h.local];
        self.team
            .context()
            .driver()
            .memcpy_dtod_async(dev, dst, src, bytes, self.stream)
            .map_err(|e| Error::driver(e, format_args!("copying {bytes} bytes between domain and rail stages")))
    }

    fn scratch<T>(&self, bytes: usize, f: impl FnOnce(DevicePtr) -> Result<T>) -> Result<T> {
        self.h.with_scratch(self.team.context(), bytes, self.stream, f)
    }

    fn all_reduce(&self, send: DevicePtr, recv: DevicePtr, count: usize, c: Collective) -> Result<()> {
        let Collective::AllReduce { dtype, op } = c else { unreachable!("an all-reduce") };
        let es = dtype.size();
        let l = self.h.layout.domain_size();
        let plan = Chunks::of(count, es, l);
        if plan.main > 0 {
            // A pipe exists only where the rail calls are stream-ordered (see `Hier::connect`).
            self.h.with_pipe(|pipe| self.chunked(&plan, send, recv, c, pipe))?;
        }
        let tail = count - plan.main;
        if tail > 0 {
            let at = (plan.main * es) as u64;
            self.domain(send + at, recv + at, tail, c)?;
            self.rail("all-reduce", |r| r.all_reduce(recv + at, recv + at, tail, dtype, op, self.stream))?;
        }
        Ok(())
    }

    /// The chunks of `plan`, each a domain reduce-scatter, a rail all-reduce of this rank's
    /// shard and a domain all-gather, issued RS(0), RS(1), rail(0), AG(0), RS(2), rail(1),
    /// AG(1), ...: the caller's stream runs RS(k+1) while the rail runs chunk k. With `pipe`,
    /// the rail calls are enqueued on the pipe's stream, ordered by its events (fork at entry,
    /// `reduced[k]` before rail(k), `railed[k]` before AG(k), join at the end: the whole is
    /// ordered on the caller's stream and can be captured in a CUDA graph); without, stage by
    /// stage (see [`Steps::rail`]). Chunk k's regions of `recv` are its own, so no chunk
    /// overwrites another's data still in use.
    fn chunked(
        &self,
        plan: &Chunks,
        send: DevicePtr,
        recv: DevicePtr,
        c: Collective,
        pipe: Option<&Pipe>,
    ) -> Result<()> {
        let Collective::AllReduce { dtype, op } = c else { unreachable!("an all-reduce") };
        let es = dtype.size() as u64;
        let l = self.h.layout.domain_size();
        let dev = self.team.devices()[self.h.local];
        let driver = self.team.context().driver();
        let sync = |what: &str, r: crate::driver::DResult<()>| {
            r.map_err(|e| Error::driver(e, format_args!("rank {}'s pipelined all-reduce: {what}", self.g)))
        };
        let shard = |k: usize| {
            let (at, len) = plan.chunk(k);
            (recv + (at + self.h.local * len / l) as u64 * es, len / l)
        };
        let rs = |k: usize| -> Result<()> {
            let (at, _) = plan.chunk(k);
            let (mine, n) = shard(k);
            self.domain(send + at as u64 * es, mine, n, Collective::ReduceScatter { dtype, op })?;
            if let Some(p) = pipe {
                sync("recording a chunk's reduce-scatter", driver.event_record(dev, p.reduced[k], self.stream))?;
            }
            Ok(())
        };
        // Rail then all-gather of chunk k; the all-gather runs even when the rail failed (the
        // domain peers wait for it), and the rail's error is returned after it.
        let rail_ag = |k: usize| -> Result<()> {
            let (at, _) = plan.chunk(k);
            let (mine, n) = shard(k);
            let railed =
                match pipe {
                    Some(p) => sync(
                        "waiting for a chunk's reduce-scatter",
                        driver.stream_wait_event(dev, p.stream, p.reduced[k]),
                    )
                    .and_then(|()| self.rail("all-reduce", |r| r.all_reduce(mine, mine, n, dtype, op, p.stream)))
                    .and_then(|()| {
                        sync("recording a chunk's rail call", driver.event_record(dev, p.railed[k], p.stream))
                    })
                    .and_then(|()| {
                        sync("waiting for a chunk's rail call", driver.stream_wait_event(dev, self.stream, p.railed[k]))
                    }),
                    None => self.rail("all-reduce", |r| r.all_reduce(mine, mine, n, dtype, op, self.stream)),
                };
            self.domain(mine, recv + at as u64 * es, n * dtype.size(), Collective::AllGather)?;
            railed
        };
        if let Some(p) = pipe {
            sync("recording the fork", driver.event_record(dev, p.fork, self.stream))?;
            sync("forking the rail stream", driver.stream_wait_event(dev, p.stream, p.fork))?;
        }
        let issued = (|| {
            for k in 0..plan.k {
                rs(k)?;
                if k > 0 {
                    rail_ag(k - 1)?;
                }
            }
            rail_ag(plan.k - 1)
        })();
        // The join, whatever happened: the caller's stream never ends before the rail stream's
        // work (a capture must end joined).
        if let Some(p) = pipe {
            sync("recording the join", driver.event_record(dev, p.join, p.stream))?;
            sync("joining the rail stream", driver.stream_wait_event(dev, self.stream, p.join))?;
        }
        issued
    }

    fn reduce_scatter(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DType,
        c: Collective,
    ) -> Result<()> {
        let Collective::ReduceScatter { op, .. } = c else { unreachable!("a reduce-scatter") };
        let layout = &self.h.layout;
        let (n, l) = (layout.domains(), layout.domain_size());
        let block = count * dtype.size();
        let contiguous = layout.contiguous();
        // [N blocks reduced over the domain][the reordered send, when needed]
        let need = n * block + if contiguous { 0 } else { n * l * block };
        self.scratch(need, |s| {
            let reduced = s;
            if contiguous {
                for d in 0..n {
                    let from = send + (d * l * block) as u64;
                    self.domain(from, reduced + (d * block) as u64, count, c)?;
                }
            } else {
                let ordered = s + (n * block) as u64;
                for j in 0..l {
                    for d in 0..n {
                        let g = layout.rank_of(d, j);
                        self.copy(ordered + ((j * n + d) * block) as u64, send + (g * block) as u64, block)?;
                    }
                }
                self.domain(ordered, reduced, n * count, c)?;
            }
            self.rail("reduce-scatter", |r| r.reduce_scatter(reduced, recv, count, dtype, op, self.stream))?;
            self.done_with_scratch()
        })
    }

    fn all_gather(&self, send: DevicePtr, recv: DevicePtr, bytes: usize) -> Result<()> {
        let layout = &self.h.layout;
        let (n, l) = (layout.domains(), layout.domain_size());
        let padded = (l * bytes).next_multiple_of(4);
        self.scratch(padded + n * padded, |s| {
            let gathered = s + (n * padded) as u64;
            self.domain(send, gathered, bytes, Collective::AllGather)?;
            let words = padded / 4;
            if layout.contiguous() && padded == l * bytes {
                self.rail("all-gather", |r| r.all_gather(gathered, recv, words, DType::U32, self.stream))?;
            } else {
                self.rail("all-gather", |r| r.all_gather(gathered, s, words, DType::U32, self.stream))?;
                for d in 0..n {
                    for j in 0..l {
                        let g = layout.rank_of(d, j);
                        self.copy(recv + (g * bytes) as u64, s + (d * padded + j * bytes) as u64, bytes)?;
                    }
                }
            }
            self.done_with_scratch()
        })
    }

    fn broadcast(&self, send: DevicePtr, recv: DevicePtr, bytes: usize, root: usize) -> Result<()> {
        let (d0, l0) = self.h.layout.place[root];
        let padded = bytes.next_multiple_of(4);
        self.scratch(padded, |s| {
            let on_rail = self.h.local == l0;
            let mut railed = Ok(());
            if on_rail {
                if self.h.rank == root {
                    self.copy(s, send, bytes)?;
                }
                railed = self.rail("broadcast", |r| r.broadcast(s, s, padded / 4, DType::U32, d0, self.stream));
            }
            // The domain broadcast runs even when the rail failed (the peers wait for it).
            let from = if on_rail { s } else { recv };
            self.domain(from, recv, bytes, Collective::Broadcast { root: l0 as u32 })?;
            self.done_with_scratch()?;
            railed
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_part_through_the_rails_in_multiples_of_the_domain_size() {
        // Up to SMALL_BYTES: the short way only.
        assert_eq!(Chunks::of(SMALL_BYTES / 4, 4, 2).main, 0);
        // Below 4 x DEPTH_BYTES one chunk, from it two, 3 from 9 x, at most MAX_CHUNKS.
        assert_eq!(Chunks::of(4 * DEPTH_BYTES / 4 - 1, 4, 1).k, 1);
        assert_eq!(Chunks::of(4 * DEPTH_BYTES / 4, 4, 1).k, 2);
        assert_eq!(Chunks::of(9 * DEPTH_BYTES / 2, 2, 1).k, 3);
        assert_eq!(Chunks::of(1 << 33, 2, 4).k, MAX_CHUNKS);
        for (count, es, l) in
            [(20_011, 4, 2), (8_388_611, 4, 2), (9_437_187, 8, 3), (300_000_001, 2, 8), (1 << 30, 4, 5)]
        {
            let c = Chunks::of(count, es, l);
            assert_eq!(c.main, count / l * l, "{count}");
            assert_eq!(c.len % l, 0, "{c:?}");
            assert!((1..=MAX_CHUNKS).contains(&c.k), "{c:?}");
            if c.k > 1 {
                // 2 x DEPTH_BYTES at least (rounded down to L elements).
                assert!(c.len * es + l * es > 2 * DEPTH_BYTES, "{c:?}");
            }
            let mut next = 0;
            for i in 0..c.k {
                let (at, len) = c.chunk(i);
                assert_eq!((at, len % l), (next, 0), "{c:?} chunk {i}");
                assert!(len >= c.len, "{c:?} chunk {i}");
                next += len;
            }
            assert_eq!(next, c.main, "{c:?}");
        }
    }
}
