//! Identity: `CUDA_VISIBLE_DEVICES`, UUIDs and PCI bus ids (`identity.rs`), each test quoting
//! the CUDA behaviour it models.

use super::*;

fn with_visible(spec: Option<&str>, host: &str) -> SimDriver {
    SimDriver::new(SimConfig { visible: spec.map(str::to_string), host: host.to_string(), ..config() })
}

fn uuids(s: &SimDriver) -> Vec<[u8; 16]> {
    (0..s.device_count().unwrap()).map(|d| s.device_props(d).unwrap().uuid).collect()
}

/// CUDA C Programming Guide, "CUDA Environment Variables": `CUDA_VISIBLE_DEVICES` is "a
/// comma-separated sequence of GPU identifiers"; "Only the devices whose index is present in
/// the sequence are visible to CUDA applications and they are enumerated in the order of the
/// sequence". Ordinals are positions in the list; the same GPU keeps its UUID whatever its
/// ordinal.
#[test]
fn visible_devices_select_and_order_the_gpus() {
    let all = with_visible(None, "h");
    assert_eq!(all.device_count().unwrap(), 4);
    let every = uuids(&all);
    let s = with_visible(Some("2,0"), "h");
    assert_eq!(s.device_count().unwrap(), 2);
    assert_eq!(uuids(&s), vec![every[2], every[0]]);
    assert_eq!((s.physical_index(0), s.physical_index(1), s.physical_index(2)), (Some(2), Some(0), None));
    assert_eq!(s.device_props(0).unwrap().pci_bus_id, all.device_props(2).unwrap().pci_bus_id);
    assert_eq!(code(s.device_props(2)), ID);
    // One GPU per process: each calls it device 0, and they are told apart by UUID only.
    let (a, b) = (with_visible(Some("0"), "h"), with_visible(Some("1"), "h"));
    assert_eq!((a.device_count().unwrap(), b.device_count().unwrap()), (1, 1));
    assert_ne!(uuids(&a), uuids(&b));
    assert_eq!(uuids(&a)[0], every[0]);
    // Every GPU distinct, and UUIDs of other hosts never collide with this host's.
    let other = uuids(&with_visible(None, "g"));
    for (i, u) in every.iter().enumerate() {
        assert!(!every[..i].contains(u) && !other.contains(u));
    }
}

/// The same guide: "If one of the indices is invalid, only the devices whose index precedes
/// the invalid index are visible to CUDA applications. For example, setting
/// CUDA_VISIBLE_DEVICES to 2,1 causes device 0 to be invisible and device 2 to be enumerated
/// before device 1. Setting CUDA_VISIBLE_DEVICES to 0,2,-1,1 causes devices 0 and 2 to be
/// visible and device 1 to be invisible." An index past the host's GPUs, garbage and a
/// repeated GPU are invalid the same way; an empty value hides every GPU.
#[test]
fn an_invalid_entry_ends_the_list() {
    let every = uuids(&with_visible(None, "h"));
    for (spec, want) in [
        ("0,2,-1,1", vec![0, 2]),
        ("2,1", vec![2, 1]),
        ("1,7,0", vec![1]),
        ("3, x,0", vec![3]),
        ("1,1,2", vec![1]),
        ("", vec![]),
        ("-1", vec![]),
    ] {
        let s = with_visible(Some(spec), "h");
        let want: Vec<[u8; 16]> = want.iter().map(|&i| every[i]).collect();
        assert_eq!(uuids(&s), want, "CUDA_VISIBLE_DEVICES={spec:?}");
    }
}

/// The same guide: GPU identifiers are "given as integer indices or as UUID strings"; a UUID
/// may be abbreviated to a unique prefix after `GPU-` (as `nvidia-smi -L` prints it).
#[test]
fn gpus_are_named_by_uuid_too() {
    let all = with_visible(None, "h");
    let third = crate::driver::uuid_string(&all.device_props(3).unwrap().uuid);
    let spec = format!("{},0", &third[..12]);
    let s = with_visible(Some(&spec), "h");
    assert_eq!(s.device_count().unwrap(), 2);
    assert_eq!(s.physical_index(0), Some(3));
    assert_eq!(with_visible(Some("GPU-zz,0"), "h").device_count().unwrap(), 0);
}

