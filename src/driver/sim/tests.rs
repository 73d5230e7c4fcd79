//! Simulator tests: one per documented rule (the doc comment quotes the sentence of
//! `shared/reference/cuda-multicast-driver-api.md`, or of `shared/DESIGN.md` where the reference
//! is silent), plus blocking, watchdog, budgets, faults, multimem translation, workers and ledger.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;

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

// ---- cuMulticastCreate ----

/// "The number of participating devices is specified by [CUmulticastObjectProp::numDevices]."
/// A team of zero devices is refused.
#[test]
fn create_needs_at_least_one_device() {
    let s = sim();
    assert_eq!(code(s.multicast_create(&prop(0, G, HandleTypes::NONE))), IV);
    let mc = s.multicast_create(&prop(1, G, HandleTypes::NONE)).unwrap();
    s.mem_release(mc).unwrap();
}

/// "This size must be a multiple of the value returned by [cuMulticastGetGranularity] with the
/// flag [CU_MULTICAST_GRANULARITY_MINIMUM]."
#[test]
fn create_size_multiple_of_minimum_granularity() {
    let s = sim();
    assert_eq!(code(s.multicast_create(&prop(2, G + 4096, HandleTypes::NONE))), IV);
    assert_eq!(code(s.multicast_create(&prop(2, 0, HandleTypes::NONE))), IV);
    let mc = s.multicast_create(&prop(2, 3 * G, HandleTypes::NONE)).unwrap();
    s.mem_release(mc).unwrap();
}

/// DESIGN.md: "`cuMulticastCreate`: ... `flags == 0`." (`CUmulticastObjectProp::flags` is
/// reserved.)
#[test]
fn create_flags_must_be_zero() {
    let s = sim();
    let p = MulticastProp { flags: 1, ..prop(2, G, HandleTypes::NONE) };
    assert_eq!(code(s.multicast_create(&p)), IV);
}

/// "Support for multicast on a specific device can be queried using the device attribute
/// [CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED]": without it, CUDA_ERROR_NOT_SUPPORTED.
#[test]
fn create_refused_without_multicast_support() {
    let s = SimDriver::new(SimConfig { multicast_supported: false, ..config() });
    assert!(!s.device_props(0).unwrap().multicast_supported);
    let p = prop(2, G, HandleTypes::NONE);
    assert_eq!(code(s.multicast_create(&p)), CuResult::ERROR_NOT_SUPPORTED);
    assert_eq!(code(s.multicast_granularity(&p, Granularity::Minimum)), CuResult::ERROR_NOT_SUPPORTED);
}

/// DESIGN.md: "Out of multicast slots: `CUDA_ERROR_OUT_OF_MEMORY`." (cuMulticastCreate
/// "Returns ... CUDA_ERROR_OUT_OF_MEMORY".) Releasing one frees its slot.
#[test]
fn create_out_of_slots_is_out_of_memory() {
    let s = SimDriver::new(SimConfig { multicast_slots: 3, ..config() });
    let p = prop(2, G, HandleTypes::NONE);
    let mcs: Vec<_> = (0..3).map(|_| s.multicast_create(&p).unwrap()).collect();
    assert_eq!(code(s.multicast_create(&p)), CuResult::ERROR_OUT_OF_MEMORY);
    s.mem_release(mcs[1]).unwrap();
    let again = s.multicast_create(&p).unwrap();
    for mc in [mcs[0], mcs[2], again] {
        s.mem_release(mc).unwrap();
    }
    assert!(s.ledger().is_empty(), "{}", s.ledger());
}

// ---- cuMulticastGetGranularity ----

/// "Calculates either the minimal or recommended granularity for a given set of multicast object
/// properties and returns it in granularity."
#[test]
fn granularity_minimum_and_recommended() {
    let s = sim();
    let p = prop(2, G, HandleTypes::NONE);
    assert_eq!(s.multicast_granularity(&p, Granularity::Minimum).unwrap(), 2 * MIB);
    assert_eq!(s.multicast_granularity(&p, Granularity::Recommended).unwrap(), 512 * MIB);
    assert_eq!(code(s.multicast_granularity(&prop(0, G, HandleTypes::NONE), Granularity::Minimum)), IV);
    let s = SimDriver::new(SimConfig { multicast_granularity_min: 4 * MIB, ..config() });
    assert_eq!(s.multicast_granularity(&p, Granularity::Minimum).unwrap(), 4 * MIB);
    assert_eq!(s.mem_granularity(0, Granularity::Recommended, HandleTypes::NONE).unwrap(), 2 * MIB);
}

// ---- cuMulticastAddDevice ----

/// "`dev` Device that will be associated to the multicast object." — an invalid ordinal gives
/// CUDA_ERROR_INVALID_DEVICE.
#[test]
fn add_device_invalid_device() {
    let s = sim();
    let mc = s.multicast_create(&prop(2, G, HandleTypes::NONE)).unwrap();
    assert_eq!(code(s.multicast_add_device(mc, 4)), ID);
    assert_eq!(code(s.multicast_add_device(mc, -1)), ID);
    assert_eq!(code(s.multicast_add_device(MemHandle(12345), 0)), IV);
    s.mem_release(mc).unwrap();
}

/// "The added device will be a part of the multicast team of size specified by
/// [CUmulticastObjectProp::numDevices] during [cuMulticastCreate]." — no more than numDevices.
#[test]
fn add_device_no_more_than_num_devices() {
    let s = sim();
    let mc = team(&s, 2, G, HandleTypes::NONE);
    assert_eq!(code(s.multicast_add_device(mc, 2)), IV);
    s.mem_release(mc).unwrap();
}

/// "The association of the device to the multicast object is permanent during the life time of
/// the multicast object." — adding it again is refused.
#[test]
fn add_device_twice_is_refused() {
    let s = sim();
    let mc = s.multicast_create(&prop(3, G, HandleTypes::NONE)).unwrap();
    s.multicast_add_device(mc, 1).unwrap();
    assert_eq!(code(s.multicast_add_device(mc, 1)), IV);
    s.mem_release(mc).unwrap();
}

// ---- binds ----

/// "`flags` Flags for future use, must be zero for now." (all four binds)
#[test]
fn bind_flags_must_be_zero() {
    let s = sim();
    let mc = team(&s, 2, 2 * G, HandleTypes::NONE);
    let (h, p) = mapped(&s, 0, G, HandleTypes::NONE);
    assert_eq!(code(s.multicast_bind_mem(mc, 0, h, 0, G, 1)), IV);
    assert_eq!(code(s.multicast_bind_mem_v2(mc, 0, 0, h, 0, G, 1)), IV);
    assert_eq!(code(s.multicast_bind_addr(mc, 0, p, G, 1)), IV);
    assert_eq!(code(s.multicast_bind_addr_v2(mc, 0, 0, p, G, 1)), IV);
    assert_eq!(s.ledger().bindings, 0);
    s.multicast_bind_mem(mc, 0, h, 0, G, 0).unwrap();
    assert_eq!(s.ledger().bindings, 1);
}

/// "The intended `size` of the bind, the offset in the multicast range `mcOffset` as well as the
/// offset in the memory `memOffset` must be a multiple of the value returned by
/// [cuMulticastGetGranularity] with the flag [CU_MULTICAST_GRANULARITY_MINIMUM]."
#[test]
fn bind_mem_offsets_and_size_multiple_of_minimum() {
    let s = SimDriver::new(SimConfig { multicast_granularity_min: 4 * MIB, ..config() });
    let m = 4 * MIB;
    let mc = team(&s, 2, 2 * m, HandleTypes::NONE);
    let h = s.mem_create(0, 2 * m, HandleTypes::NONE).unwrap();
    assert_eq!(code(s.multicast_bind_mem(mc, 0, h, 0, G, 0)), IV, "size");
    assert_eq!(code(s.multicast_bind_mem(mc, G, h, 0, m, 0)), IV, "mcOffset");
    assert_eq!(code(s.multicast_bind_mem(mc, 0, h, G, m, 0)), IV, "memOffset");
    assert_eq!(code(s.multicast_bind_mem_v2(mc, 0, 0, h, G, m, 0)), IV, "memOffset v2");
    s.multicast_bind_mem(mc, m, h, m, m, 0).unwrap();
}

