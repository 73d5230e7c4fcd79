//! Communicators: one rank of an mcast team each, in one mcast context per process.
//!
//! An `ncclComm_t` is the address of an [`Comm`] held in a table of live communicators, so a
//! destroyed or foreign communicator is an error value (`ncclInvalidArgument`), never a dangling
//! pointer. Every communicator is a team made with `mcast_team_init_rank` holding this one rank
//! (also for `ncclCommInitAll`, whose ranks all live in this process): each rank then calls the
//! mcast API for itself, as NCCL's ranks do.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use mcast::capi::buffer::{
    mcast_buffer_alloc, mcast_buffer_free, mcast_buffer_read, mcast_buffer_register, mcast_buffer_t, mcast_buffer_write,
};
use mcast::capi::collective::{
    mcast_all_reduce, mcast_broadcast, mcast_dtype_t, mcast_op_t, mcast_stream_t, mcast_synchronize, McastDtype,
    McastOp,
};
use mcast::capi::team::{mcast_team_abort, mcast_team_destroy, mcast_team_init_rank, mcast_team_t, mcast_unique_id_t};
use mcast::runtime::comm::Comm as RtComm;
use mcast::runtime::team::{Joined, Team};
use parking_lot::Mutex;

use crate::domains;
use crate::fallback;
use crate::process::{self, ContextRef};
use crate::types::{self, check, ncclResult_t, ncclUniqueId, Failure, Outcome};

/// What a communicator holds once its team exists.
pub struct Ready {
    /// The mcast team (this process holds one rank of it).
    pub team: mcast_team_t,
    /// The fallback NCCL communicator, when `MCAST_NCCL_FALLBACK` is set (and, with
    /// `MCAST_NCCL_HIER=on`, every rank could make it).
    pub fallback: Option<usize>,
    /// Why there is none although the fallback NCCL is set: with `MCAST_NCCL_HIER=on` the flat
    /// fallback communicator over all ranks is optional (a real NCCL refuses it with two ranks
    /// on one GPU), and the calls that need it fail with this message.
    pub no_fallback: Option<String>,
}

/// A buffer registered with `ncclCommRegister`, bound to the team.
pub struct Registration {
    /// Start of the caller's memory.
    pub ptr: usize,
    /// Its length.
    pub bytes: usize,
    /// The mcast buffer over it.
    pub buffer: mcast_buffer_t,
}

/// One rank of a team.
pub struct Comm {
    /// This rank.
    pub rank: c_int,
    /// Ranks in the team.
    pub nranks: c_int,
    /// The device of this rank.
    pub device: c_int,
    /// The process context.
    pub ctx: ContextRef,
    /// Set once creation finished (at once for blocking communicators, later for
    /// non-blocking ones).
    ready: OnceLock<Result<Ready, Failure>>,
    /// Whether the communicator was created non-blocking.
    pub nonblocking: bool,
    /// Streams the communicator's collectives ran on, synchronized by finalize and destroy.
    streams: Mutex<Vec<usize>>,
    /// Registrations made with `ncclCommRegister`, by handle.
    pub registrations: Mutex<HashMap<usize, Registration>>,
    /// Collectives served by mcast.
    pub served: AtomicU64,
    /// Calls forwarded to the fallback NCCL.
    pub forwarded: AtomicU64,
    /// Set by `ncclCommAbort`.
    pub aborted: AtomicBool,
    /// Set once `ncclCommGetAsyncError` logged the team's error (at `warn`, once).
    pub async_logged: AtomicBool,
    released: AtomicBool,
}

static COMMS: Mutex<Option<HashMap<usize, Arc<Comm>>>> = Mutex::new(None);

impl Comm {
    /// A communicator whose team is being made.
    pub fn new(ctx: ContextRef, rank: c_int, nranks: c_int, device: c_int, nonblocking: bool) -> Arc<Comm> {
        Arc::new(Comm {
            rank,
            nranks,
            device,
            ctx,
            ready: OnceLock::new(),
            nonblocking,
            streams: Mutex::new(Vec::new()),
            registrations: Mutex::new(HashMap::new()),
            served: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            aborted: AtomicBool::new(false),
            async_logged: AtomicBool::new(false),
            released: AtomicBool::new(false),
        })
    }

