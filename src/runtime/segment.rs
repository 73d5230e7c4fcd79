//! A segment: one physical allocation per rank, mapped on every rank's device (each rank sees
//! all ranks' memory side by side in one reservation), and on the multicast transport one
//! multicast object bound to every rank's allocation and mapped on every device.
//!
//! Creation rolls back whatever it made when a step fails; teardown follows the documented
//! order and reports every error instead of swallowing it.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::comm::{Comm, Part};
use super::context::Context;
use super::error::{Error, Result};
use super::registry::{ResourceId, ResourceKind};
use super::retry::{lockstep, retry};
use crate::driver::{
    CuResult, DResult, Device, DevicePtr, Driver, DriverError, HandleTypes, MemHandle, MulticastProp,
    FABRIC_HANDLE_BYTES,
};

/// Where the ranks of a team live and how they talk.
#[derive(Clone, Debug)]
pub struct Shape {
    /// Device of each rank.
    pub devices: Vec<Device>,
    /// Bind a multicast object.
    pub multicast: bool,
    /// Owner name for the leak report.
    pub owner: String,
    /// Alignment of every address reservation (the team's granularity, a power of two).
    pub alignment: usize,
    /// Multi-process team: the rendezvous; this process owns rank `comm.rank()` only.
    pub comm: Option<Arc<Comm>>,
    /// Multi-process team: how memory and multicast objects travel between the processes,
    /// [`HandleTypes::POSIX_FD`] (descriptors over the rendezvous socket) or
    /// [`HandleTypes::FABRIC`] (64-byte handles as exchange bytes). Single-process: `NONE`.
    pub handle_type: HandleTypes,
}

/// An exported memory or multicast object, as it travels over the rendezvous.
enum Exported {
    Fd(OwnedFd),
    Fabric([u8; FABRIC_HANDLE_BYTES]),
}

impl Exported {
    /// Exports `handle` as `ht` (POSIX_FD or FABRIC).
    fn of(driver: &dyn Driver, handle: MemHandle, ht: HandleTypes) -> DResult<Exported> {
        if ht == HandleTypes::FABRIC {
            driver.mem_export_fabric(handle).map(Exported::Fabric)
        } else {
            driver.mem_export_fd(handle).map(Exported::Fd)
        }
    }

    /// The exchange's bytes and descriptors.
    fn payload(&self) -> (&[u8], Vec<RawFd>) {
        match self {
            Exported::Fd(fd) => (&[], vec![fd.as_raw_fd()]),
            Exported::Fabric(bytes) => (bytes, vec![]),
        }
    }

    /// Imports what `part` carries as `ht`; `None` when nothing arrived.
    fn import(driver: &dyn Driver, part: &Part, ht: HandleTypes) -> Option<DResult<MemHandle>> {
        if ht == HandleTypes::FABRIC {
            let bytes: &[u8; FABRIC_HANDLE_BYTES] = part.bytes.as_slice().try_into().ok()?;
            Some(driver.mem_import_fabric(bytes))
        } else {
            part.fds.first().map(|fd| driver.mem_import_fd(fd.as_raw_fd()))
        }
    }
}

/// How a handle type is named in messages.
fn handle_type_name(ht: HandleTypes) -> &'static str {
    if ht == HandleTypes::FABRIC {
        "a fabric handle"
    } else {
        "a file descriptor"
    }
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
    /// The object itself was released.
    released: bool,
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
    /// Per rank: where its memory starts in its slot of a view (0; a registered segment maps
    /// each rank's whole allocation, and the registered pointer lies this far into it).
    skews: Vec<u64>,
    /// Memory the application registered (the segment holds retained handles, not the memory).
    registered: bool,
    /// Registered: each rank's own pointer (what the application passed).
    user_ptrs: Vec<DevicePtr>,
    parts: Mutex<Parts>,
}

/// Memory one rank registers: the handle retained from its address, the address, and how far
/// into the allocation it lies.
pub struct External {
    /// From `cuMemRetainAllocationHandle`; the segment releases it.
    pub handle: MemHandle,
    /// The caller's pointer.
    pub ptr: DevicePtr,
    /// `ptr` minus the start of the allocation's mapping.
    pub offset: usize,
}

