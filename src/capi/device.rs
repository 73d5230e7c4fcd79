//! Device queries.

use std::ffi::{c_char, c_int};
use std::mem::size_of;

use super::context::mcast_context_t;
use super::{copy_str, guard, mcast_status_t, out_ptr};
use crate::runtime::handles;

/// What a device is and whether multicast is usable on it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mcast_device_info_t {
    /// `sizeof(mcast_device_info_t)`, set by the caller.
    pub struct_size: u32,
    /// Device ordinal.
    pub ordinal: i32,
    /// Device name, NUL-terminated.
    pub name: [c_char; 96],
    /// Compute capability, major.
    pub cc_major: i32,
    /// Compute capability, minor.
    pub cc_minor: i32,
    /// Total device memory in bytes.
    pub total_memory: u64,
    /// What the driver reports (`CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`).
    pub multicast_supported: i32,
    /// After policy, kill switches and checks.
    pub multicast_usable: i32,
    /// Why not usable, or `""`.
    pub multicast_reason: [c_char; 160],
    /// Multicast granularity, MINIMUM. 0 where multicast is not usable on the device (see
    /// `multicast_reason`): off by `MCAST_MULTICAST=off` or the config, a site kill switch set
    /// (the driver is then not asked: no `cuMulticast*` call is made), no driver support; 0 also
    /// where the driver cannot report it.
    pub granularity_min: u64,
    /// Multicast granularity, RECOMMENDED (0 likewise).
    pub granularity_recommended: u64,
}

/// Writes the number of devices of `ctx` into `*count`. `MCAST_ERROR_INVALID_ARGUMENT`: `count`
/// NULL; `MCAST_ERROR_INVALID_HANDLE`: `ctx` not live. Thread-safe.
///
/// # Safety
/// `count` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn mcast_device_count(ctx: mcast_context_t, count: *mut c_int) -> mcast_status_t {
    guard("mcast_device_count", || {
        // SAFETY: the caller passes NULL or a valid pointer.
        let out = unsafe { out_ptr(count, "count") }?;
        *out = handles::context(ctx.id)?.device_count() as c_int;
        Ok(())
    })
}

/// Describes `device` of `ctx` in `*info`, whose `struct_size` the caller sets.
/// `MCAST_ERROR_INVALID_ARGUMENT`: `info` NULL, `struct_size` too small, `device` out of range;
/// `MCAST_ERROR_INVALID_HANDLE`: `ctx` not live. Thread-safe.
///
/// # Safety
/// `info` must be NULL or valid for reading and writing an `mcast_device_info_t`.
#[no_mangle]
pub unsafe extern "C" fn mcast_device_get_info(
    ctx: mcast_context_t,
    device: c_int,
    info: *mut mcast_device_info_t,
) -> mcast_status_t {
    guard("mcast_device_get_info", || {
        // SAFETY: the caller passes NULL or a valid pointer.
        let out = unsafe { out_ptr(info, "info") }?;
        super::check_struct_size(out.struct_size, size_of::<mcast_device_info_t>(), "mcast_device_info_t")?;
        let d = handles::context(ctx.id)?.device_info(device)?;
        let mut v = mcast_device_info_t {
            struct_size: out.struct_size,
            ordinal: d.ordinal,
            name: [0; 96],
            cc_major: d.props.cc_major,
            cc_minor: d.props.cc_minor,
            total_memory: d.props.total_memory,
            multicast_supported: i32::from(d.props.multicast_supported),
            multicast_usable: i32::from(d.multicast_usable),
            multicast_reason: [0; 160],
            granularity_min: d.granularity_min,
            granularity_recommended: d.granularity_recommended,
        };
        copy_str(&mut v.name, &d.props.name);
        copy_str(&mut v.multicast_reason, &d.multicast_reason);
        *out = v;
        Ok(())
    })
}

/// Writes 1 into `*can` when `device` can access `peer`'s memory (always for itself), else 0.
/// `MCAST_ERROR_INVALID_ARGUMENT`: `can` NULL or a device out of range;
/// `MCAST_ERROR_INVALID_HANDLE`: `ctx` not live. Thread-safe.
///
/// # Safety
/// `can` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn mcast_device_can_access_peer(
    ctx: mcast_context_t,
    device: c_int,
    peer: c_int,
    can: *mut c_int,
) -> mcast_status_t {
    guard("mcast_device_can_access_peer", || {
        // SAFETY: the caller passes NULL or a valid pointer.
        let out = unsafe { out_ptr(can, "can") }?;
        *out = c_int::from(handles::context(ctx.id)?.can_access_peer(device, peer)?);
        Ok(())
    })
}