/// "The intended `size` of the bind, the offset in the multicast range `mcOffset` and `memptr`
/// must be a multiple of the value returned by [cuMulticastGetGranularity] with the flag
/// [CU_MULTICAST_GRANULARITY_MINIMUM]."
#[test]
fn bind_addr_memptr_multiple_of_minimum() {
    let s = SimDriver::new(SimConfig { multicast_granularity_min: 4 * MIB, ..config() });
    let m = 4 * MIB;
    let mc = team(&s, 2, 2 * m, HandleTypes::NONE);
    let h = s.mem_create(0, 2 * m, HandleTypes::NONE).unwrap();
    let p = s.mem_address_reserve(2 * m, m).unwrap();
    assert_eq!(p % m as u64, 0);
    s.mem_map(p, 2 * m, 0, h).unwrap();
    assert_eq!(code(s.multicast_bind_addr(mc, 0, p + G as u64, m, 0)), IV, "memptr");
    assert_eq!(code(s.multicast_bind_addr_v2(mc, 0, 0, p + G as u64, m, 0)), IV, "memptr v2");
    assert_eq!(code(s.multicast_bind_addr(mc, G, p, m, 0)), IV, "mcOffset");
    s.multicast_bind_addr(mc, 0, p, m, 0).unwrap();
}

/// "The `size` + `memOffset` cannot be larger than the size of the allocated memory."
#[test]
fn bind_mem_within_allocation() {
    let s = sim();
    let mc = team(&s, 2, 4 * G, HandleTypes::NONE);
    let h = s.mem_create(0, 2 * G, HandleTypes::NONE).unwrap();
    assert_eq!(code(s.multicast_bind_mem(mc, 0, h, G, 2 * G, 0)), IV);
    assert_eq!(code(s.multicast_bind_mem(mc, 0, h, 0, 3 * G, 0)), IV);
    assert_eq!(code(s.multicast_bind_mem(mc, 0, h, usize::MAX - G + 1, G, 0)), IV, "overflow");
    s.multicast_bind_mem(mc, 0, h, G, G, 0).unwrap();
}

/// "Similarly the `size` + `mcOffset` cannot be larger than the size of the multicast object."
#[test]
fn bind_within_multicast_object() {
    let s = sim();
    let mc = team(&s, 2, 2 * G, HandleTypes::NONE);
    let (h, p) = mapped(&s, 0, 2 * G, HandleTypes::NONE);
    assert_eq!(code(s.multicast_bind_mem(mc, G, h, 0, 2 * G, 0)), IV);
    assert_eq!(code(s.multicast_bind_addr(mc, 2 * G, p, G, 0)), IV);
    s.multicast_bind_mem(mc, G, h, 0, G, 0).unwrap();
}

/// "The memory allocation must have beeen created on one of the devices that was added to the
/// multicast team via [cuMulticastAddDevice]." — else CUDA_ERROR_INVALID_DEVICE.
#[test]
fn bind_memory_on_team_device() {
    let s = sim();
    let mc = team(&s, 2, G, HandleTypes::NONE); // devices 0 and 1
    let (h, p) = mapped(&s, 2, G, HandleTypes::NONE);
    assert_eq!(code(s.multicast_bind_mem(mc, 0, h, 0, G, 0)), ID);
    assert_eq!(code(s.multicast_bind_addr(mc, 0, p, G, 0)), ID);
    let h1 = s.mem_create(1, G, HandleTypes::NONE).unwrap();
    s.multicast_bind_mem(mc, 0, h1, 0, G, 0).unwrap();
}

/// "For device memory, i.e., type [CU_MEM_LOCATION_TYPE_DEVICE], the memory allocation must have
/// been created on the device specified by `dev`. ... In both cases, the device named by `dev`
/// must have been added to the multicast team via [cuMulticastAddDevice]."
#[test]
fn bind_v2_memory_on_dev_and_dev_added() {
    let s = sim();
    let mc = team(&s, 2, G, HandleTypes::NONE); // devices 0 and 1
    let (h0, p0) = mapped(&s, 0, G, HandleTypes::NONE);
    assert_eq!(code(s.multicast_bind_mem_v2(mc, 1, 0, h0, 0, G, 0)), ID, "memory on another device");
    assert_eq!(code(s.multicast_bind_addr_v2(mc, 1, 0, p0, G, 0)), ID, "memory on another device");
    let (h2, p2) = mapped(&s, 2, G, HandleTypes::NONE);
    assert_eq!(code(s.multicast_bind_mem_v2(mc, 2, 0, h2, 0, G, 0)), ID, "dev not added");
    assert_eq!(code(s.multicast_bind_addr_v2(mc, 2, 0, p2, G, 0)), ID, "dev not added");
    assert_eq!(code(s.multicast_bind_mem_v2(mc, 9, 0, h0, 0, G, 0)), ID, "no such device");
    s.multicast_bind_mem_v2(mc, 0, 0, h0, 0, G, 0).unwrap();
    let (_h1, p1) = mapped(&s, 1, G, HandleTypes::NONE);
    s.multicast_bind_addr_v2(mc, 1, 0, p1, G, 0).unwrap();
    assert_eq!(s.ledger().bindings, 2);
}

/// "Externally shareable as well as imported multicast objects can be bound only to externally
/// shareable memory."
#[test]
fn shareable_objects_bind_only_shareable_memory() {
    let s = sim();
    let mc = team(&s, 2, 2 * G, HandleTypes::POSIX_FD);
    let (plain, plain_ptr) = mapped(&s, 0, G, HandleTypes::NONE);
    assert_eq!(code(s.multicast_bind_mem(mc, 0, plain, 0, G, 0)), IV);
    assert_eq!(code(s.multicast_bind_addr(mc, 0, plain_ptr, G, 0)), IV);
    let shared = s.mem_create(0, G, HandleTypes::POSIX_FD).unwrap();
    s.multicast_bind_mem(mc, 0, shared, 0, G, 0).unwrap();
    let fd = s.mem_export_fd(shared).unwrap();
    let imported = s.mem_import_fd(std::os::fd::AsRawFd::as_raw_fd(&fd)).unwrap();
    s.multicast_bind_mem(mc, G, imported, 0, G, 0).unwrap();
    // A non-shareable object takes either kind.
    let mc2 = team(&s, 2, G, HandleTypes::NONE);
    s.multicast_bind_mem(mc2, 0, plain, 0, G, 0).unwrap();
}

/// "The memory must have been allocated via [cuMemCreate] or [cudaMallocAsync]." — BindAddr needs
/// an address in a mapped cuMemCreate allocation; "The `size` cannot be larger than the size of
/// the allocated memory."
#[test]
fn bind_addr_needs_mapped_allocation() {
    let s = sim();
    let mc = team(&s, 2, 4 * G, HandleTypes::NONE);
    let host = [0u8; 16];
    assert_eq!(code(s.multicast_bind_addr(mc, 0, host.as_ptr() as u64, G, 0)), IV, "host memory");
    let bare = s.mem_address_reserve(2 * G, 0).unwrap();
    assert_eq!(code(s.multicast_bind_addr(mc, 0, bare, G, 0)), IV, "reserved, not mapped");
    let (_h, p) = mapped(&s, 0, 2 * G, HandleTypes::NONE);
    assert_eq!(code(s.multicast_bind_addr(mc, 0, p, 3 * G, 0)), IV, "larger than the allocation");
    assert_eq!(code(s.multicast_bind_addr(mc, 0, p + G as u64, 2 * G, 0)), IV, "past its end");
    s.multicast_bind_addr(mc, 0, p + G as u64, G, 0).unwrap();
}

/// "The memory must have been allocated via [cuMemCreate] or [cudaMallocAsync]." — plain
/// `cuMemAlloc` memory (what `cudaMalloc` returns) is refused by BindAddr, and has no allocation
/// handle to retain; it is still device memory of its device, charged to its budget and counted
/// by the ledger until `cuMemFree`.
#[test]
fn bind_addr_refuses_cuda_malloc_memory() {
    let s = sim();
    let mc = team(&s, 2, 4 * G, HandleTypes::NONE);
    let plain = s.mem_alloc(1, 2 * G).unwrap();
    assert_eq!(plain % 256, 0);
    assert_eq!(code(s.multicast_bind_addr(mc, 0, plain, G, 0)), IV);
    assert_eq!(code(s.multicast_bind_addr_v2(mc, 1, 0, plain, G, 0)), IV);
    assert_eq!(code(s.mem_retain_allocation_handle(plain)), IV);
    assert_eq!(s.pointer_device(plain + 5).unwrap(), 1);
    assert_eq!(s.mem_address_range(plain + 5).unwrap(), (plain, 2 * G));
    s.memcpy_htod(1, plain + 8, &[1, 2, 3]).unwrap();
    let mut back = [0u8; 3];
    s.memcpy_dtoh(1, &mut back, plain + 8).unwrap();
    assert_eq!(back, [1, 2, 3]);
    assert_eq!(code(s.memcpy_htod(0, plain, &[1])), IV, "another device's memory");
    assert_eq!(s.ledger().allocation_bytes[1], 2 * G as u64);
    assert_eq!(code(s.mem_alloc(1, 64 * MIB)), CuResult::ERROR_OUT_OF_MEMORY, "the device budget");
    assert_eq!(code(s.mem_free(1, plain + 8)), IV, "not the start");
    s.mem_free(1, plain).unwrap();
    assert_eq!(code(s.mem_free(1, plain)), IV, "freed twice");
    assert_eq!(code(s.pointer_device(plain)), IV);
    s.mem_release(mc).unwrap();
    assert!(s.ledger().is_empty(), "{}", s.ledger());
}

