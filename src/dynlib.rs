//! A shared library loaded at run time for its C functions: how mcast loads an NCCL, both as the
//! engine between NVLink domains (`runtime::net::nccl`) and as `libmcast_nccl`'s fallback
//! (`nccl/src/fallback.rs`). One loader, so the two agree on how such a library binds:
//!
//! - A library already in the process (a program linked with libnccl, as PyTorch's
//!   `libtorch_cuda.so` is) is used as it was loaded (`RTLD_NOLOAD`): `RTLD_DEEPBIND` would not
//!   change how it binds, and sanitizer runtimes refuse the flag.
//! - Otherwise it is loaded `RTLD_LOCAL | RTLD_DEEPBIND`: its names do not enter the global
//!   scope, and its own calls to its API names stay inside it even when `libmcast_nccl`, which
//!   exports the same names, comes first in the process (`LD_PRELOAD`).
//! - Functions are looked up under NCCL's profiling names (`pnccl*`) first, then their plain
//!   names: NCCL defines the plain names weak.
//!
//! Which path to load is the caller's business (`libpath` for variables). A library is never
//! unloaded: NCCL keeps threads and CUDA state for the life of the process. A leaf.

use std::ffi::{c_void, CStr, CString};

/// A loaded library.
#[derive(Debug)]
pub struct Library {
    handle: *mut c_void,
    /// The path or name it was loaded from.
    pub path: String,
}

// SAFETY: the handle is only used with dlsym, which is thread-safe; the library stays loaded for
// the life of the process.
unsafe impl Send for Library {}
// SAFETY: as above.
unsafe impl Sync for Library {}

/// The dynamic linker's last error, or `"unknown error"`.
pub(crate) fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by the C library.
    let why = unsafe { libc::dlerror() };
    if why.is_null() {
        return "unknown error".to_string();
    }
    // SAFETY: checked non-NULL above.
    unsafe { CStr::from_ptr(why) }.to_string_lossy().into_owned()
}

impl Library {
    /// Loads `path` (an absolute path, or a bare name the dynamic linker searches for) under the
    /// rules above. `Err` is the dynamic linker's reason.
    pub fn open(path: &str) -> Result<Library, String> {
        let c = CString::new(path).map_err(|_| "the path contains a NUL byte".to_string())?;
        // SAFETY: a NUL-terminated path; the flags are valid for dlopen.
        let mut handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if handle.is_null() {
            // SAFETY: as above.
            handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_DEEPBIND) };
        }
        if handle.is_null() {
            return Err(dlerror_text());
        }
        Ok(Library { handle, path: path.to_string() })
    }

    /// The address of function `name` (its `p`-prefixed profiling name first).
    pub fn address(&self, name: &str) -> Result<*mut c_void, String> {
        for candidate in [format!("p{name}"), name.to_string()] {
            let c = CString::new(candidate).map_err(|_| format!("{name:?} contains a NUL byte"))?;
            // SAFETY: a live handle and a NUL-terminated name.
            let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
            if !p.is_null() {
                return Ok(p);
            }
        }
        Err(format!("it has no function {name}"))
    }

    /// The function `name` as `F`, an `unsafe extern "C" fn` type.
    ///
    /// # Safety
    /// `F` must be the function pointer type of the library's `name`.
    pub unsafe fn function<F: Copy>(&self, name: &str) -> Result<F, String> {
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
        let p = self.address(name)?;
        // SAFETY: the caller names the right type; a function pointer has a data pointer's size.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_gives_the_dynamic_linkers_reason() {
        let e = Library::open("/nonexistent/libmcast-test-missing.so").unwrap_err();
        assert!(e.contains("/nonexistent/libmcast-test-missing.so") && e.contains("No such file"), "{e}");
    }

    #[test]
    fn functions_are_found_by_name_and_a_missing_one_is_named() {
        let libc_so = Library::open("libc.so.6").expect("the C library loads");
        type Getpid = unsafe extern "C" fn() -> libc::pid_t;
        // SAFETY: getpid's type.
        let getpid = unsafe { libc_so.function::<Getpid>("getpid") }.expect("getpid");
        // SAFETY: getpid has no preconditions.
        assert_eq!(unsafe { getpid() }, std::process::id() as libc::pid_t);
        let e = libc_so.address("mcastNoSuchFunction").unwrap_err();
        assert_eq!(e, "it has no function mcastNoSuchFunction");
    }
}
