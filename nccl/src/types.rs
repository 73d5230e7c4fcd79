//! NCCL's types, as `include/mcast/nccl.h` declares them, and their mapping onto mcast's.
//!
//! Enums from C arrive as integers and are checked here: a value outside the enum is an error
//! value, never undefined behaviour.

use std::ffi::{c_char, c_int, CStr};

use mcast::capi::mcast_status_t;
use mcast::capi::status::mcast_last_error;

/// `ncclResult_t` (a C enum: an `int`).
pub type ncclResult_t = c_int;
/// `ncclDataType_t`.
pub type ncclDataType_t = c_int;
/// `ncclRedOp_t`.
pub type ncclRedOp_t = c_int;

/// `ncclSuccess`.
pub const SUCCESS: ncclResult_t = 0;
/// `ncclUnhandledCudaError`.
pub const UNHANDLED_CUDA_ERROR: ncclResult_t = 1;
/// `ncclSystemError`.
pub const SYSTEM_ERROR: ncclResult_t = 2;
/// `ncclInternalError`.
pub const INTERNAL_ERROR: ncclResult_t = 3;
/// `ncclInvalidArgument`.
pub const INVALID_ARGUMENT: ncclResult_t = 4;
/// `ncclInvalidUsage`.
pub const INVALID_USAGE: ncclResult_t = 5;
/// `ncclRemoteError`.
pub const REMOTE_ERROR: ncclResult_t = 6;
/// `ncclInProgress`.
pub const IN_PROGRESS: ncclResult_t = 7;

/// NCCL's version whose API the header follows (`NCCL_VERSION_CODE` of 2.27.7).
pub const VERSION_CODE: c_int = 2 * 10000 + 27 * 100 + 7;

/// Bytes of an `ncclUniqueId`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    /// Opaque bytes.
    pub internal: [c_char; UNIQUE_ID_BYTES],
}

/// The fields of `ncclConfig_t` this library reads (the start of NCCL's struct).
#[repr(C)]
pub struct ConfigHead {
    /// `sizeof(ncclConfig_t)` of the caller.
    pub size: usize,
    /// `0xcafebeef`.
    pub magic: u32,
    /// NCCL version the caller was built with.
    pub version: u32,
    /// 0: non-blocking; 1 or `NCCL_CONFIG_UNDEF_INT`: blocking.
    pub blocking: c_int,
}

/// `ncclConfig_t.magic` of a struct made with `NCCL_CONFIG_INITIALIZER`.
pub const CONFIG_MAGIC: u32 = 0xcafe_beef;

/// `NCCL_SPLIT_NOCOLOR`.
pub const SPLIT_NOCOLOR: c_int = -1;

/// An NCCL data type: its name, its size, and the mcast dtype that reduces it, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DType {
    /// NCCL's name.
    pub name: &'static str,
    /// Bytes per element.
    pub size: usize,
    /// `mcast_dtype_t` value when mcast reduces this type.
    pub mcast: Option<u32>,
}

/// `ncclDataType_t` -> [`DType`]; `None` outside the enum.
pub fn dtype(d: ncclDataType_t) -> Option<DType> {
    let (name, size, mcast) = match d {
        0 => ("ncclInt8", 1, None),
        1 => ("ncclUint8", 1, None),
        2 => ("ncclInt32", 4, Some(4)),
        3 => ("ncclUint32", 4, Some(5)),
        4 => ("ncclInt64", 8, Some(6)),
        5 => ("ncclUint64", 8, Some(7)),
        6 => ("ncclFloat16", 2, Some(2)),
        7 => ("ncclFloat32", 4, Some(0)),
        8 => ("ncclFloat64", 8, Some(1)),
        9 => ("ncclBfloat16", 2, Some(3)),
        10 => ("ncclFloat8e4m3", 1, None),
        11 => ("ncclFloat8e5m2", 1, None),
        _ => return None,
    };
    Some(DType { name, size, mcast })
}

/// `ncclRedOp_t` -> (name, the `mcast_op_t` value when mcast serves it). `None` for values
/// that are neither built in nor possibly made by `ncclRedOpCreatePreMulSum` (negative).
pub fn red_op(op: ncclRedOp_t) -> Option<(&'static str, Option<u32>)> {
    Some(match op {
        0 => ("ncclSum", Some(0)),
        1 => ("ncclProd", None),
        2 => ("ncclMax", Some(2)),
        3 => ("ncclMin", Some(1)),
        4 => ("ncclAvg", None),
        5.. => ("a custom operation (ncclRedOpCreatePreMulSum)", None),
        _ => return None,
    })
}