/// The driver resources of a segment, released by [`Segment::teardown`].
struct Parts {
    size: usize,
    /// Bytes of the multicast object and of each binding and multicast mapping (`size`, except
    /// for registered memory).
    mc_size: usize,
    devices: Vec<Device>,
    /// Per rank (with the rank, kept while a release fails).
    phys: Vec<(usize, Tracked<MemHandle>)>,
    /// Per viewing rank: a reservation of `nranks * size` holding every rank's memory in order
    /// (multi-process: only this process's rank).
    views: Vec<Tracked<DevicePtr>>,
    /// Multi-process: the one rank this process owns.
    local: Option<usize>,
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
            mc_size: size,
            devices: shape.devices.clone(),
            phys: Vec::new(),
            views: Vec::new(),
            maps: Vec::new(),
            mc: None,
            local: shape.comm.as_ref().map(|c| c.rank()),
        };
        let built = match &shape.comm {
            Some(comm) => parts.build_mp(ctx, shape, comm, trim),
            None => parts.build(ctx, shape, trim),
        };
        if let Err(e) = built {
            for undo in parts.teardown(ctx) {
                tracing::error!("rolling back a failed segment: {undo}");
            }
            return Err(e);
        }
        Ok(Segment {
            serial: SERIAL.fetch_add(1, Ordering::Relaxed),
            size,
            view_bases: parts.per_rank(parts.views.iter().map(|v| v.value).collect()),
            mc_bases: parts.mc.as_ref().map(|m| parts.per_rank(m.views.iter().map(|(v, _)| v.value).collect())),
            skews: vec![0; shape.devices.len()],
            registered: false,
            user_ptrs: Vec::new(),
            parts: Mutex::new(parts),
        })
    }

    /// A segment over memory the application owns (one process holding every rank): every
    /// rank's whole allocation (its first `size` bytes, `size` a multiple of the granularity)
    /// mapped on every rank's device, and on the multicast transport a multicast object of
    /// `mc_size` bytes bound at each rank's pointer with `cuMulticastBindAddr` (`_v2` where the
    /// driver has it). Takes the retained handles (released on failure and at teardown).
    pub fn register(
        ctx: &Context,
        shape: &Shape,
        ext: Vec<External>,
        size: usize,
        mc_size: usize,
        trim: &mut dyn FnMut() -> u64,
    ) -> Result<Segment> {
        static SERIAL: AtomicU64 = AtomicU64::new(1 << 40);
        let owner = shape.owner.as_str();
        let mut parts = Parts {
            size,
            mc_size,
            devices: shape.devices.clone(),
            phys: Vec::new(),
            views: Vec::new(),
            maps: Vec::new(),
            mc: None,
            local: None,
        };
        for (rank, e) in ext.iter().enumerate() {
            let id = ctx.resources.track(ResourceKind::PhysicalAllocation, 0, Some(shape.devices[rank]), owner);
            parts.phys.push((rank, Tracked { value: e.handle, id }));
        }
        let handles: Vec<MemHandle> = ext.iter().map(|e| e.handle).collect();
        let built = (|| {
            for rank in 0..shape.devices.len() {
                parts.map_view(ctx, shape, &handles, rank, trim)?;
            }
            if shape.multicast {
                let ptrs: Vec<DevicePtr> = ext.iter().map(|e| e.ptr).collect();
                parts.build_multicast(ctx, shape, Some(&ptrs), trim)?;
            }
            Ok(())
        })();
        if let Err(e) = built {
            for undo in parts.teardown(ctx) {
                tracing::error!("rolling back a failed registration: {undo}");
            }
            return Err(e);
        }
        Ok(Segment {
            serial: SERIAL.fetch_add(1, Ordering::Relaxed),
            size,
            view_bases: parts.views.iter().map(|v| v.value).collect(),
            mc_bases: parts.mc.as_ref().map(|m| m.views.iter().map(|(v, _)| v.value).collect()),
            skews: ext.iter().map(|e| e.offset as u64).collect(),
            registered: true,
            user_ptrs: ext.iter().map(|e| e.ptr).collect(),
            parts: Mutex::new(parts),
        })
    }

    /// True for memory the application registered.
    pub fn is_registered(&self) -> bool {
        self.registered
    }

    /// Registered memory: rank `rank`'s own pointer.
    pub fn user_ptr(&self, rank: usize) -> Option<DevicePtr> {
        self.user_ptrs.get(rank).copied()
    }

    /// Address, on rank `rank`'s device, of byte 0 of rank `peer`'s memory.
    pub fn peer_base(&self, rank: usize, peer: usize) -> DevicePtr {
        self.view_bases[rank] + (peer * self.size) as u64 + self.skews[peer]
    }

    /// Multicast address, on rank `rank`'s device, of byte 0, on the multicast transport.
    pub fn multicast_base(&self, rank: usize) -> Option<DevicePtr> {
        self.mc_bases.as_ref().map(|m| m[rank])
    }

    /// True when this segment holds a multicast object.
    pub fn has_multicast(&self) -> bool {
        self.mc_bases.is_some()
    }

    /// Releases everything (see [`Parts::teardown`]). After failures, calling it again retries
    /// what is left; once all is released it does nothing.
    pub fn teardown(&self, ctx: &Context) -> Vec<Error> {
        self.parts.lock().teardown(ctx)
    }

    /// True once every driver resource of the segment was released.
    pub fn is_released(&self) -> bool {
        self.parts.lock().is_released()
    }
}

