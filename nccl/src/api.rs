//! The exported `nccl*` functions (declared in `include/mcast/nccl.h`).
//!
//! Every export runs inside `guard`: a panic becomes `ncclInternalError`, a failure its
//! `ncclResult_t` with the detail kept for `ncclGetLastError`. Out-parameters are written only on
//! success. Enums from C are checked integers.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use mcast::capi::collective::{
    mcast_dtype_t, mcast_op_t, mcast_stream_t, mcast_team_all_gather, mcast_team_all_reduce, mcast_team_broadcast,
    mcast_team_reduce_scatter,
};
use mcast::capi::team::{
    get_root_unique_id, mcast_get_unique_id, mcast_team_get_error, mcast_team_split, mcast_team_t, mcast_unique_id_t,
};
use parking_lot::Mutex;

use crate::comm::{self, check, Comm, ContextRef, Failure, Outcome};
use crate::fallback;
use crate::group::{self, Op};
use crate::types::{self, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclUniqueId, ConfigHead, DType};

/// `ncclComm_t`.
pub type ncclComm_t = *mut c_void;
/// `cudaStream_t`.
pub type cudaStream_t = mcast_stream_t;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    /// Device of this thread's last initialised communicator (ncclMemAlloc on the simulator).
    static LAST_DEVICE: Cell<Option<c_int>> = const { Cell::new(None) };
}

fn set_last_error(message: &str) {
    let clean: Vec<u8> = message.bytes().map(|b| if b == 0 { b'?' } else { b }).collect();
    LAST_ERROR.with(|e| *e.borrow_mut() = CString::new(clean).unwrap_or_default());
}

/// Runs the body of export `func`.
fn guard(func: &'static str, body: impl FnOnce() -> Outcome<ncclResult_t>) -> ncclResult_t {
    // mcast's leak report names the NCCL call the user wrote, not the mcast call beneath it.
    match mcast::runtime::registry::in_call(func, || catch_unwind(AssertUnwindSafe(body))) {
        Ok(Ok(r)) => r,
        Ok(Err(f)) => {
            let message = format!("{func}: {}", f.message);
            tracing::debug!("mcast_nccl: {message}");
            set_last_error(&message);
            f.code
        }
        Err(_) => {
            set_last_error(&format!("{func}: internal error (a bug in mcast_nccl, please report it)"));
            types::INTERNAL_ERROR
        }
    }
}

fn ok() -> Outcome<ncclResult_t> {
    Ok(types::SUCCESS)
}

fn out<'a, T>(ptr: *mut T, name: &str) -> Outcome<&'a mut T> {
    // SAFETY: the caller passes NULL or a valid pointer, as NCCL's API requires.
    unsafe { ptr.as_mut() }.ok_or_else(|| Failure::new(types::INVALID_ARGUMENT, format!("{name} is NULL")))
}

fn dtype_of(d: ncclDataType_t) -> Outcome<DType> {
    types::dtype(d)
        .ok_or_else(|| Failure::new(types::INVALID_ARGUMENT, format!("datatype {d} is not an ncclDataType_t")))
}

fn op_of(op: ncclRedOp_t) -> Outcome<(&'static str, Option<u32>)> {
    types::red_op(op).ok_or_else(|| Failure::new(types::INVALID_ARGUMENT, format!("op {op} is not an ncclRedOp_t")))
}

fn check_rank(comm: &Comm, root: c_int, what: &str) -> Outcome {
    if root < 0 || root >= comm.nranks {
        return Err(Failure::new(
            types::INVALID_ARGUMENT,
            format!("{what} {root} is out of range: the communicator has {} ranks", comm.nranks),
        ));
    }
    Ok(())
}

/// Submits a collective served by mcast.
fn serve(
    comm: Arc<Comm>,
    stream: cudaStream_t,
    call: impl FnOnce(&Comm, mcast_team_t, mcast_stream_t) -> Outcome + Send + 'static,
) -> Outcome {
    let stream = stream as usize;
    group::submit(Op {
        comm: Some(comm.clone()),
        blocking: false,
        forwarded: false,
        run: Box::new(move || {
            let team = comm.ready()?.team;
            comm.used_stream(stream as mcast_stream_t);
            call(&comm, team, stream as mcast_stream_t)?;
            comm.served.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }),
    })
}

/// Submits a call for the fallback NCCL: `call` gets the library and the fallback communicator.
fn forward(
    comm: Arc<Comm>,
    what: String,
    call: impl FnOnce(&fallback::Nccl, *mut c_void) -> ncclResult_t + Send + 'static,
) -> Outcome {
    let lib = match fallback::library() {
        Some(Ok(lib)) => lib,
        Some(Err(e)) => {
            return Err(Failure::new(types::INVALID_USAGE, format!("{what} is not served by mcast, and {e}")))
        }
        None => {
            return Err(Failure::new(
                types::INVALID_USAGE,
                format!(
                    "{what} is not served by mcast; set {}=/path/to/libnccl.so.2 to forward it to NCCL",
                    fallback::ENV
                ),
            ))
        }
    };
    let fc = comm.ready()?.fallback.ok_or_else(|| {
        Failure::new(types::INVALID_USAGE, format!("{what}: the communicator has no fallback NCCL communicator"))
    })?;
    tracing::debug!("mcast_nccl: rank {}: {what} forwarded to {}", comm.rank, lib.path);
    group::submit(Op {
        comm: None,
        blocking: false,
        forwarded: true,
        run: Box::new(move || {
            let r = call(lib, fc as *mut c_void);
            comm.forwarded.fetch_add(1, Ordering::Relaxed);
            if r == types::SUCCESS {
                Ok(())
            } else {
                Err(Failure::new(r, format!("{what}: the fallback NCCL failed")))
            }
        }),
    })
}

/// Looks up NCCL function `name` of type `F` in the fallback library, as a failure if absent.
///
/// # Safety
/// `F` must be NCCL's signature of `name`.
unsafe fn fallback_fn<F: Copy>(lib: &fallback::Nccl, name: &str) -> Result<F, ncclResult_t> {
    // SAFETY: forwarded from the caller.
    unsafe { lib.function::<F>(name) }.map_err(|e| {
        set_last_error(&e);
        types::INVALID_USAGE
    })
}

