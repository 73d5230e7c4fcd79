//! Collectives and registration across processes: every collective, out of place and the
//! pointer form, on 2 to 4 processes over both transports, fabric handles or POSIX descriptors;
//! the ranks agree on the LL kernels, the copy-engine threshold and the device-API slots.

use super::*;

/// Out-of-place collectives and the pointer form across processes (2 and 3 ranks, both
/// transports).
#[test]
fn out_of_place_and_pointer_form_across_processes() {
    for multicast in MODES {
        for n in [2, 3] {
            all_ok(&spawn(n, "own-memory", multicast, |_| vec![]));
        }
    }
}

/// Registration across processes (2 and 3 ranks, both transports, fabric handles by default):
/// `mcast_mem_alloc` memory registered on every rank, every `_into` collective and the pointer
/// form on the registered pointers, results read through the application's own pointers, free,
/// empty ledger on every rank.
#[test]
fn register_across_processes() {
    for multicast in MODES {
        for n in [2, 3] {
            all_ok(&spawn(n, "register", multicast, |_| expect("fabric")));
        }
    }
}

/// The same over POSIX descriptors (`MCAST_HANDLE_TYPE=posix`).
#[test]
fn register_across_processes_over_posix_descriptors() {
    for multicast in MODES {
        for n in [2, 3] {
            all_ok(&spawn(n, "register", multicast, |_| {
                let mut v = expect("posix");
                v.push(("MCAST_HANDLE_TYPE", "posix".into()));
                v
            }));
        }
    }
}

/// Two simulated hosts (`MCAST_HOST_ID`): registered memory travels as fabric handles (the
/// simulator refuses a descriptor imported on another host).
#[test]
fn register_across_two_hosts_uses_fabric_handles() {
    for multicast in MODES {
        all_ok(&spawn(2, "register", multicast, |r| {
            let mut v = expect("fabric");
            v.push(("MCAST_HOST_ID", format!("host{r}")));
            v
        }));
        all_ok(&spawn(3, "register", multicast, |r| {
            let mut v = expect("fabric");
            v.push(("MCAST_HOST_ID", format!("host{}", r.min(1))));
            v
        }));
    }
}

/// By default (`MCAST_HANDLE_TYPE=auto`) the simulator's ranks all support fabric handles.
#[test]
fn collectives_p2p_2_3_4_processes() {
    for n in [2, 3, 4] {
        all_ok(&spawn(n, "collectives", false, |_| expect("fabric")));
    }
}

#[test]
fn collectives_multicast_2_3_4_processes() {
    for n in [2, 3, 4] {
        all_ok(&spawn(n, "collectives", true, |_| expect("fabric")));
    }
}

#[test]
fn collectives_over_posix_descriptors_2_3_processes() {
    for multicast in MODES {
        for n in [2, 3] {
            all_ok(&spawn(n, "collectives", multicast, |_| {
                let mut v = expect("posix");
                v.push(("MCAST_HANDLE_TYPE", "posix".into()));
                v
            }));
        }
    }
}

/// The ranks agree on the LL kernels at creation: on (the simulator's default) where every
/// process has them on, off everywhere when one process sets `MCAST_LL=off` (else the ranks
/// would launch different kernels and wait for each other forever).
#[test]
fn the_ranks_agree_on_the_ll_kernels() {
    for off in [None, Some(1usize)] {
        all_ok(&spawn(3, "collectives", false, |r| {
            let mut v = expect("fabric");
            v.push((EXPECT_LL, if off.is_some() { "0" } else { "1" }.into()));
            if off == Some(r) {
                v.push(("MCAST_LL", "off".into()));
            }
            v
        }));
    }
}

/// The ranks agree on the copy-engine threshold at creation (each process reads its own
/// `MCAST_CE_MIN_BYTES`): the largest, or off when one rank has it off.
#[test]
fn the_ranks_agree_on_the_copy_engine_threshold() {
    for (thresholds, agreed) in [([1u64 << 20, 3 << 20, 2 << 20], 3u64 << 20), ([1 << 20, 0, 2 << 20], 0)] {
        all_ok(&spawn(3, "collectives", false, |r| {
            let mut v = expect("fabric");
            v.push(("MCAST_CE_MIN_BYTES", thresholds[r].to_string()));
            v.push((EXPECT_CE, agreed.to_string()));
            v
        }));
    }
}

/// The ranks agree on the device-API slots at creation (each process reads its own
/// `MCAST_DEVICE_SLOTS`): the largest any rank asks for, so every rank's layout is the same.
#[test]
fn the_ranks_agree_on_the_device_api_slots() {
    let asked = [300u32, 1000, 256];
    all_ok(&spawn(3, "collectives", false, |r| {
        let mut v = expect("fabric");
        v.push(("MCAST_DEVICE_SLOTS", asked[r].to_string()));
        v.push((EXPECT_SLOTS, "1000".to_string()));
        v
    }));
}
