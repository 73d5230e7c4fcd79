//! Loading the compiled kernels on a device and launching them.
//!
//! A module holds one [`Unit`] (one collective for one dtype and operator, every algorithm of it),
//! so the first call compiles only what it needs. Modules are loaded once per (driver, device,
//! variant, unit) and their entry points are resolved at load time, so a launch after warm-up
//! does no allocation, no host synchronization (it is CUDA-graph capturable) and takes no lock:
//! the look-up is a thread-local cache hit and an atomic load, the argument struct is built on
//! the stack, then `cuLaunchKernel`.
//!
//! The module table: one `DeviceModules` per (driver, device), made on first use and kept for
//! the life of the process (as the modules are), with one `OnceLock` slot per (variant, unit),
//! indexed directly (no hashing). Each thread remembers the last few tables it used, so a
//! rank's thread finds its device's table without touching the shared list; loading a module
//! (the first call of a collective) is serialised by one lock, off the launch path.

use std::cell::Cell;
use std::ffi::{c_void, CString};
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLock};

use super::abi::{self, KernelArgs, KernelId, Variant, KERNEL_IDS};
use super::error::KernelError;
use super::select::{Family, Unit};
use super::{cache, nvrtc, DType, Launch, Path, RedOp};
use crate::driver::{Device, Driver, Function, LaunchConfig, Module, RelaxedCapture};

/// One module loaded on one device, with its unit's entry points by [`abi::KernelId::index`].
pub struct LoadedModule {
    /// The module.
    pub module: Module,
    functions: Vec<Option<Function>>,
}

/// Slots per variant: every (family, dtype, operator), copying families in their first slot,
/// with and without the LL kernels.
const SLOTS_PER_VARIANT: usize = 2 * Family::ALL.len() * DType::ALL.len() * RedOp::ALL.len();

/// The slot of `unit` in `variant` in a [`DeviceModules`] (the simulator keys its modules by it
/// too: `kernels::sim::load_module`).
pub(crate) fn slot(variant: Variant, unit: Unit) -> usize {
    let family = Family::ALL.iter().position(|f| *f == unit.family).unwrap_or(0);
    let red = unit.red.map_or(0, |(d, o)| d as usize * RedOp::ALL.len() + o as usize);
    let v = match variant {
        Variant::Multimem => 0,
        Variant::Emulated => 1,
    };
    v * SLOTS_PER_VARIANT
        + usize::from(unit.ll) * (SLOTS_PER_VARIANT / 2)
        + family * DType::ALL.len() * RedOp::ALL.len()
        + red
}

/// The modules loaded on one device by one driver.
struct DeviceModules {
    driver: usize,
    dev: Device,
    slots: [OnceLock<Arc<LoadedModule>>; 2 * SLOTS_PER_VARIANT],
    /// The kernels of this device launch programmatically ([`programmatic_on`]), decided at
    /// the first module load.
    programmatic: OnceLock<bool>,
}

/// Every (driver, device) table made so far; never shrinks (the tables are leaked, so that
/// threads may cache plain references to them).
static TABLES: RwLock<Vec<&'static DeviceModules>> = RwLock::new(Vec::new());

/// Serialises module loads, so that one module per (driver, device, variant, unit) is kept.
static LOADING: Mutex<()> = Mutex::new(());

/// How many tables each thread remembers.
const RECENT: usize = 4;

