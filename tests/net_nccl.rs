//! The NCCL engine between NVLink domains (`runtime::net::nccl`) without a GPU: which library it
//! loads and why it refuses one, the version check, and a rail communicator over a stub NCCL
//! compiled here (what reaches NCCL, and how NCCL's errors come back). The real NCCL of the PyPI
//! wheel (`nvidia-nccl-cu13`, which scripts/test installs) is loaded and version-checked when it
//! is there; the test says why it skips otherwise.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use mcast::driver::Stream;
use mcast::dynlib::Library;
use mcast::kernels::{DType, RedOp};
use mcast::runtime::error::{ErrorKind, Result};
use mcast::runtime::net::nccl::{self, MAX_CTAS};
use mcast::runtime::net::{Engine, RailOob};

/// A stub with NCCL's functions: version `STUB_VERSION`, a one-rank communicator, collectives
/// that record their dtype and op, and switches for failures (`stubSet`).
const STUB: &str = r#"
#include <stddef.h>
#include <string.h>
typedef struct { char internal[128]; } uid;
struct cfg { size_t size; unsigned magic, version; int blocking, cga, min_ctas, max_ctas; const char *net; };
static int live, fail, async_state, max_ctas = -1, last_dtype = -1, last_op = -1;
static char last_error[64];
void stubSet(int f, int a) { fail = f; async_state = a; }
void stubSeen(int *l, int *m, int *d, int *o) { *l = live; *m = max_ctas; *d = last_dtype; *o = last_op; }
int ncclGetVersion(int *v) { *v = STUB_VERSION; return 0; }
int ncclGetUniqueId(uid *id) { memset(id->internal, 0x5a, sizeof id->internal); return 0; }
#ifndef STUB_NO_CONFIG
int ncclCommInitRankConfig(void **comm, int n, uid id, int rank, struct cfg *c) {
  if (id.internal[0] != 0x5a || id.internal[127] != 0x5a || n != 1 || rank != 0 || c->magic != 0xcafebeef ||
      c->version != 21700 || c->size != sizeof *c || c->blocking != 1 || c->min_ctas != 1) {
    strcpy(last_error, "stub: bad init");
    return 4;
  }
  max_ctas = c->max_ctas;
  live++;
  *comm = &live;
  return 0;
}
#endif
static int coll(void *comm, int dtype, int op) {
  if (comm != &live) return 4;
  last_dtype = dtype, last_op = op;
  if (fail) { strcpy(last_error, "stub: the wire is cut"); return 6; }
  return 0;
}
int ncclAllReduce(const void *s, void *r, size_t n, int d, int o, void *c, void *st) { (void)s, (void)r, (void)n, (void)st; return coll(c, d, o); }
int ncclReduceScatter(const void *s, void *r, size_t n, int d, int o, void *c, void *st) { (void)s, (void)r, (void)n, (void)st; return coll(c, d, o); }
int ncclAllGather(const void *s, void *r, size_t n, int d, void *c, void *st) { (void)s, (void)r, (void)n, (void)st; return coll(c, d, -1); }
int ncclBroadcast(const void *s, void *r, size_t n, int d, int root, void *c, void *st) { (void)s, (void)r, (void)n, (void)st; return coll(c, d, root); }
int ncclCommAbort(void *c) { if (c != &live) return 4; live--; return 0; }
int ncclCommDestroy(void *c) { if (c != &live) return 4; live--; return 0; }
int ncclCommGetAsyncError(void *c, int *st) { if (c != &live) return 4; *st = async_state; return 0; }
const char *ncclGetErrorString(int r) { return r == 6 ? "remote process exited or there was a network error" : "stub error"; }
const char *ncclGetLastError(void *c) { (void)c; return last_error; }
"#;

/// The stub built with `-D` flags `defines` at a path of its own (the engine caches by path).
fn stub(name: &str, defines: &[&str]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("net_nccl");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{name}.c"));
    let lib = dir.join(format!("lib{name}.so"));
    std::fs::write(&src, STUB).unwrap();
    let mut cc = Command::new("cc");
    cc.args(["-shared", "-fPIC", "-Wall", "-Werror", "-o"]).arg(&lib).arg(&src);
    for d in defines {
        cc.arg(format!("-D{d}"));
    }
    let out = cc.output().expect("cc (a C compiler) runs");
    assert!(out.status.success(), "cc failed: {}", String::from_utf8_lossy(&out.stderr));
    lib
}

