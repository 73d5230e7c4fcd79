//! The CUDA driver subset the runtime uses, as a trait with two implementations:
//! [`cuda::CudaDriver`] over the real driver (cudarc, dynamic loading) and
//! [`sim::SimDriver`], a simulated driver that enforces the documented rules.
//!
//! Every failure is a [`DriverError`] naming the driver function and its `CUresult`.
//! Nothing in this layer knows about teams, buffers or the C API.

use std::fmt;

mod copy;
pub mod cuda;
mod device;
mod exec;
mod memory;
mod multicast;
pub mod sim;

pub use copy::CopyOps;
pub use device::DeviceOps;
pub use exec::ExecOps;
pub use memory::MemoryOps;
pub use multicast::MulticastOps;

/// A raw `CUresult` value. Kept as an integer so that any code a driver returns survives.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CuResult(pub u32);

macro_rules! cu_results {
    ($($name:ident = $value:expr),* $(,)?) => {
        impl CuResult {
            $(
                #[allow(missing_docs)]
                pub const $name: CuResult = CuResult($value);
            )*

            /// The `CUDA_ERROR_*` name of this code, or `"CUDA_ERROR_UNRECOGNIZED"`.
            pub fn name(self) -> &'static str {
                match self.0 {
                    $($value => concat!("CUDA_", stringify!($name)),)*
                    _ => "CUDA_ERROR_UNRECOGNIZED",
                }
            }

            /// Parses `OUT_OF_MEMORY`, `ERROR_OUT_OF_MEMORY` or `CUDA_ERROR_OUT_OF_MEMORY`
            /// (case-insensitive), or a decimal number.
            pub fn from_name(text: &str) -> Option<CuResult> {
                let upper = text.trim().to_ascii_uppercase();
                if let Ok(n) = upper.parse::<u32>() {
                    return Some(CuResult(n));
                }
                let bare = upper.strip_prefix("CUDA_").unwrap_or(&upper);
                let bare = bare.strip_prefix("ERROR_").unwrap_or(bare);
                $(
                    let known = stringify!($name);
                    if known == bare || known.strip_prefix("ERROR_") == Some(bare) {
                        return Some(CuResult::$name);
                    }
                )*
                None
            }
        }
    };
}

cu_results! {
    SUCCESS = 0,
    ERROR_INVALID_VALUE = 1,
    ERROR_OUT_OF_MEMORY = 2,
    ERROR_NOT_INITIALIZED = 3,
    ERROR_DEINITIALIZED = 4,
    ERROR_NO_DEVICE = 100,
    ERROR_INVALID_DEVICE = 101,
    ERROR_DEVICE_NOT_LICENSED = 102,
    ERROR_INVALID_IMAGE = 200,
    ERROR_INVALID_CONTEXT = 201,
    ERROR_NO_BINARY_FOR_GPU = 209,
    ERROR_UNSUPPORTED_PTX_VERSION = 222,
    ERROR_INVALID_SOURCE = 300,
    ERROR_FILE_NOT_FOUND = 301,
    ERROR_INVALID_HANDLE = 400,
    ERROR_ILLEGAL_STATE = 401,
    ERROR_NOT_FOUND = 500,
    ERROR_NOT_READY = 600,
    ERROR_ILLEGAL_ADDRESS = 700,
    ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    ERROR_LAUNCH_TIMEOUT = 702,
    ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
    ERROR_PEER_ACCESS_NOT_ENABLED = 705,
    ERROR_CONTEXT_IS_DESTROYED = 709,
    ERROR_ASSERT = 710,
    ERROR_LAUNCH_FAILED = 719,
    ERROR_NOT_PERMITTED = 800,
    ERROR_NOT_SUPPORTED = 801,
    ERROR_SYSTEM_NOT_READY = 802,
    ERROR_SYSTEM_DRIVER_MISMATCH = 803,
    ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    ERROR_UNKNOWN = 999,
}

impl fmt::Debug for CuResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

impl fmt::Display for CuResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A failed driver call: the function and the code it returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverError {
    /// The driver entry point, e.g. `"cuMulticastBindMem"`.
    pub func: &'static str,
    /// What it returned.
    pub code: CuResult,
}

impl DriverError {
    /// A failure of `func` with `code`.
    pub fn new(func: &'static str, code: CuResult) -> Self {
        DriverError { func, code }
    }
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} returned {}", self.func, self.code)
    }
}

impl std::error::Error for DriverError {}

/// Result of a driver call.
pub type DResult<T> = Result<T, DriverError>;

/// A device ordinal (`CUdevice`).
pub type Device = i32;

/// A device virtual address (`CUdeviceptr`). On the simulator it is a host address.
pub type DevicePtr = u64;

/// A `CUmemGenericAllocationHandle`: a physical allocation or a multicast object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemHandle(pub u64);

