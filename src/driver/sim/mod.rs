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

mod fabric;
mod faults;
mod host;
mod ledger;
mod shared;
mod workers;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{c_void, CStr};
use std::os::fd::{OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

pub use faults::{parse_faults, FaultAction, FaultPlan, FaultRule, FUNCTION_NAMES};
pub use ledger::Ledger;

use super::{
    AllocationProps, CuResult, DResult, Device, DeviceProps, DevicePtr, Driver, DriverError, Event, Function,
    Granularity, Graph, GraphExec, HandleTypes, LaunchConfig, MemHandle, Module, MulticastProp, Stream,
    FABRIC_HANDLE_BYTES,
};
use faults::Calls;
use host::Memfd;
use shared::{SharedBinding, SharedMc};
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
            mem_granularity: 2 * MIB,
            multicast_granularity_min: 2 * MIB,
            multicast_granularity_recommended: 512 * MIB,
            watchdog: Duration::from_secs(20),
            faults: FaultPlan::none(),
        }
    }
}

type R<T> = Result<T, CuResult>;

const INVALID_VALUE: CuResult = CuResult::ERROR_INVALID_VALUE;

/// One physical allocation (shared by the handles created or imported for it).
struct Phys {
    memfd: Memfd,
    dev: Device,
    size: usize,
    handle_types: HandleTypes,
    /// Handles plus bindings referring to it.
    refs: u64,
}

/// A physical-allocation handle.
struct Alloc {
    phys: u64,
    imported: bool,
    released: bool,
    maps: u64,
}

/// Memory bound to a multicast object for one device.
#[derive(Clone, Copy, Debug)]
struct Binding {
    dev: Device,
    mc_offset: usize,
    size: usize,
    phys: u64,
    mem_offset: usize,
}

/// A multicast object.
struct Mc {
    prop: MulticastProp,
    devices: Vec<Device>,
    imported: bool,
    bindings: Vec<Binding>,
    released: bool,
    maps: u64,
    /// Shareable objects: the control block every process that holds the object shares
    /// (devices added and bindings, across processes).
    shared: Option<SharedMc>,
}

impl Mc {
    /// Devices added, by any process.
    fn added(&self) -> usize {
        match &self.shared {
            Some(sh) => sh.added() as usize,
            None => self.devices.len(),
        }
    }

    /// True when `dev` was added, by any process.
    fn has_device(&self, dev: Device) -> bool {
        match &self.shared {
            Some(sh) => sh.has(dev),
            None => self.devices.contains(&dev),
        }
    }
}

/// A mapping of a handle over part of a reservation.
struct Mapping {
    size: usize,
    handle: MemHandle,
    offset: usize,
    multicast: bool,
    access: BTreeSet<Device>,
}

#[derive(Default)]
struct EventState {
    recorded: u64,
    reached: u64,
    time: Option<Instant>,
}

#[derive(Default)]
struct EventCell {
    state: Mutex<EventState>,
    reached: Condvar,
}

impl EventCell {
    fn synchronize(&self) -> Option<Instant> {
        let mut st = self.state.lock();
        while st.reached < st.recorded {
            self.reached.wait(&mut st);
        }
        st.time
    }
}

/// Stream work that can run more than once: a launch recorded by a stream capture.
type Node = Arc<dyn Fn() + Send + Sync>;

/// A stream capture in progress.
#[derive(Default)]
struct Capture {
    nodes: Vec<Node>,
    /// Set by an illegal call during the capture; ending it then fails.
    invalidated: bool,
}

#[derive(Default)]
struct State {
    next_id: u64,
    phys: HashMap<u64, Phys>,
    allocs: HashMap<MemHandle, Alloc>,
    mcs: HashMap<MemHandle, Mc>,
    /// start -> size
    reservations: BTreeMap<u64, usize>,
    /// start -> mapping
    mappings: BTreeMap<u64, Mapping>,
    /// module -> (device, functions)
    modules: HashMap<usize, (Device, Vec<usize>)>,
    /// created stream -> device
    streams: HashMap<usize, Device>,
    events: HashMap<usize, (Device, Arc<EventCell>)>,
    /// (device, stream) -> the capture in progress on it
    captures: HashMap<(Device, usize), Capture>,
    /// graph -> its recorded work
    graphs: HashMap<usize, Arc<Vec<Node>>>,
    /// executable graph -> (device it was instantiated on, its work)
    graph_execs: HashMap<usize, (Device, Arc<Vec<Node>>)>,
    /// `cuMemAlloc` memory (plain device memory, not a `cuMemCreate` allocation): start ->
    /// (device, size).
    plain: BTreeMap<u64, (Device, usize)>,
}

/// Alignment of simulated `cuMemAlloc` memory (the driver guarantees at least 256 bytes).
const PLAIN_ALIGN: usize = 256;

impl State {
    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        0x51D0_0000_0000 + self.next_id
    }

    /// The descriptor and identity behind `handle` (memory, or a multicast object's control
    /// block) for an export as `need`: only objects created with that handle type export.
    fn exportable(&self, handle: MemHandle, need: HandleTypes) -> R<(RawFd, (u64, u64))> {
        if let Ok(obj) = self.live_mc(handle) {
            return match &obj.shared {
                Some(sh) if obj.prop.handle_types.contains(need) => Ok((sh.raw_fd(), sh.identity())),
                _ => Err(INVALID_VALUE),
            };
        }
        let phys = self.phys_of(self.live_alloc(handle)?)?;
        if !phys.handle_types.contains(need) {
            return Err(INVALID_VALUE);
        }
        Ok((phys.memfd.raw_fd(), phys.memfd.identity()))
    }

    fn live_alloc(&self, handle: MemHandle) -> R<&Alloc> {
        self.allocs.get(&handle).filter(|a| !a.released).ok_or(INVALID_VALUE)
    }

    fn live_mc(&self, handle: MemHandle) -> R<&Mc> {
        self.mcs.get(&handle).filter(|m| !m.released).ok_or(INVALID_VALUE)
    }

    fn phys_of(&self, alloc: &Alloc) -> R<&Phys> {
        self.phys.get(&alloc.phys).ok_or(CuResult::ERROR_UNKNOWN)
    }

    /// Device memory charged to `dev`: physical allocations and `cuMemAlloc` blocks.
    fn used_bytes(&self, dev: Device) -> u64 {
        let phys: u64 = self.phys.values().filter(|p| p.dev == dev).map(|p| p.size as u64).sum();
        phys + self.plain.values().filter(|p| p.0 == dev).map(|p| p.1 as u64).sum::<u64>()
    }

    fn unref_phys(&mut self, id: u64) {
        if let Some(p) = self.phys.get_mut(&id) {
            p.refs -= 1;
            if p.refs == 0 {
                self.phys.remove(&id);
            }
        }
    }

    fn free_alloc(&mut self, handle: MemHandle) {
        if let Some(a) = self.allocs.remove(&handle) {
            self.unref_phys(a.phys);
        }
    }

    fn free_mc(&mut self, handle: MemHandle) {
        if let Some(mc) = self.mcs.remove(&handle) {
            for b in mc.bindings {
                self.unref_phys(b.phys);
            }
        }
    }

    /// The `cuMemAlloc` block containing `addr`: (start, device, size).
    fn plain_at(&self, addr: u64) -> Option<(u64, Device, usize)> {
        let (&start, &(dev, size)) = self.plain.range(..=addr).next_back()?;
        (addr < start + size as u64).then_some((start, dev, size))
    }

    /// The mapping containing `addr`.
    fn mapping_at(&self, addr: u64) -> Option<(u64, &Mapping)> {
        let (&start, m) = self.mappings.range(..=addr).next_back()?;
        (addr < start + m.size as u64).then_some((start, m))
    }

    /// Starts of the mappings exactly covering `[ptr, ptr + size)`, with no gap.
    fn covering(&self, ptr: u64, size: usize) -> R<Vec<u64>> {
        let end = ptr.checked_add(size as u64).ok_or(INVALID_VALUE)?;
        let mut starts = Vec::new();
        let mut cur = ptr;
        while cur < end {
            let (start, m) = self.mapping_at(cur).ok_or(INVALID_VALUE)?;
            starts.push(start);
            cur = start + m.size as u64;
        }
        Ok(starts)
    }
}

