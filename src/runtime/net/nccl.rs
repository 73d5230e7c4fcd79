//! NCCL as the engine between NVLink domains, loaded at run time: `MCAST_NET_NCCL` names the
//! library, else `MCAST_NCCL_FALLBACK` (the one `libmcast_nccl` forwards to), else
//! `libnccl.so.2` from the dynamic linker's search path. The first of these that is set is the
//! one loaded (a variable ignored in a setuid or setgid program is passed over, and said so); a
//! variable's value must be an absolute path (`libpath`). The library is loaded by `dynlib`
//! (`RTLD_LOCAL | RTLD_DEEPBIND`, as `libmcast_nccl` loads its fallback), so its names never meet
//! `libmcast_nccl`'s exports of the same names in one process.
//!
//! NCCL [`MIN_VERSION`] or later is needed: its `ncclConfig_t` carries `minCTAs`/`maxCTAs`, and
//! each rail communicator is made with at most [`MAX_CTAS`] CTAs so that it stays resident beside
//! mcast's kernels on the same GPU. One communicator per rail: the rail's position 0 makes the
//! unique id, which reaches the others over mcast's bootstrap (the [`RailOob`] allgather). Calls
//! are stream ordered; a failed call (its return value, or the communicator's asynchronous
//! error after it) is an [`ErrorKind::Driver`] error naming the NCCL function and its result.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::{Engine, RailComm, RailOob};
use crate::driver::{DevicePtr, Stream};
use crate::dynlib::Library;
use crate::kernels::{DType, RedOp};
use crate::libpath::{self, LibPath};
use crate::runtime::error::{Error, ErrorKind, Result};

/// The variable naming the engine's NCCL.
pub const ENV: &str = "MCAST_NET_NCCL";
/// The variable naming `libmcast_nccl`'s fallback NCCL, the engine's second choice.
pub const FALLBACK_ENV: &str = "MCAST_NCCL_FALLBACK";
/// The library loaded when neither variable is set.
pub const DEFAULT_LIBRARY: &str = "libnccl.so.2";
/// The oldest NCCL accepted: the first whose `ncclConfig_t` has `minCTAs` and `maxCTAs`.
pub const MIN_VERSION: (u32, u32, u32) = (2, 17, 0);
/// The most CTAs (thread blocks) a rail communicator's kernels use (`ncclConfig_t.maxCTAs`).
pub const MAX_CTAS: c_int = 4;

const UNIQUE_ID_BYTES: usize = 128;
const SUCCESS: c_int = 0;
const IN_PROGRESS: c_int = 7;

type NcclComm = *mut c_void;

/// `ncclUniqueId`, passed by value as the C struct it is.
#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueId {
    internal: [u8; UNIQUE_ID_BYTES],
}

/// `ncclConfig_t` as NCCL 2.17 defines it; `version` says so, and NCCL reads only `size` bytes
/// of it, giving later fields their defaults.
#[repr(C)]
struct Config217 {
    size: usize,
    magic: u32,
    version: u32,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
}

/// NCCL's `NCCL_CONFIG_UNDEF_INT`: the library's default.
const CONFIG_UNDEF_INT: c_int = c_int::MIN;

type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type GetUniqueId = unsafe extern "C" fn(*mut UniqueId) -> c_int;
type CommInitRankConfig = unsafe extern "C" fn(*mut NcclComm, c_int, UniqueId, c_int, *mut Config217) -> c_int;
type AllReduce = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, usize) -> c_int;
type ReduceScatter = AllReduce;
type AllGather = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, NcclComm, usize) -> c_int;
type Broadcast = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, usize) -> c_int;
type CommOp = unsafe extern "C" fn(NcclComm) -> c_int;
type CommGetAsyncError = unsafe extern "C" fn(NcclComm, *mut c_int) -> c_int;
type GetErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type GetLastError = unsafe extern "C" fn(NcclComm) -> *const c_char;

