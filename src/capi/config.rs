//! `mcast_config_t` and its enums.

use std::mem::size_of;

use crate::runtime::config::{
    Backend, Config, MulticastMode, OOM_RETRIES, RETRY_BACKOFF_MS, SIM_DEVICES, SIM_DEVICE_MEMORY, SIM_MULTICAST,
    SIM_MULTICAST_SLOTS, TIMEOUT_MS,
};
use crate::runtime::{Error, Result};

/// Which driver a context uses.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum McastBackend {
    /// CUDA when a driver and a device exist, else the simulator.
    MCAST_BACKEND_AUTO = 0,
    /// The CUDA driver (`libcuda.so.1`).
    MCAST_BACKEND_CUDA = 1,
    /// The simulated driver: host memory, no GPU needed.
    MCAST_BACKEND_SIM = 2,
}

/// Values of `mcast_backend_t`, carried as an integer.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct mcast_backend_t(pub u32);

/// Whether teams use multicast.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum McastMulticast {
    /// Use multicast where usable, else peer-to-peer.
    MCAST_MULTICAST_AUTO = 0,
    /// Never use multicast.
    MCAST_MULTICAST_OFF = 1,
    /// A team that cannot use multicast is an error naming the reason.
    MCAST_MULTICAST_REQUIRE = 2,
}

/// Values of `mcast_multicast_t`, carried as an integer.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct mcast_multicast_t(pub u32);

/// Context configuration. Fill it with `mcast_config_init`, then change fields.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mcast_config_t {
    /// `sizeof(mcast_config_t)`.
    pub struct_size: u32,
    /// AUTO: CUDA when a driver and a device exist, else SIM.
    pub backend: mcast_backend_t,
    /// AUTO: use multicast where usable, else peer-to-peer.
    pub multicast: mcast_multicast_t,
    /// Extra attempts after OUT_OF_MEMORY / SYSTEM_NOT_READY / ILLEGAL_STATE, 0 to 1000; default 3.
    pub oom_retries: u32,
    /// First back-off in milliseconds, doubled per attempt, 0 to 60000; default 10.
    pub retry_backoff_ms: u32,
    /// Bound on waits for peers (device barriers, blocking steps); default 30000; 0 = forever.
    pub timeout_ms: u32,
    /// SIM: number of simulated GPUs, 1 to 72; default 4.
    pub sim_devices: u32,
    /// SIM: bytes per simulated GPU; default 1 GiB.
    pub sim_device_memory: u64,
    /// SIM: multicast objects the simulated fabric holds; default 128.
    pub sim_multicast_slots: u32,
    /// SIM: value of the multicast-supported attribute; default 1.
    pub sim_multicast_supported: u32,
}

/// The environment variables that `mcast_config_t`'s own fields stand for: with a filled struct
/// they are not read (the struct wins); every other `MCAST_*` setting comes from the environment.
const STRUCT_VARS: [&str; 9] = [
    "MCAST_BACKEND",
    "MCAST_MULTICAST",
    OOM_RETRIES.var,
    RETRY_BACKOFF_MS.var,
    TIMEOUT_MS.var,
    SIM_DEVICES.var,
    SIM_DEVICE_MEMORY.var,
    SIM_MULTICAST_SLOTS.var,
    SIM_MULTICAST.var,
];

impl mcast_config_t {
    /// The C struct for `c`.
    pub fn from_config(c: &Config) -> Self {
        mcast_config_t {
            struct_size: size_of::<mcast_config_t>() as u32,
            backend: mcast_backend_t(match c.backend {
                Backend::Auto => McastBackend::MCAST_BACKEND_AUTO,
                Backend::Cuda => McastBackend::MCAST_BACKEND_CUDA,
                Backend::Sim => McastBackend::MCAST_BACKEND_SIM,
            } as u32),
            multicast: mcast_multicast_t(match c.multicast {
                MulticastMode::Auto => McastMulticast::MCAST_MULTICAST_AUTO,
                MulticastMode::Off => McastMulticast::MCAST_MULTICAST_OFF,
                MulticastMode::Require => McastMulticast::MCAST_MULTICAST_REQUIRE,
            } as u32),
            oom_retries: c.oom_retries,
            retry_backoff_ms: c.retry_backoff_ms,
            timeout_ms: c.timeout_ms,
            sim_devices: c.sim_devices,
            sim_device_memory: c.sim_device_memory,
            sim_multicast_slots: c.sim_multicast_slots,
            sim_multicast_supported: u32::from(c.sim_multicast_supported),
        }
    }

    /// The runtime configuration, checking every field a caller may have set; the settings the
    /// C struct has no field for come from the environment.
    pub fn to_config(&self) -> Result<Config> {
        self.config_with_env(|name| std::env::var(name).ok())
    }