impl Parts {
    /// Per-rank values from per-view values: multi-process, the one view sits at the local
    /// rank's index and the others are 0 (never read: ranks of other processes are refused).
    fn per_rank(&self, values: Vec<DevicePtr>) -> Vec<DevicePtr> {
        match self.local {
            None => values,
            Some(r) => {
                let mut v = vec![0; self.devices.len()];
                if let Some(&x) = values.first() {
                    v[r] = x;
                }
                v
            }
        }
    }

    /// A multi-process segment: this rank allocates shareable memory, exports it as a file
    /// descriptor or a fabric handle ([`Shape::handle_type`]), and the ranks pass the
    /// descriptors (or the handles' bytes) to each other over the rendezvous; each
    /// rank imports its peers' memory and maps every rank's memory side by side. On the
    /// multicast transport rank 0 creates the object and passes it the same way; every rank
    /// adds its own device, binds its own memory and maps the object. Every step that can fail
    /// ends with a vote, so no rank enters a call that blocks on the others (bind, map of the
    /// multicast object) unless every rank got there; out-of-memory retries are decided
    /// together.
    fn build_mp(&mut self, ctx: &Context, shape: &Shape, comm: &Comm, trim: &mut dyn FnMut() -> u64) -> Result<()> {
        let driver = ctx.driver().clone();
        let n = shape.devices.len();
        let r = comm.rank();
        let dev = shape.devices[r];
        let size = self.size;
        let owner = shape.owner.as_str();
        let label = |step: &str| format!("segment of {size} bytes: {step}");
        let ht = shape.handle_type;
        let what = || format!("allocating {size} bytes for rank {r} on device {dev}");
        // `keep` records the allocation at once: a failure on another rank rolls it back.
        let phys = &mut self.phys;
        lockstep(
            comm,
            ctx,
            &label("cuMemCreate"),
            &what,
            size as u64,
            trim,
            || driver.mem_create(dev, size, ht),
            |h| {
                let id = ctx.resources.track(ResourceKind::PhysicalAllocation, size as u64, Some(dev), owner);
                phys.push((r, Tracked { value: h, id }));
            },
        )?;
        let own = self.phys[0].1.value;
        // Export and pass the descriptors or fabric handles.
        let exported = Exported::of(&*driver, own, ht)
            .map_err(|e| Error::driver(e, format_args!("exporting rank {r}'s memory as {}", handle_type_name(ht))));
        let (status, bytes, fds) = match &exported {
            Ok(x) => {
                let (bytes, fds) = x.payload();
                (Ok(()), bytes, fds)
            }
            Err(e) => (Err(e.clone()), &[][..], vec![]),
        };
        let parts = comm.exchange(&label("export memory"), status, bytes, &fds)?;
        drop(exported);
        let mut handles = vec![own; n];
        let mut imported = Ok(());
        for (peer, part) in parts.iter().enumerate() {
            if peer == r {
                continue;
            }
            match Exported::import(&*driver, part, ht) {
                None => {
                    imported = Err(Error::internal(format!("rank {peer}'s memory handle did not arrive")));
                    break;
                }
                Some(Ok(h)) => {
                    let id = ctx.resources.track(ResourceKind::PhysicalAllocation, 0, Some(shape.devices[peer]), owner);
                    self.phys.push((peer, Tracked { value: h, id }));
                    handles[peer] = h;
                }
                Some(Err(e)) => {
                    imported = Err(Error::driver(e, format_args!("rank {r} importing rank {peer}'s memory")));
                    break;
                }
            }
        }
        drop(parts);
        comm.vote(&label("import memory"), imported)?;
        // Map every rank's memory on this rank's device.
        let mapped = self.map_view(ctx, shape, &handles, r, trim);
        comm.vote(&label("map peers"), mapped)?;
        if shape.multicast {
            self.build_multicast_mp(ctx, shape, comm, trim)?;
        }
        Ok(())
    }