/// A resolved bind target.
struct BindSource {
    phys: u64,
    mem_offset: usize,
    dev: Device,
}

/// What a bind names as its memory.
#[derive(Clone, Copy)]
enum BindMemory {
    Handle(MemHandle, usize),
    Address(DevicePtr),
}

/// A simulated CUDA driver. Thread-safe; dropping it stops and joins every worker thread and
/// unmaps everything it mapped.
pub struct SimDriver {
    config: SimConfig,
    state: Mutex<State>,
    /// Notified whenever a device is added to a multicast object (or one is released).
    team_changed: Condvar,
    calls: Mutex<Calls>,
    workers: Workers,
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
        SimDriver {
            config,
            state: Mutex::new(State::default()),
            team_changed: Condvar::new(),
            calls: Mutex::new(calls),
            workers: Workers::default(),
        }
    }

    /// The configuration this simulator was made with.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// Runs `work` on the worker of `(dev, stream)` after everything enqueued there before: the
    /// simulated kernel launch (counted, and faultable, as `cuLaunchKernel`). Any `stream` value
    /// is accepted; `Stream(0)` is the legacy default stream of `dev`. On a capturing stream the
    /// work is recorded into the capture instead (so it must be able to run more than once).
    pub fn enqueue(&self, dev: Device, stream: Stream, work: impl Fn() + Send + Sync + 'static) -> DResult<()> {
        self.call("cuLaunchKernel", || {
            self.check_dev(dev)?;
            self.submit(dev, stream, Arc::new(work))
        })
    }

    /// Queues `node` on `(dev, stream)`, or records it when that stream is capturing.
    fn submit(&self, dev: Device, stream: Stream, node: Node) -> R<()> {
        if let Some(capture) = self.state.lock().captures.get_mut(&(dev, stream.0)) {
            capture.nodes.push(node);
            return Ok(());
        }
        self.workers
            .enqueue((dev, stream.0), Box::new(move || node()))
            .map_err(|_| CuResult::ERROR_LAUNCH_OUT_OF_RESOURCES)
    }

    /// True when `(dev, stream)` is capturing; the capture is then invalidated (what an illegal
    /// call during a capture does).
    fn invalidate_capture(&self, dev: Device, stream: Stream) -> bool {
        match self.state.lock().captures.get_mut(&(dev, stream.0)) {
            Some(capture) => {
                capture.invalidated = true;
                true
            }
            None => false,
        }
    }

    /// For a range of a multicast mapping lying inside one binding region, the host address of
    /// the same bytes in each bound device's memory, ordered by device ordinal (devices with no
    /// binding covering the range are absent). `None` when `addr` is not a multicast address, the
    /// range leaves the mapping, or no device has it bound. The pointers stay valid until the
    /// binding is undone.
    pub fn multicast_targets(&self, addr: DevicePtr, len: usize) -> Option<Vec<*mut u8>> {
        let st = self.state.lock();
        let (start, m) = st.mapping_at(addr)?;
        let end = addr.checked_add(len as u64)?;
        if !m.multicast || len == 0 || end > start + m.size as u64 {
            return None;
        }
        let mc = st.mcs.get(&m.handle)?;
        let off = m.offset + (addr - start) as usize;
        if let Some(sh) = &mc.shared {
            // Bindings of every process; the memory is reached through this process's import
            // of it (a process maps its peers' memory before it uses the multicast range).
            let mut hits: Vec<(Device, *mut u8)> = Vec::new();
            for b in sh.bindings() {
                if !(off >= b.mc_offset && off + len <= b.mc_offset + b.size) {
                    continue;
                }
                let phys = st.phys.values().find(|p| p.memfd.identity() == b.identity)?;
                if b.mem_offset + b.size > phys.size {
                    return None;
                }
                // SAFETY: mem_offset + size <= phys.size (checked above).
                hits.push((b.dev, unsafe { phys.memfd.shadow().add(b.mem_offset + (off - b.mc_offset)) }));
            }
            if hits.is_empty() {
                return None;
            }
            hits.sort_by_key(|&(dev, _)| dev);
            return Some(hits.into_iter().map(|(_, p)| p).collect());
        }
        let mut hits: Vec<(Device, *mut u8)> = mc
            .bindings
            .iter()
            .filter(|b| off >= b.mc_offset && off + len <= b.mc_offset + b.size)
            .filter_map(|b| {
                let phys = st.phys.get(&b.phys)?;
                // SAFETY: mem_offset + size <= phys.size was checked at bind time, so the offset
                // stays inside the shadow mapping.
                Some((b.dev, unsafe { phys.memfd.shadow().add(b.mem_offset + (off - b.mc_offset)) }))
            })
            .collect();
        if hits.is_empty() {
            return None;
        }
        hits.sort_by_key(|&(dev, _)| dev);
        Some(hits.into_iter().map(|(_, p)| p).collect())
    }

    /// Live simulated resources.
    pub fn ledger(&self) -> Ledger {
        let st = self.state.lock();
        let n = self.config.devices as usize;
        let mut ledger = Ledger { allocations: vec![0; n], allocation_bytes: vec![0; n], ..Ledger::default() };
        for p in st.phys.values() {
            ledger.allocations[p.dev as usize] += 1;
            ledger.allocation_bytes[p.dev as usize] += p.size as u64;
        }
        for &(dev, size) in st.plain.values() {
            ledger.allocations[dev as usize] += 1;
            ledger.allocation_bytes[dev as usize] += size as u64;
        }
        ledger.allocation_handles = st.allocs.len() as u64;
        ledger.reservations = st.reservations.len() as u64;
        ledger.reserved_bytes = st.reservations.values().map(|&s| s as u64).sum();
        ledger.mappings = st.mappings.len() as u64;
        ledger.multicast_objects = st.mcs.len() as u64;
        ledger.bindings = st.mcs.values().map(|m| m.bindings.len() as u64).sum();
        ledger.modules = st.modules.len() as u64;
        ledger.streams = st.streams.len() as u64;
        ledger.events = st.events.len() as u64;
        ledger.captures = st.captures.len() as u64;
        ledger.graphs = st.graphs.len() as u64;
        ledger.graph_execs = st.graph_execs.len() as u64;
        ledger
    }

    /// Number of stream worker threads currently alive.
    pub fn worker_threads(&self) -> usize {
        self.workers.threads()
    }

    /// Makes calls of `func` fail with `code`: the `nth` call from now (1 = the next one) and the
    /// `count - 1` after it, or every call from the `nth` on when `count` is `None`.
    pub fn inject(&self, func: &str, code: CuResult, nth: u64, count: Option<u64>) {
        self.calls.lock().arm(FaultRule {
            func: func.to_string(),
            action: FaultAction::Fail(code),
            first: nth.max(1),
            count,
        });
    }

    /// Removes every fault rule, configured or injected.
    pub fn clear_faults(&self) {
        self.calls.lock().clear_faults();
    }

    /// Every driver function called since creation (or the last [`Self::reset_call_log`]), in
    /// order, including calls that failed.
    pub fn call_log(&self) -> Vec<&'static str> {
        self.calls.lock().log()
    }

    /// Empties the call log (the per-function counts that fault rules use are kept).
    pub fn reset_call_log(&self) {
        self.calls.lock().reset_log();
    }

    /// How many times `func` was called since creation.
    pub fn call_count(&self, func: &str) -> u64 {
        self.calls.lock().count(func)
    }

    // ---- internals ----

    /// Counts the call, applies an injected fault, else runs `body`. The call-count lock is
    /// released before a fault acts, so an injected panic leaves no simulator lock held and no
    /// state changed.
    /// `cuMemImportFromShareableHandle` of a descriptor for a simulator's memfd (memory or a
    /// multicast object's control block, from this or another process), which must have been
    /// created with the handle type `need`.
    fn import_fd(&self, fd: RawFd, need: HandleTypes) -> R<MemHandle> {
        let identity = host::fd_identity(fd).map_err(|_| INVALID_VALUE)?;
        let mut st = self.state.lock();
        let known = st.phys.iter().find(|(_, p)| p.memfd.identity() == identity).map(|(&id, p)| (id, p.handle_types));
        let id = match known {
            Some((id, types)) if types.contains(need) => id,
            Some(_) => return Err(INVALID_VALUE),
            // A multicast object (from this or another process): map its control block.
            None if SharedMc::import(fd).is_some() => {
                let (sh, prop) = SharedMc::import(fd).ok_or(INVALID_VALUE)?;
                if !prop.handle_types.contains(need) {
                    return Err(INVALID_VALUE);
                }
                if st.mcs.len() >= self.config.multicast_slots as usize {
                    return Err(CuResult::ERROR_OUT_OF_MEMORY);
                }
                let handle = MemHandle(st.fresh_id());
                let obj = Mc {
                    prop,
                    devices: Vec::new(),
                    imported: true,
                    bindings: Vec::new(),
                    released: false,
                    maps: 0,
                    shared: Some(sh),
                };
                st.mcs.insert(handle, obj);
                return Ok(handle);
            }
            // Memory made by the simulator of another process: adopt the descriptor.
            None => {
                let (dev, types, size) = parse_mem_tag(fd).ok_or(INVALID_VALUE)?;
                self.check_dev(dev)?;
                if !types.contains(need) {
                    return Err(INVALID_VALUE);
                }
                let own = host_dup(fd)?;
                let memfd = Memfd::adopt(own, size).map_err(|_| CuResult::ERROR_OUT_OF_MEMORY)?;
                let id = st.fresh_id();
                // The handle below holds the only reference.
                st.phys.insert(id, Phys { memfd, dev, size, handle_types: types, refs: 0 });
                id
            }
        };
        let handle = MemHandle(st.fresh_id());
        if let Some(p) = st.phys.get_mut(&id) {
            p.refs += 1;
        }
        st.allocs.insert(handle, Alloc { phys: id, imported: true, released: false, maps: 0 });
        Ok(handle)
    }

    fn call<T>(&self, func: &'static str, body: impl FnOnce() -> R<T>) -> DResult<T> {
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

    fn check_dev(&self, dev: Device) -> R<()> {
        if dev >= 0 && (dev as u32) < self.config.devices {
            Ok(())
        } else {
            Err(CuResult::ERROR_INVALID_DEVICE)
        }
    }

    fn mc_gran(&self) -> usize {
        self.config.multicast_granularity_min
    }

    /// Waits until every device of `mc` was added; panics when the watchdog expires.
    fn wait_for_team(&self, st: &mut MutexGuard<'_, State>, mc: MemHandle, func: &'static str) -> R<()> {
        let deadline = Instant::now() + self.config.watchdog;
        loop {
            let obj = st.live_mc(mc)?;
            let (added, wanted) = (obj.added(), obj.prop.num_devices as usize);
            if added >= wanted {
                return Ok(());
            }
            let timed_out = if obj.shared.is_some() {
                // Other processes add devices: poll the shared count.
                MutexGuard::unlocked(st, || std::thread::sleep(Duration::from_millis(1)));
                Instant::now() >= deadline
            } else {
                self.team_changed.wait_until(st, deadline).timed_out()
            };
            if timed_out {
                let obj = st.live_mc(mc)?;
                let added = obj.added();
                if added >= wanted {
                    return Ok(());
                }
                panic!(
                    "mcast sim watchdog: {func} on multicast object {:#x} blocked for {:?} waiting for all \
                     devices to be added ({added} of {wanted} added); real hardware would hang forever here",
                    mc.0, self.config.watchdog
                );
            }
        }
    }

    /// The argument rules of a bind, checked before and again after waiting for the team.
    #[allow(clippy::too_many_arguments)]
    fn bind_check(
        &self,
        st: &State,
        mc: MemHandle,
        dev: Option<Device>,
        mc_offset: usize,
        memory: BindMemory,
        size: usize,
        flags: u64,
    ) -> R<BindSource> {
        let obj = st.live_mc(mc)?;
        if let Some(dev) = dev {
            self.check_dev(dev)?;
        }
        let g = self.mc_gran();
        if flags != 0 || size == 0 || size % g != 0 || mc_offset % g != 0 {
            return Err(INVALID_VALUE);
        }
        // BindMem: `memOffset` must be a multiple; BindAddr: `memptr` itself must be.
        let (alloc, mem_offset) = match memory {
            BindMemory::Handle(handle, mem_offset) => {
                if mem_offset % g != 0 {
                    return Err(INVALID_VALUE);
                }
                (st.live_alloc(handle)?, mem_offset)
            }
            BindMemory::Address(ptr) => {
                if ptr % g as u64 != 0 {
                    return Err(INVALID_VALUE);
                }
                let (start, m) = st.mapping_at(ptr).ok_or(INVALID_VALUE)?;
                if m.multicast {
                    return Err(INVALID_VALUE);
                }
                let alloc = st.allocs.get(&m.handle).ok_or(INVALID_VALUE)?;
                (alloc, m.offset + (ptr - start) as usize)
            }
        };
        let phys = st.phys_of(alloc)?;
        if mem_offset.checked_add(size).exceeds(phys.size) {
            return Err(INVALID_VALUE);
        }
        if mc_offset.checked_add(size).exceeds(obj.prop.size) {
            return Err(INVALID_VALUE);
        }
        let mem_shareable = alloc.imported || phys.handle_types.is_shareable();
        if (obj.prop.handle_types.is_shareable() || obj.imported) && !mem_shareable {
            return Err(INVALID_VALUE);
        }
        Ok(BindSource { phys: alloc.phys, mem_offset, dev: phys.dev })
    }

    #[allow(clippy::too_many_arguments)]
    fn bind(
        &self,
        func: &'static str,
        mc: MemHandle,
        dev: Option<Device>,
        mc_offset: usize,
        memory: BindMemory,
        size: usize,
        flags: u64,
    ) -> R<()> {
        let mut st = self.state.lock();
        self.bind_check(&st, mc, dev, mc_offset, memory, size, flags)?;
        self.wait_for_team(&mut st, mc, func)?;
        let src = self.bind_check(&st, mc, dev, mc_offset, memory, size, flags)?;
        let obj = st.live_mc(mc)?;
        let target = dev.unwrap_or(src.dev);
        if src.dev != target || !obj.has_device(target) {
            return Err(CuResult::ERROR_INVALID_DEVICE);
        }
        if obj
            .bindings
            .iter()
            .any(|b| b.dev == target && b.mc_offset < mc_offset + size && mc_offset < b.mc_offset + b.size)
        {
            return Err(INVALID_VALUE);
        }
        let binding = Binding { dev: target, mc_offset, size, phys: src.phys, mem_offset: src.mem_offset };
        if let Some(sh) = &obj.shared {
            let identity = st.phys.get(&src.phys).ok_or(CuResult::ERROR_UNKNOWN)?.memfd.identity();
            let record = SharedBinding { dev: target, mc_offset, size, mem_offset: src.mem_offset, identity };
            if !sh.bind(record) {
                return Err(CuResult::ERROR_OUT_OF_MEMORY);
            }
        }
        if let Some(p) = st.phys.get_mut(&src.phys) {
            p.refs += 1;
        }
        if let Some(obj) = st.mcs.get_mut(&mc) {
            obj.bindings.push(binding);
        }
        Ok(())
    }

    /// The rules of `cuMemMap`; returns whether `handle` is a multicast object.
    fn map_check(&self, st: &State, ptr: u64, size: usize, offset: usize, handle: MemHandle) -> R<bool> {
        let (multicast, total, g) = if let Ok(alloc) = st.live_alloc(handle) {
            (false, st.phys_of(alloc)?.size, self.config.mem_granularity)
        } else {
            let obj = st.live_mc(handle)?;
            if offset != 0 {
                return Err(INVALID_VALUE);
            }
            (true, obj.prop.size, self.mc_gran())
        };
        if size == 0 || size % g != 0 || offset % g != 0 || ptr % g as u64 != 0 {
            return Err(INVALID_VALUE);
        }
        if offset.checked_add(size).exceeds(total) {
            return Err(INVALID_VALUE);
        }
        let end = ptr.checked_add(size as u64).ok_or(INVALID_VALUE)?;
        let (&rstart, &rsize) = st.reservations.range(..=ptr).next_back().ok_or(INVALID_VALUE)?;
        if end > rstart + rsize as u64 {
            return Err(INVALID_VALUE);
        }
        if let Some((&mstart, m)) = st.mappings.range(..end).next_back() {
            if mstart + m.size as u64 > ptr {
                return Err(INVALID_VALUE);
            }
        }
        Ok(multicast)
    }
}

