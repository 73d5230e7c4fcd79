//! Tests of the ledger over whole lifecycles, and of objects shared across simulators (POSIX
//! descriptors and fabric handles).

use super::*;

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
    let forged = fabric::encode(
        std::process::id(),
        fd.as_raw_fd(),
        host::fd_identity(fd.as_raw_fd()).unwrap(),
        fabric::fabric_id(&a.config().fabric),
    );
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
