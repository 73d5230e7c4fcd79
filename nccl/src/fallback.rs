//! The NCCL that serves what mcast does not: the library `MCAST_NCCL_FALLBACK` names (an
//! absolute path, ignored with a warning in a setuid or setgid program: `mcast::libpath`), loaded
//! on first need with `RTLD_DEEPBIND`, so its own calls to NCCL's names stay inside it even when
//! this library was put in front of it with `LD_PRELOAD` (when the program already loaded it,
//! that copy is used as it is, and its calls on its communicators come back through
//! `comm::foreign`). Its functions are looked up under their profiling names (`pnccl*`) first,
//! then their plain names.

use std::ffi::{c_void, CString};
use std::sync::OnceLock;

use mcast::libpath::{self, LibPath};

/// A loaded fallback NCCL.
pub struct Nccl {
    handle: *mut c_void,
    /// The path it was loaded from.
    pub path: String,
}

// SAFETY: the handle is only used with dlsym, which is thread-safe; the library stays loaded
// for the life of the process.
unsafe impl Send for Nccl {}
// SAFETY: as above.
unsafe impl Sync for Nccl {}

static LIBRARY: OnceLock<Option<Result<Nccl, String>>> = OnceLock::new();

/// The variable naming the fallback library.
pub const ENV: &str = "MCAST_NCCL_FALLBACK";

/// The fallback NCCL: `None` when `MCAST_NCCL_FALLBACK` is unset or empty, `Some(Err)` when it
/// is not loaded (the message says why: not an absolute path, ignored in a setuid or setgid
/// program, or the load failed; see `mcast::libpath`).
pub fn library() -> Option<&'static Result<Nccl, String>> {
    LIBRARY
        .get_or_init(|| match libpath::from_env(ENV) {
            Ok(LibPath::Unset) => None,
            Ok(LibPath::Ignored(why)) => Some(Err(why)),
            Ok(LibPath::Path(path)) => Some(load(&path)),
            Err(e) => Some(Err(e)),
        })
        .as_ref()
}

fn load(path: &str) -> Result<Nccl, String> {
    let c = CString::new(path).map_err(|_| format!("{ENV}={path:?} contains a NUL byte"))?;
    // Already in the process (a program linked with libnccl, as PyTorch's libtorch_cuda.so is):
    // that copy, as it was loaded. RTLD_DEEPBIND would not change how it binds, and sanitizer
    // runtimes refuse the flag; its own calls to NCCL's names can then reach this library, which
    // sends those on NCCL's communicators back (comm::foreign).
    // SAFETY: a NUL-terminated path; the flags are valid for dlopen.
    let mut handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        // SAFETY: as above.
        handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_DEEPBIND) };
    }
    if handle.is_null() {
        // SAFETY: dlerror returns NULL or a NUL-terminated string.
        let why = unsafe { libc::dlerror() };
        let why = if why.is_null() {
            "unknown error".to_string()
        } else {
            // SAFETY: checked non-NULL above.
            unsafe { std::ffi::CStr::from_ptr(why) }.to_string_lossy().into_owned()
        };
        return Err(format!("{ENV}={path}: the library could not be loaded: {why}"));
    }
    let lib = Nccl { handle, path: path.to_string() };
    // A library without ncclGetUniqueId is not an NCCL.
    lib.address("ncclGetUniqueId").map_err(|e| format!("{ENV}={path}: {e}"))?;
    Ok(lib)
}

impl Nccl {
    fn address(&self, name: &str) -> Result<*mut c_void, String> {
        for candidate in [format!("p{name}"), name.to_string()] {
            let c = CString::new(candidate).expect("function names have no NUL");
            // SAFETY: a live handle and a NUL-terminated name.
            let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
            if !p.is_null() {
                return Ok(p);
            }
        }
        Err(format!("it has no function {name}"))
    }

    /// The function `name` as `F`, an `unsafe extern "C" fn` type matching NCCL's declaration.
    ///
    /// # Safety
    /// `F` must be the function pointer type of NCCL's `name`.
    pub unsafe fn function<F: Copy>(&self, name: &str) -> Result<F, String> {
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
        let p = self.address(name).map_err(|e| format!("the fallback NCCL ({}): {e}", self.path))?;
        // SAFETY: the caller names the right type; a function pointer has a data pointer's size.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }
}
