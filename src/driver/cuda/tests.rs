//! Tests of the loader and symbol table, the conversions, and (on a GPU) round trips through
//! the real driver.

use std::borrow::Cow;
use std::ptr;

use super::exec::module_image;
use super::memory::{alloc_handle_types, alloc_prop};
use super::multicast::multicast_prop;
use super::symbols::not_supported;
use super::*;
use crate::driver::{
    CopyOps, Device, DeviceOps, DevicePtr, ExecOps, Granularity, HandleTypes, LaunchConfig, MemHandle, MemoryOps,
    MulticastOps, MulticastProp, Stream,
};
use std::collections::HashSet;

/// Never called: only its address stands in for driver entry points.
extern "C" fn placeholder() {}

fn fake_lookup(missing: &'static [&'static str]) -> impl Fn(&'static str) -> Option<*mut c_void> {
    move |name| (!missing.contains(&name)).then_some(placeholder as *mut c_void)
}

#[test]
fn load_without_library_is_an_error_not_a_panic() {
    let result = std::panic::catch_unwind(CudaDriver::load);
    let result = match result {
        Ok(r) => r,
        Err(_) => panic!("CudaDriver::load panicked"),
    };
    if library_present() {
        eprintln!("libcuda present: load() -> {:?}", result.as_ref().err());
    } else {
        assert_eq!(result.err(), Some(LIBRARY_ABSENT));
        assert_eq!(LIBRARY_ABSENT.func, "cuInit");
        assert_eq!(LIBRARY_ABSENT.code, CuResult::ERROR_NOT_INITIALIZED);
    }
}

#[test]
fn symbol_lists_are_nonempty_and_unique() {
    assert!(!REQUIRED_SYMBOLS.is_empty());
    assert!(!OPTIONAL_SYMBOLS.is_empty());
    let mut seen = HashSet::new();
    for name in REQUIRED_SYMBOLS.iter().chain(OPTIONAL_SYMBOLS) {
        assert!(name.starts_with("cu"), "{name}");
        assert!(seen.insert(*name), "{name} listed twice");
    }
    // The ABI-versioned names cudarc's bindings use, not the header macros.
    for name in [
        "cuDeviceTotalMem_v2",
        "cuDevicePrimaryCtxRelease_v2",
        "cuCtxPushCurrent_v2",
        "cuCtxPopCurrent_v2",
        "cuStreamDestroy_v2",
        "cuEventDestroy_v2",
        "cuMemcpyHtoD_v2",
        "cuMemcpyDtoH_v2",
        "cuMemsetD8_v2",
    ] {
        assert!(REQUIRED_SYMBOLS.contains(&name), "{name}");
    }
    for name in [
        "cuFuncLoad",
        "cuLaunchKernelEx",
        "cuMulticastCreate",
        "cuMulticastAddDevice",
        "cuMulticastBindMem",
        "cuMulticastBindAddr",
        "cuMulticastUnbind",
        "cuMulticastGetGranularity",
        "cuMulticastBindMem_v2",
        "cuMulticastBindAddr_v2",
        "cuStreamBeginCapture_v2",
        "cuStreamEndCapture",
        "cuGraphInstantiateWithFlags",
        "cuGraphLaunch",
        "cuGraphExecDestroy",
        "cuGraphDestroy",
    ] {
        assert!(OPTIONAL_SYMBOLS.contains(&name), "{name}");
    }
}

#[test]
fn resolve_names_the_missing_required_symbol() {
    assert_eq!(Api::resolve(&fake_lookup(&["cuMemMap"])).err(), Some("cuMemMap"));
    assert_eq!(Api::resolve(&fake_lookup(&["cuDeviceTotalMem_v2"])).err(), Some("cuDeviceTotalMem_v2"));
    let null = |_: &'static str| Some(ptr::null_mut());
    assert_eq!(Api::resolve(&null).err(), Some(REQUIRED_SYMBOLS[0]));
}

