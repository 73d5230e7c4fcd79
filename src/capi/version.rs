//! The library version.

use std::ffi::c_int;

/// Major version of the header (equal to the library's `Cargo.toml` version).
pub const MCAST_VERSION_MAJOR: u32 = 0;
/// Minor version of the header.
pub const MCAST_VERSION_MINOR: u32 = 1;
/// Patch version of the header.
pub const MCAST_VERSION_PATCH: u32 = 0;

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
    fn macros_equal_the_package_version() {
        assert_eq!(MCAST_VERSION_MAJOR.to_string(), env!("CARGO_PKG_VERSION_MAJOR"));
        assert_eq!(MCAST_VERSION_MINOR.to_string(), env!("CARGO_PKG_VERSION_MINOR"));
        assert_eq!(MCAST_VERSION_PATCH.to_string(), env!("CARGO_PKG_VERSION_PATCH"));
        let (mut a, mut c) = (-5, -5);
        // SAFETY: valid pointers and one NULL.
        unsafe { mcast_get_version(&mut a, std::ptr::null_mut(), &mut c) };
        assert_eq!((a as u32, c as u32), (MCAST_VERSION_MAJOR, MCAST_VERSION_PATCH));
    }
}
