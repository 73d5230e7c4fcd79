//! A context: one driver (CUDA or simulated), its configuration, the teams created in it and
//! every driver resource they hold.

use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::config::{Backend, Config};
use super::error::{Error, ErrorKind, Result};
use super::memory::UserMemory;
use super::policy;
use super::registry::{ResourceCounts, Resources};
use super::segment::Segment;
use super::team::Team;
use crate::driver::cuda::CudaDriver;
use crate::driver::sim::{parse_faults, SimConfig, SimDriver};
use crate::driver::{Device, DeviceProps, Driver, Granularity, HandleTypes, MulticastProp};

/// A context.
pub struct Context {
    config: Config,
    driver: Arc<dyn Driver>,
    backend: Backend,
    backend_reason: String,
    /// Every driver resource held by this context's teams.
    pub resources: Resources,
    props: Vec<OnceLock<DeviceProps>>,
    teams: Mutex<Vec<Arc<Team>>>,
    /// Segments whose release failed part-way; retried at shutdown.
    parked: Mutex<Vec<Arc<Segment>>>,
    /// `mcast_mem_alloc` memory and live registrations.
    pub memory: UserMemory,
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
    /// Multicast granularity, MINIMUM (0 where the driver has no multicast entry points or cannot
    /// report it for this device).
    pub granularity_min: u64,
    /// Multicast granularity, RECOMMENDED (0 likewise).
    pub granularity_recommended: u64,
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
            return Err("libcuda.so.1 (the NVIDIA driver) could not be loaded".to_string());
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

impl Context {
    /// A context for `config`: picks the backend and records why.
    pub fn new(config: Config) -> Result<Context> {
        super::logging::init();
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
                Err(why) => (Arc::new(Self::simulator(&config)?), Backend::Sim, format!("{why}; using the simulator")),
            },
        };
        let count = driver.device_count().map_err(|e| Error::driver(e, "counting devices"))?.max(0) as usize;
        tracing::info!("context on backend {} ({backend_reason}), {count} device(s)", driver.backend_name());
        Ok(Context {
            config,
            driver,
            backend,
            backend_reason,
            resources: Resources::default(),
            props: (0..count).map(|_| OnceLock::new()).collect(),
            teams: Mutex::new(Vec::new()),
            parked: Mutex::new(Vec::new()),
            memory: UserMemory::default(),
        })
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
            ..SimConfig::default()
        }))
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The driver.
    pub fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    /// The backend in use (never `Auto`) and why it was chosen.
    pub fn backend(&self) -> (Backend, &str) {
        (self.backend, &self.backend_reason)
    }

    /// Number of devices.
    pub fn device_count(&self) -> usize {
        self.props.len()
    }

    /// Checks `dev` is a device of this context.
    pub fn check_device(&self, dev: i32, what: &str) -> Result<Device> {
        if dev < 0 || dev as usize >= self.props.len() {
            return Err(Error::invalid_argument(format!(
                "{what} {dev} is out of range: this context has {} device(s)",
                self.props.len()
            )));
        }
        Ok(dev)
    }

    /// The driver's properties of `dev` (queried once).
    pub fn props(&self, dev: Device) -> Result<DeviceProps> {
        let dev = self.check_device(dev, "device")?;
        let cell = &self.props[dev as usize];
        if let Some(p) = cell.get() {
            return Ok(p.clone());
        }
        let p = self.driver.device_props(dev).map_err(|e| Error::driver(e, format_args!("querying device {dev}")))?;
        Ok(cell.get_or_init(|| p).clone())
    }

    /// Why `dev` cannot use multicast, or `None`.
    pub fn multicast_reason(&self, dev: Device) -> Result<Option<String>> {
        let props = self.props(dev)?;
        Ok(policy::device_reason(self.config.multicast, self.driver.has_multicast_api(), dev, &props))
    }

    /// Everything `mcast_device_get_info` reports.
    pub fn device_info(&self, dev: i32) -> Result<DeviceInfo> {
        let props = self.props(dev)?;
        let reason = self.multicast_reason(dev)?;
        let (granularity_min, granularity_recommended) = if self.driver.has_multicast_api() {
            let prop = MulticastProp { num_devices: 1, size: 0, handle_types: HandleTypes::NONE, flags: 0 };
            let g = |o| self.driver.multicast_granularity(&prop, o).map(|g| g as u64).unwrap_or(0);
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
        })
    }

    /// `cuDeviceCanAccessPeer` (a device reaches itself).
    pub fn can_access_peer(&self, dev: i32, peer: i32) -> Result<bool> {
        let dev = self.check_device(dev, "device")?;
        let peer = self.check_device(peer, "peer")?;
        if dev == peer {
            return Ok(true);
        }
        self.driver
            .can_access_peer(dev, peer)
            .map_err(|e| Error::driver(e, format_args!("asking whether device {dev} can access device {peer}")))
    }

    /// Remembers a team created in this context.
    pub fn add_team(&self, team: Arc<Team>) {
        self.teams.lock().push(team);
    }

    /// Forgets a destroyed team.
    pub fn remove_team(&self, team: &Arc<Team>) {
        self.teams.lock().retain(|t| !Arc::ptr_eq(t, team));
    }

    /// Keeps a segment whose release failed part-way, to retry at shutdown.
    pub fn park(&self, seg: Arc<Segment>) {
        self.parked.lock().push(seg);
    }

    /// The live teams.
    pub fn teams(&self) -> Vec<Arc<Team>> {
        self.teams.lock().clone()
    }

    /// Releases every empty segment every team keeps cached; returns the bytes freed per rank.
    pub fn trim_caches(&self) -> u64 {
        self.teams().iter().map(|t| t.trim_cache()).sum()
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
        let teams = std::mem::take(&mut *self.teams.lock());
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
        self.memory.release_all(self);
        for seg in std::mem::take(&mut *self.parked.lock()) {
            for e in seg.teardown(self) {
                tracing::error!("releasing what an earlier failed release left: {e}");
            }
        }
        if !self.resources.is_empty() {
            tracing::error!("driver resources still tracked after shutdown:\n{}", self.resources.report());
        }
        report
    }
}
