//! Memory the application owns: `mcast_mem_alloc` / `mcast_mem_free` (NCCL's `ncclMemAlloc`):
//! device memory any team holding that device can register with `mcast_buffer_register`.

use std::ffi::{c_int, c_void};

use super::context::mcast_context_t;
use super::{guard, mcast_status_t, out_ptr};
use crate::runtime::handles;

/// Allocates `bytes` of device memory on `device`, which any team holding that device can
/// register (`mcast_buffer_register`): physical memory created with the shareable handle types
/// this system exports (POSIX file descriptors, plus fabric handles where supported), rounded
/// up to the allocation granularity (and the multicast granularity where multicast is usable on
/// `device`) and mapped read-write for `device` at an address aligned to them. On the SIM
/// backend it is host memory of the simulated device. The
/// memory is not zeroed. Retried on out-of-memory like every allocation; nothing is left on
/// failure. On success `*ptr` holds the address, freed with `mcast_mem_free` (or at
/// `mcast_context_destroy`, which reports it as a leak). `MCAST_ERROR_INVALID_ARGUMENT`: `ptr`
/// NULL, `bytes` 0, `device` out of range; `MCAST_ERROR_INVALID_HANDLE`: `ctx`;
/// `MCAST_ERROR_OUT_OF_MEMORY`: device memory exhausted. Thread-safe.
///
/// # Safety
/// `ptr` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn mcast_mem_alloc(
    ctx: mcast_context_t,
    device: c_int,
    bytes: usize,
    ptr: *mut *mut c_void,
) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| write!(s, "mcast_mem_alloc bytes={bytes} device={device}"));
    guard("mcast_mem_alloc", || {
        // SAFETY: the caller passes NULL or a valid pointer.
        let out = unsafe { out_ptr(ptr, "ptr") }?;
        let c = handles::context(ctx.id)?;
        let addr = c.memory.alloc(&c, device, bytes)?;
        *out = addr as usize as *mut c_void;
        Ok(())
    })
}

/// Frees memory from `mcast_mem_alloc` of `ctx`, after the work in flight on its device. NULL
/// is a no-op returning `MCAST_SUCCESS`. `MCAST_ERROR_IN_USE` while a registered buffer lies in
/// it (free the buffer with `mcast_buffer_free` first); `MCAST_ERROR_INVALID_ARGUMENT` when
/// `ptr` is not the start of an allocation from `mcast_mem_alloc` of `ctx`, or was already
/// freed; `MCAST_ERROR_INVALID_HANDLE`: `ctx`. Thread-safe.
#[no_mangle]
pub extern "C" fn mcast_mem_free(ctx: mcast_context_t, ptr: *mut c_void) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| write!(s, "mcast_mem_free ptr={ptr:p}"));
    guard("mcast_mem_free", || {
        let c = handles::context(ctx.id)?;
        c.memory.free(&c, ptr as usize as u64)
    })
}