/// Runs `call` with NCCL's own `name` when `comm` is a communicator of the fallback NCCL, not
/// one of ours: NCCL calls its exported functions through the dynamic linker, so with this
/// library in front of it (`LD_PRELOAD`, or a program that also loads `libnccl`, as PyTorch does)
/// its internal calls on its own communicators land here ([`comm::foreign`]). `None`: ours.
fn on_fallback<F: Copy>(comm: ncclComm_t, name: &str, call: impl FnOnce(F) -> ncclResult_t) -> Option<ncclResult_t> {
    let lib = comm::foreign(comm)?;
    // SAFETY: every caller names F as NCCL's signature of `name`.
    Some(match unsafe { fallback_fn::<F>(lib, name) } {
        Ok(f) => call(f),
        Err(r) => r,
    })
}

// ------------------------------------------------------------------------------------------
// Versions, ids, errors

/// `ncclGetVersion`: the NCCL version whose API this library follows (2.27.7 -> 22707).
#[no_mangle]
pub extern "C" fn ncclGetVersion(version: *mut c_int) -> ncclResult_t {
    guard("ncclGetVersion", || {
        *out(version, "version")? = types::VERSION_CODE;
        ok()
    })
}

/// `ncclGetUniqueId`: a new mcast unique id (a bootstrap listener in this process, which must
/// live until every rank has joined), or with `MCAST_BOOTSTRAP_ADDR` the job's env-mode id
/// (`MCAST_BOOTSTRAP_SECRET` required, as for `mcast_get_unique_id`: else
/// `ncclInvalidArgument` naming it).
#[no_mangle]
pub extern "C" fn ncclGetUniqueId(unique_id: *mut ncclUniqueId) -> ncclResult_t {
    guard("ncclGetUniqueId", || {
        let dst = out(unique_id, "uniqueId")?;
        let mut id = mcast_unique_id_t { internal: [0; 128] };
        // SAFETY: a valid out-pointer.
        check(unsafe { mcast_get_unique_id(&mut id) }, "mcast_get_unique_id")?;
        dst.internal.copy_from_slice(&id.internal);
        ok()
    })
}

/// `ncclGetErrorString`: a static text per result; never NULL.
#[no_mangle]
pub extern "C" fn ncclGetErrorString(result: ncclResult_t) -> *const c_char {
    types::error_string(result).as_ptr()
}

/// `ncclGetLastError`: the detail of the calling thread's last failure; "" if none. `comm` may
/// be NULL. Never NULL.
// The pointers go to the fallback NCCL as given, under its contract (as every NCCL call).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn ncclGetLastError(comm: ncclComm_t) -> *const c_char {
    if let Some(lib) = comm::foreign(comm) {
        type F = unsafe extern "C" fn(ncclComm_t) -> *const c_char;
        // SAFETY: NCCL's signature of ncclGetLastError.
        if let Ok(f) = unsafe { lib.function::<F>("ncclGetLastError") } {
            // SAFETY: a live communicator of that NCCL.
            let p = unsafe { f(comm) };
            if !p.is_null() {
                return p;
            }
        }
    }
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// `ncclCommGetAsyncError`: `ncclInProgress` while a non-blocking creation runs, its failure,
/// then the team's sticky error (`ncclRemoteError` after a timeout or an abort).
// The pointers go to the fallback NCCL as given, under its contract (as every NCCL call).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn ncclCommGetAsyncError(comm: ncclComm_t, async_error: *mut ncclResult_t) -> ncclResult_t {
    type F = unsafe extern "C" fn(ncclComm_t, *mut ncclResult_t) -> ncclResult_t;
    // SAFETY: the caller's arguments, as given.
    if let Some(r) = on_fallback::<F>(comm, "ncclCommGetAsyncError", |f| unsafe { f(comm, async_error) }) {
        return r;
    }
    guard("ncclCommGetAsyncError", || {
        let c = comm::lookup(comm)?;
        let dst = out(async_error, "asyncError")?;
        let state = c.init_state();
        if state != types::SUCCESS {
            *dst = state;
            return ok();
        }
        if let (true, Some(fc), Some(Ok(lib))) =
            (c.whole_fallback_comm(), c.ready()?.fallback, crate::fallback::library())
        {
            // SAFETY: NCCL's signature; the fallback communicator this one runs on.
            let f = unsafe { fallback_fn::<F>(lib, "ncclCommGetAsyncError") }
                .map_err(|r| Failure::new(r, "no ncclCommGetAsyncError"))?;
            // SAFETY: as above; a valid out-pointer.
            let r = unsafe { f(fc as ncclComm_t, dst) };
            return if r == types::SUCCESS {
                ok()
            } else {
                Err(Failure::new(r, "the fallback NCCL's ncclCommGetAsyncError failed"))
            };
        }
        let mut e = mcast::capi::mcast_status_t(0);
        // SAFETY: a valid out-pointer.
        check(unsafe { mcast_team_get_error(c.ready()?.team, &mut e) }, "mcast_team_get_error")?;
        *dst = types::result_of(e);
        ok()
    })
}

// ------------------------------------------------------------------------------------------
// Communicators

/// Creates rank `rank` of `nranks` on the calling thread's device; queued in a group.
fn init_rank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
    nonblocking: bool,
) -> Outcome<ncclResult_t> {
    let dst = out(comm, "comm")?;
    if nranks < 1 {
        return Err(Failure::new(types::INVALID_ARGUMENT, format!("nranks is {nranks}; it must be at least 1")));
    }
    if rank < 0 || rank >= nranks {
        return Err(Failure::new(
            types::INVALID_ARGUMENT,
            format!("rank {rank} is out of range for nranks = {nranks}"),
        ));
    }
    let ctx = comm::acquire_context()?;
    let device = match comm::current_device(&ctx, rank) {
        Ok(d) => d,
        Err(f) => {
            comm::release_context();
            return Err(f);
        }
    };
    let c = Comm::new(ctx, rank, nranks, device, nonblocking);
    let key = comm::publish(c.clone());
    let finish = {
        let c = c.clone();
        move || -> Outcome { c.finish_init(&id) }
    };
    if nonblocking && !group::in_group() {
        std::thread::spawn(finish);
        // The calling thread's device (ncclMemAlloc on the simulator), not the creating thread's.
        LAST_DEVICE.with(|d| d.set(Some(device)));
        *dst = key as ncclComm_t;
        return Ok(types::IN_PROGRESS);
    }
    let submitted =
        group::submit(Op { comm: Some(c.clone()), blocking: true, forwarded: false, run: Box::new(finish) });
    if let Err(f) = submitted {
        let _ = comm::unpublish(key as *const c_void);
        let _ = c.release(false);
        return Err(f);
    }
    LAST_DEVICE.with(|d| d.set(Some(device)));
    *dst = key as ncclComm_t;
    ok()
}