/// A `CUstream` as an address. `Stream(0)` is the legacy default stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stream(pub usize);

impl Stream {
    /// The legacy default stream (NULL).
    pub const DEFAULT: Stream = Stream(0);
}

/// A loaded module (`CUmodule`) as an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Module(pub usize);

/// A kernel entry point (`CUfunction`) as an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Function(pub usize);

/// A CUDA event (`CUevent`) as an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Event(pub usize);

/// A captured CUDA graph (`CUgraph`) as an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Graph(pub usize);

/// An executable CUDA graph (`CUgraphExec`) as an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphExec(pub usize);

/// `CUstreamCaptureMode`: how a stream capture and the calls of threads meet (see
/// [`ExecOps::exchange_capture_mode`]). While a capture is live, a thread in `Global` mode is
/// prohibited from *potentially unsafe* calls (synchronizations, synchronous copies and sets,
/// allocations, module loads) if it has a capture of its own not begun `Relaxed`, or if any
/// other thread has a capture begun `Global`; a prohibited call fails with
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates those captures. `ThreadLocal` looks
/// only at the thread's own captures; `Relaxed` is never prohibited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum CaptureMode {
    /// `CU_STREAM_CAPTURE_MODE_GLOBAL`: every thread's default, and PyTorch's default capture.
    #[default]
    Global,
    /// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL` (what nccl-tests captures in).
    ThreadLocal,
    /// `CU_STREAM_CAPTURE_MODE_RELAXED`.
    Relaxed,
}

/// The calling thread in [`CaptureMode::Relaxed`] until dropped, then back in the mode it had:
/// the library's own potentially unsafe calls (a peek at a device word, a module load) neither
/// fail nor invalidate a capture that another thread of the application has live, as NCCL
/// does around its own allocations. Those calls run on private non-blocking streams or touch no
/// stream, so no captured work depends on them. If the driver cannot swap the mode, the call
/// runs in the thread's own mode.
pub struct RelaxedCapture<'a, D: ExecOps + ?Sized> {
    driver: &'a D,
    previous: Option<CaptureMode>,
}

impl<'a, D: ExecOps + ?Sized> RelaxedCapture<'a, D> {
    /// Puts the calling thread in relaxed mode.
    pub fn enter(driver: &'a D) -> Self {
        let previous = driver.exchange_capture_mode(CaptureMode::Relaxed).ok();
        RelaxedCapture { driver, previous }
    }
}

impl<D: ExecOps + ?Sized> Drop for RelaxedCapture<'_, D> {
    fn drop(&mut self) {
        if let Some(mode) = self.previous {
            let _ = self.driver.exchange_capture_mode(mode);
        }
    }
}

/// `CU_MEM_ALLOC_GRANULARITY_*` / `CU_MULTICAST_GRANULARITY_*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Granularity {
    /// The smallest size and alignment the driver accepts.
    Minimum,
    /// The size and alignment the driver recommends for performance.
    Recommended,
}

/// Size of a `CUmemFabricHandle`.
pub const FABRIC_HANDLE_BYTES: usize = 64;

/// A bit set of `CUmemAllocationHandleType` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct HandleTypes(pub u32);

impl HandleTypes {
    /// Not exportable.
    pub const NONE: HandleTypes = HandleTypes(0);
    /// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
    pub const POSIX_FD: HandleTypes = HandleTypes(0x1);
    /// `CU_MEM_HANDLE_TYPE_FABRIC`.
    pub const FABRIC: HandleTypes = HandleTypes(0x8);

    /// True when any type is requested, i.e. the object is externally shareable.
    pub fn is_shareable(self) -> bool {
        self.0 != 0
    }

    /// True when every bit of `other` is set in `self`.
    pub fn contains(self, other: HandleTypes) -> bool {
        self.0 & other.0 == other.0
    }
}

/// `CUmulticastObjectProp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MulticastProp {
    /// `numDevices`: devices that will be added.
    pub num_devices: u32,
    /// `size`: bytes that can be bound per device.
    pub size: usize,
    /// `handleTypes`: shareable handle types requested.
    pub handle_types: HandleTypes,
    /// `flags`: must be 0.
    pub flags: u64,
}

/// What `cuMemGetAllocationPropertiesFromHandle` tells about an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocationProps {
    /// The device whose memory it is.
    pub dev: Device,
    /// The shareable handle types it was created with.
    pub handle_types: HandleTypes,
}

