//! What `libmcast_nccl` reads from the environment (issue 24): env mode's secret, and the
//! fallback library's path. One test, steps in order: the variables are process-wide and the
//! fallback library is read once per process.

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;

use mcast_nccl::api::*;
use mcast_nccl::types::{self, ncclUniqueId};

const NCCL_FLOAT: types::ncclDataType_t = 7;
const NCCL_PROD: types::ncclRedOp_t = 1;

fn last_error() -> String {
    // SAFETY: never NULL, NUL-terminated.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }.to_string_lossy().into_owned()
}

#[test]
fn env_mode_secret_and_a_relative_fallback_path() {
    std::env::set_var("MCAST_BACKEND", "sim");
    std::env::set_var("MCAST_MULTICAST", "off");
    // A bare library name that dlopen would find through its search path.
    std::env::set_var("MCAST_NCCL_FALLBACK", "libc.so.6");

    // Env mode without MCAST_BOOTSTRAP_SECRET: ncclGetUniqueId refuses, naming the variable.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    std::env::set_var("MCAST_BOOTSTRAP_ADDR", free.to_string());
    let mut id = ncclUniqueId { internal: [0; types::UNIQUE_ID_BYTES] };
    assert_eq!(ncclGetUniqueId(&mut id), types::INVALID_ARGUMENT);
    let e = last_error();
    assert!(e.contains("MCAST_BOOTSTRAP_SECRET") && e.contains("32 hex digits"), "{e}");
    // ncclCommInitAll's ranks are all in this process: it does not use env mode at all.
    let mut comms: [ncclComm_t; 2] = [null_mut(); 2];
    // SAFETY: room for 2 communicators; NULL devlist.
    assert_eq!(unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()) }, types::SUCCESS, "{}", last_error());
    for c in comms {
        assert_eq!(ncclCommDestroy(c), types::SUCCESS);
    }
    std::env::remove_var("MCAST_BOOTSTRAP_ADDR");

    // MCAST_NCCL_FALLBACK=libc.so.6 is not an absolute path: the init goes on without a
    // fallback, and a call mcast does not serve is ncclInvalidUsage naming the variable and
    // the rule.
    assert_eq!(ncclGetUniqueId(&mut id), types::SUCCESS, "{}", last_error());
    let mut comm = null_mut();
    assert_eq!(ncclCommInitRank(&mut comm, 1, id, 0), types::SUCCESS, "{}", last_error());
    let mut buf: *mut c_void = null_mut();
    assert_eq!(ncclMemAlloc(&mut buf, 1024), types::SUCCESS, "{}", last_error());
    let r = ncclAllReduce(buf, buf, 4, NCCL_FLOAT, NCCL_PROD, comm, null_mut());
    assert_eq!(r, types::INVALID_USAGE);
    let e = last_error();
    assert!(e.contains("MCAST_NCCL_FALLBACK=libc.so.6: must be an absolute path"), "{e}");
    assert_eq!(ncclMemFree(buf), types::SUCCESS);
    assert_eq!(ncclCommDestroy(comm), types::SUCCESS);
}
