//! A team's memory: buffers carved from its segments (new segments made and the cache trimmed
//! as needed), registered memory, free, and the release of everything at destroy.

use std::sync::Arc;

use super::pool::{Allocation, Pool};
use super::{Team, BUFFER_ALIGN};
use crate::driver::{Device, DevicePtr};
use crate::runtime::env::{Leftover, Member};
use crate::runtime::error::{Error, Result};
use crate::runtime::segment::{External, Segment};

impl Team {
    /// Sets aside `bytes` on every rank.
    pub fn alloc(&self, bytes: usize) -> Result<Allocation> {
        if bytes == 0 {
            return Err(Error::invalid_argument("bytes is 0: a buffer needs at least one byte"));
        }
        let reserved = bytes
            .checked_next_multiple_of(BUFFER_ALIGN)
            .filter(|r| r.checked_next_multiple_of(self.granularity).is_some())
            .ok_or_else(|| Error::invalid_argument(format!("bytes = {bytes} is too large")))?;
        self.check_not_aborted("allocating a buffer")?;
        let mut st = self.state.write();
        if st.destroyed {
            return Err(Error::invalid_handle("the team was destroyed"));
        }
        if let Some(a) = st.carve(bytes, reserved) {
            return Ok(a);
        }
        if st.reuse_cached(reserved) {
            return Ok(st.carve(bytes, reserved).expect("a fresh segment fits"));
        }
        let size = reserved.checked_next_multiple_of(self.granularity).expect("checked above");
        let mut spare = st.take_cache();
        let env = &self.env;
        let mut trim = || {
            let freed: usize = spare.iter().map(|s| s.size).sum();
            for s in spare.drain(..) {
                for e in s.teardown(env) {
                    tracing::error!("trimming the segment cache: {e}");
                }
                if !s.is_released() {
                    env.park(s);
                }
            }
            freed as u64
        };
        let created = Segment::create(env, &self.shape, size, &mut trim);
        st.restore_cache(spare);
        let seg = created
            .map_err(|e| e.context(format!("allocating a buffer of {bytes} bytes on devices {:?}", self.devices)))?;
        st.add(Arc::new(seg), 0);
        Ok(st.carve(bytes, reserved).expect("a fresh segment fits"))
    }

    /// Makes a buffer of memory the application owns (see [`Segment::register`]): a segment of
    /// its own, released when the buffer is freed. Single-process teams.
    pub fn register(&self, ext: Vec<External>, bytes: usize, size: usize, mc_size: usize) -> Result<Allocation> {
        let mut st = self.state.write();
        if st.destroyed {
            for e in ext {
                let _ = self.env.driver().mem_release(e.handle);
            }
            return Err(Error::invalid_handle("the team was destroyed"));
        }
        let env = &self.env;
        let mut trim = || env.trim_caches();
        let seg = Segment::register(env, &self.shape, ext, size, mc_size, &mut trim)?;
        Ok(st.add_registered(Arc::new(seg), bytes))
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
        let mut st = self.state.write();
        let live = if st.destroyed { Err(Error::invalid_handle("the team was destroyed")) } else { Ok(()) };
        if let Err(e) = comm.vote("registration: team state", live) {
            if let Err(u) = self.env.driver().mem_release(own.handle) {
                tracing::error!("mcast_buffer_register: releasing a retained handle: {u}");
            }
            return Err(e);
        }
        let env = &self.env;
        let mut trim = || env.trim_caches();
        let seg = Segment::register_mp(env, &self.shape, comm, own, skews, ptrs, size, mc_size, &mut trim)?;
        Ok(st.add_registered(Arc::new(seg), bytes))
    }

    /// The registered buffer of this team holding `[ptr, ptr + len)` of rank `rank`'s own
    /// memory, as an allocation, with the offset of `ptr` in it.
    pub fn find_registered(&self, rank: usize, ptr: DevicePtr, len: usize) -> Option<(Allocation, usize)> {
        self.state.read().find_registered(rank, ptr, len)
    }