/// The one-member rail's allgather.
struct Alone;
impl RailOob for Alone {
    fn allgather(&self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        recv.copy_from_slice(send);
        Ok(())
    }
}

fn err(explicit: Option<&str>, fallback: Option<&str>) -> String {
    match nccl::load(explicit, fallback) {
        Ok(e) => panic!("{explicit:?} {fallback:?} loaded {}", e.name()),
        Err(e) => e,
    }
}

#[test]
fn a_missing_library_is_refused_naming_the_variable_the_path_and_the_reason() {
    let e = err(Some("/nonexistent/libnccl.so.2"), Some("/also/not/here/libnccl.so.2"));
    assert!(e.contains("MCAST_NET_NCCL=/nonexistent/libnccl.so.2: the library could not be loaded"), "{e}");
    assert!(e.contains("No such file"), "{e}");
    let e = err(None, Some("/also/not/here/libnccl.so.2"));
    assert!(e.contains("MCAST_NCCL_FALLBACK=/also/not/here/libnccl.so.2: the library could not be loaded"), "{e}");
    // Neither variable: libnccl.so.2 from the dynamic linker's search path, if it is there.
    match nccl::load(None, None) {
        Ok(engine) => assert!(engine.name().starts_with("nccl 2."), "{}", engine.name()),
        Err(e) => assert!(e.contains("libnccl.so.2 (MCAST_NET_NCCL and MCAST_NCCL_FALLBACK unset)"), "{e}"),
    }
}

#[test]
fn a_relative_path_or_bare_name_is_refused_even_when_the_next_choice_would_load() {
    let good = stub("stub_relative", &["STUB_VERSION=22707"]);
    for v in ["libnccl.so.2", "./libnccl.so.2", "lib/libnccl.so.2"] {
        let e = err(Some(v), Some(good.to_str().unwrap()));
        assert!(e.contains(&format!("MCAST_NET_NCCL={v}: must be an absolute path")), "{e}");
        let e = err(None, Some(v));
        assert!(e.contains(&format!("MCAST_NCCL_FALLBACK={v}: must be an absolute path")), "{e}");
    }
}

#[test]
fn an_nccl_older_than_the_minimum_is_refused_naming_its_version() {
    for (code, shown) in [("21603", "2.16.3"), ("2804", "2.8.4")] {
        let lib = stub(&format!("stub_old_{code}"), &[&format!("STUB_VERSION={code}")]);
        let e = err(Some(lib.to_str().unwrap()), None);
        assert!(e.contains(&format!("NCCL {shown} (ncclGetVersion {code}) is too old")), "{e}");
        assert!(e.contains("needs NCCL 2.17.0 or later"), "{e}");
    }
    assert_eq!(nccl::decode_version(22707), (2, 27, 7));
    assert_eq!(nccl::decode_version(2804), (2, 8, 4));
    assert_eq!(nccl::decode_version(32101), (3, 21, 1));
}

#[test]
fn a_library_without_a_needed_function_is_refused_naming_it() {
    let lib = stub("stub_noconfig", &["STUB_VERSION=22707", "STUB_NO_CONFIG"]);
    let e = err(None, Some(lib.to_str().unwrap()));
    assert!(e.contains("not an NCCL 2.17.0 or later: it has no function ncclCommInitRankConfig"), "{e}");
}

type Set = unsafe extern "C" fn(i32, i32);
type Seen = unsafe extern "C" fn(*mut i32, *mut i32, *mut i32, *mut i32);

fn seen(lib: &Library) -> (i32, i32, i32, i32) {
    // SAFETY: stubSeen's type.
    let f = unsafe { lib.function::<Seen>("stubSeen") }.unwrap();
    let (mut l, mut m, mut d, mut o) = (0, 0, 0, 0);
    // SAFETY: valid out-pointers.
    unsafe { f(&mut l, &mut m, &mut d, &mut o) };
    (l, m, d, o)
}