fn config_nonblocking(config: *const ConfigHead) -> Outcome<bool> {
    // SAFETY: NULL or a caller's ncclConfig_t, whose first fields are ConfigHead.
    let Some(cfg) = (unsafe { config.as_ref() }) else { return Ok(false) };
    if cfg.magic != types::CONFIG_MAGIC || cfg.size < std::mem::size_of::<ConfigHead>() {
        return Err(Failure::new(
            types::INVALID_ARGUMENT,
            "config was not initialised with NCCL_CONFIG_INITIALIZER (bad magic or size)",
        ));
    }
    Ok(cfg.blocking == 0)
}

/// `ncclCommInitRank`.
#[no_mangle]
pub extern "C" fn ncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    comm_id: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    guard("ncclCommInitRank", || init_rank(comm, nranks, comm_id, rank, false))
}

/// `ncclCommInitRankConfig`: `config->blocking = 0` returns `ncclInProgress` and creates the
/// communicator in the background (poll `ncclCommGetAsyncError`). Other fields are ignored.
#[no_mangle]
pub extern "C" fn ncclCommInitRankConfig(
    comm: *mut ncclComm_t,
    nranks: c_int,
    comm_id: ncclUniqueId,
    rank: c_int,
    config: *mut c_void,
) -> ncclResult_t {
    guard("ncclCommInitRankConfig", || {
        let nonblocking = config_nonblocking(config.cast())?;
        init_rank(comm, nranks, comm_id, rank, nonblocking)
    })
}

/// `ncclCommInitRankScalable`: with one id, as `ncclCommInitRankConfig`; several ids are not
/// served (mcast's bootstrap has one root).
///
/// # Safety
/// `commIds` is NULL or points to `nId` ids, as NCCL's API requires.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankScalable(
    newcomm: *mut ncclComm_t,
    nranks: c_int,
    myrank: c_int,
    n_id: c_int,
    comm_ids: *mut ncclUniqueId,
    config: *mut c_void,
) -> ncclResult_t {
    guard("ncclCommInitRankScalable", || {
        if n_id != 1 || comm_ids.is_null() {
            return Err(Failure::new(
                types::INVALID_USAGE,
                format!("nId = {n_id}: mcast_nccl serves ncclCommInitRankScalable with exactly one unique id"),
            ));
        }
        let nonblocking = config_nonblocking(config.cast())?;
        // SAFETY: checked non-NULL; the caller passes nId ids.
        let id = unsafe { *comm_ids };
        init_rank(newcomm, nranks, id, myrank, nonblocking)
    })
}

/// `ncclCommInitAll`: one communicator per device of `devlist` (NULL: devices 0..ndev-1), all
/// in this process, made together (through a fresh id: `MCAST_BOOTSTRAP_ADDR` is not used).
///
/// # Safety
/// `comms` is NULL or has room for `ndev` communicators; `devlist` is NULL or holds `ndev` devices.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitAll(comms: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) -> ncclResult_t {
    guard("ncclCommInitAll", || {
        if comms.is_null() {
            return Err(Failure::new(types::INVALID_ARGUMENT, "comms is NULL"));
        }
        if ndev < 1 {
            return Err(Failure::new(types::INVALID_ARGUMENT, format!("ndev is {ndev}; it must be at least 1")));
        }
        let n = ndev as usize;
        let devices: Vec<c_int> = if devlist.is_null() {
            (0..ndev).collect()
        } else {
            // SAFETY: the caller passes ndev devices.
            unsafe { std::slice::from_raw_parts(devlist, n) }.to_vec()
        };
        // Every rank is in this process: a fresh root-mode id, never the job's
        // MCAST_BOOTSTRAP_ADDR (two processes' teams would meet there, as split's did).
        let mut id = mcast_unique_id_t { internal: [0; 128] };
        check(get_root_unique_id(&mut id), "mcast_get_unique_id")?;
        let nid = ncclUniqueId { internal: id.internal };
        let mut made: Vec<Arc<Comm>> = Vec::with_capacity(n);
        for (r, &d) in devices.iter().enumerate() {
            match comm::acquire_context() {
                Ok(ctx) => made.push(Comm::new(ctx, r as c_int, ndev, d, false)),
                Err(f) => {
                    made.iter().for_each(|_| comm::release_context());
                    return Err(f);
                }
            }
        }
        let results: Vec<Outcome> = std::thread::scope(|s| {
            let hs: Vec<_> = made.iter().map(|c| s.spawn(|| c.finish_init(&nid))).collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(Failure::new(types::INTERNAL_ERROR, "panicked"))))
                .collect()
        });
        if let Some(Err(f)) = results.into_iter().find(|r| r.is_err()) {
            for c in &made {
                let _ = c.release(true);
            }
            return Err(f);
        }
        for (r, c) in made.into_iter().enumerate() {
            // SAFETY: the caller passes room for ndev communicators.
            unsafe { *comms.add(r) = comm::publish(c) as ncclComm_t };
        }
        ok()
    })
}

/// `ncclCommFinalize`: returns once the communicator's work in flight is complete.
// The pointers go to the fallback NCCL as given, under its contract (as every NCCL call).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn ncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
    type F = unsafe extern "C" fn(ncclComm_t) -> ncclResult_t;
    // SAFETY: the caller's communicator, as given.
    if let Some(r) = on_fallback::<F>(comm, "ncclCommFinalize", |f| unsafe { f(comm) }) {
        return r;
    }
    guard("ncclCommFinalize", || {
        comm::lookup(comm)?.finalize()?;
        ok()
    })
}

