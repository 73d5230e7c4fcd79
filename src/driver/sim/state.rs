//! The simulator's bookkeeping: physical allocations, their handles, multicast objects and
//! their bindings, mappings and the one [`State`] table behind the simulator's lock.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::fd::RawFd;
use std::sync::Arc;

use super::exec::{Capture, EventCell, Node};
use super::host::Memfd;
use super::shared::SharedMc;
use super::{INVALID_VALUE, R};
use crate::driver::{CuResult, Device, HandleTypes, MemHandle, MulticastProp};

/// One physical allocation (shared by the handles created or imported for it).
pub(super) struct Phys {
    pub(super) memfd: Memfd,
    pub(super) dev: Device,
    pub(super) size: usize,
    pub(super) handle_types: HandleTypes,
    /// Handles plus bindings referring to it.
    pub(super) refs: u64,
}

/// A physical-allocation handle.
pub(super) struct Alloc {
    pub(super) phys: u64,
    pub(super) imported: bool,
    pub(super) released: bool,
    pub(super) maps: u64,
}

/// Memory bound to a multicast object for one device.
#[derive(Clone, Copy, Debug)]
pub(super) struct Binding {
    pub(super) dev: Device,
    pub(super) mc_offset: usize,
    pub(super) size: usize,
    pub(super) phys: u64,
    pub(super) mem_offset: usize,
}

/// A multicast object.
pub(super) struct Mc {
    pub(super) prop: MulticastProp,
    pub(super) devices: Vec<Device>,
    pub(super) imported: bool,
    pub(super) bindings: Vec<Binding>,
    pub(super) released: bool,
    pub(super) maps: u64,
    /// Shareable objects: the control block every process that holds the object shares
    /// (devices added and bindings, across processes).
    pub(super) shared: Option<SharedMc>,
}

impl Mc {
    /// Devices added, by any process.
    pub(super) fn added(&self) -> usize {
        match &self.shared {
            Some(sh) => sh.added() as usize,
            None => self.devices.len(),
        }
    }

    /// True when `dev` (whose GPU key is `gpu`) was added, by any process.
    pub(super) fn has_device(&self, dev: Device, gpu: u64) -> bool {
        match &self.shared {
            Some(sh) => sh.has(gpu),
            None => self.devices.contains(&dev),
        }
    }
}

/// A mapping of a handle over part of a reservation.
pub(super) struct Mapping {
    pub(super) size: usize,
    pub(super) handle: MemHandle,
    pub(super) offset: usize,
    pub(super) multicast: bool,
    pub(super) access: BTreeSet<Device>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) next_id: u64,
    pub(super) phys: HashMap<u64, Phys>,
    pub(super) allocs: HashMap<MemHandle, Alloc>,
    pub(super) mcs: HashMap<MemHandle, Mc>,
    /// start -> size
    pub(super) reservations: BTreeMap<u64, usize>,
    /// start -> mapping
    pub(super) mappings: BTreeMap<u64, Mapping>,
    /// module -> (device, functions)
    pub(super) modules: HashMap<usize, (Device, Vec<usize>)>,
    /// created stream -> device
    pub(super) streams: HashMap<usize, Device>,
    pub(super) events: HashMap<usize, (Device, Arc<EventCell>)>,
    /// (device, stream) -> the capture in progress on it
    pub(super) captures: HashMap<(Device, usize), Capture>,
    /// graph -> its recorded work
    pub(super) graphs: HashMap<usize, Arc<Vec<Node>>>,
    /// executable graph -> (device it was instantiated on, its work)
    pub(super) graph_execs: HashMap<usize, (Device, Arc<Vec<Node>>)>,
    /// `cuMemAlloc` memory (plain device memory, not a `cuMemCreate` allocation): start ->
    /// (device, size).
    pub(super) plain: BTreeMap<u64, (Device, usize)>,
    /// `cuMemHostAlloc` memory (mapped, portable): start -> (device whose context made it,
    /// size).
    pub(super) host_mapped: BTreeMap<u64, (Device, usize)>,
}