    /// [`to_config`](Self::to_config) with the variables `lookup` returns: only those of the
    /// settings without a field in the C struct are read (the struct's fields win).
    fn config_with_env(&self, lookup: impl Fn(&str) -> Option<String>) -> Result<Config> {
        super::check_struct_size(self.struct_size, size_of::<mcast_config_t>(), "mcast_config_t")?;
        let backend = match self.backend.0 {
            0 => Backend::Auto,
            1 => Backend::Cuda,
            2 => Backend::Sim,
            v => return Err(Error::invalid_argument(format!("config->backend = {v} is not an mcast_backend_t"))),
        };
        let multicast = match self.multicast.0 {
            0 => MulticastMode::Auto,
            1 => MulticastMode::Off,
            2 => MulticastMode::Require,
            v => return Err(Error::invalid_argument(format!("config->multicast = {v} is not an mcast_multicast_t"))),
        };
        // The ranges the environment takes (runtime::config), checked the same way.
        OOM_RETRIES.check_field(self.oom_retries.into())?;
        RETRY_BACKOFF_MS.check_field(self.retry_backoff_ms.into())?;
        TIMEOUT_MS.check_field(self.timeout_ms.into())?;
        if backend != Backend::Cuda {
            SIM_DEVICES.check_field(self.sim_devices.into())?;
            SIM_DEVICE_MEMORY.check_field(self.sim_device_memory)?;
        }
        SIM_MULTICAST_SLOTS.check_field(self.sim_multicast_slots.into())?;
        SIM_MULTICAST.check_field(self.sim_multicast_supported.into())?;
        Ok(Config {
            backend,
            multicast,
            oom_retries: self.oom_retries,
            retry_backoff_ms: self.retry_backoff_ms,
            timeout_ms: self.timeout_ms,
            sim_devices: self.sim_devices,
            sim_device_memory: self.sim_device_memory,
            sim_multicast_slots: self.sim_multicast_slots,
            sim_multicast_supported: self.sim_multicast_supported == 1,
            // Every setting the C struct lacks comes from the environment; the struct's own
            // variables are not read (the struct wins), so a new variable needs no list here.
            ..Config::default().with_env(|name| if STRUCT_VARS.contains(&name) { None } else { lookup(name) })
        })
    }
}

/// Fills `*config` with the defaults, then applies the `MCAST_*` environment variables (a
/// malformed or out-of-range value is ignored with a warning naming the variable, its range and
/// the field), and sets `struct_size`. `mcast_context_create` accepts each field in the same
/// range as its variable (docs/environment.md), else `MCAST_ERROR_INVALID_ARGUMENT` naming both. NULL is
/// ignored. Thread-safe.
///
/// # Safety
/// `config` must be NULL or valid for writing an `mcast_config_t`.
#[no_mangle]
pub unsafe extern "C" fn mcast_config_init(config: *mut mcast_config_t) {
    let _ = super::guard("mcast_config_init", || {
        // SAFETY: the caller passes NULL or a valid pointer.
        if let Some(out) = unsafe { config.as_mut() } {
            *out = mcast_config_t::from_config(&Config::from_env());
        }
        Ok(())
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::ErrorKind;

    #[test]
    fn round_trip_and_checks() {
        let c = Config { sim_devices: 3, ..Config::default() };
        let raw = mcast_config_t::from_config(&c);
        assert_eq!(raw.to_config().unwrap(), c);
        let bad = mcast_config_t { backend: mcast_backend_t(77), ..raw };
        assert_eq!(bad.to_config().unwrap_err().kind, ErrorKind::InvalidArgument);
        let bad = mcast_config_t { multicast: mcast_multicast_t(3), ..raw };
        assert!(bad.to_config().unwrap_err().message.contains("multicast = 3"));
        let bad = mcast_config_t { struct_size: 8, ..raw };
        assert!(bad.to_config().unwrap_err().message.contains("struct_size"));
        let bad = mcast_config_t { sim_devices: 0, ..raw };
        assert_eq!(bad.to_config().unwrap_err().kind, ErrorKind::InvalidArgument);
        let most = mcast_config_t { sim_devices: 72, ..raw };
        assert_eq!(most.to_config().unwrap().sim_devices, 72);
        let bad = mcast_config_t { sim_devices: 73, ..raw };
        assert!(bad.to_config().unwrap_err().message.contains("1 to 72"));
        // The environment's ranges: MCAST_OOM_RETRIES=1000 is taken in both, 1001 in neither.
        assert_eq!(mcast_config_t { oom_retries: 1000, ..raw }.to_config().unwrap().oom_retries, 1000);
        let e = mcast_config_t { oom_retries: 1001, ..raw }.to_config().unwrap_err();
        assert!(e.message.contains("config->oom_retries = 1001 is out of range (0 to 1000"), "{e}");
        assert!(e.message.contains("MCAST_OOM_RETRIES"), "{e}");
        let e = mcast_config_t { retry_backoff_ms: 60_001, ..raw }.to_config().unwrap_err();
        assert!(e.message.contains("retry_backoff_ms") && e.message.contains("MCAST_RETRY_BACKOFF_MS"), "{e}");
        let e = mcast_config_t { sim_multicast_supported: 2, ..raw }.to_config().unwrap_err();
        assert!(e.message.contains("sim_multicast_supported = 2") && e.message.contains("0 to 1"), "{e}");
    }

    #[test]
    fn settings_without_a_field_come_from_the_environment() {
        let raw = mcast_config_t::from_config(&Config::default());
        let env = |name: &str| match name {
            "MCAST_LL" => Some("off".to_string()),
            "MCAST_HANDLE_TYPE" => Some("posix".to_string()),
            // Every setting without a field, including those added after the struct.
            "MCAST_DEVICE_SLOTS" => Some("1000".to_string()),
            // A struct field: the struct wins.
            "MCAST_TIMEOUT_MS" => Some("5".to_string()),
            "MCAST_SIM_DEVICES" => Some("9".to_string()),
            _ => None,
        };
        let c = raw.config_with_env(env).unwrap();
        assert_eq!(c.device_slots, 1000, "MCAST_DEVICE_SLOTS with a filled mcast_config_t");
        assert_eq!(c.sim_devices, Config::default().sim_devices);
        assert_eq!(c.ll, crate::runtime::config::LlMode::Off);
        assert_eq!(c.handle_type, crate::runtime::config::HandleTypeMode::Posix);
        assert_eq!(c.timeout_ms, Config::default().timeout_ms);
    }
}
