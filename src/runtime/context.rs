//! A context: picks the backend (CUDA or simulated), builds the [`Env`] its teams share, and
//! reports devices, live counts and, at shutdown, what was left.

use std::ops::Deref;
use std::sync::{Arc, Once, OnceLock};

use super::config::{Backend, Config};
use super::env::{Env, Member};
use super::error::{Error, ErrorKind, Result};
use super::registry::ResourceCounts;
use crate::driver::cuda::CudaDriver;
use crate::driver::sim::{parse_faults, SimConfig, SimDriver};
use crate::driver::{Device, DeviceOps, DeviceProps, Driver, FabricInfo, Granularity, HandleTypes, MulticastProp};

/// A context. It dereferences to its `Arc<Env>`, so `&ctx` is what teams, buffers and user
/// memory take, and `ctx.driver()`, `ctx.resources` and `ctx.memory` read the shared part.
pub struct Context {
    env: Arc<Env>,
    backend: Backend,
    backend_reason: String,
}

impl Deref for Context {
    type Target = Arc<Env>;

    fn deref(&self) -> &Arc<Env> {
        &self.env
    }
}

/// What `mcast_device_get_info` reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Ordinal.
    pub ordinal: Device,
    /// The driver's properties of the device.
    pub props: DeviceProps,
    /// Multicast usable after policy, kill switches and checks.
    pub multicast_usable: bool,
    /// Why not usable, or empty.
    pub multicast_reason: String,
    /// Multicast granularity, MINIMUM. 0 where multicast is not usable on the device (see
    /// `multicast_reason`): off by `MCAST_MULTICAST=off` or the config, a site kill switch set
    /// (the driver is then not asked: no `cuMulticast*` call is made), no driver support; 0 also
    /// where the driver cannot report it.
    pub granularity_min: u64,
    /// Multicast granularity, RECOMMENDED (0 likewise).
    pub granularity_recommended: u64,
    /// The GPU's NVLink fabric (all zeros and [`FabricState::None`](crate::driver::FabricState::None) where there is none).
    pub fabric: FabricInfo,
}

/// Live teams, buffers and driver resources.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveCounts {
    /// Teams.
    pub teams: u64,
    /// Buffers.
    pub buffers: u64,
    /// Driver resources.
    pub resources: ResourceCounts,
}

/// The CUDA driver, loaded once per process.
fn cuda_driver() -> std::result::Result<Arc<CudaDriver>, String> {
    static CUDA: OnceLock<std::result::Result<Arc<CudaDriver>, String>> = OnceLock::new();
    CUDA.get_or_init(|| {
        if !crate::driver::cuda::library_present() {
            let loader = crate::driver::cuda::library_error().unwrap_or_else(|| "no candidate name loads".into());
            return Err(format!("libcuda.so.1 (the NVIDIA driver) could not be loaded ({loader})"));
        }
        cuda_driver_load()
    })
    .clone()
}

fn cuda_driver_load() -> std::result::Result<Arc<CudaDriver>, String> {
    match CudaDriver::load() {
        Ok(d) => match d.device_count() {
            Ok(n) if n > 0 => Ok(Arc::new(d)),
            Ok(_) => Err("the CUDA driver reports no device".to_string()),
            Err(e) => Err(format!("the CUDA driver cannot count devices: {e}")),
        },
        Err(e) => Err(format!("the CUDA driver is unavailable: {e}")),
    }
}

/// The warning that backend AUTO found no usable CUDA driver and runs on the simulator: at warn,
/// the default level, once per process (the first such context), so that a GPU job whose
/// container lacks the driver does not pass unnoticed.
fn warn_simulator_fallback(why: &str) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| tracing::warn!("{}", simulator_fallback_warning(why)));
}

/// The text of that warning: why, what runs instead, and how to make it an error.
pub fn simulator_fallback_warning(why: &str) -> String {
    format!(
        "no usable CUDA driver: {why}; running on the SIMULATOR (host memory, no GPU). \
         Set MCAST_BACKEND=cuda to make this an error, or MCAST_BACKEND=sim to choose the simulator \
         without this warning"
    )
}

impl Context {
    /// A context for `config`: picks the backend and records why.
    pub fn new(config: Config) -> Result<Context> {
        crate::logging::init();
        let (driver, backend, backend_reason): (Arc<dyn Driver>, Backend, String) = match config.backend {
            Backend::Sim => (Arc::new(Self::simulator(&config)?), Backend::Sim, "backend SIM requested".into()),
            Backend::Cuda => match cuda_driver() {
                Ok(d) => (d, Backend::Cuda, "backend CUDA requested".into()),
                Err(why) => {
                    return Err(Error::new(
                        ErrorKind::DriverUnavailable,
                        format!("{why}; install the NVIDIA driver (libcuda.so.1) or use MCAST_BACKEND=sim"),
                    ))
                }
            },
            Backend::Auto => match cuda_driver() {
                Ok(d) => (d, Backend::Cuda, "a CUDA driver and a device were found".into()),
                Err(why) => {
                    warn_simulator_fallback(&why);
                    let reason = format!("{why}; using the simulator (MCAST_BACKEND=cuda makes this an error)");
                    (Arc::new(Self::simulator(&config)?), Backend::Sim, reason)
                }
            },
        };
        let count = driver.device_count().map_err(|e| Error::driver(e, "counting devices"))?.max(0) as usize;
        tracing::info!("context on backend {} ({backend_reason}), {count} device(s)", driver.backend_name());
        Ok(Context { env: Arc::new(Env::new(driver, config, count)), backend, backend_reason })
    }

