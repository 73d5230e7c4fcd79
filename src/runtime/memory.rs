//! Memory the application owns: `mcast_mem_alloc` / `mcast_mem_free` (device memory any team
//! holding that device can register, like NCCL's `ncclMemAlloc`), and the context's list of live
//! registrations (no two may overlap; registered memory cannot be freed). This file holds the
//! tables, which the context's [`Env`](super::env::Env) keeps; `mem_alloc.rs`, above it, the
//! driver work of allocating and freeing.

use std::collections::BTreeMap;

use parking_lot::Mutex;

use super::error::{Error, Result};
use super::registry::ResourceId;
use crate::driver::{Device, DevicePtr, MemHandle};

/// Owner name of `mcast_mem_alloc` memory in the leak report.
pub(super) const OWNER: &str = "mcast_mem_alloc";

/// One `mcast_mem_alloc` allocation: the physical memory mapped read-write for its device.
pub(super) struct UserAlloc {
    pub(super) dev: Device,
    pub(super) handle: MemHandle,
    pub(super) size: usize,
    /// Physical allocation, reservation, mapping: `None` once released.
    pub(super) ids: [Option<ResourceId>; 3],
}

/// A live registration: `[start, end)` on `dev`, made for buffer registration `serial`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Registration {
    serial: u64,
    dev: Device,
    pub(super) start: u64,
    pub(super) end: u64,
}

/// The application's memory in one context.
#[derive(Default)]
pub struct UserMemory {
    /// `mcast_mem_alloc` allocations by address.
    pub(super) allocs: Mutex<BTreeMap<DevicePtr, UserAlloc>>,
    /// Live registrations.
    pub(super) registrations: Mutex<Vec<Registration>>,
    next_serial: Mutex<u64>,
    /// Devices whose fabric allocations the driver refused (no IMEX channel): later
    /// allocations there ask for POSIX descriptors only, without a failing call each time.
    pub(super) no_fabric: Mutex<Vec<Device>>,
}

impl UserMemory {
    /// Records the ranges of one registration (every rank this process holds) unless one of them
    /// overlaps a live registration; returns its serial.
    pub fn register(&self, ranges: &[(Device, DevicePtr, usize)]) -> Result<u64> {
        let mut regs = self.registrations.lock();
        for (i, &(dev, start, len)) in ranges.iter().enumerate() {
            let end = start + len as u64;
            if let Some(r) = regs.iter().find(|r| r.start < end && start < r.end) {
                return Err(Error::invalid_argument(format!(
                    "ptrs[{i}] = {start:#x} + {len} bytes (device {dev}) overlaps a live registration ({:#x} + {} bytes on \
                     device {}): free that buffer first",
                    r.start,
                    r.end - r.start,
                    r.dev
                )));
            }
            if let Some(j) = ranges[..i].iter().position(|&(_, s, l)| s < end && start < s + l as u64) {
                return Err(Error::invalid_argument(format!(
                    "ptrs[{i}] and ptrs[{j}] overlap: every rank registers its own memory"
                )));
            }
        }
        let mut next = self.next_serial.lock();
        *next += 1;
        let serial = *next;
        regs.extend(ranges.iter().map(|&(dev, start, len)| Registration {
            serial,
            dev,
            start,
            end: start + len as u64,
        }));
        Ok(serial)
    }

    /// Forgets registration `serial`.
    pub fn unregister(&self, serial: u64) {
        self.registrations.lock().retain(|r| r.serial != serial);
    }

    /// Number of live registrations (one per registered buffer and rank).
    pub fn registrations(&self) -> usize {
        self.registrations.lock().len()
    }

    /// Live `mcast_mem_alloc` allocations.
    pub fn live(&self) -> usize {
        self.allocs.lock().len()
    }
}