#[test]
fn a_rail_communicator_reaches_nccl_with_its_enums_and_brings_back_its_errors() {
    let path = stub("stub_rail", &["STUB_VERSION=22707"]);
    let engine: Arc<dyn Engine> = nccl::load(Some(path.to_str().unwrap()), None).unwrap();
    assert_eq!(engine.name(), "nccl 2.27.7");
    assert!(engine.stream_ordered());
    // Loaded once: a second load is the same engine.
    let again = nccl::load(None, Some(path.to_str().unwrap())).unwrap();
    assert!(Arc::ptr_eq(&engine, &again));
    // The copy the engine loaded, to read the stub's records.
    let lib = Library::open(path.to_str().unwrap()).unwrap();

    let comm = engine.comm_create(0, 0, 1, &Alone).unwrap();
    assert_eq!(seen(&lib), (1, MAX_CTAS, -1, -1), "one communicator, made with maxCTAs");
    let s = Stream::DEFAULT;
    comm.all_reduce(0x1000, 0x1000, 7, DType::BF16, RedOp::Min, s).unwrap();
    assert_eq!((seen(&lib).2, seen(&lib).3), (9, 3), "ncclBfloat16, ncclMin");
    comm.reduce_scatter(0x1000, 0x2000, 7, DType::F32, RedOp::Max, s).unwrap();
    assert_eq!((seen(&lib).2, seen(&lib).3), (7, 2), "ncclFloat32, ncclMax");
    comm.all_reduce(0x1000, 0x1000, 7, DType::U64, RedOp::Sum, s).unwrap();
    assert_eq!((seen(&lib).2, seen(&lib).3), (5, 0), "ncclUint64, ncclSum");
    comm.all_gather(0x1000, 0x2000, 7, DType::F16, s).unwrap();
    assert_eq!(seen(&lib).2, 6, "ncclFloat16");
    comm.broadcast(0x1000, 0x2000, 7, DType::I64, 0, s).unwrap();
    assert_eq!((seen(&lib).2, seen(&lib).3), (4, 0), "ncclInt64, root 0");

    // SAFETY: stubSet's type.
    let set = unsafe { lib.function::<Set>("stubSet") }.unwrap();
    // SAFETY: no preconditions.
    unsafe { set(1, 0) };
    let e = comm.all_gather(0x1000, 0x2000, 7, DType::I32, s).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Driver);
    assert!(e.message.contains("rail 0: ncclAllGather returned 6 (remote process exited"), "{}", e.message);
    assert!(e.message.contains("stub: the wire is cut"), "{}", e.message);
    // SAFETY: no preconditions.
    unsafe { set(0, 2) };
    let e = comm.broadcast(0x1000, 0x2000, 7, DType::I32, 0, s).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Driver);
    assert!(e.message.contains("ncclBroadcast: ncclCommGetAsyncError returned 2"), "{}", e.message);
    // SAFETY: no preconditions.
    unsafe { set(0, 0) };

    comm.abort().unwrap();
    assert_eq!(seen(&lib).0, 0, "ncclCommAbort released it");
    let e = comm.all_reduce(0x1000, 0x1000, 7, DType::F32, RedOp::Sum, s).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Aborted, "{}", e.message);
    comm.abort().unwrap();
    comm.destroy().unwrap();
    assert_eq!(seen(&lib).0, 0, "an aborted communicator is not destroyed again");

    let comm = engine.comm_create(3, 0, 1, &Alone).unwrap();
    assert_eq!(seen(&lib).0, 1);
    comm.destroy().unwrap();
    assert_eq!(seen(&lib).0, 0, "ncclCommDestroy released it");
}

/// The wheel's `libnccl.so.2`, found through python3, or why not.
fn wheel_nccl() -> std::result::Result<PathBuf, String> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))",
        ])
        .output()
        .map_err(|e| format!("python3 does not run: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the nvidia-nccl wheel is not installed ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !path.exists() {
        return Err(format!("{} does not exist", path.display()));
    }
    Ok(path)
}

#[test]
fn the_real_nccl_of_the_pypi_wheel_loads_and_passes_the_version_check() {
    let path = match wheel_nccl() {
        Ok(p) => p,
        Err(why) => {
            eprintln!("skipped: {why} (scripts/test installs nvidia-nccl-cu13)");
            return;
        }
    };
    let engine = nccl::load(Some(path.to_str().unwrap()), None).unwrap();
    let version = engine.name().strip_prefix("nccl ").expect("named nccl X.Y.Z");
    let parts: Vec<u32> = version.split('.').map(|p| p.parse().unwrap()).collect();
    assert!(parts.len() == 3 && (parts[0], parts[1]) >= (2, 17), "{version}");
    // Without a GPU, ncclGetUniqueId works and the communicator's creation fails cleanly.
    match engine.comm_create(0, 0, 1, &Alone) {
        Ok(comm) => comm.destroy().unwrap(),
        Err(e) => {
            assert_eq!(e.kind, ErrorKind::Driver, "{}", e.message);
            assert!(e.message.contains("ncclCommInitRankConfig returned"), "{}", e.message);
            assert!(e.message.contains(&format!("on nccl {version}")), "{}", e.message);
        }
    }
}
