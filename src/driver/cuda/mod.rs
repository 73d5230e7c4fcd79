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
//! Where things live: `symbols.rs` the entry-point table and the `CUresult` checks, `context.rs`
//! primary contexts, `device.rs` device queries, `memory.rs` allocations and mappings, `copy.rs`
//! copies, `multicast.rs` multicast objects, `exec.rs` streams, events, graphs and launch; this
//! file holds the loader and the [`Driver`] table.

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

use std::ffi::{c_void, CStr};
use std::os::fd::{OwnedFd, RawFd};
use std::sync::OnceLock;

use cudarc::driver::sys as cu;
use parking_lot::Mutex;

pub use symbols::{OPTIONAL_SYMBOLS, REQUIRED_SYMBOLS};

use super::{
    AllocationProps, CuResult, DResult, Device, DeviceProps, DevicePtr, Driver, DriverError, Event, FabricInfo,
    Function, Granularity, Graph, GraphExec, HandleTypes, LaunchConfig, MemHandle, Module, MulticastProp, Stream,
    FABRIC_HANDLE_BYTES,
};

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

/// The [`Driver`] table: each call goes to the module of its family.
impl Driver for CudaDriver {
    fn backend_name(&self) -> &'static str {
        "cuda"
    }

    fn driver_version(&self) -> DResult<i32> {
        device::driver_version(self)
    }

    fn device_count(&self) -> DResult<i32> {
        device::device_count(self)
    }

    fn device_props(&self, dev: Device) -> DResult<DeviceProps> {
        device::device_props(self, dev)
    }

    fn fabric_info(&self, dev: Device) -> DResult<FabricInfo> {
        Ok(nvml::fabric_info(&device::device_props(self, dev)?.uuid))
    }

    fn can_access_peer(&self, dev: Device, peer: Device) -> DResult<bool> {
        device::can_access_peer(self, dev, peer)
    }

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

    fn mem_granularity(&self, dev: Device, option: Granularity, handle_types: HandleTypes) -> DResult<usize> {
        memory::mem_granularity(self, dev, option, handle_types)
    }

    fn mem_create(&self, dev: Device, size: usize, handle_types: HandleTypes) -> DResult<MemHandle> {
        memory::mem_create(self, dev, size, handle_types)
    }

    fn mem_release(&self, handle: MemHandle) -> DResult<()> {
        memory::mem_release(self, handle)
    }

    fn mem_address_reserve(&self, size: usize, alignment: usize) -> DResult<DevicePtr> {
        memory::mem_address_reserve(self, size, alignment)
    }

    fn mem_address_free(&self, ptr: DevicePtr, size: usize) -> DResult<()> {
        memory::mem_address_free(self, ptr, size)
    }

    fn mem_map(&self, ptr: DevicePtr, size: usize, offset: usize, handle: MemHandle) -> DResult<()> {
        memory::mem_map(self, ptr, size, offset, handle)
    }

    fn mem_retain_allocation_handle(&self, ptr: DevicePtr) -> DResult<MemHandle> {
        memory::mem_retain_allocation_handle(self, ptr)
    }

    fn mem_allocation_props(&self, handle: MemHandle) -> DResult<AllocationProps> {
        memory::mem_allocation_props(self, handle)
    }

    fn mem_address_range(&self, ptr: DevicePtr) -> DResult<(DevicePtr, usize)> {
        memory::mem_address_range(self, ptr)
    }

    fn pointer_device(&self, ptr: DevicePtr) -> DResult<Device> {
        memory::pointer_device(self, ptr)
    }

    fn mem_alloc(&self, dev: Device, size: usize) -> DResult<DevicePtr> {
        memory::mem_alloc(self, dev, size)
    }

    fn mem_free(&self, dev: Device, ptr: DevicePtr) -> DResult<()> {
        memory::mem_free(self, dev, ptr)
    }

    fn mem_unmap(&self, ptr: DevicePtr, size: usize) -> DResult<()> {
        memory::mem_unmap(self, ptr, size)
    }

    fn mem_set_access(&self, ptr: DevicePtr, size: usize, devices: &[Device]) -> DResult<()> {
        memory::mem_set_access(self, ptr, size, devices)
    }

    fn mem_export_fd(&self, handle: MemHandle) -> DResult<OwnedFd> {
        memory::mem_export_fd(self, handle)
    }

    fn mem_import_fd(&self, fd: RawFd) -> DResult<MemHandle> {
        memory::mem_import_fd(self, fd)
    }

    fn mem_export_fabric(&self, handle: MemHandle) -> DResult<[u8; FABRIC_HANDLE_BYTES]> {
        memory::mem_export_fabric(self, handle)
    }

    fn mem_import_fabric(&self, data: &[u8; FABRIC_HANDLE_BYTES]) -> DResult<MemHandle> {
        memory::mem_import_fabric(self, data)
    }

    fn multicast_granularity(&self, prop: &MulticastProp, option: Granularity) -> DResult<usize> {
        multicast::multicast_granularity(self, prop, option)
    }

    fn multicast_create(&self, prop: &MulticastProp) -> DResult<MemHandle> {
        multicast::multicast_create(self, prop)
    }

    fn multicast_add_device(&self, mc: MemHandle, dev: Device) -> DResult<()> {
        multicast::multicast_add_device(self, mc, dev)
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
        multicast::multicast_bind_mem(self, mc, mc_offset, mem, mem_offset, size, flags)
    }

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
        multicast::multicast_bind_mem_v2(self, mc, dev, mc_offset, mem, mem_offset, size, flags)
    }

    fn multicast_bind_addr(
        &self,
        mc: MemHandle,
        mc_offset: usize,
        ptr: DevicePtr,
        size: usize,
        flags: u64,
    ) -> DResult<()> {
        multicast::multicast_bind_addr(self, mc, mc_offset, ptr, size, flags)
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
        multicast::multicast_bind_addr_v2(self, mc, dev, mc_offset, ptr, size, flags)
    }

    fn multicast_unbind(&self, mc: MemHandle, dev: Device, mc_offset: usize, size: usize) -> DResult<()> {
        multicast::multicast_unbind(self, mc, dev, mc_offset, size)
    }

    fn stream_create(&self, dev: Device) -> DResult<Stream> {
        exec::stream_create(self, dev)
    }

    fn stream_destroy(&self, dev: Device, stream: Stream) -> DResult<()> {
        exec::stream_destroy(self, dev, stream)
    }

    fn stream_synchronize(&self, dev: Device, stream: Stream) -> DResult<()> {
        exec::stream_synchronize(self, dev, stream)
    }

    fn bind_thread(&self, dev: Device) -> DResult<()> {
        context::bind_thread(self, dev)
    }

    fn device_synchronize(&self, dev: Device) -> DResult<()> {
        exec::device_synchronize(self, dev)
    }

    fn event_create(&self, dev: Device) -> DResult<Event> {
        exec::event_create(self, dev)
    }

    fn event_record(&self, dev: Device, event: Event, stream: Stream) -> DResult<()> {
        exec::event_record(self, dev, event, stream)
    }

    fn event_elapsed_ms(&self, dev: Device, start: Event, end: Event) -> DResult<f32> {
        exec::event_elapsed_ms(self, dev, start, end)
    }

    fn event_destroy(&self, dev: Device, event: Event) -> DResult<()> {
        exec::event_destroy(self, dev, event)
    }

    fn stream_begin_capture(&self, dev: Device, stream: Stream) -> DResult<()> {
        exec::stream_begin_capture(self, dev, stream)
    }

    fn stream_end_capture(&self, dev: Device, stream: Stream) -> DResult<Graph> {
        exec::stream_end_capture(self, dev, stream)
    }

    fn graph_instantiate(&self, dev: Device, graph: Graph) -> DResult<GraphExec> {
        exec::graph_instantiate(self, dev, graph)
    }

    fn graph_launch(&self, dev: Device, exec: GraphExec, stream: Stream) -> DResult<()> {
        exec::graph_launch(self, dev, exec, stream)
    }

    fn graph_exec_destroy(&self, dev: Device, exec: GraphExec) -> DResult<()> {
        exec::graph_exec_destroy(self, dev, exec)
    }

    fn graph_destroy(&self, dev: Device, graph: Graph) -> DResult<()> {
        exec::graph_destroy(self, dev, graph)
    }

    /// Copies, then synchronizes the legacy default stream: from pageable memory
    /// `cuMemcpyHtoD` may return before the DMA lands, and non-blocking streams do not wait
    /// for it.
    fn memcpy_htod(&self, dev: Device, dst: DevicePtr, src: &[u8]) -> DResult<()> {
        copy::memcpy_htod(self, dev, dst, src)
    }

    fn memcpy_dtoh(&self, dev: Device, dst: &mut [u8], src: DevicePtr) -> DResult<()> {
        copy::memcpy_dtoh(self, dev, dst, src)
    }

    fn poke_u32(&self, dev: Device, dst: DevicePtr, value: u32) -> DResult<()> {
        copy::poke_u32(self, dev, dst, value)
    }

    fn peek_u32(&self, dev: Device, src: DevicePtr) -> DResult<u32> {
        copy::peek_u32(self, dev, src)
    }

    fn memcpy_dtod_async(
        &self,
        dev: Device,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: Stream,
    ) -> DResult<()> {
        copy::memcpy_dtod_async(self, dev, dst, src, bytes, stream)
    }

    /// Sets, then synchronizes the legacy default stream (`cuMemsetD8` is asynchronous for
    /// device memory).
    fn memset_d8(&self, dev: Device, dst: DevicePtr, value: u8, bytes: usize) -> DResult<()> {
        copy::memset_d8(self, dev, dst, value, bytes)
    }

    /// A cubin or fatbin is passed as is; PTX text is NUL-terminated first (copied when it is
    /// not already).
    fn module_load(&self, dev: Device, image: &[u8]) -> DResult<Module> {
        exec::module_load(self, dev, image)
    }

    fn module_unload(&self, dev: Device, module: Module) -> DResult<()> {
        exec::module_unload(self, dev, module)
    }

    fn module_function(&self, dev: Device, module: Module, name: &CStr) -> DResult<Function> {
        exec::module_function(self, dev, module, name)
    }

    fn launch(
        &self,
        dev: Device,
        func: Function,
        config: &LaunchConfig,
        stream: Stream,
        params: &mut [*mut c_void],
    ) -> DResult<()> {
        exec::launch(self, dev, func, config, stream, params)
    }
}