/// The functions of a loaded NCCL, resolved once.
struct Api {
    get_unique_id: GetUniqueId,
    comm_init_rank_config: CommInitRankConfig,
    all_reduce: AllReduce,
    reduce_scatter: ReduceScatter,
    all_gather: AllGather,
    broadcast: Broadcast,
    comm_abort: CommOp,
    comm_destroy: CommOp,
    comm_get_async_error: CommGetAsyncError,
    get_error_string: GetErrorString,
    get_last_error: GetLastError,
}

/// NCCL, loaded and version-checked.
pub struct NcclEngine {
    api: Arc<Api>,
    name: String,
    /// Where it was loaded from.
    pub path: String,
    /// `ncclGetVersion`'s (major, minor, patch).
    pub version: (u32, u32, u32),
}

/// `ncclGetVersion`'s code as (major, minor, patch): `major * 10000 + minor * 100 + patch` from
/// NCCL 2.9, `major * 1000 + minor * 100 + patch` before.
pub fn decode_version(code: u32) -> (u32, u32, u32) {
    if code >= 20900 {
        (code / 10000, code % 10000 / 100, code % 100)
    } else {
        (code / 1000, code % 1000 / 100, code % 100)
    }
}

/// The NCCL the engine uses, under the rule of this module's documentation, given the values of
/// `MCAST_NET_NCCL` (`explicit`) and `MCAST_NCCL_FALLBACK` (`fallback`) (`None`: unset). `Err`
/// names every library tried and why each was not used. A library loaded before is not loaded
/// again.
pub fn load(explicit: Option<&str>, fallback: Option<&str>) -> std::result::Result<Arc<dyn Engine>, String> {
    load_as(explicit, fallback, libpath::secure())
}

fn load_as(
    explicit: Option<&str>,
    fallback: Option<&str>,
    secure: bool,
) -> std::result::Result<Arc<dyn Engine>, String> {
    let mut passed = Vec::new();
    let mut path = None;
    for (var, value) in [(ENV, explicit), (FALLBACK_ENV, fallback)] {
        match libpath::check(var, value, secure) {
            Ok(LibPath::Unset) => {}
            Ok(LibPath::Ignored(why)) => {
                tracing::warn!("{why}");
                passed.push(why);
            }
            Ok(LibPath::Path(p)) => {
                path = Some(format!("{var}={p}"));
                break;
            }
            Err(e) => return Err(tried(&passed, &e)),
        }
    }
    let (label, file) = match &path {
        Some(labelled) => (labelled.clone(), labelled.split_once('=').map(|(_, p)| p.to_string()).unwrap_or_default()),
        None => (format!("{DEFAULT_LIBRARY} ({ENV} and {FALLBACK_ENV} unset)"), DEFAULT_LIBRARY.to_string()),
    };
    static LOADED: OnceLock<Mutex<HashMap<String, Arc<NcclEngine>>>> = OnceLock::new();
    let mut loaded = LOADED.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(engine) = loaded.get(&file) {
        return Ok(engine.clone());
    }
    let engine = Arc::new(open(&file).map_err(|why| tried(&passed, &format!("{label}: {why}")))?);
    loaded.insert(file, engine.clone());
    Ok(engine)
}

/// The error text: the variables passed over, then the library that failed.
fn tried(passed: &[String], failed: &str) -> String {
    let mut text = String::new();
    for why in passed {
        text.push_str(why);
        text.push_str("; ");
    }
    text.push_str(failed);
    text
}