    /// Reserves `n * size` and maps every rank's memory (`handles[peer]`) for rank `rank`.
    fn map_view(
        &mut self,
        ctx: &Context,
        shape: &Shape,
        handles: &[MemHandle],
        rank: usize,
        trim: &mut dyn FnMut() -> u64,
    ) -> Result<()> {
        let driver = ctx.driver().clone();
        let n = handles.len();
        let size = self.size;
        let dev = shape.devices[rank];
        let owner = shape.owner.as_str();
        let span = n * size;
        let what = || format!("reserving {span} bytes of address space for rank {rank}");
        let base = retry(ctx, &what, 0, trim, || driver.mem_address_reserve(span, shape.alignment))?;
        let id = ctx.resources.track(ResourceKind::Reservation, span as u64, None, owner);
        self.views.push(Tracked { value: base, id });
        for (peer, &handle) in handles.iter().enumerate() {
            let addr = base + (peer * size) as u64;
            let what = || format!("mapping rank {peer}'s memory for rank {rank}");
            retry(ctx, &what, 0, trim, || driver.mem_map(addr, size, 0, handle))?;
            let id = ctx.resources.track(ResourceKind::Mapping, size as u64, Some(dev), owner);
            self.maps.push((addr, size, id));
            let what = || format!("giving device {dev} access to rank {peer}'s memory");
            retry(ctx, &what, 0, trim, || driver.mem_set_access(addr, size, &[dev]))?;
        }
        Ok(())
    }