#[test]
fn resolve_records_missing_optional_symbols() {
    let api = match Api::resolve(&fake_lookup(&[])) {
        Ok(api) => api,
        Err(name) => panic!("{name} reported missing"),
    };
    assert!(api.missing_optional().is_empty());
    let api = match Api::resolve(&fake_lookup(&["cuMulticastBindMem_v2", "cuMulticastCreate"])) {
        Ok(api) => api,
        Err(name) => panic!("{name} reported missing"),
    };
    assert!(api.cuMulticastCreate.is_none());
    assert!(api.cuMulticastBindMem_v2.is_none());
    assert!(api.cuMulticastBindAddr_v2.is_some());
    assert_eq!(api.missing_optional(), vec!["cuMulticastCreate", "cuMulticastBindMem_v2"]);
    // A driver without CUDA graphs still loads; only the graph entry points are absent.
    let api = match Api::resolve(&fake_lookup(&["cuStreamBeginCapture_v2", "cuGraphLaunch"])) {
        Ok(api) => api,
        Err(name) => panic!("{name} reported missing"),
    };
    assert!(api.cuStreamBeginCapture_v2.is_none() && api.cuGraphLaunch.is_none());
    assert!(api.cuStreamEndCapture.is_some() && api.cuGraphInstantiateWithFlags.is_some());
    assert_eq!(api.missing_optional(), vec!["cuStreamBeginCapture_v2", "cuGraphLaunch"]);
}

