//! A segment: one physical allocation per rank, mapped on every rank's device (each rank sees
//! all ranks' memory side by side in one reservation), and on the multicast transport one
//! multicast object bound to every rank's allocation and mapped on every device.
//!
//! Creation rolls back whatever it made when a step fails; teardown follows the documented
//! order and reports every error instead of swallowing it.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::context::Context;
use super::error::{Error, Result};
use super::registry::{ResourceId, ResourceKind};
use super::retry::retry;
use crate::driver::{CuResult, Device, DevicePtr, DriverError, HandleTypes, MemHandle, MulticastProp};

/// Where the ranks of a team live and how they talk.
#[derive(Clone, Debug)]
pub struct Shape {
    /// Device of each rank.
    pub devices: Vec<Device>,
    /// Bind a multicast object.
    pub multicast: bool,
    /// Owner name for the leak report.
    pub owner: String,
}

struct Tracked<T> {
    value: T,
    id: ResourceId,
}

struct Multicast {
    handle: Tracked<MemHandle>,
    /// Devices whose memory is bound, with the binding's id.
    bound: Vec<(Device, ResourceId)>,
    /// Per rank: the reservation holding the multicast mapping, and the mapping.
    views: Vec<(Tracked<DevicePtr>, Option<ResourceId>)>,
}

/// A segment. All ranks' memory is `size` bytes.
pub struct Segment {
    /// Unique in the process, for bookkeeping.
    pub serial: u64,
    /// Bytes per rank.
    pub size: usize,
    /// Per viewing rank: base of the reservation holding every rank's memory in order.
    view_bases: Vec<DevicePtr>,
    /// Per rank: base of the multicast mapping, on the multicast transport.
    mc_bases: Option<Vec<DevicePtr>>,
    parts: Mutex<Parts>,
}

/// The driver resources of a segment, released by [`Segment::teardown`].
struct Parts {
    size: usize,
    devices: Vec<Device>,
    phys: Vec<Tracked<MemHandle>>,
    /// Per viewing rank: a reservation of `nranks * size` holding every rank's memory in order.
    views: Vec<Tracked<DevicePtr>>,
    /// Unicast and peer mappings: address, size, id.
    maps: Vec<(DevicePtr, usize, ResourceId)>,
    mc: Option<Multicast>,
}

impl Segment {
    /// Creates a segment of `size` bytes per rank for `shape` (size a multiple of the team's
    /// granularity). `trim` frees cached memory when a step runs out.
    pub fn create(ctx: &Context, shape: &Shape, size: usize, trim: &mut dyn FnMut() -> u64) -> Result<Segment> {
        static SERIAL: AtomicU64 = AtomicU64::new(1);
        let mut parts = Parts {
            size,
            devices: shape.devices.clone(),
            phys: Vec::new(),
            views: Vec::new(),
            maps: Vec::new(),
            mc: None,
        };
        if let Err(e) = parts.build(ctx, shape, trim) {
            for undo in parts.teardown(ctx) {
                tracing::error!("rolling back a failed segment: {undo}");
            }
            return Err(e);
        }
        Ok(Segment {
            serial: SERIAL.fetch_add(1, Ordering::Relaxed),
            size,
            view_bases: parts.views.iter().map(|v| v.value).collect(),
            mc_bases: parts.mc.as_ref().map(|m| m.views.iter().map(|(v, _)| v.value).collect()),
            parts: Mutex::new(parts),
        })
    }

    /// Address, on rank `rank`'s device, of byte 0 of rank `peer`'s memory.
    pub fn peer_base(&self, rank: usize, peer: usize) -> DevicePtr {
        self.view_bases[rank] + (peer * self.size) as u64
    }

    /// Multicast address, on rank `rank`'s device, of byte 0, on the multicast transport.
    pub fn multicast_base(&self, rank: usize) -> Option<DevicePtr> {
        self.mc_bases.as_ref().map(|m| m[rank])
    }

    /// True when this segment holds a multicast object.
    pub fn has_multicast(&self) -> bool {
        self.mc_bases.is_some()
    }

    /// Releases everything (see [`Parts::teardown`]); a second call does nothing.
    pub fn teardown(&self, ctx: &Context) -> Vec<Error> {
        self.parts.lock().teardown(ctx)
    }
}

impl Parts {
    fn build(&mut self, ctx: &Context, shape: &Shape, trim: &mut dyn FnMut() -> u64) -> Result<()> {
        let driver = ctx.driver().clone();
        let n = shape.devices.len();
        let size = self.size;
        let owner = shape.owner.as_str();
        for (rank, &dev) in shape.devices.iter().enumerate() {
            let what = || format!("allocating {size} bytes for rank {rank} on device {dev}");
            let h = retry(ctx, &what, size as u64, trim, || driver.mem_create(dev, size, HandleTypes::NONE))?;
            let id = ctx.resources.track(ResourceKind::PhysicalAllocation, size as u64, Some(dev), owner);
            self.phys.push(Tracked { value: h, id });
        }
        for (rank, &dev) in shape.devices.iter().enumerate() {
            let span = n * size;
            let what = || format!("reserving {span} bytes of address space for rank {rank}");
            let base = retry(ctx, &what, 0, trim, || driver.mem_address_reserve(span, size))?;
            let id = ctx.resources.track(ResourceKind::Reservation, span as u64, None, owner);
            self.views.push(Tracked { value: base, id });
            for peer in 0..n {
                let addr = base + (peer * size) as u64;
                let handle = self.phys[peer].value;
                let what = || format!("mapping rank {peer}'s memory for rank {rank}");
                retry(ctx, &what, 0, trim, || driver.mem_map(addr, size, 0, handle))?;
                let id = ctx.resources.track(ResourceKind::Mapping, size as u64, Some(dev), owner);
                self.maps.push((addr, size, id));
                let what = || format!("giving device {dev} access to rank {peer}'s memory");
                retry(ctx, &what, 0, trim, || driver.mem_set_access(addr, size, &[dev]))?;
            }
        }
        if shape.multicast {
            self.build_multicast(ctx, shape, trim)?;
        }
        Ok(())
    }