    fn build_multicast_mp(
        &mut self,
        ctx: &Context,
        shape: &Shape,
        comm: &Comm,
        trim: &mut dyn FnMut() -> u64,
    ) -> Result<()> {
        let driver = ctx.driver().clone();
        let size = self.size;
        let owner = shape.owner.as_str();
        let r = comm.rank();
        let dev = shape.devices[r];
        let label = |step: &str| format!("segment of {size} bytes: {step}");
        let prop =
            MulticastProp { num_devices: shape.devices.len() as u32, size, handle_types: shape.handle_type, flags: 0 };
        // Rank 0 creates the object.
        let what = || format!("creating a multicast object of {size} bytes for {} devices", prop.num_devices);
        let mut created = None;
        let mc = &mut self.mc;
        lockstep(
            comm,
            ctx,
            &label("cuMulticastCreate"),
            &what,
            size as u64,
            trim,
            || if r == 0 { driver.multicast_create(&prop).map(Some) } else { Ok(None) },
            |h| {
                if let Some(handle) = h {
                    let id = ctx.resources.track(ResourceKind::MulticastObject, size as u64, None, owner);
                    *mc = Some(Multicast {
                        handle: Tracked { value: handle, id },
                        bound: Vec::new(),
                        views: Vec::new(),
                        released: false,
                    });
                    created = Some(handle);
                }
            },
        )?;
        // Rank 0 exports it; the others import it.
        let ht = shape.handle_type;
        let exported = match created {
            Some(h) => Exported::of(&*driver, h, ht).map(Some).map_err(|e| {
                Error::driver(e, format_args!("exporting the multicast object as {}", handle_type_name(ht)))
            }),
            None => Ok(None),
        };
        let (status, bytes, fds) = match &exported {
            Ok(Some(x)) => {
                let (bytes, fds) = x.payload();
                (Ok(()), bytes, fds)
            }
            Ok(None) => (Ok(()), &[][..], vec![]),
            Err(e) => (Err(e.clone()), &[][..], vec![]),
        };
        let parts = comm.exchange(&label("export multicast object"), status, bytes, &fds)?;
        drop(exported);
        let mut imported = Ok(());
        if r != 0 {
            imported = match Exported::import(&*driver, &parts[0], ht) {
                None => Err(Error::internal("the multicast object's handle did not arrive")),
                Some(Ok(handle)) => {
                    let id = ctx.resources.track(ResourceKind::MulticastObject, 0, None, owner);
                    self.mc = Some(Multicast {
                        handle: Tracked { value: handle, id },
                        bound: Vec::new(),
                        views: Vec::new(),
                        released: false,
                    });
                    Ok(())
                }
                Some(Err(e)) => Err(Error::driver(e, format_args!("rank {r} importing the multicast object"))),
            };
        }
        drop(parts);
        comm.vote(&label("import multicast object"), imported)?;
        let handle = self.mc_mut().handle.value;
        // Every rank adds its own device; nobody binds before all were added.
        let what = || format!("adding device {dev} to the multicast object");
        lockstep(
            comm,
            ctx,
            &label("cuMulticastAddDevice"),
            &what,
            0,
            trim,
            || driver.multicast_add_device(handle, dev),
            |()| {},
        )?;
        let v2 = driver.has_multicast_bind_v2();
        let mem = self.phys.iter().find(|(rank, _)| *rank == r).expect("own memory").1.value;
        let what = || format!("binding rank {r}'s memory (device {dev}) to the multicast object");
        let bound = &mut self.mc.as_mut().expect("the multicast object exists").bound;
        lockstep(
            comm,
            ctx,
            &label("cuMulticastBindMem"),
            &what,
            size as u64,
            trim,
            || {
                if v2 {
                    driver.multicast_bind_mem_v2(handle, dev, 0, mem, 0, size, 0)
                } else {
                    driver.multicast_bind_mem(handle, 0, mem, 0, size, 0)
                }
            },
            |()| bound.push((dev, ctx.resources.track(ResourceKind::Binding, size as u64, Some(dev), owner))),
        )?;
        let mapped = self.map_multicast(ctx, shape, handle, r, trim);
        comm.vote(&label("map multicast object"), mapped)
    }

    /// Reserves and maps the multicast object for rank `rank`.
    fn map_multicast(
        &mut self,
        ctx: &Context,
        shape: &Shape,
        handle: MemHandle,
        rank: usize,
        trim: &mut dyn FnMut() -> u64,
    ) -> Result<()> {
        let driver = ctx.driver().clone();
        let size = self.mc_size;
        let dev = shape.devices[rank];
        let owner = shape.owner.as_str();
        let what = || format!("reserving {size} bytes of multicast address space for rank {rank}");
        let va = retry(ctx, &what, 0, trim, || driver.mem_address_reserve(size, shape.alignment))?;
        let id = ctx.resources.track(ResourceKind::Reservation, size as u64, None, owner);
        self.mc_mut().views.push((Tracked { value: va, id }, None));
        let what = || format!("mapping the multicast object for rank {rank} on device {dev}");
        retry(ctx, &what, 0, trim, || driver.mem_map(va, size, 0, handle))?;
        let id = ctx.resources.track(ResourceKind::Mapping, size as u64, Some(dev), owner);
        if let Some(v) = self.mc_mut().views.last_mut() {
            v.1 = Some(id);
        }
        let what = || format!("giving device {dev} access to the multicast mapping");
        retry(ctx, &what, 0, trim, || driver.mem_set_access(va, size, &[dev]))?;
        Ok(())
    }

