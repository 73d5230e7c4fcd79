//! Memory, registration and windows: `ncclMemAlloc`/`ncclMemFree`, `ncclCommRegister`/
//! `ncclCommDeregister`, `ncclCommWindowRegister`/`ncclCommWindowDeregister`.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::comm::{self, Comm};
use crate::fallback;
use crate::group::{self, Op};
use crate::process::{self, ContextRef};
use crate::types::{self, check, ncclResult_t, Failure, Outcome};

use super::{guard, ncclComm_t, ok, on_fallback, out, LAST_DEVICE};

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
        let ctx = process::acquire_context()?;
        let device = if ctx.sim {
            match LAST_DEVICE.with(|d| d.get()) {
                Some(d) => Ok(d),
                None => process::current_device(&ctx, 0),
            }
        } else {
            process::current_device(&ctx, 0)
        };
        let mut p: *mut c_void = std::ptr::null_mut();
        let made = device.and_then(|d| {
            // SAFETY: a valid out-pointer.
            check(unsafe { mcast::capi::memory::mcast_mem_alloc(ctx.ctx, d, size, &mut p) }, "mcast_mem_alloc")
        });
        if let Err(f) = made {
            process::release_context();
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
                let detail = fallback::last_error(lib);
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
        process::release_context();
        ok()
    })
}

/// Registers `[buff, buff + size)` on `c` in one blocking collective step and writes the
/// registration's handle to `handle`, an out-pointer already checked: what `ncclCommRegister`
/// and `ncclCommWindowRegister` do once their own arguments are checked.
fn register(c: Arc<Comm>, buff: *mut c_void, size: usize, handle: *mut *mut c_void) -> Outcome {
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
        register(c, buff, size, handle)?;
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
        register(c, buff, size, win)?;
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
