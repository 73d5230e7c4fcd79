//! The runtime's error type: a kind (mapped to a C status only in `capi`) and a message that
//! says which call, which argument or which driver function failed, and what to do.

use std::fmt;

use crate::driver::{CuResult, DriverError};

/// What went wrong, one kind per public status code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A bad argument: NULL, unknown enum value, zero or misaligned size, out of range.
    InvalidArgument,
    /// A zero, destroyed, stale or foreign handle.
    InvalidHandle,
    /// Device memory or multicast resources exhausted after the retry policy ran.
    OutOfMemory,
    /// The system, policy or build lacks what the request needs.
    NotSupported,
    /// The CUDA driver (or NVRTC) cannot be loaded, or there is no device.
    DriverUnavailable,
    /// Any other driver failure.
    Driver,
    /// `CUDA_ERROR_SYSTEM_NOT_READY` or `CUDA_ERROR_ILLEGAL_STATE` persisted.
    SystemNotReady,
    /// Live dependents or work in flight.
    InUse,
    /// A peer did not arrive in time.
    Timeout,
    /// A bug: a caught panic or a broken invariant.
    Internal,
    /// The team was aborted, by `mcast_team_abort` here or in a peer process.
    Aborted,
}

/// A runtime error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// The kind, which decides the C status.
    pub kind: ErrorKind,
    /// The full message.
    pub message: String,
    /// The driver failure behind it, if any.
    pub driver: Option<DriverError>,
}

/// Result of a runtime operation.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, message: message.into(), driver: None }
    }

    /// [`ErrorKind::InvalidArgument`].
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidArgument, message)
    }

    /// [`ErrorKind::InvalidHandle`].
    pub fn invalid_handle(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidHandle, message)
    }

    /// [`ErrorKind::NotSupported`].
    pub fn not_supported(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::NotSupported, message)
    }

    /// [`ErrorKind::InUse`].
    pub fn in_use(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InUse, message)
    }

    /// [`ErrorKind::Aborted`].
    pub fn aborted(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Aborted, message)
    }

    /// [`ErrorKind::Internal`].
    pub fn internal(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Internal, message)
    }

    /// A driver failure while doing `what`, with the kind its `CUresult` implies.
    pub fn driver(err: DriverError, what: impl fmt::Display) -> Self {
        let kind = kind_of(err.code);
        let hint = match kind {
            ErrorKind::SystemNotReady => {
                "; check that the fabric manager and the NVIDIA driver daemons are running (nvidia-smi -q)"
            }
            ErrorKind::DriverUnavailable => "; check the NVIDIA driver installation (nvidia-smi)",
            _ => "",
        };
        Error { kind, message: format!("{what}: {err}{hint}"), driver: Some(err) }
    }

    /// The same error with `context: ` in front of its message.
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }

    /// True for failures the retry policy retries (out of memory, system not ready).
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind, ErrorKind::OutOfMemory | ErrorKind::SystemNotReady)
    }
}

/// The error kind a driver code maps to.
pub fn kind_of(code: CuResult) -> ErrorKind {
    match code {
        CuResult::ERROR_OUT_OF_MEMORY => ErrorKind::OutOfMemory,
        CuResult::ERROR_SYSTEM_NOT_READY | CuResult::ERROR_ILLEGAL_STATE => ErrorKind::SystemNotReady,
        CuResult::ERROR_NOT_INITIALIZED
        | CuResult::ERROR_DEINITIALIZED
        | CuResult::ERROR_NO_DEVICE
        | CuResult::ERROR_SYSTEM_DRIVER_MISMATCH => ErrorKind::DriverUnavailable,
        CuResult::ERROR_NOT_SUPPORTED => ErrorKind::NotSupported,
        _ => ErrorKind::Driver,
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_codes_map_to_kinds() {
        let oom = Error::driver(DriverError::new("cuMemCreate", CuResult::ERROR_OUT_OF_MEMORY), "allocating");
        assert_eq!(oom.kind, ErrorKind::OutOfMemory);
        assert_eq!(oom.message, "allocating: cuMemCreate returned CUDA_ERROR_OUT_OF_MEMORY (2)");
        assert!(oom.is_retryable());
        let busy = Error::driver(DriverError::new("cuMulticastBindMem", CuResult::ERROR_ILLEGAL_STATE), "binding");
        assert_eq!(busy.kind, ErrorKind::SystemNotReady);
        assert!(busy.message.contains("fabric manager"));
        let other = Error::driver(DriverError::new("cuMemMap", CuResult::ERROR_INVALID_VALUE), "mapping");
        assert_eq!(other.kind, ErrorKind::Driver);
        assert!(!other.is_retryable());
        assert_eq!(kind_of(CuResult::ERROR_NO_DEVICE), ErrorKind::DriverUnavailable);
    }
}
