//! Context configuration: defaults, then the `MCAST_*` environment variables.

use std::time::Duration;

/// Which driver a context uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// CUDA when a driver and a device exist, else the simulator.
    Auto,
    /// The real CUDA driver.
    Cuda,
    /// The simulated driver.
    Sim,
}

/// Whether teams use multicast.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MulticastMode {
    /// Where usable, else peer-to-peer.
    Auto,
    /// Never.
    Off,
    /// Always; a team that cannot is an error naming the reason.
    Require,
}

/// How multi-process teams share memory between processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandleTypeMode {
    /// Fabric handles when every rank's device reports support and a probe export succeeds on
    /// every rank, else POSIX file descriptors.
    Auto,
    /// POSIX file descriptors passed over the rendezvous socket.
    Posix,
    /// Fabric handles; a team where some rank cannot use them is an error naming the rank.
    Fabric,
}

/// Whether teams use the LL (low-latency) kernels for small messages on the P2P path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LlMode {
    /// Where a team of 2..=8 ranks has the landing area, on the simulator and on CUDA (measured
    /// across NVLink: faster than the kernels without them at every size they serve).
    Auto,
    /// Always (where a team of 2..=8 ranks has the landing area).
    On,
    /// Never.
    Off,
}

/// Which engine teams across NVLink domains use between them when the application registered
/// none (`MCAST_NET`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetMode {
    /// NCCL where it loads (the default).
    Auto,
    /// NCCL; a team across domains fails where it does not load.
    Nccl,
    /// No engine: a team across domains is refused.
    None,
}

/// Most GPUs the simulator models in one process: the 72 of an NVL72 rack, so the largest teams
/// are tested without hardware.
pub const MAX_SIM_DEVICES: u32 = 72;

/// The range of one numeric setting: the same for its `MCAST_*` variable and its field of the
/// C struct (`mcast_config_t`), which name it in their warnings and errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    /// The field of `mcast_config_t`; empty for a setting the C struct has no field for.
    pub field: &'static str,
    /// The environment variable.
    pub var: &'static str,
    /// Smallest value accepted.
    pub min: u64,
    /// Largest value accepted.
    pub max: u64,
}

impl Range {
    /// True when `v` is accepted.
    pub fn contains(&self, v: u64) -> bool {
        (self.min..=self.max).contains(&v)
    }

    /// `config->field` outside the range: `InvalidArgument` naming the field, the value, the
    /// range and the variable.
    pub fn check_field(&self, v: u64) -> crate::runtime::error::Result<()> {
        if self.contains(v) {
            return Ok(());
        }
        Err(crate::runtime::error::Error::invalid_argument(format!(
            "config->{} = {v} is out of range ({} to {}; the environment's {} takes the same)",
            self.field, self.min, self.max, self.var
        )))
    }
}

/// `oom_retries`: at most 1000 (each retry waits up to 65536 back-offs).
pub const OOM_RETRIES: Range = Range { field: "oom_retries", var: "MCAST_OOM_RETRIES", min: 0, max: 1000 };
/// `retry_backoff_ms`: at most a minute.
pub const RETRY_BACKOFF_MS: Range =
    Range { field: "retry_backoff_ms", var: "MCAST_RETRY_BACKOFF_MS", min: 0, max: 60_000 };
/// `timeout_ms`: any `u32` (0 waits forever).
pub const TIMEOUT_MS: Range = Range { field: "timeout_ms", var: "MCAST_TIMEOUT_MS", min: 0, max: u32::MAX as u64 };
/// `sim_devices`: 1 to [`MAX_SIM_DEVICES`].
pub const SIM_DEVICES: Range =
    Range { field: "sim_devices", var: "MCAST_SIM_DEVICES", min: 1, max: MAX_SIM_DEVICES as u64 };
/// `sim_device_memory`: at least one byte.
pub const SIM_DEVICE_MEMORY: Range =
    Range { field: "sim_device_memory", var: "MCAST_SIM_DEVICE_MEMORY", min: 1, max: u64::MAX };
/// `sim_multicast_slots`: any `u32` (0: no multicast object can be made).
pub const SIM_MULTICAST_SLOTS: Range =
    Range { field: "sim_multicast_slots", var: "MCAST_SIM_MULTICAST_SLOTS", min: 0, max: u32::MAX as u64 };
