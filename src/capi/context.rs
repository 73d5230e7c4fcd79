//! `mcast_context_t`: creation, destruction and leak tracking.

use std::ffi::c_char;
use std::mem::size_of;
use std::sync::Arc;

use super::config::{mcast_backend_t, mcast_config_t, McastBackend};
use super::{copy_str, guard, mcast_status_t, out_ptr, write_versioned};
use crate::runtime::config::{Backend, Config};
use crate::runtime::context::Context;
use crate::runtime::handles;

/// A context: one backend (CUDA or simulated) and everything created in it. Passed by value;
/// id 0 is never valid.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct mcast_context_t {
    /// Opaque id.
    pub id: u64,
}

/// Live objects of a context.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct mcast_live_counts_t {
    /// `sizeof(mcast_live_counts_t)`, set by the caller.
    pub struct_size: u32,
    /// Teams.
    pub teams: u64,
    /// Buffers.
    pub buffers: u64,
    /// Multicast objects.
    pub multicast_objects: u64,
    /// Physical allocations (`cuMemCreate`).
    pub physical_allocations: u64,
    /// Mappings (unicast, peer and multicast).
    pub mappings: u64,
    /// Address reservations.
    pub reservations: u64,
    /// Physical bytes held, all devices.
    pub device_bytes: u64,
}

/// What a context runs on (`mcast_context_get_info`): print it, or refuse to run on the
/// simulator where a GPU was expected.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mcast_context_info_t {
    /// `sizeof(mcast_context_info_t)`, set by the caller.
    pub struct_size: u32,
    /// The backend in use: `MCAST_BACKEND_CUDA` or `MCAST_BACKEND_SIM`, never
    /// `MCAST_BACKEND_AUTO` (AUTO is resolved at creation).
    pub backend: mcast_backend_t,
    /// Why that backend, NUL-terminated: `"backend SIM requested"`, `"a CUDA driver and a
    /// device were found"`, or, where AUTO fell back to the simulator, what was missing (the
    /// driver library that could not be loaded and the loader's message, or no device).
    pub backend_reason: [c_char; 256],
    /// Devices of the context, as `mcast_device_count` gives them.
    pub device_count: i32,
    /// The CUDA driver's version as `cuDriverGetVersion` gives it (13000 for 13.0); on the
    /// simulator, the version it stands for; 0 where the driver cannot say.
    pub driver_version: i32,
}

/// Creates a context. `config` NULL means the result of `mcast_config_init`. On success
/// `*out` holds the new context, which the caller destroys with `mcast_context_destroy`; on
/// failure `*out` is untouched. `MCAST_ERROR_INVALID_ARGUMENT`: `out` NULL, a bad
/// `struct_size`, an unknown enum value in `config`, or a field out of its range (the message
/// names the field, its range and its variable; `sim_devices` and `sim_device_memory` are
/// checked only where the backend may be the simulator, not with `MCAST_BACKEND_CUDA`), or a
/// malformed `MCAST_SIM_FAULTS` on the simulator;
/// `MCAST_ERROR_DRIVER_UNAVAILABLE`:
/// backend CUDA asked for and no driver or device. Thread-safe.
///
/// # Safety
/// `config` must be NULL or point to an `mcast_config_t`; `out` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn mcast_context_create(
    config: *const mcast_config_t,
    out: *mut mcast_context_t,
) -> mcast_status_t {
    guard("mcast_context_create", || {
        // SAFETY: the caller passes NULL or a valid pointer.
        let out = unsafe { out_ptr(out, "out") }?;
        // SAFETY: the caller passes NULL or a valid pointer.
        let config = match unsafe { config.as_ref() } {
            Some(c) => c.to_config()?,
            None => Config::from_env(),
        };
        let ctx = Arc::new(Context::new(config)?);
        *out = mcast_context_t { id: handles::insert_context(ctx) };
        Ok(())
    })
}

/// Destroys a context: waits for outstanding work, releases every team and buffer still alive
/// in the right order (their handles become invalid), logs a leak report at warn level if
/// anything was left, and returns `MCAST_SUCCESS` (a leak is reported, not fatal). The zero
/// handle is a no-op returning `MCAST_SUCCESS`; a destroyed or unknown handle gives
/// `MCAST_ERROR_INVALID_HANDLE`. Thread-safe, but no other call may use the context's objects
/// meanwhile.
#[no_mangle]
pub extern "C" fn mcast_context_destroy(ctx: mcast_context_t) -> mcast_status_t {
    guard("mcast_context_destroy", || {
        if ctx.id == 0 {
            return Ok(());
        }
        let context = handles::remove_context(ctx.id)?;
        let leaks = context.shutdown();
        if !leaks.is_empty() {
            tracing::warn!("mcast_context_destroy: released what the program left alive:\n{}", leaks.trim_end());
        }
        Ok(())
    })
}