    fn build(&mut self, ctx: &Context, shape: &Shape, trim: &mut dyn FnMut() -> u64) -> Result<()> {
        let driver = ctx.driver().clone();
        let n = shape.devices.len();
        let size = self.size;
        let owner = shape.owner.as_str();
        for (rank, &dev) in shape.devices.iter().enumerate() {
            let what = || format!("allocating {size} bytes for rank {rank} on device {dev}");
            let h = retry(ctx, &what, size as u64, trim, || driver.mem_create(dev, size, HandleTypes::NONE))?;
            let id = ctx.resources.track(ResourceKind::PhysicalAllocation, size as u64, Some(dev), owner);
            self.phys.push((rank, Tracked { value: h, id }));
        }
        for (rank, &dev) in shape.devices.iter().enumerate() {
            let span = n * size;
            let what = || format!("reserving {span} bytes of address space for rank {rank}");
            let base = retry(ctx, &what, 0, trim, || driver.mem_address_reserve(span, shape.alignment))?;
            let id = ctx.resources.track(ResourceKind::Reservation, span as u64, None, owner);
            self.views.push(Tracked { value: base, id });
            for peer in 0..n {
                let addr = base + (peer * size) as u64;
                let handle = self.phys[peer].1.value;
                let what = || format!("mapping rank {peer}'s memory for rank {rank}");
                retry(ctx, &what, 0, trim, || driver.mem_map(addr, size, 0, handle))?;
                let id = ctx.resources.track(ResourceKind::Mapping, size as u64, Some(dev), owner);
                self.maps.push((addr, size, id));
                let what = || format!("giving device {dev} access to rank {peer}'s memory");
                retry(ctx, &what, 0, trim, || driver.mem_set_access(addr, size, &[dev]))?;
            }
        }
        if shape.multicast {
            self.build_multicast(ctx, shape, None, trim)?;
        }
        Ok(())
    }

    /// Creates the multicast object, adds every device, binds every rank's memory (its handle
    /// from offset 0, or with `addrs` the caller's pointers through `cuMulticastBindAddr`) and
    /// maps the object on every device.
    fn build_multicast(
        &mut self,
        ctx: &Context,
        shape: &Shape,
        addrs: Option<&[DevicePtr]>,
        trim: &mut dyn FnMut() -> u64,
    ) -> Result<()> {
        let driver = ctx.driver().clone();
        let size = self.mc_size;
        let owner = shape.owner.as_str();
        let prop =
            MulticastProp { num_devices: shape.devices.len() as u32, size, handle_types: HandleTypes::NONE, flags: 0 };
        let what = || format!("creating a multicast object of {size} bytes for {} devices", prop.num_devices);
        let handle = retry(ctx, &what, size as u64, trim, || driver.multicast_create(&prop))?;
        let id = ctx.resources.track(ResourceKind::MulticastObject, size as u64, None, owner);
        self.mc = Some(Multicast {
            handle: Tracked { value: handle, id },
            bound: Vec::new(),
            views: Vec::new(),
            released: false,
        });
        for &dev in &shape.devices {
            let what = || format!("adding device {dev} to the multicast object");
            retry(ctx, &what, 0, trim, || driver.multicast_add_device(handle, dev))?;
        }
        let v2 = driver.has_multicast_bind_v2();
        for (rank, &dev) in shape.devices.iter().enumerate() {
            let mem = self.phys[rank].1.value;
            let what = || format!("binding rank {rank}'s memory (device {dev}) to the multicast object");
            retry(ctx, &what, size as u64, trim, || match (addrs, v2) {
                (Some(a), true) => driver.multicast_bind_addr_v2(handle, dev, 0, a[rank], size, 0),
                (Some(a), false) => driver.multicast_bind_addr(handle, 0, a[rank], size, 0),
                (None, true) => driver.multicast_bind_mem_v2(handle, dev, 0, mem, 0, size, 0),
                (None, false) => driver.multicast_bind_mem(handle, 0, mem, 0, size, 0),
            })?;
            let id = ctx.resources.track(ResourceKind::Binding, size as u64, Some(dev), owner);
            self.mc_mut().bound.push((dev, id));
        }
        for rank in 0..shape.devices.len() {
            self.map_multicast(ctx, shape, handle, rank, trim)?;
        }
        Ok(())
    }

