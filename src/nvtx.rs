//! NVTX ranges: each collective, team creation, registration and allocation of the C API (and
//! each call of `libmcast_nccl`) as a named range in Nsight Systems' timeline, in the domain
//! `mcast`, named with the call and its arguments (`mcast_all_reduce bytes=4096 dtype=f32 op=sum
//! team=0x... rank=1`).
//!
//! # Loading, as the NVTX v3 headers do it
//!
//! No NVTX library is linked. A tool that records NVTX (Nsight Systems, `nsys`) names its
//! injection library in `NVTX_INJECTION64_PATH`; at the first range this module loads it (the
//! rule of `libpath`: an absolute path, ignored in setuid programs), calls its
//! `InitializeInjectionNvtx2` with our `nvtxGetExportTable`, and the tool writes its functions
//! into the slots of the function tables it asks for (`GetModuleFunctionTable`, the
//! `NVTX_ETID_CALLBACKS` export table) — the protocol of `nvtxDetail/nvtxInit.h` and
//! `nvtxTypes.h` in NVIDIA's NVTX v3 headers. A tool that returns 0, or fills neither the domain
//! functions (`nvtxDomainCreateA`, `nvtxDomainRangePushEx`, `nvtxDomainRangePop`) nor the core
//! ones (`nvtxRangePushA`, `nvtxRangePop`), leaves the ranges off.
//!
//! # Cost
//!
//! Off (no `NVTX_INJECTION64_PATH`, `MCAST_NVTX=off`, or a tool that failed to load): after the
//! first call decided it, a call's range costs one relaxed atomic load, and its name is never
//! built. On: the name is written into a buffer of the calling thread (the tool copies it during
//! the push), so a warm call still makes no heap allocation, and the tool's push and pop are
//! called; a buffer form's name looks the team's handle up in the handle table (shared lock).
//!
//! Uses `types` (names of dtypes and operators) and `logging` (so that a failure to
//! load the tool is seen even when the first range comes before any context), nothing else.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::libpath::{self, LibPath};
use crate::types::{DType, RedOp};

/// The variable that turns the ranges off: `off`; `auto` or `on` (the default): ranges whenever
/// a tool is attached.
pub const ENV: &str = "MCAST_NVTX";

/// The variable a tool sets to its injection library (64-bit processes).
pub const INJECTION_ENV: &str = "NVTX_INJECTION64_PATH";

/// The NVTX domain of mcast's ranges.
pub const DOMAIN: &CStr = c"mcast";

// ---- The NVTX v3 injection protocol (nvtxTypes.h, nvToolsExt.h) ----

/// `NVTX_VERSION`.
const NVTX_VERSION: u16 = 3;
/// `NvtxExportTableID`: `NVTX_ETID_CALLBACKS`, `NVTX_ETID_VERSIONINFO`.
const ETID_CALLBACKS: u32 = 1;
const ETID_VERSIONINFO: u32 = 3;
/// `NvtxCallbackModule`: the slot count of each module's function table (`NVTX_CBID_*_SIZE`),
/// by module number (CORE 1, CUDA 2, OPENCL 3, CUDART 4, CORE2 5, SYNC 6). Every module the
/// headers define is offered, as they offer them, though only CORE and CORE2 are called.
const MODULE_SIZES: [usize; 7] = [0, 16, 9, 15, 7, 16, 7];
const MODULE_CORE: usize = 1;
const MODULE_CORE2: usize = 5;
/// `NvtxCallbackIdCore`.
const CORE_RANGE_PUSH_A: usize = 9;
const CORE_RANGE_POP: usize = 11;
/// `NvtxCallbackIdCore2`.
const CORE2_DOMAIN_RANGE_PUSH_EX: usize = 4;
const CORE2_DOMAIN_RANGE_POP: usize = 5;
const CORE2_DOMAIN_CREATE_A: usize = 12;
/// `NVTX_MESSAGE_TYPE_ASCII`.
const MESSAGE_TYPE_ASCII: i32 = 1;