fn open(path: &str) -> std::result::Result<NcclEngine, String> {
    let lib = Library::open(path).map_err(|why| format!("the library could not be loaded: {why}"))?;
    for name in [
        "ncclGetVersion",
        "ncclGetUniqueId",
        "ncclCommInitRankConfig",
        "ncclAllReduce",
        "ncclReduceScatter",
        "ncclAllGather",
        "ncclBroadcast",
        "ncclCommAbort",
        "ncclCommDestroy",
        "ncclCommGetAsyncError",
        "ncclGetErrorString",
        "ncclGetLastError",
    ] {
        lib.address(name)
            .map_err(|e| format!("not an NCCL {}.{}.{} or later: {e}", MIN_VERSION.0, MIN_VERSION.1, MIN_VERSION.2))?;
    }
    // SAFETY: every name was found above; each type is NCCL's declaration of that function.
    let api = unsafe {
        Api {
            get_unique_id: lib.function("ncclGetUniqueId")?,
            comm_init_rank_config: lib.function("ncclCommInitRankConfig")?,
            all_reduce: lib.function("ncclAllReduce")?,
            reduce_scatter: lib.function("ncclReduceScatter")?,
            all_gather: lib.function("ncclAllGather")?,
            broadcast: lib.function("ncclBroadcast")?,
            comm_abort: lib.function("ncclCommAbort")?,
            comm_destroy: lib.function("ncclCommDestroy")?,
            comm_get_async_error: lib.function("ncclCommGetAsyncError")?,
            get_error_string: lib.function("ncclGetErrorString")?,
            get_last_error: lib.function("ncclGetLastError")?,
        }
    };
    // SAFETY: as above.
    let get_version: GetVersion = unsafe { lib.function("ncclGetVersion")? };
    let mut code: c_int = 0;
    // SAFETY: a valid out-pointer.
    let r = unsafe { get_version(&mut code) };
    if r != SUCCESS {
        return Err(format!("ncclGetVersion returned {r} ({})", api.error_string(r)));
    }
    let version = decode_version(u32::try_from(code).unwrap_or(0));
    let (ma, mi, pa) = version;
    if version < MIN_VERSION {
        let (a, b, c) = MIN_VERSION;
        return Err(format!(
            "NCCL {ma}.{mi}.{pa} (ncclGetVersion {code}) is too old: mcast needs NCCL {a}.{b}.{c} or later"
        ));
    }
    Ok(NcclEngine { api: Arc::new(api), name: format!("nccl {ma}.{mi}.{pa}"), path: path.to_string(), version })
}

impl Api {
    fn error_string(&self, r: c_int) -> String {
        // SAFETY: ncclGetErrorString returns a static string for any value.
        let s = unsafe { (self.get_error_string)(r) };
        if s.is_null() {
            return "unknown result".to_string();
        }
        // SAFETY: non-NULL, NUL-terminated.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }

    /// The error for `func` returning `r` on `comm` (NULL before it exists), with NCCL's last
    /// message when it has one.
    fn error(&self, func: &str, r: c_int, comm: NcclComm) -> Error {
        // SAFETY: NULL or a live communicator; the result is NULL or a NUL-terminated string.
        let last = unsafe { (self.get_last_error)(comm) };
        let detail = if last.is_null() {
            String::new()
        } else {
            // SAFETY: non-NULL, NUL-terminated.
            let s = unsafe { CStr::from_ptr(last) }.to_string_lossy();
            if s.is_empty() {
                String::new()
            } else {
                format!(": {s}")
            }
        };
        Error::new(ErrorKind::Driver, format!("{func} returned {r} ({}){detail}", self.error_string(r)))
    }
}

/// NCCL's `ncclDataType_t` for `dtype`.
fn nccl_dtype(dtype: DType) -> c_int {
    match dtype {
        DType::I32 => 2,
        DType::U32 => 3,
        DType::I64 => 4,
        DType::U64 => 5,
        DType::F16 => 6,
        DType::F32 => 7,
        DType::F64 => 8,
        DType::BF16 => 9,
    }
}

/// NCCL's `ncclRedOp_t` for `op`.
fn nccl_op(op: RedOp) -> c_int {
    match op {
        RedOp::Sum => 0,
        RedOp::Max => 2,
        RedOp::Min => 3,
    }
}

impl Engine for NcclEngine {
    fn name(&self) -> &str {
        &self.name
    }

    fn stream_ordered(&self) -> bool {
        true
    }

