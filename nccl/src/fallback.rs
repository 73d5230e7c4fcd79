//! The NCCL that serves what mcast does not: the library `MCAST_NCCL_FALLBACK` names (an
//! absolute path, ignored with a warning in a setuid or setgid program: `mcast::libpath`), loaded
//! on first need by `mcast::dynlib` (the loader the core's NCCL engine uses too): with
//! `RTLD_DEEPBIND`, so its own calls to NCCL's names stay inside it even when this library was
//! put in front of it with `LD_PRELOAD`; when the program already loaded it, that copy is used as
//! it is, and its calls on its communicators come back through [`foreign`]. Its functions are
//! looked up under their profiling names (`pnccl*`) first, then their plain names.

use std::collections::HashSet;
use std::ffi::{c_void, CStr};
use std::sync::OnceLock;

use mcast::dynlib::Library;
use mcast::libpath::{self, LibPath};
use parking_lot::Mutex;

use crate::types::{self, ncclResult_t, Failure, Outcome};

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

/// Communicators of the fallback NCCL made by this library (beside a team, or by a split).
static FALLBACK_COMMS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

/// Destroys (`abort`: aborts) the fallback communicator `fc`, made by this process, once, and
/// forgets it: the fallback NCCL's error with its last-error text when the call fails (where the
/// library lacks the function, `fc` is only forgotten). Untracked only after the call returns:
/// NCCL calls its own exported functions (`ncclCommGetAsyncError`) on `fc` while it destroys
/// it, and they may arrive here.
pub fn destroy(lib: &Nccl, fc: usize, abort: bool) -> Outcome {
    type Destroy = unsafe extern "C" fn(*mut c_void) -> ncclResult_t;
    let name = if abort { "ncclCommAbort" } else { "ncclCommDestroy" };
    // SAFETY: NCCL's signature of both functions.
    let Ok(f) = (unsafe { lib.function::<Destroy>(name) }) else {
        untrack(fc);
        return Ok(());
    };
    // SAFETY: a fallback communicator this process made, destroyed once (the caller's promise).
    let r = unsafe { f(fc as *mut c_void) };
    untrack(fc);
    if r != types::SUCCESS {
        return Err(Failure::new(r, format!("the fallback NCCL's {name} failed: {}", last_error(lib))));
    }
    Ok(())
}

/// Records `fc`, a communicator the fallback NCCL made for this library.
pub fn track(fc: usize) {
    FALLBACK_COMMS.lock().get_or_insert_with(HashSet::new).insert(fc);
}

/// Forgets `fc` once the fallback NCCL destroyed it.
pub fn untrack(fc: usize) {
    if let Some(s) = FALLBACK_COMMS.lock().as_mut() {
        s.remove(&fc);
    }
}

/// The fallback NCCL when `ptr` is one of its live communicators rather than one of ours.
///
/// NCCL calls its own exported functions (`ncclCommGetAsyncError` from `ncclCommDestroy`,
/// `ncclCommFinalize` and `ncclCommAbort`; `ncclBroadcast` from `ncclBcast`; registration and
/// windows in NCCL 2.28) through the dynamic linker. When this library is in front of NCCL
/// (`LD_PRELOAD`, or linked before a `libnccl` the program also loads, as PyTorch's
/// `libtorch_cuda.so` does) those calls arrive here with NCCL's own communicators, and must go
/// back to NCCL. The same holds for the rail communicators of mcast's NCCL engine, which with
/// `MCAST_NCCL_HIER=on` the fallback NCCL makes for a team across NVLink domains.
pub fn foreign(ptr: *const c_void) -> Option<&'static Nccl> {
    let ours = FALLBACK_COMMS.lock().as_ref().is_some_and(|s| s.contains(&(ptr as usize)));
    if ptr.is_null() || !(ours || mcast::runtime::net::nccl::is_rail_comm(ptr)) {
        return None;
    }
    match library() {
        Some(Ok(lib)) => Some(lib),
        _ => None,
    }
}

/// The fallback NCCL's `ncclGetLastError`, or a note that it has none.
pub fn last_error(lib: &Nccl) -> String {
    type LastError = unsafe extern "C" fn(*mut c_void) -> *const std::ffi::c_char;
    // SAFETY: NCCL's signature of ncclGetLastError.
    let Ok(f) = (unsafe { lib.function::<LastError>("ncclGetLastError") }) else {
        return "(the fallback NCCL has no ncclGetLastError)".into();
    };
    // SAFETY: NULL is a valid communicator argument of ncclGetLastError.
    let p = unsafe { f(std::ptr::null_mut()) };
    if p.is_null() {
        return "(no detail)".into();
    }
    // SAFETY: NCCL returns a NUL-terminated string.
    let text = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    if text.is_empty() {
        "(no detail from the fallback NCCL's ncclGetLastError)".into()
    } else {
        text
    }
}
