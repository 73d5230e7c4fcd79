//! The driver work behind [`UserMemory`]: `mcast_mem_alloc` (granularity, shareable handle
//! types, retries, rollback) and `mcast_mem_free`.

use super::memory::{UserAlloc, UserMemory, OWNER};
use crate::driver::{CuResult, Device, DevicePtr, HandleTypes};
use crate::runtime::env::Env;
use crate::runtime::error::{Error, Result};
use crate::runtime::registry::ResourceKind;
use crate::runtime::retry::retry;

impl UserMemory {
    /// Allocates `bytes` on `dev`: physical memory with the shareable handle types the device
    /// exports (POSIX file descriptors, plus fabric handles where supported), rounded up to the
    /// allocation granularity (and the multicast granularity where multicast is usable on `dev`),
    /// mapped read-write for `dev` and for every device
    /// that can access `dev`'s memory peer to peer (as `ncclMemAlloc` does). Retried on
    /// out-of-memory; rolled back on failure.
    pub fn alloc(&self, ctx: &Env, dev: i32, bytes: usize) -> Result<DevicePtr> {
        let dev = ctx.check_device(dev, "device")?;
        if bytes == 0 {
            return Err(Error::invalid_argument("bytes is 0: an allocation needs at least one byte"));
        }
        let driver = ctx.driver().clone();
        let props = ctx.props(dev)?;
        // The devices that will reach the memory: `dev` and every device that can access its
        // memory peer to peer (asked before anything is created: nothing to roll back).
        let mut devices = vec![dev];
        for peer in 0..ctx.device_count() as Device {
            if peer != dev && ctx.can_access_peer(peer, dev)? {
                devices.push(peer);
            }
        }
        let mut types = HandleTypes::NONE;
        if props.posix_fd_supported {
            types = HandleTypes(types.0 | HandleTypes::POSIX_FD.0);
        }
        let with_fabric = HandleTypes(types.0 | HandleTypes::FABRIC.0);
        if props.fabric_supported && !self.no_fabric.lock().contains(&dev) {
            types = with_fabric;
        }
        // Aligned for a multicast team where `dev` can be in one; none when multicast is off
        // (no cuMulticast* call then).
        let g = ctx.granularity(&[dev], types, ctx.multicast_reason(dev)?.is_none())?;
        let size = bytes
            .checked_next_multiple_of(g)
            .ok_or_else(|| Error::invalid_argument(format!("bytes = {bytes} is too large")))?;
        let mut trim = || ctx.trim_caches();
        let what = || format!("mcast_mem_alloc: allocating {size} bytes on device {dev}");
        let handle = match retry(ctx, &what, size as u64, &mut trim, || driver.mem_create(dev, size, types)) {
            // Fabric handles need an IMEX channel the system may lack (a device that reports
            // fabric support then refuses with NOT_PERMITTED, seen on 2 x H200): POSIX
            // descriptors only.
            Err(e)
                if types.contains(HandleTypes::FABRIC)
                    && matches!(
                        e.driver.as_ref().map(|d| d.code),
                        Some(CuResult::ERROR_NOT_SUPPORTED | CuResult::ERROR_NOT_PERMITTED)
                    ) =>
            {
                self.no_fabric.lock().push(dev);
                types = HandleTypes(types.0 & !HandleTypes::FABRIC.0);
                retry(ctx, &what, size as u64, &mut trim, || driver.mem_create(dev, size, types))?
            }
            r => r?,
        };
        let res = &ctx.resources;
        let phys = res.track(ResourceKind::PhysicalAllocation, size as u64, Some(dev), OWNER);
        let what = || format!("mcast_mem_alloc: reserving {size} bytes of address space");
        let va = match retry(ctx, &what, 0, &mut trim, || driver.mem_address_reserve(size, g)) {
            Ok(va) => va,
            Err(e) => {
                if let Err(u) = driver.mem_release(handle) {
                    tracing::error!("mcast_mem_alloc: rolling back: {u}");
                }
                res.untrack(phys);
                return Err(e);
            }
        };
        let reservation = res.track(ResourceKind::Reservation, size as u64, None, OWNER);
        let what = || format!("mcast_mem_alloc: mapping {size} bytes on device {dev}");
        let mapped = retry(ctx, &what, 0, &mut trim, || driver.mem_map(va, size, 0, handle));
        let mapping = mapped.as_ref().ok().map(|_| res.track(ResourceKind::Mapping, size as u64, Some(dev), OWNER));
        let access = mapped.and_then(|_| {
            let what = || format!("mcast_mem_alloc: giving devices {devices:?} access to {size} bytes");
            retry(ctx, &what, 0, &mut trim, || driver.mem_set_access(va, size, &devices))
        });
        if let Err(e) = access {
            if let Some(id) = mapping {
                match driver.mem_unmap(va, size) {
                    Ok(()) => res.untrack(id),
                    Err(u) => tracing::error!("mcast_mem_alloc: rolling back: {u}"),
                }
            }
            for (r, id) in [(driver.mem_address_free(va, size), reservation), (driver.mem_release(handle), phys)] {
                match r {
                    Ok(()) => res.untrack(id),
                    Err(u) => tracing::error!("mcast_mem_alloc: rolling back: {u}"),
                }
            }
            return Err(e);
        }
        let ids = [Some(phys), Some(reservation), mapping];
        self.allocs.lock().insert(va, UserAlloc { dev, handle, size, ids });
        Ok(va)
    }