    fn comm_create(&self, rail: usize, domain: usize, ndomains: usize, oob: &dyn RailOob) -> Result<Box<dyn RailComm>> {
        let (Ok(rank), Ok(nranks)) = (c_int::try_from(domain), c_int::try_from(ndomains)) else {
            return Err(Error::invalid_argument(format!("rail {rail}: {ndomains} domains are more than NCCL counts")));
        };
        let mut id = UniqueId { internal: [0u8; UNIQUE_ID_BYTES] };
        if domain == 0 {
            // SAFETY: a 128-byte out-buffer, ncclUniqueId's size.
            let r = unsafe { (self.api.get_unique_id)(&mut id) };
            if r != SUCCESS {
                return Err(self.api.error("ncclGetUniqueId", r, std::ptr::null_mut()).context(format!("rail {rail}")));
            }
        }
        let mut all = vec![0u8; UNIQUE_ID_BYTES * ndomains];
        oob.allgather(&id.internal, &mut all)
            .map_err(|e| e.context(format!("rail {rail}: sending NCCL's unique id")))?;
        id.internal.copy_from_slice(&all[..UNIQUE_ID_BYTES]);
        let mut config = Config217 {
            size: std::mem::size_of::<Config217>(),
            magic: 0xcafe_beef,
            version: 21700,
            blocking: 1,
            cga_cluster_size: CONFIG_UNDEF_INT,
            min_ctas: 1,
            max_ctas: MAX_CTAS,
            net_name: std::ptr::null(),
        };
        let mut comm: NcclComm = std::ptr::null_mut();
        // SAFETY: valid out-pointer and config; the id is rail position 0's.
        let r = unsafe { (self.api.comm_init_rank_config)(&mut comm, nranks, id, rank, &mut config) };
        if r != SUCCESS {
            return Err(self
                .api
                .error("ncclCommInitRankConfig", r, std::ptr::null_mut())
                .context(format!("rail {rail} (position {domain} of {ndomains}) on {}", self.name)));
        }
        RAIL_COMMS.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(HashSet::new).insert(comm as usize);
        Ok(Box::new(NcclRail { api: self.api.clone(), comm: AtomicPtr::new(comm), rail }))
    }
}

/// The rail communicators alive in this process, as NCCL made them.
static RAIL_COMMS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

/// True when `comm` is a live rail communicator of this engine: NCCL calls its own exported
/// functions through the dynamic linker (`ncclCommGetAsyncError` from inside `ncclBroadcast`,
/// `ncclCommDestroy`, ...), so where `libmcast_nccl` stands in front of NCCL those calls reach
/// it with these communicators, and it must send them back to NCCL.
pub fn is_rail_comm(comm: *const c_void) -> bool {
    !comm.is_null()
        && RAIL_COMMS.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(|s| s.contains(&(comm as usize)))
}

/// Forgets `comm` once NCCL released it (after the call: NCCL's teardown asks about it).
fn forget(comm: NcclComm) {
    if let Some(s) = RAIL_COMMS.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
        s.remove(&(comm as usize));
    }
}

/// One rail's NCCL communicator; NULL once aborted.
struct NcclRail {
    api: Arc<Api>,
    comm: AtomicPtr<c_void>,
    rail: usize,
}

impl NcclRail {
    fn live(&self, func: &str) -> Result<NcclComm> {
        let comm = self.comm.load(Ordering::Acquire);
        if comm.is_null() {
            return Err(Error::aborted(format!("{func} on rail {}: its NCCL communicator was aborted", self.rail)));
        }
        Ok(comm)
    }

