//! The real CUDA driver, loaded at run time through `cudarc::driver::sys`.
//!
//! # Loading never panics
//!
//! cudarc's dynamic-loading wrappers panic when `libcuda` or one of their symbols is missing, and
//! they return `CUresult` as a Rust enum, which is undefined behaviour for a code newer than the
//! bindings. This backend therefore calls none of them: [`CudaDriver::load`] first asks
//! [`library_present`] (cudarc's `is_culib_present`), then looks every entry point up in cudarc's
//! `culib()` by its exact exported name, and keeps plain function pointers whose return type is
//! the raw `CUresult` integer. The argument types are cudarc's `sys` types, so the signatures are
//! those of the CUDA 13.0 headers.
//!
//! - Every name in [`REQUIRED_SYMBOLS`] must exist, else `load` fails with
//!   `DriverError { func: <that symbol>, code: CUDA_ERROR_NOT_FOUND }`.
//! - The names in [`OPTIONAL_SYMBOLS`] (the multicast API, the `_v2` binds, the two forms of
//!   `cuEventElapsedTime`, stream capture and CUDA graphs) are recorded when present; calling one that is absent returns
//!   `CUDA_ERROR_NOT_SUPPORTED` from that function, without calling anything.
//! - No library: [`LIBRARY_ABSENT`] (`cuInit` / `CUDA_ERROR_NOT_INITIALIZED`). No device:
//!   `cuInit` or `cuDeviceGetCount` with `CUDA_ERROR_NO_DEVICE`.
//!
//! # Contexts
//!
//! Each device's primary context (the one the CUDA runtime uses) is retained once, lazily, and
//! released on drop. A call that takes a [`Device`] pushes that context and pops it afterwards,
//! on every path, so the caller's current context is left as it was. Calls without a device
//! (address reservations, mappings, multicast objects) run in the caller's current context, or,
//! when there is none, in device 0's primary context (best effort: if that fails the call is
//! made anyway and reports its own error).
//!
//! Errors name the CUDA API function as written in C (`cuMemcpyHtoD`, `cuStreamDestroy`), not
//! the ABI-versioned symbol behind it (`cuMemcpyHtoD_v2`, `cuStreamDestroy_v2`); the distinct
//! `_v2` APIs (`cuMulticastBindMem_v2`, `cuMulticastBindAddr_v2`) keep their suffix.
//!
//! Where things live: one file per family of [`Driver`] calls, each implementing its trait:
//! `device.rs` ([`DeviceOps`]: device queries), `memory.rs` ([`MemoryOps`]: allocations and
//! mappings), `copy.rs` ([`CopyOps`]: copies), `multicast.rs` ([`MulticastOps`]: multicast
//! objects), `exec.rs` ([`ExecOps`]: streams, events, graphs and launch); beside them
//! `symbols.rs` the entry-point table and the `CUresult` checks, `context.rs` primary contexts,
//! `nvml.rs` NVML's fabric info; this file holds the loader.

mod context;
mod copy;
mod device;
mod exec;
mod memory;
mod multicast;
mod nvml;
mod symbols;

#[cfg(test)]
mod tests;

use std::ffi::c_void;
use std::sync::OnceLock;

use cudarc::driver::sys as cu;
use parking_lot::Mutex;

pub use symbols::{OPTIONAL_SYMBOLS, REQUIRED_SYMBOLS};

#[cfg(doc)]
use super::{CopyOps, Device, ExecOps, MemoryOps, MulticastOps};
use super::{CuResult, DResult, DeviceOps, Driver, DriverError};

use symbols::{check, Api};

/// The error [`CudaDriver::load`] returns when no CUDA driver library can be loaded
/// (`libcuda.so`, `libcuda.so.1`, ... as cudarc searches them). The runtime reports it as
/// `MCAST_ERROR_DRIVER_UNAVAILABLE`.
pub const LIBRARY_ABSENT: DriverError = DriverError { func: "cuInit", code: CuResult::ERROR_NOT_INITIALIZED };

/// True when a CUDA driver library (`libcuda`) can be loaded on this machine.
///
/// This says nothing about devices; [`CudaDriver::load`] checks those.
pub fn library_present() -> bool {
    // SAFETY: `is_culib_present` only tries to dlopen the CUDA driver library under cudarc's
    // candidate names and closes it again; loading the system driver library runs its own
    // initialisers, which is what every CUDA program does.
    unsafe { cu::is_culib_present() }
}

