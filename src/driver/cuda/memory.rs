//! Memory: physical allocations (`cuMemCreate`, release, export and import), address
//! reservations, mappings and access, pointer queries and plain `cuMemAlloc` memory.

use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::ptr;

use cudarc::driver::sys as cu;

use super::symbols::check;
use super::CudaDriver;
use crate::driver::{
    AllocationProps, CuResult, DResult, Device, DevicePtr, DriverError, Granularity, HandleTypes, MemHandle, MemoryOps,
    FABRIC_HANDLE_BYTES,
};

/// The `CUmemAllocationHandleType` bit set for `types`.
pub(super) fn alloc_handle_types(types: HandleTypes) -> cu::CUmemAllocationHandleType {
    cu::CUmemAllocationHandleType_enum(types.0)
}

/// `CUmemAllocationProp` of pinned device memory on `dev` exportable as `types`.
pub(super) fn alloc_prop(dev: cu::CUdevice, types: HandleTypes) -> cu::CUmemAllocationProp {
    cu::CUmemAllocationProp {
        type_: cu::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: alloc_handle_types(types),
        location: cu::CUmemLocation { type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: dev },
        win32HandleMetaData: ptr::null_mut(),
        allocFlags: cu::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

impl CudaDriver {
    /// The device ordinal of `ptr` (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`), or `None` when the
    /// driver does not know the pointer.
    fn pointer_ordinal(&self, ptr: DevicePtr) -> Option<Device> {
        let _ctx = self.enter_any();
        let mut ordinal: c_int = -1;
        // SAFETY: CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL writes one `int` into the local.
        let r = unsafe {
            (self.api.cuPointerGetAttribute)(
                (&mut ordinal as *mut c_int).cast(),
                cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr,
            )
        };
        (check("cuPointerGetAttribute", r).is_ok() && ordinal >= 0).then_some(ordinal)
    }
}

impl MemoryOps for CudaDriver {
    fn mem_granularity(&self, dev: Device, option: Granularity, handle_types: HandleTypes) -> DResult<usize> {
        let device = self.cu_device(dev)?;
        let prop = alloc_prop(device, handle_types);
        let option = match option {
            Granularity::Minimum => cu::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            Granularity::Recommended => cu::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
        };
        let _ctx = self.enter(dev)?;
        let mut granularity: usize = 0;
        // SAFETY: `prop` and the out-pointer are locals that outlive the call.
        check("cuMemGetAllocationGranularity", unsafe {
            (self.api.cuMemGetAllocationGranularity)(&mut granularity, &prop, option)
        })?;
        Ok(granularity)
    }

    fn mem_create(&self, dev: Device, size: usize, handle_types: HandleTypes) -> DResult<MemHandle> {
        let device = self.cu_device(dev)?;
        let prop = alloc_prop(device, handle_types);
        let _ctx = self.enter(dev)?;
        let mut handle: cu::CUmemGenericAllocationHandle = 0;
        // SAFETY: `prop` and the out-pointer are locals that outlive the call; flags must be 0.
        check("cuMemCreate", unsafe { (self.api.cuMemCreate)(&mut handle, size, &prop, 0) })?;
        Ok(MemHandle(handle))
    }

    fn mem_release(&self, handle: MemHandle) -> DResult<()> {
        let _ctx = self.enter_any();
        // SAFETY: the handle is passed by value; the driver validates it.
        check("cuMemRelease", unsafe { (self.api.cuMemRelease)(handle.0) })
    }

    fn mem_address_reserve(&self, size: usize, alignment: usize) -> DResult<DevicePtr> {
        let _ctx = self.enter_any();
        let mut ptr: cu::CUdeviceptr = 0;
        // SAFETY: the out-pointer is a local; no fixed address is requested; flags must be 0.
        check("cuMemAddressReserve", unsafe { (self.api.cuMemAddressReserve)(&mut ptr, size, alignment, 0, 0) })?;
        Ok(ptr)
    }

    fn mem_address_free(&self, ptr: DevicePtr, size: usize) -> DResult<()> {
        let _ctx = self.enter_any();
        // SAFETY: plain values; the driver validates the range.
        check("cuMemAddressFree", unsafe { (self.api.cuMemAddressFree)(ptr, size) })
    }

    fn mem_map(&self, ptr: DevicePtr, size: usize, offset: usize, handle: MemHandle) -> DResult<()> {
        let _ctx = self.enter_any();
        // SAFETY: plain values; the driver validates the range and handle; flags must be 0.
        check("cuMemMap", unsafe { (self.api.cuMemMap)(ptr, size, offset, handle.0, 0) })
    }

    fn mem_retain_allocation_handle(&self, ptr: DevicePtr) -> DResult<MemHandle> {
        // In the context of the pointer's device, as for cuMemGetAddressRange.
        let _ctx = match self.pointer_ordinal(ptr) {
            Some(dev) => self.enter(dev)?,
            None => self.enter_any(),
        };
        let mut handle: cu::CUmemGenericAllocationHandle = 0;
        // SAFETY: the out-pointer is a local; the address is only looked up by the driver.
        check("cuMemRetainAllocationHandle", unsafe {
            (self.api.cuMemRetainAllocationHandle)(&mut handle, ptr as usize as *mut c_void)
        })?;
        Ok(MemHandle(handle))
    }

    fn mem_allocation_props(&self, handle: MemHandle) -> DResult<AllocationProps> {
        let _ctx = self.enter_any();
        let mut prop = alloc_prop(0, HandleTypes::NONE);
        // SAFETY: `prop` is a local the driver fills in.
        check("cuMemGetAllocationPropertiesFromHandle", unsafe {
            (self.api.cuMemGetAllocationPropertiesFromHandle)(&mut prop, handle.0)
        })?;
        // The handle types are a bit set the driver may write as any combination: read the
        // field as the integer it is, never as the Rust enum of the bindings.
        // SAFETY: the field is a 32-bit C enum inside the initialised local `prop`.
        let types = unsafe { ptr::addr_of!(prop.requestedHandleTypes).cast::<u32>().read() };
        Ok(AllocationProps { dev: prop.location.id, handle_types: HandleTypes(types) })
    }

    fn mem_address_range(&self, ptr: DevicePtr) -> DResult<(DevicePtr, usize)> {
        // A VMM mapping is found only from the context of a device with access to it (from
        // another device's context the driver answers NOT_FOUND: seen on 2 x H200), so the
        // query runs in the context of the pointer's own device.
        let _ctx = match self.pointer_ordinal(ptr) {
            Some(dev) => self.enter(dev)?,
            None => self.enter_any(),
        };
        let (mut base, mut size): (cu::CUdeviceptr, usize) = (0, 0);
        // SAFETY: the out-pointers are locals.
        check("cuMemGetAddressRange", unsafe { (self.api.cuMemGetAddressRange_v2)(&mut base, &mut size, ptr) })?;
        Ok((base, size))
    }

    fn pointer_device(&self, ptr: DevicePtr) -> DResult<Device> {
        let _ctx = self.enter_any();
        let mut kind: c_uint = 0;
        // SAFETY: CU_POINTER_ATTRIBUTE_MEMORY_TYPE writes one `unsigned int` into the local.
        check("cuPointerGetAttribute", unsafe {
            (self.api.cuPointerGetAttribute)(
                (&mut kind as *mut c_uint).cast(),
                cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                ptr,
            )
        })?;
        if kind != cu::CUmemorytype::CU_MEMORYTYPE_DEVICE as c_uint {
            return Err(DriverError::new("cuPointerGetAttribute", CuResult::ERROR_INVALID_VALUE));
        }
        let mut ordinal: c_int = -1;
        // SAFETY: CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL writes one `int` into the local.
        check("cuPointerGetAttribute", unsafe {
            (self.api.cuPointerGetAttribute)(
                (&mut ordinal as *mut c_int).cast(),
                cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr,
            )
        })?;
        Ok(ordinal)
    }

    fn mem_alloc(&self, dev: Device, size: usize) -> DResult<DevicePtr> {
        let _ctx = self.enter(dev)?;
        let mut ptr: cu::CUdeviceptr = 0;
        // SAFETY: the out-pointer is a local.
        check("cuMemAlloc", unsafe { (self.api.cuMemAlloc_v2)(&mut ptr, size) })?;
        Ok(ptr)
    }

    fn mem_free(&self, dev: Device, ptr: DevicePtr) -> DResult<()> {
        let _ctx = self.enter(dev)?;
        // SAFETY: plain value; the driver validates it.
        check("cuMemFree", unsafe { (self.api.cuMemFree_v2)(ptr) })
    }

    fn host_alloc_mapped(&self, dev: Device, size: usize) -> DResult<DevicePtr> {
        let _ctx = self.enter(dev)?;
        let mut host: *mut c_void = ptr::null_mut();
        let flags = cu::CU_MEMHOSTALLOC_PORTABLE | cu::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: the out-pointer is a local; the flags are valid `CU_MEMHOSTALLOC_*` bits.
        check("cuMemHostAlloc", unsafe { (self.api.cuMemHostAlloc)(&mut host, size, flags) })?;
        let mut device: cu::CUdeviceptr = 0;
        // SAFETY: `host` was just allocated with `CU_MEMHOSTALLOC_DEVICEMAP`; flags must be 0.
        let mapped = check("cuMemHostGetDevicePointer", unsafe {
            (self.api.cuMemHostGetDevicePointer_v2)(&mut device, host, 0)
        });
        if mapped.is_err() || device != host as cu::CUdeviceptr {
            // SAFETY: allocated above and not handed out.
            let _ = unsafe { (self.api.cuMemFreeHost)(host) };
            mapped?;
            return Err(DriverError::new("cuMemHostGetDevicePointer", CuResult::ERROR_NOT_SUPPORTED));
        }
        // SAFETY: `host` is `size` writable bytes of page-locked memory allocated above.
        unsafe { ptr::write_bytes(host.cast::<u8>(), 0, size) };
        Ok(device)
    }

    fn host_free_mapped(&self, dev: Device, ptr: DevicePtr) -> DResult<()> {
        let _ctx = self.enter(dev)?;
        // SAFETY: plain value; the driver validates it.
        check("cuMemFreeHost", unsafe { (self.api.cuMemFreeHost)(ptr as *mut c_void) })
    }

    fn mem_unmap(&self, ptr: DevicePtr, size: usize) -> DResult<()> {
        let _ctx = self.enter_any();
        // SAFETY: plain values; the driver validates the range.
        check("cuMemUnmap", unsafe { (self.api.cuMemUnmap)(ptr, size) })
    }

    fn mem_set_access(&self, ptr: DevicePtr, size: usize, devices: &[Device]) -> DResult<()> {
        let descs: Vec<cu::CUmemAccessDesc> = devices
            .iter()
            .map(|&dev| cu::CUmemAccessDesc {
                location: cu::CUmemLocation { type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: dev },
                flags: cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect();
        let _ctx = self.enter_any();
        // SAFETY: `descs` holds `descs.len()` initialised descriptors and outlives the call.
        check("cuMemSetAccess", unsafe { (self.api.cuMemSetAccess)(ptr, size, descs.as_ptr(), descs.len()) })
    }

    fn mem_export_fd(&self, handle: MemHandle) -> DResult<OwnedFd> {
        let _ctx = self.enter_any();
        let mut fd: c_int = -1;
        // SAFETY: for CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR the driver writes an `int` to
        // the out-pointer, which is a local `c_int`; flags must be 0.
        check("cuMemExportToShareableHandle", unsafe {
            (self.api.cuMemExportToShareableHandle)(
                (&mut fd as *mut c_int).cast(),
                handle.0,
                cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        })?;
        if fd < 0 {
            return Err(DriverError::new("cuMemExportToShareableHandle", CuResult::ERROR_UNKNOWN));
        }
        // SAFETY: the driver returned a new file descriptor that we now own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn mem_import_fd(&self, fd: RawFd) -> DResult<MemHandle> {
        let _ctx = self.enter_any();
        let mut handle: cu::CUmemGenericAllocationHandle = 0;
        // SAFETY: for POSIX file descriptors the driver takes the descriptor itself cast to a
        // pointer (`(void *)(uintptr_t)fd`) and does not take ownership of it; the out-pointer
        // is a local.
        check("cuMemImportFromShareableHandle", unsafe {
            (self.api.cuMemImportFromShareableHandle)(
                &mut handle,
                fd as usize as *mut c_void,
                cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        })?;
        Ok(MemHandle(handle))
    }

    fn mem_export_fabric(&self, handle: MemHandle) -> DResult<[u8; FABRIC_HANDLE_BYTES]> {
        let _ctx = self.enter_any();
        let mut out = cu::CUmemFabricHandle { data: [0; FABRIC_HANDLE_BYTES] };
        // SAFETY: for CU_MEM_HANDLE_TYPE_FABRIC the driver writes a `CUmemFabricHandle` (64
        // bytes) to the out-pointer, which is a local of that type; flags must be 0.
        check("cuMemExportToShareableHandle", unsafe {
            (self.api.cuMemExportToShareableHandle)(
                (&mut out as *mut cu::CUmemFabricHandle).cast(),
                handle.0,
                cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC,
                0,
            )
        })?;
        Ok(out.data)
    }

    fn mem_import_fabric(&self, data: &[u8; FABRIC_HANDLE_BYTES]) -> DResult<MemHandle> {
        let _ctx = self.enter_any();
        let mut fabric = cu::CUmemFabricHandle { data: *data };
        let mut handle: cu::CUmemGenericAllocationHandle = 0;
        // SAFETY: for fabric handles the driver reads a `CUmemFabricHandle` through the pointer
        // (a local that outlives the call) and does not keep it; the out-pointer is a local.
        check("cuMemImportFromShareableHandle", unsafe {
            (self.api.cuMemImportFromShareableHandle)(
                &mut handle,
                (&mut fabric as *mut cu::CUmemFabricHandle).cast(),
                cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC,
            )
        })?;
        Ok(MemHandle(handle))
    }
}
