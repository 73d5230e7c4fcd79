//! Loading the compiled kernels on a device and launching them.
//!
//! A module holds one [`Unit`] (one collective for one dtype and operator, every algorithm of it),
//! so the first call compiles only what it needs. Modules are loaded once per (driver, device,
//! variant, unit) and their entry points are resolved at load time, so a launch after warm-up
//! does no allocation and no host synchronization (it is CUDA-graph capturable): look-up under a
//! lock, build the argument struct on the stack, `cuLaunchKernel`.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::abi::{self, KernelArgs, Variant, KERNEL_IDS};
use super::error::KernelError;
use super::select::Unit;
use super::{cache, nvrtc, Launch, Path};
use crate::driver::{Device, Driver, Function, LaunchConfig, Module};

/// One module loaded on one device, with its unit's entry points by [`abi::KernelId::index`].
pub struct LoadedModule {
    /// The module.
    pub module: Module,
    functions: Vec<Option<Function>>,
}

type Key = (usize, Device, Variant, Unit);

fn modules() -> &'static Mutex<HashMap<Key, Arc<LoadedModule>>> {
    static M: OnceLock<Mutex<HashMap<Key, Arc<LoadedModule>>>> = OnceLock::new();
    M.get_or_init(Default::default)
}

fn driver_key(driver: &dyn Driver) -> usize {
    driver as *const dyn Driver as *const () as usize
}

/// True when `MCAST_EMULATE_MULTIMEM=1` asks for the emulated multicast kernels even where a
/// multicast address exists (read once).
pub fn emulate_forced() -> bool {
    static E: OnceLock<bool> = OnceLock::new();
    *E.get_or_init(|| std::env::var("MCAST_EMULATE_MULTIMEM").is_ok_and(|v| v == "1"))
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
    let key = (driver_key(driver), dev, variant, unit);
    if let Some(m) = modules().lock().get(&key) {
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
    let image = cache::cubin(&arch, variant, Some(unit))?;
    // Compile outside the lock (slow); load under it so that one module per key is kept.
    let mut map = modules().lock();
    if let Some(m) = map.get(&key) {
        return Ok(m.clone());
    }
    let module = driver.module_load(dev, &image)?;
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
    map.insert(key, m.clone());
    Ok(m)
}

/// Enqueues `l` on `l.stream`: chooses the entry point (multicast kernel, or its P2P fallback;
/// one-shot or two-shot all-reduce by [`abi::one_shot_max_bytes`]) and launches it. No host sync;
/// no allocation once the module of this device and build is loaded.
pub fn launch(driver: &dyn Driver, l: &Launch) -> Result<(), KernelError> {
    if driver.as_sim().is_some() {
        return Err(KernelError::Unsupported("the simulator runs collectives on the host, not with kernels".into()));
    }
    let Some(plan) = abi::plan(l).map_err(KernelError::Unsupported)? else {
        return Ok(());
    };
    if let Some(why) = plan.fallback {
        tracing::debug!(
            "{:?}: multicast kernel unavailable ({why}); using {:?} over P2P",
            l.collective,
            plan.kernel.kind
        );
    }
    let variant = variant_for(l);
    let module = prepare(driver, l.dev, variant, Unit::of(plan.kernel))?;
    let func = module.functions[plan.kernel.index()]
        .ok_or_else(|| KernelError::Unsupported(format!("no entry point {}", plan.kernel.name())))?;
    let mut args: KernelArgs = abi::kernel_args(l, variant);
    args.push_row = plan.push_row;
    let config = LaunchConfig { grid: [plan.blocks, 1, 1], block: [abi::THREADS, 1, 1], shared_bytes: 0 };
    let mut params = [&mut args as *mut KernelArgs as *mut c_void];
    driver.launch(l.dev, func, &config, l.stream, &mut params)?;
    Ok(())
}

/// Enqueues rank `l.rank`'s barrier kernel (`mcast_barrier_p2p`, one block: one barrier across
/// the team on block slot 0, abort and timeout aware like every barrier) on `l.stream`. Only
/// `rank`, `nranks`, `dev`, `stream`, `sync` and `timeout_ns` of `l` are used (`data` must hold
/// `nranks` addresses, any). Capturable, like
/// [`launch`].
pub fn launch_barrier(driver: &dyn Driver, l: &Launch) -> Result<(), KernelError> {
    if driver.as_sim().is_some() {
        return Err(KernelError::Unsupported("the simulator runs collectives on the host, not with kernels".into()));
    }
    let n = l.nranks as usize;
    if n == 0 || l.rank >= l.nranks || l.sync.len() != n || l.data.len() != n || n > super::MAX_RANKS {
        return Err(KernelError::Unsupported(format!(
            "barrier of rank {} with {} sync and {} data addresses for {n} ranks",
            l.rank,
            l.sync.len(),
            l.data.len()
        )));
    }
    let kernel = abi::KernelId { kind: abi::KernelKind::BarrierP2p, red: None };
    let module = prepare(driver, l.dev, Variant::Emulated, Unit::of(kernel))?;
    let func = module.functions[kernel.index()]
        .ok_or_else(|| KernelError::Unsupported(format!("no entry point {}", kernel.name())))?;
    let mut args: KernelArgs = abi::kernel_args(l, Variant::Emulated);
    let config = LaunchConfig { grid: [1, 1, 1], block: [abi::THREADS, 1, 1], shared_bytes: 0 };
    let mut params = [&mut args as *mut KernelArgs as *mut c_void];
    driver.launch(l.dev, func, &config, l.stream, &mut params)?;
    Ok(())
}