/// `ncclCommDestroy`: waits for the work in flight, then releases everything. NULL: no-op.
// The pointers go to the fallback NCCL as given, under its contract (as every NCCL call).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn ncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
    type F = unsafe extern "C" fn(ncclComm_t) -> ncclResult_t;
    // SAFETY: the caller's communicator, as given.
    if let Some(r) = on_fallback::<F>(comm, "ncclCommDestroy", |f| unsafe { f(comm) }) {
        return r;
    }
    guard("ncclCommDestroy", || {
        if comm.is_null() {
            return ok();
        }
        let c = comm::unpublish(comm)?;
        let fin = c.finalize();
        let rel = c.release(false);
        fin.and(rel)?;
        ok()
    })
}

/// `ncclCommAbort`: ends every wait of the team (`mcast_team_abort`) and releases the
/// communicator without waiting for peers. NULL: no-op.
// The pointers go to the fallback NCCL as given, under its contract (as every NCCL call).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
    type F = unsafe extern "C" fn(ncclComm_t) -> ncclResult_t;
    // SAFETY: the caller's communicator, as given.
    if let Some(r) = on_fallback::<F>(comm, "ncclCommAbort", |f| unsafe { f(comm) }) {
        return r;
    }
    guard("ncclCommAbort", || {
        if comm.is_null() {
            return ok();
        }
        comm::unpublish(comm)?.release(true)?;
        ok()
    })
}

/// `ncclCommSplit`: MPI_Comm_split over the ranks of `comm` (`mcast_team_split`); color
/// `NCCL_SPLIT_NOCOLOR` gives NULL. Queued in a group (written at `ncclGroupEnd`).
#[no_mangle]
pub extern "C" fn ncclCommSplit(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut c_void,
) -> ncclResult_t {
    guard("ncclCommSplit", || {
        let c = comm::lookup(comm)?;
        out(newcomm, "newcomm")?;
        config_nonblocking(config.cast())?;
        if color < 0 && color != types::SPLIT_NOCOLOR {
            return Err(Failure::new(
                types::INVALID_ARGUMENT,
                format!("color {color} is negative and not NCCL_SPLIT_NOCOLOR"),
            ));
        }
        let dst = newcomm as usize;
        let parent = c.clone();
        group::submit(Op {
            comm: Some(c),
            blocking: true,
            forwarded: false,
            run: Box::new(move || {
                if parent.whole_fallback_comm() {
                    return Err(Failure::new(
                        types::INVALID_USAGE,
                        "ncclCommSplit of a communicator that runs whole on the fallback NCCL (it spans several \
                         NVLink domains) is not served yet",
                    ));
                }
                let team = parent.ready()?.team;
                let mut new_team = mcast_team_t { id: 0 };
                let (colors, keys) = ([color], [key]);
                // SAFETY: one color and key for the one rank this process holds.
                check(
                    unsafe { mcast_team_split(team, colors.as_ptr(), keys.as_ptr(), &mut new_team) },
                    "mcast_team_split",
                )?;
                let fallback = split_fallback(&parent, color, key)?;
                let made = if new_team.id == 0 {
                    std::ptr::null_mut()
                } else {
                    child(&parent, new_team, fallback)? as ncclComm_t
                };
                // SAFETY: the caller's out-pointer, valid until the group ends.
                unsafe { *(dst as *mut ncclComm_t) = made };
                Ok(())
            }),
        })?;
        ok()
    })
}

/// Splits the parent's fallback NCCL communicator the same way (every rank of the parent
/// takes part, as in mcast's split).
fn split_fallback(parent: &Comm, color: c_int, key: c_int) -> Outcome<Option<usize>> {
    let (Some(fc), Some(Ok(lib))) = (parent.ready()?.fallback, fallback::library()) else { return Ok(None) };
    type F = unsafe extern "C" fn(*mut c_void, c_int, c_int, *mut *mut c_void, *mut c_void) -> ncclResult_t;
    // SAFETY: NCCL's signature of ncclCommSplit.
    let f = unsafe { lib.function::<F>("ncclCommSplit") }.map_err(|e| Failure::new(types::INVALID_USAGE, e))?;
    let mut new: *mut c_void = std::ptr::null_mut();
    // SAFETY: the fallback communicator of the parent; a valid out-pointer; no config.
    let r = unsafe { f(fc as *mut c_void, color, key, &mut new, std::ptr::null_mut()) };
    if r != types::SUCCESS {
        return Err(Failure::new(r, "the fallback NCCL's ncclCommSplit failed"));
    }
    if !new.is_null() {
        comm::track_fallback(new as usize);
    }
    Ok((!new.is_null()).then_some(new as usize))
}

/// A communicator over `team`, split from `parent`.
fn child(parent: &Comm, team: mcast_team_t, fallback: Option<usize>) -> Outcome<usize> {
    let t = mcast::runtime::handles::team(team.id).map_err(|e| Failure::new(types::INTERNAL_ERROR, e.message))?;
    let (rank, nranks) = (t.local_rank().unwrap_or(0) as c_int, t.size() as c_int);
    let ctx: ContextRef = comm::acquire_context()?;
    let c = Comm::new(ctx, rank, nranks, parent.device, parent.nonblocking);
    c.adopt(team, fallback);
    Ok(comm::publish(c))
}

/// `ncclCommShrink`: not served (forwarded).
#[no_mangle]
pub extern "C" fn ncclCommShrink(
    comm: ncclComm_t,
    _exclude_ranks_list: *mut c_int,
    _exclude_ranks_count: c_int,
    _newcomm: *mut ncclComm_t,
    _config: *mut c_void,
    _shrink_flags: c_int,
) -> ncclResult_t {
    guard("ncclCommShrink", || {
        comm::lookup(comm)?;
        Err(Failure::new(
            types::INVALID_USAGE,
            "ncclCommShrink is not served by mcast_nccl: use ncclCommSplit with NCCL_SPLIT_NOCOLOR on the excluded ranks",
        ))
    })
}

/// `ncclCommCount`.
// The pointers go to the fallback NCCL as given, under its contract (as every NCCL call).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn ncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
    type F = unsafe extern "C" fn(ncclComm_t, *mut c_int) -> ncclResult_t;
    // SAFETY: the caller's arguments, as given.
    if let Some(r) = on_fallback::<F>(comm, "ncclCommCount", |f| unsafe { f(comm, count) }) {
        return r;
    }
    guard("ncclCommCount", || {
        let c = comm::lookup(comm)?;
        *out(count, "count")? = c.nranks;
        ok()
    })
}

