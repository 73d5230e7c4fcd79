//! Which GPU and which NVLink domain: `CUDA_VISIBLE_DEVICES` per process decided by UUID, and
//! the domains of ranks on simulated hosts (fabric, IMEX, `MCAST_MNNVL`, `MCAST_DOMAIN`).

use super::*;

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
