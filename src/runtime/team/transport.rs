//! Transport choice: multicast or peer-to-peer from every rank's facts, the handle type a
//! multi-process team passes memory with (POSIX descriptors or fabric handles, probed and
//! agreed), and the grid cap. Decided the same on every rank from the same facts.

use crate::driver::{Device, Granularity, HandleTypes, MulticastProp};
use crate::runtime::comm::{Comm, Dec, Enc};
use crate::runtime::config::HandleTypeMode;
use crate::runtime::env::Env;
use crate::runtime::error::{Error, Result};

/// How a team's ranks exchange data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// One multicast object per segment, multimem kernels.
    Multicast,
    /// Peer mappings, load/store kernels.
    P2P,
}

/// The transport of a team over `devices`, given why multicast is impossible (`reason`, from
/// the policy), why peer access is (`peer_problem`) and, with `required`, who requires
/// multicast (`""` for this process, `" by rank q"`). Returns the transport and the reason
/// shown to users (empty for multicast).
pub(super) fn choose(
    reason: Option<String>,
    peer_problem: Option<String>,
    required: Option<&str>,
    devices: &[Device],
) -> Result<(Transport, String)> {
    let reason = reason.or_else(|| peer_problem.clone());
    match (&reason, required) {
        (None, _) => Ok((Transport::Multicast, String::new())),
        (Some(why), Some(by)) => {
            Err(Error::not_supported(format!("multicast is required{by} (MCAST_MULTICAST=require) but {why}")))
        }
        (Some(why), None) => match &peer_problem {
            None => Ok((Transport::P2P, why.clone())),
            Some(p) => Err(Error::not_supported(format!(
                "neither multicast ({why}) nor peer-to-peer ({p}) is possible for devices {devices:?}"
            ))),
        },
    }
}

/// Why some device of `devices` cannot access another's memory, or `None`.
pub(super) fn peer_problem(env: &Env, devices: &[i32]) -> Result<Option<String>> {
    for &a in devices {
        for &b in devices {
            if a != b && !env.can_access_peer(a, b)? {
                return Ok(Some(format!("device {a} cannot access device {b}'s memory")));
            }
        }
    }
    Ok(None)
}

/// Every block of every rank on one device must be resident at once (blocks wait for their
/// peers in barriers): at worst one block per SM, so the SMs are shared out among the ranks
/// the busiest device hosts.
pub(super) fn block_cap(env: &Env, devices: &[i32]) -> Result<u32> {
    let mut cap = u32::MAX;
    for &d in devices {
        let sms = env.props(d)?.sm_count.max(1) as u32;
        let sharing = devices.iter().filter(|&&x| x == d).count() as u32;
        cap = cap.min(sms / sharing);
    }
    Ok(cap.max(1))
}