/// `sim_multicast_supported`: 0 or 1.
pub const SIM_MULTICAST: Range = Range { field: "sim_multicast_supported", var: "MCAST_SIM_MULTICAST", min: 0, max: 1 };
/// `MCAST_DEVICE_SLOTS` (not in the C struct).
pub const DEVICE_SLOTS: Range = Range { field: "", var: "MCAST_DEVICE_SLOTS", min: 1, max: MAX_DEVICE_SLOTS as u64 };

/// The copy-engine threshold where [`Config::ce_min_bytes`] is left at auto, on the simulator:
/// where the copy engines start to win on 2 x H100 (measured: the SM kernels win below 64 MiB,
/// where the barrier kernels around the copies cost more than the copy engines' higher rate saves;
/// the copy engines move 3-10% more at 128 MiB, 6-14% at 1 GiB). On CUDA auto is off: a copy
/// already queued cannot be stopped, so ranks that disagree on a call would still write each
/// other's memory; `MCAST_CE_MIN_BYTES=64M` trades that for the bandwidth.
pub const DEFAULT_CE_MIN_BYTES: u64 = 64 << 20;

/// Device-API slots per team unless `MCAST_DEVICE_SLOTS` says otherwise
/// (`MCAST_DEV_DEFAULT_SLOTS` of `mcast/device.h`).
pub const DEFAULT_DEVICE_SLOTS: u32 = 256;
/// Most device-API slots a team may reserve.
pub const MAX_DEVICE_SLOTS: u32 = 65536;

