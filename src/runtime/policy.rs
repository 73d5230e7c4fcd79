//! The multicast policy: multicast is used only when the mode allows it, no site-wide kill switch
//! is set, the driver has the entry points, every device reports support, and the team has at
//! least two distinct devices (distinct GPUs, by UUID: processes that each see one GPU all call
//! it device 0). The first unmet condition is the reason shown to users.

use super::config::MulticastMode;
use crate::driver::{uuid_string, Device, DeviceProps};

/// Site-wide NVLS kill switches and the value test that turns each on.
const KILL_SWITCHES: [(&str, bool); 4] = [
    ("NCCL_NVLS_ENABLE", false),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", true),
    ("NVSHMEM_DISABLE_NVLS", true),
    ("MSCCLPP_FORCE_DISABLE_NVLS", true),
];

/// The first kill switch set in the environment, as `NAME=value`.
pub fn kill_switch() -> Option<String> {
    kill_switch_in(|name| std::env::var(name).ok())
}

/// [`kill_switch`] over any variable lookup. A `*_DISABLE_*` variable counts as set unless it
/// reads as false; `NCCL_NVLS_ENABLE` counts when it reads as false. When unsure, multicast
/// stays off.
pub fn kill_switch_in(lookup: impl Fn(&str) -> Option<String>) -> Option<String> {
    for (name, disables_when_true) in KILL_SWITCHES {
        let Some(value) = lookup(name) else { continue };
        let v = value.trim().to_ascii_lowercase();
        let falsy = matches!(v.as_str(), "" | "0" | "false" | "no" | "off");
        let set = if disables_when_true { !falsy } else { falsy && !v.is_empty() };
        if set {
            return Some(format!("{name}={value}"));
        }
    }
    None
}

/// Why multicast is off whatever the devices: `mode` is off, or `kill_switch` (as
/// [`kill_switch`] returns it) is set; `None` when neither is. While it is off no `cuMulticast*`
/// function is called.
pub fn off_reason(mode: MulticastMode, kill_switch: Option<&str>) -> Option<String> {
    if mode == MulticastMode::Off {
        return Some("multicast is off (MCAST_MULTICAST=off or config.multicast)".into());
    }
    kill_switch.map(|switch| format!("site kill switch {switch} is set"))
}

/// Why `dev` cannot use multicast, or `None` when it can (`kill_switch`: see [`off_reason`]).
pub fn device_reason(
    mode: MulticastMode,
    kill_switch: Option<&str>,
    has_api: bool,
    dev: Device,
    props: &DeviceProps,
) -> Option<String> {
    if let Some(why) = off_reason(mode, kill_switch) {
        return Some(why);
    }
    if !has_api {
        return Some("the CUDA driver lacks the cuMulticast* entry points (driver 12.1 or newer needed)".into());
    }
    if !props.multicast_supported {
        return Some(format!("device {dev} does not report CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED"));
    }
    if !props.vmm_supported {
        return Some(format!("device {dev} does not support virtual memory management"));
    }
    None
}

