//! Device queries.

use std::ffi::{c_char, c_int};

use super::context::mcast_context_t;
use super::{copy_str, guard, mcast_status_t, out_ptr, write_versioned};
use crate::driver::FabricState;
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
    /// The GPU's UUID (`cuDeviceGetUuid`): the same in every process that sees the GPU,
    /// whatever its ordinal there. Appended with the fields below; a `struct_size` of
    /// the earlier struct (up to `granularity_recommended`) is still accepted and filled up to
    /// its size.
    pub uuid: [u8; 16],
    /// PCI bus id (`cuDeviceGetPCIBusId`), NUL-terminated: `"0000:18:00.0"`; `""` where the
    /// driver cannot say.
    pub pci_bus_id: [c_char; 16],
    /// The NVLink fabric's cluster UUID (NVML GPU fabric info); zeros where none.
    pub fabric_cluster_uuid: [u8; 16],
    /// The clique (NVLink partition) in that cluster; 0 where none.
    pub fabric_clique_id: u32,
    /// `mcast_fabric_state_t`: `MCAST_FABRIC_NONE`, `MCAST_FABRIC_IN_PROGRESS` or
    /// `MCAST_FABRIC_COMPLETED`.
    pub fabric_state: i32,
}

/// Where a GPU stands in a multi-node NVLink fabric (`mcast_device_info_t.fabric_state`);
/// `mcast_fabric_state_t` in C.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum McastFabricState {
    /// No NVLink fabric: NVML absent, no fabric support, or the fabric manager not running.
    MCAST_FABRIC_NONE = 0,
    /// The fabric manager is still registering the GPU.
    MCAST_FABRIC_IN_PROGRESS = 1,
    /// Registered: the cluster UUID and clique id are valid.
    MCAST_FABRIC_COMPLETED = 2,
}

/// The size of the first version of `mcast_device_info_t` (before `uuid`).
const DEVICE_INFO_V1: usize = std::mem::offset_of!(mcast_device_info_t, uuid);

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

/// Describes `device` of `ctx` in `*info`, whose `struct_size` the caller sets: at least the
/// size of the struct's first version (up to `granularity_recommended`); the first
/// `struct_size` bytes are filled (all of them for `sizeof(mcast_device_info_t)`).
/// `MCAST_ERROR_INVALID_ARGUMENT`: `info` NULL, `struct_size` too small, `device` out of range;
/// `MCAST_ERROR_INVALID_HANDLE`: `ctx` not live. Thread-safe.
///
/// # Safety
/// `info` must be NULL or valid for reading and writing `info->struct_size` bytes (at most
/// `sizeof(mcast_device_info_t)` are written).
#[no_mangle]
pub unsafe extern "C" fn mcast_device_get_info(
    ctx: mcast_context_t,
    device: c_int,
    info: *mut mcast_device_info_t,
) -> mcast_status_t {
    guard("mcast_device_get_info", || {
        let fill = |struct_size| {
            let d = handles::context(ctx.id)?.device_info(device)?;
            let mut v = mcast_device_info_t {
                struct_size,
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
                uuid: d.props.uuid,
                pci_bus_id: [0; 16],
                fabric_cluster_uuid: d.fabric.cluster_uuid,
                fabric_clique_id: d.fabric.clique_id,
                fabric_state: match d.fabric.state {
                    FabricState::None => McastFabricState::MCAST_FABRIC_NONE,
                    FabricState::InProgress => McastFabricState::MCAST_FABRIC_IN_PROGRESS,
                    FabricState::Completed => McastFabricState::MCAST_FABRIC_COMPLETED,
                } as i32,
            };
            copy_str(&mut v.name, &d.props.name);
            copy_str(&mut v.multicast_reason, &d.multicast_reason);
            copy_str(&mut v.pci_bus_id, &d.props.pci_bus_id);
            Ok(v)
        };
        // SAFETY: the caller passes NULL or a pointer to its struct of struct_size bytes.
        unsafe { write_versioned(info, DEVICE_INFO_V1, "mcast_device_info_t", fill) }
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