/// `ncclCommCuDevice`.
// The pointers go to the fallback NCCL as given, under its contract (as every NCCL call).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn ncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
    type F = unsafe extern "C" fn(ncclComm_t, *mut c_int) -> ncclResult_t;
    // SAFETY: the caller's arguments, as given.
    if let Some(r) = on_fallback::<F>(comm, "ncclCommCuDevice", |f| unsafe { f(comm, device) }) {
        return r;
    }
    guard("ncclCommCuDevice", || {
        let c = comm::lookup(comm)?;
        *out(device, "device")? = c.device;
        ok()
    })
}

/// `ncclCommUserRank`.
// The pointers go to the fallback NCCL as given, under its contract (as every NCCL call).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn ncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
    type F = unsafe extern "C" fn(ncclComm_t, *mut c_int) -> ncclResult_t;
    // SAFETY: the caller's arguments, as given.
    if let Some(r) = on_fallback::<F>(comm, "ncclCommUserRank", |f| unsafe { f(comm, rank) }) {
        return r;
    }
    guard("ncclCommUserRank", || {
        let c = comm::lookup(comm)?;
        *out(rank, "rank")? = c.rank;
        ok()
    })
}

// ------------------------------------------------------------------------------------------
// Memory

/// Live `ncclMemAlloc` allocations: address -> the process context they came from.
static ALLOCATIONS: Mutex<Option<HashMap<usize, ContextRef>>> = Mutex::new(None);

/// `ncclMemAlloc`: device memory any communicator can register (`mcast_mem_alloc`), on the
/// calling thread's CUDA device (simulator: the device of its last communicator, else
/// `MCAST_SIM_DEVICE`, else 0).
#[no_mangle]
pub extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
    guard("ncclMemAlloc", || {
        let dst = out(ptr, "ptr")?;
        if size == 0 {
            return Err(Failure::new(types::INVALID_ARGUMENT, "size is 0"));
        }
        let ctx = comm::acquire_context()?;
        let device = if ctx.sim {
            match LAST_DEVICE.with(|d| d.get()) {
                Some(d) => Ok(d),
                None => comm::current_device(&ctx, 0),
            }
        } else {
            comm::current_device(&ctx, 0)
        };
        let mut p: *mut c_void = std::ptr::null_mut();
        let made = device.and_then(|d| {
            // SAFETY: a valid out-pointer.
            check(unsafe { mcast::capi::memory::mcast_mem_alloc(ctx.ctx, d, size, &mut p) }, "mcast_mem_alloc")
        });
        if let Err(f) = made {
            comm::release_context();
            return Err(f);
        }
        ALLOCATIONS.lock().get_or_insert_with(HashMap::new).insert(p as usize, ctx);
        *dst = p;
        ok()
    })
}

/// `ncclMemFree`: frees memory from `ncclMemAlloc`. NULL: no-op.
// The pointers go to the fallback NCCL as given, under its contract (as every NCCL call).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn ncclMemFree(ptr: *mut c_void) -> ncclResult_t {
    guard("ncclMemFree", || {
        if ptr.is_null() {
            return ok();
        }
        let ours = ALLOCATIONS.lock().as_ref().is_some_and(|m| m.contains_key(&(ptr as usize)));
        if let (false, Some(Ok(lib))) = (ours, fallback::library()) {
            // Not ours: memory of the fallback NCCL (NCCL 2.28 frees its own ncclMemAlloc
            // memory with ncclMemFree, which lands here when this library is in front of it).
            type F = unsafe extern "C" fn(*mut c_void) -> ncclResult_t;
            // SAFETY: NCCL's signature of ncclMemFree.
            let f = unsafe { lib.function::<F>("ncclMemFree") }.map_err(|e| Failure::new(types::INVALID_USAGE, e))?;
            // SAFETY: the caller's pointer, as given.
            let r = unsafe { f(ptr) };
            if r != types::SUCCESS {
                let detail = comm::fallback_last_error(lib);
                return Err(Failure::new(r, format!("{ptr:p} is not ncclMemAlloc memory of mcast_nccl, and the fallback NCCL's ncclMemFree failed: {detail}")));
            }
            return ok();
        }
        let ctx = ALLOCATIONS.lock().as_mut().and_then(|m| m.remove(&(ptr as usize))).ok_or_else(|| {
            Failure::new(types::INVALID_ARGUMENT, format!("{ptr:p} is not live memory from ncclMemAlloc"))
        })?;
        let freed = check(mcast::capi::memory::mcast_mem_free(ctx.ctx, ptr), "mcast_mem_free");
        if let Err(f) = freed {
            // Still registered (IN_USE): the allocation stays live.
            ALLOCATIONS.lock().get_or_insert_with(HashMap::new).insert(ptr as usize, ctx);
            return Err(f);
        }
        comm::release_context();
        ok()
    })
}

/// `ncclCommRegister`: binds `[buff, buff + size)` to the team (`mcast_buffer_register`), so
/// collectives on pointers inside it go zero-copy. Collective: every rank registers its buffer
/// (in a group, or from its own thread).
// The pointers go to the fallback NCCL as given, under its contract (as every NCCL call).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn ncclCommRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> ncclResult_t {
    type F = unsafe extern "C" fn(ncclComm_t, *mut c_void, usize, *mut *mut c_void) -> ncclResult_t;
    // SAFETY: the caller's arguments, as given.
    if let Some(r) = on_fallback::<F>(comm, "ncclCommRegister", |f| unsafe { f(comm, buff, size, handle) }) {
        return r;
    }
    guard("ncclCommRegister", || {
        let c = comm::lookup(comm)?;
        out(handle, "handle")?;
        if buff.is_null() || size == 0 {
            return Err(Failure::new(types::INVALID_ARGUMENT, "buff is NULL or size is 0"));
        }
        let (dst, ptr) = (handle as usize, buff as usize);
        let me = c.clone();
        group::submit(Op {
            comm: Some(c),
            blocking: true,
            forwarded: false,
            run: Box::new(move || {
                let h = me.register(ptr, size)?;
                // SAFETY: the caller's out-pointer.
                unsafe { *(dst as *mut *mut c_void) = h as *mut c_void };
                Ok(())
            }),
        })?;
        ok()
    })
}