/// Why a team cannot use multicast, given each rank's device (`devices`, ordinals in the
/// rank's own process), its GPU's UUID (`gpus`) and each device's own reason (see
/// [`device_reason`]), or `None` when it can.
pub fn team_reason(devices: &[Device], gpus: &[[u8; 16]], device_reasons: &[Option<String>]) -> Option<String> {
    if let Some(reason) = device_reasons.iter().flatten().next() {
        // Ranks sharing a GPU are worth naming even when policy already rules multicast out
        // (a shared machine with multicast off): P2P on one GPU shares its SMs.
        let shared = gpus.iter().enumerate().find_map(|(j, g)| {
            let i = gpus[..j].iter().position(|x| x == g)?;
            Some(format!("; ranks {i} and {j} share one GPU ({})", uuid_string(g)))
        });
        return Some(format!("{reason}{}", shared.unwrap_or_default()));
    }
    if devices.len() < 2 {
        return Some("a team of one rank has no peer to multicast to".into());
    }
    for (j, g) in gpus.iter().enumerate() {
        let Some(i) = gpus[..j].iter().position(|x| x == g) else { continue };
        let (di, dj) = (devices[i], devices[j]);
        let gpu = uuid_string(g);
        return Some(if di == dj {
            format!("device {di} appears more than once (ranks {i} and {j}, {gpu}); multicast needs distinct devices")
        } else {
            format!(
                "ranks {i} and {j} are on one GPU ({gpu}: device {di} and device {dj} in their processes); \
                 multicast needs distinct devices"
            )
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn kill_switches_are_recognised() {
        assert_eq!(kill_switch_in(lookup(&[])), None);
        assert_eq!(kill_switch_in(lookup(&[("NCCL_NVLS_ENABLE", "0")])).as_deref(), Some("NCCL_NVLS_ENABLE=0"));
        assert_eq!(kill_switch_in(lookup(&[("NCCL_NVLS_ENABLE", "1")])), None);
        assert_eq!(
            kill_switch_in(lookup(&[("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")])).as_deref(),
            Some("TORCH_SYMM_MEM_DISABLE_MULTICAST=1")
        );
        assert_eq!(kill_switch_in(lookup(&[("NVSHMEM_DISABLE_NVLS", "0")])), None);
        assert!(kill_switch_in(lookup(&[("NVSHMEM_DISABLE_NVLS", "true")])).is_some());
        assert!(kill_switch_in(lookup(&[("MSCCLPP_FORCE_DISABLE_NVLS", "1")])).is_some());
    }

    #[test]
    fn team_reasons_in_order() {
        let (a, b) = ([1u8; 16], [2u8; 16]);
        assert_eq!(team_reason(&[0, 1], &[a, b], &[None, None]), None);
        assert!(team_reason(&[0], &[a], &[None]).unwrap().contains("one rank"));
        assert!(team_reason(&[0, 0], &[a, a], &[None, None]).unwrap().contains("device 0 appears more than once"));
        let r = team_reason(&[0, 1], &[a, b], &[None, Some("device 1 does not report X".into())]);
        assert_eq!(r.as_deref(), Some("device 1 does not report X"));
        // A shared GPU is named after the policy's reason.
        let r = team_reason(&[0, 0], &[a, a], &[Some("multicast is off".into()), None]).unwrap();
        assert_eq!(r, format!("multicast is off; ranks 0 and 1 share one GPU ({})", uuid_string(&a)));
    }

    /// One visible GPU per process: every rank calls its GPU device 0, and distinct GPUs are
    /// told apart by UUID; two ordinals naming one GPU are the same device.
    #[test]
    fn the_same_gpu_is_decided_by_uuid_not_ordinal() {
        let (a, b) = ([1u8; 16], [2u8; 16]);
        assert_eq!(team_reason(&[0, 0, 0], &[a, b, [3; 16]], &[None, None, None]), None);
        let r = team_reason(&[0, 1], &[b, b], &[None, None]).unwrap();
        assert!(r.contains("ranks 0 and 1 are on one GPU") && r.contains(&uuid_string(&b)), "{r}");
        assert!(r.contains("device 0 and device 1"), "{r}");
    }

    #[test]
    fn device_reasons_in_order() {
        let props = DeviceProps { multicast_supported: true, vmm_supported: true, ..Default::default() };
        assert!(device_reason(MulticastMode::Off, None, true, 0, &props).unwrap().contains("off"));
        let switch = Some("NCCL_NVLS_ENABLE=0");
        let why = device_reason(MulticastMode::Require, switch, true, 0, &props).unwrap();
        assert!(why.contains("kill switch NCCL_NVLS_ENABLE=0"), "{why}");
        assert_eq!(device_reason(MulticastMode::Auto, None, true, 0, &props), None);
        assert!(device_reason(MulticastMode::Auto, None, false, 0, &props).unwrap().contains("entry points"));
        let no = DeviceProps { multicast_supported: false, ..props.clone() };
        assert!(device_reason(MulticastMode::Require, None, true, 3, &no).unwrap().contains("device 3"));
    }
}
