//! Tests of the memory rules: `cuMemMap`, release, access, the memory budget, export and import.

use super::*;

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
        let name = std::ffi::CString::new(format!("mcast-sim:mem:gpu=1:types=1@{host}")).unwrap();
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
