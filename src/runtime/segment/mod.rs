//! A segment: one physical allocation per rank, mapped on every rank's device (each rank sees
//! all ranks' memory side by side in one reservation), and on the multicast transport one
//! multicast object bound to every rank's allocation and mapped on every device.
//!
//! This file holds what a segment is and how it is released (in the documented order, every
//! error reported). `create.rs` has the three ways to make one, `local.rs` and `shared.rs` the
//! one-process and multi-process builds, `map.rs` the steps each rank does for itself, and
//! `export.rs` how memory travels between processes. Creation rolls back whatever it made when
//! a step fails.

mod create;
mod export;
mod local;
mod map;
mod shared;

use std::sync::Arc;

use parking_lot::Mutex;

use super::comm::Comm;
use super::env::{Env, Leftover};
use super::error::{Error, Result};
use super::registry::ResourceId;
use crate::driver::{CuResult, Device, DevicePtr, DriverError, HandleTypes, MemHandle};

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

impl Multicast {
    /// A multicast object just created or imported, nothing bound or mapped yet.
    fn new(handle: MemHandle, id: ResourceId) -> Multicast {
        Multicast { handle: Tracked { value: handle, id }, bound: Vec::new(), views: Vec::new(), released: false }
    }
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
    /// The segment of `parts` once `built` succeeded; otherwise rolls `parts` back (`what` names
    /// it in the log) and returns the error. `skews` and `user_ptrs` as in the fields (registered
    /// memory has user pointers, allocated memory none).
    fn finish(
        mut parts: Parts,
        built: Result<()>,
        what: &str,
        serial: u64,
        skews: Vec<u64>,
        user_ptrs: Vec<DevicePtr>,
        env: &Env,
    ) -> Result<Segment> {
        if let Err(e) = built {
            for undo in parts.teardown(env) {
                tracing::error!("rolling back a failed {what}: {undo}");
            }
            return Err(e);
        }
        Ok(Segment {
            serial,
            size: parts.size,
            view_bases: parts.per_rank(parts.views.iter().map(|v| v.value).collect()),
            mc_bases: parts.mc.as_ref().map(|m| parts.per_rank(m.views.iter().map(|(v, _)| v.value).collect())),
            skews,
            registered: !user_ptrs.is_empty(),
            user_ptrs,
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

    /// Releases everything (see `Parts::teardown`). After failures, calling it again retries
    /// what is left; once all is released it does nothing.
    pub fn teardown(&self, env: &Env) -> Vec<Error> {
        self.parts.lock().teardown(env)
    }

    /// True once every driver resource of the segment was released.
    pub fn is_released(&self) -> bool {
        self.parts.lock().is_released()
    }
}

impl Leftover for Segment {
    fn release(&self, env: &Env) -> Vec<Error> {
        self.teardown(env)
    }
}

impl Parts {
    /// Nothing made yet, for `shape`: `size` bytes per rank, `mc_size` bytes of multicast;
    /// `local`: the one rank this process owns in a multi-process team.
    fn new(shape: &Shape, size: usize, mc_size: usize, local: Option<usize>) -> Parts {
        Parts {
            size,
            mc_size,
            devices: shape.devices.clone(),
            phys: Vec::new(),
            views: Vec::new(),
            maps: Vec::new(),
            mc: None,
            local,
        }
    }

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

    fn mc_mut(&mut self) -> &mut Multicast {
        self.mc.as_mut().expect("multicast state exists while building it")
    }

    /// Releases everything, in the documented order: unmap the multicast range, unbind every
    /// rank, release the multicast object, unmap peers and unicast, release physical memory,
    /// free address reservations. Continues past failures and returns them all; a step that
    /// fails keeps its resource (and what depends on it) for a later call to retry.
    /// `CUDA_ERROR_DEINITIALIZED` (process exit) is not an error.
    fn teardown(&mut self, env: &Env) -> Vec<Error> {
        let driver = env.driver().clone();
        let res = &env.resources;
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
