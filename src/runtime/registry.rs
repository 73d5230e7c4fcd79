//! Handles and resource tracking.
//!
//! [`HandleMap`] issues the 64-bit ids behind the C handles: a kind tag, a generation and a slot,
//! so a destroyed, stale or foreign id is recognised instead of aliasing a live object.
//! [`Resources`] records every driver resource a context holds (kind, bytes, device, owner and
//! the code that created it) for live counts and the leak report.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::panic::Location;

use parking_lot::Mutex;

use crate::driver::Device;

/// What a handle refers to; part of the id so a team id is never taken for a buffer id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum HandleKind {
    /// `mcast_context_t`.
    Context = 1,
    /// `mcast_team_t`.
    Team = 2,
    /// `mcast_buffer_t`.
    Buffer = 3,
}

const GENERATION_BITS: u32 = 24;
const GENERATION_MASK: u64 = (1 << GENERATION_BITS) - 1;

/// A slot map from ids to values with per-slot generations.
pub struct HandleMap<T> {
    kind: HandleKind,
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
}

struct Slot<T> {
    generation: u64,
    value: Option<T>,
}

impl<T: Clone> HandleMap<T> {
    /// An empty map issuing ids of `kind`.
    pub const fn new(kind: HandleKind) -> Self {
        HandleMap { kind, slots: Vec::new(), free: Vec::new() }
    }

    /// Stores `value` and returns its id (never 0).
    pub fn insert(&mut self, value: T) -> u64 {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot { generation: 0, value: None });
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.generation += 1;
        slot.value = Some(value);
        let generation = slot.generation;
        self.id(index as usize, generation)
    }

    fn id(&self, index: usize, generation: u64) -> u64 {
        ((self.kind as u64) << 56) | (generation << 32) | (index as u64 + 1)
    }

    fn index_of(&self, id: u64) -> Option<usize> {
        if id >> 56 != self.kind as u64 {
            return None;
        }
        let index = (id & 0xFFFF_FFFF).checked_sub(1)? as usize;
        let generation = (id >> 32) & GENERATION_MASK;
        let slot = self.slots.get(index)?;
        (slot.value.is_some() && slot.generation == generation).then_some(index)
    }

    /// The value behind `id`, if `id` is live.
    pub fn get(&self, id: u64) -> Option<T> {
        self.index_of(id).and_then(|i| self.slots[i].value.clone())
    }

    /// Removes and returns the value behind `id`, if live. The slot is reused with a new
    /// generation; a slot whose generation is exhausted is retired.
    pub fn remove(&mut self, id: u64) -> Option<T> {
        let index = self.index_of(id)?;
        let slot = &mut self.slots[index];
        let value = slot.value.take();
        if slot.generation < GENERATION_MASK {
            self.free.push(index as u32);
        }
        value
    }

    /// Removes every value `pred` selects and returns them.
    pub fn remove_where(&mut self, mut pred: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut removed = Vec::new();
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if slot.value.as_ref().is_some_and(&mut pred) {
                removed.extend(slot.value.take());
                if slot.generation < GENERATION_MASK {
                    self.free.push(index as u32);
                }
            }
        }
        removed
    }

    /// The id of the first live value `pred` selects.
    pub fn find(&self, mut pred: impl FnMut(&T) -> bool) -> Option<u64> {
        let (index, slot) = self.slots.iter().enumerate().find(|(_, s)| s.value.as_ref().is_some_and(&mut pred))?;
        Some(self.id(index, slot.generation))
    }

    /// Live values.
    pub fn values(&self) -> Vec<T> {
        self.slots.iter().filter_map(|s| s.value.clone()).collect()
    }
}

/// A kind of driver resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResourceKind {
    /// A `cuMemCreate` allocation.
    PhysicalAllocation,
    /// A `cuMemAddressReserve` range.
    Reservation,
    /// A `cuMemMap` mapping.
    Mapping,
    /// A `cuMulticastCreate` object.
    MulticastObject,
    /// A `cuMulticastBind*` binding.
    Binding,
    /// A loaded module.
    Module,
    /// Mapped host memory (`cuMemHostAlloc`): a team's doorbell.
    HostMemory,
}