/// Memory of a GPU another process sees under another ordinal imports onto that GPU's
/// ordinal here, as the same GPU; memory of a GPU this process does not see imports too
/// (CUDA maps peer memory whatever the importer's `CUDA_VISIBLE_DEVICES`) and belongs to no
/// ordinal here.
#[test]
fn imported_memory_keeps_its_gpu() {
    let exporter = with_visible(Some("2"), "h");
    let h = exporter.mem_create(0, G, HandleTypes::POSIX_FD).unwrap();
    let fd = exporter.mem_export_fd(h).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&fd);
    let sees = with_visible(Some("0,2"), "h");
    let mine = sees.mem_import_fd(fd).unwrap();
    assert_eq!(sees.mem_allocation_props(mine).unwrap().dev, 1, "GPU 2 is ordinal 1 here");
    let blind = with_visible(Some("0"), "h");
    let theirs = blind.mem_import_fd(fd).unwrap();
    assert_eq!(blind.mem_allocation_props(theirs).unwrap().dev, super::super::memory::NOT_VISIBLE);
    assert!(blind.ledger().allocations.iter().all(|&n| n == 0), "charged to no device here");
    for (s, m) in [(&sees, mine), (&blind, theirs), (&exporter, h)] {
        s.mem_release(m).unwrap();
        assert!(s.ledger().is_empty(), "{}", s.ledger());
    }
}

fn fabric_sim(fabric: Option<(&str, u32)>, imex: bool, host: &str) -> SimDriver {
    let mut c = SimConfig { imex, host: host.to_string(), ..config() };
    if let Some((name, clique)) = fabric {
        c.fabric = (name.to_string(), clique);
    }
    SimDriver::new(c)
}

/// NVML's GPU fabric info (`nvmlDeviceGetGpuFabricInfoV`): GPUs of one NVLink fabric report
/// the same cluster UUID and clique and state COMPLETED; a GPU without fabric support reports
/// none. Unset, every simulated host is in one fabric.
#[test]
fn fabric_info_names_the_fabric() {
    let (a, b) = (fabric_sim(None, true, "h0"), fabric_sim(None, true, "h1"));
    let (fa, fb) = (a.fabric_info(0).unwrap(), b.fabric_info(3).unwrap());
    assert_eq!(fa.state, FabricState::Completed);
    assert_eq!((fa.cluster_uuid, fa.clique_id), (fb.cluster_uuid, fb.clique_id));
    let c = fabric_sim(Some(("rack2", 5)), true, "h2");
    let fc = c.fabric_info(0).unwrap();
    assert_ne!(fc.cluster_uuid, fa.cluster_uuid);
    assert_eq!(fc.clique_id, 5);
    let none = SimDriver::new(SimConfig { fabric_supported: false, ..config() });
    assert_eq!(none.fabric_info(0).unwrap(), FabricInfo::default());
    assert_eq!(code(a.fabric_info(4)), ID);
}

/// A FABRIC handle names memory anywhere in its NVLink fabric and nowhere else: importing one
/// made in another fabric fails with `CUDA_ERROR_INVALID_HANDLE` (CUresult 400), what
/// torchcomms#3516 saw on a system whose local probe passed (domains.md).
#[test]
fn fabric_handles_do_not_cross_fabrics() {
    let a = fabric_sim(Some(("rackA", 0)), true, "h0");
    let h = a.mem_create(0, G, HandleTypes::FABRIC).unwrap();
    let bytes = a.mem_export_fabric(h).unwrap();
    let same = fabric_sim(Some(("rackA", 0)), true, "h1");
    let ok = same.mem_import_fabric(&bytes).unwrap();
    same.mem_release(ok).unwrap();
    for other in [fabric_sim(Some(("rackB", 0)), true, "h2"), fabric_sim(Some(("rackA", 1)), true, "h3")] {
        assert_eq!(code(other.mem_import_fabric(&bytes)), CuResult::ERROR_INVALID_HANDLE);
        assert!(other.ledger().is_empty());
    }
    a.mem_release(h).unwrap();
}

/// CUDA programming guide, "Multi-Node NVLink": memory shared through FABRIC handles needs an
/// IMEX channel; without access to one, creating or exporting such memory fails with
/// `CUDA_ERROR_NOT_PERMITTED`, though the device still reports
/// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED` (`MCAST_SIM_IMEX=0`).
#[test]
fn no_imex_channel_is_not_permitted() {
    let s = fabric_sim(None, false, "h0");
    assert!(s.device_props(0).unwrap().fabric_supported);
    assert_eq!(code(s.mem_create(0, G, HandleTypes::FABRIC)), CuResult::ERROR_NOT_PERMITTED);
    assert_eq!(code(s.multicast_create(&prop(2, G, HandleTypes::FABRIC))), CuResult::ERROR_NOT_PERMITTED);
    // POSIX descriptors need no IMEX channel.
    let h = s.mem_create(0, G, HandleTypes::POSIX_FD).unwrap();
    s.mem_release(h).unwrap();
    // A handle made where there is a channel does not import here either.
    let a = fabric_sim(None, true, "h1");
    let m = a.mem_create(0, G, HandleTypes::FABRIC).unwrap();
    assert_eq!(code(s.mem_import_fabric(&a.mem_export_fabric(m).unwrap())), CuResult::ERROR_NOT_PERMITTED);
    a.mem_release(m).unwrap();
    assert!(s.ledger().is_empty());
}