    /// Makes the team (and the fallback communicator) and records the outcome.
    pub fn finish_init(&self, id: &ncclUniqueId) -> Outcome {
        let outcome = self.make_team(id);
        let result = match &outcome {
            Ok(r) => Ok(Ready { team: r.team, fallback: r.fallback, no_fallback: r.no_fallback.clone() }),
            Err(f) => Err(f.clone()),
        };
        if self.ready.set(result).is_err() {
            return Err(Failure::new(types::INTERNAL_ERROR, "a communicator was initialised twice"));
        }
        outcome.map(drop)
    }

    fn make_team(&self, id: &ncclUniqueId) -> Outcome<Ready> {
        // Ranks in several NVLink domains: see `domains`.
        let hier = domains::hierarchical()?;
        let team = if hier {
            domains::use_fallback_between_domains(&self.ctx)?;
            let mut mid = mcast_unique_id_t { internal: [0; 128] };
            mid.internal.copy_from_slice(&id.internal);
            let mut team = mcast_team_t { id: 0 };
            // SAFETY: a valid out-pointer.
            check(
                unsafe { mcast_team_init_rank(self.ctx.ctx, mid, self.nranks, self.rank, self.device, &mut team) },
                &format!("rank {} of {}: creating the team on device {}", self.rank, self.nranks, self.device),
            )?;
            team
        } else {
            match (self.join(id)?, fallback::library()) {
                (Ok(team), _) => team,
                (Err((comm, refusal)), Some(Ok(lib))) => {
                    let whole = (self.rank, self.nranks, self.device);
                    let fc = domains::whole_fallback(lib, &comm, &refusal, &self.ctx, whole)?;
                    return Ok(Ready { team: mcast_team_t { id: 0 }, fallback: Some(fc), no_fallback: None });
                }
                (Err((_, refusal)), _) => {
                    let what =
                        format!("rank {} of {}: creating the team on device {}", self.rank, self.nranks, self.device);
                    return Err(domains::refused(&what, &refusal));
                }
            }
        };
        let (fallback, no_fallback) = match fallback::library() {
            None => (None, None),
            Some(Err(e)) => {
                tracing::warn!("mcast_nccl: {e}; calls mcast does not serve will fail with ncclInvalidUsage");
                (None, None)
            }
            // Served hierarchically, the team needs no flat communicator: without one (every rank
            // agreed) only the calls mcast does not serve fail.
            Some(Ok(lib)) => match self.fallback_comm(lib, team, hier) {
                Ok(Ok(c)) => (Some(c), None),
                Ok(Err(f)) if hier => {
                    let why = format!("the flat fallback communicator could not be made: {}", f.message);
                    tracing::warn!(
                        "mcast_nccl: rank {} of {}: {why}; the communicator is served without it ({}=on), and \
                         calls mcast does not serve will fail with ncclInvalidUsage",
                        self.rank,
                        self.nranks,
                        domains::HIER_ENV
                    );
                    (None, Some(why))
                }
                Ok(Err(e)) | Err(e) => {
                    let _ = mcast_team_destroy(team);
                    return Err(e);
                }
            },
        };
        Ok(Ready { team, fallback, no_fallback })
    }

    /// Joins the team through the runtime (`Team::join_rank`): the team's handle, or, when the
    /// ranks span several NVLink domains, the formed connections and the refusal.
    #[allow(clippy::type_complexity)]
    fn join(&self, id: &ncclUniqueId) -> Outcome<Result<mcast_team_t, (Arc<RtComm>, String)>> {
        let what = format!("rank {} of {}: creating the team on device {}", self.rank, self.nranks, self.device);
        let fail = |e: mcast::runtime::Error| {
            Failure::new(types::result_of(mcast::capi::status_of(e.kind)), format!("{what}: {}", e.message))
        };
        let ctx = mcast::runtime::handles::context(self.ctx.ctx.id).map_err(fail)?;
        let bytes: [u8; 128] = id.internal.map(|b| b as u8);
        match Team::join_rank(&ctx, &bytes, self.nranks, self.rank, self.device).map_err(fail)? {
            Joined::Team(team) => Ok(Ok(mcast_team_t { id: mcast::runtime::handles::insert_team(team) })),
            Joined::AcrossDomains { comm, refusal, .. } => Ok(Err((comm, refusal.message))),
        }
    }

    /// True when the communicator runs whole on the fallback NCCL (it spans several NVLink
    /// domains): every call is forwarded.
    pub fn whole_fallback_comm(&self) -> bool {
        matches!(self.ready.get(), Some(Ok(r)) if r.team.id == 0)
    }

