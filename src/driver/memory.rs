//! Memory: physical allocations (`cuMemCreate`, release, export and import), address
//! reservations, mappings and access, pointer queries and plain `cuMemAlloc` memory.

use std::os::fd::{OwnedFd, RawFd};

use super::{AllocationProps, DResult, Device, DevicePtr, Granularity, HandleTypes, MemHandle, FABRIC_HANDLE_BYTES};

/// Physical memory, virtual addresses, mappings and shareable handles. Part of [`super::Driver`].
pub trait MemoryOps {
    /// `cuMemGetAllocationGranularity` for a device allocation on `dev`.
    fn mem_granularity(&self, dev: Device, option: Granularity, handle_types: HandleTypes) -> DResult<usize>;

    /// `cuMemCreate`: `size` bytes of device memory on `dev`.
    fn mem_create(&self, dev: Device, size: usize, handle_types: HandleTypes) -> DResult<MemHandle>;

    /// `cuMemRelease` of a physical allocation or a multicast object. Freed once unmapped.
    fn mem_release(&self, handle: MemHandle) -> DResult<()>;

    /// `cuMemAddressReserve`.
    fn mem_address_reserve(&self, size: usize, alignment: usize) -> DResult<DevicePtr>;

    /// `cuMemAddressFree`.
    fn mem_address_free(&self, ptr: DevicePtr, size: usize) -> DResult<()>;

    /// `cuMemMap` of `handle` (from `offset`) at `ptr`.
    fn mem_map(&self, ptr: DevicePtr, size: usize, offset: usize, handle: MemHandle) -> DResult<()>;

    /// `cuMemUnmap`.
    fn mem_unmap(&self, ptr: DevicePtr, size: usize) -> DResult<()>;

    /// `cuMemSetAccess`: read-write for each of `devices`.
    fn mem_set_access(&self, ptr: DevicePtr, size: usize, devices: &[Device]) -> DResult<()>;

    /// `cuMemExportToShareableHandle` as a POSIX file descriptor.
    fn mem_export_fd(&self, handle: MemHandle) -> DResult<OwnedFd>;

    /// `cuMemImportFromShareableHandle` of a POSIX file descriptor (not consumed).
    fn mem_import_fd(&self, fd: RawFd) -> DResult<MemHandle>;

    /// `cuMemExportToShareableHandle` as a `CU_MEM_HANDLE_TYPE_FABRIC` handle: the 64 bytes
    /// of a `CUmemFabricHandle`, which any process of the same NVLink domain (other nodes
    /// included) can import. Only objects created with [`HandleTypes::FABRIC`] export this way.
    fn mem_export_fabric(&self, handle: MemHandle) -> DResult<[u8; FABRIC_HANDLE_BYTES]>;

    /// `cuMemImportFromShareableHandle` of a fabric handle made by [`MemoryOps::mem_export_fabric`]
    /// in this or another process.
    fn mem_import_fabric(&self, data: &[u8; FABRIC_HANDLE_BYTES]) -> DResult<MemHandle>;

    /// `cuMemRetainAllocationHandle`: a new handle (released with [`MemoryOps::mem_release`]) of
    /// the physical allocation mapped at `ptr`. Fails with `CUDA_ERROR_INVALID_VALUE` for memory
    /// that is not a mapped `cuMemCreate` allocation (`cudaMalloc` memory, host memory).
    fn mem_retain_allocation_handle(&self, ptr: DevicePtr) -> DResult<MemHandle>;

    /// `cuMemGetAllocationPropertiesFromHandle`: the device and the requested shareable handle
    /// types of an allocation.
    fn mem_allocation_props(&self, handle: MemHandle) -> DResult<AllocationProps>;

    /// `cuMemGetAddressRange`: base and size of the mapping (or `cuMemAlloc` block) holding
    /// `ptr`.
    fn mem_address_range(&self, ptr: DevicePtr) -> DResult<(DevicePtr, usize)>;

    /// `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)` after checking
    /// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` is device memory: the device whose memory `ptr` is.
    /// `CUDA_ERROR_INVALID_VALUE` for host or unknown memory.
    fn pointer_device(&self, ptr: DevicePtr) -> DResult<Device>;

    /// `cuMemAlloc`: plain device memory (what `cudaMalloc` returns), not a `cuMemCreate`
    /// allocation.
    fn mem_alloc(&self, dev: Device, size: usize) -> DResult<DevicePtr>;

    /// `cuMemFree` of [`MemoryOps::mem_alloc`] memory.
    fn mem_free(&self, dev: Device, ptr: DevicePtr) -> DResult<()>;

    /// `cuMemHostAlloc` with `CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP`, made in
    /// `dev`'s context: `size` bytes of zeroed, page-locked host memory that every device's
    /// kernels can store to, at one address that is both the host pointer and the device
    /// pointer (unified addressing; a driver that maps it elsewhere gives
    /// `CUDA_ERROR_NOT_SUPPORTED`). The host reads it with plain (atomic or volatile) loads, no
    /// driver call: what a device writes for the host to poll lives here.
    fn host_alloc_mapped(&self, dev: Device, size: usize) -> DResult<DevicePtr>;

    /// `cuMemFreeHost` of [`MemoryOps::host_alloc_mapped`] memory. The caller makes sure no
    /// kernel can still store to it.
    fn host_free_mapped(&self, dev: Device, ptr: DevicePtr) -> DResult<()>;
}