/// Everything a context is configured with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Driver choice.
    pub backend: Backend,
    /// Multicast policy.
    pub multicast: MulticastMode,
    /// Extra attempts after OUT_OF_MEMORY / SYSTEM_NOT_READY / ILLEGAL_STATE.
    pub oom_retries: u32,
    /// First back-off in milliseconds, doubled per attempt.
    pub retry_backoff_ms: u32,
    /// Bound on waits for peers in milliseconds; 0 waits forever.
    pub timeout_ms: u32,
    /// Simulated GPUs.
    pub sim_devices: u32,
    /// Bytes per simulated GPU.
    pub sim_device_memory: u64,
    /// Multicast objects the simulated fabric holds.
    pub sim_multicast_slots: u32,
    /// Value of the simulated multicast-supported attribute.
    pub sim_multicast_supported: bool,
    /// Handle type of multi-process teams (`MCAST_HANDLE_TYPE`; not in the C config struct).
    pub handle_type: HandleTypeMode,
    /// Value of the simulated fabric-handle-supported attribute (`MCAST_SIM_FABRIC`; not in
    /// the C config struct): false for `0`, `off`, `none`.
    pub sim_fabric_supported: bool,
    /// The simulated NVLink fabric of this host and its clique (`MCAST_SIM_FABRIC=<name>[:<clique>]`);
    /// `None`: the one fabric every simulated host shares.
    pub sim_fabric: Option<(String, u32)>,
    /// The simulated host has an IMEX channel (`MCAST_SIM_IMEX`, default true).
    pub sim_imex: bool,
    /// `MCAST_DOMAIN`: ranks with equal labels form one NVLink domain, and no others.
    pub domain: Option<String>,
    /// `MCAST_MNNVL=off` makes this false: fabric information is ignored, every host is its
    /// own NVLink domain.
    pub mnnvl: bool,
    /// LL kernels for small messages (`MCAST_LL`; not in the C config struct). The ranks of a
    /// team agree at creation: LL runs only where every rank has it on.
    pub ll: LlMode,
    /// The ranks of a collective compare their calls' signatures (collective, dtype, op, root,
    /// count, offsets) at the kernels' entry and refuse a disagreement with INVALID_ARGUMENT
    /// (`MCAST_CHECK_CALLS`, default on; not in the C config struct). The ranks of a team agree
    /// at creation: the check runs where any rank has it on.
    pub check_calls: bool,
    /// Smallest message (bytes, as `mcast-bench` counts them: the whole gathered output of an
    /// all-gather, the message of a broadcast or all-reduce) that the P2P transport moves with
    /// the copy engines instead of SM kernels; 0 = never (`MCAST_CE_MIN_BYTES`; not in the C
    /// config struct). See `runtime::ce`.
    /// `None`: auto ([`DEFAULT_CE_MIN_BYTES`] on the simulator, off on CUDA: see
    /// [`DEFAULT_CE_MIN_BYTES`]).
    pub ce_min_bytes: Option<u64>,
    /// Barrier and signal slots each team reserves for the device API (`mcast/device.h`), apart
    /// from the library's own (`MCAST_DEVICE_SLOTS`, 1..=65536; not in the C struct). A
    /// multi-process team takes the largest any rank asks for.
    pub device_slots: u32,
    /// The variables a shared GPU host sets, as a simulated context sees them (not in the C
    /// config struct, never read from the environment): the NVLS kill switches and
    /// `CUDA_VISIBLE_DEVICES`. `None`, the default, reads the process environment; `Some(vars)`
    /// reads `vars` instead, so that a simulator test is hermetic (`Some(vec![])`: no switch
    /// and every simulated GPU visible, whatever the caller exported) or sets a variable for one
    /// context without touching the process. Ignored on CUDA: there the process environment
    /// always decides, so a site's switches stay honoured on real GPUs.
    pub sim_host_env: Option<Vec<(String, String)>>,
    /// The engine between NVLink domains when the application registered none (`MCAST_NET`:
    /// `auto`, `nccl`, `none`; not in the C config struct).
    pub net: NetMode,
    /// The NCCL library the NCCL engine loads (`MCAST_NET_NCCL`, an absolute path; not in the C
    /// config struct). `None`: `MCAST_NCCL_FALLBACK`'s, else `libnccl.so.2`.
    pub net_nccl: Option<String>,
    /// The NCCL library `libmcast_nccl` forwards to (`MCAST_NCCL_FALLBACK`), the NCCL engine's
    /// second choice (not in the C config struct).
    pub nccl_fallback: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            backend: Backend::Auto,
            multicast: MulticastMode::Auto,
            oom_retries: 3,
            retry_backoff_ms: 10,
            timeout_ms: crate::bootstrap::DEFAULT_TIMEOUT_MS,
            sim_devices: 4,
            sim_device_memory: 1 << 30,
            sim_multicast_slots: 128,
            sim_multicast_supported: true,
            handle_type: HandleTypeMode::Auto,
            sim_fabric_supported: true,
            sim_fabric: None,
            sim_imex: true,
            domain: None,
            mnnvl: true,
            ll: LlMode::Auto,
            check_calls: true,
            ce_min_bytes: None,
            device_slots: DEFAULT_DEVICE_SLOTS,
            sim_host_env: None,
            net: NetMode::Auto,
            net_nccl: None,
            nccl_fallback: None,
        }
    }
}

impl Config {
    /// The defaults, then every `MCAST_*` variable that is set. A malformed value is ignored
    /// with a warning that names the variable.
    pub fn from_env() -> Config {
        Config::default().with_env(|name| std::env::var(name).ok())
    }

