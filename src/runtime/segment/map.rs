//! The steps every rank does for itself, in one process or many: reserve and map a view of
//! every rank's memory, bind its memory to the multicast object, map the multicast object.
//! Each step is retried under the policy of [`crate::runtime::retry`] and tracked at once.

use super::{Parts, Shape, Tracked};
use crate::driver::{DResult, Device, DevicePtr, Driver, MemHandle};
use crate::runtime::env::Env;
use crate::runtime::error::Result;
use crate::runtime::registry::ResourceKind;
use crate::runtime::retry::retry;

/// Binds `size` bytes to multicast object `handle` for `dev`: its memory `mem` from offset 0,
/// or with `addr` the application's pointer through `cuMulticastBindAddr`; the `_v2` entry
/// point where the driver has it.
pub(super) fn bind(
    driver: &dyn Driver,
    handle: MemHandle,
    dev: Device,
    addr: Option<DevicePtr>,
    mem: MemHandle,
    size: usize,
) -> DResult<()> {
    match (addr, driver.has_multicast_bind_v2()) {
        (Some(a), true) => driver.multicast_bind_addr_v2(handle, dev, 0, a, size, 0),
        (Some(a), false) => driver.multicast_bind_addr(handle, 0, a, size, 0),
        (None, true) => driver.multicast_bind_mem_v2(handle, dev, 0, mem, 0, size, 0),
        (None, false) => driver.multicast_bind_mem(handle, 0, mem, 0, size, 0),
    }
}

impl Parts {
    /// Reserves `n * size` and maps every rank's memory (`handles[peer]`) for rank `rank`.
    pub(super) fn map_view(
        &mut self,
        env: &Env,
        shape: &Shape,
        handles: &[MemHandle],
        rank: usize,
        trim: &mut dyn FnMut() -> u64,
    ) -> Result<()> {
        let driver = env.driver().clone();
        let n = handles.len();
        let size = self.size;
        let dev = shape.devices[rank];
        let owner = shape.owner.as_str();
        let span = n * size;
        let what = || format!("reserving {span} bytes of address space for rank {rank}");
        let base = retry(env, &what, 0, trim, || driver.mem_address_reserve(span, shape.alignment))?;
        let id = env.resources.track(ResourceKind::Reservation, span as u64, None, owner);
        self.views.push(Tracked { value: base, id });
        for (peer, &handle) in handles.iter().enumerate() {
            let addr = base + (peer * size) as u64;
            let what = || format!("mapping rank {peer}'s memory for rank {rank}");
            retry(env, &what, 0, trim, || driver.mem_map(addr, size, 0, handle))?;
            let id = env.resources.track(ResourceKind::Mapping, size as u64, Some(dev), owner);
            self.maps.push((addr, size, id));
            let what = || format!("giving rank {rank}'s device {dev} access to rank {peer}'s memory");
            retry(env, &what, 0, trim, || driver.mem_set_access(addr, size, &[dev]))?;
        }
        Ok(())
    }

    /// Reserves and maps the multicast object for rank `rank`.
    pub(super) fn map_multicast(
        &mut self,
        env: &Env,
        shape: &Shape,
        handle: MemHandle,
        rank: usize,
        trim: &mut dyn FnMut() -> u64,
    ) -> Result<()> {
        let driver = env.driver().clone();
        let size = self.mc_size;
        let dev = shape.devices[rank];
        let owner = shape.owner.as_str();
        let what = || format!("reserving {size} bytes of multicast address space for rank {rank}");
        let va = retry(env, &what, 0, trim, || driver.mem_address_reserve(size, shape.alignment))?;
        let id = env.resources.track(ResourceKind::Reservation, size as u64, None, owner);
        self.mc_mut().views.push((Tracked { value: va, id }, None));
        let what = || format!("mapping the multicast object for rank {rank} on device {dev}");
        retry(env, &what, 0, trim, || driver.mem_map(va, size, 0, handle))?;
        let id = env.resources.track(ResourceKind::Mapping, size as u64, Some(dev), owner);
        if let Some(v) = self.mc_mut().views.last_mut() {
            v.1 = Some(id);
        }
        let what = || format!("giving rank {rank}'s device {dev} access to the multicast mapping");
        retry(env, &what, 0, trim, || driver.mem_set_access(va, size, &[dev]))?;
        Ok(())
    }
}