    fn mc_mut(&mut self) -> &mut Multicast {
        self.mc.as_mut().expect("multicast state exists while building it")
    }

    /// Releases everything, in the documented order: unmap the multicast range, unbind every
    /// rank, release the multicast object, unmap peers and unicast, release physical memory,
    /// free address reservations. Continues past failures and returns them all; a step that
    /// fails keeps its resource (and what depends on it) for a later call to retry.
    /// `CUDA_ERROR_DEINITIALIZED` (process exit) is not an error.
    fn teardown(&mut self, ctx: &Context) -> Vec<Error> {
        let driver = ctx.driver().clone();
        let res = &ctx.resources;
        let size = self.size;
        let mc_size = self.mc_size;
        let n = self.devices.len();
        let mut errors = Vec::new();
        let mut ok = |r: std::result::Result<(), DriverError>, what: &dyn Fn() -> String| match r {
            Ok(()) => true,
            Err(e) if e.code == CuResult::ERROR_DEINITIALIZED => true,
            Err(e) => {
                errors.push(Error::driver(e, what()));
                false
            }
        };
        if let Some(mc) = self.mc.as_mut() {
            for (rank, (va, map)) in mc.views.iter_mut().enumerate() {
                if let Some(id) = *map {
                    if ok(driver.mem_unmap(va.value, mc_size), &|| format!("unmapping rank {rank}'s multicast range")) {
                        res.untrack(id);
                        *map = None;
                    }
                }
            }
            let handle = mc.handle.value;
            mc.bound.retain(|&(dev, id)| {
                let done = ok(driver.multicast_unbind(handle, dev, 0, mc_size), &|| {
                    format!("unbinding device {dev} from the multicast object")
                });
                if done {
                    res.untrack(id);
                }
                !done
            });
            let unused = mc.views.iter().all(|(_, m)| m.is_none()) && mc.bound.is_empty();
            if unused && !mc.released && ok(driver.mem_release(handle), &|| "releasing the multicast object".into()) {
                res.untrack(mc.handle.id);
                mc.released = true;
            }
        }
        self.maps.retain(|&(addr, len, id)| {
            let done = ok(driver.mem_unmap(addr, len), &|| format!("unmapping {len} bytes at {addr:#x}"));
            if done {
                res.untrack(id);
            }
            !done
        });
        let devices = &self.devices;
        self.phys.retain(|(rank, p)| {
            let dev = devices[*rank];
            let done = ok(driver.mem_release(p.value), &|| format!("releasing rank {rank}'s memory on device {dev}"));
            if done {
                res.untrack(p.id);
            }
            !done
        });
        let mut free = |v: &Tracked<DevicePtr>, span: usize| {
            let done = ok(driver.mem_address_free(v.value, span), &|| format!("freeing {span} bytes of address space"));
            if done {
                res.untrack(v.id);
            }
            done
        };
        if self.maps.is_empty() {
            self.views.retain(|v| !free(v, n * size));
        }
        if let Some(mc) = self.mc.as_mut() {
            mc.views.retain(|(va, map)| map.is_some() || !free(va, mc_size));
            if mc.released && mc.views.is_empty() && mc.bound.is_empty() {
                self.mc = None;
            }
        }
        errors
    }

    fn is_released(&self) -> bool {
        self.mc.is_none() && self.maps.is_empty() && self.phys.is_empty() && self.views.is_empty()
    }
}
