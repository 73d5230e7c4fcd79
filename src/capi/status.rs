//! `mcast_status_t`: status codes, their names and the thread-local error message.

use std::ffi::c_char;

/// Status codes. `MCAST_SUCCESS` is 0; the numbers never change.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum McastStatus {
    /// Success.
    MCAST_SUCCESS = 0,
    /// NULL out-pointer, unknown enum value, zero or misaligned size/offset, range past the end,
    /// rank or device out of range.
    MCAST_ERROR_INVALID_ARGUMENT = 1,
    /// Zero, destroyed, stale or foreign handle.
    MCAST_ERROR_INVALID_HANDLE = 2,
    /// Device memory or multicast resources exhausted after the retry policy ran.
    MCAST_ERROR_OUT_OF_MEMORY = 3,
    /// The request needs something this system, policy or build lacks (the message names it).
    MCAST_ERROR_NOT_SUPPORTED = 4,
    /// `libcuda.so.1` (or NVRTC, for kernels) cannot be loaded, or there is no device.
    MCAST_ERROR_DRIVER_UNAVAILABLE = 5,
    /// Any other CUDA driver failure; the message names the function and `CUresult`.
    MCAST_ERROR_DRIVER = 6,
    /// `CUDA_ERROR_SYSTEM_NOT_READY` or `CUDA_ERROR_ILLEGAL_STATE` persisted: fabric manager or
    /// driver daemons.
    MCAST_ERROR_SYSTEM_NOT_READY = 7,
    /// Destroy/free refused: live dependents or work in flight.
    MCAST_ERROR_IN_USE = 8,
    /// A peer rank did not arrive within `timeout_ms`, or the team's bootstrap connections failed
    /// (a peer process exited, a frame failed authentication or broke a cap).
    MCAST_ERROR_TIMEOUT = 9,
    /// A bug: a caught panic or a broken invariant.
    MCAST_ERROR_INTERNAL = 10,
    /// The team was aborted, by `mcast_team_abort` here or in a peer process.
    MCAST_ERROR_ABORTED = 11,
}

/// A status code (values of `mcast_status_t`), carried as an integer so that any value a
/// caller passes is safe to receive.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct mcast_status_t(pub u32);

impl mcast_status_t {
    /// `MCAST_SUCCESS`.
    pub const SUCCESS: mcast_status_t = mcast_status_t(0);
}

const NAMES: [&str; 12] = [
    "MCAST_SUCCESS\0",
    "MCAST_ERROR_INVALID_ARGUMENT\0",
    "MCAST_ERROR_INVALID_HANDLE\0",
    "MCAST_ERROR_OUT_OF_MEMORY\0",
    "MCAST_ERROR_NOT_SUPPORTED\0",
    "MCAST_ERROR_DRIVER_UNAVAILABLE\0",
    "MCAST_ERROR_DRIVER\0",
    "MCAST_ERROR_SYSTEM_NOT_READY\0",
    "MCAST_ERROR_IN_USE\0",
    "MCAST_ERROR_TIMEOUT\0",
    "MCAST_ERROR_INTERNAL\0",
    "MCAST_ERROR_ABORTED\0",
];

/// The name of `status` (`"MCAST_ERROR_OUT_OF_MEMORY"`), or `"MCAST_ERROR_UNKNOWN"` for a value
/// that is not a status. The string is static; never NULL. Thread-safe.
#[no_mangle]
pub extern "C" fn mcast_status_string(status: mcast_status_t) -> *const c_char {
    let name = NAMES.get(status.0 as usize).copied().unwrap_or("MCAST_ERROR_UNKNOWN\0");
    name.as_ptr().cast()
}

/// A NUL-terminated message describing this thread's most recent failure: which call, which
/// argument or which driver function and its `CUresult` name, and what to do. `""` when this
/// thread has had no failure. Never NULL. Owned by the library; valid until this thread's next
/// failing call. Thread-safe (each thread has its own).
#[no_mangle]
pub extern "C" fn mcast_last_error() -> *const c_char {
    super::last_error_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn every_status_has_its_name() {
        for (i, name) in NAMES.iter().enumerate() {
            // SAFETY: static NUL-terminated strings.
            let got = unsafe { CStr::from_ptr(mcast_status_string(mcast_status_t(i as u32))) };
            assert_eq!(got.to_bytes(), name.trim_end_matches('\0').as_bytes());
        }
        assert_eq!(McastStatus::MCAST_ERROR_ABORTED as usize, NAMES.len() - 1);
        // SAFETY: as above.
        let unknown = unsafe { CStr::from_ptr(mcast_status_string(mcast_status_t(9999))) };
        assert_eq!(unknown.to_str().unwrap(), "MCAST_ERROR_UNKNOWN");
    }
}
