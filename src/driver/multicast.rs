//! Multicast objects: whether the driver has them, their granularity, creation, devices, binds
//! and unbinds.

use super::{DResult, Device, DevicePtr, Granularity, MemHandle, MulticastProp};

/// Multicast objects (`cuMulticast*`). Part of [`super::Driver`].
pub trait MulticastOps {
    /// True when the driver exports the multicast entry points
    /// (`cuMulticastCreate`, `AddDevice`, `BindMem`, `BindAddr`, `Unbind`, `GetGranularity`).
    fn has_multicast_api(&self) -> bool;

    /// True when the driver exports `cuMulticastBindMem_v2` and `cuMulticastBindAddr_v2`.
    fn has_multicast_bind_v2(&self) -> bool;

    /// `cuMulticastGetGranularity`.
    fn multicast_granularity(&self, prop: &MulticastProp, option: Granularity) -> DResult<usize>;

    /// `cuMulticastCreate`.
    fn multicast_create(&self, prop: &MulticastProp) -> DResult<MemHandle>;

    /// `cuMulticastAddDevice`.
    fn multicast_add_device(&self, mc: MemHandle, dev: Device) -> DResult<()>;

    /// `cuMulticastBindMem`.
    fn multicast_bind_mem(
        &self,
        mc: MemHandle,
        mc_offset: usize,
        mem: MemHandle,
        mem_offset: usize,
        size: usize,
        flags: u64,
    ) -> DResult<()>;

    /// `cuMulticastBindMem_v2` (binding applicable for `dev`).
    #[allow(clippy::too_many_arguments)]
    fn multicast_bind_mem_v2(
        &self,
        mc: MemHandle,
        dev: Device,
        mc_offset: usize,
        mem: MemHandle,
        mem_offset: usize,
        size: usize,
        flags: u64,
    ) -> DResult<()>;

    /// `cuMulticastBindAddr`.
    fn multicast_bind_addr(
        &self,
        mc: MemHandle,
        mc_offset: usize,
        ptr: DevicePtr,
        size: usize,
        flags: u64,
    ) -> DResult<()>;

    /// `cuMulticastBindAddr_v2`.
    fn multicast_bind_addr_v2(
        &self,
        mc: MemHandle,
        dev: Device,
        mc_offset: usize,
        ptr: DevicePtr,
        size: usize,
        flags: u64,
    ) -> DResult<()>;

    /// `cuMulticastUnbind`.
    fn multicast_unbind(&self, mc: MemHandle, dev: Device, mc_offset: usize, size: usize) -> DResult<()>;
}
