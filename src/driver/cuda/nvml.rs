//! NVML's GPU fabric info, loaded at run time like the driver: `libnvidia-ml.so.1` opened once
//! with `dlopen`, `nvmlInit_v2`, a device found by its UUID (`nvmlDeviceGetHandleByUUID`),
//! then `nvmlDeviceGetGpuFabricInfoV` (R550+) or `nvmlDeviceGetGpuFabricInfo` (R530+). No
//! library, no symbol, or any NVML failure reads as "no fabric": never an error, never a panic.

use std::ffi::{c_char, c_uint, c_void, CString};
use std::sync::OnceLock;

use crate::driver::{uuid_string, FabricInfo, FabricState};

type NvmlDevice = *mut c_void;
type InitFn = unsafe extern "C" fn() -> c_uint;
type ByUuidFn = unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> c_uint;
type InfoFn = unsafe extern "C" fn(NvmlDevice, *mut c_void) -> c_uint;

/// `nvmlGpuFabricInfo_v2_t` (nvml.h): what `nvmlDeviceGetGpuFabricInfoV` fills.
#[repr(C)]
#[derive(Default)]
struct InfoV2 {
    version: c_uint,
    cluster_uuid: [u8; 16],
    status: c_uint,
    clique_id: c_uint,
    state: u8,
    health_mask: c_uint,
}

/// `nvmlGpuFabricInfo_t` (nvml.h): what `nvmlDeviceGetGpuFabricInfo` fills.
#[repr(C)]
#[derive(Default)]
struct InfoV1 {
    cluster_uuid: [u8; 16],
    status: c_uint,
    clique_id: c_uint,
    state: u8,
}

/// `NVML_STRUCT_VERSION(GpuFabricInfo, 2)`: the struct's size with the version in the top byte.
const INFO_V2_VERSION: c_uint = std::mem::size_of::<InfoV2>() as c_uint | (2 << 24);
const NVML_SUCCESS: c_uint = 0;
/// `NVML_GPU_FABRIC_STATE_IN_PROGRESS`, `NVML_GPU_FABRIC_STATE_COMPLETED`.
const STATE_IN_PROGRESS: u8 = 2;
const STATE_COMPLETED: u8 = 3;

struct Nvml {
    by_uuid: ByUuidFn,
    info_v: Option<InfoFn>,
    info: Option<InfoFn>,
}

// SAFETY: plain function pointers into a library that stays loaded for the process's life.
unsafe impl Send for Nvml {}
// SAFETY: as above; NVML's functions are thread-safe.
unsafe impl Sync for Nvml {}

fn symbol(lib: *mut c_void, name: &str) -> Option<*mut c_void> {
    let c = CString::new(name).ok()?;
    // SAFETY: `lib` is a handle from dlopen; `c` a NUL-terminated name.
    let p = unsafe { libc::dlsym(lib, c.as_ptr()) };
    (!p.is_null()).then_some(p)
}

fn load() -> Option<Nvml> {
    let name = CString::new("libnvidia-ml.so.1").ok()?;
    // SAFETY: opening the system's NVML library runs its initialisers, as any NVML program does;
    // the handle is kept for the process's life.
    let lib = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if lib.is_null() {
        return None;
    }
    // SAFETY: each address is the named NVML function, whose C signature is declared above
    // (nvml.h: nvmlReturn_t is an unsigned int enum, nvmlDevice_t a pointer).
    unsafe {
        let init = std::mem::transmute::<*mut c_void, InitFn>(symbol(lib, "nvmlInit_v2")?);
        if init() != NVML_SUCCESS {
            return None;
        }
        Some(Nvml {
            by_uuid: std::mem::transmute::<*mut c_void, ByUuidFn>(symbol(lib, "nvmlDeviceGetHandleByUUID")?),
            info_v: symbol(lib, "nvmlDeviceGetGpuFabricInfoV").map(|p| std::mem::transmute::<*mut c_void, InfoFn>(p)),
            info: symbol(lib, "nvmlDeviceGetGpuFabricInfo").map(|p| std::mem::transmute::<*mut c_void, InfoFn>(p)),
        })
    }
}

fn nvml() -> Option<&'static Nvml> {
    static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
    NVML.get_or_init(load).as_ref()
}

/// The fabric info of the GPU with `uuid`; [`FabricState::None`] where NVML cannot say.
pub(super) fn fabric_info(uuid: &[u8; 16]) -> FabricInfo {
    let Some(n) = nvml() else { return FabricInfo::default() };
    let Ok(name) = CString::new(uuid_string(uuid)) else { return FabricInfo::default() };
    let mut dev: NvmlDevice = std::ptr::null_mut();
    // SAFETY: a NUL-terminated UUID string and a local out-pointer.
    if unsafe { (n.by_uuid)(name.as_ptr(), &mut dev) } != NVML_SUCCESS {
        return FabricInfo::default();
    }
    let (cluster, status, clique, state) = if let Some(f) = n.info_v {
        let mut v = InfoV2 { version: INFO_V2_VERSION, ..InfoV2::default() };
        // SAFETY: `v` is the versioned struct its version field names.
        if unsafe { f(dev, (&mut v as *mut InfoV2).cast()) } != NVML_SUCCESS {
            return FabricInfo::default();
        }
        (v.cluster_uuid, v.status, v.clique_id, v.state)
    } else if let Some(f) = n.info {
        let mut v = InfoV1::default();
        // SAFETY: `v` is the struct this entry point fills.
        if unsafe { f(dev, (&mut v as *mut InfoV1).cast()) } != NVML_SUCCESS {
            return FabricInfo::default();
        }
        (v.cluster_uuid, v.status, v.clique_id, v.state)
    } else {
        return FabricInfo::default();
    };
    let state = match state {
        STATE_COMPLETED if status == NVML_SUCCESS => FabricState::Completed,
        STATE_IN_PROGRESS => FabricState::InProgress,
        // Not supported, not started, or registration failed.
        _ => return FabricInfo::default(),
    };
    FabricInfo { cluster_uuid: cluster, clique_id: clique, state }
}