thread_local! {
    /// The tables this thread used last (most rank threads drive one device: one entry).
    static RECENT_TABLES: Cell<[Option<&'static DeviceModules>; RECENT]> = const { Cell::new([None; RECENT]) };
}

fn driver_key(driver: &dyn Driver) -> usize {
    driver as *const dyn Driver as *const () as usize
}

/// The module table of `driver`'s device `dev`: a thread-local hit, else the shared list (read
/// lock), else a new table (write lock, first use of the device).
fn device_modules(driver: &dyn Driver, dev: Device) -> &'static DeviceModules {
    let key = driver_key(driver);
    let recent = RECENT_TABLES.try_with(Cell::get).unwrap_or([None; RECENT]);
    if let Some(t) = recent.iter().flatten().find(|t| t.driver == key && t.dev == dev) {
        return t;
    }
    let found = TABLES.read().iter().copied().find(|t| t.driver == key && t.dev == dev);
    let table = found.unwrap_or_else(|| {
        let mut tables = TABLES.write();
        match tables.iter().copied().find(|t| t.driver == key && t.dev == dev) {
            Some(t) => t,
            None => {
                let t: &'static DeviceModules = Box::leak(Box::new(DeviceModules {
                    driver: key,
                    dev,
                    slots: std::array::from_fn(|_| OnceLock::new()),
                    programmatic: OnceLock::new(),
                }));
                tables.push(t);
                t
            }
        }
    });
    // Remember it, dropping the oldest.
    let mut next = [None; RECENT];
    next[0] = Some(table);
    next[1..].copy_from_slice(&recent[..RECENT - 1]);
    let _ = RECENT_TABLES.try_with(|c| c.set(next));
    table
}

/// The entry point of `kernel` in the module of `unit` in `variant` on `dev` if it is loaded (no
/// lock, no allocation); `None` when it is not loaded yet.
fn loaded_function(
    driver: &dyn Driver,
    dev: Device,
    variant: Variant,
    unit: Unit,
    kernel: KernelId,
) -> Option<Result<Function, KernelError>> {
    let module = device_modules(driver, dev).slots[slot(variant, unit)].get()?;
    Some(
        module.functions[kernel.index()]
            .ok_or_else(|| KernelError::Unsupported(format!("no entry point {}", kernel.name()))),
    )
}

/// True when `MCAST_EMULATE_MULTIMEM=1` asks for the emulated multicast kernels even where a
/// multicast address exists (read once).
pub fn emulate_forced() -> bool {
    static E: OnceLock<bool> = OnceLock::new();
    *E.get_or_init(|| std::env::var("MCAST_EMULATE_MULTIMEM").is_ok_and(|v| v == "1"))
}

/// True when `MCAST_PDL=on` (or `1`) asks for programmatic dependent launch (read once). Off by
/// default: it has not yet run on a GPU (docs/environment.md).
fn pdl_enabled() -> bool {
    static E: OnceLock<bool> = OnceLock::new();
    *E.get_or_init(|| std::env::var("MCAST_PDL").is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "on" | "1")))
}

/// True when the kernels launch on `dev` with programmatic dependent launch
/// ([`LaunchConfig::programmatic`]): each may start once the blocks of the kernel before it on
/// the stream have exited, its launch overlapping that kernel's completion, and waits for that
/// kernel's memory at its entry (`MCAST_ENTRY` in kernels/entry.cuh: `griddepcontrol.wait`).
/// Where `MCAST_PDL` is on, compute capability 9.0+ has the instructions and a driver of CUDA
/// 12.3+ captures such launches into graphs. It orders nothing differently: a kernel that waits
/// at its entry sees everything the kernel before it wrote, as after a plain launch.
fn programmatic_on(driver: &dyn Driver, dev: Device) -> bool {
    pdl_enabled()
        && driver.device_props(dev).is_ok_and(|p| p.cc_major >= 9)
        && driver.driver_version().is_ok_and(|v| v >= 12030)
}

/// The build a launch uses: the real multimem build for the multicast path with a multicast
/// address; the emulated build otherwise (it also holds the P2P kernels, and compiles for any
/// architecture).
pub fn variant_for(l: &Launch) -> Variant {
    if l.path == Path::Multicast && l.data_mc.is_some() && l.sync_mc.is_some() && !emulate_forced() {
        Variant::Multimem
    } else {
        Variant::Emulated
    }
}