    /// Creates the fallback NCCL communicator beside `team`: rank 0 makes its unique id and
    /// the team broadcasts it (an mcast broadcast of its 128 bytes and whether rank 0 has one).
    ///
    /// The outer error is the team's (an mcast collective failed); the inner one says why this
    /// rank has no fallback communicator. With `agree` (the team is served hierarchically, and
    /// the communicator may come up without it) the ranks agree twice over the team: whether
    /// every rank can call `ncclCommInitRank` (or none does), and whether every rank's call
    /// succeeded; if one failed, the ranks that made theirs destroy it, so every rank has one
    /// or none has.
    fn fallback_comm(&self, lib: &fallback::Nccl, team: mcast_team_t, agree: bool) -> Outcome<Outcome<usize>> {
        type GetId = unsafe extern "C" fn(*mut ncclUniqueId) -> ncclResult_t;
        type InitRank = unsafe extern "C" fn(*mut *mut c_void, c_int, ncclUniqueId, c_int) -> ncclResult_t;
        // What this rank needs; a failure skips its own steps, never the team's collectives.
        let prepare = || -> Outcome<(GetId, InitRank)> {
            let unusable = |e: String| Failure::new(types::INVALID_USAGE, e);
            // SAFETY: the types are NCCL's documented signatures.
            let get_id: GetId = unsafe { lib.function("ncclGetUniqueId") }.map_err(unusable)?;
            // SAFETY: as above.
            let init: InitRank = unsafe { lib.function("ncclCommInitRank") }.map_err(unusable)?;
            if !self.ctx.sim {
                // NCCL uses the calling thread's current device.
                if let Ok(c) = mcast::runtime::handles::context(self.ctx.ctx.id) {
                    c.driver()
                        .bind_thread(self.device)
                        .map_err(|e| Failure::new(types::UNHANDLED_CUDA_ERROR, e.to_string()))?;
                }
            }
            Ok((get_id, init))
        };
        let mut local = prepare();
        let mut fid = ncclUniqueId { internal: [0; types::UNIQUE_ID_BYTES] };
        if self.rank == 0 {
            if let Ok((get_id, _)) = local {
                // SAFETY: a valid out-pointer.
                let r = unsafe { get_id(&mut fid) };
                if r != types::SUCCESS {
                    let detail = fallback::last_error(lib);
                    local = Err(Failure::new(r, format!("the fallback NCCL's ncclGetUniqueId failed: {detail}")));
                }
            }
        }
        let root_has_id = self.broadcast_id(team, &mut fid, local.is_ok())?;
        if !root_has_id && local.is_ok() {
            local = Err(Failure::new(types::INVALID_USAGE, "rank 0 could not make the fallback NCCL's unique id"));
        }
        if agree {
            let first = self.first_failed(team, local.is_ok())?;
            if let (Some(r), true) = (first, local.is_ok()) {
                local = Err(Failure::new(
                    types::INVALID_USAGE,
                    format!("rank {r} could not take part in the fallback NCCL's ncclCommInitRank"),
                ));
            }
        }
        let made = local.and_then(|(_, init)| {
            let mut comm: *mut c_void = std::ptr::null_mut();
            // SAFETY: a valid out-pointer; the id came from the fallback's rank 0.
            let r = unsafe { init(&mut comm, self.nranks, fid, self.rank) };
            if r != types::SUCCESS {
                let detail = fallback::last_error(lib);
                return Err(Failure::new(
                    r,
                    format!("rank {}: the fallback NCCL's ncclCommInitRank failed: {detail}", self.rank),
                ));
            }
            fallback::track(comm as usize);
            Ok(comm as usize)
        });
        if !agree {
            return Ok(made);
        }
        match (self.first_failed(team, made.is_ok())?, made) {
            (None, made) => Ok(made),
            (Some(_), Err(f)) => Ok(Err(f)),
            (Some(r), Ok(fc)) => {
                if let Err(e) = fallback::destroy(lib, fc, false) {
                    tracing::warn!("mcast_nccl: rank {}: the unused flat communicator: {}", self.rank, e.message);
                }
                Ok(Err(Failure::new(
                    types::INVALID_USAGE,
                    format!("rank {r}'s ncclCommInitRank failed (its log says why), so no rank keeps one"),
                )))
            }
        }
    }

