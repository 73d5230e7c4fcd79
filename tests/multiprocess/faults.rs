//! A failure on one rank is every rank's: rules broken and driver faults on one rank,
//! handle-type fallback, out of memory retried together, a rank killed during setup or a
//! collective.

use super::*;

/// A rule broken on rank 1 only (memory not from cuMemCreate; a pointer off the multicast
/// granularity; host memory; a range overlapping a live registration): every rank gets the
/// same kind of error naming rank 1 and the rule, within the timeout, and nothing is left.
#[test]
fn register_rule_broken_on_one_rank() {
    for multicast in MODES {
        for n in [2, 3] {
            for case in ["plain", "host", "overlap"].into_iter().chain(multicast.then_some("misaligned")) {
                all_ok(&spawn(n, "register-errors", multicast, |_| vec![(CASE, case.to_string())]));
            }
        }
    }
}

/// A driver call of the registration failing on one rank (injected, not retryable): every rank
/// gets an error naming that rank within the timeout, and every rank's ledger is empty after
/// the memory is freed and the team destroyed (each step rolled back). Rank 0 alone creates the
/// multicast object, so that fault is injected there.
#[test]
fn register_fault_on_one_rank_rolls_back_everywhere() {
    let common = [
        "cuMemRetainAllocationHandle",
        "cuMemGetAllocationPropertiesFromHandle",
        "cuMemGetAddressRange",
        "cuMemExportToShareableHandle",
        "cuMemImportFromShareableHandle",
        "cuMemAddressReserve",
        "cuMemMap",
        "cuMemSetAccess",
    ];
    let multicast_only = ["cuMulticastCreate", "cuMulticastAddDevice", "cuMulticastBindAddr"];
    for multicast in MODES {
        let extra = if multicast { &multicast_only[..] } else { &[][..] };
        for func in common.iter().chain(extra) {
            for n in [2, 3] {
                let st = spawn(n, "register-fault", multicast, |_| vec![(CASE, func.to_string())]);
                for (r, s) in st.iter().enumerate() {
                    assert!(s.success(), "{func}, {n} ranks, multicast {multicast}: rank {r} failed: {s:?}");
                }
            }
        }
    }
}

/// One rank's device lacks fabric support: every rank falls back to POSIX descriptors.
#[test]
fn one_rank_without_fabric_falls_back_to_posix() {
    for multicast in MODES {
        for n in [2, 3] {
            all_ok(&spawn(n, "collectives", multicast, |r| {
                let mut v = expect("posix");
                if r == n - 1 {
                    v.push(("MCAST_SIM_FABRIC", "0".into()));
                }
                v
            }));
        }
    }
}

/// Fabric handles forced on every rank while rank 1 lacks them: a clean error on every rank.
#[test]
fn forced_fabric_without_support_fails_every_rank() {
    for multicast in MODES {
        all_ok(&spawn(3, "forced-fabric", multicast, |r| {
            let mut v = vec![("MCAST_HANDLE_TYPE", "fabric".to_string())];
            if r == 1 {
                v.push(("MCAST_SIM_FABRIC", "0".into()));
            }
            v
        }));
    }
}

#[test]
fn a_fault_on_one_rank_fails_every_rank() {
    // The third cuMemCreate of rank 1 (after the fabric probe and the first segment: the
    // buffer's segment) fails; every rank checks it got an error naming rank 1, and nothing
    // leaks.
    for multicast in MODES {
        all_ok(&spawn(3, "fault", multicast, |r| {
            if r == 1 {
                vec![("MCAST_SIM_FAULTS", "cuMemCreate=INVALID_VALUE@3".into())]
            } else {
                vec![]
            }
        }));
    }
}

#[test]
fn out_of_memory_on_one_rank_is_retried_together() {
    all_ok(&spawn(3, "oom", true, |r| {
        if r == 2 {
            vec![("MCAST_SIM_FAULTS", "cuMemCreate=OUT_OF_MEMORY@3x2".into())]
        } else {
            vec![]
        }
    }));
}

#[test]
fn a_rank_killed_mid_setup_gives_the_others_an_error() {
    for multicast in MODES {
        let st = spawn(3, "die-setup", multicast, |r| {
            if r == 2 {
                vec![("MCAST_SIM_FAULTS", "cuMemImportFromShareableHandle=PANIC@1".into())]
            } else {
                vec![]
            }
        });
        assert!(st[0].success() && st[1].success(), "{st:?}");
        assert!(!st[2].success(), "rank 2 was to die: {st:?}");
    }
}

#[test]
fn a_rank_killed_mid_collective_gives_the_others_a_timeout() {
    for multicast in MODES {
        let st = spawn(3, "die-collective", multicast, |_| vec![]);
        assert!(st[0].success() && st[1].success(), "{st:?}");
        assert!(!st[2].success(), "rank 2 was to die: {st:?}");
    }
}