/// `nvtxEventAttributes_t` (`nvtxEventAttributes_v2`).
#[repr(C)]
struct EventAttributes {
    version: u16,
    size: u16,
    category: u32,
    color_type: i32,
    color: u32,
    payload_type: i32,
    reserved0: i32,
    payload: u64,
    message_type: i32,
    message: *const c_char,
}

const _: () = assert!(std::mem::size_of::<EventAttributes>() == 48);

/// `NvtxExportTableCallbacks`.
#[repr(C)]
struct ExportCallbacks {
    struct_size: usize,
    get_module_function_table: unsafe extern "C" fn(c_int, *mut *const *const AtomicUsize, *mut u32) -> c_int,
}

/// `NvtxExportTableVersionInfo`.
#[repr(C)]
struct ExportVersionInfo {
    struct_size: usize,
    version: u32,
    reserved0: u32,
    set_injection_nvtx_version: extern "C" fn(u32),
}

type InitializeInjection = unsafe extern "C" fn(unsafe extern "C" fn(u32) -> *const c_void) -> c_int;
type DomainCreateA = unsafe extern "C" fn(*const c_char) -> *mut c_void;
type DomainRangePushEx = unsafe extern "C" fn(*mut c_void, *const EventAttributes) -> c_int;
type DomainRangePop = unsafe extern "C" fn(*mut c_void) -> c_int;
type RangePushA = unsafe extern "C" fn(*const c_char) -> c_int;
type RangePop = unsafe extern "C" fn() -> c_int;

/// The slots the tool writes its functions into, by module and callback id (0 = not given).
static SLOTS: [[AtomicUsize; 16]; 7] = [const { [const { AtomicUsize::new(0) }; 16] }; 7];

/// Each module's function table, as `GetModuleFunctionTable` hands it out: `size + 1` pointers,
/// the first and the last NULL, the others the slots (made once, never freed).
static TABLES: OnceLock<[usize; 7]> = OnceLock::new();

fn tables() -> &'static [usize; 7] {
    TABLES.get_or_init(|| {
        let mut out = [0usize; 7];
        for (m, &size) in MODULE_SIZES.iter().enumerate().skip(1) {
            let mut table: Vec<*const AtomicUsize> = vec![std::ptr::null(); size + 1];
            for (id, entry) in table.iter_mut().enumerate().take(size).skip(1) {
                *entry = &SLOTS[m][id];
            }
            out[m] = Box::leak(table.into_boxed_slice()).as_ptr() as usize;
        }
        out
    })
}

/// `GetModuleFunctionTable`: the table of `module` and its size (`NVTX_CBID_*_SIZE`), or 0 for
/// a module NVTX does not define.
unsafe extern "C" fn get_module_function_table(
    module: c_int,
    out_table: *mut *const *const AtomicUsize,
    out_size: *mut u32,
) -> c_int {
    let Some(&size) = usize::try_from(module).ok().filter(|&m| m > 0).and_then(|m| MODULE_SIZES.get(m)) else {
        return 0;
    };
    let table = tables()[module as usize];
    // SAFETY: the tool passes NULL or pointers it can receive these values through.
    unsafe {
        if !out_size.is_null() {
            *out_size = size as u32;
        }
        if !out_table.is_null() {
            *out_table = table as *const *const AtomicUsize;
        }
    }
    1
}

extern "C" fn set_injection_nvtx_version(_version: u32) {}

static CALLBACKS: ExportCallbacks =
    ExportCallbacks { struct_size: std::mem::size_of::<ExportCallbacks>(), get_module_function_table };

static VERSION_INFO: ExportVersionInfo = ExportVersionInfo {
    struct_size: std::mem::size_of::<ExportVersionInfo>(),
    version: NVTX_VERSION as u32,
    reserved0: 0,
    set_injection_nvtx_version,
};

/// `nvtxGetExportTable`, handed to the tool's `InitializeInjectionNvtx2`.
unsafe extern "C" fn get_export_table(id: u32) -> *const c_void {
    match id {
        ETID_CALLBACKS => std::ptr::addr_of!(CALLBACKS).cast(),
        ETID_VERSIONINFO => std::ptr::addr_of!(VERSION_INFO).cast(),
        _ => std::ptr::null(),
    }
}