/// `None` (overflow) or greater than a bound: the shape of every "cannot be larger than" rule.
trait Exceeds {
    fn exceeds(self, bound: usize) -> bool;
}

impl Exceeds for Option<usize> {
    fn exceeds(self, bound: usize) -> bool {
        match self {
            None => true,
            Some(v) => v > bound,
        }
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

impl Driver for SimDriver {
    fn backend_name(&self) -> &'static str {
        "sim"
    }

    fn driver_version(&self) -> DResult<i32> {
        self.call("cuDriverGetVersion", || Ok(13000))
    }

    fn device_count(&self) -> DResult<i32> {
        self.call("cuDeviceGetCount", || i32::try_from(self.config.devices).map_err(|_| INVALID_VALUE))
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
        self.call("cuMemGetAllocationGranularity", || {
            self.check_dev(dev)?;
            Ok(self.config.mem_granularity)
        })
    }

    fn mem_create(&self, dev: Device, size: usize, handle_types: HandleTypes) -> DResult<MemHandle> {
        self.call("cuMemCreate", || {
            self.check_dev(dev)?;
            if size == 0 || size % self.config.mem_granularity != 0 {
                return Err(INVALID_VALUE);
            }
            if handle_types.contains(HandleTypes::FABRIC) && !self.config.fabric_supported {
                return Err(CuResult::ERROR_NOT_SUPPORTED);
            }
            let mut st = self.state.lock();
            if st.used_bytes(dev).saturating_add(size as u64) > self.config.device_memory {
                return Err(CuResult::ERROR_OUT_OF_MEMORY);
            }
            let tag = format!("mem:dev={dev}:types={}", handle_types.0);
            let memfd = Memfd::create(size, &tag).map_err(|_| CuResult::ERROR_OUT_OF_MEMORY)?;
            let id = st.fresh_id();
            st.phys.insert(id, Phys { memfd, dev, size, handle_types, refs: 1 });
            let handle = MemHandle(st.fresh_id());
            st.allocs.insert(handle, Alloc { phys: id, imported: false, released: false, maps: 0 });
            Ok(handle)
        })
    }

    fn mem_release(&self, handle: MemHandle) -> DResult<()> {
        self.call("cuMemRelease", || {
            let mut st = self.state.lock();
            if let Some(a) = st.allocs.get_mut(&handle).filter(|a| !a.released) {
                a.released = true;
                if a.maps == 0 {
                    st.free_alloc(handle);
                }
                return Ok(());
            }
            let obj = st.mcs.get_mut(&handle).filter(|m| !m.released).ok_or(INVALID_VALUE)?;
            obj.released = true;
            if obj.maps == 0 {
                st.free_mc(handle);
            }
            // Wake binds and maps waiting on this object: they now fail.
            self.team_changed.notify_all();
            Ok(())
        })
    }

    fn mem_address_reserve(&self, size: usize, alignment: usize) -> DResult<DevicePtr> {
        self.call("cuMemAddressReserve", || {
            let g = self.config.mem_granularity;
            if size == 0 || size % g != 0 || (alignment != 0 && !alignment.is_power_of_two()) {
                return Err(INVALID_VALUE);
            }
            let align = alignment.max(g).next_power_of_two();
            let ptr = host::reserve(size, align).map_err(|_| CuResult::ERROR_OUT_OF_MEMORY)?;
            self.state.lock().reservations.insert(ptr, size);
            Ok(ptr)
        })
    }

    fn mem_address_free(&self, ptr: DevicePtr, size: usize) -> DResult<()> {
        self.call("cuMemAddressFree", || {
            let mut st = self.state.lock();
            if st.reservations.get(&ptr) != Some(&size) {
                return Err(INVALID_VALUE);
            }
            if st.mappings.range(ptr..ptr + size as u64).next().is_some() {
                return Err(INVALID_VALUE);
            }
            st.reservations.remove(&ptr);
            host::unreserve(ptr, size);
            Ok(())
        })
    }

    fn mem_map(&self, ptr: DevicePtr, size: usize, offset: usize, handle: MemHandle) -> DResult<()> {
        self.call("cuMemMap", || {
            let mut st = self.state.lock();
            let multicast = self.map_check(&st, ptr, size, offset, handle)?;
            if multicast {
                self.wait_for_team(&mut st, handle, "cuMemMap")?;
                self.map_check(&st, ptr, size, offset, handle)?;
                // The range stays PROT_NONE: multimem goes through the translation table.
                if let Some(obj) = st.mcs.get_mut(&handle) {
                    obj.maps += 1;
                }
            } else {
                let alloc = st.live_alloc(handle)?;
                let fd = st.phys_of(alloc)?.memfd.raw_fd();
                host::map_fixed(ptr, size, fd, offset).map_err(|_| CuResult::ERROR_OUT_OF_MEMORY)?;
                if let Some(a) = st.allocs.get_mut(&handle) {
                    a.maps += 1;
                }
            }
            let mapping = Mapping { size, handle, offset, multicast, access: BTreeSet::new() };
            st.mappings.insert(ptr, mapping);
            Ok(())
        })
    }

    fn mem_unmap(&self, ptr: DevicePtr, size: usize) -> DResult<()> {
        self.call("cuMemUnmap", || {
            let mut st = self.state.lock();
            let starts = st.covering(ptr, size)?;
            let last_end = starts.last().and_then(|s| st.mappings.get(s).map(|m| s + m.size as u64));
            if starts.first() != Some(&ptr) || last_end != Some(ptr + size as u64) {
                return Err(INVALID_VALUE);
            }
            for start in starts {
                let Some(m) = st.mappings.remove(&start) else {
                    continue;
                };
                if m.multicast {
                    if let Some(obj) = st.mcs.get_mut(&m.handle) {
                        obj.maps -= 1;
                        if obj.maps == 0 && obj.released {
                            st.free_mc(m.handle);
                        }
                    }
                } else {
                    host::protect_none(start, m.size).map_err(|_| CuResult::ERROR_UNKNOWN)?;
                    if let Some(a) = st.allocs.get_mut(&m.handle) {
                        a.maps -= 1;
                        if a.maps == 0 && a.released {
                            st.free_alloc(m.handle);
                        }
                    }
                }
            }
            Ok(())
        })
    }

    fn mem_set_access(&self, ptr: DevicePtr, size: usize, devices: &[Device]) -> DResult<()> {
        self.call("cuMemSetAccess", || {
            if devices.is_empty() || size == 0 {
                return Err(INVALID_VALUE);
            }
            for &dev in devices {
                self.check_dev(dev)?;
            }
            let mut st = self.state.lock();
            let starts = st.covering(ptr, size)?;
            let last_end = starts.last().and_then(|s| st.mappings.get(s).map(|m| s + m.size as u64));
            if starts.first() != Some(&ptr) || last_end != Some(ptr + size as u64) {
                return Err(INVALID_VALUE);
            }
            for start in starts {
                if let Some(m) = st.mappings.get_mut(&start) {
                    m.access.extend(devices.iter().copied());
                }
            }
            Ok(())
        })
    }

    fn mem_export_fd(&self, handle: MemHandle) -> DResult<OwnedFd> {
        self.call("cuMemExportToShareableHandle", || {
            let st = self.state.lock();
            let (fd, _) = st.exportable(handle, HandleTypes::POSIX_FD)?;
            host_dup(fd)
        })
    }

    fn mem_import_fd(&self, fd: RawFd) -> DResult<MemHandle> {
        self.call("cuMemImportFromShareableHandle", || {
            // Descriptors cannot cross hosts: a simulated host is a host identity, and a
            // descriptor made under another one means the runtime routed a handle wrongly.
            if let Some(theirs) = host::memfd_host(fd) {
                let ours = crate::bootstrap::host::host_tag();
                if theirs != ours {
                    tracing::error!(
                        "simulator: a POSIX descriptor made on host {theirs} imported on host {ours}: descriptors \
                         only travel between processes of one host"
                    );
                    return Err(INVALID_VALUE);
                }
            }
            self.import_fd(fd, HandleTypes::POSIX_FD)
        })
    }

    fn mem_export_fabric(&self, handle: MemHandle) -> DResult<[u8; FABRIC_HANDLE_BYTES]> {
        self.call("cuMemExportToShareableHandle", || {
            if !self.config.fabric_supported {
                return Err(CuResult::ERROR_NOT_SUPPORTED);
            }
            let st = self.state.lock();
            let (fd, identity) = st.exportable(handle, HandleTypes::FABRIC)?;
            Ok(fabric::encode(std::process::id(), fd, identity))
        })
    }

    fn mem_import_fabric(&self, data: &[u8; FABRIC_HANDLE_BYTES]) -> DResult<MemHandle> {
        self.call("cuMemImportFromShareableHandle", || {
            if !self.config.fabric_supported {
                return Err(CuResult::ERROR_NOT_SUPPORTED);
            }
            let fd = fabric::open(data)?;
            self.import_fd(std::os::fd::AsRawFd::as_raw_fd(&fd), HandleTypes::FABRIC)
        })
    }

    fn multicast_granularity(&self, prop: &MulticastProp, option: Granularity) -> DResult<usize> {
        self.call("cuMulticastGetGranularity", || {
            if !self.config.multicast_supported {
                return Err(CuResult::ERROR_NOT_SUPPORTED);
            }
            if prop.num_devices == 0 {
                return Err(INVALID_VALUE);
            }
            Ok(match option {
                Granularity::Minimum => self.config.multicast_granularity_min,
                Granularity::Recommended => self.config.multicast_granularity_recommended,
            })
        })
    }

    fn multicast_create(&self, prop: &MulticastProp) -> DResult<MemHandle> {
        self.call("cuMulticastCreate", || {
            if !self.config.multicast_supported {
                return Err(CuResult::ERROR_NOT_SUPPORTED);
            }
            let g = self.mc_gran();
            if prop.num_devices == 0 || prop.flags != 0 || prop.size == 0 || prop.size % g != 0 {
                return Err(INVALID_VALUE);
            }
            if prop.handle_types.contains(HandleTypes::FABRIC) && !self.config.fabric_supported {
                return Err(CuResult::ERROR_NOT_SUPPORTED);
            }
            let mut st = self.state.lock();
            if st.mcs.len() >= self.config.multicast_slots as usize {
                return Err(CuResult::ERROR_OUT_OF_MEMORY);
            }
            let shared = if prop.handle_types.is_shareable() {
                Some(SharedMc::create(prop).map_err(|_| CuResult::ERROR_OUT_OF_MEMORY)?)
            } else {
                None
            };
            let handle = MemHandle(st.fresh_id());
            let obj = Mc {
                prop: *prop,
                devices: Vec::new(),
                imported: false,
                bindings: Vec::new(),
                released: false,
                maps: 0,
                shared,
            };
            st.mcs.insert(handle, obj);
            Ok(handle)
        })
    }

    fn multicast_add_device(&self, mc: MemHandle, dev: Device) -> DResult<()> {
        self.call("cuMulticastAddDevice", || {
            let mut st = self.state.lock();
            st.live_mc(mc)?;
            self.check_dev(dev)?;
            let obj = st.mcs.get_mut(&mc).ok_or(INVALID_VALUE)?;
            match &obj.shared {
                Some(sh) => {
                    if !sh.add(dev) {
                        return Err(INVALID_VALUE);
                    }
                }
                None => {
                    if obj.devices.contains(&dev) || obj.devices.len() >= obj.prop.num_devices as usize {
                        return Err(INVALID_VALUE);
                    }
                }
            }
            obj.devices.push(dev);
            self.team_changed.notify_all();
            Ok(())
        })
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
        let f = "cuMulticastBindMem";
        self.call(f, || self.bind(f, mc, None, mc_offset, BindMemory::Handle(mem, mem_offset), size, flags))
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
        let f = "cuMulticastBindMem_v2";
        self.call(f, || self.bind(f, mc, Some(dev), mc_offset, BindMemory::Handle(mem, mem_offset), size, flags))
    }

    fn multicast_bind_addr(
        &self,
        mc: MemHandle,
        mc_offset: usize,
        ptr: DevicePtr,
        size: usize,
        flags: u64,
    ) -> DResult<()> {
        let f = "cuMulticastBindAddr";
        self.call(f, || self.bind(f, mc, None, mc_offset, BindMemory::Address(ptr), size, flags))
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
        let f = "cuMulticastBindAddr_v2";
        self.call(f, || self.bind(f, mc, Some(dev), mc_offset, BindMemory::Address(ptr), size, flags))
    }

    fn multicast_unbind(&self, mc: MemHandle, dev: Device, mc_offset: usize, size: usize) -> DResult<()> {
        self.call("cuMulticastUnbind", || {
            let mut st = self.state.lock();
            let obj = st.live_mc(mc)?;
            self.check_dev(dev)?;
            let g = self.mc_gran();
            if size == 0 || size % g != 0 || mc_offset % g != 0 || mc_offset.checked_add(size).exceeds(obj.prop.size) {
                return Err(INVALID_VALUE);
            }
            let Some(i) = obj.bindings.iter().position(|b| b.dev == dev && b.mc_offset == mc_offset && b.size == size)
            else {
                tracing::error!(
                    "mcast sim: cuMulticastUnbind(mc {:#x}, dev {dev}, offset {mc_offset}, size {size}) matches no \
                     earlier bind; undefined behaviour on real hardware",
                    mc.0
                );
                return Err(INVALID_VALUE);
            };
            if let Some(sh) = &obj.shared {
                sh.unbind(dev, mc_offset, size);
            }
            let phys = st.mcs.get_mut(&mc).map(|obj| obj.bindings.remove(i).phys);
            if let Some(phys) = phys {
                st.unref_phys(phys);
            }
            Ok(())
        })
    }

    fn mem_retain_allocation_handle(&self, ptr: DevicePtr) -> DResult<MemHandle> {
        self.call("cuMemRetainAllocationHandle", || {
            let mut st = self.state.lock();
            let (_, m) = st.mapping_at(ptr).ok_or(INVALID_VALUE)?;
            if m.multicast {
                return Err(INVALID_VALUE);
            }
            let alloc = st.allocs.get(&m.handle).ok_or(INVALID_VALUE)?;
            let (phys, imported) = (alloc.phys, alloc.imported);
            st.phys.get_mut(&phys).ok_or(CuResult::ERROR_UNKNOWN)?.refs += 1;
            let handle = MemHandle(st.fresh_id());
            st.allocs.insert(handle, Alloc { phys, imported, released: false, maps: 0 });
            Ok(handle)
        })
    }

    fn mem_allocation_props(&self, handle: MemHandle) -> DResult<AllocationProps> {
        self.call("cuMemGetAllocationPropertiesFromHandle", || {
            let st = self.state.lock();
            let phys = st.phys_of(st.live_alloc(handle)?)?;
            Ok(AllocationProps { dev: phys.dev, handle_types: phys.handle_types })
        })
    }

    fn mem_address_range(&self, ptr: DevicePtr) -> DResult<(DevicePtr, usize)> {
        self.call("cuMemGetAddressRange", || {
            let st = self.state.lock();
            if let Some((start, _, size)) = st.plain_at(ptr) {
                return Ok((start, size));
            }
            let (start, m) = st.mapping_at(ptr).ok_or(INVALID_VALUE)?;
            Ok((start, m.size))
        })
    }

    fn pointer_device(&self, ptr: DevicePtr) -> DResult<Device> {
        self.call("cuPointerGetAttribute", || {
            let st = self.state.lock();
            if let Some((_, dev, _)) = st.plain_at(ptr) {
                return Ok(dev);
            }
            let (_, m) = st.mapping_at(ptr).ok_or(INVALID_VALUE)?;
            if m.multicast {
                return Err(INVALID_VALUE);
            }
            let alloc = st.allocs.get(&m.handle).ok_or(INVALID_VALUE)?;
            Ok(st.phys_of(alloc)?.dev)
        })
    }

    fn mem_alloc(&self, dev: Device, size: usize) -> DResult<DevicePtr> {
        self.call("cuMemAlloc", || {
            self.check_dev(dev)?;
            if size == 0 {
                return Err(INVALID_VALUE);
            }
            let mut st = self.state.lock();
            if st.used_bytes(dev).saturating_add(size as u64) > self.config.device_memory {
                return Err(CuResult::ERROR_OUT_OF_MEMORY);
            }
            // SAFETY: the layout has a non-zero size.
            let ptr = unsafe { std::alloc::alloc_zeroed(plain_layout(size)) };
            if ptr.is_null() {
                return Err(CuResult::ERROR_OUT_OF_MEMORY);
            }
            st.plain.insert(ptr as u64, (dev, size));
            Ok(ptr as u64)
        })
    }

    fn mem_free(&self, dev: Device, ptr: DevicePtr) -> DResult<()> {
        self.call("cuMemFree", || {
            self.check_dev(dev)?;
            let mut st = self.state.lock();
            let size = match st.plain.get(&ptr) {
                Some(&(_, size)) => size,
                None => return Err(INVALID_VALUE),
            };
            st.plain.remove(&ptr);
            // SAFETY: allocated by `mem_alloc` with this layout; removed from the table first,
            // so it is freed once.
            unsafe { std::alloc::dealloc(ptr as *mut u8, plain_layout(size)) };
            Ok(())
        })
    }

    fn stream_create(&self, dev: Device) -> DResult<Stream> {
        self.call("cuStreamCreate", || {
            self.check_dev(dev)?;
            let mut st = self.state.lock();
            let id = st.fresh_id() as usize;
            st.streams.insert(id, dev);
            Ok(Stream(id))
        })
    }

    fn stream_destroy(&self, dev: Device, stream: Stream) -> DResult<()> {
        self.call("cuStreamDestroy", || {
            self.check_dev(dev)?;
            let mut st = self.state.lock();
            if st.streams.get(&stream.0) != Some(&dev) {
                return Err(CuResult::ERROR_INVALID_HANDLE);
            }
            st.streams.remove(&stream.0);
            // A capture still open on it ends with the stream.
            st.captures.remove(&(dev, stream.0));
            drop(st);
            // Work already queued still runs, as on hardware.
            self.workers.retire((dev, stream.0));
            Ok(())
        })
    }

    fn stream_synchronize(&self, dev: Device, stream: Stream) -> DResult<()> {
        self.call("cuStreamSynchronize", || {
            self.check_dev(dev)?;
            if self.invalidate_capture(dev, stream) {
                return Err(CuResult::ERROR_STREAM_CAPTURE_UNSUPPORTED);
            }
            self.workers.synchronize((dev, stream.0));
            Ok(())
        })
    }

    fn bind_thread(&self, dev: Device) -> DResult<()> {
        self.call("cuCtxSetCurrent", || self.check_dev(dev))
    }

    fn device_synchronize(&self, dev: Device) -> DResult<()> {
        self.call("cuCtxSynchronize", || {
            self.check_dev(dev)?;
            self.workers.synchronize_device(dev);
            Ok(())
        })
    }

    fn event_create(&self, dev: Device) -> DResult<Event> {
        self.call("cuEventCreate", || {
            self.check_dev(dev)?;
            let mut st = self.state.lock();
            let id = st.fresh_id() as usize;
            st.events.insert(id, (dev, Arc::default()));
            Ok(Event(id))
        })
    }

    fn event_record(&self, dev: Device, event: Event, stream: Stream) -> DResult<()> {
        self.call("cuEventRecord", || {
            self.check_dev(dev)?;
            let cell = {
                let st = self.state.lock();
                let cell = st.events.get(&event.0).map(|(_, c)| c.clone()).ok_or(CuResult::ERROR_INVALID_HANDLE)?;
                if st.captures.contains_key(&(dev, stream.0)) {
                    // In a capture an event only orders the captured work: no node, no time.
                    return Ok(());
                }
                cell
            };
            cell.state.lock().recorded += 1;
            let reach = cell.clone();
            let work: Box<dyn FnOnce() + Send> = Box::new(move || {
                let mut st = reach.state.lock();
                st.reached += 1;
                st.time = Some(Instant::now());
                reach.reached.notify_all();
            });
            self.workers.enqueue((dev, stream.0), work).map_err(|_| {
                cell.state.lock().recorded -= 1;
                CuResult::ERROR_LAUNCH_OUT_OF_RESOURCES
            })
        })
    }

    fn event_elapsed_ms(&self, dev: Device, start: Event, end: Event) -> DResult<f32> {
        self.call("cuEventElapsedTime", || {
            self.check_dev(dev)?;
            let (a, b) = {
                let st = self.state.lock();
                let get = |e: Event| st.events.get(&e.0).map(|(_, c)| c.clone()).ok_or(CuResult::ERROR_INVALID_HANDLE);
                (get(start)?, get(end)?)
            };
            let (Some(t0), Some(t1)) = (a.synchronize(), b.synchronize()) else {
                return Err(CuResult::ERROR_INVALID_HANDLE);
            };
            let ms = if t1 >= t0 {
                t1.duration_since(t0).as_secs_f64() * 1e3
            } else {
                -(t0.duration_since(t1).as_secs_f64() * 1e3)
            };
            Ok(ms as f32)
        })
    }

    fn event_destroy(&self, dev: Device, event: Event) -> DResult<()> {
        self.call("cuEventDestroy", || {
            self.check_dev(dev)?;
            self.state.lock().events.remove(&event.0).map(|_| ()).ok_or(CuResult::ERROR_INVALID_HANDLE)
        })
    }

    fn stream_begin_capture(&self, dev: Device, stream: Stream) -> DResult<()> {
        self.call("cuStreamBeginCapture", || {
            self.check_dev(dev)?;
            if stream == Stream::DEFAULT {
                // The legacy default stream cannot be captured.
                return Err(CuResult::ERROR_STREAM_CAPTURE_UNSUPPORTED);
            }
            let mut st = self.state.lock();
            if st.captures.contains_key(&(dev, stream.0)) {
                return Err(CuResult::ERROR_ILLEGAL_STATE);
            }
            st.captures.insert((dev, stream.0), Capture::default());
            Ok(())
        })
    }

    fn stream_end_capture(&self, dev: Device, stream: Stream) -> DResult<Graph> {
        self.call("cuStreamEndCapture", || {
            self.check_dev(dev)?;
            let mut st = self.state.lock();
            let capture = st.captures.remove(&(dev, stream.0)).ok_or(CuResult::ERROR_ILLEGAL_STATE)?;
            if capture.invalidated {
                return Err(CuResult::ERROR_STREAM_CAPTURE_INVALIDATED);
            }
            let id = st.fresh_id() as usize;
            st.graphs.insert(id, Arc::new(capture.nodes));
            Ok(Graph(id))
        })
    }

    fn graph_instantiate(&self, dev: Device, graph: Graph) -> DResult<GraphExec> {
        self.call("cuGraphInstantiateWithFlags", || {
            self.check_dev(dev)?;
            let mut st = self.state.lock();
            let nodes = st.graphs.get(&graph.0).cloned().ok_or(CuResult::ERROR_INVALID_VALUE)?;
            let id = st.fresh_id() as usize;
            st.graph_execs.insert(id, (dev, nodes));
            Ok(GraphExec(id))
        })
    }

    fn graph_launch(&self, dev: Device, exec: GraphExec, stream: Stream) -> DResult<()> {
        self.call("cuGraphLaunch", || {
            self.check_dev(dev)?;
            let nodes = match self.state.lock().graph_execs.get(&exec.0) {
                Some((on, nodes)) if *on == dev => nodes.clone(),
                Some(_) => return Err(CuResult::ERROR_INVALID_VALUE),
                None => return Err(CuResult::ERROR_INVALID_HANDLE),
            };
            // One stream item runs the graph's work in the captured order; on a capturing
            // stream it becomes one node (a child graph).
            self.submit(dev, stream, Arc::new(move || nodes.iter().for_each(|node| node())))
        })
    }

    fn graph_exec_destroy(&self, dev: Device, exec: GraphExec) -> DResult<()> {
        self.call("cuGraphExecDestroy", || {
            self.check_dev(dev)?;
            // Replays already queued keep their work alive until they have run.
            self.state.lock().graph_execs.remove(&exec.0).map(|_| ()).ok_or(CuResult::ERROR_INVALID_VALUE)
        })
    }

    fn graph_destroy(&self, dev: Device, graph: Graph) -> DResult<()> {
        self.call("cuGraphDestroy", || {
            self.check_dev(dev)?;
            self.state.lock().graphs.remove(&graph.0).map(|_| ()).ok_or(CuResult::ERROR_INVALID_VALUE)
        })
    }

    fn memcpy_htod(&self, dev: Device, dst: DevicePtr, src: &[u8]) -> DResult<()> {
        self.call("cuMemcpyHtoD", || {
            self.check_dev(dev)?;
            let st = self.state.lock();
            check_access(&st, dev, dst, src.len())?;
            // SAFETY: the whole range is mapped read-write (checked above, lock held), and `src`
            // is host memory the caller owns, so the ranges cannot overlap.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
            Ok(())
        })
    }

    fn memcpy_dtoh(&self, dev: Device, dst: &mut [u8], src: DevicePtr) -> DResult<()> {
        self.call("cuMemcpyDtoH", || {
            self.check_dev(dev)?;
            let st = self.state.lock();
            check_access(&st, dev, src, dst.len())?;
            // SAFETY: the source range is mapped read-write (checked above, lock held); `dst` is
            // a distinct host buffer borrowed mutably.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
            Ok(())
        })
    }

    fn poke_u32(&self, dev: Device, dst: DevicePtr, value: u32) -> DResult<()> {
        self.call("cuMemcpyHtoDAsync", || {
            self.check_dev(dev)?;
            if dst % 4 != 0 {
                return Err(INVALID_VALUE);
            }
            let st = self.state.lock();
            check_access(&st, dev, dst, 4)?;
            // SAFETY: the word is mapped read-write and 4-byte aligned (checked above, lock
            // held); kernels on the workers access such words atomically only.
            unsafe { &*(dst as *const std::sync::atomic::AtomicU32) }
                .store(value, std::sync::atomic::Ordering::Release);
            Ok(())
        })
    }

    fn peek_u32(&self, dev: Device, src: DevicePtr) -> DResult<u32> {
        self.call("cuMemcpyDtoHAsync", || {
            self.check_dev(dev)?;
            if src % 4 != 0 {
                return Err(INVALID_VALUE);
            }
            let st = self.state.lock();
            check_access(&st, dev, src, 4)?;
            // SAFETY: as in `poke_u32`.
            Ok(unsafe { &*(src as *const std::sync::atomic::AtomicU32) }.load(std::sync::atomic::Ordering::Acquire))
        })
    }

    fn memcpy_dtod_async(
        &self,
        dev: Device,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: Stream,
    ) -> DResult<()> {
        self.call("cuMemcpyDtoDAsync", || {
            self.check_dev(dev)?;
            if bytes == 0 {
                return Ok(());
            }
            {
                let st = self.state.lock();
                check_access(&st, dev, dst, bytes)?;
                check_access(&st, dev, src, bytes)?;
            }
            if dst < src.saturating_add(bytes as u64) && src < dst.saturating_add(bytes as u64) {
                return Err(INVALID_VALUE);
            }
            let (d, s) = (dst as usize, src as usize);
            // SAFETY: both ranges were mapped for `dev` when the copy was enqueued and do not
            // overlap; the memory outlives work in flight (frees wait for streams), as on a GPU.
            self.submit(
                dev,
                stream,
                Arc::new(move || unsafe { std::ptr::copy_nonoverlapping(s as *const u8, d as *mut u8, bytes) }),
            )
        })
    }

    fn memset_d8(&self, dev: Device, dst: DevicePtr, value: u8, bytes: usize) -> DResult<()> {
        self.call("cuMemsetD8", || {
            self.check_dev(dev)?;
            let st = self.state.lock();
            check_access(&st, dev, dst, bytes)?;
            // SAFETY: the range is mapped read-write (checked above, lock held).
            unsafe { std::ptr::write_bytes(dst as *mut u8, value, bytes) };
            Ok(())
        })
    }

    fn module_load(&self, dev: Device, image: &[u8]) -> DResult<Module> {
        self.call("cuModuleLoadData", || {
            self.check_dev(dev)?;
            if image.is_empty() {
                return Err(CuResult::ERROR_INVALID_IMAGE);
            }
            let mut st = self.state.lock();
            let id = st.fresh_id() as usize;
            st.modules.insert(id, (dev, Vec::new()));
            Ok(Module(id))
        })
    }

    fn module_unload(&self, dev: Device, module: Module) -> DResult<()> {
        self.call("cuModuleUnload", || {
            self.check_dev(dev)?;
            self.state.lock().modules.remove(&module.0).map(|_| ()).ok_or(CuResult::ERROR_INVALID_HANDLE)
        })
    }

    fn module_function(&self, dev: Device, module: Module, name: &CStr) -> DResult<Function> {
        self.call("cuModuleGetFunction", || {
            self.check_dev(dev)?;
            let mut st = self.state.lock();
            if !st.modules.contains_key(&module.0) {
                return Err(CuResult::ERROR_INVALID_HANDLE);
            }
            if name.is_empty() {
                return Err(CuResult::ERROR_NOT_FOUND);
            }
            let id = st.fresh_id() as usize;
            if let Some((_, functions)) = st.modules.get_mut(&module.0) {
                functions.push(id);
            }
            Ok(Function(id))
        })
    }

    fn launch(
        &self,
        dev: Device,
        _func: Function,
        _config: &LaunchConfig,
        _stream: Stream,
        _params: &mut [*mut c_void],
    ) -> DResult<()> {
        self.call("cuLaunchKernel", || {
            self.check_dev(dev)?;
            // The simulator cannot run cubins; the kernels layer runs host code through `enqueue`.
            Err(CuResult::ERROR_NOT_SUPPORTED)
        })
    }

    fn as_sim(&self) -> Option<&SimDriver> {
        Some(self)
    }
}

/// Device, handle types and size of a memory memfd made by a simulator (any process).
fn parse_mem_tag(fd: RawFd) -> Option<(Device, HandleTypes, usize)> {
    let (tag, size) = host::memfd_tag(fd)?;
    let rest = tag.strip_prefix("mem:dev=")?;
    let (dev, types) = rest.split_once(":types=")?;
    Some((dev.parse().ok()?, HandleTypes(types.parse().ok()?), size))
}

/// A close-on-exec duplicate of `fd`.
fn host_dup(fd: RawFd) -> R<OwnedFd> {
    // SAFETY: the caller's descriptor is open for the duration of the call.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    borrowed.try_clone_to_owned().map_err(|_| CuResult::ERROR_OUT_OF_MEMORY)
}

/// The layout of a simulated `cuMemAlloc` block of `size` bytes.
fn plain_layout(size: usize) -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(size.max(1), PLAIN_ALIGN).expect("a valid layout")
}

/// `[ptr, ptr + len)` lies in unicast mappings that `dev` may access, with no gap, or in one
/// `cuMemAlloc` block of `dev`.
fn check_access(st: &State, dev: Device, ptr: u64, len: usize) -> R<()> {
    if len == 0 {
        return Ok(());
    }
    if let Some((start, owner, size)) = st.plain_at(ptr) {
        let end = ptr.checked_add(len as u64).ok_or(INVALID_VALUE)?;
        return if owner == dev && end <= start + size as u64 { Ok(()) } else { Err(INVALID_VALUE) };
    }
    for start in st.covering(ptr, len)? {
        let m = st.mappings.get(&start).ok_or(INVALID_VALUE)?;
        if m.multicast || !m.access.contains(&dev) {
            return Err(INVALID_VALUE);
        }
    }
    Ok(())
}