    fn build_multicast(&mut self, ctx: &Context, shape: &Shape, trim: &mut dyn FnMut() -> u64) -> Result<()> {
        let driver = ctx.driver().clone();
        let size = self.size;
        let owner = shape.owner.as_str();
        let prop =
            MulticastProp { num_devices: shape.devices.len() as u32, size, handle_types: HandleTypes::NONE, flags: 0 };
        let what = || format!("creating a multicast object of {size} bytes for {} devices", prop.num_devices);
        let handle = retry(ctx, &what, size as u64, trim, || driver.multicast_create(&prop))?;
        let id = ctx.resources.track(ResourceKind::MulticastObject, size as u64, None, owner);
        self.mc = Some(Multicast { handle: Tracked { value: handle, id }, bound: Vec::new(), views: Vec::new() });
        for &dev in &shape.devices {
            let what = || format!("adding device {dev} to the multicast object");
            retry(ctx, &what, 0, trim, || driver.multicast_add_device(handle, dev))?;
        }
        let v2 = driver.has_multicast_bind_v2();
        for (rank, &dev) in shape.devices.iter().enumerate() {
            let mem = self.phys[rank].value;
            let what = || format!("binding rank {rank}'s memory (device {dev}) to the multicast object");
            retry(ctx, &what, size as u64, trim, || {
                if v2 {
                    driver.multicast_bind_mem_v2(handle, dev, 0, mem, 0, size, 0)
                } else {
                    driver.multicast_bind_mem(handle, 0, mem, 0, size, 0)
                }
            })?;
            let id = ctx.resources.track(ResourceKind::Binding, size as u64, Some(dev), owner);
            self.mc_mut().bound.push((dev, id));
        }
        for (rank, &dev) in shape.devices.iter().enumerate() {
            let what = || format!("reserving {size} bytes of multicast address space for rank {rank}");
            let va = retry(ctx, &what, 0, trim, || driver.mem_address_reserve(size, size))?;
            let id = ctx.resources.track(ResourceKind::Reservation, size as u64, None, owner);
            self.mc_mut().views.push((Tracked { value: va, id }, None));
            let what = || format!("mapping the multicast object for rank {rank} on device {dev}");
            retry(ctx, &what, 0, trim, || driver.mem_map(va, size, 0, handle))?;
            let id = ctx.resources.track(ResourceKind::Mapping, size as u64, Some(dev), owner);
            self.mc_mut().views[rank].1 = Some(id);
            let what = || format!("giving device {dev} access to the multicast mapping");
            retry(ctx, &what, 0, trim, || driver.mem_set_access(va, size, &[dev]))?;
        }
        Ok(())
    }

    fn mc_mut(&mut self) -> &mut Multicast {
        self.mc.as_mut().expect("multicast state exists while building it")
    }

    /// Releases everything, in the documented order: unmap the multicast range, unbind every
    /// rank, release the multicast object, unmap peers and unicast, release physical memory,
    /// free address reservations. Continues past failures and returns them all;
    /// `CUDA_ERROR_DEINITIALIZED` (process exit) is not an error.
    fn teardown(&mut self, ctx: &Context) -> Vec<Error> {
        let driver = ctx.driver().clone();
        let res = &ctx.resources;
        let mut errors = Vec::new();
        let mut check = |r: std::result::Result<(), DriverError>, what: String| match r {
            Ok(()) => true,
            Err(e) if e.code == CuResult::ERROR_DEINITIALIZED => true,
            Err(e) => {
                errors.push(Error::driver(e, what));
                false
            }
        };
        let mut reservations = Vec::new();
        if let Some(mc) = self.mc.take() {
            for (rank, (va, map)) in mc.views.into_iter().enumerate() {
                if let Some(map) = map {
                    if check(driver.mem_unmap(va.value, self.size), format!("unmapping rank {rank}'s multicast range"))
                    {
                        res.untrack(map);
                    }
                }
                reservations.push((va, self.size));
            }
            for (dev, id) in mc.bound {
                let r = driver.multicast_unbind(mc.handle.value, dev, 0, self.size);
                if check(r, format!("unbinding device {dev} from the multicast object")) {
                    res.untrack(id);
                }
            }
            if check(driver.mem_release(mc.handle.value), "releasing the multicast object".into()) {
                res.untrack(mc.handle.id);
            }
        }
        for (addr, size, id) in self.maps.drain(..) {
            if check(driver.mem_unmap(addr, size), format!("unmapping {size} bytes at {addr:#x}")) {
                res.untrack(id);
            }
        }
        for (rank, p) in self.phys.drain(..).enumerate() {
            let dev = self.devices[rank];
            if check(driver.mem_release(p.value), format!("releasing rank {rank}'s memory on device {dev}")) {
                res.untrack(p.id);
            }
        }
        let n = self.devices.len();
        reservations.extend(self.views.drain(..).map(|v| (v, n * self.size)));
        for (v, span) in reservations {
            if check(driver.mem_address_free(v.value, span), format!("freeing {span} bytes of address space")) {
                res.untrack(v.id);
            }
        }
        errors
    }
}