/// `cuMemRetainAllocationHandle`, `cuMemGetAllocationPropertiesFromHandle`,
/// `cuMemGetAddressRange`, `cuPointerGetAttribute` on a mapped cuMemCreate allocation: the
/// retained handle names the same memory (it binds, and keeps the memory alive after the
/// creator's handle is released) and must itself be released.
#[test]
fn retained_allocation_handles() {
    let s = sim();
    let (h, p) = mapped(&s, 2, 2 * G, HandleTypes::POSIX_FD);
    let r = s.mem_retain_allocation_handle(p + G as u64 + 3).unwrap();
    assert_ne!(r, h);
    assert_eq!(s.mem_allocation_props(r).unwrap(), AllocationProps { dev: 2, handle_types: HandleTypes::POSIX_FD });
    assert_eq!(s.mem_address_range(p + 7).unwrap(), (p, 2 * G));
    assert_eq!(s.pointer_device(p + 7).unwrap(), 2);
    let host = [0u8; 4];
    assert_eq!(code(s.pointer_device(host.as_ptr() as u64)), IV, "host memory");
    // The retained handle binds like the original (shareable memory, shareable object).
    let mc = team(&s, 3, 2 * G, HandleTypes::POSIX_FD);
    s.multicast_bind_mem(mc, 0, r, 0, G, 0).unwrap();
    s.multicast_unbind(mc, 2, 0, G).unwrap();
    s.mem_release(mc).unwrap();
    unmapped_free(&s, h, p, 2 * G);
    assert_eq!(s.ledger().allocations[2], 1, "the retained handle keeps the memory");
    s.mem_release(r).unwrap();
    assert!(s.ledger().is_empty(), "{}", s.ledger());
}

/// Simulator rule (brief): a second bind overlapping an existing binding of the same device is
/// refused; other devices may bind the same range.
#[test]
fn bind_overlapping_same_device_refused() {
    let s = sim();
    let mc = team(&s, 2, 4 * G, HandleTypes::NONE);
    let h0 = s.mem_create(0, 4 * G, HandleTypes::NONE).unwrap();
    let h1 = s.mem_create(1, 4 * G, HandleTypes::NONE).unwrap();
    s.multicast_bind_mem(mc, 0, h0, 0, 2 * G, 0).unwrap();
    assert_eq!(code(s.multicast_bind_mem(mc, G, h0, 2 * G, 2 * G, 0)), IV);
    s.multicast_bind_mem(mc, 0, h1, 0, 2 * G, 0).unwrap();
    s.multicast_bind_mem(mc, 2 * G, h0, 2 * G, 2 * G, 0).unwrap();
    assert_eq!(s.ledger().bindings, 3);
}

/// "Any calls to [cuMulticastBindMem], [cuMulticastBindMem_v2], [cuMulticastBindAddr], or
/// [cuMulticastBindAddr_v2] will block until all devices have been added."
#[test]
fn bind_blocks_until_all_devices_added() {
    let s = sim();
    let mc = s.multicast_create(&prop(2, G, HandleTypes::NONE)).unwrap();
    s.multicast_add_device(mc, 0).unwrap();
    let h = s.mem_create(0, G, HandleTypes::NONE).unwrap();
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let binder = scope.spawn(|| {
            let r = s.multicast_bind_mem(mc, 0, h, 0, G, 0);
            done.store(true, Ordering::SeqCst);
            r
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(!done.load(Ordering::SeqCst), "bind returned before the last device was added");
        s.multicast_add_device(mc, 1).unwrap();
        binder.join().unwrap().unwrap();
    });
    assert_eq!(s.ledger().bindings, 1);
}

/// "Similarly all devices must be added to the multicast team before a virtual address range can
/// be mapped to the multicast object. A call to [cuMemMap] will block until all devices have been
/// added."
#[test]
fn map_of_multicast_blocks_until_all_devices_added() {
    let s = sim();
    let mc = s.multicast_create(&prop(3, G, HandleTypes::NONE)).unwrap();
    s.multicast_add_device(mc, 0).unwrap();
    let va = s.mem_address_reserve(G, 0).unwrap();
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let mapper = scope.spawn(|| {
            let r = s.mem_map(va, G, 0, mc);
            done.store(true, Ordering::SeqCst);
            r
        });
        std::thread::sleep(Duration::from_millis(50));
        s.multicast_add_device(mc, 1).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(!done.load(Ordering::SeqCst), "cuMemMap returned with 2 of 3 devices added");
        s.multicast_add_device(mc, 2).unwrap();
        mapper.join().unwrap().unwrap();
    });
    assert_eq!(s.ledger().mappings, 1);
}

/// The watchdog: a bind that can never complete (a device is never added) panics loudly instead of
/// hanging like real hardware would.
#[test]
#[should_panic(expected = "1 of 2 added); real hardware would hang forever")]
fn watchdog_turns_endless_bind_into_panic() {
    let s = SimDriver::new(SimConfig { watchdog: Duration::from_millis(200), ..config() });
    let mc = s.multicast_create(&prop(2, G, HandleTypes::NONE)).unwrap();
    s.multicast_add_device(mc, 0).unwrap();
    let h = s.mem_create(0, G, HandleTypes::NONE).unwrap();
    let _ = s.multicast_bind_mem(mc, 0, h, 0, G, 0);
}

/// The watchdog names the blocked call for cuMemMap too.
#[test]
fn watchdog_names_blocked_map() {
    let s = SimDriver::new(SimConfig { watchdog: Duration::from_millis(100), ..config() });
    let mc = s.multicast_create(&prop(2, G, HandleTypes::NONE)).unwrap();
    let va = s.mem_address_reserve(G, 0).unwrap();
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.mem_map(va, G, 0, mc))).unwrap_err();
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("cuMemMap") && msg.contains("0 of 2 added"), "{msg}");
}

// ---- cuMulticastUnbind ----

/// "The intended `size` of the unbind and the offset in the multicast range ( `mcOffset` ) must be
/// a multiple of the value returned by [cuMulticastGetGranularity] flag
/// [CU_MULTICAST_GRANULARITY_MINIMUM]. The `size` + `mcOffset` cannot be larger than the total
/// size of the multicast object."
#[test]
fn unbind_granularity_and_bounds() {
    let s = sim();
    let mc = team(&s, 2, 2 * G, HandleTypes::NONE);
    let h = s.mem_create(0, 2 * G, HandleTypes::NONE).unwrap();
    s.multicast_bind_mem(mc, 0, h, 0, 2 * G, 0).unwrap();
    assert_eq!(code(s.multicast_unbind(mc, 0, 0, 2 * G - 4096)), IV);
    assert_eq!(code(s.multicast_unbind(mc, 0, 4096, 2 * G)), IV);
    assert_eq!(code(s.multicast_unbind(mc, 0, 2 * G, 2 * G)), IV);
    assert_eq!(code(s.multicast_unbind(mc, 7, 0, 2 * G)), ID);
    assert_eq!(s.ledger().bindings, 1);
}

