//! The library version.

use std::ffi::c_int;

/// Writes the version of the loaded library into the non-NULL pointers among `major`, `minor`
/// and `patch` (NULL pointers are skipped). Thread-safe; cannot fail.
///
/// # Safety
/// Each pointer must be NULL or valid for writing an `int`.
#[no_mangle]
pub unsafe extern "C" fn mcast_get_version(major: *mut c_int, minor: *mut c_int, patch: *mut c_int) {
    let parse = |s: &str| s.parse::<c_int>().unwrap_or(-1);
    for (ptr, value) in [
        (major, env!("CARGO_PKG_VERSION_MAJOR")),
        (minor, env!("CARGO_PKG_VERSION_MINOR")),
        (patch, env!("CARGO_PKG_VERSION_PATCH")),
    ] {
        // SAFETY: the caller passes NULL or a valid pointer.
        if let Some(p) = unsafe { ptr.as_mut() } {
            *p = parse(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_is_the_package_version() {
        let (mut a, mut c) = (-5, -5);
        // SAFETY: valid pointers and one NULL.
        unsafe { mcast_get_version(&mut a, std::ptr::null_mut(), &mut c) };
        assert_eq!(a.to_string(), env!("CARGO_PKG_VERSION_MAJOR"));
        assert_eq!(c.to_string(), env!("CARGO_PKG_VERSION_PATCH"));
    }
}
