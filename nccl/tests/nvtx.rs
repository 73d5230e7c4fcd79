//! `libmcast_nccl`'s calls as NVTX ranges: a child process of this binary runs an NCCL program
//! on the simulator with the stand-in NVTX tool of mcast's tests (`tests/nvtx/fake_tool.c`) in
//! `NVTX_INJECTION64_PATH`; each NCCL call is a range named by its function, and the mcast call
//! that serves a collective is a range inside it, with its bytes, dtype, op, team and rank.

use std::ffi::{c_void, CStr};
use std::path::PathBuf;
use std::process::Command;
use std::ptr::null_mut;

use mcast_nccl::api::*;
use mcast_nccl::types::{self, ncclUniqueId};

const CHILD: &str = "MCAST_TEST_NCCL_NVTX_CHILD";
const NCCL_FLOAT: types::ncclDataType_t = 7;
const NCCL_SUM: types::ncclRedOp_t = 0;

fn last_error() -> String {
    // SAFETY: never NULL, NUL-terminated.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }.to_string_lossy().into_owned()
}

#[test]
fn each_nccl_call_is_a_range_around_the_mcast_call_that_serves_it() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("nccl-nvtx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (lib, log) = (dir.join("libfake_nvtx_tool.so"), dir.join("tool.log"));
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&lib)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/nvtx/fake_tool.c"))
        .output()
        .expect("cc (a C compiler) runs");
    assert!(out.status.success(), "cc failed: {}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("NVTX_INJECTION64_PATH", &lib)
        .env("FAKE_NVTX_LOG", &log)
        .env("MCAST_BACKEND", "sim")
        .env("MCAST_MULTICAST", "off")
        .env_remove("MCAST_NVTX")
        .env_remove("FAKE_NVTX_MODE")
        .env_remove("MCAST_NCCL_FALLBACK")
        .env_remove("MCAST_BOOTSTRAP_ADDR")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{:?}\n{text}", out.status);
    let log = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    let at = |l: &str| lines.iter().position(|x| *x == l).unwrap_or_else(|| panic!("no {l:?} in:\n{log}"));
    at("push mcast ncclGetUniqueId");
    at("push mcast ncclCommInitRank");
    at("push mcast ncclCommDestroy");
    let outer = at("push mcast ncclAllReduce");
    let inner =
        lines.iter().position(|l| l.starts_with("push mcast mcast_team_all_reduce bytes=16 dtype=f32 op=sum team=0x"));
    let inner = inner.unwrap_or_else(|| panic!("no served all-reduce in:\n{log}"));
    assert!(lines[inner].ends_with(" rank=0"), "{}", lines[inner]);
    // Nested: the mcast range opens after the NCCL one and closes before it.
    assert!(inner > outer && lines[inner + 1] == "pop mcast" && lines[inner + 2] == "pop mcast", "{log}");
    assert_eq!(log.matches("push ").count(), log.matches("pop ").count(), "{log}");
}

#[test]
fn child() {
    if std::env::var(CHILD).is_err() {
        return;
    }
    let mut id = ncclUniqueId { internal: [0; types::UNIQUE_ID_BYTES] };
    assert_eq!(ncclGetUniqueId(&mut id), types::SUCCESS, "{}", last_error());
    let mut comm = null_mut();
    assert_eq!(ncclCommInitRank(&mut comm, 1, id, 0), types::SUCCESS, "{}", last_error());
    let mut buf: *mut c_void = null_mut();
    assert_eq!(ncclMemAlloc(&mut buf, 1024), types::SUCCESS, "{}", last_error());
    assert_eq!(ncclAllReduce(buf, buf, 4, NCCL_FLOAT, NCCL_SUM, comm, null_mut()), types::SUCCESS, "{}", last_error());
    assert_eq!(ncclMemFree(buf), types::SUCCESS, "{}", last_error());
    assert_eq!(ncclCommDestroy(comm), types::SUCCESS, "{}", last_error());
}
