//! Versions, unique ids and errors: `ncclGetVersion`, `ncclGetUniqueId`, `ncclGetErrorString`,
//! `ncclGetLastError`, `ncclCommGetAsyncError`.

use std::ffi::{c_char, c_int, CStr};
use std::sync::atomic::Ordering;

use mcast::capi::status::mcast_last_error;
use mcast::capi::team::{mcast_get_unique_id, mcast_team_get_error, mcast_unique_id_t};

use crate::comm;
use crate::fallback;
use crate::types::{self, check, ncclResult_t, ncclUniqueId, Failure};

use super::{fallback_fn, guard, ncclComm_t, ok, on_fallback, out, set_last_error, LAST_ERROR};

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
    if let Some(lib) = fallback::foreign(comm) {
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
        if e.0 != 0 {
            // The reason, for this thread's ncclGetLastError (what a watchdog prints beside the
            // result) and once in the log at `warn`.
            // SAFETY: never NULL, NUL-terminated; mcast_team_get_error just set it.
            let why = unsafe { CStr::from_ptr(mcast_last_error()) }.to_string_lossy().into_owned();
            let message = format!("rank {} of {}: {why}", c.rank, c.nranks);
            if !c.async_logged.swap(true, Ordering::Relaxed) {
                mcast::logging::init();
                tracing::warn!("mcast_nccl: ncclCommGetAsyncError: {message}");
            }
            set_last_error(&message);
        }
        ok()
    })
}
