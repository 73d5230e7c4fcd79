//! The C boundary: one module per C type. Every export runs inside `guard` (panic boundary,
//! status, thread-local message); arguments are checked here and handed to `runtime`, which
//! knows nothing of C. No logic lives here.
#![deny(missing_docs)]
#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::runtime::{Error, ErrorKind, Result};

// In the order of an application's lifecycle, which is the order of include/mcast.h (cbindgen
// reads the modules in this order) and of docs/reference.md: statuses and the version; the
// context and its devices; memory, teams and buffers; collectives; the device API's handles; the
// engine between NVLink domains. (A blank line between them: rustfmt sorts adjacent ones.)
pub mod status;

pub mod version;

pub mod config;

pub mod context;

pub mod device;

pub mod memory;

pub mod team;

pub mod buffer;

pub mod collective;

pub mod device_api;

pub mod net;

pub use status::mcast_status_t;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as this thread's last error.
pub(crate) fn set_last_error(message: &str) {
    let clean: Vec<u8> = message.bytes().map(|b| if b == 0 { b'?' } else { b }).collect();
    let c = CString::new(clean).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Pointer to this thread's last error, valid until its next failing call.
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The status a runtime error kind is reported as.
pub fn status_of(kind: ErrorKind) -> mcast_status_t {
    use status::McastStatus as S;
    let s = match kind {
        ErrorKind::InvalidArgument => S::MCAST_ERROR_INVALID_ARGUMENT,
        ErrorKind::InvalidHandle => S::MCAST_ERROR_INVALID_HANDLE,
        ErrorKind::OutOfMemory => S::MCAST_ERROR_OUT_OF_MEMORY,
        ErrorKind::NotSupported => S::MCAST_ERROR_NOT_SUPPORTED,
        ErrorKind::DriverUnavailable => S::MCAST_ERROR_DRIVER_UNAVAILABLE,
        ErrorKind::Driver => S::MCAST_ERROR_DRIVER,
        ErrorKind::SystemNotReady => S::MCAST_ERROR_SYSTEM_NOT_READY,
        ErrorKind::InUse => S::MCAST_ERROR_IN_USE,
        ErrorKind::Timeout => S::MCAST_ERROR_TIMEOUT,
        ErrorKind::Internal => S::MCAST_ERROR_INTERNAL,
        ErrorKind::Aborted => S::MCAST_ERROR_ABORTED,
    };
    mcast_status_t(s as u32)
}

/// Runs the body of export `func`: a panic becomes `MCAST_ERROR_INTERNAL`, an error its status;
/// both leave a message for `mcast_last_error`.
pub(crate) fn guard(func: &'static str, body: impl FnOnce() -> Result<()>) -> mcast_status_t {
    // Resources created by `body` are reported as created by `func` (the leak report).
    match crate::runtime::registry::in_call(func, || catch_unwind(AssertUnwindSafe(body))) {
        Ok(Ok(())) => mcast_status_t::SUCCESS,
        Ok(Err(e)) => {
            set_last_error(&format!("{func}: {}", e.message));
            status_of(e.kind)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            let msg = format!("{func}: internal error (a bug in mcast, please report it): {what}");
            crate::logging::init();
            tracing::error!("{msg}");
            set_last_error(&msg);
            status_of(ErrorKind::Internal)
        }
    }
}

/// `Ok(&mut T)` for a non-NULL out-pointer, else `MCAST_ERROR_INVALID_ARGUMENT`.
///
/// # Safety
/// `ptr` must be NULL or valid for writes of a `T`.
pub(crate) unsafe fn out_ptr<'a, T>(ptr: *mut T, name: &str) -> Result<&'a mut T> {
    // SAFETY: the caller guarantees `ptr` is NULL or valid for writes.
    unsafe { ptr.as_mut() }.ok_or_else(|| Error::invalid_argument(format!("{name} is NULL")))
}

/// Checks a `struct_size` field against the smallest size this library accepts.
pub(crate) fn check_struct_size(given: u32, min: usize, name: &str) -> Result<()> {
    if (given as usize) < min {
        return Err(Error::invalid_argument(format!(
            "{name}->struct_size is {given}; set it to sizeof({name}) (at least {min})"
        )));
    }
    Ok(())
}

/// Fills a versioned out-struct (first field `uint32_t struct_size`, grown only by appending)
/// at `ptr`: `struct_size` must be at least `first` (the size of the struct's first version);
/// `fill(struct_size)` makes the value, of which the first `min(struct_size, sizeof(T))` bytes
/// are written, so a caller built against an earlier, smaller version gets the fields it
/// knows and nothing past its struct.
///
/// # Safety
/// `ptr` must be NULL or valid for reading 4 bytes and for writing `struct_size` bytes or
/// `sizeof(T)`, whichever is less.
pub(crate) unsafe fn write_versioned<T>(
    ptr: *mut T,
    first: usize,
    name: &str,
    fill: impl FnOnce(u32) -> Result<T>,
) -> Result<()> {
    if ptr.is_null() {
        return Err(Error::invalid_argument("info is NULL"));
    }
    // SAFETY: the caller's struct starts with its uint32_t struct_size.
    let given = unsafe { ptr.cast::<u32>().read_unaligned() };
    if (given as usize) < first {
        return Err(Error::invalid_argument(format!(
            "{name}->struct_size is {given}; set it to sizeof({name}) ({}; at least {first}, the size of its first \
             version)",
            std::mem::size_of::<T>()
        )));
    }
    let value = fill(given)?;
    let n = (given as usize).min(std::mem::size_of::<T>());
    // SAFETY: an untyped copy of `value`'s first `n` bytes (padding included, copied as it is);
    // the destination holds at least `n` bytes (checked above and the caller's promise) and
    // cannot overlap a local.
    unsafe { std::ptr::copy_nonoverlapping((&value as *const T).cast::<u8>(), ptr.cast::<u8>(), n) };
    Ok(())
}

/// Copies `text` into a fixed C char array, truncated, NUL-terminated.
pub(crate) fn copy_str(dst: &mut [c_char], text: &str) {
    let n = text.len().min(dst.len().saturating_sub(1));
    for (d, &b) in dst.iter_mut().zip(text.as_bytes()[..n].iter()) {
        *d = b as c_char;
    }
    if let Some(end) = dst.get_mut(n) {
        *end = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn guard_turns_a_panic_into_internal() {
        let st = guard("mcast_test", || panic!("boom {}", 42));
        assert_eq!(st, status_of(ErrorKind::Internal));
        // SAFETY: the pointer is this thread's NUL-terminated message.
        let msg = unsafe { CStr::from_ptr(last_error_ptr()) }.to_str().unwrap().to_string();
        assert!(msg.contains("mcast_test") && msg.contains("boom 42"), "{msg}");
    }

    #[test]
    fn guard_reports_errors_and_success() {
        let st = guard("mcast_x", || Err(Error::invalid_argument("bad thing")));
        assert_eq!(st.0, 1);
        // SAFETY: as above.
        let msg = unsafe { CStr::from_ptr(last_error_ptr()) }.to_str().unwrap().to_string();
        assert_eq!(msg, "mcast_x: bad thing");
        assert_eq!(guard("mcast_y", || Ok(())), mcast_status_t::SUCCESS);
    }

    #[test]
    fn strings_are_truncated_and_terminated() {
        let mut buf = [1 as c_char; 5];
        copy_str(&mut buf, "abcdefgh");
        assert_eq!(buf, [b'a' as c_char, b'b' as c_char, b'c' as c_char, b'd' as c_char, 0]);
        let mut small = [1 as c_char; 4];
        copy_str(&mut small, "xy");
        assert_eq!(&small[..3], &[b'x' as c_char, b'y' as c_char, 0]);
    }
}