impl ResourceKind {
    fn name(self) -> &'static str {
        match self {
            ResourceKind::PhysicalAllocation => "physical allocation",
            ResourceKind::Reservation => "address reservation",
            ResourceKind::Mapping => "mapping",
            ResourceKind::MulticastObject => "multicast object",
            ResourceKind::Binding => "multicast binding",
            ResourceKind::Module => "module",
            ResourceKind::HostMemory => "mapped host memory",
        }
    }
}

/// One tracked resource.
#[derive(Clone, Debug)]
pub struct Record {
    /// What it is.
    pub kind: ResourceKind,
    /// Bytes it covers.
    pub bytes: u64,
    /// The device it is on (`None`: not device-specific, e.g. a reservation).
    pub device: Option<Device>,
    /// Who holds it, e.g. `team 0x..`.
    pub owner: String,
    /// Where it was created.
    pub site: &'static Location<'static>,
    /// The public call (C function) during which it was created, if any ([`in_call`]).
    pub call: Option<&'static str>,
}

thread_local! {
    /// The outermost public call this thread is in (see [`in_call`]).
    static CALL: std::cell::Cell<Option<&'static str>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` as the public call `name` (a C function, `mcast_buffer_alloc`), so that resources
/// it creates are reported with that name rather than an internal source line. Nested calls
/// (the NCCL layer calling the C API) keep the outermost name: the one the user wrote.
pub fn in_call<R>(name: &'static str, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<&'static str>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CALL.set(self.0);
        }
    }
    let outer = CALL.get();
    let _restore = Restore(outer);
    if outer.is_none() {
        CALL.set(Some(name));
    }
    f()
}

/// A token for a tracked resource; give it back with [`Resources::untrack`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceId(u64);

/// Every driver resource a context holds.
#[derive(Default)]
pub struct Resources {
    inner: Mutex<ResourcesInner>,
}

#[derive(Default)]
struct ResourcesInner {
    next: u64,
    live: BTreeMap<ResourceId, Record>,
}

/// Live resources by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResourceCounts {
    /// Multicast objects.
    pub multicast_objects: u64,
    /// Physical allocations.
    pub physical_allocations: u64,
    /// Mappings (unicast, peer and multicast).
    pub mappings: u64,
    /// Address reservations.
    pub reservations: u64,
    /// Multicast bindings.
    pub bindings: u64,
    /// Loaded modules.
    pub modules: u64,
    /// Physical bytes held, all devices.
    pub device_bytes: u64,
}

impl Resources {
    /// Records a resource created by the caller's caller.
    #[track_caller]
    pub fn track(&self, kind: ResourceKind, bytes: u64, device: Option<Device>, owner: &str) -> ResourceId {
        let site = Location::caller();
        let mut inner = self.inner.lock();
        inner.next += 1;
        let id = ResourceId(inner.next);
        let call = CALL.get();
        inner.live.insert(id, Record { kind, bytes, device, owner: owner.to_string(), site, call });
        id
    }

    /// Forgets a resource that was released.
    pub fn untrack(&self, id: ResourceId) {
        self.inner.lock().live.remove(&id);
    }

    /// Counts of live resources.
    pub fn counts(&self) -> ResourceCounts {
        let inner = self.inner.lock();
        let mut c = ResourceCounts::default();
        for r in inner.live.values() {
            match r.kind {
                ResourceKind::MulticastObject => c.multicast_objects += 1,
                ResourceKind::PhysicalAllocation => {
                    c.physical_allocations += 1;
                    c.device_bytes += r.bytes;
                }
                ResourceKind::Mapping => c.mappings += 1,
                ResourceKind::Reservation => c.reservations += 1,
                ResourceKind::Binding => c.bindings += 1,
                ResourceKind::Module => c.modules += 1,
                // Not a count of the C struct (`mcast_live_counts_t`): listed by the report.
                ResourceKind::HostMemory => {}
            }
        }
        c
    }

