//! One process per rank on the simulator: the test re-runs its own binary as the ranks
//! (`MCAST_MP_CHILD` selects the role), over real processes, real file descriptors passed with
//! `SCM_RIGHTS` or the simulator's fabric handles (64 bytes naming a memfd of another process),
//! and the simulator's memfd-backed memory.

mod common;

use std::process::{Command, ExitStatus};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use mcast::bootstrap::new_unique_id;
use mcast::driver::{HandleTypes, Stream};
use mcast::kernels::{Collective, DType, RedOp};
use mcast::runtime::buffer::Buffer;
use mcast::runtime::collective::{run, run_into, run_ptr, synchronize};
use mcast::runtime::config::{Config, MulticastMode};
use mcast::runtime::context::Context;
use mcast::runtime::team::{Team, Transport};
use mcast::runtime::ErrorKind;
/// Transports under test: P2P, and MULTICAST (the simulator's cross-process multicast).
const MODES: [bool; 2] = [false, true];
const ROLE: &str = "MCAST_MP_CHILD";
/// The handle type a child expects its team to use: `fabric` or `posix`.
const EXPECT_HT: &str = "MCAST_MP_EXPECT_HANDLE_TYPE";
/// Whether a rank expects its team to run the LL kernels ("1", "0"); unset: not checked.
const EXPECT_LL: &str = "MCAST_MP_EXPECT_LL";
/// The copy-engine threshold a rank expects its team to have agreed on; unset: not checked.
const EXPECT_CE: &str = "MCAST_MP_EXPECT_CE";
const EXPECT_SLOTS: &str = "MCAST_MP_EXPECT_SLOTS";
/// Set: a killed peer must be reported within timeout_ms + 1 s.
const TIGHT: &str = "MCAST_MP_TIGHT";
/// The case a `register-errors` child runs.
const CASE: &str = "MCAST_MP_CASE";
/// What an `identity` rank uses and expects: `device;transport;blocks;reason` (the reason a
/// substring of the team's, `{uuid}` standing for this rank's GPU's UUID; empty: none).
const IDENTITY: &str = "MCAST_MP_IDENTITY";
/// What a `domains` rank uses and expects: `device;ok;domains;domain_size` or
/// `device;refused;substring|substring...` (NOT_SUPPORTED naming each).
const DOMAINS: &str = "MCAST_MP_DOMAINS";

