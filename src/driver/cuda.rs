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

use std::borrow::Cow;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::ptr;

use cudarc::driver::sys as cu;
use parking_lot::Mutex;

use super::{
    AllocationProps, CuResult, DResult, Device, DeviceProps, DevicePtr, Driver, DriverError, Event, Function,
    Granularity, Graph, GraphExec, HandleTypes, LaunchConfig, MemHandle, Module, MulticastProp, Stream,
    FABRIC_HANDLE_BYTES,
};

/// A `CUresult` as the integer the driver returns (never read as a Rust enum).
type Raw = u32;

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

/// Declares the driver entry points: the `Api` table of function pointers, the
/// [`REQUIRED_SYMBOLS`] and [`OPTIONAL_SYMBOLS`] lists, and the resolver.
macro_rules! driver_api {
    (
        required { $( $req:ident ( $( $rarg:ty ),* ); )* }
        optional { $( $opt:ident ( $( $oarg:ty ),* ); )* }
    ) => {
        /// The resolved entry points. A field is named exactly like the symbol it holds.
        #[allow(non_snake_case)]
        struct Api {
            $( $req: unsafe extern "C" fn( $( $rarg ),* ) -> Raw, )*
            $( $opt: Option<unsafe extern "C" fn( $( $oarg ),* ) -> Raw>, )*
        }

        /// The exact symbol strings [`CudaDriver::load`] requires; a missing one fails the load
        /// with `CUDA_ERROR_NOT_FOUND` and that name.
        pub const REQUIRED_SYMBOLS: &[&str] = &[ $( stringify!($req) ),* ];

        /// The exact symbol strings looked up once and used only when present.
        pub const OPTIONAL_SYMBOLS: &[&str] = &[ $( stringify!($opt) ),* ];

        impl Api {
            /// Builds the table from `lookup` (a symbol's address, or `None`).
            /// Returns the first missing required symbol as the error.
            fn resolve(lookup: &dyn Fn(&'static str) -> Option<*mut c_void>) -> Result<Api, &'static str> {
                Ok(Api {
                    $(
                        $req: {
                            let name = stringify!($req);
                            let addr = lookup(name).filter(|p| !p.is_null()).ok_or(name)?;
                            // SAFETY: `addr` is the non-null address of the exported driver
                            // function `name`, whose C signature is the one declared here
                            // (copied from cudarc's bindings of the CUDA 13.0 headers, with the
                            // `CUresult` return read as its underlying 32-bit integer).
                            unsafe {
                                std::mem::transmute::<*mut c_void, unsafe extern "C" fn( $( $rarg ),* ) -> Raw>(addr)
                            }
                        },
                    )*
                    $(
                        $opt: lookup(stringify!($opt)).filter(|p| !p.is_null()).map(|addr| {
                            // SAFETY: as above, for an optional entry point that is present.
                            unsafe {
                                std::mem::transmute::<*mut c_void, unsafe extern "C" fn( $( $oarg ),* ) -> Raw>(addr)
                            }
                        }),
                    )*
                })
            }

            /// The optional symbols the driver does not export.
            fn missing_optional(&self) -> Vec<&'static str> {
                let mut missing = Vec::new();
                $( if self.$opt.is_none() { missing.push(stringify!($opt)); } )*
                missing
            }
        }
    };
}

driver_api! {
    required {
        cuInit(c_uint);
        cuDriverGetVersion(*mut c_int);
        cuDeviceGet(*mut cu::CUdevice, c_int);
        cuDeviceGetCount(*mut c_int);
        cuDeviceGetName(*mut c_char, c_int, cu::CUdevice);
        cuDeviceGetAttribute(*mut c_int, cu::CUdevice_attribute, cu::CUdevice);
        cuDeviceTotalMem_v2(*mut usize, cu::CUdevice);
        cuDeviceCanAccessPeer(*mut c_int, cu::CUdevice, cu::CUdevice);
        cuDevicePrimaryCtxRetain(*mut cu::CUcontext, cu::CUdevice);
        cuDevicePrimaryCtxRelease_v2(cu::CUdevice);
        cuCtxGetCurrent(*mut cu::CUcontext);
        cuCtxPushCurrent_v2(cu::CUcontext);
        cuCtxPopCurrent_v2(*mut cu::CUcontext);
        cuMemGetAllocationGranularity(
            *mut usize,
            *const cu::CUmemAllocationProp,
            cu::CUmemAllocationGranularity_flags
        );
        cuMemCreate(*mut cu::CUmemGenericAllocationHandle, usize, *const cu::CUmemAllocationProp, u64);
        cuMemRelease(cu::CUmemGenericAllocationHandle);
        cuMemAddressReserve(*mut cu::CUdeviceptr, usize, usize, cu::CUdeviceptr, u64);
        cuMemAddressFree(cu::CUdeviceptr, usize);
        cuMemMap(cu::CUdeviceptr, usize, usize, cu::CUmemGenericAllocationHandle, u64);
        cuMemUnmap(cu::CUdeviceptr, usize);
        cuMemSetAccess(cu::CUdeviceptr, usize, *const cu::CUmemAccessDesc, usize);
        cuMemExportToShareableHandle(
            *mut c_void,
            cu::CUmemGenericAllocationHandle,
            cu::CUmemAllocationHandleType,
            u64
        );
        cuMemImportFromShareableHandle(
            *mut cu::CUmemGenericAllocationHandle,
            *mut c_void,
            cu::CUmemAllocationHandleType
        );
        cuStreamCreate(*mut cu::CUstream, c_uint);
        cuStreamDestroy_v2(cu::CUstream);
        cuStreamSynchronize(cu::CUstream);
        cuCtxSynchronize();
        cuCtxSetCurrent(cu::CUcontext);
        cuEventCreate(*mut cu::CUevent, c_uint);
        cuEventRecord(cu::CUevent, cu::CUstream);
        cuEventSynchronize(cu::CUevent);
        cuEventDestroy_v2(cu::CUevent);
        cuMemcpyHtoD_v2(cu::CUdeviceptr, *const c_void, usize);
        cuMemcpyDtoH_v2(*mut c_void, cu::CUdeviceptr, usize);
        cuMemsetD8_v2(cu::CUdeviceptr, u8, usize);
        cuMemRetainAllocationHandle(*mut cu::CUmemGenericAllocationHandle, *mut c_void);
        cuMemGetAllocationPropertiesFromHandle(*mut cu::CUmemAllocationProp, cu::CUmemGenericAllocationHandle);
        cuMemGetAddressRange_v2(*mut cu::CUdeviceptr, *mut usize, cu::CUdeviceptr);
        cuPointerGetAttribute(*mut c_void, cu::CUpointer_attribute, cu::CUdeviceptr);
        cuMemAlloc_v2(*mut cu::CUdeviceptr, usize);
        cuMemFree_v2(cu::CUdeviceptr);
        cuMemcpyHtoDAsync_v2(cu::CUdeviceptr, *const c_void, usize, cu::CUstream);
        cuMemcpyDtoHAsync_v2(*mut c_void, cu::CUdeviceptr, usize, cu::CUstream);
        cuMemcpyDtoDAsync_v2(cu::CUdeviceptr, cu::CUdeviceptr, usize, cu::CUstream);
        cuModuleLoadData(*mut cu::CUmodule, *const c_void);
        cuModuleUnload(cu::CUmodule);
        cuModuleGetFunction(*mut cu::CUfunction, cu::CUmodule, *const c_char);
        cuLaunchKernel(
            cu::CUfunction,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            cu::CUstream,
            *mut *mut c_void,
            *mut *mut c_void
        );
    }
    optional {
        cuMulticastCreate(*mut cu::CUmemGenericAllocationHandle, *const cu::CUmulticastObjectProp);
        cuMulticastAddDevice(cu::CUmemGenericAllocationHandle, cu::CUdevice);
        cuMulticastBindMem(cu::CUmemGenericAllocationHandle, usize, cu::CUmemGenericAllocationHandle, usize, usize, u64);
        cuMulticastBindAddr(cu::CUmemGenericAllocationHandle, usize, cu::CUdeviceptr, usize, u64);
        cuMulticastUnbind(cu::CUmemGenericAllocationHandle, cu::CUdevice, usize, usize);
        cuMulticastGetGranularity(*mut usize, *const cu::CUmulticastObjectProp, cu::CUmulticastGranularity_flags);
        cuMulticastBindMem_v2(
            cu::CUmemGenericAllocationHandle,
            cu::CUdevice,
            usize,
            cu::CUmemGenericAllocationHandle,
            usize,
            usize,
            u64
        );
        cuMulticastBindAddr_v2(cu::CUmemGenericAllocationHandle, cu::CUdevice, usize, cu::CUdeviceptr, usize, u64);
        cuEventElapsedTime_v2(*mut f32, cu::CUevent, cu::CUevent);
        cuEventElapsedTime(*mut f32, cu::CUevent, cu::CUevent);
        cuStreamBeginCapture_v2(cu::CUstream, c_uint);
        cuStreamEndCapture(cu::CUstream, *mut cu::CUgraph);
        cuGraphInstantiateWithFlags(*mut cu::CUgraphExec, cu::CUgraph, u64);
        cuGraphLaunch(cu::CUgraphExec, cu::CUstream);
        cuGraphExecDestroy(cu::CUgraphExec);
        cuGraphDestroy(cu::CUgraph);
    }
}

/// `Ok(())` for `CUDA_SUCCESS`, else the error of `func`.
fn check(func: &'static str, raw: Raw) -> DResult<()> {
    if raw == CuResult::SUCCESS.0 {
        Ok(())
    } else {
        Err(DriverError::new(func, CuResult(raw)))
    }
}

/// The error of calling an optional entry point the driver does not export.
fn not_supported(func: &'static str) -> DriverError {
    DriverError::new(func, CuResult::ERROR_NOT_SUPPORTED)
}

/// The `CUmemAllocationHandleType` bit set for `types`.
fn alloc_handle_types(types: HandleTypes) -> cu::CUmemAllocationHandleType {
    cu::CUmemAllocationHandleType_enum(types.0)
}

/// `CUmemAllocationProp` of pinned device memory on `dev` exportable as `types`.
fn alloc_prop(dev: cu::CUdevice, types: HandleTypes) -> cu::CUmemAllocationProp {
    cu::CUmemAllocationProp {
        type_: cu::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: alloc_handle_types(types),
        location: cu::CUmemLocation { type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: dev },
        win32HandleMetaData: ptr::null_mut(),
        allocFlags: cu::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// `CUmulticastObjectProp` of `prop`.
fn multicast_prop(prop: &MulticastProp) -> cu::CUmulticastObjectProp {
    cu::CUmulticastObjectProp {
        numDevices: prop.num_devices,
        size: prop.size,
        handleTypes: u64::from(prop.handle_types.0),
        flags: prop.flags,
    }
}

/// True when `image` is a binary (ELF cubin or fatbin) rather than PTX text.
fn is_binary_image(image: &[u8]) -> bool {
    const ELF: [u8; 4] = [0x7f, b'E', b'L', b'F'];
    const FATBIN: [u8; 4] = 0xBA55_ED50u32.to_le_bytes();
    image.starts_with(&ELF) || image.starts_with(&FATBIN)
}

/// The bytes to give `cuModuleLoadData`: a cubin or fatbin as is; PTX text NUL-terminated
/// (copied when it is not already).
fn module_image(image: &[u8]) -> Cow<'_, [u8]> {
    if is_binary_image(image) || image.last() == Some(&0) {
        Cow::Borrowed(image)
    } else {
        let mut text = Vec::with_capacity(image.len() + 1);
        text.extend_from_slice(image);
        text.push(0);
        Cow::Owned(text)
    }
}

/// A primary context retained by this driver.
#[derive(Clone, Copy)]
struct Retained {
    /// The `CUdevice` it belongs to.
    device: cu::CUdevice,
    /// The `CUcontext`, as an address (so the table is `Send`).
    ctx: usize,
}

/// Pops the context it pushed when dropped, restoring the caller's current context.
struct CtxGuard<'a> {
    api: &'a Api,
    pushed: bool,
}

impl Drop for CtxGuard<'_> {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped: cu::CUcontext = ptr::null_mut();
            // SAFETY: this guard pushed a context on this thread and nothing popped it since
            // (the guard lives only within one driver call); the out-pointer is a local.
            // A failure (e.g. `CUDA_ERROR_DEINITIALIZED` at exit) leaves nothing to undo.
            let _ = unsafe { (self.api.cuCtxPopCurrent_v2)(&mut popped) };
        }
    }
}

