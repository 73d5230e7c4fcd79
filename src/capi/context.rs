//! `mcast_context_t`: creation, destruction and leak tracking.

use std::ffi::c_char;
use std::mem::size_of;
use std::sync::Arc;

use super::config::mcast_config_t;
use super::{guard, mcast_status_t, out_ptr};
use crate::runtime::config::Config;
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