/// Runs `n` ranks of `role`; `env(rank)` gives extra environment for a rank. Returns each
/// rank's exit status and how long the slowest took.
fn spawn(n: usize, role: &str, multicast: bool, env: impl Fn(usize) -> Vec<(&'static str, String)>) -> Vec<ExitStatus> {
    spawn_in(n, role, multicast, &new_unique_id().unwrap(), |_| Vec::new(), env)
}

/// [`spawn`] with a given id, each rank's command line prefixed by `wrap(rank)` (e.g. `ip netns
/// exec NAME`).
fn spawn_in(
    n: usize,
    role: &str,
    multicast: bool,
    id: &[u8],
    wrap: impl Fn(usize) -> Vec<String>,
    env: impl Fn(usize) -> Vec<(&'static str, String)>,
) -> Vec<ExitStatus> {
    let id = hex(id);
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..n)
        .map(|r| {
            let prefix = wrap(r);
            let mut c = match prefix.split_first() {
                Some((first, rest)) => {
                    let mut c = Command::new(first);
                    c.args(rest).arg(&exe);
                    c
                }
                None => Command::new(&exe),
            };
            c.args(["--exact", "child", "--nocapture", "--test-threads=1"])
                .env(ROLE, format!("{role}:{n}:{r}:{}:{id}", u8::from(multicast)))
                .env_remove("MCAST_SIM_FAULTS")
                .env_remove("MCAST_HANDLE_TYPE")
                .env_remove("MCAST_SIM_FABRIC")
                .env_remove("MCAST_LL")
                .env_remove(EXPECT_LL)
                .env_remove("MCAST_CE_MIN_BYTES")
                .env_remove(EXPECT_CE)
                .env_remove("MCAST_DEVICE_SLOTS")
                .env_remove(EXPECT_SLOTS)
                .env_remove(EXPECT_HT)
                .env_remove("MCAST_HOST_ID")
                .env_remove("MCAST_BOOTSTRAP_ADDR")
                .env_remove("MCAST_BOOTSTRAP_SECRET")
                .env_remove("CUDA_VISIBLE_DEVICES")
                .env_remove(IDENTITY)
                .env_remove(DOMAINS)
                .env_remove("MCAST_SIM_IMEX")
                .env_remove("MCAST_DOMAIN")
                .env_remove("MCAST_MNNVL")
                .env_remove(TIGHT);
            for (k, v) in env(r) {
                c.env(k, v);
            }
            c.spawn().unwrap()
        })
        .collect();
    children.into_iter().map(|mut c| c.wait().unwrap()).collect()
}

fn all_ok(st: &[ExitStatus]) {
    for (r, s) in st.iter().enumerate() {
        assert!(s.success(), "rank {r} failed: {s:?}");
    }
}

fn expect(ht: &str) -> Vec<(&'static str, String)> {
    vec![(EXPECT_HT, ht.into())]
}

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

/// `CUDA_VISIBLE_DEVICES` set per process (SLURM `--gpus-per-task=1`, Kubernetes): rank `r`'s
/// env gives its `CUDA_VISIBLE_DEVICES`, device ordinal and expectations (see [`IDENTITY`]).
fn identity(n: usize, per_rank: impl Fn(usize) -> (String, Option<String>, &'static str)) -> Vec<ExitStatus> {
    spawn(n, "identity", false, |r| {
        let (visible, host, expect) = per_rank(r);
        let mut v = vec![("CUDA_VISIBLE_DEVICES", visible), (IDENTITY, expect.to_string())];
        if let Some(h) = host {
            v.push(("MCAST_HOST_ID", h));
        }
        v
    })
}

/// One visible GPU per process, each calling it device 0: distinct GPUs, so the team gets the
/// transport and grid of one process holding all of them (MULTICAST, every SM: 132 blocks),
/// and the collectives are right. Before UUIDs, this was "device 0 appears more than once",
/// P2P and 132 / N blocks.
#[test]
fn one_visible_gpu_per_process_is_one_process_holding_them_all() {
    for n in [2, 3] {
        all_ok(&identity(n, |r| (r.to_string(), None, "0;multicast;132;;collectives")));
    }
    // On two simulated hosts, the GPU each calls device 0 is another GPU too.
    all_ok(&identity(2, |r| ("0".into(), Some(format!("host{r}")), "0;multicast;132;")));
}

/// Two processes given the same GPU (`CUDA_VISIBLE_DEVICES=1` each): P2P with a reason naming
/// the shared GPU, and the SMs shared out between its two ranks (66 blocks each).
#[test]
fn processes_given_the_same_gpu_share_it() {
    all_ok(&identity(2, |_| ("1".into(), None, "0;p2p;66;device 0 appears more than once (ranks 0 and 1, {uuid})")));
}

/// Each process sees only its own GPU, so peer access is left to importing and mapping the
/// peer's memory; when that fails (an injected `CUDA_ERROR_INVALID_VALUE` on rank 1's import)
/// the team is NOT_SUPPORTED on every rank, "no peer access" naming the GPUs, promptly, with
/// nothing left behind.
#[test]
fn a_peer_gpu_that_does_not_map_is_no_peer_access() {
    all_ok(&spawn(2, "identity-no-access", false, |r| {
        let mut v = vec![("CUDA_VISIBLE_DEVICES", r.to_string())];
        if r == 1 {
            v.push(("MCAST_SIM_FAULTS", "cuMemImportFromShareableHandle=INVALID_VALUE@1".into()));
        }
        v
    }));
}

/// Permuted lists (`0,1` in one process, `1,0` in the other): the same ordinal is another GPU,
/// another ordinal the same GPU; decided by UUID either way.
#[test]
fn permuted_visible_lists_are_decided_by_uuid() {
    let lists = ["0,1", "1,0"];
    // Device 0 in each: GPUs 0 and 1, distinct.
    all_ok(&identity(2, |r| (lists[r].into(), None, "0;multicast;132;")));
    // Device 1 in rank 0 and device 0 in rank 1: both GPU 1.
    all_ok(&identity(2, |r| {
        let expect = ["1;p2p;66;ranks 0 and 1 are on one GPU ({uuid}: device 1 and device 0", "0;p2p;66;{uuid}"][r];
        (lists[r].into(), None, expect)
    }));
}

/// Ranks on simulated hosts (`host{r / per_host}`), device `r % per_host`, each with extra
/// environment, expecting `expect` (see [`DOMAINS`]).
fn domains(
    n: usize,
    per_host: usize,
    expect: &str,
    extra: impl Fn(usize) -> Vec<(&'static str, String)>,
) -> Vec<ExitStatus> {
    spawn(n, "domains", false, |r| {
        let mut v =
            vec![("MCAST_HOST_ID", format!("host{}", r / per_host)), (DOMAINS, format!("{};{expect}", r % per_host))];
        v.extend(extra(r));
        v
    })
}

/// 2 to 8 processes on simulated hosts of one NVLink fabric (the default): the trial FABRIC
/// handles import everywhere, so the team is one domain of every rank.
#[test]
fn hosts_of_one_fabric_are_one_domain() {
    all_ok(&domains(2, 1, "ok;1;2", |_| vec![]));
    all_ok(&domains(4, 2, "ok;1;4", |_| vec![]));
    all_ok(&domains(8, 2, "ok;1;8", |_| vec![]));
}

/// Two fabrics (`MCAST_SIM_FABRIC` per host), or no IMEX channel on one host, or fabric
/// information ignored (`MCAST_MNNVL=off`): one domain per host, and a team over several
/// domains is NOT_SUPPORTED on every rank naming the domains (the engine between domains is
/// the next issue's).
#[test]
fn several_domains_are_refused_naming_them() {
    all_ok(&domains(4, 2, "refused;2 NVLink domains|host host0 (ranks 0, 1)|host host1 (ranks 2, 3)", |r| {
        vec![("MCAST_SIM_FABRIC", format!("rack{}", r / 2))]
    }));
    all_ok(&domains(
        2,
        1,
        "refused;2 NVLink domains|rank 1 on host host1|CUDA_ERROR_NOT_PERMITTED|no usable IMEX channel?",
        |r| {
            if r == 1 {
                vec![("MCAST_SIM_IMEX", "0".into())]
            } else {
                vec![]
            }
        },
    ));
    all_ok(&domains(2, 1, "refused;2 NVLink domains|MCAST_MNNVL=off", |_| vec![("MCAST_MNNVL", "off".into())]));
}

/// One fabric by NVML, but a FABRIC handle does not import between the hosts (injected
/// `CUDA_ERROR_INVALID_HANDLE` on rank 2's import, as torchcomms#3516 saw): the candidate
/// domain splits by host, with the reason in the message; the handshake never fails the team
/// by itself, so the error is the domains'.
#[test]
fn a_failed_handshake_splits_the_fabric_by_host() {
    let expect =
        "refused;host host0 (ranks 0, 1), host host1 (ranks 2, 3)|rank 2 cannot import rank 0's fabric handle|\
                  CUDA_ERROR_INVALID_HANDLE";
    all_ok(&domains(4, 2, expect, |r| {
        if r == 2 {
            vec![("MCAST_SIM_FAULTS", "cuMemImportFromShareableHandle=INVALID_HANDLE@1".into())]
        } else {
            vec![]
        }
    }));
}

/// `MCAST_DOMAIN` puts ranks with equal labels in one domain and no others: four processes of
/// one host labelled A, A, B, B are two domains; labels equal everywhere make one, even across
/// hosts without fabric handles between them.
#[test]
fn the_domain_label_overrides() {
    let ab = |r: usize| vec![("MCAST_DOMAIN", ["A", "A", "B", "B"][r].to_string())];
    all_ok(&domains(4, 4, "refused;MCAST_DOMAIN=A (ranks 0, 1)|MCAST_DOMAIN=B (ranks 2, 3)", ab));
    all_ok(&domains(4, 4, "ok;1;4", |_| vec![("MCAST_DOMAIN", "all".into())]));
    // Two hosts whose fabric information is ignored (two domains by themselves), one label.
    all_ok(&domains(2, 1, "ok;1;2", |_| vec![("MCAST_DOMAIN", "x".into()), ("MCAST_MNNVL", "off".into())]));
}

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

/// Two simulated hosts of two ranks each (`MCAST_HOST_ID`): descriptors cannot cross hosts
/// (the simulator refuses them), so the team shares memory through fabric handles, and every
/// collective is checked on both transports, with a clean teardown and an empty ledger.
#[test]
fn collectives_across_two_hosts_of_two_ranks() {
    for multicast in MODES {
        all_ok(&spawn(4, "collectives", multicast, |r| {
            let mut v = expect("fabric");
            v.push(("MCAST_HOST_ID", format!("host{}", r / 2)));
            v
        }));
    }
}

/// `MCAST_HANDLE_TYPE=posix` across hosts: `NOT_SUPPORTED` on every rank, naming the rank and
/// its host.
#[test]
fn posix_descriptors_across_hosts_are_not_supported() {
    all_ok(&spawn(3, "cross-host-posix", false, |r| {
        vec![("MCAST_HOST_ID", format!("host{}", r.min(1))), ("MCAST_HANDLE_TYPE", "posix".into())]
    }));
}

/// A rank on the second host cannot use fabric handles (no IMEX channel on a real system):
/// `NOT_SUPPORTED` on every rank naming rank, host and reason.
#[test]
fn no_fabric_handles_across_hosts_is_not_supported() {
    for multicast in MODES {
        all_ok(&spawn(2, "cross-host-no-fabric", multicast, |r| {
            let mut v = vec![("MCAST_HOST_ID", format!("host{r}"))];
            if r == 1 {
                v.push(("MCAST_SIM_FABRIC", "0".into()));
            }
            v
        }));
    }
}

/// A peer killed during setup and during a collective, the team on two hosts: the others get
/// `TIMEOUT` (or the clean stale-handle error) within `timeout_ms` + 1 s, with an empty ledger.
#[test]
fn a_rank_killed_on_another_host_during_setup_and_collective() {
    for multicast in MODES {
        let hosts = |r: usize| vec![("MCAST_HOST_ID", format!("host{}", r / 2)), (TIGHT, "1".into())];
        let st = spawn(3, "die-setup", multicast, |r| {
            let mut v = hosts(r);
            if r == 2 {
                v.push(("MCAST_SIM_FAULTS", "cuMemImportFromShareableHandle=PANIC@1".into()));
            }
            v
        });
        assert!(st[0].success() && st[1].success(), "{st:?}");
        assert!(!st[2].success(), "rank 2 was to die: {st:?}");
        let st = spawn(3, "die-collective", multicast, hosts);
        assert!(st[0].success() && st[1].success(), "{st:?}");
        assert!(!st[2].success(), "rank 2 was to die: {st:?}");
    }
}

/// Two network namespaces joined by a veth pair, created here and deleted on every path.
struct Netns {
    names: [String; 2],
}

impl Netns {
    fn ip(args: &[&str]) -> bool {
        Command::new("ip").args(args).status().is_ok_and(|s| s.success())
    }

    /// `None` (with the reason) where this process lacks the privilege or the `ip` tool.
    fn create(tag: &str) -> Result<Netns, String> {
        let pid = std::process::id() % 100_000;
        let ns = Netns { names: [format!("mcast-{tag}-{pid}-a"), format!("mcast-{tag}-{pid}-b")] };
        let (va, vb) = (format!("mc{pid}{tag}a"), format!("mc{pid}{tag}b"));
        let (a, b) = (ns.names[0].as_str(), ns.names[1].as_str());
        if !Self::ip(&["netns", "add", a]) {
            return Err("cannot create a network namespace (needs root / CAP_SYS_ADMIN and iproute2)".into());
        }
        let x = pid % 200 + 20;
        let ok = Self::ip(&["netns", "add", b])
            && Self::ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])
            && Self::ip(&["link", "set", &va, "netns", a])
            && Self::ip(&["link", "set", &vb, "netns", b])
            && Self::ip(&["-n", a, "addr", "add", &format!("10.213.{x}.1/24"), "dev", &va])
            && Self::ip(&["-n", b, "addr", "add", &format!("10.213.{x}.2/24"), "dev", &vb])
            && Self::ip(&["-n", a, "addr", "add", &format!("fd6d:6373:{x}::1/64"), "dev", &va, "nodad"])
            && Self::ip(&["-n", b, "addr", "add", &format!("fd6d:6373:{x}::2/64"), "dev", &vb, "nodad"])
            && Self::ip(&["-n", a, "link", "set", &va, "up"])
            && Self::ip(&["-n", b, "link", "set", &vb, "up"])
            && Self::ip(&["-n", a, "link", "set", "lo", "up"])
            && Self::ip(&["-n", b, "link", "set", "lo", "up"]);
        if !ok {
            return Err("cannot create and address the veth pair".into());
        }
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end in it, and so the pair.
        for n in &self.names {
            Netns::ip(&["netns", "del", n]);
        }
    }
}

/// Two processes in different network namespaces joined by a veth pair: different hosts by
/// identity (netns inode), TCP over the veth (IPv4, then IPv6), interface chosen with
/// `MCAST_SOCKET_IFNAME`, rank 0 listening at the id's address; every collective checked.
#[test]
fn two_network_namespaces_over_a_veth_pair() {
    let ns = match Netns::create("t") {
        Ok(ns) => ns,
        Err(why) => {
            assert!(std::env::var_os("CI").is_none(), "CI runs as root: the namespace test must run there: {why}");
            eprintln!("SKIPPED two_network_namespaces_over_a_veth_pair: {why}");
            return;
        }
    };
    let pid = std::process::id() % 100_000;
    let x = pid % 200 + 20;
    for addr in [format!("10.213.{x}.1:29517"), format!("[fd6d:6373:{x}::1]:29518")] {
        let id = mcast::bootstrap::UniqueId { addr: addr.parse().unwrap(), secret: [0x5a; 32], rank0_listens: true };
        for multicast in MODES {
            let st = spawn_in(
                2,
                "collectives",
                multicast,
                &id.encode(),
                |r| vec!["ip".into(), "netns".into(), "exec".into(), ns.names[r].clone()],
                |r| {
                    let mut v = expect("fabric");
                    v.push(("MCAST_SOCKET_IFNAME", format!("mc{pid}t{}", if r == 0 { 'a' } else { 'b' })));
                    v
                },
            );
            all_ok(&st);
        }
    }
}

/// torchrun-style: no id is moved; every process exports the same `MCAST_BOOTSTRAP_ADDR` and
/// `MCAST_BOOTSTRAP_SECRET` and makes the id itself; rank 0 listens there.
#[test]
fn every_process_makes_the_id_from_the_environment() {
    let addr = free_loopback_addr();
    all_ok(&spawn(3, "env-id", false, |_| {
        let mut v = expect("fabric");
        v.extend(env_mode(&addr, Some(GOOD_SECRET)));
        v
    }));
}

/// A secret of 32 hex digits (128 bits), as `openssl rand -hex 16` prints.
const GOOD_SECRET: &str = "3f2a9c04d1e87b6650c3aa19e2f4d7b8";
/// How long a delayed rank sleeps before it joins (`MCAST_MP_DELAY_MS`).
const DELAY: &str = "MCAST_MP_DELAY_MS";

/// A loopback address with a port no one listened on a moment ago.
fn free_loopback_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// Env mode's variables: `MCAST_BOOTSTRAP_ADDR`, and `MCAST_BOOTSTRAP_SECRET` when given.
fn env_mode(addr: &str, secret: Option<&str>) -> Vec<(&'static str, String)> {
    let mut v = vec![("MCAST_BOOTSTRAP_ADDR", addr.to_string())];
    if let Some(s) = secret {
        v.push(("MCAST_BOOTSTRAP_SECRET", s.to_string()));
    }
    v
}

/// Env mode without a secret, with a short one or one that is not hex: `mcast_get_unique_id`
/// (`new_unique_id`) and the init of an env-mode id are refused at once with
/// INVALID_ARGUMENT naming `MCAST_BOOTSTRAP_SECRET`.
#[test]
fn env_mode_without_a_good_secret_is_refused() {
    for secret in [None, Some("job-4711"), Some("3f2a9c04d1e87b6650c3aa19e2f4d7b")] {
        let addr = free_loopback_addr();
        let st = spawn_in(2, "env-refused", false, &[0; 128], |_| Vec::new(), |_| env_mode(&addr, secret));
        for (r, s) in st.iter().enumerate() {
            assert!(s.success(), "secret {secret:?}: rank {r} failed: {s:?}");
        }
    }
}

/// Issue 24: with `MCAST_BOOTSTRAP_ADDR` set and no secret, a stranger who knew only the
/// address derived the id's secret (a hash of the address), passed the handshake and joined as
/// rank 1. The stranger here forges that id and tries to join as rank 1 while the real rank 1
/// is late; it must fail, and with a good secret the team forms without it.
#[test]
fn a_stranger_who_knows_only_the_address_cannot_join_an_env_mode_team() {
    use mcast::bootstrap::{Bootstrap, UniqueId};
    use sha2::{Digest, Sha256};
    for secret in [None, Some(GOOD_SECRET)] {
        let addr = free_loopback_addr();
        // The secret every process used to derive from the address alone.
        let mut h = Sha256::new();
        h.update(b"mcast bootstrap secret\0");
        h.update(addr.as_bytes());
        h.update(b"\0");
        let forged = UniqueId { addr: addr.parse().unwrap(), secret: h.finalize().into(), rank0_listens: true };
        let stranger = std::thread::spawn(move || {
            Bootstrap::init_id(&forged.encode(), 2, 1, 72, 3000, "stranger".into()).map(|_| ())
        });
        let st = spawn_in(
            2,
            "env-join",
            false,
            &[0; 128],
            |_| Vec::new(),
            |r| {
                let mut v = env_mode(&addr, secret);
                if r == 1 {
                    v.push((DELAY, "1500".into()));
                }
                v
            },
        );
        let joined = stranger.join().unwrap();
        let e = joined.err().unwrap_or_else(|| panic!("secret {secret:?}: the stranger joined the team as rank 1"));
        if secret.is_some() {
            // It reached rank 0's listener and was refused in the handshake.
            assert!(e.message.contains("handshake"), "{}", e.message);
        }
        for (r, s) in st.iter().enumerate() {
            assert!(s.success(), "secret {secret:?}: rank {r} failed: {s:?}");
        }
    }
}

/// Issue 24: a split under env mode made every color's id from the environment, so every color
/// met at the same address with the same secret (color 1's root failed with EADDRINUSE, its
/// ranks joined color 0's team). Split ids are fresh root-mode ids: with colors {0,0,1,1} each
/// new team holds exactly its two ranks and sums only their values.
#[test]
fn split_under_env_mode_gives_each_color_its_own_team() {
    let addr = free_loopback_addr();
    all_ok(&spawn_in(4, "env-split", false, &[0; 128], |_| Vec::new(), |_| env_mode(&addr, Some(GOOD_SECRET))));
}

/// Team formation time of multi-process teams (reported with --nocapture).
#[test]
fn team_formation_time_of_processes() {
    for n in [2, 4, 8] {
        let t = Instant::now();
        all_ok(&spawn(n, "form", false, |r| vec![("MCAST_HOST_ID", format!("host{}", r % 2))]));
        eprintln!("{n} processes on 2 simulated hosts: spawn + init_rank + destroy in {:?}", t.elapsed());
    }
}

// ---- the ranks ----

const TIMEOUT_MS: u32 = 3000;

fn context(multicast: bool) -> Arc<Context> {
    let config = Config {
        multicast: if multicast { MulticastMode::Require } else { MulticastMode::Off },
        retry_backoff_ms: 1,
        // The children see only what a test gave them (`CUDA_VISIBLE_DEVICES` is cleared for the
        // others), never the caller's kill switches.
        sim_host_env: Some(
            std::env::var("CUDA_VISIBLE_DEVICES")
                .map(|v| vec![("CUDA_VISIBLE_DEVICES".to_string(), v)])
                .unwrap_or_default(),
        ),
        ..sim_runtime(multicast, 4, TIMEOUT_MS)
    }
    // The handle type and the simulated fabric support come from the environment.
    .with_env(|name| match name {
        "MCAST_HANDLE_TYPE" | "MCAST_SIM_FABRIC" | "MCAST_LL" | "MCAST_CE_MIN_BYTES" | "MCAST_SIM_IMEX"
        | "MCAST_DOMAIN" | "MCAST_MNNVL" | "MCAST_DEVICE_SLOTS" => std::env::var(name).ok(),
        _ => None,
    });
    Arc::new(Context::new(config).unwrap())
}

/// Small integers: exact in every dtype and order.
fn value(r: usize, i: usize) -> f64 {
    ((r * 7 + i * 3) % 17) as f64 - 8.0
}

fn input(d: DType, r: usize, count: usize) -> Vec<f64> {
    (0..count).map(|i| if matches!(d, DType::U32 | DType::U64) { value(r, i).abs() } else { value(r, i) }).collect()
}

fn bytes(d: DType, xs: &[f64]) -> Vec<u8> {
    xs.iter().flat_map(|&v| encode(d, v)).collect()
}

fn check_collectives(team: &Arc<Team>, n: usize, r: usize) {
    let rank = r as i32;
    let s = Stream::DEFAULT;
    let buf = Buffer::alloc(team, 3 * MIB).unwrap();
    // All-reduce, every dtype and op, a small and a large count.
    for d in DType::ALL {
        for op in RedOp::ALL {
            for count in [5usize, 70_001] {
                buf.write(rank, 0, &bytes(d, &input(d, r, count))).unwrap();
                run(&buf, rank, 0, count, Collective::AllReduce { dtype: d, op }, s).unwrap();
                synchronize(team, rank, s).unwrap();
                let inputs: Vec<Vec<f64>> = (0..n).map(|q| input(d, q, count)).collect();
                let want: Vec<f64> =
                    (0..count).map(|i| reduce(op, &inputs.iter().map(|x| x[i]).collect::<Vec<_>>())).collect();
                let mut got = vec![0u8; count * d.size()];
                buf.read(rank, 0, &mut got).unwrap();
                assert_eq!(got, bytes(d, &want), "all-reduce {d:?} {op:?} count {count} on rank {r} of {n}");
            }
        }
    }
    // Reduce-scatter.
    let (d, count) = (DType::I32, 1001usize);
    buf.write(rank, 0, &bytes(d, &input(d, r, n * count))).unwrap();
    run(&buf, rank, 0, count, Collective::ReduceScatter { dtype: d, op: RedOp::Sum }, s).unwrap();
    synchronize(team, rank, s).unwrap();
    let inputs: Vec<Vec<f64>> = (0..n).map(|q| input(d, q, n * count)).collect();
    let want: Vec<f64> = (r * count..(r + 1) * count).map(|i| inputs.iter().map(|x| x[i]).sum()).collect();
    let mut got = vec![0u8; count * 4];
    buf.read(rank, r * count * 4, &mut got).unwrap();
    assert_eq!(got, bytes(d, &want), "reduce-scatter on rank {r}");
    // Broadcast from the last rank, and all-gather.
    let block = 4099usize;
    let mine: Vec<u8> = (0..n * block).map(|i| (i * 31 + r * 7) as u8).collect();
    buf.write(rank, 0, &mine).unwrap();
    let root = n - 1;
    run(&buf, rank, 0, block, Collective::Broadcast { root: root as u32 }, s).unwrap();
    synchronize(team, rank, s).unwrap();
    let mut got = vec![0u8; block];
    buf.read(rank, 0, &mut got).unwrap();
    let want: Vec<u8> = (0..block).map(|i| (i * 31 + root * 7) as u8).collect();
    assert_eq!(got, want, "broadcast on rank {r}");
    buf.write(rank, 0, &mine).unwrap();
    run(&buf, rank, 0, block, Collective::AllGather, s).unwrap();
    synchronize(team, rank, s).unwrap();
    let mut got = vec![0u8; n * block];
    buf.read(rank, 0, &mut got).unwrap();
    let want: Vec<u8> = (0..n * block).map(|i| (i * 31 + (i / block) * 7) as u8).collect();
    assert_eq!(got, want, "all-gather on rank {r}");
    buf.free().unwrap();
}

/// A one-element i32 sum over `team` from `rank`'s `value`.
fn all_reduce_i32(team: &Arc<Team>, rank: i32, value: i32) -> i32 {
    let s = Stream::DEFAULT;
    let buf = Buffer::alloc(team, 4096).unwrap();
    buf.write(rank, 0, &value.to_ne_bytes()).unwrap();
    run(&buf, rank, 0, 1, Collective::AllReduce { dtype: DType::I32, op: RedOp::Sum }, s).unwrap();
    synchronize(team, rank, s).unwrap();
    let mut got = [0u8; 4];
    buf.read(rank, 0, &mut got).unwrap();
    buf.free().unwrap();
    i32::from_ne_bytes(got)
}

#[test]
fn child() {
    let Ok(spec) = std::env::var(ROLE) else { return };
    let f: Vec<&str> = spec.split(':').collect();
    let (role, n, r, multicast, id) =
        (f[0], f[1].parse::<usize>().unwrap(), f[2].parse::<usize>().unwrap(), f[3] == "1", unhex(f[4]));
    let rank = r as i32;
    let ctx = context(multicast);
    let start = Instant::now();
    let bound = if std::env::var_os(TIGHT).is_some() {
        Duration::from_millis(u64::from(TIMEOUT_MS) + 1000)
    } else {
        Duration::from_millis(u64::from(TIMEOUT_MS) * 2 + 2000)
    };
    match role {
        "collectives" => {
            let team = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).unwrap();
            let want = if multicast { Transport::Multicast } else { Transport::P2P };
            assert_eq!(team.transport(), want);
            match std::env::var(EXPECT_HT).as_deref() {
                Ok("fabric") => assert_eq!(team.handle_type(), HandleTypes::FABRIC, "rank {r}"),
                Ok("posix") => assert_eq!(team.handle_type(), HandleTypes::POSIX_FD, "rank {r}"),
                other => panic!("rank {r}: no expected handle type ({other:?})"),
            }
            if let Ok(ll) = std::env::var(EXPECT_LL) {
                assert_eq!(team.ll(), ll == "1", "rank {r}: LL");
            }
            if let Ok(ce) = std::env::var(EXPECT_CE) {
                assert_eq!(team.ce_min_bytes().to_string(), ce, "rank {r}: copy-engine threshold");
            }
            if let Ok(slots) = std::env::var(EXPECT_SLOTS) {
                assert_eq!(team.device_slots().to_string(), slots, "rank {r}: device-API slots");
                let v = mcast::runtime::device_api::team_view(&team, r as i32).unwrap();
                assert_eq!(v.nslots.to_string(), slots, "rank {r}: the handle's slots");
            }
            // Ranks of other processes are refused.
            let other = ((r + 1) % n) as i32;
            let b = Buffer::alloc(&team, 1000).unwrap();
            assert_eq!(b.local_ptr(other).unwrap_err().kind, ErrorKind::InvalidArgument);
            assert_eq!(synchronize(&team, other, Stream::DEFAULT).unwrap_err().kind, ErrorKind::InvalidArgument);
            assert!(b.peer_ptr(rank, other).is_ok());
            b.free().unwrap();
            check_collectives(&team, n, r);
            team.destroy().unwrap();
        }
        "identity" => {
            let spec = std::env::var(IDENTITY).unwrap();
            let f: Vec<&str> = spec.split(';').collect();
            let dev: i32 = f[0].parse().unwrap();
            // AUTO: the team's own facts decide the transport.
            let auto = Config { multicast: MulticastMode::Auto, ..ctx.config().clone() };
            let ctx = Arc::new(Context::new(auto).unwrap());
            let team = Team::init_rank(&ctx, &id, n as i32, rank, dev).unwrap();
            let info = team.info();
            let want = if f[1] == "multicast" { Transport::Multicast } else { Transport::P2P };
            assert_eq!(team.transport(), want, "rank {r}: {}", info.transport_reason);
            assert_eq!(team.max_blocks().to_string(), f[2], "rank {r}: grid cap");
            let uuid = mcast::driver::uuid_string(&ctx.props(dev).unwrap().uuid);
            let reason = f[3].replace("{uuid}", &uuid);
            assert!(info.transport_reason.contains(&reason), "rank {r}: {:?} lacks {reason:?}", info.transport_reason);
            if f.get(4) == Some(&"collectives") {
                check_collectives(&team, n, r);
            }
            team.destroy().unwrap();
            assert!(ctx.driver().as_sim().unwrap().ledger().is_empty());
        }
        "domains" => {
            let spec = std::env::var(DOMAINS).unwrap();
            let f: Vec<&str> = spec.split(';').collect();
            let dev: i32 = f[0].parse().unwrap();
            match f[1] {
                "ok" => {
                    let team = Team::init_rank(&ctx, &id, n as i32, rank, dev).unwrap();
                    let info = team.info();
                    assert_eq!((info.domains.to_string(), info.domain_size.to_string()), (f[2].into(), f[3].into()));
                    assert_eq!(info.net_engine, "");
                    team.destroy().unwrap();
                }
                _ => {
                    let e = Team::init_rank(&ctx, &id, n as i32, rank, dev).err().expect("several domains");
                    assert_eq!(e.kind, ErrorKind::NotSupported, "rank {r}: {}", e.message);
                    for want in f[2].split('|') {
                        assert!(e.message.contains(want), "rank {r}: {:?} lacks {want:?}", e.message);
                    }
                    assert!(start.elapsed() < bound);
                }
            }
            assert!(ctx.driver().as_sim().unwrap().ledger().is_empty(), "rank {r}");
        }
        "identity-no-access" => {
            // P2P (multicast off): the import that fails is of the peer's memory.
            let e = Team::init_rank(&ctx, &id, n as i32, rank, 0).err().expect("no peer access");
            assert_eq!(e.kind, ErrorKind::NotSupported, "rank {r}: {}", e.message);
            let other = ctx.props(0).unwrap().uuid;
            assert!(e.message.contains("no peer access"), "rank {r}: {}", e.message);
            assert!(e.message.contains(&mcast::driver::uuid_string(&other)), "rank {r}: {}", e.message);
            assert!(start.elapsed() < bound);
            assert!(ctx.driver().as_sim().unwrap().ledger().is_empty(), "rank {r}");
        }
        "fault" => {
            let team = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).unwrap();
            let e = Buffer::alloc(&team, 4 * MIB).err().expect("the buffer fails on every rank");
            assert!(e.message.contains("rank 1"), "rank {r}: {}", e.message);
            assert!(start.elapsed() < bound);
            team.destroy().unwrap();
        }
        "forced-fabric" => {
            let e = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).err().expect("setup fails");
            assert_eq!(e.kind, ErrorKind::NotSupported, "rank {r}: {}", e.message);
            assert!(e.message.contains("rank 1") && e.message.contains("fabric"), "rank {r}: {}", e.message);
            assert!(start.elapsed() < bound);
        }
        "cross-host-posix" | "cross-host-no-fabric" => {
            let e = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).err().expect("setup fails");
            assert_eq!(e.kind, ErrorKind::NotSupported, "rank {r}: {}", e.message);
            let why = if role == "cross-host-posix" { "MCAST_HANDLE_TYPE=posix" } else { "fabric handle support" };
            assert!(e.message.contains("host1") && e.message.contains(why), "rank {r}: {}", e.message);
            assert!(e.message.contains(if role == "cross-host-posix" { "rank 0" } else { "rank 1" }), "{}", e.message);
            assert!(start.elapsed() < bound);
        }
        "env-refused" => {
            let e = new_unique_id().expect_err("an id was made without a good secret");
            assert_eq!(e.kind, mcast::bootstrap::Kind::InvalidArgument, "rank {r}: {}", e.message);
            assert!(e.message.contains("MCAST_BOOTSTRAP_SECRET"), "rank {r}: {}", e.message);
            // An env-mode id (made elsewhere) is not joined from this environment either.
            let addr = std::env::var("MCAST_BOOTSTRAP_ADDR").unwrap();
            let id = mcast::bootstrap::UniqueId { addr: addr.parse().unwrap(), secret: [7; 32], rank0_listens: true };
            let e = Team::init_rank(&ctx, &id.encode(), n as i32, rank, r as i32).err().expect("init must fail");
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "rank {r}: {}", e.message);
            assert!(e.message.contains("MCAST_BOOTSTRAP_SECRET"), "rank {r}: {}", e.message);
            assert!(start.elapsed() < Duration::from_secs(2), "rank {r} took {:?}", start.elapsed());
        }
        "env-join" => {
            if let Ok(ms) = std::env::var(DELAY) {
                std::thread::sleep(Duration::from_millis(ms.parse().unwrap()));
            }
            // As a job would: form the team with whatever id the environment gives.
            let made = new_unique_id();
            if let Ok(id) = &made {
                let team = Team::init_rank(&ctx, id, n as i32, rank, r as i32).unwrap();
                assert_eq!(team.size(), n);
                assert_eq!(all_reduce_i32(&team, rank, 1 << r), (1 << n) - 1, "rank {r}: a stranger's value?");
                team.destroy().unwrap();
            }
            match (made, std::env::var_os("MCAST_BOOTSTRAP_SECRET")) {
                (Ok(_), Some(_)) => {}
                (Ok(_), None) => panic!("rank {r}: an id was made without a secret"),
                (Err(e), secret) => {
                    assert!(secret.is_none(), "rank {r}: {}", e.message);
                    assert!(e.message.contains("MCAST_BOOTSTRAP_SECRET"), "rank {r}: {}", e.message);
                }
            }
        }
        "env-split" => {
            let team = Team::init_rank(&ctx, &new_unique_id().unwrap(), n as i32, rank, r as i32).unwrap();
            let color = (r / 2) as i32;
            let made = team.split(&[color], &[rank]).unwrap();
            let [Some(sub)] = &made[..] else { panic!("rank {r}: no team for color {color}") };
            assert_eq!(sub.size(), 2, "rank {r}: the team of color {color}");
            let new_rank = sub.local_rank().unwrap();
            assert_eq!(new_rank, r % 2, "rank {r}");
            // Each rank contributes 1 << its old rank: the sum names the members.
            let want = (1 << (2 * color)) | (1 << (2 * color + 1));
            assert_eq!(all_reduce_i32(sub, new_rank as i32, 1 << r), want, "rank {r}: color {color}'s sum");
            sub.destroy().unwrap();
            // The parent team is intact.
            assert_eq!(all_reduce_i32(&team, rank, 1 << r), (1 << n) - 1, "rank {r}: the parent's sum");
            team.destroy().unwrap();
        }
        "env-id" => {
            let mine = new_unique_id().unwrap();
            assert_eq!(mine, new_unique_id().unwrap(), "the id is a function of the environment");
            let team = Team::init_rank(&ctx, &mine, n as i32, rank, r as i32).unwrap();
            check_collectives(&team, n, r);
            team.destroy().unwrap();
        }
        "form" => {
            let team = Team::init_rank(&ctx, &id, n as i32, rank, (r % 4) as i32).unwrap();
            team.destroy().unwrap();
        }
        "oom" => {
            let team = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).unwrap();
            let b = Buffer::alloc(&team, 4 * MIB).unwrap();
            b.free().unwrap();
            team.destroy().unwrap();
        }
        "die-setup" => {
            if r == 2 {
                // A hard death: no unwinding, no cleanup.
                std::panic::set_hook(Box::new(|_| std::process::abort()));
            }
            let e = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).err().expect("setup fails");
            // With fabric handles a rank may open rank 2's memory after rank 2 died: the handle
            // is stale, which is a clean error of its own instead of the timeout.
            let stale = e.message.contains("importing rank 2's memory");
            assert!(e.kind == ErrorKind::Timeout || stale, "rank {r}: {:?} {}", e.kind, e.message);
            assert!(start.elapsed() < bound, "rank {r} took {:?}", start.elapsed());
        }
        "die-collective" => {
            let team = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).unwrap();
            let buf = Buffer::alloc(&team, 4096).unwrap();
            if r == 2 {
                std::process::abort();
            }
            let t = Instant::now();
            run(&buf, rank, 0, 1024, Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum }, Stream::DEFAULT)
                .unwrap();
            let e = synchronize(&team, rank, Stream::DEFAULT).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Timeout, "{}", e.message);
            assert!(t.elapsed() < bound, "rank {r} took {:?}", t.elapsed());
            buf.free().unwrap();
            team.destroy().unwrap();
        }
        "register" => {
            let team = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).unwrap();
            match std::env::var(EXPECT_HT).as_deref() {
                Ok("fabric") => assert_eq!(team.handle_type(), HandleTypes::FABRIC, "rank {r}"),
                Ok("posix") => assert_eq!(team.handle_type(), HandleTypes::POSIX_FD, "rank {r}"),
                _ => {}
            }
            let s = Stream::DEFAULT;
            let dev = r as i32;
            let count = 20_000usize;
            let block = count * 4;
            let driver = ctx.driver().clone();
            let mem = |bytes: usize| ctx.memory.alloc(&ctx, dev, bytes).unwrap();
            // send holds n blocks (reduce-scatter), recv n blocks (all-gather).
            let (ps, pr) = (mem(n * block), mem(n * block));
            let send = Buffer::register(&team, &[ps], n * block).unwrap();
            let recv = Buffer::register(&team, &[pr], n * block).unwrap();
            assert!(send.is_registered() && recv.is_registered());
            assert_eq!(ctx.memory.registrations(), 2);
            let value = |q: usize, i: usize| ((q + 1) * (i % 13)) as i32;
            let bytes_of = |v: Vec<i32>| -> Vec<u8> { v.into_iter().flat_map(|x| x.to_ne_bytes()).collect() };
            let read = |p: u64, len: usize| {
                let mut got = vec![0u8; len];
                driver.memcpy_dtoh(dev, &mut got, p).unwrap();
                got
            };
            let mine: Vec<i32> = (0..n * count).map(|i| value(r, i)).collect();
            driver.memcpy_htod(dev, ps, &bytes_of(mine)).unwrap();
            let sum = Collective::AllReduce { dtype: DType::I32, op: RedOp::Sum };
            let tri = (n * (n + 1) / 2) as i32;
            // All-reduce into recv.
            run_into(&send, 0, &recv, 0, rank, count, sum, s).unwrap();
            synchronize(&team, rank, s).unwrap();
            let want = bytes_of((0..count).map(|i| tri * (i % 13) as i32).collect());
            assert_eq!(read(pr, block), want, "rank {r}: all-reduce into registered memory");
            // Reduce-scatter: block r of every rank's send, summed, lands in recv.
            let rs = Collective::ReduceScatter { dtype: DType::I32, op: RedOp::Sum };
            run_into(&send, 0, &recv, 0, rank, count, rs, s).unwrap();
            synchronize(&team, rank, s).unwrap();
            let want = bytes_of((0..count).map(|i| tri * ((r * count + i) % 13) as i32).collect());
            assert_eq!(read(pr, block), want, "rank {r}: reduce-scatter into registered memory");
            // All-gather: every rank's first block, in rank order.
            run_into(&send, 0, &recv, 0, rank, block, Collective::AllGather, s).unwrap();
            synchronize(&team, rank, s).unwrap();
            let want = bytes_of((0..n).flat_map(|q| (0..count).map(move |i| value(q, i))).collect());
            assert_eq!(read(pr, n * block), want, "rank {r}: all-gather into registered memory");
            // Broadcast from the last rank.
            let root = (n - 1) as u32;
            run_into(&send, 0, &recv, 0, rank, block, Collective::Broadcast { root }, s).unwrap();
            synchronize(&team, rank, s).unwrap();
            let want = bytes_of((0..count).map(|i| value(n - 1, i)).collect());
            assert_eq!(read(pr, block), want, "rank {r}: broadcast into registered memory");
            // The pointer form on the registered pointers (zero-copy path), offsets inside.
            run_ptr(&team, rank, ps + 256, pr + 512, count, sum, s).unwrap();
            synchronize(&team, rank, s).unwrap();
            let want = bytes_of((0..count).map(|i| tri * ((i + 64) % 13) as i32).collect());
            assert_eq!(read(pr + 512, block), want, "rank {r}: pointer-form all-reduce on registered memory");
            // In place on the registered send buffer.
            run(&send, rank, 0, count, sum, s).unwrap();
            synchronize(&team, rank, s).unwrap();
            let want = bytes_of((0..count).map(|i| tri * (i % 13) as i32).collect());
            assert_eq!(read(ps, block), want, "rank {r}: in-place all-reduce on registered memory");
            // The memory stays with its owner while registered, and after the free.
            assert_eq!(ctx.memory.free(&ctx, ps).unwrap_err().kind, ErrorKind::InUse);
            send.free().unwrap();
            recv.free().unwrap();
            assert_eq!(ctx.memory.registrations(), 0);
            assert_eq!(read(ps, block), want, "rank {r}: the memory outlives its registration");
            ctx.memory.free(&ctx, ps).unwrap();
            ctx.memory.free(&ctx, pr).unwrap();
            team.destroy().unwrap();
        }
        "register-errors" => {
            // A failed vote ends the team's setup calls (as for mcast_buffer_alloc): one case
            // per team.
            let case = std::env::var(CASE).unwrap();
            let team = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).unwrap();
            let dev = r as i32;
            let driver = ctx.driver().clone();
            let bytes = 4096;
            let p = ctx.memory.alloc(&ctx, dev, bytes).unwrap();
            let plain = driver.mem_alloc(dev, bytes).unwrap();
            let host = [0u8; 64];
            // The overlap case: a live registration of p, made before the team breaks.
            let live = (case == "overlap").then(|| Buffer::register(&team, &[p], bytes).unwrap());
            let q = ctx.memory.alloc(&ctx, dev, bytes).unwrap();
            let (theirs, len, kind, words) = match case.as_str() {
                "plain" => (plain, bytes, ErrorKind::NotSupported, "not memory from cuMemCreate"),
                "host" => (host.as_ptr() as u64, 64, ErrorKind::InvalidArgument, "not device memory"),
                "misaligned" => (p + 256, 256, ErrorKind::NotSupported, "not aligned"),
                "overlap" => (p, bytes, ErrorKind::InvalidArgument, "overlaps a live registration"),
                other => panic!("unknown case {other}"),
            };
            let mine = if r == 1 { theirs } else { q };
            let e = Buffer::register(&team, &[mine], len).err().expect("rank 1 breaks a rule");
            // Rank 1 has its own error; the others have rank 1's kind, with a message naming
            // rank 1 and the rule.
            assert_eq!(e.kind, kind, "rank {r}: {case}: {}", e.message);
            assert!(e.message.contains("rank 1") && e.message.contains(words), "rank {r}: {case}: {}", e.message);
            assert!(start.elapsed() < bound, "rank {r}: {case} took {:?}", start.elapsed());
            let left = usize::from(live.is_some());
            assert_eq!(ctx.memory.registrations(), left, "rank {r}: {case}: a registration was left");
            assert_eq!(team.live_buffers(), left, "rank {r}: {case}: a buffer was left");
            if let Some(b) = live {
                b.free().unwrap();
            }
            driver.mem_free(dev, plain).unwrap();
            ctx.memory.free(&ctx, p).unwrap();
            ctx.memory.free(&ctx, q).unwrap();
            team.destroy().unwrap();
        }
        "register-fault" => {
            let func = std::env::var(CASE).unwrap();
            let team = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).unwrap();
            let dev = r as i32;
            let p = ctx.memory.alloc(&ctx, dev, 4096).unwrap();
            let culprit = if func == "cuMulticastCreate" { 0 } else { 1 };
            let sim = ctx.driver().as_sim().unwrap();
            if r == culprit {
                let code = mcast::driver::CuResult::ERROR_INVALID_VALUE;
                sim.inject(&func, code, 1, Some(1));
                if func == "cuMulticastBindAddr" {
                    sim.inject("cuMulticastBindAddr_v2", code, 1, Some(1));
                }
            }
            let e = Buffer::register(&team, &[p], 4096).err().expect("the registration fails on every rank");
            let who = format!("rank {culprit}");
            assert!(e.message.contains(&who), "rank {r}: {func}: {:?} {}", e.kind, e.message);
            assert!(start.elapsed() < bound, "rank {r}: {func} took {:?}", start.elapsed());
            assert_eq!(ctx.memory.registrations(), 0, "rank {r}: {func}: a registration was left");
            assert_eq!(team.live_buffers(), 0, "rank {r}: {func}: a buffer was left");
            sim.clear_faults();
            ctx.memory.free(&ctx, p).unwrap();
            team.destroy().unwrap();
        }
        "own-memory" => {
            let team = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).unwrap();
            let s = Stream::DEFAULT;
            let count = 70_000usize; // past one chunk of the pointer form's scratch for 2 ranks
            let value = |q: usize, i: usize| ((q + 1) * (i % 11)) as i32;
            let tri = (n * (n + 1) / 2) as i32;
            // Out of place across processes: send and recv buffers of the team.
            let send = Buffer::alloc(&team, count * 4).unwrap();
            let recv = Buffer::alloc(&team, count * 4 + 64).unwrap();
            let mine: Vec<u8> = (0..count).flat_map(|i| value(r, i).to_ne_bytes()).collect();
            send.write(rank, 0, &mine).unwrap();
            let sum = Collective::AllReduce { dtype: DType::I32, op: RedOp::Sum };
            run_into(&send, 0, &recv, 16, rank, count, sum, s).unwrap();
            synchronize(&team, rank, s).unwrap();
            let mut got = vec![0u8; count * 4];
            recv.read(rank, 16, &mut got).unwrap();
            let want: Vec<u8> = (0..count).flat_map(|i| (tri * (i % 11) as i32).to_ne_bytes()).collect();
            assert_eq!(got, want, "rank {r}: out-of-place all-reduce");
            // The pointer form on plain device memory of this process.
            let driver = ctx.driver().clone();
            let p = driver.mem_alloc(r as i32, count * 4).unwrap();
            driver.memcpy_htod(r as i32, p, &mine).unwrap();
            run_ptr(&team, rank, p, p, count, sum, s).unwrap();
            synchronize(&team, rank, s).unwrap();
            driver.memcpy_dtoh(r as i32, &mut got, p).unwrap();
            assert_eq!(got, want, "rank {r}: pointer-form all-reduce");
            driver.mem_free(r as i32, p).unwrap();
            send.free().unwrap();
            recv.free().unwrap();
            team.destroy().unwrap();
        }
        other => panic!("unknown role {other}"),
    }
    assert_clean(&ctx);
}
