//! Multicast objects: granularity, create, add device, the four binds and unbind. The whole
//! multicast API is optional: a driver without it answers `CUDA_ERROR_NOT_SUPPORTED`.

use cudarc::driver::sys as cu;

use super::symbols::{check, not_supported};
use super::CudaDriver;
use crate::driver::{DResult, Device, DevicePtr, Granularity, MemHandle, MulticastOps, MulticastProp};

/// `CUmulticastObjectProp` of `prop`.
pub(super) fn multicast_prop(prop: &MulticastProp) -> cu::CUmulticastObjectProp {
    cu::CUmulticastObjectProp {
        numDevices: prop.num_devices,
        size: prop.size,
        handleTypes: u64::from(prop.handle_types.0),
        flags: prop.flags,
    }
}

impl MulticastOps for CudaDriver {
    fn has_multicast_api(&self) -> bool {
        let a = &self.api;
        a.cuMulticastCreate.is_some()
            && a.cuMulticastAddDevice.is_some()
            && a.cuMulticastBindMem.is_some()
            && a.cuMulticastBindAddr.is_some()
            && a.cuMulticastUnbind.is_some()
            && a.cuMulticastGetGranularity.is_some()
    }

    fn has_multicast_bind_v2(&self) -> bool {
        self.api.cuMulticastBindMem_v2.is_some() && self.api.cuMulticastBindAddr_v2.is_some()
    }

    fn multicast_granularity(&self, prop: &MulticastProp, option: Granularity) -> DResult<usize> {
        let f = self.api.cuMulticastGetGranularity.ok_or(not_supported("cuMulticastGetGranularity"))?;
        let prop = multicast_prop(prop);
        let option = match option {
            Granularity::Minimum => cu::CUmulticastGranularity_flags::CU_MULTICAST_GRANULARITY_MINIMUM,
            Granularity::Recommended => cu::CUmulticastGranularity_flags::CU_MULTICAST_GRANULARITY_RECOMMENDED,
        };
        let _ctx = self.enter_any();
        let mut granularity: usize = 0;
        // SAFETY: `prop` and the out-pointer are locals that outlive the call.
        check("cuMulticastGetGranularity", unsafe { f(&mut granularity, &prop, option) })?;
        Ok(granularity)
    }

    fn multicast_create(&self, prop: &MulticastProp) -> DResult<MemHandle> {
        let f = self.api.cuMulticastCreate.ok_or(not_supported("cuMulticastCreate"))?;
        let prop = multicast_prop(prop);
        let _ctx = self.enter_any();
        let mut handle: cu::CUmemGenericAllocationHandle = 0;
        // SAFETY: `prop` and the out-pointer are locals that outlive the call.
        check("cuMulticastCreate", unsafe { f(&mut handle, &prop) })?;
        Ok(MemHandle(handle))
    }

    fn multicast_add_device(&self, mc: MemHandle, dev: Device) -> DResult<()> {
        let f = self.api.cuMulticastAddDevice.ok_or(not_supported("cuMulticastAddDevice"))?;
        let device = self.cu_device(dev)?;
        let _ctx = self.enter_any();
        // SAFETY: plain values; the driver validates the handle and device.
        check("cuMulticastAddDevice", unsafe { f(mc.0, device) })
    }

    fn multicast_bind_mem(
        &self,
        mc: MemHandle,
        mc_offset: usize,
        mem: MemHandle,
        mem_offset: usize,
        size: usize,
        flags: u64,
    ) -> DResult<()> {
        let f = self.api.cuMulticastBindMem.ok_or(not_supported("cuMulticastBindMem"))?;
        let _ctx = self.enter_any();
        // SAFETY: plain values; the driver validates handles, offsets and flags.
        check("cuMulticastBindMem", unsafe { f(mc.0, mc_offset, mem.0, mem_offset, size, flags) })
    }

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
    ) -> DResult<()> {
        let f = self.api.cuMulticastBindMem_v2.ok_or(not_supported("cuMulticastBindMem_v2"))?;
        let device = self.cu_device(dev)?;
        let _ctx = self.enter_any();
        // SAFETY: plain values; the driver validates handles, device, offsets and flags.
        check("cuMulticastBindMem_v2", unsafe { f(mc.0, device, mc_offset, mem.0, mem_offset, size, flags) })
    }

    fn multicast_bind_addr(
        &self,
        mc: MemHandle,
        mc_offset: usize,
        ptr: DevicePtr,
        size: usize,
        flags: u64,
    ) -> DResult<()> {
        let f = self.api.cuMulticastBindAddr.ok_or(not_supported("cuMulticastBindAddr"))?;
        let _ctx = self.enter_any();
        // SAFETY: plain values; the driver validates the handle, address range and flags.
        check("cuMulticastBindAddr", unsafe { f(mc.0, mc_offset, ptr, size, flags) })
    }

    fn multicast_bind_addr_v2(
        &self,
        mc: MemHandle,
        dev: Device,
        mc_offset: usize,
        ptr: DevicePtr,
        size: usize,
        flags: u64,
    ) -> DResult<()> {
        let f = self.api.cuMulticastBindAddr_v2.ok_or(not_supported("cuMulticastBindAddr_v2"))?;
        let device = self.cu_device(dev)?;
        let _ctx = self.enter_any();
        // SAFETY: plain values; the driver validates the handle, device, address range and flags.
        check("cuMulticastBindAddr_v2", unsafe { f(mc.0, device, mc_offset, ptr, size, flags) })
    }

    fn multicast_unbind(&self, mc: MemHandle, dev: Device, mc_offset: usize, size: usize) -> DResult<()> {
        let f = self.api.cuMulticastUnbind.ok_or(not_supported("cuMulticastUnbind"))?;
        let device = self.cu_device(dev)?;
        let _ctx = self.enter_any();
        // SAFETY: plain values; the driver validates the handle, device and range.
        check("cuMulticastUnbind", unsafe { f(mc.0, device, mc_offset, size) })
    }
}
