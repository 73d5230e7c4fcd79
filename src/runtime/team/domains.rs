//! NVLink domains of a multi-process team, decided once at setup from what works, the same on
//! every rank (API.md, "Devices by identity, NVLink domains"):
//!
//! - ranks of one host are one domain (their GPUs reach each other by peer access);
//! - ranks on several hosts are one domain when their GPUs are in one NVLink fabric (NVML: same
//!   cluster UUID and clique, state COMPLETED) *and* a FABRIC handle really imports between
//!   them: each such rank exports a trial allocation and imports every such peer's on another
//!   host. A failed import splits that fabric's candidate domain by host, with the reason
//!   logged once; it never fails the team by itself;
//! - `MCAST_DOMAIN=<label>` puts ranks with equal labels in one domain and no others;
//!   `MCAST_MNNVL=off` ignores fabric information (every host its own domain).

use crate::driver::{
    uuid_string, CuResult, Device, FabricInfo, FabricState, Granularity, HandleTypes, FABRIC_HANDLE_BYTES,
};
use crate::runtime::comm::{Comm, Dec, Enc};
use crate::runtime::env::Env;
use crate::runtime::error::{Error, Result};

/// How the refusal of a team over several domains begins (see [`spans_domains`]).
const SPANS: &str = "the team spans ";

/// True when `message` (an error's) is the refusal of a team over several NVLink domains, which
/// callers such as `libmcast_nccl` serve another way.
pub fn spans_domains(message: &str) -> bool {
    message.contains(SPANS) && message.contains(" NVLink domains: ")
}

/// The domains of a team: how many, their size, and which each rank is in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Domains {
    /// Domain of each rank (0.. in order of each domain's first rank).
    pub of_rank: Vec<usize>,
    /// A name per domain for messages: its label, its fabric or its host.
    pub names: Vec<String>,
}

impl Domains {
    /// One domain of `n` ranks (a single-process team, or one host).
    pub fn one(n: usize) -> Domains {
        Domains { of_rank: vec![0; n], names: vec!["one host".into()] }
    }

    /// How many domains.
    pub fn count(&self) -> usize {
        self.names.len()
    }

    /// Ranks per domain; 0 when the domains differ in size.
    pub fn size(&self) -> usize {
        let sizes: Vec<usize> = (0..self.count()).map(|d| self.of_rank.iter().filter(|&&x| x == d).count()).collect();
        if sizes.windows(2).all(|w| w[0] == w[1]) {
            sizes[0]
        } else {
            0
        }
    }

    /// `"A (ranks 0, 1), B (ranks 2, 3)"`.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = (0..self.count())
            .map(|d| {
                let ranks: Vec<String> =
                    self.of_rank.iter().enumerate().filter(|&(_, &x)| x == d).map(|(r, _)| r.to_string()).collect();
                format!("{} (ranks {})", self.names[d], ranks.join(", "))
            })
            .collect();
        parts.join(", ")
    }
}

/// What one rank says about itself.
struct Facts {
    label: Option<String>,
    fabric: FabricInfo,
    /// Its trial fabric handle, or why it has none.
    trial: std::result::Result<[u8; FABRIC_HANDLE_BYTES], String>,
}

impl Facts {
    /// The fabric candidate key, for a rank whose fabric handles work.
    fn fabric_key(&self) -> Option<([u8; 16], u32)> {
        (self.label.is_none() && self.fabric.state == FabricState::Completed && self.trial.is_ok())
            .then_some((self.fabric.cluster_uuid, self.fabric.clique_id))
    }
}