/// Loads (compiling or from cache) the module of `unit` in `variant` on `dev`, once per driver,
/// device and unit. A first call of a collective does this; call it before CUDA-graph capture
/// to keep compilation and loading out of the capture.
pub fn prepare(
    driver: &dyn Driver,
    dev: Device,
    variant: Variant,
    unit: Unit,
) -> Result<Arc<LoadedModule>, KernelError> {
    let cell = &device_modules(driver, dev).slots[slot(variant, unit)];
    if let Some(m) = cell.get() {
        return Ok(m.clone());
    }
    let props = driver.device_props(dev)?;
    if (props.cc_major, props.cc_minor) < (7, 5) {
        return Err(KernelError::Unsupported(format!(
            "device {dev} has compute capability {}.{}; the kernels need 7.5+ (NVRTC 13)",
            props.cc_major, props.cc_minor
        )));
    }
    if variant == Variant::Multimem && props.cc_major < 9 {
        return Err(KernelError::Unsupported(format!(
            "multimem kernels need compute capability 9.0+, device {dev} has {}.{}",
            props.cc_major, props.cc_minor
        )));
    }
    let arch = nvrtc::arch_for(props.cc_major, props.cc_minor);
    // Compile outside the lock (slow); load under it so that one module per key is kept.
    let image = cache::cubin(&arch, variant, Some(unit))?;
    load(driver, dev, variant, unit, &image)
}

/// Loads `image` (a cubin, fatbin or PTX of `unit` built as `variant`) on `dev` as the module
/// launches of that unit use, resolving its entry points, unless one is loaded already (then
/// that one is returned). [`prepare`] calls it with the compiled image; tests call it with a
/// stand-in image on the simulator to run the launch path's look-ups without NVRTC.
#[doc(hidden)]
pub fn load(
    driver: &dyn Driver,
    dev: Device,
    variant: Variant,
    unit: Unit,
    image: &[u8],
) -> Result<Arc<LoadedModule>, KernelError> {
    let cell = &device_modules(driver, dev).slots[slot(variant, unit)];
    let _loading = LOADING.lock();
    if let Some(m) = cell.get() {
        return Ok(m.clone());
    }
    // A load is potentially unsafe in a stream capture: a collective's first call may come
    // while the application (this thread or another) captures a graph, and the load must not
    // invalidate it. It touches no stream, so the capture does not depend on it.
    let _relaxed = RelaxedCapture::enter(driver);
    let module = driver.module_load(dev, image)?;
    let mut functions = vec![None; KERNEL_IDS];
    for id in unit.kernels() {
        let name = CString::new(id.name()).expect("kernel names have no NUL");
        match driver.module_function(dev, module, &name) {
            Ok(f) => functions[id.index()] = Some(f),
            Err(e) => {
                let _ = driver.module_unload(dev, module);
                return Err(e.into());
            }
        }
    }
    let m = Arc::new(LoadedModule { module, functions });
    // Under `LOADING` and checked empty above: the set succeeds.
    let _ = cell.set(m.clone());
    device_modules(driver, dev).programmatic.get_or_init(|| programmatic_on(driver, dev));
    Ok(m)
}

/// Enqueues `l` on `l.stream`: chooses the entry point (multicast kernel, or its P2P fallback;
/// one-shot or two-shot all-reduce by [`abi::one_shot_max_bytes`]) and launches it. No host sync;
/// no allocation and no lock once the module of this device and build is loaded.
pub fn launch(driver: &dyn Driver, l: &Launch) -> Result<(), KernelError> {
    if driver.as_sim().is_some() {
        return Err(KernelError::Unsupported("the simulator runs collectives on the host, not with kernels".into()));
    }
    let Some(mut k) = resolve(driver, l)? else {
        return Ok(());
    };
    let mut params = [&mut k.args as *mut KernelArgs as *mut c_void];
    driver.launch(l.dev, k.func, &k.config, l.stream, &mut params)?;
    Ok(())
}

/// What [`launch`] hands `cuLaunchKernel` for one [`Launch`].
#[derive(Clone, Copy, Debug)]
pub struct Resolved {
    /// The entry point.
    pub func: Function,
    /// Grid and block.
    pub config: LaunchConfig,
    /// The kernel's argument.
    pub args: KernelArgs,
}