    /// Returns a buffer's range. An empty segment other than the first goes to the cache or is
    /// released.
    pub fn free(&self, a: &Allocation) -> Result<()> {
        let mut st = self.state.write();
        match st.give_back(a)? {
            Some((seg, what)) => match self.release_segment(seg).into_iter().next() {
                Some(e) => Err(e.context(what)),
                None => Ok(()),
            },
            None => Ok(()),
        }
    }

    /// Releases every cached empty segment; returns the bytes per rank freed. Skips a team
    /// that is busy (its own allocation trims its cache itself).
    pub fn trim_cache(&self) -> u64 {
        let Some(mut st) = self.state.try_write() else { return 0 };
        let mut freed = 0u64;
        for s in st.take_cache() {
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
        if self.state.write().destroyed {
            return Err(Error::invalid_handle("the team was destroyed (by another call)"));
        }
        // What the host knows (no driver call: a device timeout nobody synchronized on is
        // found by mcast_team_get_error, which makes it known here).
        let failed = self.error().is_some() || self.comm.as_ref().and_then(|c| c.aborted()).is_some();
        // An aborted team goes with its buffers (they can no longer be freed one by one); a
        // timed-out one frees them first, as a healthy one.
        let aborted = self.is_aborted();
        // A team that keeps its buffers is refused before anything is done to it: stopping the
        // device waits of a team that stays alive would fail its later collectives as aborted.
        if !aborted && self.live_buffers() > 0 {
            return Err(Error::in_use(format!(
                "the team still has {} live buffer(s); free them with mcast_buffer_free first",
                self.live_buffers()
            )));
        }
        let waited = if failed {
            self.stop_device_waits(false);
            self.quiesce()
        } else if self.live_buffers() == 0 {
            self.quiesce()
        } else {
            Ok(())
        };
        let errors = {
            let mut st = self.state.write();
            if st.buffers > 0 && !aborted {
                return Err(Error::in_use(format!(
                    "the team still has {} live buffer(s); free them with mcast_buffer_free first",
                    st.buffers
                )));
            }
            self.release_locked(&mut st)
        };
        self.env.leave(&**self);
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
        self.release_locked(&mut self.state.write())
    }

    fn release_locked(&self, st: &mut Pool) -> Vec<Error> {
        *self.sync_live.write() = false;
        let segments = st.drain();
        let mut errors: Vec<Error> = Vec::new();
        let mut all_released = true;
        for seg in segments {
            errors.extend(self.release_segment(seg.clone()));
            all_released &= seg.is_released();
        }
        // The doorbell goes once nothing of the team can still ring it: with its memory. A
        // segment that could not be released (its device may still run the team's kernels)
        // keeps the doorbell for the context's retry.
        let bell = self.doorbell.clone();
        if all_released {
            let failed = bell.release(&self.env);
            if !failed.is_empty() {
                self.env.park(bell);
            }
            errors.extend(failed);
        } else {
            self.env.park(bell);
        }
        errors
    }

    /// Tears `seg` down; what a failing step kept is handed to the context, which retries it
    /// when it is destroyed.
    fn release_segment(&self, seg: Arc<Segment>) -> Vec<Error> {
        let errors = seg.teardown(&self.env);
        if !seg.is_released() {
            self.env.park(seg);
        }
        errors
    }
}

/// What the context asks of its teams: trim caches when memory runs out, count and, at
/// shutdown, release what is left.
impl Member for Team {
    fn trim_cache(&self) -> u64 {
        Team::trim_cache(self)
    }

    fn live_buffers(&self) -> usize {
        Team::live_buffers(self)
    }

    fn size(&self) -> usize {
        Team::size(self)
    }

    fn devices(&self) -> &[Device] {
        Team::devices(self)
    }

    fn release_all(&self) -> Vec<Error> {
        Team::release_all(self)
    }
}