    /// Rank 0's `id` to every rank, through an mcast buffer of the team, with whether rank 0
    /// has one (`root_has_id`, rank 0's argument): the result.
    fn broadcast_id(&self, team: mcast_team_t, id: &mut ncclUniqueId, root_has_id: bool) -> Outcome<bool> {
        let n = types::UNIQUE_ID_BYTES;
        let mut bytes = vec![0u8; n + 1];
        for (d, s) in bytes.iter_mut().zip(id.internal.iter()) {
            *d = *s as u8;
        }
        bytes[n] = u8::from(root_has_id);
        let mut buf = mcast_buffer_t { id: 0 };
        // SAFETY: a valid out-pointer.
        check(unsafe { mcast_buffer_alloc(team, n + 1, &mut buf) }, "allocating the id exchange buffer")?;
        let stream: mcast_stream_t = std::ptr::null_mut();
        let mut steps = || -> Outcome {
            if self.rank == 0 {
                // SAFETY: `bytes` holds n + 1 readable bytes.
                check(unsafe { mcast_buffer_write(buf, 0, 0, bytes.as_ptr().cast(), n + 1) }, "writing the id")?;
            }
            check(mcast_broadcast(buf, self.rank, 0, 0, n + 1, stream), "broadcasting the fallback id")?;
            check(mcast_synchronize(team, self.rank, stream), "broadcasting the fallback id")?;
            // SAFETY: `bytes` holds n + 1 writable bytes.
            check(unsafe { mcast_buffer_read(buf, self.rank, 0, bytes.as_mut_ptr().cast(), n + 1) }, "reading the id")
        };
        let outcome = steps();
        let freed = check(mcast_buffer_free(buf), "freeing the id exchange buffer");
        outcome.and(freed)?;
        for (d, s) in id.internal.iter_mut().zip(&bytes) {
            *d = *s as _;
        }
        Ok(bytes[n] != 0)
    }

    /// The lowest rank of the team whose `ok` is false, or `None` when every rank's is true: a
    /// min all-reduce over the team of `rank` or `i32::MAX`.
    fn first_failed(&self, team: mcast_team_t, ok: bool) -> Outcome<Option<c_int>> {
        let mut value: i32 = if ok { i32::MAX } else { self.rank };
        let size = std::mem::size_of::<i32>();
        let mut buf = mcast_buffer_t { id: 0 };
        // SAFETY: a valid out-pointer.
        check(unsafe { mcast_buffer_alloc(team, size, &mut buf) }, "allocating the agreement buffer")?;
        let stream: mcast_stream_t = std::ptr::null_mut();
        let what = "agreeing on the fallback NCCL communicator";
        let mut steps = || -> Outcome {
            let p: *mut i32 = &mut value;
            // SAFETY: `value` holds `size` readable bytes.
            check(unsafe { mcast_buffer_write(buf, self.rank, 0, p.cast_const().cast(), size) }, what)?;
            let (dtype, op) = (mcast_dtype_t(McastDtype::MCAST_INT32 as u32), mcast_op_t(McastOp::MCAST_MIN as u32));
            check(mcast_all_reduce(buf, self.rank, 0, 1, dtype, op, stream), what)?;
            check(mcast_synchronize(team, self.rank, stream), what)?;
            // SAFETY: `value` holds `size` writable bytes.
            check(unsafe { mcast_buffer_read(buf, self.rank, 0, p.cast(), size) }, what)
        };
        let outcome = steps();
        let freed = check(mcast_buffer_free(buf), "freeing the agreement buffer");
        outcome.and(freed)?;
        Ok((value != i32::MAX).then_some(value))
    }

    /// Takes `team` (made by a split), `fallback` and why there is none (`no_fallback`, the
    /// parent's) as this communicator's.
    pub fn adopt(&self, team: mcast_team_t, fallback: Option<usize>, no_fallback: Option<String>) {
        let _ = self.ready.set(Ok(Ready { team, fallback, no_fallback }));
    }

    /// The team, once creation succeeded.
    pub fn ready(&self) -> Outcome<&Ready> {
        match self.ready.get() {
            None => Err(Failure::new(
                types::INVALID_USAGE,
                "the communicator is still being created (non-blocking): poll ncclCommGetAsyncError until it \
                 returns ncclSuccess",
            )),
            Some(Err(f)) => Err(Failure::new(f.code, format!("the communicator's creation failed: {}", f.message))),
            Some(Ok(r)) => Ok(r),
        }
    }

    /// `ncclInProgress` while being created, the creation's failure, or success.
    pub fn init_state(&self) -> ncclResult_t {
        match self.ready.get() {
            None => types::IN_PROGRESS,
            Some(Err(f)) => f.code,
            Some(Ok(_)) => types::SUCCESS,
        }
    }

    /// Remembers `stream` for finalize and destroy.
    pub fn used_stream(&self, stream: mcast_stream_t) {
        let s = stream as usize;
        let mut v = self.streams.lock();
        if !v.contains(&s) {
            v.push(s);
        }
    }

