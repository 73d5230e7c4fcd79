//! The driver's entry points: the `Api` table of raw function pointers, the lists of required
//! and optional symbols, the resolver, and the `CUresult` checks every call goes through.

use std::ffi::{c_char, c_int, c_uint, c_void};

use cudarc::driver::sys as cu;

use crate::driver::{CuResult, DResult, DriverError};

/// A `CUresult` as the integer the driver returns (never read as a Rust enum).
pub(super) type Raw = u32;

/// Declares the driver entry points: the `Api` table of function pointers, the
/// [`REQUIRED_SYMBOLS`] and [`OPTIONAL_SYMBOLS`] lists, and the resolver.
macro_rules! driver_api {
    (
        required { $( $req:ident ( $( $rarg:ty ),* ); )* }
        optional { $( $opt:ident ( $( $oarg:ty ),* ); )* }
    ) => {
        /// The resolved entry points. A field is named exactly like the symbol it holds.
        #[allow(non_snake_case)]
        pub(super) struct Api {
            $( pub(super) $req: unsafe extern "C" fn( $( $rarg ),* ) -> Raw, )*
            $( pub(super) $opt: Option<unsafe extern "C" fn( $( $oarg ),* ) -> Raw>, )*
        }

        /// The exact symbol strings [`CudaDriver::load`](super::CudaDriver::load) requires; a missing one fails the load
        /// with `CUDA_ERROR_NOT_FOUND` and that name.
        pub const REQUIRED_SYMBOLS: &[&str] = &[ $( stringify!($req) ),* ];

        /// The exact symbol strings looked up once and used only when present.
        pub const OPTIONAL_SYMBOLS: &[&str] = &[ $( stringify!($opt) ),* ];

        impl Api {
            /// Builds the table from `lookup` (a symbol's address, or `None`).
            /// Returns the first missing required symbol as the error.
            pub(super) fn resolve(lookup: &dyn Fn(&'static str) -> Option<*mut c_void>) -> Result<Api, &'static str> {
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
            pub(super) fn missing_optional(&self) -> Vec<&'static str> {
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
        cuStreamWaitEvent(cu::CUstream, cu::CUevent, c_uint);
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
        cuMemHostAlloc(*mut *mut c_void, usize, c_uint);
        cuMemHostGetDevicePointer_v2(*mut cu::CUdeviceptr, *mut c_void, c_uint);
        cuMemFreeHost(*mut c_void);
        cuThreadExchangeStreamCaptureMode(*mut c_uint);
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
        cuDeviceGetUuid_v2(*mut cu::CUuuid, cu::CUdevice);
        cuDeviceGetUuid(*mut cu::CUuuid, cu::CUdevice);
        cuDeviceGetPCIBusId(*mut c_char, c_int, cu::CUdevice);
        cuFuncLoad(cu::CUfunction);
        cuLaunchKernelEx(*const cu::CUlaunchConfig, cu::CUfunction, *mut *mut c_void, *mut *mut c_void);
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
pub(super) fn check(func: &'static str, raw: Raw) -> DResult<()> {
    if raw == CuResult::SUCCESS.0 {
        Ok(())
    } else {
        Err(DriverError::new(func, CuResult(raw)))
    }
}

/// The error of calling an optional entry point the driver does not export.
pub(super) fn not_supported(func: &'static str) -> DriverError {
    DriverError::new(func, CuResult::ERROR_NOT_SUPPORTED)
}