    /// One line per live resource: kind, size, device, owner, creation site.
    pub fn report(&self) -> String {
        let inner = self.inner.lock();
        let mut out = String::new();
        for r in inner.live.values() {
            let device = r.device.map_or_else(|| "-".to_string(), |d| d.to_string());
            let by = r.call.map_or_else(String::new, |c| format!("created by {c}, "));
            let _ = writeln!(
                out,
                "{}: {} bytes, device {}, owner {}, {by}created at {}:{}",
                r.kind.name(),
                r.bytes,
                device,
                r.owner,
                r.site.file(),
                r.site.line()
            );
        }
        out
    }

    /// True when nothing is tracked.
    pub fn is_empty(&self) -> bool {
        self.inner.lock().live.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_generation_checked_and_typed() {
        let mut map = HandleMap::new(HandleKind::Team);
        let a = map.insert("a");
        assert_ne!(a, 0);
        assert_eq!(map.get(a), Some("a"));
        assert_eq!(map.remove(a), Some("a"));
        assert_eq!(map.get(a), None, "destroyed id");
        assert_eq!(map.remove(a), None, "double destroy");
        let b = map.insert("b");
        assert_ne!(a, b, "a reused slot gets a new generation");
        assert_eq!(map.get(a), None, "stale id of a reused slot");
        assert_eq!(map.get(b), Some("b"));
        let other: HandleMap<&str> = HandleMap::new(HandleKind::Buffer);
        assert_eq!(other.get(b), None, "foreign kind");
        assert_eq!(map.get(0), None);
        assert_eq!(map.get(b ^ (1 << 32)), None, "wrong generation");
    }

    #[test]
    fn find_gives_the_live_id_of_a_value() {
        let mut map = HandleMap::new(HandleKind::Team);
        let a = map.insert("a");
        let b = map.insert("b");
        assert_eq!(map.find(|v| *v == "b"), Some(b));
        map.remove(a);
        assert_eq!(map.find(|v| *v == "a"), None, "a removed value has no id");
        let c = map.insert("c");
        assert_eq!(map.find(|v| *v == "c"), Some(c), "the reused slot's new generation");
    }

    #[test]
    fn remove_where_frees_matching() {
        let mut map = HandleMap::new(HandleKind::Buffer);
        let ids: Vec<u64> = (0..6).map(|i| map.insert(i)).collect();
        let gone = map.remove_where(|v| v % 2 == 0);
        assert_eq!(gone.len(), 3);
        assert_eq!(map.get(ids[0]), None);
        assert_eq!(map.get(ids[1]), Some(1));
        assert_eq!(map.values().len(), 3);
    }

    #[test]
    fn resources_count_and_report() {
        let r = Resources::default();
        let a = r.track(ResourceKind::PhysicalAllocation, 4096, Some(1), "team 7");
        let b = r.track(ResourceKind::MulticastObject, 0, None, "team 7");
        let c = r.counts();
        assert_eq!((c.physical_allocations, c.multicast_objects, c.device_bytes), (1, 1, 4096));
        let report = r.report();
        assert!(report.contains("physical allocation: 4096 bytes, device 1, owner team 7, created at"));
        let m = in_call("mcast_buffer_alloc", || {
            in_call("mcast_inner", || r.track(ResourceKind::Mapping, 64, Some(0), "team 7"))
        });
        let report_in_call = r.report();
        assert!(
            report_in_call
                .contains("mapping: 64 bytes, device 0, owner team 7, created by mcast_buffer_alloc, created at"),
            "{report_in_call}"
        );
        r.untrack(m);
        // The call's name is not left behind once it returned.
        let after = r.track(ResourceKind::Mapping, 64, Some(0), "team 7");
        assert!(!r.report().contains("created by"), "{}", r.report());
        r.untrack(after);
        assert!(report.contains("registry.rs"));
        r.untrack(a);
        r.untrack(b);
        assert!(r.is_empty());
        assert_eq!(r.report(), "");
    }
}