    /// Waits for the work of this rank on every stream it used.
    pub fn finalize(&self) -> Outcome {
        let Ok(ready) = self.ready() else { return Ok(()) };
        let streams: Vec<usize> = self.streams.lock().clone();
        for s in streams {
            check(mcast_synchronize(ready.team, self.rank, s as mcast_stream_t), "ncclCommFinalize")?;
        }
        Ok(())
    }

    /// Releases the registrations, the fallback communicator and the team (once).
    pub fn release(&self, abort: bool) -> Outcome {
        if self.released.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let mut first: Outcome = Ok(());
        if let Some(Ok(ready)) = self.ready.get() {
            if abort {
                self.aborted.store(true, Ordering::SeqCst);
                let _ = mcast_team_abort(ready.team);
            }
            for (_, reg) in self.registrations.lock().drain() {
                let r = check(mcast_buffer_free(reg.buffer), "releasing a registration");
                first = first.and(r);
            }
            if let (Some(fc), Some(Ok(lib))) = (ready.fallback, fallback::library()) {
                first = first.and(fallback::destroy(lib, fc, abort));
            }
            let r = check(mcast_team_destroy(ready.team), "destroying the team");
            first = first.and(r);
        }
        let (served, forwarded) = (self.served.load(Ordering::Relaxed), self.forwarded.load(Ordering::Relaxed));
        tracing::info!(
            "mcast_nccl: rank {} of {} on device {}: {served} collective(s) served by mcast, {forwarded} call(s) \
             forwarded to the fallback NCCL",
            self.rank,
            self.nranks,
            self.device
        );
        process::release_context();
        first
    }

    /// Registers `[ptr, ptr + bytes)` with the team (collective over the team's ranks).
    pub fn register(&self, ptr: usize, bytes: usize) -> Outcome<usize> {
        let ready = self.ready()?;
        if ready.team.id == 0 {
            return Err(Failure::new(
                types::INVALID_USAGE,
                "registration on a communicator that runs whole on the fallback NCCL (it spans several NVLink \
                 domains) is not served yet; its collectives work on unregistered memory",
            ));
        }
        let mut buffer = mcast_buffer_t { id: 0 };
        let ptrs = [ptr as *mut c_void];
        // SAFETY: one pointer for the one rank this process holds; a valid out-pointer.
        check(unsafe { mcast_buffer_register(ready.team, ptrs.as_ptr(), bytes, &mut buffer) }, "ncclCommRegister")?;
        let handle = Box::into_raw(Box::new(0u8)) as usize;
        self.registrations.lock().insert(handle, Registration { ptr, bytes, buffer });
        Ok(handle)
    }

    /// Releases a registration made by [`Comm::register`].
    pub fn deregister(&self, handle: usize) -> Outcome {
        let reg = self.registrations.lock().remove(&handle).ok_or_else(|| {
            Failure::new(
                types::INVALID_ARGUMENT,
                format!("handle {handle:#x} is not a registration of this communicator"),
            )
        })?;
        // SAFETY: made by Box::into_raw in register, removed from the table once.
        drop(unsafe { Box::from_raw(handle as *mut u8) });
        check(mcast_buffer_free(reg.buffer), "ncclCommDeregister")
    }
}

/// Adds `comm` to the live table; returns its `ncclComm_t` value.
pub fn publish(comm: Arc<Comm>) -> usize {
    let key = Arc::as_ptr(&comm) as usize;
    COMMS.lock().get_or_insert_with(HashMap::new).insert(key, comm);
    key
}

/// The live communicator behind `ptr`.
pub fn lookup(ptr: *const c_void) -> Outcome<Arc<Comm>> {
    if ptr.is_null() {
        return Err(Failure::new(types::INVALID_ARGUMENT, "comm is NULL"));
    }
    COMMS.lock().as_ref().and_then(|m| m.get(&(ptr as usize)).cloned()).ok_or_else(|| {
        Failure::new(
            types::INVALID_ARGUMENT,
            format!("comm {ptr:p} is not a live communicator (destroyed, aborted, or not made by this library)"),
        )
    })
}

/// Removes `ptr` from the live table; returns the communicator.
pub fn unpublish(ptr: *const c_void) -> Outcome<Arc<Comm>> {
    let comm = lookup(ptr)?;
    COMMS.lock().as_mut().and_then(|m| m.remove(&(ptr as usize)));
    Ok(comm)
}