/// "Warning: The `mcOffset` and the `size` must match the corresponding values specified during
/// the bind call. Any other values may result in undefined behavior." — the simulator returns
/// CUDA_ERROR_INVALID_VALUE (and logs an error) for anything but an exact match.
#[test]
fn unbind_must_match_a_bind_exactly() {
    let s = sim();
    let mc = team(&s, 2, 4 * G, HandleTypes::NONE);
    let h = s.mem_create(0, 4 * G, HandleTypes::NONE).unwrap();
    s.multicast_bind_mem(mc, 0, h, 0, 2 * G, 0).unwrap();
    assert_eq!(code(s.multicast_unbind(mc, 0, 0, G)), IV, "smaller size");
    assert_eq!(code(s.multicast_unbind(mc, 0, 0, 4 * G)), IV, "larger size");
    assert_eq!(code(s.multicast_unbind(mc, 1, 0, 2 * G)), IV, "another device");
    assert_eq!(code(s.multicast_unbind(mc, 0, 2 * G, 2 * G)), IV, "never bound");
    s.multicast_unbind(mc, 0, 0, 2 * G).unwrap();
    assert_eq!(code(s.multicast_unbind(mc, 0, 0, 2 * G)), IV, "already unbound");
    assert_eq!(s.ledger().bindings, 0);
}

// ---- cuMemMap / cuMemRelease / access ----

/// DESIGN.md: "`cuMemMap` of a multicast handle: offset 0 (mapping starts at the object's
/// start)". Also the mapping must fit the object.
#[test]
fn map_of_multicast_needs_offset_zero() {
    let s = sim();
    let mc = team(&s, 2, 2 * G, HandleTypes::NONE);
    let va = s.mem_address_reserve(4 * G, 0).unwrap();
    assert_eq!(code(s.mem_map(va, G, G, mc)), IV);
    assert_eq!(code(s.mem_map(va, 4 * G, 0, mc)), IV);
    s.mem_map(va, 2 * G, 0, mc).unwrap();
    // A multicast mapping is not ordinary memory.
    s.mem_set_access(va, 2 * G, &[0]).unwrap();
    assert_eq!(code(s.memset_d8(0, va, 1, 16)), IV);
}

/// cuMemMap rules (VMM): inside a reservation, not over another mapping, granularity-aligned,
/// `offset + size` within the allocation; cuMemAddressFree needs the range unmapped.
#[test]
fn map_rules() {
    let s = sim();
    let h = s.mem_create(0, 2 * G, HandleTypes::NONE).unwrap();
    let va = s.mem_address_reserve(4 * G, 0).unwrap();
    assert_eq!(va % G as u64, 0);
    let host = [0u8; 8];
    assert_eq!(code(s.mem_map(host.as_ptr() as u64, G, 0, h)), IV, "not reserved");
    assert_eq!(code(s.mem_map(va + 3 * G as u64, 2 * G, 0, h)), IV, "leaves the reservation");
    assert_eq!(code(s.mem_map(va + 4096, G, 0, h)), IV, "misaligned address");
    assert_eq!(code(s.mem_map(va, G, 4096, h)), IV, "misaligned offset");
    assert_eq!(code(s.mem_map(va, 2 * G, G, h)), IV, "past the allocation");
    assert_eq!(code(s.mem_map(va, G, 0, MemHandle(99))), IV, "no such handle");
    s.mem_map(va, 2 * G, 0, h).unwrap();
    assert_eq!(code(s.mem_map(va + G as u64, G, 0, h)), IV, "already mapped");
    assert_eq!(code(s.mem_address_free(va, 4 * G)), IV, "still mapped");
    assert_eq!(code(s.mem_unmap(va, G)), IV, "part of a mapping");
    s.mem_unmap(va, 2 * G).unwrap();
    assert_eq!(code(s.mem_address_free(va, 2 * G)), IV, "not the reserved size");
    s.mem_address_free(va, 4 * G).unwrap();
    s.mem_release(h).unwrap();
    assert_eq!(code(s.mem_release(h)), IV, "released twice");
    assert!(s.ledger().is_empty(), "{}", s.ledger());
}

/// Access rules: a new mapping is inaccessible until cuMemSetAccess, and only for the devices
/// named; copies need the whole range mapped.
#[test]
fn access_needs_set_access_for_the_device() {
    let s = sim();
    let h = s.mem_create(0, 2 * G, HandleTypes::NONE).unwrap();
    let va = s.mem_address_reserve(2 * G, 0).unwrap();
    s.mem_map(va, 2 * G, 0, h).unwrap();
    assert_eq!(code(s.memcpy_htod(0, va, &[1, 2, 3])), IV, "no access yet");
    assert_eq!(code(s.mem_set_access(va, 2 * G, &[])), IV);
    assert_eq!(code(s.mem_set_access(va, 2 * G, &[5])), ID);
    assert_eq!(code(s.mem_set_access(va, 4 * G, &[0])), IV, "past the mapping");
    s.mem_set_access(va, 2 * G, &[0]).unwrap();
    s.memcpy_htod(0, va + 10, &[1, 2, 3]).unwrap();
    assert_eq!(code(s.memcpy_htod(1, va, &[1])), IV, "device 1 has no access");
    let mut out = [0u8; 4];
    assert_eq!(code(s.memcpy_dtoh(1, &mut out, va + 9)), IV);
    s.mem_set_access(va, 2 * G, &[1]).unwrap();
    s.memcpy_dtoh(1, &mut out, va + 9).unwrap();
    assert_eq!(out, [0, 1, 2, 3]);
    s.memset_d8(0, va + 2 * G as u64 - 4, 7, 4).unwrap();
    assert_eq!(code(s.memset_d8(0, va + 2 * G as u64 - 4, 7, 5)), IV, "past the mapping");
    s.memcpy_dtoh(0, &mut out, va + 2 * G as u64 - 4).unwrap();
    assert_eq!(out, [7; 4]);
    unmapped_free(&s, h, va, 2 * G);
    assert!(s.ledger().is_empty(), "{}", s.ledger());
}

/// DESIGN.md: "`cuMemRelease` of a mapped handle defers the free until unmapped." (and the
/// reference: "Multicast objects can be released using the virtual memory management API
/// [cuMemRelease].")
#[test]
fn release_of_mapped_handles_is_deferred() {
    let s = SimDriver::new(SimConfig { multicast_slots: 1, ..config() });
    let (h, va) = mapped(&s, 0, G, HandleTypes::NONE);
    s.memcpy_htod(0, va, b"kept").unwrap();
    s.mem_release(h).unwrap();
    assert_eq!(code(s.mem_map(va, G, 0, h)), IV, "the handle is gone for the caller");
    let mut out = [0u8; 4];
    s.memcpy_dtoh(0, &mut out, va).unwrap();
    assert_eq!(&out, b"kept", "memory stays while mapped");
    assert_eq!(s.ledger().allocations[0], 1);
    s.mem_unmap(va, G).unwrap();
    assert_eq!(s.ledger().allocations[0], 0, "freed on the last unmap");

    let mc = team(&s, 1, G, HandleTypes::NONE);
    s.mem_map(va, G, 0, mc).unwrap();
    s.mem_release(mc).unwrap();
    let p = prop(1, G, HandleTypes::NONE);
    assert_eq!(code(s.multicast_create(&p)), CuResult::ERROR_OUT_OF_MEMORY, "slot held while mapped");
    s.mem_unmap(va, G).unwrap();
    let mc2 = s.multicast_create(&p).unwrap();
    s.mem_release(mc2).unwrap();
    s.mem_address_free(va, G).unwrap();
    assert!(s.ledger().is_empty(), "{}", s.ledger());
}

/// DESIGN.md: "Budgets: per-device memory (`sim_device_memory`) ... give real
/// `CUDA_ERROR_OUT_OF_MEMORY`." (cuMemCreate returns CUDA_ERROR_OUT_OF_MEMORY.)
#[test]
fn memory_budget_gives_out_of_memory() {
    let s = SimDriver::new(SimConfig { device_memory: 8 * MIB as u64, ..config() });
    let a = s.mem_create(0, 6 * MIB, HandleTypes::NONE).unwrap();
    assert_eq!(code(s.mem_create(0, 4 * MIB, HandleTypes::NONE)), CuResult::ERROR_OUT_OF_MEMORY);
    let b = s.mem_create(1, 8 * MIB, HandleTypes::NONE).unwrap(); // per device
    let c = s.mem_create(0, 2 * MIB, HandleTypes::NONE).unwrap();
    assert_eq!(s.ledger().allocation_bytes[..2], [8 * MIB as u64, 8 * MIB as u64]);
    s.mem_release(a).unwrap();
    let d = s.mem_create(0, 6 * MIB, HandleTypes::NONE).unwrap();
    assert_eq!(code(s.mem_create(0, G + 1, HandleTypes::NONE)), IV, "not a granularity multiple");
    for h in [b, c, d] {
        s.mem_release(h).unwrap();
    }
    assert!(s.ledger().is_empty(), "{}", s.ledger());
}