/// Everything [`launch`] does before `cuLaunchKernel`: the plan, the entry point (loading its
/// module on first use) and the argument. `Ok(None)`: nothing to launch (count 0).
pub fn resolve(driver: &dyn Driver, l: &Launch) -> Result<Option<Resolved>, KernelError> {
    let Some(plan) = abi::plan(l).map_err(KernelError::Unsupported)? else {
        return Ok(None);
    };
    if let Some(why) = plan.fallback {
        tracing::debug!(
            "{:?}: multicast kernel unavailable ({why}); using {:?} over P2P",
            l.collective,
            plan.kernel.kind
        );
    }
    let variant = variant_for(l);
    let unit = Unit::of(plan.kernel, l.ll);
    let func = match loaded_function(driver, l.dev, variant, unit, plan.kernel) {
        Some(f) => f?,
        None => {
            prepare(driver, l.dev, variant, unit)?;
            loaded_function(driver, l.dev, variant, unit, plan.kernel).expect("loaded by prepare")?
        }
    };
    let mut args: KernelArgs = abi::kernel_args(l, variant);
    args.push_row = plan.push_row;
    let config = launch_config(driver, l.dev, plan.blocks);
    Ok(Some(Resolved { func, config, args }))
}

/// `blocks` blocks of [`abi::THREADS`], programmatic where [`programmatic_on`] said so at the
/// device's first module load.
fn launch_config(driver: &dyn Driver, dev: Device, blocks: u32) -> LaunchConfig {
    let programmatic = device_modules(driver, dev).programmatic.get() == Some(&true);
    LaunchConfig { programmatic, ..LaunchConfig::linear(blocks, abi::THREADS) }
}

/// Enqueues rank `l.rank`'s barrier kernel (`mcast_barrier_p2p`, one block: one barrier across
/// the team on block slot 0, abort and timeout aware like every barrier) on `l.stream`. Only
/// `rank`, `nranks`, `dev`, `stream`, `sync` and `timeout_ns` of `l` are used (`data` must hold
/// `nranks` addresses, any). Capturable, like
/// [`launch`].
pub fn launch_barrier(driver: &dyn Driver, l: &Launch) -> Result<(), KernelError> {
    launch_fixed(driver, l, abi::KernelKind::BarrierP2p, 1)
}

/// Most blocks of the copy-out kernel: one 16-byte vector per thread of 128 blocks of 512 threads
/// is a staging area's 1 MiB in one pass, from most of the SMs (the loads of 32 blocks, four
/// vectors each, cost an all-gather through the staging area 0.8 us per chunk on 2 x H100).
const COPY_OUT_MAX_BLOCKS: u64 = 128;

/// Enqueues rank `l.rank`'s copy-out kernel (`mcast_copy_out`) on `l.stream`: for every rank
/// slot k with `l.data[k] != 0`, `l.count` bytes from `l.data[k]` to `l.out[k]` (addresses on
/// `l.dev`), unless this rank's error word (in `l.sync[l.rank]`) is set. No peer is waited for.
/// Capturable, like [`launch`].
pub fn launch_copy_out(driver: &dyn Driver, l: &Launch) -> Result<(), KernelError> {
    let rows = l.data.iter().filter(|&&a| a != 0).count() as u64;
    let bytes = rows.saturating_mul(l.count);
    let blocks = bytes.div_ceil(u64::from(abi::THREADS) * 16).clamp(1, COPY_OUT_MAX_BLOCKS);
    launch_fixed(driver, l, abi::KernelKind::CopyOut, blocks as u32)
}

/// Enqueues `kind`, an entry point of the all-gather module without a (dtype, operator), with
/// `blocks` blocks and the arguments of `l`.
fn launch_fixed(driver: &dyn Driver, l: &Launch, kind: abi::KernelKind, blocks: u32) -> Result<(), KernelError> {
    if driver.as_sim().is_some() {
        return Err(KernelError::Unsupported("the simulator runs collectives on the host, not with kernels".into()));
    }
    super::check_fixed(l, kind)?;
    let kernel = abi::KernelId { kind, red: None };
    let module = prepare(driver, l.dev, Variant::Emulated, Unit::of(kernel, l.ll))?;
    let func = module.functions[kernel.index()]
        .ok_or_else(|| KernelError::Unsupported(format!("no entry point {}", kernel.name())))?;
    let mut args: KernelArgs = abi::kernel_args(l, Variant::Emulated);
    let config = launch_config(driver, l.dev, blocks);
    let mut params = [&mut args as *mut KernelArgs as *mut c_void];
    driver.launch(l.dev, func, &config, l.stream, &mut params)?;
    Ok(())
}