/// Every rank says whether it can share memory through fabric handles (its device reports
/// support and a probe allocation exports; on the multicast transport rank 0 also probes a
/// multicast object) and how `MCAST_HANDLE_TYPE` is set on it; every rank decides the same:
/// fabric handles when every rank can and none asks for POSIX descriptors; POSIX
/// descriptors otherwise, unless a rank asks for fabric handles, which is an error naming
/// the ranks that cannot use them. Ranks on different hosts (see
/// [`crate::bootstrap::host`]) cannot pass descriptors, so a team that spans hosts uses
/// fabric handles for every rank, or fails with `NotSupported` naming the rank, its host
/// and the reason (also when a rank forces `MCAST_HANDLE_TYPE=posix`).
pub(super) fn agree_handle_type(
    env: &Env,
    comm: &Comm,
    device: Device,
    devices: &[Device],
    transport: Transport,
) -> Result<HandleTypes> {
    let r = comm.rank();
    let mode = env.config().handle_type;
    let probe = match mode {
        HandleTypeMode::Posix => Err("MCAST_HANDLE_TYPE=posix".to_string()),
        _ => probe_fabric(env, device, (r == 0 && transport == Transport::Multicast).then_some(devices.len())),
    };
    if let Err(why) = &probe {
        tracing::debug!("rank {r}: no fabric handles: {why}");
    }
    let mut e = Enc::default();
    e.u32(match mode {
        HandleTypeMode::Auto => 0,
        HandleTypeMode::Posix => 1,
        HandleTypeMode::Fabric => 2,
    });
    match &probe {
        Ok(()) => e.u32(1),
        Err(why) => e.u32(0).str(why),
    };
    let parts = comm.exchange("handle type", Ok(()), &e.0, &[])?;
    let (mut cannot, mut posix, mut fabric) = (Vec::new(), None, None);
    let hosts = comm.bootstrap().hosts();
    let mut cannot_hosted = Vec::new();
    for (q, p) in parts.iter().enumerate() {
        let mut d = Dec(&p.bytes);
        match d.u32()? {
            1 => posix = posix.or(Some(q)),
            2 => fabric = fabric.or(Some(q)),
            _ => {}
        }
        if d.u32()? == 0 {
            let why = d.str()?;
            cannot_hosted.push(format!("rank {q} on host {}: {why}", hosts[q]));
            cannot.push(format!("rank {q}: {why}"));
        }
    }
    // Ranks on different hosts cannot pass descriptors: fabric handles or nothing.
    if let Some(q) = (1..hosts.len()).find(|&q| hosts[q] != hosts[0]) {
        let span = format!("the team spans hosts (rank 0 on host {}, rank {q} on host {})", hosts[0], hosts[q]);
        if let Some(p) = posix {
            return Err(Error::not_supported(format!(
                "rank {p} on host {} forces MCAST_HANDLE_TYPE=posix, but POSIX file descriptors only travel \
                     between ranks of one host and {span}; use MCAST_HANDLE_TYPE=auto or fabric",
                hosts[p]
            )));
        }
        if !cannot_hosted.is_empty() {
            return Err(Error::not_supported(format!(
                "{span}, so memory must travel as fabric handles, but {}; a multi-node NVLink system needs the \
                     fabric manager and an IMEX channel (/dev/nvidia-caps-imex-channels/channel0, IMEX daemon \
                     running) on every node",
                cannot_hosted.join("; ")
            )));
        }
        return Ok(HandleTypes::FABRIC);
    }
    match (fabric, posix) {
        (Some(q), _) if !cannot.is_empty() => Err(Error::not_supported(format!(
            "fabric handles are required by rank {q} (MCAST_HANDLE_TYPE=fabric) but {}",
            cannot.join("; ")
        ))),
        _ if cannot.is_empty() && posix.is_none() => Ok(HandleTypes::FABRIC),
        _ => Ok(HandleTypes::POSIX_FD),
    }
}

/// Whether `dev` can share memory through fabric handles: it reports support, and an
/// allocation of one granularity (and, with `multicast` devices, a multicast object)
/// created with the fabric type exports; the probes are released at once.
fn probe_fabric(env: &Env, dev: Device, multicast: Option<usize>) -> std::result::Result<(), String> {
    let driver = env.driver();
    let props = env.props(dev).map_err(|e| e.message)?;
    if !props.fabric_supported {
        return Err(format!("device {dev} does not report fabric handle support"));
    }
    let ht = HandleTypes::FABRIC;
    let size = driver.mem_granularity(dev, Granularity::Minimum, ht).map_err(|e| e.to_string())?;
    let mut objects = vec![driver.mem_create(dev, size, ht).map_err(|e| e.to_string())?];
    let mut outcome = driver.mem_export_fabric(objects[0]).map(drop);
    if let (Ok(()), Some(n)) = (&outcome, multicast) {
        let prop = MulticastProp { num_devices: n as u32, size: 0, handle_types: ht, flags: 0 };
        outcome = driver
            .multicast_granularity(&prop, Granularity::Minimum)
            .and_then(|size| driver.multicast_create(&MulticastProp { size, ..prop }))
            .and_then(|mc| {
                objects.push(mc);
                driver.mem_export_fabric(mc).map(drop)
            });
    }
    for h in objects {
        if let Err(e) = driver.mem_release(h) {
            tracing::error!("releasing a fabric handle probe on device {dev}: {e}");
        }
    }
    outcome.map_err(|e| e.to_string())
}

/// `"fabric"`, `"POSIX fd"` or `"no shareable"`.
pub(super) fn handle_type_label(ht: HandleTypes) -> &'static str {
    if ht == HandleTypes::FABRIC {
        "fabric"
    } else if ht == HandleTypes::POSIX_FD {
        "POSIX fd"
    } else {
        "no shareable"
    }
}