    /// Frees `mcast_mem_alloc` memory at `ptr` (0: nothing), after the work in flight on its
    /// device. Refused while a registration lies in it.
    pub fn free(&self, ctx: &Env, ptr: DevicePtr) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        let mut allocs = self.allocs.lock();
        let Some(a) = allocs.get(&ptr) else {
            return Err(Error::invalid_argument(format!(
                "ptr = {ptr:#x} is not memory from mcast_mem_alloc of this context, or was already freed"
            )));
        };
        let end = ptr + a.size as u64;
        if let Some(r) = self.registrations.lock().iter().find(|r| r.start < end && ptr < r.end) {
            return Err(Error::in_use(format!(
                "ptr = {ptr:#x} is registered ({:#x} + {} bytes): free the registered buffer with mcast_buffer_free \
                 first",
                r.start,
                r.end - r.start
            )));
        }
        let dev = a.dev;
        let waited = ctx
            .driver()
            .device_synchronize(dev)
            .map_err(|e| Error::driver(e, format_args!("waiting for work in flight on device {dev}")));
        let mut a = allocs.remove(&ptr).expect("found above");
        let released = a.release(ctx, ptr);
        if released.is_err() {
            // Kept (what is left of it) for a later free or the context's destroy to retry.
            allocs.insert(ptr, a);
        }
        released.and(waited)
    }

    /// Frees every allocation still alive (context destroy); returns how many there were.
    pub fn release_all(&self, ctx: &Env) -> usize {
        let allocs = std::mem::take(&mut *self.allocs.lock());
        self.registrations.lock().clear();
        let n = allocs.len();
        for (ptr, mut a) in allocs {
            if let Err(e) = a.release(ctx, ptr) {
                tracing::error!("releasing mcast_mem_alloc memory at context destroy: {e}");
            }
        }
        n
    }
}

/// One release step of an allocation.
type Step<'a> = dyn Fn() -> crate::driver::DResult<()> + 'a;

impl UserAlloc {
    /// Unmaps, frees the reservation and releases the memory, skipping what an earlier call
    /// released; stops at the first failure (what is left stays tracked, for a retry, and shows
    /// in the leak report).
    fn release(&mut self, ctx: &Env, va: DevicePtr) -> Result<()> {
        let driver = ctx.driver();
        let res = &ctx.resources;
        let size = self.size;
        let handle = self.handle;
        let steps: [(usize, &str, &Step); 3] = [
            (2, "unmapping", &|| driver.mem_unmap(va, size)),
            (1, "freeing the address range", &|| driver.mem_address_free(va, size)),
            (0, "releasing the memory", &|| driver.mem_release(handle)),
        ];
        for (i, what, step) in steps {
            let Some(id) = self.ids[i] else { continue };
            match step() {
                Ok(()) => {}
                Err(e) if e.code == CuResult::ERROR_DEINITIALIZED => {}
                Err(e) => return Err(Error::driver(e, format_args!("mcast_mem_free: {what}"))),
            }
            res.untrack(id);
            self.ids[i] = None;
        }
        Ok(())
    }
}
