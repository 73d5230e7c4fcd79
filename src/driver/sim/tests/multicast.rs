//! Tests of the multicast rules: create, granularity, add device, the four binds (blocking and
//! the watchdog), unbind, and the multimem address translation.

use super::*;

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
