//! Errors of the kernel layer.

use std::fmt;

use crate::driver::DriverError;

/// How to get NVRTC, appended to [`KernelError::NvrtcUnavailable`] messages.
pub const NVRTC_HINT: &str = "install NVRTC with `pip install nvidia-cuda-nvrtc` (or the CUDA toolkit) and set \
     MCAST_NVRTC_PATH to its libnvrtc.so.* (e.g. .../site-packages/nvidia/cu13/lib/libnvrtc.so.13) or add its \
     directory to LD_LIBRARY_PATH";

/// A failure of the kernel layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelError {
    /// NVRTC could not be loaded (maps to `MCAST_ERROR_DRIVER_UNAVAILABLE`).
    NvrtcUnavailable(String),
    /// NVRTC rejected the source: the build and the compile log.
    Compile {
        /// Which build (`"sm_90 multimem"`).
        target: String,
        /// NVRTC's log.
        log: String,
    },
    /// A driver call failed (module load, function lookup, launch).
    Driver(DriverError),
    /// A launch this layer cannot run (bad descriptor, architecture too old, ...).
    Unsupported(String),
}

impl KernelError {
    /// True when the runtime should report `MCAST_ERROR_DRIVER_UNAVAILABLE`.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, KernelError::NvrtcUnavailable(_))
    }
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelError::NvrtcUnavailable(detail) => {
                write!(f, "NVRTC is not available: {detail}; {NVRTC_HINT}")
            }
            KernelError::Compile { target, log } => {
                write!(f, "kernel compilation failed for {target}:\n{log}")
            }
            KernelError::Driver(e) => write!(f, "{e}"),
            KernelError::Unsupported(what) => write!(f, "unsupported kernel launch: {what}"),
        }
    }
}

impl std::error::Error for KernelError {}

impl From<DriverError> for KernelError {
    fn from(e: DriverError) -> Self {
        KernelError::Driver(e)
    }
}