/// What the dynamic loader says when asked for `libcuda.so.1` (its `dlerror` text, such as
/// "libcuda.so.1: cannot open shared object file: No such file or directory"), for the
/// message that says why there is no CUDA backend; `None` when it loads.
pub fn library_error() -> Option<String> {
    // SAFETY: dlopen of the driver library with a NUL-terminated name, closed again at once
    // (what `library_present` does); dlerror's text is read before any other dl call on this
    // thread.
    unsafe {
        let handle = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if !handle.is_null() {
            libc::dlclose(handle);
            return None;
        }
        let text = libc::dlerror();
        Some(if text.is_null() {
            "libcuda.so.1 not found".to_string()
        } else {
            std::ffi::CStr::from_ptr(text).to_string_lossy().into_owned()
        })
    }
}
/// A primary context retained by this driver.
#[derive(Clone, Copy)]
struct Retained {
    /// The `CUdevice` it belongs to.
    device: cu::CUdevice,
    /// The `CUcontext`, as an address (so the table is `Send`).
    ctx: usize,
}

/// The CUDA driver, loaded at run time. Thread-safe.
pub struct CudaDriver {
    api: Api,
    /// Primary contexts retained so far, one slot per device ordinal (`0..cuDeviceGetCount`):
    /// set once, then read with one atomic load by every call that takes a device (the launch
    /// path included), no lock, no hashing.
    contexts: Box<[OnceLock<Retained>]>,
    /// Serialises the retains (first use of each device).
    retaining: Mutex<()>,
}

impl CudaDriver {
    /// Loads the CUDA driver library, resolves its entry points and calls `cuInit(0)`.
    ///
    /// Never panics. Errors: [`LIBRARY_ABSENT`] when no driver library loads; a missing
    /// required symbol as `CUDA_ERROR_NOT_FOUND` with the symbol's name in `func`; `cuInit`'s
    /// own failure (e.g. `CUDA_ERROR_NO_DEVICE`, `CUDA_ERROR_STUB_LIBRARY`); and
    /// `cuDeviceGetCount` with `CUDA_ERROR_NO_DEVICE` when it counts no device.
    pub fn load() -> DResult<CudaDriver> {
        if !library_present() {
            return Err(LIBRARY_ABSENT);
        }
        // SAFETY: `culib()` panics only when no candidate library loads; we just checked that
        // one does (cudarc searches the same names in the same order).
        let lib = unsafe { cu::culib() };
        let lookup = |name: &'static str| -> Option<*mut c_void> {
            // SAFETY: reading a symbol's address does not call it; the type `*mut c_void` is
            // the symbol's address itself, converted to its real signature by `Api::resolve`.
            unsafe { lib.get::<*mut c_void>(name).ok().map(|sym| *sym) }
        };
        let api = Api::resolve(&lookup).map_err(|name| DriverError::new(name, CuResult::ERROR_NOT_FOUND))?;
        if api.cuEventElapsedTime_v2.is_none() && api.cuEventElapsedTime.is_none() {
            return Err(DriverError::new("cuEventElapsedTime", CuResult::ERROR_NOT_FOUND));
        }
        // SAFETY: `cuInit` takes flags by value; 0 is the only valid value.
        check("cuInit", unsafe { (api.cuInit)(0) })?;
        let mut driver = CudaDriver { api, contexts: Box::new([]), retaining: Mutex::new(()) };
        let count = driver.device_count()?;
        if count <= 0 {
            return Err(DriverError::new("cuDeviceGetCount", CuResult::ERROR_NO_DEVICE));
        }
        driver.contexts = (0..count).map(|_| OnceLock::new()).collect();
        let missing = driver.api.missing_optional();
        if !missing.is_empty() {
            tracing::debug!(?missing, "CUDA driver lacks optional entry points");
        }
        Ok(driver)
    }

    /// The optional symbols (see [`OPTIONAL_SYMBOLS`]) this driver does not export.
    pub fn missing_optional_symbols(&self) -> Vec<&'static str> {
        self.api.missing_optional()
    }
}

impl Drop for CudaDriver {
    fn drop(&mut self) {
        for r in self.contexts.iter_mut().filter_map(OnceLock::take) {
            // SAFETY: each entry was retained exactly once by `primary_ctx`. At process exit
            // the driver may already be torn down and return `CUDA_ERROR_DEINITIALIZED`:
            // there is nothing left to release then, so the result is ignored.
            let _ = unsafe { (self.api.cuDevicePrimaryCtxRelease_v2)(r.device) };
        }
    }
}

/// The families of calls are implemented in their files (see the module documentation).
impl Driver for CudaDriver {
    fn backend_name(&self) -> &'static str {
        "cuda"
    }
}
