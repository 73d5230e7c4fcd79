//! The multicast policy: multicast is used only when the mode allows it, no site-wide kill switch
//! is set, the driver has the entry points, every device reports support, and the team has at
//! least two distinct devices. The first unmet condition is the reason shown to users.

use super::config::MulticastMode;
use crate::driver::{Device, DeviceProps};

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

/// Why a team over `devices` cannot use multicast, given each device's own reason (see
/// [`device_reason`]), or `None` when it can.
pub fn team_reason(devices: &[Device], device_reasons: &[Option<String>]) -> Option<String> {
    if let Some(reason) = device_reasons.iter().flatten().next() {
        return Some(reason.clone());
    }
    if devices.len() < 2 {
        return Some("a team of one rank has no peer to multicast to".into());
    }
    for (i, d) in devices.iter().enumerate() {
        if devices[..i].contains(d) {
            return Some(format!("device {d} appears more than once; multicast needs distinct devices"));
        }
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
        assert_eq!(team_reason(&[0, 1], &[None, None]), None);
        assert!(team_reason(&[0], &[None]).unwrap().contains("one rank"));
        assert!(team_reason(&[0, 0], &[None, None]).unwrap().contains("device 0 appears more than once"));
        let r = team_reason(&[0, 1], &[None, Some("device 1 does not report X".into())]);
        assert_eq!(r.as_deref(), Some("device 1 does not report X"));
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