/// The tool's function in slot `id` of `module`, 0 where it gave none.
fn slot(module: usize, id: usize) -> usize {
    SLOTS[module][id].load(Ordering::Acquire)
}

// ---- The ranges ----

/// How the attached tool takes ranges.
enum Api {
    /// In the `mcast` domain (`nvtxDomainRangePushEx` / `nvtxDomainRangePop`).
    Domain(usize),
    /// In the default domain (`nvtxRangePushA` / `nvtxRangePop`), for a tool without domains.
    Core,
}

struct Loaded {
    api: Option<Api>,
    /// What `status` says.
    status: String,
}

const UNDECIDED: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

/// `OFF` once the first range found no tool: from then on a range is this one relaxed load.
static STATE: AtomicU8 = AtomicU8::new(UNDECIDED);
static LOADED: OnceLock<Loaded> = OnceLock::new();

/// An open range, closed when dropped, on the thread that opened it (NVTX ranges nest per
/// thread).
#[must_use = "the range closes when this is dropped"]
pub struct Range {
    api: Option<&'static Api>,
    _same_thread: PhantomData<*const ()>,
}

impl Drop for Range {
    fn drop(&mut self) {
        if let Some(api) = self.api {
            pop(api);
        }
    }
}

thread_local! {
    /// Where this thread's range names are written: the tool copies a name during the push, so
    /// one buffer serves every range and a name allocates only while the buffer grows.
    static NAME: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Opens a range when a tool records NVTX, named by what `name` writes; `name` is called only
/// then.
#[inline]
pub fn range<F: FnOnce(&mut dyn fmt::Write) -> fmt::Result>(name: F) -> Range {
    if STATE.load(Ordering::Relaxed) == OFF {
        return Range { api: None, _same_thread: PhantomData };
    }
    open(name)
}

#[cold]
#[inline(never)]
fn open<F: FnOnce(&mut dyn fmt::Write) -> fmt::Result>(name: F) -> Range {
    let Some(api) = loaded().api.as_ref() else { return Range { api: None, _same_thread: PhantomData } };
    let write = |s: &mut String| {
        s.clear();
        let _ = name(s);
        // A NUL inside would only shorten the name; the names written here hold none.
        s.push('\0');
        push(api, s.as_ptr().cast());
    };
    let mut write = Some(write);
    let _ = NAME.try_with(|cell| {
        if let (Ok(mut s), Some(w)) = (cell.try_borrow_mut(), write.take()) {
            w(&mut s);
        }
    });
    // The thread's buffer is gone (thread exit) or in use (a range opened while naming one).
    if let Some(w) = write {
        w(&mut String::new());
    }
    Range { api: Some(api), _same_thread: PhantomData }
}

/// Whether ranges are recorded, and why or why not (`mcast-info` prints it).
pub fn status() -> (bool, &'static str) {
    let l = loaded();
    (l.api.is_some(), &l.status)
}

fn loaded() -> &'static Loaded {
    LOADED.get_or_init(|| {
        crate::logging::init();
        let l = load();
        STATE.store(if l.api.is_some() { ON } else { OFF }, Ordering::Relaxed);
        l
    })
}

fn off(status: String) -> Loaded {
    Loaded { api: None, status }
}

fn load() -> Loaded {
    let mode = std::env::var(ENV).unwrap_or_default();
    match mode.trim() {
        "off" => return off(format!("off ({ENV}=off)")),
        "" | "auto" | "on" => {}
        other => tracing::warn!("{ENV}={other:?} is not one of auto, on, off; using auto"),
    }
    let path = match libpath::from_env(INJECTION_ENV) {
        Ok(LibPath::Path(p)) => p,
        Ok(LibPath::Unset) => return off(format!("off (no tool attached: {INJECTION_ENV} is unset)")),
        Ok(LibPath::Ignored(why)) => return off(format!("off ({why})")),
        Err(why) => {
            tracing::warn!("{why}; no NVTX ranges");
            return off(format!("off ({why})"));
        }
    };
    match attach(&path) {
        Ok(api) => {
            let how = match api {
                Api::Domain(_) => "domain \"mcast\"",
                Api::Core => "default domain",
            };
            tracing::info!("NVTX ranges on ({INJECTION_ENV}={path}, {how})");
            Loaded { api: Some(api), status: format!("on ({INJECTION_ENV}={path}, {how})") }
        }
        Err(why) => {
            let why = format!("{INJECTION_ENV}={path}: {why}");
            tracing::warn!("{why}; no NVTX ranges");
            off(format!("off ({why})"))
        }
    }
}