#[test]
fn handle_types_map_to_cuda_bits() {
    use cu::CUmemAllocationHandleType as H;
    assert_eq!(alloc_handle_types(HandleTypes::NONE), H::CU_MEM_HANDLE_TYPE_NONE);
    assert_eq!(alloc_handle_types(HandleTypes::POSIX_FD), H::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    assert_eq!(alloc_handle_types(HandleTypes::FABRIC), H::CU_MEM_HANDLE_TYPE_FABRIC);
    assert_eq!(
        alloc_handle_types(HandleTypes(HandleTypes::POSIX_FD.0 | HandleTypes::FABRIC.0)),
        H::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | H::CU_MEM_HANDLE_TYPE_FABRIC
    );
    let mc =
        multicast_prop(&MulticastProp { num_devices: 4, size: 2 << 20, handle_types: HandleTypes::FABRIC, flags: 0 });
    assert_eq!(mc.numDevices, 4);
    assert_eq!(mc.size, 2 << 20);
    assert_eq!(mc.handleTypes, u64::from(H::CU_MEM_HANDLE_TYPE_FABRIC.0));
    assert_eq!(mc.flags, 0);
}

#[test]
fn alloc_prop_is_pinned_device_memory() {
    let prop = alloc_prop(3, HandleTypes::POSIX_FD);
    assert_eq!(prop.type_, cu::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED);
    assert_eq!(prop.location.type_, cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE);
    assert_eq!(prop.location.id, 3);
    assert_eq!(prop.requestedHandleTypes, cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    assert!(prop.win32HandleMetaData.is_null());
}

#[test]
fn module_images_are_nul_terminated_text_or_binaries() {
    assert_eq!(&*module_image(b".version 7.0"), b".version 7.0\0");
    assert!(matches!(module_image(b"ptx\0"), Cow::Borrowed(_)));
    let elf = [0x7f, b'E', b'L', b'F', 2, 1];
    assert!(matches!(module_image(&elf), Cow::Borrowed(_)));
    let fatbin = [0x50, 0xED, 0x55, 0xBA, 1, 0];
    assert!(matches!(module_image(&fatbin), Cow::Borrowed(_)));
    assert_eq!(&*module_image(b""), b"\0");
}

#[test]
fn errors_name_the_function() {
    assert_eq!(check("cuMemMap", 0), Ok(()));
    assert_eq!(check("cuMemMap", 2), Err(DriverError::new("cuMemMap", CuResult::ERROR_OUT_OF_MEMORY)));
    // A code newer than any binding survives as a number.
    assert_eq!(check("cuMemMap", 12345).map_err(|e| e.code), Err(CuResult(12345)));
    assert_eq!(not_supported("cuMulticastCreate").code, CuResult::ERROR_NOT_SUPPORTED);
}

// ---- GPU tests: `cargo test gpu_ -- --include-ignored`. They skip where no driver loads,
// and never create a multicast object (see DESIGN.md, "Safety rule").

/// The driver, or `None` (printed as skipped) where there is no CUDA driver or device.
fn gpu_driver() -> Option<CudaDriver> {
    if !library_present() {
        eprintln!("skipped: no CUDA driver");
        return None;
    }
    match CudaDriver::load() {
        Ok(d) => Some(d),
        Err(e) if e.code == CuResult::ERROR_NO_DEVICE => {
            eprintln!("skipped: no CUDA device ({e})");
            None
        }
        Err(e) => panic!("CudaDriver::load failed: {e}"),
    }
}

fn current_ctx(d: &CudaDriver) -> usize {
    let mut ctx: cu::CUcontext = ptr::null_mut();
    // SAFETY: the out-pointer is a local.
    let raw = unsafe { (d.api.cuCtxGetCurrent)(&mut ctx) };
    assert_eq!(check("cuCtxGetCurrent", raw), Ok(()));
    ctx as usize
}

/// One granularity-sized allocation on `dev`, mapped read-write there.
struct Mapped {
    handle: MemHandle,
    ptr: DevicePtr,
    size: usize,
}

fn map_one(d: &CudaDriver, dev: Device, types: HandleTypes) -> Mapped {
    let size = d.mem_granularity(dev, Granularity::Minimum, types).unwrap();
    assert!(size > 0 && size.is_power_of_two(), "{size}");
    let handle = d.mem_create(dev, size, types).unwrap();
    let ptr = d.mem_address_reserve(size, size).unwrap();
    d.mem_map(ptr, size, 0, handle).unwrap();
    d.mem_set_access(ptr, size, &[dev]).unwrap();
    Mapped { handle, ptr, size }
}

fn unmap_one(d: &CudaDriver, m: Mapped) {
    d.mem_unmap(m.ptr, m.size).unwrap();
    d.mem_release(m.handle).unwrap();
    d.mem_address_free(m.ptr, m.size).unwrap();
}

const FILL_PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry mcast_test_fill(
.param .u64 mcast_test_fill_param_0,
.param .u32 mcast_test_fill_param_1
)
{
.reg .b32 %r<4>;
.reg .b64 %rd<5>;

ld.param.u64 %rd1, [mcast_test_fill_param_0];
ld.param.u32 %r1, [mcast_test_fill_param_1];
cvta.to.global.u64 %rd2, %rd1;
mov.u32 %r2, %tid.x;
add.s32 %r3, %r1, %r2;
mul.wide.u32 %rd3, %r2, 4;
add.s64 %rd4, %rd2, %rd3;
st.global.u32 [%rd4], %r3;
ret;
}
"#;

#[test]
fn gpu_device_count_and_props() {
    let Some(d) = gpu_driver() else { return };
    assert_eq!(d.backend_name(), "cuda");
    let version = d.driver_version().unwrap();
    let count = d.device_count().unwrap();
    assert!(count >= 1);
    eprintln!(
        "driver {version}, {count} device(s), multicast API {}, bind_v2 {}, missing {:?}",
        d.has_multicast_api(),
        d.has_multicast_bind_v2(),
        d.missing_optional_symbols()
    );
    for dev in 0..count {
        let p = d.device_props(dev).unwrap();
        eprintln!("device {dev}: {p:?}");
        assert!(!p.name.is_empty());
        assert!(p.cc_major >= 3);
        assert!(p.total_memory > 0);
        assert!(p.sm_count > 0);
        assert!(d.can_access_peer(dev, dev).unwrap());
        for peer in 0..count {
            d.can_access_peer(dev, peer).unwrap();
        }
    }
    assert_eq!(d.device_props(count).err().map(|e| e.code), Some(CuResult::ERROR_INVALID_DEVICE));
}

#[test]
fn gpu_vmm_round_trip() {
    let Some(d) = gpu_driver() else { return };
    assert!(d.device_props(0).unwrap().vmm_supported);
    let m = map_one(&d, 0, HandleTypes::NONE);
    d.memset_d8(0, m.ptr, 0xAB, m.size).unwrap();
    let mut back = vec![0u8; m.size];
    d.memcpy_dtoh(0, &mut back, m.ptr).unwrap();
    assert!(back.iter().all(|&b| b == 0xAB));
    let pattern: Vec<u8> = (0..m.size).map(|i| (i * 7 + 3) as u8).collect();
    d.memcpy_htod(0, m.ptr, &pattern).unwrap();
    d.memcpy_dtoh(0, &mut back, m.ptr).unwrap();
    assert_eq!(back, pattern);
    unmap_one(&d, m);
}

#[test]
fn gpu_posix_fd_export_import() {
    let Some(d) = gpu_driver() else { return };
    if !d.device_props(0).unwrap().posix_fd_supported {
        eprintln!("skipped: POSIX fd handles not supported");
        return;
    }
    let m = map_one(&d, 0, HandleTypes::POSIX_FD);
    let fd = d.mem_export_fd(m.handle).unwrap();
    let imported = d.mem_import_fd(std::os::fd::AsRawFd::as_raw_fd(&fd)).unwrap();
    // The imported handle maps the same memory.
    let ptr = d.mem_address_reserve(m.size, m.size).unwrap();
    d.mem_map(ptr, m.size, 0, imported).unwrap();
    d.mem_set_access(ptr, m.size, &[0]).unwrap();
    d.memset_d8(0, m.ptr, 0x5C, m.size).unwrap();
    let mut back = vec![0u8; m.size];
    d.memcpy_dtoh(0, &mut back, ptr).unwrap();
    assert!(back.iter().all(|&b| b == 0x5C));
    d.mem_unmap(ptr, m.size).unwrap();
    d.mem_address_free(ptr, m.size).unwrap();
    d.mem_release(imported).unwrap();
    drop(fd);
    unmap_one(&d, m);
}

#[test]
fn gpu_stream_event_timing_and_launch() {
    let Some(d) = gpu_driver() else { return };
    let m = map_one(&d, 0, HandleTypes::NONE);
    let module = d.module_load(0, FILL_PTX.as_bytes()).unwrap();
    let func = d.module_function(0, module, c"mcast_test_fill").unwrap();
    let stream = d.stream_create(0).unwrap();
    assert_ne!(stream, Stream::DEFAULT);
    let (start, end) = (d.event_create(0).unwrap(), d.event_create(0).unwrap());
    d.event_record(0, start, stream).unwrap();
    let mut out: u64 = m.ptr;
    let mut base: u32 = 1000;
    let mut params = [(&mut out as *mut u64).cast::<c_void>(), (&mut base as *mut u32).cast::<c_void>()];
    let config = LaunchConfig::linear(1, 64);
    d.launch(0, func, &config, stream, &mut params).unwrap();
    d.event_record(0, end, stream).unwrap();
    let ms = d.event_elapsed_ms(0, start, end).unwrap();
    assert!(ms >= 0.0, "{ms}");
    d.stream_synchronize(0, stream).unwrap();
    d.stream_synchronize(0, Stream::DEFAULT).unwrap();
    let mut back = vec![0u8; 64 * 4];
    d.memcpy_dtoh(0, &mut back, m.ptr).unwrap();
    for (i, word) in back.chunks_exact(4).enumerate() {
        let v = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        assert_eq!(v, 1000 + i as u32);
    }
    d.event_destroy(0, start).unwrap();
    d.event_destroy(0, end).unwrap();
    d.stream_destroy(0, stream).unwrap();
    d.module_unload(0, module).unwrap();
    unmap_one(&d, m);
}

#[test]
fn gpu_a_stream_waits_on_an_event_of_another() {
    let Some(d) = gpu_driver() else { return };
    let m = map_one(&d, 0, HandleTypes::NONE);
    let module = d.module_load(0, FILL_PTX.as_bytes()).unwrap();
    let func = d.module_function(0, module, c"mcast_test_fill").unwrap();
    let (a, b) = (d.stream_create(0).unwrap(), d.stream_create(0).unwrap());
    let ev = d.event_create_untimed(0).unwrap();
    let mut out: u64 = m.ptr;
    let mut base: u32 = 7000;
    let mut params = [(&mut out as *mut u64).cast::<c_void>(), (&mut base as *mut u32).cast::<c_void>()];
    let config = LaunchConfig::linear(1, 64);
    d.launch(0, func, &config, a, &mut params).unwrap();
    d.event_record(0, ev, a).unwrap();
    // b copies what a's kernel wrote, after it (the wait), into the next 256 bytes.
    d.stream_wait_event(0, b, ev).unwrap();
    d.memcpy_dtod_async(0, m.ptr + 256, m.ptr, 256, b).unwrap();
    d.stream_synchronize(0, b).unwrap();
    let mut back = vec![0u8; 256];
    d.memcpy_dtoh(0, &mut back, m.ptr + 256).unwrap();
    for (i, word) in back.chunks_exact(4).enumerate() {
        assert_eq!(u32::from_le_bytes([word[0], word[1], word[2], word[3]]), 7000 + i as u32);
    }
    // An untimed event cannot be timed.
    assert!(d.event_elapsed_ms(0, ev, ev).is_err());
    d.event_destroy(0, ev).unwrap();
    d.stream_destroy(0, a).unwrap();
    d.stream_destroy(0, b).unwrap();
    d.module_unload(0, module).unwrap();
    unmap_one(&d, m);
}

#[test]
fn gpu_caller_context_restored() {
    let Some(d) = gpu_driver() else { return };
    // A fresh test thread has no current context: every call leaves it so.
    let before = current_ctx(&d);
    d.device_props(0).unwrap();
    let m = map_one(&d, 0, HandleTypes::NONE);
    let stream = d.stream_create(0).unwrap();
    d.stream_destroy(0, stream).unwrap();
    assert_eq!(current_ctx(&d), before);

    // With a caller's context current (the last device's primary context), calls on
    // device 0 restore it, on success and on failure.
    let last = d.device_count().unwrap() - 1;
    let mine = d.primary_ctx(last).unwrap();
    // SAFETY: `mine` is a primary context the driver retained.
    assert_eq!(check("cuCtxPushCurrent", unsafe { (d.api.cuCtxPushCurrent_v2)(mine) }), Ok(()));
    let module = d.module_load(0, FILL_PTX.as_bytes()).unwrap();
    assert_eq!(current_ctx(&d), mine as usize);
    let missing = d.module_function(0, module, c"no_such_kernel").err();
    assert_eq!(missing.map(|e| e.code), Some(CuResult::ERROR_NOT_FOUND));
    assert_eq!(current_ctx(&d), mine as usize);
    d.memset_d8(0, m.ptr, 1, m.size).unwrap();
    d.module_unload(0, module).unwrap();
    unmap_one(&d, m);
    assert_eq!(current_ctx(&d), mine as usize);
    let mut popped: cu::CUcontext = ptr::null_mut();
    // SAFETY: we pushed `mine` above; the out-pointer is a local.
    assert_eq!(check("cuCtxPopCurrent", unsafe { (d.api.cuCtxPopCurrent_v2)(&mut popped) }), Ok(()));
    assert_eq!(popped, mine);
    assert_eq!(current_ctx(&d), before);
}
