//! The process's mcast context: one per process, shared by every communicator and every
//! `ncclMemAlloc` allocation, made from the `MCAST_*` environment on first use and destroyed when
//! the last user goes; and the device a new rank uses.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use mcast::capi::config::{mcast_config_init, mcast_config_t};
use mcast::capi::context::{mcast_context_create, mcast_context_destroy, mcast_context_t};
use parking_lot::Mutex;

use crate::types::{self, check, Failure, Outcome};

/// The process's mcast context, shared by every communicator and every `ncclMemAlloc`
/// allocation, destroyed when the last of them goes.
struct Process {
    ctx: mcast_context_t,
    users: usize,
    sim: bool,
    devices: c_int,
}

static PROCESS: Mutex<Option<Process>> = Mutex::new(None);

/// What a user of the process context learns.
#[derive(Clone, Copy, Debug)]
pub struct ContextRef {
    /// The context.
    pub ctx: mcast_context_t,
    /// Whether it runs on the simulator.
    pub sim: bool,
    /// Its devices.
    pub devices: c_int,
}

/// Takes a reference to the process context, creating it (from the `MCAST_*` environment) on
/// first use.
pub fn acquire_context() -> Outcome<ContextRef> {
    let mut p = PROCESS.lock();
    if p.is_none() {
        let mut config = std::mem::MaybeUninit::<mcast_config_t>::zeroed();
        // SAFETY: a valid pointer to a config to fill.
        unsafe { mcast_config_init(config.as_mut_ptr()) };
        // SAFETY: filled above.
        let config = unsafe { config.assume_init() };
        let mut ctx = mcast_context_t { id: 0 };
        // SAFETY: valid pointers.
        check(unsafe { mcast_context_create(&config, &mut ctx) }, "creating the mcast context")?;
        let (sim, devices) = match mcast::runtime::handles::context(ctx.id) {
            Ok(c) => (c.driver().backend_name() == "sim", c.device_count() as c_int),
            Err(e) => {
                mcast_context_destroy(ctx);
                return Err(Failure::new(types::INTERNAL_ERROR, e.message));
            }
        };
        *p = Some(Process { ctx, users: 0, sim, devices });
    }
    let proc = p.as_mut().expect("made above");
    proc.users += 1;
    Ok(ContextRef { ctx: proc.ctx, sim: proc.sim, devices: proc.devices })
}

/// Drops a reference taken with [`acquire_context`]; the last one destroys the context.
pub fn release_context() {
    let mut p = PROCESS.lock();
    let last = match p.as_mut() {
        Some(proc) => {
            proc.users = proc.users.saturating_sub(1);
            proc.users == 0
        }
        None => false,
    };
    if last {
        let proc = p.take().expect("checked");
        let st = mcast_context_destroy(proc.ctx);
        if st.0 != 0 {
            tracing::warn!("mcast_nccl: destroying the mcast context: status {}", st.0);
        }
    }
}

/// The device a new rank uses: the calling thread's current CUDA device; on the simulator
/// `MCAST_SIM_DEVICE` if set, else `rank` modulo the simulated devices.
pub fn current_device(ctx: &ContextRef, rank: c_int) -> Outcome<c_int> {
    if ctx.sim {
        if let Some(v) = std::env::var("MCAST_SIM_DEVICE").ok().filter(|v| !v.is_empty()) {
            return v.trim().parse::<c_int>().map_err(|_| {
                Failure::new(types::INVALID_ARGUMENT, format!("MCAST_SIM_DEVICE={v:?} is not a device number"))
            });
        }
        return Ok(rank.rem_euclid(ctx.devices.max(1)));
    }
    cuda_current_device()
}

/// `cuCtxGetDevice` of the calling thread, looked up in the libcuda mcast already loaded.
fn cuda_current_device() -> Outcome<c_int> {
    type GetDevice = unsafe extern "C" fn(*mut c_int) -> c_int;
    static SYMBOL: OnceLock<Option<GetDevice>> = OnceLock::new();
    let f = SYMBOL.get_or_init(|| {
        // SAFETY: a NUL-terminated name; RTLD_NOLOAD only finds an already loaded library.
        let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if lib.is_null() {
            return None;
        }
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(lib, c"cuCtxGetDevice".as_ptr()) };
        // SAFETY: cuCtxGetDevice has this signature (CUresult (*)(CUdevice *)).
        (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, GetDevice>(p) })
    });
    let Some(f) = f else {
        return Err(Failure::new(types::UNHANDLED_CUDA_ERROR, "cuCtxGetDevice is not available in libcuda.so.1"));
    };
    let mut dev: c_int = 0;
    // SAFETY: a valid out-pointer.
    match unsafe { f(&mut dev) } {
        0 => Ok(dev),
        // CUDA_ERROR_INVALID_CONTEXT: no current context yet: the runtime's default device.
        201 => Ok(0),
        code => Err(Failure::new(types::UNHANDLED_CUDA_ERROR, format!("cuCtxGetDevice failed with CUresult {code}"))),
    }
}