/// The CUDA driver, loaded at run time. Thread-safe.
pub struct CudaDriver {
    api: Api,
    /// Primary contexts retained so far, by device ordinal.
    contexts: Mutex<HashMap<Device, Retained>>,
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
        let driver = CudaDriver { api, contexts: Mutex::new(HashMap::new()) };
        if driver.device_count()? == 0 {
            return Err(DriverError::new("cuDeviceGetCount", CuResult::ERROR_NO_DEVICE));
        }
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

    /// `cuDeviceGet` for ordinal `dev`.
    fn cu_device(&self, dev: Device) -> DResult<cu::CUdevice> {
        let mut device: cu::CUdevice = 0;
        // SAFETY: the out-pointer is a local; the ordinal is checked by the driver.
        check("cuDeviceGet", unsafe { (self.api.cuDeviceGet)(&mut device, dev) })?;
        Ok(device)
    }

    /// The primary context of `dev`, retained on first use.
    fn primary_ctx(&self, dev: Device) -> DResult<cu::CUcontext> {
        let mut contexts = self.contexts.lock();
        if let Some(r) = contexts.get(&dev) {
            return Ok(r.ctx as cu::CUcontext);
        }
        let device = self.cu_device(dev)?;
        let mut ctx: cu::CUcontext = ptr::null_mut();
        // SAFETY: `device` came from `cuDeviceGet`; the out-pointer is a local. The retain is
        // balanced by `cuDevicePrimaryCtxRelease` in `Drop`.
        check("cuDevicePrimaryCtxRetain", unsafe { (self.api.cuDevicePrimaryCtxRetain)(&mut ctx, device) })?;
        contexts.insert(dev, Retained { device, ctx: ctx as usize });
        Ok(ctx)
    }