/// The `ncclResult_t` an mcast status is reported as.
pub fn result_of(status: mcast_status_t) -> ncclResult_t {
    match status.0 {
        0 => SUCCESS,
        // INVALID_ARGUMENT, INVALID_HANDLE
        1 | 2 => INVALID_ARGUMENT,
        // OUT_OF_MEMORY, SYSTEM_NOT_READY: the system (device memory, fabric manager)
        3 | 7 => SYSTEM_ERROR,
        // NOT_SUPPORTED, IN_USE: a request this library or system cannot take
        4 | 8 => INVALID_USAGE,
        // DRIVER_UNAVAILABLE, DRIVER
        5 | 6 => UNHANDLED_CUDA_ERROR,
        // TIMEOUT, ABORTED: a peer did not come, or the team was aborted (here or by a peer)
        9 | 11 => REMOTE_ERROR,
        _ => INTERNAL_ERROR,
    }
}

/// `ncclGetErrorString`'s text.
pub fn error_string(r: ncclResult_t) -> &'static std::ffi::CStr {
    match r {
        SUCCESS => c"no error",
        UNHANDLED_CUDA_ERROR => c"unhandled cuda error (ncclGetLastError says why)",
        SYSTEM_ERROR => c"unhandled system error (ncclGetLastError says why)",
        INTERNAL_ERROR => c"internal error - please report this issue to the mcast developers",
        INVALID_ARGUMENT => c"invalid argument (ncclGetLastError says why)",
        INVALID_USAGE => c"invalid usage (ncclGetLastError says why)",
        REMOTE_ERROR => c"remote process exited or there was a network error",
        IN_PROGRESS => c"NCCL operation in progress",
        _ => c"unknown result code",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mcast_status_maps_to_a_documented_result() {
        for s in 0..=12u32 {
            let r = result_of(mcast_status_t(s));
            assert!((0..=6).contains(&r), "status {s} -> {r}");
            assert_eq!(r == SUCCESS, s == 0);
        }
        assert_eq!(result_of(mcast_status_t(1)), INVALID_ARGUMENT);
        assert_eq!(result_of(mcast_status_t(9)), REMOTE_ERROR);
    }

    #[test]
    fn dtypes_follow_nccl_numbering() {
        assert_eq!(dtype(7).unwrap().name, "ncclFloat32");
        assert_eq!(dtype(9).unwrap(), DType { name: "ncclBfloat16", size: 2, mcast: Some(3) });
        assert_eq!(dtype(0).unwrap().mcast, None);
        assert!(dtype(12).is_none() && dtype(-1).is_none());
        // Every mcast dtype is reachable exactly once.
        let mut seen: Vec<u32> = (0..12).filter_map(|d| dtype(d).unwrap().mcast).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn ops_map_min_and_max_the_right_way_round() {
        assert_eq!(red_op(2), Some(("ncclMax", Some(2))));
        assert_eq!(red_op(3), Some(("ncclMin", Some(1))));
        assert_eq!(red_op(1).unwrap().1, None);
        assert!(red_op(-3).is_none());
    }
}

/// A failed call: the result and the message `ncclGetLastError` shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The result returned.
    pub code: ncclResult_t,
    /// What went wrong and what to do.
    pub message: String,
}

impl Failure {
    /// A failure with `code`.
    pub fn new(code: ncclResult_t, message: impl Into<String>) -> Failure {
        Failure { code, message: message.into() }
    }
}

/// What a call returns internally.
pub type Outcome<T = ()> = Result<T, Failure>;

/// Turns an mcast status into an outcome, with `mcast_last_error` as the message.
pub fn check(status: mcast_status_t, what: &str) -> Outcome {
    if status.0 == 0 {
        return Ok(());
    }
    // SAFETY: mcast_last_error never returns NULL; the text is NUL-terminated.
    let detail = unsafe { CStr::from_ptr(mcast_last_error()) }.to_string_lossy().into_owned();
    let message = if detail.starts_with(what) { detail } else { format!("{what}: {detail}") };
    Err(Failure::new(result_of(status), message))
}