impl State {
    pub(super) fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        0x51D0_0000_0000 + self.next_id
    }

    /// The descriptor and identity behind `handle` (memory, or a multicast object's control
    /// block) for an export as `need`: only objects created with that handle type export.
    pub(super) fn exportable(&self, handle: MemHandle, need: HandleTypes) -> R<(RawFd, (u64, u64))> {
        if let Ok(obj) = self.live_mc(handle) {
            return match &obj.shared {
                Some(sh) if obj.prop.handle_types.contains(need) => Ok((sh.raw_fd(), sh.identity())),
                _ => Err(INVALID_VALUE),
            };
        }
        let phys = self.phys_of(self.live_alloc(handle)?)?;
        if !phys.handle_types.contains(need) {
            return Err(INVALID_VALUE);
        }
        Ok((phys.memfd.raw_fd(), phys.memfd.identity()))
    }

    pub(super) fn live_alloc(&self, handle: MemHandle) -> R<&Alloc> {
        self.allocs.get(&handle).filter(|a| !a.released).ok_or(INVALID_VALUE)
    }

    pub(super) fn live_mc(&self, handle: MemHandle) -> R<&Mc> {
        self.mcs.get(&handle).filter(|m| !m.released).ok_or(INVALID_VALUE)
    }

    pub(super) fn phys_of(&self, alloc: &Alloc) -> R<&Phys> {
        self.phys.get(&alloc.phys).ok_or(CuResult::ERROR_UNKNOWN)
    }

    /// Device memory charged to `dev`: physical allocations and `cuMemAlloc` blocks.
    pub(super) fn used_bytes(&self, dev: Device) -> u64 {
        let phys: u64 = self.phys.values().filter(|p| p.dev == dev).map(|p| p.size as u64).sum();
        phys + self.plain.values().filter(|p| p.0 == dev).map(|p| p.1 as u64).sum::<u64>()
    }

    pub(super) fn unref_phys(&mut self, id: u64) {
        if let Some(p) = self.phys.get_mut(&id) {
            p.refs -= 1;
            if p.refs == 0 {
                self.phys.remove(&id);
            }
        }
    }

    pub(super) fn free_alloc(&mut self, handle: MemHandle) {
        if let Some(a) = self.allocs.remove(&handle) {
            self.unref_phys(a.phys);
        }
    }

    pub(super) fn free_mc(&mut self, handle: MemHandle) {
        if let Some(mc) = self.mcs.remove(&handle) {
            for b in mc.bindings {
                self.unref_phys(b.phys);
            }
        }
    }

    /// The `cuMemAlloc` block containing `addr`: (start, device, size).
    pub(super) fn plain_at(&self, addr: u64) -> Option<(u64, Device, usize)> {
        let (&start, &(dev, size)) = self.plain.range(..=addr).next_back()?;
        (addr < start + size as u64).then_some((start, dev, size))
    }

    /// The mapping containing `addr`.
    pub(super) fn mapping_at(&self, addr: u64) -> Option<(u64, &Mapping)> {
        let (&start, m) = self.mappings.range(..=addr).next_back()?;
        (addr < start + m.size as u64).then_some((start, m))
    }

    /// Starts of the mappings exactly covering `[ptr, ptr + size)`, with no gap.
    pub(super) fn covering(&self, ptr: u64, size: usize) -> R<Vec<u64>> {
        let end = ptr.checked_add(size as u64).ok_or(INVALID_VALUE)?;
        let mut starts = Vec::new();
        let mut cur = ptr;
        while cur < end {
            let (start, m) = self.mapping_at(cur).ok_or(INVALID_VALUE)?;
            starts.push(start);
            cur = start + m.size as u64;
        }
        Ok(starts)
    }

    /// Starts of whole mappings that together are exactly `[ptr, ptr + size)`: the first starts
    /// at `ptr` and the last ends at `ptr + size` (the rule of `cuMemUnmap` and
    /// `cuMemSetAccess`).
    pub(super) fn whole_mappings(&self, ptr: u64, size: usize) -> R<Vec<u64>> {
        let starts = self.covering(ptr, size)?;
        let last_end = starts.last().and_then(|s| self.mappings.get(s).map(|m| s + m.size as u64));
        if starts.first() != Some(&ptr) || last_end != Some(ptr + size as u64) {
            return Err(INVALID_VALUE);
        }
        Ok(starts)
    }
}

/// `None` (overflow) or greater than a bound: the shape of every "cannot be larger than" rule.
pub(super) trait Exceeds {
    fn exceeds(self, bound: usize) -> bool;
}

impl Exceeds for Option<usize> {
    fn exceeds(self, bound: usize) -> bool {
        match self {
            None => true,
            Some(v) => v > bound,
        }
    }
}
