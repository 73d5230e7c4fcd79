//! What teams, segments, retries and user memory need of their context, as one value:
//! [`Env`] (driver, configuration, resource ledger, device checks, the teams and leftovers the
//! context drains at shutdown). `Context` builds it and hands out `Arc<Env>`; `Env` never names a
//! team or a segment, it sees them as [`Member`] and [`Leftover`].

use std::fmt;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::config::{Config, LlMode};
use super::error::{Error, Result};
use super::memory::UserMemory;
use super::net::Engine;
use super::policy;
use super::registry::Resources;
use crate::driver::{
    CuResult, Device, DeviceProps, DevicePtr, Driver, FabricInfo, Granularity, HandleTypes, MulticastProp,
};

/// What the context needs of a team it holds (implemented by `Team`).
pub trait Member: Send + Sync {
    /// Releases every cached empty segment; returns the bytes freed per rank.
    fn trim_cache(&self) -> u64;
    /// Buffers alive.
    fn live_buffers(&self) -> usize;
    /// Ranks.
    fn size(&self) -> usize;
    /// Device of each rank.
    fn devices(&self) -> &[Device];
    /// Releases everything the team holds, live buffers or not; returns the teardown errors.
    fn release_all(&self) -> Vec<Error>;
}

/// What a failed release left (implemented by `Segment`): released again at shutdown.
pub trait Leftover: Send + Sync {
    /// Retries the release; returns what still fails.
    fn release(&self, env: &Env) -> Vec<Error>;
}

/// The shared part of a context.
pub struct Env {
    driver: Arc<dyn Driver>,
    config: Config,
    /// Every driver resource held by this context's teams.
    pub resources: Resources,
    /// `mcast_mem_alloc` memory and live registrations.
    pub memory: UserMemory,
    props: Vec<OnceLock<DeviceProps>>,
    members: Mutex<Vec<Arc<dyn Member>>>,
    /// Releases that failed part-way; retried at shutdown.
    leftovers: Mutex<Vec<Arc<dyn Leftover>>>,
    /// The engine between NVLink domains the application registered (`mcast_context_set_net`).
    net: Mutex<Option<Arc<dyn Engine>>>,
}

impl Env {
    /// The environment of a context over `driver`, which reports `devices` devices.
    pub fn new(driver: Arc<dyn Driver>, config: Config, devices: usize) -> Env {
        Env {
            driver,
            config,
            resources: Resources::default(),
            memory: UserMemory::default(),
            props: (0..devices).map(|_| OnceLock::new()).collect(),
            members: Mutex::new(Vec::new()),
            leftovers: Mutex::new(Vec::new()),
            net: Mutex::new(None),
        }
    }

    /// Registers the engine between NVLink domains for teams made from now on (`None`: back to
    /// `MCAST_NET`). Teams already made keep theirs.
    pub fn set_net(&self, engine: Option<Arc<dyn Engine>>) {
        *self.net.lock() = engine;
    }

    /// The engine the application registered, if any.
    pub fn registered_net(&self) -> Option<Arc<dyn Engine>> {
        self.net.lock().clone()
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Whether this process wants the LL kernels for its teams ([`LlMode`]: `auto` is on).
    pub fn ll_wanted(&self) -> bool {
        self.config.ll != LlMode::Off
    }

    /// This process's copy-engine threshold ([`Config::ce_min_bytes`], auto resolved: the
    /// default on the simulator, off on CUDA: see [`super::config::DEFAULT_CE_MIN_BYTES`]); 0 =
    /// off.
    pub fn ce_min_bytes(&self) -> u64 {
        let auto = if self.driver.as_sim().is_some() { super::config::DEFAULT_CE_MIN_BYTES } else { 0 };
        self.config.ce_min_bytes.unwrap_or(auto)
    }

    /// The driver.
    pub fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
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

    /// `dev`'s NVLink fabric (NVML's GPU fabric info); none with `MCAST_MNNVL=off`.
    pub fn fabric(&self, dev: Device) -> Result<FabricInfo> {
        let dev = self.check_device(dev, "device")?;
        if !self.config.mnnvl {
            return Ok(FabricInfo::default());
        }
        self.driver.fabric_info(dev).map_err(|e| Error::driver(e, format_args!("asking device {dev}'s NVLink fabric")))
    }

    /// The first NVLS kill switch set, as `NAME=value` ([`policy::kill_switch`]): from the
    /// process environment, or on the simulator from [`Config::sim_host_env`] where set.
    pub fn kill_switch(&self) -> Option<String> {
        match (&self.config.sim_host_env, self.driver.as_sim()) {
            (Some(vars), Some(_)) => {
                policy::kill_switch_in(|name| vars.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()))
            }
            _ => policy::kill_switch(),
        }
    }