/// What the runtime needs to know about one device.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct DeviceProps {
    /// `cuDeviceGetName`.
    pub name: String,
    /// Compute capability, major.
    pub cc_major: i32,
    /// Compute capability, minor.
    pub cc_minor: i32,
    /// `cuDeviceTotalMem`.
    pub total_memory: u64,
    /// Streaming multiprocessors.
    pub sm_count: i32,
    /// `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`.
    pub multicast_supported: bool,
    /// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`.
    pub vmm_supported: bool,
    /// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`.
    pub posix_fd_supported: bool,
    /// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED`.
    pub fabric_supported: bool,
    /// `cuDeviceGetUuid_v2` (else `cuDeviceGetUuid`): what the GPU is, the same in every
    /// process that sees it whatever its ordinal there (see [`uuid_string`]).
    pub uuid: [u8; 16],
    /// `cuDeviceGetPCIBusId`: `"0000:18:00.0"` (empty where the driver cannot say).
    pub pci_bus_id: String,
}

/// `nvmlGpuFabricState_t` reduced to what mcast tells apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FabricState {
    /// No NVLink fabric (NVML absent, not supported, or not started).
    #[default]
    None,
    /// The fabric manager is still registering the GPU.
    InProgress,
    /// Registered: the cluster UUID and clique id are valid.
    Completed,
}

/// The GPU's place in a multi-node NVLink fabric (NVML's GPU fabric info).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FabricInfo {
    /// The fabric's cluster UUID; zeros where none.
    pub cluster_uuid: [u8; 16],
    /// The clique (NVLink partition) inside the cluster.
    pub clique_id: u32,
    /// Registration state.
    pub state: FabricState,
}

/// A device UUID as CUDA and `nvidia-smi` print it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn uuid_string(uuid: &[u8; 16]) -> String {
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

/// Launch geometry and arguments of one kernel.
#[derive(Clone, Copy, Debug)]
pub struct LaunchConfig {
    /// Grid dimensions.
    pub grid: [u32; 3],
    /// Block dimensions.
    pub block: [u32; 3],
    /// Dynamic shared memory bytes.
    pub shared_bytes: u32,
    /// Programmatic dependent launch (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`,
    /// through `cuLaunchKernelEx`): the kernel may be launched once every block of the kernel
    /// before it on the stream has exited (or triggered), before that kernel's completion, and
    /// must wait for its memory with `griddepcontrol.wait` before touching any. Compute
    /// capability 9.0+; where the driver lacks `cuLaunchKernelEx` the launch is a plain one.
    pub programmatic: bool,
}

impl LaunchConfig {
    /// A 1-D grid of `blocks` blocks of `threads` threads, no dynamic shared memory, launched
    /// after the work before it on the stream ends.
    pub fn linear(blocks: u32, threads: u32) -> LaunchConfig {
        LaunchConfig { grid: [blocks, 1, 1], block: [threads, 1, 1], shared_bytes: 0, programmatic: false }
    }
}

/// The CUDA driver subset the runtime uses, one supertrait per family of calls (each
/// backend implements a family in the file of that name). Implementations are thread-safe.
///
/// Calls that take a [`Device`] run in that device's primary context; the caller's current
/// context is left as it was.
pub trait Driver: DeviceOps + MemoryOps + MulticastOps + CopyOps + ExecOps + Send + Sync + 'static {
    /// `"cuda"` or `"sim"`.
    fn backend_name(&self) -> &'static str;

    /// The simulator, when this is one: the kernels layer runs collectives on its workers.
    fn as_sim(&self) -> Option<&sim::SimDriver> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cu_result_names_round_trip() {
        assert_eq!(CuResult::ERROR_OUT_OF_MEMORY.name(), "CUDA_ERROR_OUT_OF_MEMORY");
        assert_eq!(CuResult::SUCCESS.name(), "CUDA_SUCCESS");
        assert_eq!(CuResult(12345).name(), "CUDA_ERROR_UNRECOGNIZED");
        for text in ["OUT_OF_MEMORY", "ERROR_OUT_OF_MEMORY", "CUDA_ERROR_OUT_OF_MEMORY", "out_of_memory", "2"] {
            assert_eq!(CuResult::from_name(text), Some(CuResult::ERROR_OUT_OF_MEMORY), "{text}");
        }
        assert_eq!(CuResult::from_name("SYSTEM_NOT_READY"), Some(CuResult::ERROR_SYSTEM_NOT_READY));
        assert_eq!(CuResult::from_name("SUCCESS"), Some(CuResult::SUCCESS));
        assert_eq!(CuResult::from_name("NO_SUCH_THING"), None);
    }

    #[test]
    fn uuids_print_as_cuda_prints_them() {
        let u: [u8; 16] = std::array::from_fn(|i| i as u8 * 17);
        assert_eq!(uuid_string(&u), "GPU-00112233-4455-6677-8899-aabbccddeeff");
    }

    #[test]
    fn driver_error_names_function_and_code() {
        let e = DriverError::new("cuMemCreate", CuResult::ERROR_OUT_OF_MEMORY);
        assert_eq!(e.to_string(), "cuMemCreate returned CUDA_ERROR_OUT_OF_MEMORY (2)");
    }
}