/// Decides the team's domains (see the module doc); every rank returns the same, with why the
/// ranks are not one fabric domain ("" or "; not one fabric domain because ...", for messages).
pub(super) fn decide(env: &Env, comm: &Comm, device: Device) -> Result<(Domains, String)> {
    let (r, n) = (comm.rank(), comm.nranks());
    let hosts: Vec<String> = comm.bootstrap().hosts().to_vec();
    let spans_hosts = hosts.iter().any(|h| *h != hosts[0]);
    let label = env.config().domain.clone();
    let fabric = env.fabric(device);
    let mut probe = None;
    let trial = match (&fabric, spans_hosts && label.is_none()) {
        (_, false) => Err("one host".to_string()),
        (Err(e), _) => Err(e.message.clone()),
        (Ok(f), _) if f.state != FabricState::Completed => Err(no_fabric_reason(env, device, f)),
        (Ok(_), true) => trial_handle(env, device).map(|(h, bytes)| {
            probe = Some(h);
            bytes
        }),
    };
    let fabric = fabric.unwrap_or_default();
    let mut e = Enc::default();
    match &label {
        Some(l) => e.u32(1).str(l),
        None => e.u32(0),
    };
    e.u32(fabric.state as u32).bytes(&fabric.cluster_uuid).u32(fabric.clique_id);
    match &trial {
        Ok(h) => e.u32(1).bytes(h),
        Err(why) => e.u32(0).str(why),
    };
    let release = |env: &Env| {
        if let Some(h) = probe {
            if let Err(e) = env.driver().mem_release(h) {
                tracing::error!("releasing the trial fabric handle on device {device}: {e}");
            }
        }
    };
    let parts = match comm.exchange("domain facts", Ok(()), &e.0, &[]) {
        Ok(p) => p,
        Err(e) => {
            release(env);
            return Err(e);
        }
    };
    let facts = match parse_facts(&parts) {
        Ok(f) => f,
        Err(e) => {
            release(env);
            return Err(e);
        }
    };
    debug_assert_eq!(facts.len(), n);
    // The handshake: import every trial handle of a peer on another host in this rank's fabric.
    let mut failed = Vec::new();
    if let Some(key) = facts[r].fabric_key() {
        for (q, f) in facts.iter().enumerate() {
            if hosts[q] == hosts[r] || f.fabric_key() != Some(key) {
                continue;
            }
            let Ok(bytes) = &f.trial else { continue };
            match env.driver().mem_import_fabric(bytes) {
                Ok(h) => {
                    if let Err(e) = env.driver().mem_release(h) {
                        tracing::error!("releasing rank {q}'s imported trial fabric handle: {e}");
                    }
                }
                Err(e) => failed.push((q, e.to_string())),
            }
        }
    }
    let mut e = Enc::default();
    e.u32(failed.len() as u32);
    for (q, why) in &failed {
        e.u32(*q as u32).str(why);
    }
    let parts = comm.exchange("domain handshake", Ok(()), &e.0, &[]);
    release(env);
    let mut failures = Vec::new();
    for (p, part) in parts?.iter().enumerate() {
        let mut d = Dec(&part.bytes);
        for _ in 0..d.u32()? {
            let q = d.u32()? as usize;
            failures.push((p, q, d.str()?));
        }
    }
    let domains = assign(&hosts, &facts, &failures);
    if !failures.is_empty() {
        let list: Vec<String> = failures
            .iter()
            .map(|(p, q, why)| {
                format!("rank {p} on host {} importing rank {q}'s (host {}): {why}", hosts[*p], hosts[*q])
            })
            .collect();
        let msg = format!(
            "a FABRIC handle does not import between hosts of one NVLink fabric, so its ranks form one domain per \
             host: {}",
            list.join("; ")
        );
        if r == 0 {
            tracing::warn!("{msg}");
        } else {
            tracing::debug!("{msg}");
        }
    }
    let why: Vec<String> = facts
        .iter()
        .enumerate()
        .filter(|(q, f)| f.label.is_none() && f.fabric_key().is_none() && hosts.iter().any(|h| *h != hosts[*q]))
        .filter_map(|(q, f)| f.trial.as_ref().err().map(|why| format!("rank {q} on host {}: {why}", hosts[q])))
        .chain(failures.iter().map(|(p, q, why)| format!("rank {p} cannot import rank {q}'s fabric handle: {why}")))
        .collect();
    let why =
        if why.is_empty() { String::new() } else { format!("; not one fabric domain because {}", why.join("; ")) };
    Ok((domains, why))
}

/// `"the team spans 2 NVLink domains: A (ranks 0, 1), B (ranks 2, 3)"`: how every message
/// about a team over several domains begins (see [`spans_domains`]).
pub fn spanning(domains: &Domains) -> String {
    format!("{SPANS}{} NVLink domains: {}", domains.count(), domains.describe())
}