/// `ncclCommDeregister`.
// The pointers go to the fallback NCCL as given, under its contract (as every NCCL call).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn ncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
    type F = unsafe extern "C" fn(ncclComm_t, *mut c_void) -> ncclResult_t;
    // SAFETY: the caller's arguments, as given.
    if let Some(r) = on_fallback::<F>(comm, "ncclCommDeregister", |f| unsafe { f(comm, handle) }) {
        return r;
    }
    guard("ncclCommDeregister", || {
        comm::lookup(comm)?.deregister(handle as usize)?;
        ok()
    })
}

/// `NCCL_WIN_DEFAULT | NCCL_WIN_COLL_SYMMETRIC`: the window flags NCCL 2.27 defines.
const WIN_KNOWN_FLAGS: c_int = 0x01;

/// `ncclCommWindowRegister` (NCCL 2.27's symmetric windows): an mcast registration of
/// `[buff, buff + size)`, as `ncclCommRegister`, so collectives on window memory go zero-copy
/// (mcast's registered buffers are symmetric already: every rank registers its own memory in one
/// collective call). `win_flags`: `NCCL_WIN_DEFAULT` or `NCCL_WIN_COLL_SYMMETRIC`; other bits are
/// `ncclInvalidArgument`. Collective, like `ncclCommRegister`.
// The pointers go to the fallback NCCL as given, under its contract (as every NCCL call).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn ncclCommWindowRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    win: *mut *mut c_void,
    win_flags: c_int,
) -> ncclResult_t {
    type F = unsafe extern "C" fn(ncclComm_t, *mut c_void, usize, *mut *mut c_void, c_int) -> ncclResult_t;
    // SAFETY: the caller's arguments, as given.
    if let Some(r) =
        on_fallback::<F>(comm, "ncclCommWindowRegister", |f| unsafe { f(comm, buff, size, win, win_flags) })
    {
        return r;
    }
    guard("ncclCommWindowRegister", || {
        let c = comm::lookup(comm)?;
        out(win, "win")?;
        if win_flags & !WIN_KNOWN_FLAGS != 0 {
            return Err(Failure::new(
                types::INVALID_ARGUMENT,
                format!("win_flags {win_flags:#x}: only NCCL_WIN_DEFAULT and NCCL_WIN_COLL_SYMMETRIC are known"),
            ));
        }
        if buff.is_null() || size == 0 {
            return Err(Failure::new(types::INVALID_ARGUMENT, "buff is NULL or size is 0"));
        }
        let (dst, ptr) = (win as usize, buff as usize);
        let me = c.clone();
        group::submit(Op {
            comm: Some(c),
            blocking: true,
            forwarded: false,
            run: Box::new(move || {
                let h = me.register(ptr, size)?;
                // SAFETY: the caller's out-pointer.
                unsafe { *(dst as *mut *mut c_void) = h as *mut c_void };
                Ok(())
            }),
        })?;
        ok()
    })
}

/// `ncclCommWindowDeregister`: ends the registration `ncclCommWindowRegister` made.
// The pointers go to the fallback NCCL as given, under its contract (as every NCCL call).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn ncclCommWindowDeregister(comm: ncclComm_t, win: *mut c_void) -> ncclResult_t {
    type F = unsafe extern "C" fn(ncclComm_t, *mut c_void) -> ncclResult_t;
    // SAFETY: the caller's arguments, as given.
    if let Some(r) = on_fallback::<F>(comm, "ncclCommWindowDeregister", |f| unsafe { f(comm, win) }) {
        return r;
    }
    guard("ncclCommWindowDeregister", || {
        comm::lookup(comm)?.deregister(win as usize)?;
        ok()
    })
}

// ------------------------------------------------------------------------------------------
// Reduction operations (forwarded)

/// `ncclRedOpCreatePreMulSum`: forwarded to the fallback NCCL (made on its communicator).
#[no_mangle]
pub extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut ncclRedOp_t,
    scalar: *mut c_void,
    datatype: ncclDataType_t,
    residence: c_int,
    comm: ncclComm_t,
) -> ncclResult_t {
    guard("ncclRedOpCreatePreMulSum", || {
        let c = comm::lookup(comm)?;
        out(op, "op")?;
        dtype_of(datatype)?;
        let (dst, scalar) = (op as usize, scalar as usize);
        forward(c, "ncclRedOpCreatePreMulSum".into(), move |lib, fc| {
            type F =
                unsafe extern "C" fn(*mut ncclRedOp_t, *mut c_void, ncclDataType_t, c_int, *mut c_void) -> ncclResult_t;
            // SAFETY: NCCL's signature.
            match unsafe { fallback_fn::<F>(lib, "ncclRedOpCreatePreMulSum") } {
                // SAFETY: the caller's pointers, forwarded as given.
                Ok(f) => unsafe { f(dst as *mut ncclRedOp_t, scalar as *mut c_void, datatype, residence, fc) },
                Err(r) => r,
            }
        })?;
        ok()
    })
}

/// `ncclRedOpDestroy`: forwarded.
#[no_mangle]
pub extern "C" fn ncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t {
    guard("ncclRedOpDestroy", || {
        let c = comm::lookup(comm)?;
        forward(c, "ncclRedOpDestroy".into(), move |lib, fc| {
            type F = unsafe extern "C" fn(ncclRedOp_t, *mut c_void) -> ncclResult_t;
            // SAFETY: NCCL's signature.
            match unsafe { fallback_fn::<F>(lib, "ncclRedOpDestroy") } {
                // SAFETY: forwarded as given.
                Ok(f) => unsafe { f(op, fc) },
                Err(r) => r,
            }
        })?;
        ok()
    })
}

// ------------------------------------------------------------------------------------------
// Collectives

type ReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclRedOp_t,
    *mut c_void,
    cudaStream_t,
) -> ncclResult_t;