    fn simulator(config: &Config) -> Result<SimDriver> {
        let faults = match std::env::var("MCAST_SIM_FAULTS") {
            Ok(spec) if !spec.trim().is_empty() => {
                parse_faults(&spec).map_err(|e| Error::invalid_argument(format!("MCAST_SIM_FAULTS={spec:?}: {e}")))?
            }
            _ => Default::default(),
        };
        Ok(SimDriver::new(SimConfig {
            devices: config.sim_devices,
            device_memory: config.sim_device_memory,
            multicast_slots: config.sim_multicast_slots,
            multicast_supported: config.sim_multicast_supported,
            fabric_supported: config.sim_fabric_supported,
            faults,
            visible: match &config.sim_host_env {
                Some(vars) => vars.iter().find(|(n, _)| n == "CUDA_VISIBLE_DEVICES").map(|(_, v)| v.clone()),
                None => std::env::var("CUDA_VISIBLE_DEVICES").ok(),
            },
            fabric: config.sim_fabric.clone().unwrap_or_else(|| (crate::driver::sim::DEFAULT_FABRIC.to_string(), 0)),
            imex: config.sim_imex,
            ..SimConfig::default()
        }))
    }

    /// The backend in use (never `Auto`) and why it was chosen.
    pub fn backend(&self) -> (Backend, &str) {
        (self.backend, &self.backend_reason)
    }

    /// Everything `mcast_device_get_info` reports.
    pub fn device_info(&self, dev: i32) -> Result<DeviceInfo> {
        let props = self.props(dev)?;
        let reason = self.multicast_reason(dev)?;
        let driver = self.driver();
        // Asked only where multicast is usable: with multicast off (by the mode or a kill
        // switch) nothing calls a cuMulticast* function.
        let (granularity_min, granularity_recommended) = if reason.is_none() {
            let prop = MulticastProp { num_devices: 1, size: 0, handle_types: HandleTypes::NONE, flags: 0 };
            let g = |o| driver.multicast_granularity(&prop, o).map(|g| g as u64).unwrap_or(0);
            (g(Granularity::Minimum), g(Granularity::Recommended))
        } else {
            (0, 0)
        };
        Ok(DeviceInfo {
            ordinal: dev,
            props,
            multicast_usable: reason.is_none(),
            multicast_reason: reason.unwrap_or_default(),
            granularity_min,
            granularity_recommended,
            fabric: self.fabric(dev)?,
        })
    }

    /// The shared part, as teams hold it.
    pub fn env(&self) -> &Arc<Env> {
        &self.env
    }

    /// The live teams.
    pub fn teams(&self) -> Vec<Arc<dyn Member>> {
        self.env.members()
    }

    /// Teams, buffers and resources alive now.
    pub fn live_counts(&self) -> LiveCounts {
        let teams = self.teams();
        LiveCounts {
            teams: teams.len() as u64,
            buffers: teams.iter().map(|t| t.live_buffers() as u64).sum(),
            resources: self.resources.counts(),
        }
    }

    /// Destroys every team still alive (their buffers first) and returns what was left, as a
    /// report (empty when nothing was).
    pub fn shutdown(&self) -> String {
        // The registered engine is released once no team holds it (`mcast_net_ops_t.release`).
        self.env.set_net(None);
        let teams = self.env.take_members();
        let mut report = String::new();
        for team in &teams {
            let buffers = team.live_buffers();
            report.push_str(&format!(
                "team of {} rank(s) on devices {:?} with {buffers} buffer(s) was not destroyed\n",
                team.size(),
                team.devices()
            ));
        }
        let user = self.memory.live();
        if user > 0 {
            report.push_str(&format!("{user} mcast_mem_alloc allocation(s) were not freed\n"));
        }
        let resources = self.resources.report();
        report.push_str(&resources);
        for team in teams {
            for e in team.release_all() {
                tracing::error!("releasing a leaked team: {e}");
            }
        }
        // After the teams: registered buffers unbind and unmap before the memory goes.
        self.memory.release_all(&self.env);
        for e in self.env.release_leftovers() {
            tracing::error!("releasing what an earlier failed release left: {e}");
        }
        if !self.resources.is_empty() {
            tracing::error!("driver resources still tracked after shutdown:\n{}", self.resources.report());
        }
        report
    }
}
