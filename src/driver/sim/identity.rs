//! Which GPU a simulated device is: the simulated host has [`SimConfig::devices`] GPUs
//! (physical indices `0..N`); `CUDA_VISIBLE_DEVICES` ([`SimConfig::visible`]) selects and
//! orders the ones this process sees, and an ordinal is a position in that list. Each GPU has a
//! UUID and a PCI bus id derived from (host identity, physical index), so the same GPU seen by
//! two processes of one simulated host has one UUID whatever its ordinal in each, and GPUs of
//! different simulated hosts never share one.
//!
//! [`SimConfig::devices`]: super::SimConfig::devices
//! [`SimConfig::visible`]: super::SimConfig::visible

use sha2::{Digest, Sha256};

/// PCI buses of the GPUs of an 8-GPU HGX H100 board, in physical order.
const BUSES: [u8; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

/// The physical indices this process sees, in ordinal order, for `CUDA_VISIBLE_DEVICES =
/// spec` on a host with `physical` GPUs (`None`: the variable is unset, every GPU in order).
///
/// As the CUDA C Programming Guide ("CUDA Environment Variables") describes it: a comma list of
/// indices or UUIDs (`GPU-` and a unique prefix of the UUID); "If one of the indices is invalid,
/// only the devices whose index precedes the invalid index are visible to CUDA applications"
/// (its example: `0,2,-1,1` shows devices 0 and 2). An entry naming a GPU already listed ends
/// the list the same way, and an empty value hides every GPU.
pub(super) fn visible(spec: Option<&str>, physical: u32, host: &str) -> Vec<u32> {
    let Some(spec) = spec else { return (0..physical).collect() };
    let mut out = Vec::new();
    for entry in spec.split(',') {
        let entry = entry.trim();
        let index = match entry.strip_prefix("GPU-") {
            Some(prefix) if !prefix.is_empty() => {
                let prefix = prefix.to_ascii_lowercase();
                let hits: Vec<u32> = (0..physical)
                    .filter(|&i| crate::driver::uuid_string(&uuid(host, i))[4..].starts_with(&prefix))
                    .collect();
                match hits[..] {
                    [i] => Some(i),
                    _ => None,
                }
            }
            _ => entry.parse::<u32>().ok().filter(|&i| i < physical),
        };
        match index {
            Some(i) if !out.contains(&i) => out.push(i),
            _ => break,
        }
    }
    out
}

/// The UUID of GPU `index` of simulated host `host` (a host tag).
pub(super) fn uuid(host: &str, index: u32) -> [u8; 16] {
    let digest = Sha256::digest(format!("mcast-sim-gpu/{host}/{index}").as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&digest[..16]);
    out
}

/// The PCI bus id of GPU `index`: the buses of an HGX board, one PCI domain per eight GPUs.
pub(super) fn pci_bus_id(index: u32) -> String {
    format!("{:04x}:{:02x}:00.0", index / 8, BUSES[(index % 8) as usize])
}

/// A GPU as the simulator's cross-process records name it (multicast members, bindings,
/// memory made by another process): the first 8 bytes of its UUID, never 0.
pub(super) fn key(uuid: &[u8; 16]) -> u64 {
    u64::from_ne_bytes(uuid[..8].try_into().expect("8 bytes")) | 1
}
