//! A segment built by one process holding every rank: allocate each rank's memory, map every
//! rank's view, and on the multicast transport create, bind and map the multicast object.

use super::map::bind;
use super::{Multicast, Parts, Shape, Tracked};
use crate::driver::{DevicePtr, HandleTypes, MemHandle, MulticastProp};
use crate::runtime::env::Env;
use crate::runtime::error::Result;
use crate::runtime::registry::ResourceKind;
use crate::runtime::retry::retry;

impl Parts {
    /// Allocates `size` bytes per rank, maps every rank's view and, on the multicast transport,
    /// builds the multicast object.
    pub(super) fn build(&mut self, env: &Env, shape: &Shape, trim: &mut dyn FnMut() -> u64) -> Result<()> {
        let driver = env.driver().clone();
        let size = self.size;
        let owner = shape.owner.as_str();
        for (rank, &dev) in shape.devices.iter().enumerate() {
            let what = || format!("allocating {size} bytes for rank {rank} on device {dev}");
            let h = retry(env, &what, size as u64, trim, || driver.mem_create(dev, size, HandleTypes::NONE))?;
            let id = env.resources.track(ResourceKind::PhysicalAllocation, size as u64, Some(dev), owner);
            self.phys.push((rank, Tracked { value: h, id }));
        }
        let handles: Vec<MemHandle> = self.phys.iter().map(|(_, p)| p.value).collect();
        for rank in 0..shape.devices.len() {
            self.map_view(env, shape, &handles, rank, trim)?;
        }
        if shape.multicast {
            self.build_multicast(env, shape, None, trim)?;
        }
        Ok(())
    }

    /// Creates the multicast object, adds every device, binds every rank's memory (its handle
    /// from offset 0, or with `addrs` the caller's pointers through `cuMulticastBindAddr`) and
    /// maps the object on every device.
    pub(super) fn build_multicast(
        &mut self,
        env: &Env,
        shape: &Shape,
        addrs: Option<&[DevicePtr]>,
        trim: &mut dyn FnMut() -> u64,
    ) -> Result<()> {
        let driver = env.driver().clone();
        let size = self.mc_size;
        let owner = shape.owner.as_str();
        let prop =
            MulticastProp { num_devices: shape.devices.len() as u32, size, handle_types: HandleTypes::NONE, flags: 0 };
        let what = || format!("creating a multicast object of {size} bytes for {} devices", prop.num_devices);
        let handle = retry(env, &what, size as u64, trim, || driver.multicast_create(&prop))?;
        let id = env.resources.track(ResourceKind::MulticastObject, size as u64, None, owner);
        self.mc = Some(Multicast::new(handle, id));
        for &dev in &shape.devices {
            let what = || format!("adding device {dev} to the multicast object");
            retry(env, &what, 0, trim, || driver.multicast_add_device(handle, dev))?;
        }
        for (rank, &dev) in shape.devices.iter().enumerate() {
            let mem = self.phys[rank].1.value;
            let addr = addrs.map(|a| a[rank]);
            let what = || format!("binding rank {rank}'s memory (device {dev}) to the multicast object");
            retry(env, &what, size as u64, trim, || bind(&*driver, handle, dev, addr, mem, size))?;
            let id = env.resources.track(ResourceKind::Binding, size as u64, Some(dev), owner);
            self.mc_mut().bound.push((dev, id));
        }
        for rank in 0..shape.devices.len() {
            self.map_multicast(env, shape, handle, rank, trim)?;
        }
        Ok(())
    }
}