/// The refusal of a team over several domains for a caller that serves such teams another way
/// (`libmcast_nccl`, see [`spans_domains`]); `why` as [`decide`] returns it.
pub(super) fn refusal(domains: &Domains, why: &str) -> Error {
    Error::not_supported(format!(
        "{}; this caller serves a team across NVLink domains another way (MCAST_DOMAIN labels and MCAST_MNNVL=off \
         decide domains too){why}",
        spanning(domains)
    ))
}

/// Every rank's [`Facts`] from the "domain facts" exchange.
fn parse_facts(parts: &[crate::runtime::comm::Part]) -> Result<Vec<Facts>> {
    let mut facts = Vec::with_capacity(parts.len());
    for p in parts {
        let mut d = Dec(&p.bytes);
        let label = if d.u32()? != 0 { Some(d.str()?) } else { None };
        let state = match d.u32()? {
            x if x == FabricState::Completed as u32 => FabricState::Completed,
            x if x == FabricState::InProgress as u32 => FabricState::InProgress,
            _ => FabricState::None,
        };
        let cluster_uuid =
            <[u8; 16]>::try_from(d.bytes()?).map_err(|_| Error::internal("a cluster UUID of bad size"))?;
        let clique_id = d.u32()?;
        let trial = if d.u32()? != 0 {
            Ok(<[u8; FABRIC_HANDLE_BYTES]>::try_from(d.bytes()?).map_err(|_| Error::internal("a bad fabric handle"))?)
        } else {
            Err(d.str()?)
        };
        facts.push(Facts { label, fabric: FabricInfo { cluster_uuid, clique_id, state }, trial });
    }
    Ok(facts)
}

/// Why `dev` is in no NVLink fabric that the team can use.
fn no_fabric_reason(env: &Env, dev: Device, f: &FabricInfo) -> String {
    if !env.config().mnnvl {
        return "MCAST_MNNVL=off".into();
    }
    match env.props(dev) {
        Ok(p) if !p.fabric_supported => format!("device {dev} does not report fabric handle support"),
        _ if f.state == FabricState::InProgress => format!("device {dev}'s NVLink fabric registration is in progress"),
        _ => format!("device {dev} is in no NVLink fabric (NVML GPU fabric info)"),
    }
}

/// A trial allocation of one granularity with the FABRIC handle type, and its exported handle.
fn trial_handle(
    env: &Env,
    dev: Device,
) -> std::result::Result<(crate::driver::MemHandle, [u8; FABRIC_HANDLE_BYTES]), String> {
    let driver = env.driver();
    let ht = HandleTypes::FABRIC;
    let why = |e: crate::driver::DriverError| match e.code {
        CuResult::ERROR_NOT_PERMITTED => format!("{e} (no usable IMEX channel?)"),
        _ => e.to_string(),
    };
    let size = driver.mem_granularity(dev, Granularity::Minimum, ht).map_err(why)?;
    let h = driver.mem_create(dev, size, ht).map_err(why)?;
    match driver.mem_export_fabric(h) {
        Ok(bytes) => Ok((h, bytes)),
        Err(e) => {
            if let Err(e) = driver.mem_release(h) {
                tracing::error!("releasing a trial fabric allocation on device {dev}: {e}");
            }
            Err(why(e))
        }
    }
}