    /// Makes `dev`'s primary context current until the guard drops. When it already is current
    /// (a caller using the CUDA runtime on that device) nothing is pushed: one driver call on
    /// the launch path instead of three.
    fn enter(&self, dev: Device) -> DResult<CtxGuard<'_>> {
        let ctx = self.primary_ctx(dev)?;
        let mut current: cu::CUcontext = ptr::null_mut();
        // SAFETY: the out-pointer is a local.
        let raw = unsafe { (self.api.cuCtxGetCurrent)(&mut current) };
        if raw == CuResult::SUCCESS.0 && current == ctx {
            return Ok(CtxGuard { api: &self.api, pushed: false });
        }
        // SAFETY: `ctx` is a primary context this driver retained and has not released.
        check("cuCtxPushCurrent", unsafe { (self.api.cuCtxPushCurrent_v2)(ctx) })?;
        Ok(CtxGuard { api: &self.api, pushed: true })
    }

    /// Makes sure some context is current (the caller's, else device 0's primary context),
    /// best effort: when that fails the guard does nothing and the call reports its own error.
    /// The device ordinal of `ptr` (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`), or `None` when the
    /// driver does not know the pointer.
    fn pointer_ordinal(&self, ptr: DevicePtr) -> Option<Device> {
        let _ctx = self.enter_any();
        let mut ordinal: c_int = -1;
        // SAFETY: CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL writes one `int` into the local.
        let r = unsafe {
            (self.api.cuPointerGetAttribute)(
                (&mut ordinal as *mut c_int).cast(),
                cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr,
            )
        };
        (check("cuPointerGetAttribute", r).is_ok() && ordinal >= 0).then_some(ordinal)
    }

    fn enter_any(&self) -> CtxGuard<'_> {
        let mut current: cu::CUcontext = ptr::null_mut();
        // SAFETY: the out-pointer is a local.
        let raw = unsafe { (self.api.cuCtxGetCurrent)(&mut current) };
        if raw == CuResult::SUCCESS.0 && !current.is_null() {
            return CtxGuard { api: &self.api, pushed: false };
        }
        self.enter(0).unwrap_or(CtxGuard { api: &self.api, pushed: false })
    }

    /// `cuDeviceGetAttribute`.
    fn attribute(&self, device: cu::CUdevice, attr: cu::CUdevice_attribute) -> DResult<i32> {
        let mut value: c_int = 0;
        // SAFETY: the out-pointer is a local; `attr` is a valid attribute enumerator.
        check("cuDeviceGetAttribute", unsafe { (self.api.cuDeviceGetAttribute)(&mut value, attr, device) })?;
        Ok(value)
    }

    /// A boolean attribute; `CUDA_ERROR_INVALID_VALUE` (an attribute older drivers do not know)
    /// reads as unsupported.
    fn attribute_flag(&self, device: cu::CUdevice, attr: cu::CUdevice_attribute) -> DResult<bool> {
        match self.attribute(device, attr) {
            Ok(v) => Ok(v != 0),
            Err(e) if e.code == CuResult::ERROR_INVALID_VALUE => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `cuStreamSynchronize` of the legacy default stream of the current context.
    /// Runs `copy` (named `what`) on a fresh non-blocking stream of `dev`, waits for that
    /// stream only, and destroys it: the copy neither waits for nor is waited on by work on
    /// the caller's streams (a kernel spinning in a barrier included).
    fn on_private_stream(
        &self,
        dev: Device,
        what: &'static str,
        copy: impl FnOnce(&Api, cu::CUstream) -> Raw,
    ) -> DResult<()> {
        let _ctx = self.enter(dev)?;
        let mut stream: cu::CUstream = ptr::null_mut();
        // SAFETY: the out-pointer is a local; the flag is a valid `CUstream_flags` value.
        check("cuStreamCreate", unsafe {
            (self.api.cuStreamCreate)(&mut stream, cu::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint)
        })?;
        let copied = check(what, copy(&self.api, stream));
        // SAFETY: a stream created above; synchronizing it waits only for the copy.
        let synced = check("cuStreamSynchronize", unsafe { (self.api.cuStreamSynchronize)(stream) });
        // SAFETY: the stream is idle and owned here.
        let destroyed = check("cuStreamDestroy", unsafe { (self.api.cuStreamDestroy_v2)(stream) });
        copied.and(synced).and(destroyed)
    }

    fn sync_default_stream(&self) -> DResult<()> {
        // SAFETY: the NULL stream is the legacy default stream of the current context.
        check("cuStreamSynchronize", unsafe { (self.api.cuStreamSynchronize)(ptr::null_mut()) })
    }
}

impl Drop for CudaDriver {
    fn drop(&mut self) {
        for (_, r) in self.contexts.get_mut().drain() {
            // SAFETY: each entry was retained exactly once by `primary_ctx`. At process exit
            // the driver may already be torn down and return `CUDA_ERROR_DEINITIALIZED`:
            // there is nothing left to release then, so the result is ignored.
            let _ = unsafe { (self.api.cuDevicePrimaryCtxRelease_v2)(r.device) };
        }
    }
}

fn stream_ptr(stream: Stream) -> cu::CUstream {
    stream.0 as cu::CUstream
}

fn event_ptr(event: Event) -> cu::CUevent {
    event.0 as cu::CUevent
}

impl Driver for CudaDriver {
    fn backend_name(&self) -> &'static str {
        "cuda"
    }

    fn driver_version(&self) -> DResult<i32> {
        let mut version: c_int = 0;
        // SAFETY: the out-pointer is a local.
        check("cuDriverGetVersion", unsafe { (self.api.cuDriverGetVersion)(&mut version) })?;
        Ok(version)
    }

    fn device_count(&self) -> DResult<i32> {
        let mut count: c_int = 0;
        // SAFETY: the out-pointer is a local.
        check("cuDeviceGetCount", unsafe { (self.api.cuDeviceGetCount)(&mut count) })?;
        Ok(count)
    }

    fn device_props(&self, dev: Device) -> DResult<DeviceProps> {
        use cu::CUdevice_attribute as A;
        let device = self.cu_device(dev)?;
        let mut name = [0u8; 256];
        // SAFETY: the buffer is writable for its full length, which is what we pass.
        check("cuDeviceGetName", unsafe {
            (self.api.cuDeviceGetName)(name.as_mut_ptr().cast(), name.len() as c_int, device)
        })?;
        let name = match CStr::from_bytes_until_nul(&name) {
            Ok(s) => s.to_string_lossy().into_owned(),
            Err(_) => String::from_utf8_lossy(&name).into_owned(),
        };
        let mut total: usize = 0;
        // SAFETY: the out-pointer is a local; `device` came from `cuDeviceGet`.
        check("cuDeviceTotalMem", unsafe { (self.api.cuDeviceTotalMem_v2)(&mut total, device) })?;
        Ok(DeviceProps {
            name,
            cc_major: self.attribute(device, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            cc_minor: self.attribute(device, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            total_memory: total as u64,
            sm_count: self.attribute(device, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            multicast_supported: self.attribute_flag(device, A::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED)?,
            vmm_supported: self.attribute_flag(device, A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)?,
            posix_fd_supported: self
                .attribute_flag(device, A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)?,
            fabric_supported: self.attribute_flag(device, A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED)?,
        })
    }

    fn can_access_peer(&self, dev: Device, peer: Device) -> DResult<bool> {
        let a = self.cu_device(dev)?;
        let b = self.cu_device(peer)?;
        if a == b {
            return Ok(true);
        }
        let mut can: c_int = 0;
        // SAFETY: the out-pointer is a local; both devices came from `cuDeviceGet`.
        check("cuDeviceCanAccessPeer", unsafe { (self.api.cuDeviceCanAccessPeer)(&mut can, a, b) })?;
        Ok(can != 0)
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
        let device = self.cu_device(dev)?;
        let prop = alloc_prop(device, handle_types);
        let option = match option {
            Granularity::Minimum => cu::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            Granularity::Recommended => cu::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
        };
        let _ctx = self.enter(dev)?;
        let mut granularity: usize = 0;
        // SAFETY: `prop` and the out-pointer are locals that outlive the call.
        check("cuMemGetAllocationGranularity", unsafe {
            (self.api.cuMemGetAllocationGranularity)(&mut granularity, &prop, option)
        })?;
        Ok(granularity)
    }

    fn mem_create(&self, dev: Device, size: usize, handle_types: HandleTypes) -> DResult<MemHandle> {
        let device = self.cu_device(dev)?;
        let prop = alloc_prop(device, handle_types);
        let _ctx = self.enter(dev)?;
        let mut handle: cu::CUmemGenericAllocationHandle = 0;
        // SAFETY: `prop` and the out-pointer are locals that outlive the call; flags must be 0.
        check("cuMemCreate", unsafe { (self.api.cuMemCreate)(&mut handle, size, &prop, 0) })?;
        Ok(MemHandle(handle))
    }

    fn mem_release(&self, handle: MemHandle) -> DResult<()> {
        let _ctx = self.enter_any();
        // SAFETY: the handle is passed by value; the driver validates it.
        check("cuMemRelease", unsafe { (self.api.cuMemRelease)(handle.0) })
    }

    fn mem_address_reserve(&self, size: usize, alignment: usize) -> DResult<DevicePtr> {
        let _ctx = self.enter_any();
        let mut ptr: cu::CUdeviceptr = 0;
        // SAFETY: the out-pointer is a local; no fixed address is requested; flags must be 0.
        check("cuMemAddressReserve", unsafe { (self.api.cuMemAddressReserve)(&mut ptr, size, alignment, 0, 0) })?;
        Ok(ptr)
    }

    fn mem_address_free(&self, ptr: DevicePtr, size: usize) -> DResult<()> {
        let _ctx = self.enter_any();
        // SAFETY: plain values; the driver validates the range.
        check("cuMemAddressFree", unsafe { (self.api.cuMemAddressFree)(ptr, size) })
    }

    fn mem_map(&self, ptr: DevicePtr, size: usize, offset: usize, handle: MemHandle) -> DResult<()> {
        let _ctx = self.enter_any();
        // SAFETY: plain values; the driver validates the range and handle; flags must be 0.
        check("cuMemMap", unsafe { (self.api.cuMemMap)(ptr, size, offset, handle.0, 0) })
    }

    fn mem_retain_allocation_handle(&self, ptr: DevicePtr) -> DResult<MemHandle> {
        // In the context of the pointer's device, as for cuMemGetAddressRange.
        let _ctx = match self.pointer_ordinal(ptr) {
            Some(dev) => self.enter(dev)?,
            None => self.enter_any(),
        };
        let mut handle: cu::CUmemGenericAllocationHandle = 0;
        // SAFETY: the out-pointer is a local; the address is only looked up by the driver.
        check("cuMemRetainAllocationHandle", unsafe {
            (self.api.cuMemRetainAllocationHandle)(&mut handle, ptr as usize as *mut c_void)
        })?;
        Ok(MemHandle(handle))
    }

    fn mem_allocation_props(&self, handle: MemHandle) -> DResult<AllocationProps> {
        let _ctx = self.enter_any();
        let mut prop = alloc_prop(0, HandleTypes::NONE);
        // SAFETY: `prop` is a local the driver fills in.
        check("cuMemGetAllocationPropertiesFromHandle", unsafe {
            (self.api.cuMemGetAllocationPropertiesFromHandle)(&mut prop, handle.0)
        })?;
        // The handle types are a bit set the driver may write as any combination: read the
        // field as the integer it is, never as the Rust enum of the bindings.
        // SAFETY: the field is a 32-bit C enum inside the initialised local `prop`.
        let types = unsafe { ptr::addr_of!(prop.requestedHandleTypes).cast::<u32>().read() };
        Ok(AllocationProps { dev: prop.location.id, handle_types: HandleTypes(types) })
    }

    fn mem_address_range(&self, ptr: DevicePtr) -> DResult<(DevicePtr, usize)> {
        // A VMM mapping is found only from the context of a device with access to it (from
        // another device's context the driver answers NOT_FOUND: seen on 2 x H200), so the
        // query runs in the context of the pointer's own device.
        let _ctx = match self.pointer_ordinal(ptr) {
            Some(dev) => self.enter(dev)?,
            None => self.enter_any(),
        };
        let (mut base, mut size): (cu::CUdeviceptr, usize) = (0, 0);
        // SAFETY: the out-pointers are locals.
        check("cuMemGetAddressRange", unsafe { (self.api.cuMemGetAddressRange_v2)(&mut base, &mut size, ptr) })?;
        Ok((base, size))
    }

    fn pointer_device(&self, ptr: DevicePtr) -> DResult<Device> {
        let _ctx = self.enter_any();
        let mut kind: c_uint = 0;
        // SAFETY: CU_POINTER_ATTRIBUTE_MEMORY_TYPE writes one `unsigned int` into the local.
        check("cuPointerGetAttribute", unsafe {
            (self.api.cuPointerGetAttribute)(
                (&mut kind as *mut c_uint).cast(),
                cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                ptr,
            )
        })?;
        if kind != cu::CUmemorytype::CU_MEMORYTYPE_DEVICE as c_uint {
            return Err(DriverError::new("cuPointerGetAttribute", CuResult::ERROR_INVALID_VALUE));
        }
        let mut ordinal: c_int = -1;
        // SAFETY: CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL writes one `int` into the local.
        check("cuPointerGetAttribute", unsafe {
            (self.api.cuPointerGetAttribute)(
                (&mut ordinal as *mut c_int).cast(),
                cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr,
            )
        })?;
        Ok(ordinal)
    }

    fn mem_alloc(&self, dev: Device, size: usize) -> DResult<DevicePtr> {
        let _ctx = self.enter(dev)?;
        let mut ptr: cu::CUdeviceptr = 0;
        // SAFETY: the out-pointer is a local.
        check("cuMemAlloc", unsafe { (self.api.cuMemAlloc_v2)(&mut ptr, size) })?;
        Ok(ptr)
    }

    fn mem_free(&self, dev: Device, ptr: DevicePtr) -> DResult<()> {
        let _ctx = self.enter(dev)?;
        // SAFETY: plain value; the driver validates it.
        check("cuMemFree", unsafe { (self.api.cuMemFree_v2)(ptr) })
    }

    fn mem_unmap(&self, ptr: DevicePtr, size: usize) -> DResult<()> {
        let _ctx = self.enter_any();
        // SAFETY: plain values; the driver validates the range.
        check("cuMemUnmap", unsafe { (self.api.cuMemUnmap)(ptr, size) })
    }

    fn mem_set_access(&self, ptr: DevicePtr, size: usize, devices: &[Device]) -> DResult<()> {
        let descs: Vec<cu::CUmemAccessDesc> = devices
            .iter()
            .map(|&dev| cu::CUmemAccessDesc {
                location: cu::CUmemLocation { type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: dev },
                flags: cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect();
        let _ctx = self.enter_any();
        // SAFETY: `descs` holds `descs.len()` initialised descriptors and outlives the call.
        check("cuMemSetAccess", unsafe { (self.api.cuMemSetAccess)(ptr, size, descs.as_ptr(), descs.len()) })
    }

    fn mem_export_fd(&self, handle: MemHandle) -> DResult<OwnedFd> {
        let _ctx = self.enter_any();
        let mut fd: c_int = -1;
        // SAFETY: for CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR the driver writes an `int` to
        // the out-pointer, which is a local `c_int`; flags must be 0.
        check("cuMemExportToShareableHandle", unsafe {
            (self.api.cuMemExportToShareableHandle)(
                (&mut fd as *mut c_int).cast(),
                handle.0,
                cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        })?;
        if fd < 0 {
            return Err(DriverError::new("cuMemExportToShareableHandle", CuResult::ERROR_UNKNOWN));
        }
        // SAFETY: the driver returned a new file descriptor that we now own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn mem_import_fd(&self, fd: RawFd) -> DResult<MemHandle> {
        let _ctx = self.enter_any();
        let mut handle: cu::CUmemGenericAllocationHandle = 0;
        // SAFETY: for POSIX file descriptors the driver takes the descriptor itself cast to a
        // pointer (`(void *)(uintptr_t)fd`) and does not take ownership of it; the out-pointer
        // is a local.
        check("cuMemImportFromShareableHandle", unsafe {
            (self.api.cuMemImportFromShareableHandle)(
                &mut handle,
                fd as usize as *mut c_void,
                cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        })?;
        Ok(MemHandle(handle))
    }

    fn mem_export_fabric(&self, handle: MemHandle) -> DResult<[u8; FABRIC_HANDLE_BYTES]> {
        let _ctx = self.enter_any();
        let mut out = cu::CUmemFabricHandle { data: [0; FABRIC_HANDLE_BYTES] };
        // SAFETY: for CU_MEM_HANDLE_TYPE_FABRIC the driver writes a `CUmemFabricHandle` (64
        // bytes) to the out-pointer, which is a local of that type; flags must be 0.
        check("cuMemExportToShareableHandle", unsafe {
            (self.api.cuMemExportToShareableHandle)(
                (&mut out as *mut cu::CUmemFabricHandle).cast(),
                handle.0,
                cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC,
                0,
            )
        })?;
        Ok(out.data)
    }

    fn mem_import_fabric(&self, data: &[u8; FABRIC_HANDLE_BYTES]) -> DResult<MemHandle> {
        let _ctx = self.enter_any();
        let mut fabric = cu::CUmemFabricHandle { data: *data };
        let mut handle: cu::CUmemGenericAllocationHandle = 0;
        // SAFETY: for fabric handles the driver reads a `CUmemFabricHandle` through the pointer
        // (a local that outlives the call) and does not keep it; the out-pointer is a local.
        check("cuMemImportFromShareableHandle", unsafe {
            (self.api.cuMemImportFromShareableHandle)(
                &mut handle,
                (&mut fabric as *mut cu::CUmemFabricHandle).cast(),
                cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC,
            )
        })?;
        Ok(MemHandle(handle))
    }

    fn multicast_granularity(&self, prop: &MulticastProp, option: Granularity) -> DResult<usize> {
        let f = self.api.cuMulticastGetGranularity.ok_or(not_supported("cuMulticastGetGranularity"))?;
        let prop = multicast_prop(prop);
        let option = match option {
            Granularity::Minimum => cu::CUmulticastGranularity_flags::CU_MULTICAST_GRANULARITY_MINIMUM,
            Granularity::Recommended => cu::CUmulticastGranularity_flags::CU_MULTICAST_GRANULARITY_RECOMMENDED,
        };
        let _ctx = self.enter_any();
        let mut granularity: usize = 0;
        // SAFETY: `prop` and the out-pointer are locals that outlive the call.
        check("cuMulticastGetGranularity", unsafe { f(&mut granularity, &prop, option) })?;
        Ok(granularity)
    }

    fn multicast_create(&self, prop: &MulticastProp) -> DResult<MemHandle> {
        let f = self.api.cuMulticastCreate.ok_or(not_supported("cuMulticastCreate"))?;
        let prop = multicast_prop(prop);
        let _ctx = self.enter_any();
        let mut handle: cu::CUmemGenericAllocationHandle = 0;
        // SAFETY: `prop` and the out-pointer are locals that outlive the call.
        check("cuMulticastCreate", unsafe { f(&mut handle, &prop) })?;
        Ok(MemHandle(handle))
    }

    fn multicast_add_device(&self, mc: MemHandle, dev: Device) -> DResult<()> {
        let f = self.api.cuMulticastAddDevice.ok_or(not_supported("cuMulticastAddDevice"))?;
        let device = self.cu_device(dev)?;
        let _ctx = self.enter_any();
        // SAFETY: plain values; the driver validates the handle and device.
        check("cuMulticastAddDevice", unsafe { f(mc.0, device) })
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
        let f = self.api.cuMulticastBindMem.ok_or(not_supported("cuMulticastBindMem"))?;
        let _ctx = self.enter_any();
        // SAFETY: plain values; the driver validates handles, offsets and flags.
        check("cuMulticastBindMem", unsafe { f(mc.0, mc_offset, mem.0, mem_offset, size, flags) })
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
        let f = self.api.cuMulticastBindMem_v2.ok_or(not_supported("cuMulticastBindMem_v2"))?;
        let device = self.cu_device(dev)?;
        let _ctx = self.enter_any();
        // SAFETY: plain values; the driver validates handles, device, offsets and flags.
        check("cuMulticastBindMem_v2", unsafe { f(mc.0, device, mc_offset, mem.0, mem_offset, size, flags) })
    }

    fn multicast_bind_addr(
        &self,
        mc: MemHandle,
        mc_offset: usize,
        ptr: DevicePtr,
        size: usize,
        flags: u64,
    ) -> DResult<()> {
        let f = self.api.cuMulticastBindAddr.ok_or(not_supported("cuMulticastBindAddr"))?;
        let _ctx = self.enter_any();
        // SAFETY: plain values; the driver validates the handle, address range and flags.
        check("cuMulticastBindAddr", unsafe { f(mc.0, mc_offset, ptr, size, flags) })
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
        let f = self.api.cuMulticastBindAddr_v2.ok_or(not_supported("cuMulticastBindAddr_v2"))?;
        let device = self.cu_device(dev)?;
        let _ctx = self.enter_any();
        // SAFETY: plain values; the driver validates the handle, device, address range and flags.
        check("cuMulticastBindAddr_v2", unsafe { f(mc.0, device, mc_offset, ptr, size, flags) })
    }

    fn multicast_unbind(&self, mc: MemHandle, dev: Device, mc_offset: usize, size: usize) -> DResult<()> {
        let f = self.api.cuMulticastUnbind.ok_or(not_supported("cuMulticastUnbind"))?;
        let device = self.cu_device(dev)?;
        let _ctx = self.enter_any();
        // SAFETY: plain values; the driver validates the handle, device and range.
        check("cuMulticastUnbind", unsafe { f(mc.0, device, mc_offset, size) })
    }

    fn stream_create(&self, dev: Device) -> DResult<Stream> {
        let _ctx = self.enter(dev)?;
        let mut stream: cu::CUstream = ptr::null_mut();
        // SAFETY: the out-pointer is a local; the flag is a valid `CUstream_flags` value.
        check("cuStreamCreate", unsafe {
            (self.api.cuStreamCreate)(&mut stream, cu::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint)
        })?;
        Ok(Stream(stream as usize))
    }

    fn stream_destroy(&self, dev: Device, stream: Stream) -> DResult<()> {
        let _ctx = self.enter(dev)?;
        // SAFETY: the stream value is the caller's; the driver validates it.
        check("cuStreamDestroy", unsafe { (self.api.cuStreamDestroy_v2)(stream_ptr(stream)) })
    }

    fn stream_synchronize(&self, dev: Device, stream: Stream) -> DResult<()> {
        let _ctx = self.enter(dev)?;
        // SAFETY: the stream value is the caller's (NULL: the legacy default stream).
        check("cuStreamSynchronize", unsafe { (self.api.cuStreamSynchronize)(stream_ptr(stream)) })
    }

    fn bind_thread(&self, dev: Device) -> DResult<()> {
        let ctx = self.primary_ctx(dev)?;
        // SAFETY: `ctx` is a primary context this driver retained and has not released.
        check("cuCtxSetCurrent", unsafe { (self.api.cuCtxSetCurrent)(ctx) })
    }

    fn device_synchronize(&self, dev: Device) -> DResult<()> {
        let _ctx = self.enter(dev)?;
        // SAFETY: synchronizes the current (primary) context; no arguments.
        check("cuCtxSynchronize", unsafe { (self.api.cuCtxSynchronize)() })
    }

    fn event_create(&self, dev: Device) -> DResult<Event> {
        let _ctx = self.enter(dev)?;
        let mut event: cu::CUevent = ptr::null_mut();
        // SAFETY: the out-pointer is a local; CU_EVENT_DEFAULT keeps timing enabled.
        check("cuEventCreate", unsafe {
            (self.api.cuEventCreate)(&mut event, cu::CUevent_flags::CU_EVENT_DEFAULT as c_uint)
        })?;
        Ok(Event(event as usize))
    }

    fn event_record(&self, dev: Device, event: Event, stream: Stream) -> DResult<()> {
        let _ctx = self.enter(dev)?;
        // SAFETY: event and stream values are the caller's; the driver validates them.
        check("cuEventRecord", unsafe { (self.api.cuEventRecord)(event_ptr(event), stream_ptr(stream)) })
    }

    fn event_elapsed_ms(&self, dev: Device, start: Event, end: Event) -> DResult<f32> {
        let _ctx = self.enter(dev)?;
        // SAFETY: the event value is the caller's; the driver validates it.
        check("cuEventSynchronize", unsafe { (self.api.cuEventSynchronize)(event_ptr(end)) })?;
        let mut ms: f32 = 0.0;
        let elapsed = match (self.api.cuEventElapsedTime_v2, self.api.cuEventElapsedTime) {
            (Some(f), _) | (None, Some(f)) => f,
            (None, None) => return Err(not_supported("cuEventElapsedTime")),
        };
        // SAFETY: the out-pointer is a local; event values are the caller's.
        check("cuEventElapsedTime", unsafe { elapsed(&mut ms, event_ptr(start), event_ptr(end)) })?;
        Ok(ms)
    }

    fn event_destroy(&self, dev: Device, event: Event) -> DResult<()> {
        let _ctx = self.enter(dev)?;
        // SAFETY: the event value is the caller's; the driver validates it.
        check("cuEventDestroy", unsafe { (self.api.cuEventDestroy_v2)(event_ptr(event)) })
    }

    fn stream_begin_capture(&self, dev: Device, stream: Stream) -> DResult<()> {
        let begin = self.api.cuStreamBeginCapture_v2.ok_or_else(|| not_supported("cuStreamBeginCapture"))?;
        let _ctx = self.enter(dev)?;
        let mode = cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL as c_uint;
        // SAFETY: the stream value is the caller's; the driver validates it; `mode` is a valid
        // `CUstreamCaptureMode` passed as the C enum's integer.
        check("cuStreamBeginCapture", unsafe { begin(stream_ptr(stream), mode) })
    }

    fn stream_end_capture(&self, dev: Device, stream: Stream) -> DResult<Graph> {
        let end = self.api.cuStreamEndCapture.ok_or_else(|| not_supported("cuStreamEndCapture"))?;
        let _ctx = self.enter(dev)?;
        let mut graph: cu::CUgraph = ptr::null_mut();
        // SAFETY: the out-pointer is a local; the stream value is the caller's.
        check("cuStreamEndCapture", unsafe { end(stream_ptr(stream), &mut graph) })?;
        Ok(Graph(graph as usize))
    }

    fn graph_instantiate(&self, dev: Device, graph: Graph) -> DResult<GraphExec> {
        let instantiate =
            self.api.cuGraphInstantiateWithFlags.ok_or_else(|| not_supported("cuGraphInstantiateWithFlags"))?;
        let _ctx = self.enter(dev)?;
        let mut exec: cu::CUgraphExec = ptr::null_mut();
        // SAFETY: the out-pointer is a local; the graph value is the caller's; flags 0.
        check("cuGraphInstantiateWithFlags", unsafe { instantiate(&mut exec, graph.0 as cu::CUgraph, 0) })?;
        Ok(GraphExec(exec as usize))
    }

    fn graph_launch(&self, dev: Device, exec: GraphExec, stream: Stream) -> DResult<()> {
        let launch = self.api.cuGraphLaunch.ok_or_else(|| not_supported("cuGraphLaunch"))?;
        let _ctx = self.enter(dev)?;
        // SAFETY: executable graph and stream values are the caller's; the driver validates them.
        check("cuGraphLaunch", unsafe { launch(exec.0 as cu::CUgraphExec, stream_ptr(stream)) })
    }

    fn graph_exec_destroy(&self, dev: Device, exec: GraphExec) -> DResult<()> {
        let destroy = self.api.cuGraphExecDestroy.ok_or_else(|| not_supported("cuGraphExecDestroy"))?;
        let _ctx = self.enter(dev)?;
        // SAFETY: the executable graph value is the caller's; the driver validates it.
        check("cuGraphExecDestroy", unsafe { destroy(exec.0 as cu::CUgraphExec) })
    }

    fn graph_destroy(&self, dev: Device, graph: Graph) -> DResult<()> {
        let destroy = self.api.cuGraphDestroy.ok_or_else(|| not_supported("cuGraphDestroy"))?;
        let _ctx = self.enter(dev)?;
        // SAFETY: the graph value is the caller's; the driver validates it.
        check("cuGraphDestroy", unsafe { destroy(graph.0 as cu::CUgraph) })
    }

    /// Copies, then synchronizes the legacy default stream: from pageable memory
    /// `cuMemcpyHtoD` may return before the DMA lands, and non-blocking streams do not wait
    /// for it.
    fn memcpy_htod(&self, dev: Device, dst: DevicePtr, src: &[u8]) -> DResult<()> {
        if src.is_empty() {
            return Ok(());
        }
        let _ctx = self.enter(dev)?;
        // SAFETY: `src` is readable for `src.len()` bytes for the duration of the call; the
        // driver validates `dst`.
        check("cuMemcpyHtoD", unsafe { (self.api.cuMemcpyHtoD_v2)(dst, src.as_ptr().cast(), src.len()) })?;
        self.sync_default_stream()
    }

    fn memcpy_dtoh(&self, dev: Device, dst: &mut [u8], src: DevicePtr) -> DResult<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let _ctx = self.enter(dev)?;
        // SAFETY: `dst` is writable for `dst.len()` bytes and the copy is synchronous (it
        // returns once the bytes are in `dst`); the driver validates `src`.
        check("cuMemcpyDtoH", unsafe { (self.api.cuMemcpyDtoH_v2)(dst.as_mut_ptr().cast(), src, dst.len()) })
    }

    fn poke_u32(&self, dev: Device, dst: DevicePtr, value: u32) -> DResult<()> {
        let bytes = value.to_ne_bytes();
        self.on_private_stream(dev, "cuMemcpyHtoDAsync", |api, stream| {
            // SAFETY: `bytes` lives until the stream was synchronized (below, in
            // `on_private_stream`); the driver validates `dst`.
            unsafe { (api.cuMemcpyHtoDAsync_v2)(dst, bytes.as_ptr().cast(), 4, stream) }
        })
    }

    fn peek_u32(&self, dev: Device, src: DevicePtr) -> DResult<u32> {
        let mut bytes = [0u8; 4];
        self.on_private_stream(dev, "cuMemcpyDtoHAsync", |api, stream| {
            // SAFETY: `bytes` is writable and lives until the stream was synchronized; the
            // driver validates `src`.
            unsafe { (api.cuMemcpyDtoHAsync_v2)(bytes.as_mut_ptr().cast(), src, 4, stream) }
        })?;
        Ok(u32::from_ne_bytes(bytes))
    }

    fn memcpy_dtod_async(
        &self,
        dev: Device,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: Stream,
    ) -> DResult<()> {
        if bytes == 0 {
            return Ok(());
        }
        let _ctx = self.enter(dev)?;
        // SAFETY: plain values; the driver validates both ranges and the stream.
        check("cuMemcpyDtoDAsync", unsafe { (self.api.cuMemcpyDtoDAsync_v2)(dst, src, bytes, stream_ptr(stream)) })
    }

    /// Sets, then synchronizes the legacy default stream (`cuMemsetD8` is asynchronous for
    /// device memory).
    fn memset_d8(&self, dev: Device, dst: DevicePtr, value: u8, bytes: usize) -> DResult<()> {
        if bytes == 0 {
            return Ok(());
        }
        let _ctx = self.enter(dev)?;
        // SAFETY: plain values; the driver validates the range.
        check("cuMemsetD8", unsafe { (self.api.cuMemsetD8_v2)(dst, value, bytes) })?;
        self.sync_default_stream()
    }

    /// A cubin or fatbin is passed as is; PTX text is NUL-terminated first (copied when it is
    /// not already).
    fn module_load(&self, dev: Device, image: &[u8]) -> DResult<Module> {
        let data = module_image(image);
        let _ctx = self.enter(dev)?;
        let mut module: cu::CUmodule = ptr::null_mut();
        // SAFETY: `data` is a complete binary image or NUL-terminated text that outlives the
        // call (the driver copies what it keeps); the out-pointer is a local.
        check("cuModuleLoadData", unsafe { (self.api.cuModuleLoadData)(&mut module, data.as_ptr().cast()) })?;
        Ok(Module(module as usize))
    }

    fn module_unload(&self, dev: Device, module: Module) -> DResult<()> {
        let _ctx = self.enter(dev)?;
        // SAFETY: the module value is the caller's; the driver validates it.
        check("cuModuleUnload", unsafe { (self.api.cuModuleUnload)(module.0 as cu::CUmodule) })
    }

    fn module_function(&self, dev: Device, module: Module, name: &CStr) -> DResult<Function> {
        let _ctx = self.enter(dev)?;
        let mut func: cu::CUfunction = ptr::null_mut();
        // SAFETY: `name` is NUL-terminated and outlives the call; the out-pointer is a local.
        check("cuModuleGetFunction", unsafe {
            (self.api.cuModuleGetFunction)(&mut func, module.0 as cu::CUmodule, name.as_ptr())
        })?;
        Ok(Function(func as usize))
    }

    fn launch(
        &self,
        dev: Device,
        func: Function,
        config: &LaunchConfig,
        stream: Stream,
        params: &mut [*mut c_void],
    ) -> DResult<()> {
        let params_ptr = if params.is_empty() { ptr::null_mut() } else { params.as_mut_ptr() };
        let _ctx = self.enter(dev)?;
        let [gx, gy, gz] = config.grid;
        let [bx, by, bz] = config.block;
        // SAFETY: `params` holds one pointer per kernel argument, each pointing at a live value
        // of the argument's type (the caller's contract); the driver copies the argument
        // values before returning. `extra` is NULL.
        check("cuLaunchKernel", unsafe {
            (self.api.cuLaunchKernel)(
                func.0 as cu::CUfunction,
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                config.shared_bytes,
                stream_ptr(stream),
                params_ptr,
                ptr::null_mut(),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let mc = multicast_prop(&MulticastProp {
            num_devices: 4,
            size: 2 << 20,
            handle_types: HandleTypes::FABRIC,
            flags: 0,
        });
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
        let config = LaunchConfig { grid: [1, 1, 1], block: [64, 1, 1], shared_bytes: 0 };
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
}
