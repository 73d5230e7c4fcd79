//! The simulator's own count of live resources, independent of the runtime's registry, and
//! [`SimDriver::ledger`](super::SimDriver::ledger) that takes it.

use std::fmt;

/// Live simulated resources at one moment. [`Ledger::is_empty`] after teardown proves that
/// nothing leaked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Live physical allocations per device (memory still charged to the device budget).
    pub allocations: Vec<u64>,
    /// Bytes of those allocations per device.
    pub allocation_bytes: Vec<u64>,
    /// Physical-allocation handles not yet freed (created or imported; released-but-mapped count).
    pub allocation_handles: u64,
    /// Address reservations.
    pub reservations: u64,
    /// Bytes of address space reserved.
    pub reserved_bytes: u64,
    /// Mappings (unicast and multicast).
    pub mappings: u64,
    /// Multicast objects (each holds a fabric slot).
    pub multicast_objects: u64,
    /// Bindings of memory to multicast objects.
    pub bindings: u64,
    /// Loaded modules.
    pub modules: u64,
    /// Streams made by `stream_create` and not destroyed.
    pub streams: u64,
    /// Events not destroyed.
    pub events: u64,
    /// Stream captures begun and not ended.
    pub captures: u64,
    /// Captured graphs not destroyed.
    pub graphs: u64,
    /// Executable graphs not destroyed.
    pub graph_execs: u64,
    /// Mapped host allocations (`cuMemHostAlloc`) not freed.
    pub host_allocations: u64,
}

impl Ledger {
    /// True when nothing is live.
    pub fn is_empty(&self) -> bool {
        self.allocations.iter().all(|&n| n == 0)
            && self.allocation_handles == 0
            && self.reservations == 0
            && self.mappings == 0
            && self.multicast_objects == 0
            && self.bindings == 0
            && self.modules == 0
            && self.streams == 0
            && self.events == 0
            && self.captures == 0
            && self.graphs == 0
            && self.graph_execs == 0
            && self.host_allocations == 0
    }
}

impl fmt::Display for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return write!(f, "nothing live");
        }
        let mut parts = Vec::new();
        for (dev, (&n, &bytes)) in self.allocations.iter().zip(&self.allocation_bytes).enumerate() {
            if n > 0 {
                parts.push(format!("device {dev}: {n} allocation(s), {bytes} bytes"));
            }
        }
        let counts = [
            (self.allocation_handles, "allocation handle(s)"),
            (self.reservations, "reservation(s)"),
            (self.mappings, "mapping(s)"),
            (self.multicast_objects, "multicast object(s)"),
            (self.bindings, "binding(s)"),
            (self.modules, "module(s)"),
            (self.streams, "stream(s)"),
            (self.events, "event(s)"),
            (self.captures, "stream capture(s)"),
            (self.graphs, "graph(s)"),
            (self.graph_execs, "executable graph(s)"),
            (self.host_allocations, "mapped host allocation(s)"),
        ];
        for (n, what) in counts {
            if n > 0 {
                if what.starts_with("reservation") {
                    parts.push(format!("{n} {what} ({} bytes)", self.reserved_bytes));
                } else {
                    parts.push(format!("{n} {what}"));
                }
            }
        }
        write!(f, "live: {}", parts.join("; "))
    }
}

impl super::SimDriver {
    /// Live simulated resources.
    pub fn ledger(&self) -> Ledger {
        let st = self.state.lock();
        let n = self.gpus.len();
        let mut ledger = Ledger { allocations: vec![0; n], allocation_bytes: vec![0; n], ..Ledger::default() };
        // Memory of a GPU this process does not see (imported) is charged to no device here;
        // its handles are counted below.
        for p in st.phys.values().filter(|p| p.dev >= 0) {
            ledger.allocations[p.dev as usize] += 1;
            ledger.allocation_bytes[p.dev as usize] += p.size as u64;
        }
        for &(dev, size) in st.plain.values() {
            ledger.allocations[dev as usize] += 1;
            ledger.allocation_bytes[dev as usize] += size as u64;
        }
        ledger.allocation_handles = st.allocs.len() as u64;
        ledger.reservations = st.reservations.len() as u64;
        ledger.reserved_bytes = st.reservations.values().map(|&s| s as u64).sum();
        ledger.mappings = st.mappings.len() as u64;
        ledger.multicast_objects = st.mcs.len() as u64;
        ledger.bindings = st.mcs.values().map(|m| m.bindings.len() as u64).sum();
        ledger.modules = st.modules.len() as u64;
        ledger.streams = st.streams.len() as u64;
        ledger.events = st.events.len() as u64;
        ledger.captures = st.captures.len() as u64;
        ledger.graphs = st.graphs.len() as u64;
        ledger.graph_execs = st.graph_execs.len() as u64;
        ledger.host_allocations = st.host_mapped.len() as u64;
        ledger
    }
}