/// Export and import: only shareable POSIX-fd allocations export; an import refers to the same
/// memory.
#[test]
fn export_and_import_share_memory() {
    let s = sim();
    let plain = s.mem_create(0, G, HandleTypes::NONE).unwrap();
    assert_eq!(code(s.mem_export_fd(plain)), IV);
    let fabric = s.mem_create(0, G, HandleTypes::FABRIC).unwrap();
    assert_eq!(code(s.mem_export_fd(fabric)), IV);
    let (h, va) = mapped(&s, 0, G, HandleTypes::POSIX_FD);
    let fd = s.mem_export_fd(h).unwrap();
    let imported = s.mem_import_fd(std::os::fd::AsRawFd::as_raw_fd(&fd)).unwrap();
    assert_ne!(imported, h);
    assert_eq!(s.ledger().allocations[0], 3, "an import is no new memory");
    let vb = s.mem_address_reserve(G, 0).unwrap();
    s.mem_map(vb, G, 0, imported).unwrap();
    s.mem_set_access(vb, G, &[0]).unwrap();
    s.memcpy_htod(0, va + 100, b"same").unwrap();
    let mut out = [0u8; 4];
    s.memcpy_dtoh(0, &mut out, vb + 100).unwrap();
    assert_eq!(&out, b"same");
    assert_eq!(code(s.mem_import_fd(-1)), IV);
    let stranger = std::fs::File::open("/proc/self/stat").unwrap();
    assert_eq!(code(s.mem_import_fd(std::os::fd::AsRawFd::as_raw_fd(&stranger))), IV);
}

/// DESIGN.md "Processes and hosts": the simulator models hosts by their identity; a POSIX
/// descriptor made under another host identity is refused (a wrongly routed handle), while the
/// same memory made on this host imports.
#[test]
fn posix_descriptors_do_not_cross_hosts() {
    let s = sim();
    let make = |host: &str| {
        let name = std::ffi::CString::new(format!("mcast-sim:mem:dev=0:types=1@{host}")).unwrap();
        // SAFETY: a valid name; checked.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: a fresh descriptor.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
        // SAFETY: a valid memfd.
        assert_eq!(unsafe { libc::ftruncate(raw, G as libc::off_t) }, 0);
        fd
    };
    let other = make(&crate::bootstrap::host::tag_of("another host"));
    assert_eq!(code(s.mem_import_fd(std::os::fd::AsRawFd::as_raw_fd(&other))), IV);
    let here = make(crate::bootstrap::host::host_tag());
    let h = s.mem_import_fd(std::os::fd::AsRawFd::as_raw_fd(&here)).unwrap();
    s.mem_release(h).unwrap();
}

// ---- multimem translation ----