/// Writes the counts of live teams, buffers and driver resources of `ctx` into `*counts`,
/// whose `struct_size` the caller sets. `MCAST_ERROR_INVALID_ARGUMENT`: `counts` NULL or
/// `struct_size` too small; `MCAST_ERROR_INVALID_HANDLE`: `ctx` not live. Thread-safe.
///
/// # Safety
/// `counts` must be NULL or valid for reading and writing `counts->struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn mcast_context_live_counts(
    ctx: mcast_context_t,
    counts: *mut mcast_live_counts_t,
) -> mcast_status_t {
    guard("mcast_context_live_counts", || {
        // SAFETY: the caller passes NULL or a valid pointer.
        let out = unsafe { out_ptr(counts, "counts") }?;
        super::check_struct_size(out.struct_size, size_of::<mcast_live_counts_t>(), "mcast_live_counts_t")?;
        let c = handles::context(ctx.id)?.live_counts();
        *out = mcast_live_counts_t {
            struct_size: out.struct_size,
            teams: c.teams,
            buffers: c.buffers,
            multicast_objects: c.resources.multicast_objects,
            physical_allocations: c.resources.physical_allocations,
            mappings: c.resources.mappings,
            reservations: c.resources.reservations,
            device_bytes: c.resources.device_bytes,
        };
        Ok(())
    })
}

/// Writes a NUL-terminated report of what `ctx` holds — one line per live team and per live
/// driver resource: kind, size, device, owner and where it was created — into `buf`,
/// truncating to `len - 1` characters, and returns the length the full report needs (without
/// the NUL), like `snprintf`. `buf` may be NULL when `len` is 0. An invalid `ctx` writes `""`,
/// returns 0 and sets `mcast_last_error`. Thread-safe.
///
/// # Safety
/// `buf` must be NULL or valid for writing `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn mcast_context_leak_report(ctx: mcast_context_t, buf: *mut c_char, len: usize) -> usize {
    let mut report = String::new();
    let _ = guard("mcast_context_leak_report", || {
        let context = handles::context(ctx.id)?;
        for team in context.teams() {
            report.push_str(&format!(
                "team: {} rank(s) on devices {:?}, {} live buffer(s)\n",
                team.size(),
                team.devices(),
                team.live_buffers()
            ));
        }
        report.push_str(&context.resources.report());
        Ok(())
    });
    if !buf.is_null() && len > 0 {
        let n = report.len().min(len - 1);
        // SAFETY: `buf` is valid for `len` bytes and `n < len`.
        unsafe {
            std::ptr::copy_nonoverlapping(report.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
    report.len()
}

/// Describes `ctx` in `*info`: the backend in use and why, the device count and the driver
/// version. The caller sets `struct_size` to `sizeof(mcast_context_info_t)`; fields a later
/// version appends are written only up to the caller's `struct_size`.
/// `MCAST_ERROR_INVALID_ARGUMENT`: `info` NULL or `struct_size` too small;
/// `MCAST_ERROR_INVALID_HANDLE`: `ctx` not live. Thread-safe.
///
/// # Safety
/// `info` must be NULL or valid for reading and writing `info->struct_size` bytes (at most
/// `sizeof(mcast_context_info_t)` are written).
#[no_mangle]
pub unsafe extern "C" fn mcast_context_get_info(
    ctx: mcast_context_t,
    info: *mut mcast_context_info_t,
) -> mcast_status_t {
    guard("mcast_context_get_info", || {
        let fill = |struct_size| {
            let context = handles::context(ctx.id)?;
            let (backend, reason) = context.backend();
            let backend = match backend {
                Backend::Sim => McastBackend::MCAST_BACKEND_SIM,
                Backend::Cuda => McastBackend::MCAST_BACKEND_CUDA,
                Backend::Auto => McastBackend::MCAST_BACKEND_AUTO,
            };
            let mut v = mcast_context_info_t {
                struct_size,
                backend: mcast_backend_t(backend as u32),
                backend_reason: [0; 256],
                device_count: context.device_count() as i32,
                driver_version: context.driver().driver_version().unwrap_or(0),
            };
            copy_str(&mut v.backend_reason, reason);
            Ok(v)
        };
        // SAFETY: the caller passes NULL or a pointer valid for `struct_size` bytes.
        unsafe { write_versioned(info, size_of::<mcast_context_info_t>(), "mcast_context_info_t", fill) }
    })
}