/// Forwards a reduction of NCCL's (send, recv, count, type, op, comm, stream) shape.
#[allow(clippy::too_many_arguments)]
fn forward_reduction(
    c: Arc<Comm>,
    name: &'static str,
    what: String,
    send: usize,
    recv: usize,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    stream: cudaStream_t,
) -> Outcome {
    let stream = stream as usize;
    forward(c, what, move |lib, fc| {
        // SAFETY: NCCL's signature of ncclAllReduce and ncclReduceScatter.
        match unsafe { fallback_fn::<ReduceFn>(lib, name) } {
            // SAFETY: the caller's arguments, forwarded as given.
            Ok(f) => unsafe {
                f(send as *const c_void, recv as *mut c_void, count, datatype, op, fc, stream as cudaStream_t)
            },
            Err(r) => r,
        }
    })
}

/// `ncclAllReduce`: served for mcast's types with sum, min and max (`mcast_team_all_reduce`);
/// forwarded otherwise.
#[no_mangle]
pub extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard("ncclAllReduce", || {
        let c = comm::lookup(comm)?;
        let dt = dtype_of(datatype)?;
        let (op_name, mop) = op_of(op)?;
        let (send, recv) = (sendbuff as usize, recvbuff as usize);
        match (dt.mcast, mop) {
            (Some(d), Some(o)) if !c.whole_fallback_comm() => serve(c, stream, move |c, team, stream| {
                check(
                    mcast_team_all_reduce(
                        team,
                        c.rank,
                        send as *const c_void,
                        recv as *mut c_void,
                        count,
                        mcast_dtype_t(d),
                        mcast_op_t(o),
                        stream,
                    ),
                    "mcast_team_all_reduce",
                )
            }),
            _ => forward_reduction(
                c,
                "ncclAllReduce",
                format!("ncclAllReduce of {} with {op_name}", dt.name),
                send,
                recv,
                count,
                datatype,
                op,
                stream,
            ),
        }?;
        ok()
    })
}

/// `ncclReduceScatter`: served like [`ncclAllReduce`]; `recvcount` elements per rank.
#[no_mangle]
pub extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard("ncclReduceScatter", || {
        let c = comm::lookup(comm)?;
        let dt = dtype_of(datatype)?;
        let (op_name, mop) = op_of(op)?;
        let (send, recv) = (sendbuff as usize, recvbuff as usize);
        match (dt.mcast, mop) {
            (Some(d), Some(o)) if !c.whole_fallback_comm() => serve(c, stream, move |c, team, stream| {
                check(
                    mcast_team_reduce_scatter(
                        team,
                        c.rank,
                        send as *const c_void,
                        recv as *mut c_void,
                        recvcount,
                        mcast_dtype_t(d),
                        mcast_op_t(o),
                        stream,
                    ),
                    "mcast_team_reduce_scatter",
                )
            }),
            _ => forward_reduction(
                c,
                "ncclReduceScatter",
                format!("ncclReduceScatter of {} with {op_name}", dt.name),
                send,
                recv,
                recvcount,
                datatype,
                op,
                stream,
            ),
        }?;
        ok()
    })
}

/// `ncclAllGather`: served for every type (bytes), `sendcount` elements per rank.
#[no_mangle]
pub extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard("ncclAllGather", || {
        let c = comm::lookup(comm)?;
        let dt = dtype_of(datatype)?;
        let bytes = sendcount
            .checked_mul(dt.size)
            .ok_or_else(|| Failure::new(types::INVALID_ARGUMENT, format!("sendcount {sendcount} overflows")))?;
        let (send, recv) = (sendbuff as usize, recvbuff as usize);
        if c.whole_fallback_comm() {
            type F = unsafe extern "C" fn(
                *const c_void,
                *mut c_void,
                usize,
                ncclDataType_t,
                *mut c_void,
                cudaStream_t,
            ) -> ncclResult_t;
            let st = stream as usize;
            forward(c, "ncclAllGather".into(), move |lib, fc| {
                // SAFETY: NCCL's signature of ncclAllGather.
                match unsafe { fallback_fn::<F>(lib, "ncclAllGather") } {
                    // SAFETY: the caller's arguments, forwarded as given.
                    Ok(f) => unsafe {
                        f(send as *const c_void, recv as *mut c_void, sendcount, datatype, fc, st as cudaStream_t)
                    },
                    Err(r) => r,
                }
            })?;
            return ok();
        }
        serve(c, stream, move |c, team, stream| {
            check(
                mcast_team_all_gather(team, c.rank, send as *const c_void, recv as *mut c_void, bytes, stream),
                "mcast_team_all_gather",
            )
        })?;
        ok()
    })
}

/// `ncclBroadcast`: served for every type (bytes).
// The pointers go to the fallback NCCL as given, under its contract (as every NCCL call).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    type F = unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        c_int,
        ncclComm_t,
        cudaStream_t,
    ) -> ncclResult_t;
    // SAFETY: the caller's arguments, as given (NCCL's ncclBcast calls ncclBroadcast).
    if let Some(r) = on_fallback::<F>(comm, "ncclBroadcast", |f| unsafe {
        f(sendbuff, recvbuff, count, datatype, root, comm, stream)
    }) {
        return r;
    }
    guard("ncclBroadcast", || {
        let c = comm::lookup(comm)?;
        let dt = dtype_of(datatype)?;
        check_rank(&c, root, "root")?;
        let bytes = count
            .checked_mul(dt.size)
            .ok_or_else(|| Failure::new(types::INVALID_ARGUMENT, format!("count {count} overflows")))?;
        let (send, recv) = (sendbuff as usize, recvbuff as usize);
        if c.whole_fallback_comm() {
            type G = unsafe extern "C" fn(
                *const c_void,
                *mut c_void,
                usize,
                ncclDataType_t,
                c_int,
                *mut c_void,
                cudaStream_t,
            ) -> ncclResult_t;
            let st = stream as usize;
            forward(c, "ncclBroadcast".into(), move |lib, fc| {
                // SAFETY: NCCL's signature of ncclBroadcast.
                match unsafe { fallback_fn::<G>(lib, "ncclBroadcast") } {
                    // SAFETY: the caller's arguments, forwarded as given.
                    Ok(f) => unsafe {
                        f(send as *const c_void, recv as *mut c_void, count, datatype, root, fc, st as cudaStream_t)
                    },
                    Err(r) => r,
                }
            })?;
            return ok();
        }
        serve(c, stream, move |c, team, stream| {
            check(
                mcast_team_broadcast(team, c.rank, root, send as *const c_void, recv as *mut c_void, bytes, stream),
                "mcast_team_broadcast",
            )
        })?;
        ok()
    })
}