    /// Why `dev` cannot use multicast, or `None`.
    pub fn multicast_reason(&self, dev: Device) -> Result<Option<String>> {
        let props = self.props(dev)?;
        let switch = self.kill_switch();
        let has_api = self.driver.has_multicast_api();
        Ok(policy::device_reason(self.config.multicast, switch.as_deref(), has_api, dev, &props))
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

    /// Checks `ptr` is memory of rank `rank`'s device `dev`, as the driver says
    /// (`cuPointerGetAttribute`). In messages `name` names the pointer (`"send = 0x..."`), `verb`
    /// says what the caller does with device memory (`"register"`, `"pass"`) and `asking`
    /// describes the query. `name` and `asking` are formatted only on failure (the collectives'
    /// pointer forms call this on every call).
    pub fn check_pointer_device(
        &self,
        ptr: DevicePtr,
        rank: usize,
        dev: Device,
        name: impl fmt::Display,
        verb: &str,
        asking: &dyn Fn() -> String,
    ) -> Result<()> {
        match self.driver.pointer_device(ptr) {
            Ok(d) if d == dev => Ok(()),
            Ok(d) => Err(Error::invalid_argument(format!(
                "{name} is memory of device {d}, but rank {rank} runs on device {dev}"
            ))),
            Err(e) if e.code == CuResult::ERROR_INVALID_VALUE => Err(Error::invalid_argument(format!(
                "{name} is not device memory ({e}): {verb} device memory of rank {rank}'s device {dev}"
            ))),
            Err(e) => Err(Error::driver(e, asking())),
        }
    }

    /// The granularity of memory of handle types `ht` shared by `devices`: the least common
    /// multiple of each device's minimum allocation granularity and, with `multicast`, of the
    /// multicast granularity of an object over all of them.
    pub fn granularity(&self, devices: &[Device], ht: HandleTypes, multicast: bool) -> Result<usize> {
        let mut g = 1usize;
        for &d in devices {
            let m = self
                .driver
                .mem_granularity(d, Granularity::Minimum, ht)
                .map_err(|e| Error::driver(e, format_args!("asking the allocation granularity of device {d}")))?;
            g = lcm(g, m.max(1));
        }
        if multicast {
            let prop = MulticastProp { num_devices: devices.len() as u32, size: 0, handle_types: ht, flags: 0 };
            let m = self.driver.multicast_granularity(&prop, Granularity::Minimum).map_err(|e| match devices {
                [d] => Error::driver(e, format_args!("asking the multicast granularity of device {d}")),
                _ => Error::driver(e, "asking the multicast granularity"),
            })?;
            g = lcm(g, m.max(1));
        }
        Ok(g)
    }

    /// Remembers a team created in this context.
    pub fn join(&self, member: Arc<dyn Member>) {
        self.members.lock().push(member);
    }

    /// Forgets a destroyed team.
    pub fn leave(&self, member: &dyn Member) {
        let me = member as *const dyn Member as *const ();
        self.members.lock().retain(|m| Arc::as_ptr(m) as *const () != me);
    }

    /// The live teams.
    pub fn members(&self) -> Vec<Arc<dyn Member>> {
        self.members.lock().clone()
    }

    /// Forgets every live team and returns them (shutdown).
    pub fn take_members(&self) -> Vec<Arc<dyn Member>> {
        std::mem::take(&mut *self.members.lock())
    }

    /// Releases every empty segment every team keeps cached; returns the bytes freed per rank.
    pub fn trim_caches(&self) -> u64 {
        self.members().iter().map(|t| t.trim_cache()).sum()
    }

    /// Keeps what a release failed to free, to retry at shutdown.
    pub fn park(&self, leftover: Arc<dyn Leftover>) {
        self.leftovers.lock().push(leftover);
    }

    /// Retries every parked release; returns what still fails.
    pub fn release_leftovers(&self) -> Vec<Error> {
        let leftovers = std::mem::take(&mut *self.leftovers.lock());
        leftovers.iter().flat_map(|l| l.release(self)).collect()
    }
}

/// Least common multiple of two positive numbers.
pub fn lcm(a: usize, b: usize) -> usize {
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    a / gcd(a, b) * b
}