/// DESIGN.md: "Multimem semantics: a multicast address maps to every bound rank's memory; a
/// simulated `ld_reduce` reads all of them, `st` writes all of them."
#[test]
fn multicast_targets_ld_reduce_and_st() {
    let s = sim();
    let mc = team(&s, 3, 2 * G, HandleTypes::NONE);
    let ranks: Vec<_> = [2, 0, 1].iter().map(|&d| (d, mapped(&s, d, 2 * G, HandleTypes::NONE))).collect();
    for &(d, (h, va)) in &ranks {
        s.multicast_bind_mem(mc, 0, h, 0, 2 * G, 0).unwrap();
        let vals: Vec<u8> = (0..64u32).flat_map(|i| (i * 10 + d as u32 + 1).to_le_bytes()).collect();
        s.memcpy_htod(d, va + 4096, &vals).unwrap();
    }
    let mva = s.mem_address_reserve(2 * G, 0).unwrap();
    s.mem_map(mva, 2 * G, 0, mc).unwrap();
    assert!(s.multicast_targets(mva + 2 * G as u64 - 4, 8).is_none(), "leaves the mapping");
    assert!(s.multicast_targets(ranks[0].1 .1, 8).is_none(), "a unicast address");
    let targets = s.multicast_targets(mva + 4096, 256).unwrap();
    assert_eq!(targets.len(), 3);
    // Ordered by device ordinal: the first target is device 0's memory.
    let first = unsafe { (targets[0] as *const u32).read_unaligned() };
    assert_eq!(first, 1);
    // ld_reduce (sum) then st, by host loops.
    for i in 0..64 {
        let sum: u32 = targets
            .iter()
            // SAFETY: each target covers the 256 bytes asked for.
            .map(|&t| unsafe { (t as *const u32).add(i).read_unaligned() })
            .sum();
        assert_eq!(sum, 30 * i as u32 + 6);
        for &t in &targets {
            // SAFETY: as above.
            unsafe { (t as *mut u32).add(i).write_unaligned(sum) };
        }
    }
    for &(d, (_, va)) in &ranks {
        let mut out = vec![0u8; 256];
        s.memcpy_dtoh(d, &mut out, va + 4096).unwrap();
        let got: Vec<u32> = out.chunks(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        assert_eq!(got, (0..64u32).map(|i| 30 * i + 6).collect::<Vec<_>>(), "device {d}");
    }
}

/// Devices without a binding covering the range are absent from the targets.
#[test]
fn multicast_targets_skip_unbound_devices() {
    let s = sim();
    let mc = team(&s, 3, 2 * G, HandleTypes::NONE);
    let h: Vec<_> = (0..3).map(|d| s.mem_create(d, 2 * G, HandleTypes::NONE).unwrap()).collect();
    s.multicast_bind_mem(mc, 0, h[0], 0, 2 * G, 0).unwrap();
    s.multicast_bind_mem(mc, G, h[2], 0, G, 0).unwrap();
    let mva = s.mem_address_reserve(2 * G, 0).unwrap();
    s.mem_map(mva, 2 * G, 0, mc).unwrap();
    assert_eq!(s.multicast_targets(mva, 64).unwrap().len(), 1);
    assert_eq!(s.multicast_targets(mva + G as u64, 64).unwrap().len(), 2);
    assert!(s.multicast_targets(mva + G as u64 - 32, 64).unwrap().len() == 1, "straddles device 2's region");
    s.multicast_unbind(mc, 0, 0, 2 * G).unwrap();
    assert!(s.multicast_targets(mva, 64).is_none());
}

// ---- streams, events, modules ----

#[test]
fn workers_run_in_order_and_synchronize_waits() {
    let s = sim();
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let stream = s.stream_create(1).unwrap();
    assert_ne!(stream, Stream::DEFAULT);
    assert_ne!(s.stream_create(1).unwrap(), stream);
    for i in 0..50 {
        let seen = seen.clone();
        s.enqueue(
            1,
            stream,
            Box::new(move || {
                if i == 0 {
                    std::thread::sleep(Duration::from_millis(30));
                }
                seen.lock().push(i);
            }),
        )
        .unwrap();
    }
    s.stream_synchronize(1, stream).unwrap();
    assert_eq!(*seen.lock(), (0..50).collect::<Vec<_>>());
    // Any stream value works, the default stream included; synchronizing an idle one returns.
    let flag = Arc::new(AtomicUsize::new(0));
    let f = flag.clone();
    s.enqueue(0, Stream(0xdead_beef), Box::new(move || f.store(7, Ordering::SeqCst))).unwrap();
    s.stream_synchronize(0, Stream(0xdead_beef)).unwrap();
    assert_eq!(flag.load(Ordering::SeqCst), 7);
    s.stream_synchronize(3, Stream::DEFAULT).unwrap();
    assert_eq!(code(s.enqueue(4, Stream::DEFAULT, Box::new(|| {}))), ID);
    assert_eq!(code(s.stream_destroy(0, stream)), CuResult::ERROR_INVALID_HANDLE, "wrong device");
    s.stream_destroy(1, stream).unwrap();
    assert_eq!(code(s.stream_destroy(1, stream)), CuResult::ERROR_INVALID_HANDLE);
}

#[test]
fn events_time_the_work_between_them() {
    let s = sim();
    let (a, b) = (s.event_create(0).unwrap(), s.event_create(0).unwrap());
    assert_eq!(code(s.event_elapsed_ms(0, a, b)), CuResult::ERROR_INVALID_HANDLE, "never recorded");
    let st = Stream(5);
    s.event_record(0, a, st).unwrap();
    s.enqueue(0, st, Box::new(|| std::thread::sleep(Duration::from_millis(40)))).unwrap();
    s.event_record(0, b, st).unwrap();
    let ms = s.event_elapsed_ms(0, a, b).unwrap();
    assert!((35.0..1000.0).contains(&ms), "{ms} ms");
    s.event_destroy(0, a).unwrap();
    s.event_destroy(0, b).unwrap();
    assert_eq!(code(s.event_destroy(0, b)), CuResult::ERROR_INVALID_HANDLE);
    assert_eq!(code(s.event_record(0, b, st)), CuResult::ERROR_INVALID_HANDLE);
}

// ---- stream capture and CUDA graphs ----

/// DESIGN.md (sim): launches on a capturing stream are recorded, not run; `cuGraphLaunch` runs
/// the recorded work in order, after the work queued on the stream before, once per launch.
#[test]
fn capture_records_launches_and_graph_launch_replays_them_in_order() {
    let s = sim();
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let push = |v: u32| {
        let seen = seen.clone();
        move || seen.lock().push(v)
    };
    let stream = s.stream_create(1).unwrap();
    s.stream_begin_capture(1, stream).unwrap();
    for v in 1..=3 {
        s.enqueue(1, stream, push(v)).unwrap();
    }
    // Another stream of the same device is not captured.
    s.enqueue(1, Stream(77), push(100)).unwrap();
    s.stream_synchronize(1, Stream(77)).unwrap();
    assert_eq!(*seen.lock(), vec![100], "captured launches must not run");
    let graph = s.stream_end_capture(1, stream).unwrap();
    assert_eq!(s.ledger().graphs, 1);
    let exec = s.graph_instantiate(1, graph).unwrap();
    // The executable graph outlives its graph.
    s.graph_destroy(1, graph).unwrap();
    seen.lock().clear();
    s.enqueue(1, stream, push(0)).unwrap();
    s.graph_launch(1, exec, stream).unwrap();
    s.graph_launch(1, exec, stream).unwrap();
    s.enqueue(1, stream, push(9)).unwrap();
    s.stream_synchronize(1, stream).unwrap();
    assert_eq!(*seen.lock(), vec![0, 1, 2, 3, 1, 2, 3, 9]);
    // Launched on another stream, the graph runs there.
    seen.lock().clear();
    s.graph_launch(1, exec, Stream(5)).unwrap();
    s.stream_synchronize(1, Stream(5)).unwrap();
    assert_eq!(*seen.lock(), vec![1, 2, 3]);
    // On another device it is not valid.
    assert_eq!(code(s.graph_launch(0, exec, Stream(5))), IV);
    s.graph_exec_destroy(1, exec).unwrap();
    assert_eq!(code(s.graph_launch(1, exec, stream)), CuResult::ERROR_INVALID_HANDLE);
    assert_eq!(code(s.graph_exec_destroy(1, exec)), IV);
    assert_eq!(code(s.graph_destroy(1, graph)), IV);
    assert_eq!(code(s.graph_instantiate(1, graph)), IV);
    s.stream_destroy(1, stream).unwrap();
    assert!(s.ledger().is_empty(), "{}", s.ledger());
}

/// CUDA driver API: capture cannot begin on the legacy stream or on a stream already capturing,
/// and ending needs a capture in progress; a synchronization of a capturing stream is illegal
/// and invalidates the capture, whose end then fails.
#[test]
fn capture_rules() {
    let s = sim();
    let st = Stream(11);
    assert_eq!(code(s.stream_begin_capture(0, Stream::DEFAULT)), CuResult::ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(code(s.stream_begin_capture(9, st)), ID);
    assert_eq!(code(s.stream_end_capture(0, st)), CuResult::ERROR_ILLEGAL_STATE, "not capturing");
    s.stream_begin_capture(0, st).unwrap();
    assert_eq!(code(s.stream_begin_capture(0, st)), CuResult::ERROR_ILLEGAL_STATE, "already capturing");
    assert_eq!(s.ledger().captures, 1);
    assert!(!s.ledger().is_empty(), "an open capture is live");
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    s.enqueue(0, st, move || {
        r.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    // An event recorded in the capture only orders it: it never completes a timing.
    let ev = s.event_create(0).unwrap();
    s.event_record(0, ev, st).unwrap();
    assert_eq!(code(s.stream_synchronize(0, st)), CuResult::ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(code(s.stream_end_capture(0, st)), CuResult::ERROR_STREAM_CAPTURE_INVALIDATED);
    assert_eq!(s.ledger().captures, 0, "the invalidated capture has ended");
    assert_eq!(s.ledger().graphs, 0);
    // The stream works eagerly again; the captured launch never ran.
    s.stream_synchronize(0, st).unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    // A graph launched on a capturing stream becomes one node of the new capture.
    s.stream_begin_capture(0, st).unwrap();
    let r = ran.clone();
    s.enqueue(0, st, move || {
        r.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    let inner = s.graph_instantiate(0, s.stream_end_capture(0, st).unwrap()).unwrap();
    s.stream_begin_capture(0, st).unwrap();
    s.graph_launch(0, inner, st).unwrap();
    s.graph_launch(0, inner, st).unwrap();
    let outer = s.stream_end_capture(0, st).unwrap();
    let outer_exec = s.graph_instantiate(0, outer).unwrap();
    s.stream_synchronize(0, st).unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 0, "nothing ran while capturing");
    s.graph_launch(0, outer_exec, st).unwrap();
    s.stream_synchronize(0, st).unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 2);
    // Faults reach the new entry points like any other.
    s.inject("cuGraphLaunch", CuResult::ERROR_LAUNCH_FAILED, 1, Some(1));
    assert_eq!(code(s.graph_launch(0, outer_exec, st)), CuResult::ERROR_LAUNCH_FAILED);
    s.clear_faults();
    // Destroying a capturing stream ends its capture.
    let st2 = s.stream_create(0).unwrap();
    s.stream_begin_capture(0, st2).unwrap();
    s.stream_destroy(0, st2).unwrap();
    assert_eq!(s.ledger().captures, 0);
    for e in [inner, outer_exec] {
        s.graph_exec_destroy(0, e).unwrap();
    }
    let graphs = s.ledger().graphs;
    assert_eq!(graphs, 2, "the two graphs ended without an error are live until destroyed");
    s.event_destroy(0, ev).unwrap();
}

#[test]
fn modules_and_launch() {
    let s = sim();
    assert_eq!(code(s.module_load(0, &[])), CuResult::ERROR_INVALID_IMAGE);
    let m = s.module_load(0, b"\x7fELF cubin").unwrap();
    let f = s.module_function(0, m, c"mc_allreduce").unwrap();
    let cfg = LaunchConfig { grid: [1; 3], block: [1; 3], shared_bytes: 0 };
    assert_eq!(code(s.launch(0, f, &cfg, Stream::DEFAULT, &mut [])), CuResult::ERROR_NOT_SUPPORTED);
    assert_eq!(s.ledger().modules, 1);
    s.module_unload(0, m).unwrap();
    assert_eq!(code(s.module_unload(0, m)), CuResult::ERROR_INVALID_HANDLE);
    assert_eq!(code(s.module_function(0, m, c"x")), CuResult::ERROR_INVALID_HANDLE);
}

#[test]
fn drop_runs_queued_work_and_joins_workers() {
    let s = sim();
    let token = Arc::new(());
    let ran = Arc::new(AtomicBool::new(false));
    let (t, r) = (token.clone(), ran.clone());
    s.enqueue(
        2,
        Stream(9),
        Box::new(move || {
            std::thread::sleep(Duration::from_millis(30));
            r.store(true, Ordering::SeqCst);
            let _held = &t;
        }),
    )
    .unwrap();
    assert_eq!(s.worker_threads(), 1);
    drop(s);
    assert!(ran.load(Ordering::SeqCst), "queued work ran before the drop returned");
    assert_eq!(Arc::strong_count(&token), 1, "the worker and its closure are gone");
}

// ---- faults and call log ----

#[test]
fn parse_faults_valid_items() {
    let plan =
        parse_faults("cuMulticastBindMem=OUT_OF_MEMORY@2, cuMemCreate=CUDA_ERROR_OUT_OF_MEMORY@1x3,cuMemMap=801@4+,")
            .unwrap();
    let rule =
        |func: &str, code, first, count| FaultRule { func: func.into(), action: FaultAction::Fail(code), first, count };
    assert_eq!(
        plan.rules,
        vec![
            rule("cuMulticastBindMem", CuResult::ERROR_OUT_OF_MEMORY, 2, Some(1)),
            rule("cuMemCreate", CuResult::ERROR_OUT_OF_MEMORY, 1, Some(3)),
            rule("cuMemMap", CuResult::ERROR_NOT_SUPPORTED, 4, None),
        ]
    );
    assert!(parse_faults("").unwrap().rules.is_empty());
    let r = &plan.rules[1];
    assert!(!r.hits(0) && r.hits(1) && r.hits(3) && !r.hits(4));
    assert!(plan.rules[2].hits(1000) && !plan.rules[2].hits(3));
}

#[test]
fn parse_faults_malformed_items_are_named() {
    for (spec, bad) in [
        ("cuMemCreate", "`cuMemCreate`"),
        ("cuMemCreate=OUT_OF_MEMORY", "`cuMemCreate=OUT_OF_MEMORY`"),
        ("cuMemCreat=OUT_OF_MEMORY@1", "cuMemCreat"),
        ("cuMemMap=NO_SUCH_CODE@1", "NO_SUCH_CODE"),
        ("cuMemMap=SUCCESS@1", "cuMemMap=SUCCESS@1"),
        ("cuMemCreate=OUT_OF_MEMORY@1,cuMemMap=OUT_OF_MEMORY@0", "cuMemMap=OUT_OF_MEMORY@0"),
        ("cuMemMap=OUT_OF_MEMORY@2x0", "2x0"),
        ("cuMemMap=OUT_OF_MEMORY@x", "@x"),
        ("cuMemMap=OUT_OF_MEMORY@-1+", "-1+"),
    ] {
        let err = parse_faults(spec).expect_err(spec);
        assert!(err.contains(bad), "{spec}: {err}");
    }
}

#[test]
fn parse_faults_panic_items() {
    let plan = parse_faults("cuMemCreate=PANIC@1, cuMemMap=PANIC@2x3,cuMulticastCreate=OUT_OF_MEMORY@1").unwrap();
    let actions: Vec<_> = plan.rules.iter().map(|r| (r.func.as_str(), r.action, r.first, r.count)).collect();
    assert_eq!(
        actions,
        vec![
            ("cuMemCreate", FaultAction::Panic, 1, Some(1)),
            ("cuMemMap", FaultAction::Panic, 2, Some(3)),
            ("cuMulticastCreate", FaultAction::Fail(CuResult::ERROR_OUT_OF_MEMORY), 1, Some(1)),
        ]
    );
    // Still strict: the function must exist, the spelling is exact, a call number is needed.
    for (spec, bad) in [
        ("cuMemCreat=PANIC@1", "cuMemCreat"),
        ("cuMemCreate=panic@1", "panic"),
        ("cuMemCreate=PANIC", "`cuMemCreate=PANIC`"),
        ("cuMemCreate=PANIC@0", "PANIC@0"),
        ("cuMemCreate=PANICS@1", "PANICS"),
    ] {
        let err = parse_faults(spec).expect_err(spec);
        assert!(err.contains(bad), "{spec}: {err}");
    }
}

#[test]
fn injected_panic_has_no_effect_and_leaves_no_lock_held() {
    let faults = parse_faults("cuMemCreate=PANIC@2").unwrap();
    let s = SimDriver::new(SimConfig { faults, ..config() });
    let a = s.mem_create(0, G, HandleTypes::NONE).unwrap();
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.mem_create(0, G, HandleTypes::NONE)))
        .expect_err("the 2nd cuMemCreate panics");
    let msg = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert_eq!(msg, "injected panic in cuMemCreate");
    assert_eq!(s.call_count("cuMemCreate"), 2, "the panicking call was counted");
    assert_eq!(s.ledger().allocations[0], 1, "the panicking call created nothing");
    // Every lock is free again: the state, the call counts and the log all work.
    let b = s.mem_create(0, G, HandleTypes::NONE).unwrap();
    assert_eq!(s.call_log().iter().filter(|f| **f == "cuMemCreate").count(), 3);
    for h in [a, b] {
        s.mem_release(h).unwrap();
    }
    assert!(s.ledger().is_empty(), "{}", s.ledger());
}

#[test]
fn configured_faults_fail_the_chosen_calls_without_effect() {
    let faults = parse_faults("cuMemCreate=OUT_OF_MEMORY@2x2,cuMulticastCreate=SYSTEM_NOT_READY@1").unwrap();
    let s = SimDriver::new(SimConfig { faults, ..config() });
    let a = s.mem_create(0, G, HandleTypes::NONE).unwrap();
    let e = s.mem_create(0, G, HandleTypes::NONE).unwrap_err();
    assert_eq!(e, DriverError::new("cuMemCreate", CuResult::ERROR_OUT_OF_MEMORY));
    assert_eq!(code(s.mem_create(0, G, HandleTypes::NONE)), CuResult::ERROR_OUT_OF_MEMORY);
    assert_eq!(s.ledger().allocations[0], 1, "failed calls created nothing");
    let b = s.mem_create(0, G, HandleTypes::NONE).unwrap();
    let p = prop(1, G, HandleTypes::NONE);
    assert_eq!(code(s.multicast_create(&p)), CuResult::ERROR_SYSTEM_NOT_READY);
    assert_eq!(s.ledger().multicast_objects, 0);
    let mc = s.multicast_create(&p).unwrap();
    for h in [a, b, mc] {
        s.mem_release(h).unwrap();
    }
    assert!(s.ledger().is_empty(), "{}", s.ledger());
}

#[test]
fn injected_faults_count_from_injection_and_clear() {
    let s = sim();
    let mc = team(&s, 1, 2 * G, HandleTypes::NONE);
    let h = s.mem_create(0, 2 * G, HandleTypes::NONE).unwrap();
    s.multicast_bind_mem(mc, 0, h, 0, G, 0).unwrap();
    s.inject("cuMulticastBindMem", CuResult::ERROR_OUT_OF_MEMORY, 1, Some(1));
    assert_eq!(code(s.multicast_bind_mem(mc, G, h, G, G, 0)), CuResult::ERROR_OUT_OF_MEMORY);
    assert_eq!(s.ledger().bindings, 1, "a faulted bind binds nothing");
    s.multicast_bind_mem(mc, G, h, G, G, 0).unwrap();
    s.inject("cuMulticastUnbind", CuResult::ERROR_ILLEGAL_STATE, 2, None);
    s.multicast_unbind(mc, 0, 0, G).unwrap();
    assert_eq!(code(s.multicast_unbind(mc, 0, G, G)), CuResult::ERROR_ILLEGAL_STATE);
    assert_eq!(code(s.multicast_unbind(mc, 0, G, G)), CuResult::ERROR_ILLEGAL_STATE);
    s.clear_faults();
    s.multicast_unbind(mc, 0, G, G).unwrap();
    assert_eq!(s.call_count("cuMulticastUnbind"), 4);
}

#[test]
fn call_log_enumerates_driver_calls() {
    let s = sim();
    s.reset_call_log();
    let (h, va) = mapped(&s, 0, G, HandleTypes::NONE);
    unmapped_free(&s, h, va, G);
    assert_eq!(
        s.call_log(),
        [
            "cuMemCreate",
            "cuMemAddressReserve",
            "cuMemMap",
            "cuMemSetAccess",
            "cuMemUnmap",
            "cuMemAddressFree",
            "cuMemRelease"
        ]
    );
    for name in s.call_log() {
        assert!(FUNCTION_NAMES.contains(&name));
    }
    s.reset_call_log();
    assert!(s.call_log().is_empty());
    assert_eq!(s.call_count("cuMemCreate"), 1);
}

// ---- ledger ----

#[test]
fn ledger_tracks_a_full_multicast_lifecycle_to_empty() {
    let s = sim();
    let t0 = Instant::now();
    let mc = team(&s, 2, 2 * G, HandleTypes::NONE);
    let ranks: Vec<_> = (0..2).map(|d| mapped(&s, d, 2 * G, HandleTypes::NONE)).collect();
    for &(h, _) in &ranks {
        s.multicast_bind_mem(mc, 0, h, 0, 2 * G, 0).unwrap();
    }
    let mva = s.mem_address_reserve(2 * G, 0).unwrap();
    s.mem_map(mva, 2 * G, 0, mc).unwrap();
    let stream = s.stream_create(0).unwrap();
    let ev = s.event_create(0).unwrap();
    let module = s.module_load(0, b"image").unwrap();
    let l = s.ledger();
    assert_eq!(
        (l.allocations[..2].to_vec(), l.reservations, l.mappings, l.multicast_objects, l.bindings),
        (vec![1, 1], 3, 3, 1, 2)
    );
    assert_eq!((l.modules, l.streams, l.events), (1, 1, 1));
    let shown = l.to_string();
    assert!(shown.contains("1 multicast object(s)") && shown.contains("2 binding(s)"), "{shown}");
    s.mem_release(mc).unwrap(); // deferred: still mapped
    assert_eq!(s.ledger().multicast_objects, 1);
    s.mem_unmap(mva, 2 * G).unwrap();
    assert_eq!((s.ledger().multicast_objects, s.ledger().bindings), (0, 0), "bindings go with the object");
    s.mem_address_free(mva, 2 * G).unwrap();
    for (h, va) in ranks {
        unmapped_free(&s, h, va, 2 * G);
    }
    s.module_unload(0, module).unwrap();
    s.event_destroy(0, ev).unwrap();
    s.stream_destroy(0, stream).unwrap();
    assert!(s.ledger().is_empty(), "{}", s.ledger());
    assert_eq!(s.ledger().to_string(), "nothing live");
    assert!(t0.elapsed() < Duration::from_secs(1));
}

/// Two simulators stand for two processes: a shareable multicast object exported by one and
/// imported by the other shares its added devices and bindings (a memfd control block); a bind
/// blocks until every device was added by either; an imported object binds only shareable
/// memory; multimem targets reach memory bound by the other process once imported here.
#[test]
fn multicast_objects_are_shared_across_simulators() {
    use std::os::fd::AsRawFd;
    let a = Arc::new(SimDriver::new(SimConfig::default()));
    let b = SimDriver::new(SimConfig::default());
    let prop = MulticastProp { num_devices: 2, size: G, handle_types: HandleTypes::POSIX_FD, flags: 0 };
    let mc_a = a.multicast_create(&prop).unwrap();
    let fd = a.mem_export_fd(mc_a).unwrap();
    let mc_b = b.mem_import_fd(fd.as_raw_fd()).unwrap();
    let mem_a = a.mem_create(0, G, HandleTypes::POSIX_FD).unwrap();
    let mem_b = b.mem_create(1, G, HandleTypes::POSIX_FD).unwrap();
    let plain_b = b.mem_create(1, G, HandleTypes::NONE).unwrap();
    a.multicast_add_device(mc_a, 0).unwrap();
    assert_eq!(code(a.multicast_add_device(mc_a, 0)), IV, "device 0 was added already");
    let waiter = {
        let a = a.clone();
        std::thread::spawn(move || a.multicast_bind_mem(mc_a, 0, mem_a, 0, G, 0))
    };
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(!waiter.is_finished(), "a bind blocks until every device was added");
    b.multicast_add_device(mc_b, 1).unwrap();
    waiter.join().unwrap().unwrap();
    assert_eq!(code(b.multicast_bind_mem(mc_b, 0, plain_b, 0, G, 0)), IV, "imported objects bind shareable memory");
    b.multicast_bind_mem(mc_b, 0, mem_b, 0, G, 0).unwrap();
    // b imports a's memory and maps the object: both copies are reachable from b.
    let fd_mem = a.mem_export_fd(mem_a).unwrap();
    let imported = b.mem_import_fd(fd_mem.as_raw_fd()).unwrap();
    let va = b.mem_address_reserve(G, G).unwrap();
    b.mem_map(va, G, 0, mc_b).unwrap();
    assert_eq!(b.multicast_targets(va, 64).map(|t| t.len()), Some(2));
    b.mem_unmap(va, G).unwrap();
    b.mem_address_free(va, G).unwrap();
    b.multicast_unbind(mc_b, 1, 0, G).unwrap();
    a.multicast_unbind(mc_a, 0, 0, G).unwrap();
    for (s, hs) in [(&*a, vec![mc_a, mem_a]), (&b, vec![mc_b, mem_b, plain_b, imported])] {
        for h in hs {
            s.mem_release(h).unwrap();
        }
        assert!(s.ledger().is_empty(), "{}", s.ledger());
    }
}

/// Fabric handles: 64 bytes that another simulator (process) opens without a descriptor being
/// passed; only FABRIC objects export that way; garbage, stale handles and handles of memory
/// made without the FABRIC type are refused; a simulator without fabric support refuses them.
#[test]
fn fabric_handles_name_memory_and_multicast_objects() {
    use std::os::fd::AsRawFd;
    let a = SimDriver::new(SimConfig::default());
    let b = SimDriver::new(SimConfig::default());
    // Memory: a's bytes are b's bytes.
    let (mem_a, va) = mapped(&a, 0, G, HandleTypes::FABRIC);
    let handle = a.mem_export_fabric(mem_a).unwrap();
    let mem_b = b.mem_import_fabric(&handle).unwrap();
    let vb = b.mem_address_reserve(G, 0).unwrap();
    b.mem_map(vb, G, 0, mem_b).unwrap();
    b.mem_set_access(vb, G, &[1]).unwrap();
    a.memcpy_htod(0, va + 64, b"fabric").unwrap();
    let mut out = [0u8; 6];
    b.memcpy_dtoh(1, &mut out, vb + 64).unwrap();
    assert_eq!(&out, b"fabric");
    // Importing in the exporting simulator refers to the same memory.
    let again = a.mem_import_fabric(&handle).unwrap();
    assert_eq!(a.ledger().allocations[0], 1, "an import is no new memory");
    a.mem_release(again).unwrap();
    // Only FABRIC objects export as fabric handles; a fabric object is no POSIX fd.
    let posix = a.mem_create(0, G, HandleTypes::POSIX_FD).unwrap();
    assert_eq!(code(a.mem_export_fabric(posix)), IV);
    assert_eq!(code(a.mem_export_fd(mem_a)), IV);
    // A handle naming memory made without the FABRIC type does not import.
    let fd = a.mem_export_fd(posix).unwrap();
    let forged = fabric::encode(std::process::id(), fd.as_raw_fd(), host::fd_identity(fd.as_raw_fd()).unwrap());
    assert_eq!(code(b.mem_import_fabric(&forged)), IV);
    drop(fd);
    a.mem_release(posix).unwrap();
    // Garbage.
    assert_eq!(code(b.mem_import_fabric(&[0u8; FABRIC_HANDLE_BYTES])), IV);
    assert_eq!(code(b.mem_import_fabric(&[0x5au8; FABRIC_HANDLE_BYTES])), IV);
    let mut bent = handle;
    bent[20] ^= 1;
    assert_eq!(code(b.mem_import_fabric(&bent)), IV, "another identity");
    // Multicast objects.
    let prop = MulticastProp { num_devices: 2, size: G, handle_types: HandleTypes::FABRIC, flags: 0 };
    let mc_a = a.multicast_create(&prop).unwrap();
    assert_eq!(code(a.mem_export_fd(mc_a)), IV);
    let mc_handle = a.mem_export_fabric(mc_a).unwrap();
    let mc_b = b.mem_import_fabric(&mc_handle).unwrap();
    b.multicast_add_device(mc_b, 1).unwrap();
    assert_eq!(code(a.multicast_add_device(mc_a, 1)), IV, "device 1 was added through b");
    let posix_mc = a.multicast_create(&MulticastProp { handle_types: HandleTypes::POSIX_FD, ..prop }).unwrap();
    assert_eq!(code(a.mem_export_fabric(posix_mc)), IV);
    for h in [mc_a, posix_mc] {
        a.mem_release(h).unwrap();
    }
    b.mem_release(mc_b).unwrap();
    // Released: the handle is stale.
    b.mem_unmap(vb, G).unwrap();
    b.mem_address_free(vb, G).unwrap();
    b.mem_release(mem_b).unwrap();
    unmapped_free(&a, mem_a, va, G);
    assert_eq!(code(b.mem_import_fabric(&handle)), IV, "the memory is gone");
    assert!(a.ledger().is_empty(), "{}", a.ledger());
    assert!(b.ledger().is_empty(), "{}", b.ledger());
    // Without fabric support.
    let c = SimDriver::new(SimConfig { fabric_supported: false, ..SimConfig::default() });
    assert!(!c.device_props(0).unwrap().fabric_supported);
    assert_eq!(code(c.mem_create(0, G, HandleTypes::FABRIC)), CuResult::ERROR_NOT_SUPPORTED);
    assert_eq!(code(c.multicast_create(&prop)), CuResult::ERROR_NOT_SUPPORTED);
    assert_eq!(code(c.mem_import_fabric(&handle)), CuResult::ERROR_NOT_SUPPORTED);
}