/// `ncclBcast`: in-place [`ncclBroadcast`].
#[no_mangle]
pub extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    ncclBroadcast(buff, buff, count, datatype, root, comm, stream)
}

/// `ncclReduce`: forwarded.
#[no_mangle]
pub extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard("ncclReduce", || {
        let c = comm::lookup(comm)?;
        dtype_of(datatype)?;
        op_of(op)?;
        check_rank(&c, root, "root")?;
        let (send, recv, stream) = (sendbuff as usize, recvbuff as usize, stream as usize);
        forward(c, "ncclReduce".into(), move |lib, fc| {
            type F = unsafe extern "C" fn(
                *const c_void,
                *mut c_void,
                usize,
                ncclDataType_t,
                ncclRedOp_t,
                c_int,
                *mut c_void,
                cudaStream_t,
            ) -> ncclResult_t;
            // SAFETY: NCCL's signature.
            match unsafe { fallback_fn::<F>(lib, "ncclReduce") } {
                // SAFETY: forwarded as given.
                Ok(f) => unsafe {
                    f(send as *const c_void, recv as *mut c_void, count, datatype, op, root, fc, stream as cudaStream_t)
                },
                Err(r) => r,
            }
        })?;
        ok()
    })
}

/// Forwards a call of NCCL's (send, recv, count, type, [root,] comm, stream) shape.
macro_rules! forwarded_movement {
    ($(#[$doc:meta])* $name:ident, root) => {
        $(#[$doc])*
        #[no_mangle]
        pub extern "C" fn $name(
            sendbuff: *const c_void,
            recvbuff: *mut c_void,
            count: usize,
            datatype: ncclDataType_t,
            root: c_int,
            comm: ncclComm_t,
            stream: cudaStream_t,
        ) -> ncclResult_t {
            guard(stringify!($name), || {
                let c = comm::lookup(comm)?;
                dtype_of(datatype)?;
                check_rank(&c, root, "root")?;
                let (send, recv, stream) = (sendbuff as usize, recvbuff as usize, stream as usize);
                forward(c, stringify!($name).into(), move |lib, fc| {
                    type F = unsafe extern "C" fn(*const c_void, *mut c_void, usize, ncclDataType_t, c_int, *mut c_void, cudaStream_t) -> ncclResult_t;
                    // SAFETY: NCCL's signature.
                    match unsafe { fallback_fn::<F>(lib, stringify!($name)) } {
                        // SAFETY: forwarded as given.
                        Ok(f) => unsafe { f(send as *const c_void, recv as *mut c_void, count, datatype, root, fc, stream as cudaStream_t) },
                        Err(r) => r,
                    }
                })?;
                ok()
            })
        }
    };
}

forwarded_movement!(
    /// `ncclGather`: forwarded.
    ncclGather, root
);
forwarded_movement!(
    /// `ncclScatter`: forwarded.
    ncclScatter, root
);

/// `ncclAlltoAll`: forwarded.
#[no_mangle]
pub extern "C" fn ncclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard("ncclAlltoAll", || {
        let c = comm::lookup(comm)?;
        dtype_of(datatype)?;
        let (send, recv, stream) = (sendbuff as usize, recvbuff as usize, stream as usize);
        forward(c, "ncclAlltoAll".into(), move |lib, fc| {
            type F = unsafe extern "C" fn(
                *const c_void,
                *mut c_void,
                usize,
                ncclDataType_t,
                *mut c_void,
                cudaStream_t,
            ) -> ncclResult_t;
            // SAFETY: NCCL's signature.
            match unsafe { fallback_fn::<F>(lib, "ncclAlltoAll") } {
                // SAFETY: forwarded as given.
                Ok(f) => unsafe {
                    f(send as *const c_void, recv as *mut c_void, count, datatype, fc, stream as cudaStream_t)
                },
                Err(r) => r,
            }
        })?;
        ok()
    })
}

/// `ncclSend` / `ncclRecv` forwarding.
fn point_to_point(
    name: &'static str,
    buff: usize,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Outcome<ncclResult_t> {
    let c = comm::lookup(comm)?;
    dtype_of(datatype)?;
    check_rank(&c, peer, "peer")?;
    let stream = stream as usize;
    forward(c, name.into(), move |lib, fc| {
        type F =
            unsafe extern "C" fn(*mut c_void, usize, ncclDataType_t, c_int, *mut c_void, cudaStream_t) -> ncclResult_t;
        // SAFETY: NCCL's signatures of ncclSend and ncclRecv have this shape (the buffer's
        // constness aside).
        match unsafe { fallback_fn::<F>(lib, name) } {
            // SAFETY: forwarded as given.
            Ok(f) => unsafe { f(buff as *mut c_void, count, datatype, peer, fc, stream as cudaStream_t) },
            Err(r) => r,
        }
    })?;
    ok()
}

/// `ncclSend`: forwarded.
#[no_mangle]
pub extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard("ncclSend", || point_to_point("ncclSend", sendbuff as usize, count, datatype, peer, comm, stream))
}

/// `ncclRecv`: forwarded.
#[no_mangle]
pub extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard("ncclRecv", || point_to_point("ncclRecv", recvbuff as usize, count, datatype, peer, comm, stream))
}

// ------------------------------------------------------------------------------------------
// Groups

/// `ncclGroupStart`.
#[no_mangle]
pub extern "C" fn ncclGroupStart() -> ncclResult_t {
    guard("ncclGroupStart", || {
        group::start();
        ok()
    })
}

/// `ncclGroupEnd`: runs the calls of the outermost group.
#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> ncclResult_t {
    guard("ncclGroupEnd", || {
        group::end()?;
        ok()
    })
}

/// `ncclGroupSimulateEnd`: not served.
#[no_mangle]
pub extern "C" fn ncclGroupSimulateEnd(_sim_info: *mut c_void) -> ncclResult_t {
    guard("ncclGroupSimulateEnd", || {
        Err(Failure::new(types::INVALID_USAGE, "ncclGroupSimulateEnd is not served by mcast_nccl"))
    })
}
