//! Simulator tests: one per documented rule (the doc comment quotes the sentence of
//! `shared/reference/cuda-multicast-driver-api.md`, or of `shared/DESIGN.md` where the reference
//! is silent), plus blocking, watchdog, budgets, faults, multimem translation, workers and ledger.

mod exec;
mod faults;
mod identity;
mod ledger;
mod memory;
mod multicast;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::driver::{
    AllocationProps, CaptureMode, CopyOps, DeviceOps, DevicePtr, ExecOps, FabricInfo, FabricState, Granularity,
    HandleTypes, LaunchConfig, MemHandle, MemoryOps, MulticastOps, MulticastProp, Stream, FABRIC_HANDLE_BYTES,
};

const G: usize = 2 * MIB;
const IV: CuResult = CuResult::ERROR_INVALID_VALUE;
const ID: CuResult = CuResult::ERROR_INVALID_DEVICE;

fn config() -> SimConfig {
    SimConfig { device_memory: 64 * MIB as u64, watchdog: Duration::from_secs(5), ..SimConfig::default() }
}

fn sim() -> SimDriver {
    SimDriver::new(config())
}

fn code<T: std::fmt::Debug>(r: DResult<T>) -> CuResult {
    r.expect_err("expected a failure").code
}

fn prop(n: u32, size: usize, handle_types: HandleTypes) -> MulticastProp {
    MulticastProp { num_devices: n, size, handle_types, flags: 0 }
}

/// A multicast object for devices `0..n`, all added.
fn team(s: &SimDriver, n: u32, size: usize, types: HandleTypes) -> MemHandle {
    let mc = s.multicast_create(&prop(n, size, types)).unwrap();
    for d in 0..n as i32 {
        s.multicast_add_device(mc, d).unwrap();
    }
    mc
}

/// An allocation on `dev` mapped read-write for `dev`: (handle, address).
fn mapped(s: &SimDriver, dev: Device, size: usize, types: HandleTypes) -> (MemHandle, DevicePtr) {
    let h = s.mem_create(dev, size, types).unwrap();
    let p = s.mem_address_reserve(size, 0).unwrap();
    s.mem_map(p, size, 0, h).unwrap();
    s.mem_set_access(p, size, &[dev]).unwrap();
    (h, p)
}

fn unmapped_free(s: &SimDriver, h: MemHandle, p: DevicePtr, size: usize) {
    s.mem_unmap(p, size).unwrap();
    s.mem_address_free(p, size).unwrap();
    s.mem_release(h).unwrap();
}

// ---- devices ----

#[test]
fn devices_and_invalid_ordinals() {
    let s = sim();
    assert_eq!(s.device_count().unwrap(), 4);
    assert_eq!(s.driver_version().unwrap(), 13000);
    let p = s.device_props(3).unwrap();
    assert_eq!((p.name.as_str(), p.cc_major, p.cc_minor, p.sm_count), ("mcast simulated GPU", 9, 0, 132));
    assert_eq!(p.total_memory, 64 * MIB as u64);
    assert!(p.multicast_supported && p.vmm_supported && p.posix_fd_supported && p.fabric_supported);
    assert_eq!(code(s.device_props(4)), ID);
    assert_eq!(code(s.device_props(-1)), ID);
    assert!(s.can_access_peer(0, 3).unwrap());
    assert_eq!(code(s.can_access_peer(0, 9)), ID);
    assert_eq!(code(s.mem_create(7, G, HandleTypes::NONE)), ID);
    assert!(s.has_multicast_api() && s.has_multicast_bind_v2());
    assert_eq!(s.backend_name(), "sim");
    assert!(s.as_sim().is_some());
}
