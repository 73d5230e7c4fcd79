//! Communicators: one rank of an mcast team each, in one mcast context per process.
//!
//! An `ncclComm_t` is the address of an [`Comm`] held in a table of live communicators, so a
//! destroyed or foreign communicator is an error value (`ncclInvalidArgument`), never a dangling
//! pointer. Every communicator is a team made with `mcast_team_init_rank` holding this one rank
//! (also for `ncclCommInitAll`, whose ranks all live in this process): each rank then calls the
//! mcast API for itself, as NCCL's ranks do.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use mcast::capi::buffer::{
    mcast_buffer_alloc, mcast_buffer_free, mcast_buffer_read, mcast_buffer_register, mcast_buffer_t, mcast_buffer_write,
};
use mcast::capi::collective::{
    mcast_all_reduce, mcast_broadcast, mcast_dtype_t, mcast_op_t, mcast_stream_t, mcast_synchronize, McastDtype,
    McastOp,
};
use mcast::capi::config::{mcast_config_init, mcast_config_t};
use mcast::capi::context::{mcast_context_create, mcast_context_destroy, mcast_context_t};
use mcast::capi::mcast_status_t;
use mcast::capi::status::mcast_last_error;
use mcast::capi::team::{mcast_team_abort, mcast_team_destroy, mcast_team_init_rank, mcast_team_t, mcast_unique_id_t};
use mcast::runtime::comm::Comm as RtComm;
use mcast::runtime::team::{Joined, Team};
use parking_lot::Mutex;

use crate::domains;
use crate::fallback;
use crate::types::{self, ncclResult_t, ncclUniqueId};

/// A failed call: the result and the message `ncclGetLastError` shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The result returned.
    pub code: ncclResult_t,
    /// What went wrong and what to do.
    pub message: String,
}

impl Failure {
    /// A failure with `code`.
    pub fn new(code: ncclResult_t, message: impl Into<String>) -> Failure {
        Failure { code, message: message.into() }
    }
}

/// What a call returns internally.
pub type Outcome<T = ()> = Result<T, Failure>;

/// Turns an mcast status into an outcome, with `mcast_last_error` as the message.
pub fn check(status: mcast_status_t, what: &str) -> Outcome {
    if status.0 == 0 {
        return Ok(());
    }
    // SAFETY: mcast_last_error never returns NULL; the text is NUL-terminated.
    let detail = unsafe { CStr::from_ptr(mcast_last_error()) }.to_string_lossy().into_owned();
    let message = if detail.starts_with(what) { detail } else { format!("{what}: {detail}") };
    Err(Failure::new(types::result_of(status), message))
}

/// The process's mcast context, shared by every communicator and every `ncclMemAlloc`
/// allocation, destroyed when the last of them goes.
struct Process {
    ctx: mcast_context_t,
    users: usize,
    sim: bool,
    devices: c_int,
}

static PROCESS: Mutex<Option<Process>> = Mutex::new(None);

/// What a user of the process context learns.
#[derive(Clone, Copy, Debug)]
pub struct ContextRef {
    /// The context.
    pub ctx: mcast_context_t,
    /// Whether it runs on the simulator.
    pub sim: bool,
    /// Its devices.
    pub devices: c_int,
}

/// Takes a reference to the process context, creating it (from the `MCAST_*` environment) on
/// first use.
pub fn acquire_context() -> Outcome<ContextRef> {
    let mut p = PROCESS.lock();
    if p.is_none() {
        let mut config = std::mem::MaybeUninit::<mcast_config_t>::zeroed();
        // SAFETY: a valid pointer to a config to fill.
        unsafe { mcast_config_init(config.as_mut_ptr()) };
        // SAFETY: filled above.
        let config = unsafe { config.assume_init() };
        let mut ctx = mcast_context_t { id: 0 };
        // SAFETY: valid pointers.
        check(unsafe { mcast_context_create(&config, &mut ctx) }, "creating the mcast context")?;
        let (sim, devices) = match mcast::runtime::handles::context(ctx.id) {
            Ok(c) => (c.driver().backend_name() == "sim", c.device_count() as c_int),
            Err(e) => {
                mcast_context_destroy(ctx);
                return Err(Failure::new(types::INTERNAL_ERROR, e.message));
            }
        };
        *p = Some(Process { ctx, users: 0, sim, devices });
    }
    let proc = p.as_mut().expect("made above");
    proc.users += 1;
    Ok(ContextRef { ctx: proc.ctx, sim: proc.sim, devices: proc.devices })
}

