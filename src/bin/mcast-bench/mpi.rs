//! `--net mpi`: MPI as the engine between NVLink domains, for a run under `mpirun`.
//!
//! mcast never loads MPI itself (MPI has no portable binary interface) and the bench is not built
//! with an MPI compiler, so it loads `libmcast_mpi` at run time (the adapter `scripts/install`
//! builds with `mpicc`, which links the MPI it was built with), starts MPI through it if the
//! process has not (`MPI_Init_thread`, at least `MPI_THREAD_SERIALIZED`: a rank's timing runs on
//! a thread of its own), and registers `mcast_mpi_net_ops()` with
//! `mcast_mpi_net_user(MPI_COMM_WORLD)` on the context, before the team is made. The world
//! communicator is found by Open MPI's symbol (`MPI_COMM_WORLD` is `&ompi_mpi_comm_world`
//! there): Open MPI only. The library is `MCAST_MPI_LIBRARY` (an absolute path, the rule of
//! `mcast::libpath`), else `libmcast_mpi.so` from the dynamic linker's search path.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

use mcast::capi::context::mcast_context_t;
use mcast::capi::net::{mcast_context_set_net, mcast_net_ops_t};
use mcast::libpath::{self, LibPath};

use crate::api;
use crate::args::{runtime, Failure};

/// The variable naming the library.
const LIBRARY_VAR: &str = "MCAST_MPI_LIBRARY";
/// Open MPI's `MPI_THREAD_SERIALIZED` and `MPI_THREAD_MULTIPLE`.
const THREAD_SERIALIZED: c_int = 2;
const THREAD_MULTIPLE: c_int = 3;

type InitializedFn = unsafe extern "C" fn(*mut c_int) -> c_int;
type InitThreadFn = unsafe extern "C" fn(*mut c_int, *mut *mut *mut c_char, c_int, *mut c_int) -> c_int;
type FinalizeFn = unsafe extern "C" fn() -> c_int;
type OpsFn = unsafe extern "C" fn() -> *const mcast_net_ops_t;
type UserFn = unsafe extern "C" fn(*mut c_void) -> *mut c_void;

/// MPI and `libmcast_mpi`, loaded and initialised; [`Mpi::finish`] finalises what it started.
pub struct Mpi {
    ops: OpsFn,
    user: UserFn,
    finalize: Option<FinalizeFn>,
    /// `MPI_COMM_WORLD`.
    world: *mut c_void,
}

/// `dlerror()`'s text.
fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: checked non-NULL above.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

impl Mpi {
    /// Loads the library and starts MPI (unless the process already did).
    pub fn load() -> Result<Mpi, Failure> {
        let name = match libpath::from_env(LIBRARY_VAR).map_err(runtime)? {
            LibPath::Path(p) => p,
            LibPath::Unset | LibPath::Ignored(_) => "libmcast_mpi.so".to_string(),
        };
        let c_name = CString::new(name.clone()).map_err(|_| runtime(format!("{LIBRARY_VAR}: a NUL byte")))?;
        // SAFETY: a valid NUL-terminated name; the handle is never closed (MPI stays loaded).
        // Global: Open MPI's own plugins resolve libmpi's symbols through the global scope.
        let lib = unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if lib.is_null() {
            return Err(runtime(format!(
                "--net mpi: loading {name}: {} (build it with scripts/install, where mpicc is found, and set \
                 {LIBRARY_VAR} to its absolute path or put its directory on LD_LIBRARY_PATH)",
                dl_error()
            )));
        }
        let sym = |s: &str| -> Result<*mut c_void, Failure> {
            let c = CString::new(s).expect("no NUL");
            // SAFETY: a live handle and a NUL-terminated name.
            let p = unsafe { libc::dlsym(lib, c.as_ptr()) };
            if p.is_null() {
                let open_mpi = if s.starts_with("ompi_") { " (--net mpi needs Open MPI)" } else { "" };
                return Err(runtime(format!("--net mpi: {s} not found through {name}: {}{open_mpi}", dl_error())));
            }
            Ok(p)
        };
        // SAFETY: each symbol is the function of that name with the C signature declared above
        // (mpi.h and mcast/mpi.h), or Open MPI's world communicator object.
        let (initialized, init, finalize, ops, user, world) = unsafe {
            (
                std::mem::transmute::<*mut c_void, InitializedFn>(sym("MPI_Initialized")?),
                std::mem::transmute::<*mut c_void, InitThreadFn>(sym("MPI_Init_thread")?),
                std::mem::transmute::<*mut c_void, FinalizeFn>(sym("MPI_Finalize")?),
                std::mem::transmute::<*mut c_void, OpsFn>(sym("mcast_mpi_net_ops")?),
                std::mem::transmute::<*mut c_void, UserFn>(sym("mcast_mpi_net_user")?),
                sym("ompi_mpi_comm_world")?,
            )
        };
        let mut up: c_int = 0;
        // SAFETY: a valid out-pointer.
        unsafe { initialized(&mut up) };
        let mut started = None;
        if up == 0 {
            let mut provided: c_int = 0;
            // SAFETY: NULL argc/argv are allowed by MPI; a valid out-pointer.
            let rc = unsafe { init(std::ptr::null_mut(), std::ptr::null_mut(), THREAD_MULTIPLE, &mut provided) };
            if rc != 0 {
                return Err(runtime(format!("--net mpi: MPI_Init_thread returned {rc}")));
            }
            started = Some(finalize);
            if provided < THREAD_SERIALIZED {
                // SAFETY: MPI was initialised just above.
                unsafe { finalize() };
                return Err(runtime(format!(
                    "--net mpi: this MPI provides thread level {provided}; the bench needs MPI_THREAD_SERIALIZED (2)"
                )));
            }
        }
        Ok(Mpi { ops, user, finalize: started, world })
    }

    /// Registers MPI as `ctx`'s engine between domains (before any team is made in it).
    pub fn register(&self, ctx: mcast_context_t) -> Result<(), Failure> {
        // SAFETY: the adapter's functions, called as mcast/mpi.h says: the user is made over
        // MPI_COMM_WORLD (collective over it, as every rank does this here) and handed to one
        // context, which releases it when it is destroyed.
        let (ops, user) = unsafe { ((self.ops)(), (self.user)(self.world)) };
        if user.is_null() {
            return Err(runtime("--net mpi: mcast_mpi_net_user(MPI_COMM_WORLD) returned NULL"));
        }
        // SAFETY: ops is the adapter's static table; user its value for it.
        api::check(unsafe { mcast_context_set_net(ctx, ops, user) }).map_err(runtime)
    }

    /// `MPI_Finalize`, if [`Mpi::load`] started MPI (after the context is destroyed).
    pub fn finish(self) {
        if let Some(f) = self.finalize {
            // SAFETY: MPI was initialised by load and is finalised once.
            unsafe { f() };
        }
    }
}
