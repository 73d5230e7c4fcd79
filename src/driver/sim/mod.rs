//! The simulated CUDA driver: devices whose memory is host memory, multicast objects that enforce
//! every rule of the driver documentation (`shared/reference/cuda-multicast-driver-api.md`),
//! per-(device, stream) worker threads, memory and multicast-slot budgets, fault injection and a
//! ledger of live resources.
//!
//! Stream capture and CUDA graphs: a stream between [`ExecOps::stream_begin_capture`] and
//! [`ExecOps::stream_end_capture`] records its launches (and graph launches) instead of running
//! them; an executable graph replays the recorded work in order on the stream it is launched
//! on, after the work queued there before, as often as it is launched. A synchronization of a
//! capturing stream fails with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates the
//! capture; an event recorded on a capturing stream only orders the capture (no timing node),
//! as `cuEventRecord` does in a capture. Captures and threads meet as [`CaptureMode`](crate::driver::CaptureMode) says:
//! a potentially unsafe call (a synchronization, a synchronous copy or set, `cuMemAlloc`,
//! `cuMemFree`, `cuMemHostAlloc`, `cuMemFreeHost`, a module load) from a thread that a live
//! capture prohibits fails with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates that
//! capture, also when the capture is another thread's, begun in global mode (what PyTorch's
//! `torch.cuda.graph` does).
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
//! Where things live: one file per family of [`Driver`] calls, each implementing its trait and
//! holding its rules: `device.rs` ([`DeviceOps`]: devices and their properties), `memory.rs`
//! ([`MemoryOps`]: allocations and mappings), `copy.rs` ([`CopyOps`]: copies), `multicast.rs`
//! ([`MulticastOps`]: multicast objects and binds), `exec.rs` ([`ExecOps`]: streams, events,
//! graphs and launch); beside them `state.rs` the bookkeeping, `faults.rs` fault injection and
//! the call log, `ledger.rs` the count of live resources, `identity.rs` which GPUs this process
//! sees; this file holds the configuration and the call glue.

mod copy;
mod device;
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
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

pub use device_work::{device_allocations, in_device, library_allocations, CountingAlloc, DeviceWork};
pub use faults::{parse_faults, FaultAction, FaultPlan, FaultRule, FUNCTION_NAMES};
pub use ledger::Ledger;

#[cfg(doc)]
use super::{CopyOps, DeviceOps, ExecOps, HandleTypes, MemoryOps, MulticastOps};
use super::{CuResult, DResult, Device, Driver, DriverError};
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
    /// Like `cuModuleLoadData`, the load is potentially unsafe in a stream capture: a thread
    /// that a live capture prohibits gets `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and the
    /// capture is invalidated (see [`CaptureMode`](crate::driver::CaptureMode)).
    pub fn load_kernel_module(&self, dev: Device, key: u64) -> DResult<()> {
        if !self.kernel_modules.lock().contains(&(dev, key)) {
            self.unsafe_in_capture().map_err(|code| DriverError::new("cuModuleLoadData", code))?;
            self.workers.synchronize_device(dev);
            self.kernel_modules.lock().insert((dev, key));
        }
        Ok(())
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
        for (&ptr, &(_, size)) in &st.host_mapped {
            // SAFETY: allocated by `host_alloc_mapped` with this layout and not freed (still
            // listed).
            unsafe { std::alloc::dealloc(ptr as *mut u8, memory::host_layout(size)) };
        }
        st.host_mapped.clear();
        // Physical allocations unmap their shadows and close their memfds as they drop.
    }
}

/// The families of calls are implemented in their files (see the module documentation).
impl Driver for SimDriver {
    fn backend_name(&self) -> &'static str {
        "sim"
    }

    fn as_sim(&self) -> Option<&SimDriver> {
        Some(self)
    }
}
