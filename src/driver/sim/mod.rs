//! The simulated CUDA driver: devices whose memory is host memory, multicast objects that enforce
//! every rule of the driver documentation (`shared/reference/cuda-multicast-driver-api.md`),
//! per-(device, stream) worker threads, memory and multicast-slot budgets, fault injection and a
//! ledger of live resources.
//!
//! Stream capture and CUDA graphs: a stream between [`Driver::stream_begin_capture`] and
//! [`Driver::stream_end_capture`] records its launches (and graph launches) instead of running
//! them; an executable graph replays the recorded work in order on the stream it is launched
//! on, after the work queued there before, as often as it is launched. A synchronization of a
//! capturing stream fails with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates the
//! capture; an event recorded on a capturing stream only orders the capture (no timing node),
//! as `cuEventRecord` does in a capture.
//!
//! Device pointers are host addresses. A physical allocation is a sparse memfd; an address
//! reservation is a `PROT_NONE` mapping; `cuMemMap` maps the memfd read-write over it. A multicast
//! mapping stays `PROT_NONE` (an ordinary load or store there is undefined behaviour on hardware;
//! here it faults): multimem operations go through [`SimDriver::multicast_targets`].
//!
//! Two failures are loud by design, because real hardware would hang or misbehave silently:
//! - a bind or multicast `cuMemMap` that waits longer than [`SimConfig::watchdog`] for the team to
//!   fill panics (hardware would block forever);
//! - a `cuMulticastUnbind` that matches no earlier bind (undefined behaviour on hardware) returns
//!   `CUDA_ERROR_INVALID_VALUE` and is logged with `tracing::error!`.
//!
//! Where things live: `state.rs` the bookkeeping, `memory.rs` allocations and mappings, `copy.rs`
//! copies, `multicast.rs` multicast objects and binds, `exec.rs` streams, events, graphs and
//! launch, `faults.rs` fault injection and the call log, `ledger.rs` the count of live resources;
//! this file holds the configuration, the call glue and the [`Driver`] table.

mod copy;
mod device_work;
mod exec;
mod fabric;
mod faults;
mod host;
mod identity;
mod ledger;
mod memory;
mod multicast;
mod shared;
mod state;
mod workers;

#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::ffi::{c_void, CStr};
use std::os::fd::{OwnedFd, RawFd};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

pub use device_work::{device_allocations, in_device, library_allocations, CountingAlloc, DeviceWork};
pub use faults::{parse_faults, FaultAction, FaultPlan, FaultRule, FUNCTION_NAMES};
pub use ledger::Ledger;

use super::{
    AllocationProps, CuResult, DResult, Device, DeviceProps, DevicePtr, Driver, DriverError, Event, FabricInfo,
    FabricState, Function, Granularity, Graph, GraphExec, HandleTypes, LaunchConfig, MemHandle, Module, MulticastProp,
    Stream, FABRIC_HANDLE_BYTES,
};
use faults::Calls;
use memory::plain_layout;
use state::State;
use workers::Workers;

const MIB: usize = 1 << 20;

/// Configuration of the simulated system.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Number of simulated GPUs.
    pub devices: u32,
    /// Bytes of memory per simulated GPU.
    pub device_memory: u64,
    /// Multicast objects the simulated fabric holds at once.
    pub multicast_slots: u32,
    /// Value of `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`.
    pub multicast_supported: bool,
    /// Value of `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED`. Without it, memory and
    /// multicast objects cannot be created with [`HandleTypes::FABRIC`] (`NOT_SUPPORTED`) and
    /// fabric handles neither export nor import. Default true.
    pub fabric_supported: bool,
    /// The NVLink fabric this host's GPUs are in (`MCAST_SIM_FABRIC=<name>[:<clique>]`), with
    /// `fabric_supported`: cluster UUID derived from the name. A fabric handle made in another
    /// fabric does not import here (`CUDA_ERROR_INVALID_HANDLE`). Default: one fabric that
    /// every simulated host shares, clique 0.
    pub fabric: (String, u32),
    /// An IMEX channel is usable (`MCAST_SIM_IMEX`, default true). Without one, creating memory
    /// or a multicast object with [`HandleTypes::FABRIC`] and exporting a fabric handle fail
    /// with `CUDA_ERROR_NOT_PERMITTED`, though the device still reports fabric support (as a
    /// real system without an IMEX channel does).
    pub imex: bool,
    /// `cuMemGetAllocationGranularity` (both options); a power of two. Default 2 MiB.
    pub mem_granularity: usize,
    /// `CU_MULTICAST_GRANULARITY_MINIMUM`; a power of two. Default 2 MiB.
    pub multicast_granularity_min: usize,
    /// `CU_MULTICAST_GRANULARITY_RECOMMENDED`. Default 512 MiB.
    pub multicast_granularity_recommended: usize,
    /// How long a bind or multicast map may wait for the team to fill before the simulator
    /// panics (real hardware would wait forever). Default 20 s.
    pub watchdog: Duration,
    /// Driver calls made to fail (see [`parse_faults`]).
    pub faults: FaultPlan,
    /// `CUDA_VISIBLE_DEVICES` as this process would read it: which of the host's `devices`
    /// GPUs it sees, in ordinal order (see `identity.rs`). `None`: all of them. Default `None`
    /// (the runtime's context passes the process's variable).
    pub visible: Option<String>,
    /// The simulated host's identity ([`crate::bootstrap::host::host_tag`] by default): with
    /// the physical index, what a GPU's UUID is derived from.
    pub host: String,
}

