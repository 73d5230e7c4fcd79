//! Devices: the driver version, device count, properties and attributes, NVLink fabric info
//! (from NVML), peer access and binding a thread to a device.

use std::ffi::{c_int, CStr};

use cudarc::driver::sys as cu;

use super::symbols::{check, not_supported};
use super::CudaDriver;
use crate::driver::{CuResult, DResult, Device, DeviceOps, DeviceProps, FabricInfo};

impl CudaDriver {
    /// `cuDeviceGetAttribute`.
    fn attribute(&self, device: cu::CUdevice, attr: cu::CUdevice_attribute) -> DResult<i32> {
        let mut value: c_int = 0;
        // SAFETY: the out-pointer is a local; `attr` is a valid attribute enumerator.
        check("cuDeviceGetAttribute", unsafe { (self.api.cuDeviceGetAttribute)(&mut value, attr, device) })?;
        Ok(value)
    }

    /// A boolean attribute; `CUDA_ERROR_INVALID_VALUE` (an attribute older drivers do not know)
    /// reads as unsupported.
    fn attribute_flag(&self, device: cu::CUdevice, attr: cu::CUdevice_attribute) -> DResult<bool> {
        match self.attribute(device, attr) {
            Ok(v) => Ok(v != 0),
            Err(e) if e.code == CuResult::ERROR_INVALID_VALUE => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl DeviceOps for CudaDriver {
    fn driver_version(&self) -> DResult<i32> {
        let mut version: c_int = 0;
        // SAFETY: the out-pointer is a local.
        check("cuDriverGetVersion", unsafe { (self.api.cuDriverGetVersion)(&mut version) })?;
        Ok(version)
    }

    fn device_count(&self) -> DResult<i32> {
        let mut count: c_int = 0;
        // SAFETY: the out-pointer is a local.
        check("cuDeviceGetCount", unsafe { (self.api.cuDeviceGetCount)(&mut count) })?;
        Ok(count)
    }

    fn device_props(&self, dev: Device) -> DResult<DeviceProps> {
        use cu::CUdevice_attribute as A;
        let device = self.cu_device(dev)?;
        let mut name = [0u8; 256];
        // SAFETY: the buffer is writable for its full length, which is what we pass.
        check("cuDeviceGetName", unsafe {
            (self.api.cuDeviceGetName)(name.as_mut_ptr().cast(), name.len() as c_int, device)
        })?;
        let name = match CStr::from_bytes_until_nul(&name) {
            Ok(s) => s.to_string_lossy().into_owned(),
            Err(_) => String::from_utf8_lossy(&name).into_owned(),
        };
        let mut total: usize = 0;
        // SAFETY: the out-pointer is a local; `device` came from `cuDeviceGet`.
        check("cuDeviceTotalMem", unsafe { (self.api.cuDeviceTotalMem_v2)(&mut total, device) })?;
        Ok(DeviceProps {
            name,
            cc_major: self.attribute(device, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            cc_minor: self.attribute(device, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            total_memory: total as u64,
            sm_count: self.attribute(device, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            multicast_supported: self.attribute_flag(device, A::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED)?,
            vmm_supported: self.attribute_flag(device, A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)?,
            posix_fd_supported: self
                .attribute_flag(device, A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)?,
            fabric_supported: self.attribute_flag(device, A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED)?,
            uuid: uuid(self, device)?,
            pci_bus_id: pci_bus_id(self, device),
        })
    }

    fn fabric_info(&self, dev: Device) -> DResult<FabricInfo> {
        Ok(super::nvml::fabric_info(&self.device_props(dev)?.uuid))
    }

    fn can_access_peer(&self, dev: Device, peer: Device) -> DResult<bool> {
        let a = self.cu_device(dev)?;
        let b = self.cu_device(peer)?;
        if a == b {
            return Ok(true);
        }
        let mut can: c_int = 0;
        // SAFETY: the out-pointer is a local; both devices came from `cuDeviceGet`.
        check("cuDeviceCanAccessPeer", unsafe { (self.api.cuDeviceCanAccessPeer)(&mut can, a, b) })?;
        Ok(can != 0)
    }

    fn bind_thread(&self, dev: Device) -> DResult<()> {
        let ctx = self.primary_ctx(dev)?;
        // SAFETY: `ctx` is a primary context this driver retained and has not released.
        check("cuCtxSetCurrent", unsafe { (self.api.cuCtxSetCurrent)(ctx) })
    }
}

/// `cuDeviceGetUuid_v2` where the driver has it (CUDA 11.4+: MIG instances get their own
/// UUID), else `cuDeviceGetUuid` (CUDA 9.2+).
fn uuid(drv: &CudaDriver, device: cu::CUdevice) -> DResult<[u8; 16]> {
    let (name, f) = match (drv.api.cuDeviceGetUuid_v2, drv.api.cuDeviceGetUuid) {
        (Some(f), _) => ("cuDeviceGetUuid_v2", f),
        (None, Some(f)) => ("cuDeviceGetUuid", f),
        (None, None) => return Err(not_supported("cuDeviceGetUuid")),
    };
    // SAFETY: CUuuid is 16 plain bytes; zeroed is a valid value.
    let mut out: cu::CUuuid = unsafe { std::mem::zeroed() };
    // SAFETY: the out-pointer is a local; `device` came from `cuDeviceGet`.
    check(name, unsafe { f(&mut out, device) })?;
    Ok(out.bytes.map(|b| b as u8))
}

/// `cuDeviceGetPCIBusId`, or `""` where the driver lacks it or fails.
fn pci_bus_id(drv: &CudaDriver, device: cu::CUdevice) -> String {
    let Some(f) = drv.api.cuDeviceGetPCIBusId else { return String::new() };
    let mut buf = [0u8; 32];
    // SAFETY: the buffer is writable for its full length, which is what we pass.
    if unsafe { f(buf.as_mut_ptr().cast(), buf.len() as c_int, device) } != CuResult::SUCCESS.0 {
        return String::new();
    }
    CStr::from_bytes_until_nul(&buf).map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}