/// The domains from every rank's facts and the failed imports `(importer, exporter, why)`.
fn assign(hosts: &[String], facts: &[Facts], failures: &[(usize, usize, String)]) -> Domains {
    let n = facts.len();
    let mut parent: Vec<usize> = (0..n).collect();
    fn root(p: &mut [usize], mut x: usize) -> usize {
        while p[x] != x {
            p[x] = p[p[x]];
            x = p[x];
        }
        x
    }
    let union = |p: &mut Vec<usize>, a: usize, b: usize| {
        let (x, y) = (root(p, a), root(p, b));
        if x != y {
            p[x.max(y)] = x.min(y);
        }
    };
    for a in 0..n {
        for b in 0..a {
            let (fa, fb) = (&facts[a], &facts[b]);
            let together = match (&fa.label, &fb.label) {
                (Some(x), Some(y)) => x == y,
                (None, None) => hosts[a] == hosts[b],
                _ => false,
            };
            if together {
                union(&mut parent, a, b);
            }
        }
    }
    // Fabric candidates whose handshake passed everywhere join across hosts.
    let mut keys: Vec<([u8; 16], u32)> = facts.iter().filter_map(Facts::fabric_key).collect();
    keys.sort_unstable();
    keys.dedup();
    let mut via_fabric = Vec::new();
    for key in keys {
        let members: Vec<usize> = (0..n).filter(|&q| facts[q].fabric_key() == Some(key)).collect();
        let broken = failures.iter().any(|(p, q, _)| members.contains(p) && members.contains(q));
        if !broken {
            for w in members.windows(2) {
                union(&mut parent, w[0], w[1]);
            }
            via_fabric.push((key, members));
        }
    }
    let mut of_rank = vec![0; n];
    let mut roots: Vec<usize> = Vec::new();
    let mut names = Vec::new();
    for q in 0..n {
        let x = root(&mut parent, q);
        let d = match roots.iter().position(|&y| y == x) {
            Some(d) => d,
            None => {
                roots.push(x);
                let spans = (0..n).any(|p| root(&mut parent, p) == x && hosts[p] != hosts[q]);
                let name = match (&facts[q].label, via_fabric.iter().find(|(_, m)| m.contains(&q))) {
                    (Some(l), _) => format!("MCAST_DOMAIN={l}"),
                    (None, Some((key, _))) if spans => {
                        format!("NVLink fabric {} clique {}", &uuid_string(&key.0)[4..12], key.1)
                    }
                    _ => format!("host {}", hosts[q]),
                };
                names.push(name);
                roots.len() - 1
            }
        };
        of_rank[q] = d;
    }
    Domains { of_rank, names }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(label: Option<&str>, fabric: Option<u8>) -> Facts {
        let info = match fabric {
            Some(c) => FabricInfo { cluster_uuid: [c; 16], clique_id: 0, state: FabricState::Completed },
            None => FabricInfo::default(),
        };
        let trial = if fabric.is_some() { Ok([1; FABRIC_HANDLE_BYTES]) } else { Err("no fabric".into()) };
        Facts { label: label.map(str::to_string), fabric: info, trial }
    }

    fn hosts(h: &[&str]) -> Vec<String> {
        h.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn hosts_join_through_a_fabric_that_works() {
        let h = hosts(&["a", "a", "b", "b"]);
        let f: Vec<Facts> = (0..4).map(|_| facts(None, Some(1))).collect();
        let d = assign(&h, &f, &[]);
        assert_eq!((d.count(), d.size()), (1, 4));
        // A failed import splits the fabric by host.
        let d = assign(&h, &f, &[(2, 0, "CUDA_ERROR_INVALID_HANDLE".into())]);
        assert_eq!(d.of_rank, vec![0, 0, 1, 1]);
        assert_eq!((d.count(), d.size()), (2, 2));
        assert_eq!(d.describe(), "host a (ranks 0, 1), host b (ranks 2, 3)");
        // Two fabrics: one domain each; no fabric: one per host.
        let f = vec![facts(None, Some(1)), facts(None, Some(1)), facts(None, Some(2)), facts(None, None)];
        let d = assign(&hosts(&["a", "b", "c", "d"]), &f, &[]);
        assert_eq!(d.of_rank, vec![0, 0, 1, 2]);
        assert_eq!(d.size(), 0, "unequal domains");
        assert!(d.names[0].starts_with("NVLink fabric"), "{:?}", d.names);
    }

    #[test]
    fn the_refusal_is_recognised() {
        let d = Domains { of_rank: vec![0, 1], names: vec!["A".into(), "B".into()] };
        assert!(spans_domains(&format!("x: {SPANS}2 NVLink domains: {}", d.describe())));
        assert!(!spans_domains("the team spans hosts (rank 0 on host a, rank 1 on host b)"));
    }

    #[test]
    fn labels_override_everything() {
        let f = vec![facts(Some("A"), None), facts(Some("B"), None), facts(Some("A"), None), facts(Some("B"), None)];
        let d = assign(&hosts(&["a", "a", "a", "a"]), &f, &[]);
        assert_eq!(d.of_rank, vec![0, 1, 0, 1]);
        assert_eq!(d.describe(), "MCAST_DOMAIN=A (ranks 0, 2), MCAST_DOMAIN=B (ranks 1, 3)");
    }
}