impl Default for SimConfig {
    /// 4 devices of 1 GiB, 128 multicast slots, multicast and fabric handles supported, 2 MiB granularities
    /// (512 MiB recommended for multicast), a 20 s watchdog and no faults.
    fn default() -> Self {
        SimConfig {
            devices: 4,
            device_memory: 1 << 30,
            multicast_slots: 128,
            multicast_supported: true,
            fabric_supported: true,
            fabric: (DEFAULT_FABRIC.to_string(), 0),
            imex: true,
            mem_granularity: 2 * MIB,
            multicast_granularity_min: 2 * MIB,
            multicast_granularity_recommended: 512 * MIB,
            watchdog: Duration::from_secs(20),
            faults: FaultPlan::none(),
            visible: None,
            host: crate::bootstrap::host::host_tag().to_string(),
        }
    }
}

/// The name of the one fabric every simulated host is in unless `MCAST_SIM_FABRIC` says otherwise.
pub const DEFAULT_FABRIC: &str = "mcast-sim";

type R<T> = Result<T, CuResult>;

const INVALID_VALUE: CuResult = CuResult::ERROR_INVALID_VALUE;

/// A simulated CUDA driver. Thread-safe; dropping it stops and joins every worker thread and
/// unmaps everything it mapped.
pub struct SimDriver {
    config: SimConfig,
    state: Mutex<State>,
    /// Notified whenever a device is added to a multicast object (or one is released).
    team_changed: Condvar,
    calls: Mutex<Calls>,
    workers: Workers,
    /// (device, module identity) of every kernel module [`SimDriver::load_kernel_module`] loaded.
    kernel_modules: Mutex<HashSet<(Device, u64)>>,
    /// Per ordinal: the physical index of the GPU and its UUID.
    gpus: Vec<(u32, [u8; 16])>,
}

impl SimDriver {
    /// A simulated system described by `config`. A zero granularity is replaced by its default.
    pub fn new(mut config: SimConfig) -> Self {
        let defaults = SimConfig::default();
        if config.mem_granularity == 0 {
            config.mem_granularity = defaults.mem_granularity;
        }
        if config.multicast_granularity_min == 0 {
            config.multicast_granularity_min = defaults.multicast_granularity_min;
        }
        if config.multicast_granularity_recommended == 0 {
            config.multicast_granularity_recommended = defaults.multicast_granularity_recommended;
        }
        let calls = Calls::new(&config.faults);
        let gpus = identity::visible(config.visible.as_deref(), config.devices, &config.host)
            .into_iter()
            .map(|i| (i, identity::uuid(&config.host, i)))
            .collect();
        SimDriver {
            gpus,
            config,
            state: Mutex::new(State::default()),
            team_changed: Condvar::new(),
            calls: Mutex::new(calls),
            workers: Workers::default(),
            kernel_modules: Mutex::new(HashSet::new()),
        }
    }

    /// A collective's kernel module (`key`, its identity: the CUDA path's module slot) used on
    /// `dev`: the first time, the simulated load, which, like CUDA's, returns only once every
    /// kernel running on the device is done. Measured on an H200 (`bench/cuda-load-wait.cu`):
    /// `cuModuleLoadData` and `cuLibraryLoadData` waited out a kernel spinning in the context,
    /// under lazy and eager loading alike; the CUDA programming guide's lazy-loading hazards say
    /// loading "might require context synchronization". A thread that loads a module while a
    /// kernel it launched waits for work it has yet to issue waits here until that kernel's
    /// timeout, as on a GPU. Later uses return at once.
    pub fn load_kernel_module(&self, dev: Device, key: u64) {
        if !self.kernel_modules.lock().contains(&(dev, key)) {
            self.workers.synchronize_device(dev);
            self.kernel_modules.lock().insert((dev, key));
        }
    }

    /// The configuration this simulator was made with.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// Number of stream worker threads currently alive.
    pub fn worker_threads(&self) -> usize {
        self.workers.threads()
    }

    /// Counts the call, applies an injected fault, else runs `body`. The call-count lock is
    /// released before a fault acts, so an injected panic leaves no simulator lock held and no
    /// state changed.
    /// The whole call is the simulated driver's work ([`DeviceWork`]).
    fn call<T>(&self, func: &'static str, body: impl FnOnce() -> R<T>) -> DResult<T> {
        let _device = DeviceWork::enter();
        let fault = self.calls.lock().enter(func);
        match fault {
            Some(FaultAction::Fail(code)) => {
                tracing::debug!("mcast sim: injected fault {func} -> {code}");
                return Err(DriverError::new(func, code));
            }
            Some(FaultAction::Panic) => panic!("injected panic in {func}"),
            None => {}
        }
        body().map_err(|code| DriverError::new(func, code))
    }

