//! The real CUDA driver through cudarc (placeholder until the driver layer lands).

use super::{CuResult, DResult, DriverError};

/// The CUDA driver, loaded at run time.
pub struct CudaDriver {
    _private: (),
}

impl CudaDriver {
    /// Loads `libcuda.so.1` and calls `cuInit(0)`.
    pub fn load() -> DResult<CudaDriver> {
        Err(DriverError::new("cuInit", CuResult::ERROR_NOT_INITIALIZED))
    }
}