    /// `r` from `func`, then the communicator's asynchronous error, as a result.
    fn check(&self, func: &str, r: c_int, comm: NcclComm) -> Result<()> {
        if r != SUCCESS && r != IN_PROGRESS {
            return Err(self.api.error(func, r, comm).context(format!("rail {}", self.rail)));
        }
        let mut state: c_int = SUCCESS;
        // SAFETY: a live communicator and a valid out-pointer.
        let q = unsafe { (self.api.comm_get_async_error)(comm, &mut state) };
        if q != SUCCESS {
            return Err(self.api.error("ncclCommGetAsyncError", q, comm).context(format!("rail {}", self.rail)));
        }
        if state != SUCCESS && state != IN_PROGRESS {
            return Err(self
                .api
                .error(&format!("{func}: ncclCommGetAsyncError"), state, comm)
                .context(format!("rail {}", self.rail)));
        }
        Ok(())
    }
}

impl RailComm for NcclRail {
    fn all_reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DType,
        op: RedOp,
        stream: Stream,
    ) -> Result<()> {
        let comm = self.live("ncclAllReduce")?;
        // SAFETY: device pointers of the caller's device with `count` elements; a live communicator.
        let r = unsafe {
            (self.api.all_reduce)(
                send as usize as *const c_void,
                recv as usize as *mut c_void,
                count,
                nccl_dtype(dtype),
                nccl_op(op),
                comm,
                stream.0,
            )
        };
        self.check("ncclAllReduce", r, comm)
    }

    fn reduce_scatter(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        recv_count: usize,
        dtype: DType,
        op: RedOp,
        stream: Stream,
    ) -> Result<()> {
        let comm = self.live("ncclReduceScatter")?;
        // SAFETY: as in all_reduce.
        let r = unsafe {
            (self.api.reduce_scatter)(
                send as usize as *const c_void,
                recv as usize as *mut c_void,
                recv_count,
                nccl_dtype(dtype),
                nccl_op(op),
                comm,
                stream.0,
            )
        };
        self.check("ncclReduceScatter", r, comm)
    }

    fn all_gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        send_count: usize,
        dtype: DType,
        stream: Stream,
    ) -> Result<()> {
        let comm = self.live("ncclAllGather")?;
        // SAFETY: as in all_reduce.
        let r = unsafe {
            (self.api.all_gather)(
                send as usize as *const c_void,
                recv as usize as *mut c_void,
                send_count,
                nccl_dtype(dtype),
                comm,
                stream.0,
            )
        };
        self.check("ncclAllGather", r, comm)
    }

    fn broadcast(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DType,
        root: usize,
        stream: Stream,
    ) -> Result<()> {
        let comm = self.live("ncclBroadcast")?;
        let root = c_int::try_from(root)
            .map_err(|_| Error::invalid_argument(format!("ncclBroadcast on rail {}: root {root}", self.rail)))?;
        // SAFETY: as in all_reduce.
        let r = unsafe {
            (self.api.broadcast)(
                send as usize as *const c_void,
                recv as usize as *mut c_void,
                count,
                nccl_dtype(dtype),
                root,
                comm,
                stream.0,
            )
        };
        self.check("ncclBroadcast", r, comm)
    }

    fn abort(&self) -> Result<()> {
        let comm = self.comm.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if comm.is_null() {
            return Ok(());
        }
        // SAFETY: a live communicator, aborted once (the swap above).
        let r = unsafe { (self.api.comm_abort)(comm) };
        forget(comm);
        if r != SUCCESS {
            return Err(self
                .api
                .error("ncclCommAbort", r, std::ptr::null_mut())
                .context(format!("rail {}", self.rail)));
        }
        Ok(())
    }

    fn destroy(self: Box<Self>) -> Result<()> {
        let comm = self.comm.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if comm.is_null() {
            return Ok(());
        }
        // SAFETY: a live communicator, destroyed once.
        let r = unsafe { (self.api.comm_destroy)(comm) };
        forget(comm);
        if r != SUCCESS {
            return Err(self
                .api
                .error("ncclCommDestroy", r, std::ptr::null_mut())
                .context(format!("rail {}", self.rail)));
        }
        Ok(())
    }
}

// SAFETY: NCCL's functions may be called from any thread; the communicator pointer is an atomic.
unsafe impl Send for NcclRail {}
// SAFETY: as above.
unsafe impl Sync for NcclRail {}