    /// The physical index (on the simulated host) of the GPU that is ordinal `dev` here.
    pub fn physical_index(&self, dev: Device) -> Option<u32> {
        self.gpus.get(usize::try_from(dev).ok()?).map(|g| g.0)
    }

    /// The cross-process name of ordinal `dev`'s GPU (see `identity::key`); 0 for no device.
    fn gpu_key(&self, dev: Device) -> u64 {
        usize::try_from(dev).ok().and_then(|d| self.gpus.get(d)).map_or(0, |g| identity::key(&g.1))
    }

    /// The ordinal here of the GPU named `key` by another process, if this process sees it.
    fn ordinal_of_key(&self, key: u64) -> Option<Device> {
        self.gpus.iter().position(|g| identity::key(&g.1) == key).map(|d| d as Device)
    }

    fn check_dev(&self, dev: Device) -> R<()> {
        if dev >= 0 && (dev as usize) < self.gpus.len() {
            Ok(())
        } else {
            Err(CuResult::ERROR_INVALID_DEVICE)
        }
    }

    fn mc_gran(&self) -> usize {
        self.config.multicast_granularity_min
    }
}

impl Drop for SimDriver {
    fn drop(&mut self) {
        self.workers.shutdown();
        let st = self.state.get_mut();
        for (&ptr, &size) in &st.reservations {
            host::unreserve(ptr, size);
        }
        st.reservations.clear();
        st.mappings.clear();
        for (&ptr, &(_, size)) in &st.plain {
            // SAFETY: allocated by `mem_alloc` with this layout and not freed (still listed).
            unsafe { std::alloc::dealloc(ptr as *mut u8, plain_layout(size)) };
        }
        st.plain.clear();
        // Physical allocations unmap their shadows and close their memfds as they drop.
    }
}

/// The [`Driver`] table: each call goes to the module of its family, which holds its rules.
impl Driver for SimDriver {
    fn backend_name(&self) -> &'static str {
        "sim"
    }

    fn driver_version(&self) -> DResult<i32> {
        self.call("cuDriverGetVersion", || Ok(13000))
    }

    fn device_count(&self) -> DResult<i32> {
        self.call("cuDeviceGetCount", || i32::try_from(self.gpus.len()).map_err(|_| INVALID_VALUE))
    }

    fn device_props(&self, dev: Device) -> DResult<DeviceProps> {
        self.call("cuDeviceGetAttribute", || {
            self.check_dev(dev)?;
            Ok(DeviceProps {
                name: "mcast simulated GPU".to_string(),
                cc_major: 9,
                cc_minor: 0,
                total_memory: self.config.device_memory,
                sm_count: 132,
                multicast_supported: self.config.multicast_supported,
                vmm_supported: true,
                posix_fd_supported: true,
                fabric_supported: self.config.fabric_supported,
                uuid: self.gpus[dev as usize].1,
                pci_bus_id: identity::pci_bus_id(self.gpus[dev as usize].0),
            })
        })
    }

    fn fabric_info(&self, dev: Device) -> DResult<FabricInfo> {
        self.call("nvmlDeviceGetGpuFabricInfoV", || {
            self.check_dev(dev)?;
            if !self.config.fabric_supported {
                return Ok(FabricInfo::default());
            }
            Ok(FabricInfo {
                cluster_uuid: fabric::cluster_uuid(&self.config.fabric.0),
                clique_id: self.config.fabric.1,
                state: FabricState::Completed,
            })
        })
    }

    fn can_access_peer(&self, dev: Device, peer: Device) -> DResult<bool> {
        self.call("cuDeviceCanAccessPeer", || {
            self.check_dev(dev)?;
            self.check_dev(peer)?;
            Ok(true)
        })
    }

    fn has_multicast_api(&self) -> bool {
        true
    }

    fn has_multicast_bind_v2(&self) -> bool {
        true
    }

    fn mem_granularity(&self, dev: Device, _option: Granularity, _handle_types: HandleTypes) -> DResult<usize> {
        memory::mem_granularity(self, dev, _option, _handle_types)
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
        self.call("cuCtxSetCurrent", || self.check_dev(dev))
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

    fn memset_d8(&self, dev: Device, dst: DevicePtr, value: u8, bytes: usize) -> DResult<()> {
        copy::memset_d8(self, dev, dst, value, bytes)
    }

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
        _func: Function,
        _config: &LaunchConfig,
        _stream: Stream,
        _params: &mut [*mut c_void],
    ) -> DResult<()> {
        exec::launch(self, dev, _func, _config, _stream, _params)
    }

    fn as_sim(&self) -> Option<&SimDriver> {
        Some(self)
    }
}
