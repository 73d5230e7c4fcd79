//! The NCCL that serves what mcast does not: the library `MCAST_NCCL_FALLBACK` names (an
//! absolute path, ignored with a warning in a setuid or setgid program: `mcast::libpath`), loaded
//! on first need by `mcast::dynlib` (the loader the core's NCCL engine uses too): with
//! `RTLD_DEEPBIND`, so its own calls to NCCL's names stay inside it even when this library was
//! put in front of it with `LD_PRELOAD`; when the program already loaded it, that copy is used as
//! it is, and its calls on its communicators come back through `comm::foreign`. Its functions are
//! looked up under their profiling names (`pnccl*`) first, then their plain names.

use std::sync::OnceLock;

use mcast::dynlib::Library;
use mcast::libpath::{self, LibPath};

/// A loaded fallback NCCL.
pub struct Nccl {
    lib: Library,
    /// The path it was loaded from.
    pub path: String,
}

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
    let lib = Library::open(path).map_err(|why| format!("{ENV}={path}: the library could not be loaded: {why}"))?;
    // A library without ncclGetUniqueId is not an NCCL.
    lib.address("ncclGetUniqueId").map_err(|e| format!("{ENV}={path}: {e}"))?;
    Ok(Nccl { lib, path: path.to_string() })
}

impl Nccl {
    /// The function `name` as `F`, an `unsafe extern "C" fn` type matching NCCL's declaration.
    ///
    /// # Safety
    /// `F` must be the function pointer type of NCCL's `name`.
    pub unsafe fn function<F: Copy>(&self, name: &str) -> Result<F, String> {
        // SAFETY: the caller names the right type.
        unsafe { self.lib.function::<F>(name) }.map_err(|e| format!("the fallback NCCL ({}): {e}", self.path))
    }
}