    /// The configuration with the variables `lookup` returns applied.
    pub fn with_env(mut self, lookup: impl Fn(&str) -> Option<String>) -> Config {
        let get = |name: &str| lookup(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        if let Some(v) = get("MCAST_BACKEND") {
            match v.to_ascii_lowercase().as_str() {
                "auto" => self.backend = Backend::Auto,
                "cuda" => self.backend = Backend::Cuda,
                "sim" => self.backend = Backend::Sim,
                _ => warn_malformed("MCAST_BACKEND", &v, "auto, cuda or sim"),
            }
        }
        if let Some(v) = get("MCAST_MULTICAST") {
            match v.to_ascii_lowercase().as_str() {
                "auto" => self.multicast = MulticastMode::Auto,
                "off" => self.multicast = MulticastMode::Off,
                "require" => self.multicast = MulticastMode::Require,
                _ => warn_malformed("MCAST_MULTICAST", &v, "auto, off or require"),
            }
        }
        parse_into(&get, OOM_RETRIES, &mut self.oom_retries);
        parse_into(&get, RETRY_BACKOFF_MS, &mut self.retry_backoff_ms);
        parse_into(&get, TIMEOUT_MS, &mut self.timeout_ms);
        parse_into(&get, SIM_DEVICES, &mut self.sim_devices);
        if let Some(v) = get(SIM_DEVICE_MEMORY.var) {
            match parse_bytes(&v) {
                Some(n) if SIM_DEVICE_MEMORY.contains(n) => self.sim_device_memory = n,
                _ => warn_malformed(
                    SIM_DEVICE_MEMORY.var,
                    &v,
                    "a byte count of at least 1 such as 1073741824, 512M or 4G (sim_device_memory)",
                ),
            }
        }
        parse_into(&get, SIM_MULTICAST_SLOTS, &mut self.sim_multicast_slots);
        if let Some(v) = get(SIM_MULTICAST.var) {
            match parse_bool(&v) {
                Some(b) => self.sim_multicast_supported = b,
                None => warn_malformed(SIM_MULTICAST.var, &v, "0 or 1 (as config->sim_multicast_supported)"),
            }
        }
        if let Some(v) = get("MCAST_HANDLE_TYPE") {
            match v.to_ascii_lowercase().as_str() {
                "auto" => self.handle_type = HandleTypeMode::Auto,
                "posix" => self.handle_type = HandleTypeMode::Posix,
                "fabric" => self.handle_type = HandleTypeMode::Fabric,
                _ => warn_malformed("MCAST_HANDLE_TYPE", &v, "auto, posix or fabric"),
            }
        }
        if let Some(v) = get("MCAST_CE_MIN_BYTES") {
            match parse_bytes(&v) {
                Some(n) => self.ce_min_bytes = Some(n),
                None => warn_malformed("MCAST_CE_MIN_BYTES", &v, "a byte count such as 67108864, 64M or 0 (off)"),
            }
        }
        parse_into(&get, DEVICE_SLOTS, &mut self.device_slots);
        if let Some(v) = get("MCAST_SIM_FABRIC") {
            match (v.to_ascii_lowercase().as_str(), parse_bool(&v)) {
                ("none", _) | (_, Some(false)) => self.sim_fabric_supported = false,
                (_, Some(true)) => self.sim_fabric_supported = true,
                _ => match parse_fabric(&v) {
                    Some(f) => {
                        self.sim_fabric_supported = true;
                        self.sim_fabric = Some(f);
                    }
                    None => warn_malformed("MCAST_SIM_FABRIC", &v, "none, 1, or <name>[:<clique>]"),
                },
            }
        }
        if let Some(v) = get("MCAST_SIM_IMEX") {
            match parse_bool(&v) {
                Some(b) => self.sim_imex = b,
                None => warn_malformed("MCAST_SIM_IMEX", &v, "0 or 1"),
            }
        }
        if let Some(v) = get("MCAST_DOMAIN") {
            self.domain = Some(v);
        }
        if let Some(v) = get("MCAST_MNNVL") {
            match parse_bool(&v) {
                Some(b) => self.mnnvl = b,
                None => warn_malformed("MCAST_MNNVL", &v, "on or off"),
            }
        }
        if let Some(v) = get("MCAST_NET") {
            match v.to_ascii_lowercase().as_str() {
                "auto" => self.net = NetMode::Auto,
                "nccl" => self.net = NetMode::Nccl,
                "none" | "off" => self.net = NetMode::None,
                _ => warn_malformed("MCAST_NET", &v, "auto, nccl or none"),
            }
        }
        self.net_nccl = get("MCAST_NET_NCCL");
        self.nccl_fallback = get("MCAST_NCCL_FALLBACK");
        if let Some(v) = get("MCAST_CHECK_CALLS") {
            match parse_bool(&v) {
                Some(b) => self.check_calls = b,
                None => warn_malformed("MCAST_CHECK_CALLS", &v, "on or off"),
            }
        }
        if let Some(v) = get("MCAST_LL") {
            match v.to_ascii_lowercase().as_str() {
                "auto" => self.ll = LlMode::Auto,
                "on" | "1" => self.ll = LlMode::On,
                "off" | "0" => self.ll = LlMode::Off,
                _ => warn_malformed("MCAST_LL", &v, "auto, on or off"),
            }
        }
        self
    }

    /// `timeout_ms` as a duration; `None` waits forever.
    pub fn timeout(&self) -> Option<Duration> {
        (self.timeout_ms != 0).then(|| Duration::from_millis(u64::from(self.timeout_ms)))
    }
}

fn warn_malformed(name: &str, value: &str, expected: &str) {
    crate::logging::init();
    tracing::warn!("ignoring {name}={value:?}: expected {expected}");
}

/// Reads `range.var` into `field`; a value that is not an integer in the range is ignored with
/// a warning naming the variable, the range and the struct field (where the struct has one).
fn parse_into(get: &impl Fn(&str) -> Option<String>, range: Range, field: &mut u32) {
    if let Some(v) = get(range.var) {
        match v.parse::<u64>() {
            Ok(n) if range.contains(n) => *field = n as u32,
            _ if range.field.is_empty() => {
                warn_malformed(range.var, &v, &format!("an integer from {} to {}", range.min, range.max))
            }
            _ => warn_malformed(
                range.var,
                &v,
                &format!("an integer from {} to {} (as config->{})", range.min, range.max, range.field),
            ),
        }
    }
}

/// `123`, `4K`, `512M`, `4G` (binary multiples; an optional trailing `B`/`iB`).
pub fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim().to_ascii_uppercase();
    let t = t.strip_suffix("IB").or_else(|| t.strip_suffix('B')).unwrap_or(&t);
    let (digits, shift) = match t.chars().last()? {
        'K' => (&t[..t.len() - 1], 10),
        'M' => (&t[..t.len() - 1], 20),
        'G' => (&t[..t.len() - 1], 30),
        'T' => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    digits.trim().parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

/// `<name>[:<clique>]`: a name of letters, digits, `-`, `_`, `.`; a clique a `u32`.
fn parse_fabric(text: &str) -> Option<(String, u32)> {
    let (name, clique) = match text.split_once(':') {
        Some((n, c)) => (n, c.parse().ok()?),
        None => (text, 0),
    };
    let ok = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    ok.then(|| (name.to_string(), clique))
}

fn parse_bool(text: &str) -> Option<bool> {
    match text.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)]) -> Config {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::default().with_env(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_match_the_api_contract() {
        let c = Config::default();
        assert_eq!((c.oom_retries, c.retry_backoff_ms, c.timeout_ms), (3, 10, 30_000));
        assert_eq!((c.sim_devices, c.sim_device_memory, c.sim_multicast_slots), (4, 1 << 30, 128));
        assert!(c.sim_multicast_supported && c.sim_fabric_supported);
        assert_eq!(c.handle_type, HandleTypeMode::Auto);
        assert_eq!(c.ll, LlMode::Auto);
        assert_eq!(c.ce_min_bytes, None);
        assert_eq!(c.device_slots, 256);
        assert_eq!((c.backend, c.multicast), (Backend::Auto, MulticastMode::Auto));
    }

    #[test]
    fn variables_override_defaults() {
        let c = with(&[
            ("MCAST_BACKEND", "SIM"),
            ("MCAST_MULTICAST", "off"),
            ("MCAST_OOM_RETRIES", "5"),
            ("MCAST_TIMEOUT_MS", "0"),
            ("MCAST_SIM_DEVICES", "8"),
            ("MCAST_SIM_DEVICE_MEMORY", "512M"),
            ("MCAST_SIM_MULTICAST", "0"),
            ("MCAST_HANDLE_TYPE", "Posix"),
            ("MCAST_SIM_FABRIC", "off"),
            ("MCAST_LL", "On"),
            ("MCAST_CE_MIN_BYTES", "256M"),
        ]);
        assert_eq!(c.ll, LlMode::On);
        assert_eq!(with(&[("MCAST_LL", "0")]).ll, LlMode::Off);
        assert_eq!(c.ce_min_bytes, Some(256 << 20));
        assert_eq!(with(&[("MCAST_CE_MIN_BYTES", "0")]).ce_min_bytes, Some(0));
        assert_eq!(c.handle_type, HandleTypeMode::Posix);
        assert!(!c.sim_fabric_supported);
        let f = with(&[("MCAST_SIM_FABRIC", "rack-1:7"), ("MCAST_SIM_IMEX", "0"), ("MCAST_DOMAIN", "A")]);
        assert_eq!((f.sim_fabric, f.sim_fabric_supported, f.sim_imex), (Some(("rack-1".into(), 7)), true, false));
        assert_eq!(f.domain.as_deref(), Some("A"));
        assert!(!with(&[("MCAST_SIM_FABRIC", "none")]).sim_fabric_supported);
        assert!(!with(&[("MCAST_MNNVL", "off")]).mnnvl);
        assert_eq!(c.net, NetMode::Auto);
        let n = with(&[("MCAST_NET", "NCCL"), ("MCAST_NET_NCCL", "/opt/nccl/libnccl.so.2")]);
        assert_eq!((n.net, n.net_nccl.as_deref()), (NetMode::Nccl, Some("/opt/nccl/libnccl.so.2")));
        assert_eq!(with(&[("MCAST_NET", "none")]).net, NetMode::None);
        assert_eq!(with(&[("MCAST_NET", "mpi")]).net, NetMode::Auto, "malformed: the default stays");
        assert_eq!(c.backend, Backend::Sim);
        assert_eq!(c.multicast, MulticastMode::Off);
        assert_eq!(c.oom_retries, 5);
        assert_eq!(c.timeout(), None);
        assert_eq!(c.sim_devices, 8);
        assert_eq!(c.sim_device_memory, 512 << 20);
        assert!(!c.sim_multicast_supported);
        assert_eq!(with(&[("MCAST_DEVICE_SLOTS", "1024")]).device_slots, 1024);
        assert!(!with(&[("MCAST_CHECK_CALLS", "off")]).check_calls);
        assert!(with(&[("MCAST_CHECK_CALLS", "maybe")]).check_calls, "malformed: the default, on");
        assert_eq!(with(&[("MCAST_DEVICE_SLOTS", "0")]).device_slots, DEFAULT_DEVICE_SLOTS);
        assert_eq!(with(&[("MCAST_DEVICE_SLOTS", "65537")]).device_slots, DEFAULT_DEVICE_SLOTS);
    }

    #[test]
    fn the_environment_and_the_struct_share_ranges() {
        assert_eq!(with(&[("MCAST_OOM_RETRIES", "1000")]).oom_retries, 1000);
        assert_eq!(with(&[("MCAST_OOM_RETRIES", "1001")]).oom_retries, Config::default().oom_retries);
        assert_eq!(with(&[("MCAST_SIM_DEVICES", "72")]).sim_devices, 72);
        assert_eq!(with(&[("MCAST_SIM_DEVICES", "73")]).sim_devices, Config::default().sim_devices);
        assert_eq!(with(&[("MCAST_TIMEOUT_MS", "4294967295")]).timeout_ms, u32::MAX);
        assert_eq!(with(&[("MCAST_TIMEOUT_MS", "4294967296")]).timeout_ms, Config::default().timeout_ms);
        assert!(OOM_RETRIES.check_field(1000).is_ok());
        let e = OOM_RETRIES.check_field(1001).unwrap_err();
        assert!(e.message.contains("oom_retries = 1001") && e.message.contains("0 to 1000"), "{e}");
        assert!(e.message.contains("MCAST_OOM_RETRIES"), "{e}");
    }

    #[test]
    fn malformed_values_are_ignored() {
        let c = with(&[
            ("MCAST_BACKEND", "gpu"),
            ("MCAST_OOM_RETRIES", "-1"),
            ("MCAST_SIM_DEVICES", "0"),
            ("MCAST_SIM_DEVICE_MEMORY", "lots"),
            ("MCAST_TIMEOUT_MS", "1e3"),
            ("MCAST_HANDLE_TYPE", "nvlink"),
            ("MCAST_SIM_FABRIC", "a b"),
            ("MCAST_SIM_IMEX", "maybe"),
            ("MCAST_MNNVL", "sometimes"),
            ("MCAST_LL", "fast"),
            ("MCAST_CE_MIN_BYTES", "-1"),
        ]);
        assert_eq!(c, Config::default());
    }

    #[test]
    fn byte_sizes_parse() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("4K"), Some(4096));
        assert_eq!(parse_bytes("2MiB"), Some(2 << 20));
        assert_eq!(parse_bytes("1g"), Some(1 << 30));
        assert_eq!(parse_bytes("x"), None);
        assert_eq!(parse_bytes("99999999999T"), None);
    }
}