/// Drops a reference taken with [`acquire_context`]; the last one destroys the context.
pub fn release_context() {
    let mut p = PROCESS.lock();
    let last = match p.as_mut() {
        Some(proc) => {
            proc.users = proc.users.saturating_sub(1);
            proc.users == 0
        }
        None => false,
    };
    if last {
        let proc = p.take().expect("checked");
        let st = mcast_context_destroy(proc.ctx);
        if st.0 != 0 {
            tracing::warn!("mcast_nccl: destroying the mcast context: status {}", st.0);
        }
    }
}

/// The device a new rank uses: the calling thread's current CUDA device; on the simulator
/// `MCAST_SIM_DEVICE` if set, else `rank` modulo the simulated devices.
pub fn current_device(ctx: &ContextRef, rank: c_int) -> Outcome<c_int> {
    if ctx.sim {
        if let Some(v) = std::env::var("MCAST_SIM_DEVICE").ok().filter(|v| !v.is_empty()) {
            return v.trim().parse::<c_int>().map_err(|_| {
                Failure::new(types::INVALID_ARGUMENT, format!("MCAST_SIM_DEVICE={v:?} is not a device number"))
            });
        }
        return Ok(rank.rem_euclid(ctx.devices.max(1)));
    }
    cuda_current_device()
}