/// Loads the injection library at `path` and lets it fill the tables.
fn attach(path: &str) -> Result<Api, String> {
    let cpath = CString::new(path).map_err(|_| "the path holds a NUL byte".to_string())?;
    tables();
    // SAFETY: dlopen of the library a tool named, as NVTX itself does (RTLD_LAZY); dlerror is
    // read at once on this thread; the handle is kept open for the process's life on success.
    unsafe {
        let handle = libc::dlopen(cpath.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if handle.is_null() {
            return Err(format!("cannot be loaded: {}", crate::dynlib::dlerror_text()));
        }
        let init = libc::dlsym(handle, c"InitializeInjectionNvtx2".as_ptr());
        if init.is_null() {
            libc::dlclose(handle);
            return Err("has no InitializeInjectionNvtx2: not an NVTX injection library".into());
        }
        let init: InitializeInjection = std::mem::transmute::<*mut c_void, InitializeInjection>(init);
        if init(get_export_table) == 0 {
            libc::dlclose(handle);
            return Err("its InitializeInjectionNvtx2 returned 0 (failed)".into());
        }
        let (create, push_ex, pop_d) = (
            slot(MODULE_CORE2, CORE2_DOMAIN_CREATE_A),
            slot(MODULE_CORE2, CORE2_DOMAIN_RANGE_PUSH_EX),
            slot(MODULE_CORE2, CORE2_DOMAIN_RANGE_POP),
        );
        if create != 0 && push_ex != 0 && pop_d != 0 {
            let create = std::mem::transmute::<usize, DomainCreateA>(create);
            return Ok(Api::Domain(create(DOMAIN.as_ptr()) as usize));
        }
        if slot(MODULE_CORE, CORE_RANGE_PUSH_A) != 0 && slot(MODULE_CORE, CORE_RANGE_POP) != 0 {
            return Ok(Api::Core);
        }
        // The tool stays loaded: it initialised and may hold state of this process.
        Err("the tool records no ranges (it gave neither nvtxDomainRangePushEx nor nvtxRangePushA)".into())
    }
}

fn push(api: &Api, name: *const c_char) {
    match *api {
        Api::Domain(domain) => {
            let f = slot(MODULE_CORE2, CORE2_DOMAIN_RANGE_PUSH_EX);
            if f != 0 {
                let attributes = EventAttributes {
                    version: NVTX_VERSION,
                    size: std::mem::size_of::<EventAttributes>() as u16,
                    category: 0,
                    color_type: 0,
                    color: 0,
                    payload_type: 0,
                    reserved0: 0,
                    payload: 0,
                    message_type: MESSAGE_TYPE_ASCII,
                    message: name,
                };
                // SAFETY: the tool's nvtxDomainRangePushEx, with its domain and valid attributes.
                unsafe { std::mem::transmute::<usize, DomainRangePushEx>(f)(domain as *mut c_void, &attributes) };
            }
        }
        Api::Core => {
            let f = slot(MODULE_CORE, CORE_RANGE_PUSH_A);
            if f != 0 {
                // SAFETY: the tool's nvtxRangePushA with a NUL-terminated name.
                unsafe { std::mem::transmute::<usize, RangePushA>(f)(name) };
            }
        }
    }
}

fn pop(api: &Api) {
    match *api {
        Api::Domain(domain) => {
            let f = slot(MODULE_CORE2, CORE2_DOMAIN_RANGE_POP);
            if f != 0 {
                // SAFETY: the tool's nvtxDomainRangePop with its domain.
                unsafe { std::mem::transmute::<usize, DomainRangePop>(f)(domain as *mut c_void) };
            }
        }
        Api::Core => {
            let f = slot(MODULE_CORE, CORE_RANGE_POP);
            if f != 0 {
                // SAFETY: the tool's nvtxRangePop.
                unsafe { std::mem::transmute::<usize, RangePop>(f)() };
            }
        }
    }
}

// ---- Names ----

/// Writes the name of a collective's range: `func bytes=B [dtype=D op=O] [root=R] team=0xT
/// rank=K`; `count` is in elements of `dtype` where one is given, else in bytes. Values the call
/// will refuse are shown as given.
pub fn collective_name(
    w: &mut dyn fmt::Write,
    func: &str,
    team: Option<u64>,
    rank: i32,
    count: usize,
    reduction: Option<(u32, u32)>,
    root: Option<i32>,
) -> fmt::Result {
    w.write_str(func)?;
    match reduction {
        Some((dtype, op)) => {
            match DType::from_raw(dtype) {
                Some(d) => write!(w, " bytes={} dtype={}", count.saturating_mul(d.size()), d.name())?,
                None => write!(w, " count={count} dtype={dtype}?")?,
            }
            match RedOp::from_raw(op) {
                Some(o) => write!(w, " op={}", o.name())?,
                None => write!(w, " op={op}?")?,
            }
        }
        None => write!(w, " bytes={count}")?,
    }
    if let Some(r) = root {
        write!(w, " root={r}")?;
    }
    match team {
        Some(t) => write!(w, " team={t:#x}")?,
        None => w.write_str(" team=?")?,
    }
    write!(w, " rank={rank}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(
        func: &str,
        team: Option<u64>,
        rank: i32,
        count: usize,
        red: Option<(u32, u32)>,
        root: Option<i32>,
    ) -> String {
        let mut s = String::new();
        collective_name(&mut s, func, team, rank, count, red, root).unwrap();
        s
    }

    #[test]
    fn collective_names_carry_the_op_bytes_dtype_team_and_rank() {
        assert_eq!(
            name("mcast_all_reduce", Some(0x2000001), 1, 1024, Some((0, 0)), None),
            "mcast_all_reduce bytes=4096 dtype=f32 op=sum team=0x2000001 rank=1"
        );
        assert_eq!(
            name("mcast_broadcast", Some(0x20), 0, 100, None, Some(3)),
            "mcast_broadcast bytes=100 root=3 team=0x20 rank=0"
        );
        assert_eq!(
            name("mcast_team_all_reduce", None, 2, 7, Some((99, 42)), None),
            "mcast_team_all_reduce count=7 dtype=99? op=42? team=? rank=2"
        );
    }

    #[test]
    fn the_tables_are_nvtx_shaped() {
        // Every defined module: 1 and its size; NULL at both ends, the slots between.
        for (m, &size) in MODULE_SIZES.iter().enumerate() {
            let (mut table, mut n): (*const *const AtomicUsize, u32) = (std::ptr::null(), 0);
            // SAFETY: valid out-pointers.
            let found = unsafe { get_module_function_table(m as c_int, &mut table, &mut n) };
            if m == 0 {
                assert_eq!(found, 0);
                continue;
            }
            assert_eq!((found, n as usize), (1, size), "module {m}");
            // SAFETY: the table has size + 1 entries.
            let entries = unsafe { std::slice::from_raw_parts(table, size + 1) };
            assert!(entries[0].is_null() && entries[size].is_null());
            for (id, &e) in entries.iter().enumerate().take(size).skip(1) {
                assert!(std::ptr::eq(e, &SLOTS[m][id]), "module {m} slot {id}");
            }
        }
        // SAFETY: valid out-pointers; an unknown module is refused.
        assert_eq!(unsafe { get_module_function_table(7, std::ptr::null_mut(), std::ptr::null_mut()) }, 0);
        // SAFETY: the export tables are statics.
        unsafe {
            assert!(!get_export_table(ETID_CALLBACKS).is_null());
            assert!(!get_export_table(ETID_VERSIONINFO).is_null());
            assert!(get_export_table(2).is_null());
        }
    }
}