/// `cuCtxGetDevice` of the calling thread, looked up in the libcuda mcast already loaded.
fn cuda_current_device() -> Outcome<c_int> {
    type GetDevice = unsafe extern "C" fn(*mut c_int) -> c_int;
    static SYMBOL: OnceLock<Option<GetDevice>> = OnceLock::new();
    let f = SYMBOL.get_or_init(|| {
        // SAFETY: a NUL-terminated name; RTLD_NOLOAD only finds an already loaded library.
        let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if lib.is_null() {
            return None;
        }
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(lib, c"cuCtxGetDevice".as_ptr()) };
        // SAFETY: cuCtxGetDevice has this signature (CUresult (*)(CUdevice *)).
        (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, GetDevice>(p) })
    });
    let Some(f) = f else {
        return Err(Failure::new(types::UNHANDLED_CUDA_ERROR, "cuCtxGetDevice is not available in libcuda.so.1"));
    };
    let mut dev: c_int = 0;
    // SAFETY: a valid out-pointer.
    match unsafe { f(&mut dev) } {
        0 => Ok(dev),
        // CUDA_ERROR_INVALID_CONTEXT: no current context yet: the runtime's default device.
        201 => Ok(0),
        code => Err(Failure::new(types::UNHANDLED_CUDA_ERROR, format!("cuCtxGetDevice failed with CUresult {code}"))),
    }
}

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
                (Err((comm, refusal)), Some(Ok(lib))) => return self.whole_fallback(lib, &comm, &refusal),
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
            Joined::AcrossDomains { comm, refusal } => Ok(Err((comm, refusal.message))),
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
                    let detail = fallback_last_error(lib);
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
                let detail = fallback_last_error(lib);
                return Err(Failure::new(
                    r,
                    format!("rank {}: the fallback NCCL's ncclCommInitRank failed: {detail}", self.rank),
                ));
            }
            track_fallback(comm as usize);
            Ok(comm as usize)
        });
        if !agree {
            return Ok(made);
        }
        match (self.first_failed(team, made.is_ok())?, made) {
            (None, made) => Ok(made),
            (Some(_), Err(f)) => Ok(Err(f)),
            (Some(r), Ok(fc)) => {
                if let Err(e) = destroy_fallback(lib, fc, false) {
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
                first = first.and(destroy_fallback(lib, fc, abort));
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
        release_context();
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

/// Communicators of the fallback NCCL made by this library (beside a team, or by a split).
static FALLBACK_COMMS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

/// Destroys (`abort`: aborts) the fallback communicator `fc`, made by this process, once, and
/// forgets it: the fallback NCCL's error with its last-error text when the call fails (where the
/// library lacks the function, `fc` is only forgotten). Untracked only after the call returns:
/// NCCL calls its own exported functions (`ncclCommGetAsyncError`) on `fc` while it destroys
/// it, and they may arrive here.
fn destroy_fallback(lib: &fallback::Nccl, fc: usize, abort: bool) -> Outcome {
    type Destroy = unsafe extern "C" fn(*mut c_void) -> ncclResult_t;
    let name = if abort { "ncclCommAbort" } else { "ncclCommDestroy" };
    // SAFETY: NCCL's signature of both functions.
    let Ok(f) = (unsafe { lib.function::<Destroy>(name) }) else {
        untrack_fallback(fc);
        return Ok(());
    };
    // SAFETY: a fallback communicator this process made, destroyed once (the caller's promise).
    let r = unsafe { f(fc as *mut c_void) };
    untrack_fallback(fc);
    if r != types::SUCCESS {
        return Err(Failure::new(r, format!("the fallback NCCL's {name} failed: {}", fallback_last_error(lib))));
    }
    Ok(())
}

/// Records `fc`, a communicator the fallback NCCL made for this library.
pub fn track_fallback(fc: usize) {
    FALLBACK_COMMS.lock().get_or_insert_with(HashSet::new).insert(fc);
}

/// Forgets `fc` once the fallback NCCL destroyed it.
pub fn untrack_fallback(fc: usize) {
    if let Some(s) = FALLBACK_COMMS.lock().as_mut() {
        s.remove(&fc);
    }
}

/// The fallback NCCL when `ptr` is one of its live communicators rather than one of ours.
///
/// NCCL calls its own exported functions (`ncclCommGetAsyncError` from `ncclCommDestroy`,
/// `ncclCommFinalize` and `ncclCommAbort`; `ncclBroadcast` from `ncclBcast`; registration and
/// windows in NCCL 2.28) through the dynamic linker. When this library is in front of NCCL
/// (`LD_PRELOAD`, or linked before a `libnccl` the program also loads, as PyTorch's
/// `libtorch_cuda.so` does) those calls arrive here with NCCL's own communicators, and must go
/// back to NCCL. The same holds for the rail communicators of mcast's NCCL engine, which with
/// `MCAST_NCCL_HIER=on` the fallback NCCL makes for a team across NVLink domains.
pub fn foreign(ptr: *const c_void) -> Option<&'static fallback::Nccl> {
    let ours = FALLBACK_COMMS.lock().as_ref().is_some_and(|s| s.contains(&(ptr as usize)));
    if ptr.is_null() || !(ours || mcast::runtime::net::nccl::is_rail_comm(ptr)) {
        return None;
    }
    match fallback::library() {
        Some(Ok(lib)) => Some(lib),
        _ => None,
    }
}

/// The fallback NCCL's `ncclGetLastError`, or a note that it has none.
pub fn fallback_last_error(lib: &fallback::Nccl) -> String {
    type LastError = unsafe extern "C" fn(*mut c_void) -> *const std::ffi::c_char;
    // SAFETY: NCCL's signature of ncclGetLastError.
    let Ok(f) = (unsafe { lib.function::<LastError>("ncclGetLastError") }) else {
        return "(the fallback NCCL has no ncclGetLastError)".into();
    };
    // SAFETY: NULL is a valid communicator argument of ncclGetLastError.
    let p = unsafe { f(std::ptr::null_mut()) };
    if p.is_null() {
        return "(no detail)".into();
    }
    // SAFETY: NCCL returns a NUL-terminated string.
    let text = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    if text.is_empty() {
        "(no detail from the fallback NCCL's ncclGetLastError)".into()
    } else {
        text
    }
}
