//! A segment built by the processes of a multi-process team, one rank each: the same steps as
//! `local.rs`, each followed by an exchange or a vote, so a failure on one rank is an error on
//! every rank and no rank enters a call that blocks on the others alone.

use super::export::{self, handle_type_name, Exported};
use super::map::bind;
use super::{Multicast, Parts, Shape, Tracked};
use crate::driver::{DevicePtr, MemHandle, MulticastProp};
use crate::runtime::comm::Comm;
use crate::runtime::env::Env;
use crate::runtime::error::{Error, Result};
use crate::runtime::registry::ResourceKind;
use crate::runtime::retry::lockstep;

impl Parts {
    /// A multi-process segment: this rank allocates shareable memory, exports it as a file
    /// descriptor or a fabric handle ([`Shape::handle_type`]), and the ranks pass the
    /// descriptors (or the handles' bytes) to each other over the rendezvous; each
    /// rank imports its peers' memory and maps every rank's memory side by side. On the
    /// multicast transport rank 0 creates the object and passes it the same way; every rank
    /// adds its own device, binds its own memory and maps the object. Every step that can fail
    /// ends with a vote, so no rank enters a call that blocks on the others (bind, map of the
    /// multicast object) unless every rank got there; out-of-memory retries are decided
    /// together.
    pub(super) fn build_mp(
        &mut self,
        env: &Env,
        shape: &Shape,
        comm: &Comm,
        trim: &mut dyn FnMut() -> u64,
    ) -> Result<()> {
        let driver = env.driver().clone();
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
            env,
            &label("cuMemCreate"),
            &what,
            size as u64,
            trim,
            || driver.mem_create(dev, size, ht),
            |h| {
                let id = env.resources.track(ResourceKind::PhysicalAllocation, size as u64, Some(dev), owner);
                phys.push((r, Tracked { value: h, id }));
            },
        )?;
        let own = self.phys[0].1.value;
        self.share_and_map(env, shape, comm, own, None, &label(""), trim)
    }

    /// Exports this rank's memory `own`, imports every peer's ([`Parts::share_memory`]), maps
    /// every rank's memory on this rank's device and, on the multicast transport, builds the
    /// multicast object with this rank's memory bound (at `addr`, the application's pointer,
    /// for registered memory). Every step voted; `prefix` starts the steps' labels.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn share_and_map(
        &mut self,
        env: &Env,
        shape: &Shape,
        comm: &Comm,
        own: MemHandle,
        addr: Option<DevicePtr>,
        prefix: &str,
        trim: &mut dyn FnMut() -> u64,
    ) -> Result<()> {
        let handles = self.share_memory(env, shape, comm, own, prefix)?;
        let mapped = self.map_view(env, shape, &handles, comm.rank(), trim);
        comm.vote(&format!("{prefix}map peers"), mapped)?;
        if shape.multicast {
            self.build_multicast_mp(env, shape, comm, addr, prefix, trim)?;
        }
        Ok(())
    }

    /// Exports this rank's memory `own` as the team's handle type, passes it to every peer over
    /// the rendezvous and imports theirs (tracked in `phys` at once, so a rollback releases
    /// them); voted. Returns every rank's handle, `own` at this rank's index. `prefix` starts
    /// the steps' labels.
    fn share_memory(
        &mut self,
        env: &Env,
        shape: &Shape,
        comm: &Comm,
        own: MemHandle,
        prefix: &str,
    ) -> Result<Vec<MemHandle>> {
        let driver = env.driver().clone();
        let n = shape.devices.len();
        let r = comm.rank();
        let owner = shape.owner.as_str();
        let ht = shape.handle_type;
        let exported = Exported::of(&*driver, own, ht)
            .map(Some)
            .map_err(|e| Error::driver(e, format_args!("exporting rank {r}'s memory as {}", handle_type_name(ht))));
        let parts = export::exchange(comm, &format!("{prefix}export memory"), exported)?;
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
                    let id = env.resources.track(ResourceKind::PhysicalAllocation, 0, Some(shape.devices[peer]), owner);
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
        comm.vote(&format!("{prefix}import memory"), imported)?;
        Ok(handles)
    }

    /// The multicast object of a multi-process segment, `mc_size` bytes: rank 0 creates it and
    /// passes it to the others; every rank adds its own device, binds its own memory (its
    /// handle from offset 0, or with `addr` the application's pointer through
    /// `cuMulticastBindAddr`) and maps the object. Every step is voted.
    fn build_multicast_mp(
        &mut self,
        env: &Env,
        shape: &Shape,
        comm: &Comm,
        addr: Option<DevicePtr>,
        prefix: &str,
        trim: &mut dyn FnMut() -> u64,
    ) -> Result<()> {
        let driver = env.driver().clone();
        let size = self.mc_size;
        let owner = shape.owner.as_str();
        let r = comm.rank();
        let dev = shape.devices[r];
        let label = |step: &str| format!("{prefix}{step}");
        let prop =
            MulticastProp { num_devices: shape.devices.len() as u32, size, handle_types: shape.handle_type, flags: 0 };
        // Rank 0 creates the object.
        let what = || format!("rank {r} creating a multicast object of {size} bytes for {} devices", prop.num_devices);
        let mut created = None;
        let mc = &mut self.mc;
        lockstep(
            comm,
            env,
            &label("cuMulticastCreate"),
            &what,
            size as u64,
            trim,
            || if r == 0 { driver.multicast_create(&prop).map(Some) } else { Ok(None) },
            |h| {
                if let Some(handle) = h {
                    let id = env.resources.track(ResourceKind::MulticastObject, size as u64, None, owner);
                    *mc = Some(Multicast::new(handle, id));
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
        let parts = export::exchange(comm, &label("export multicast object"), exported)?;
        let mut imported = Ok(());
        if r != 0 {
            imported = match Exported::import(&*driver, &parts[0], ht) {
                None => Err(Error::internal("the multicast object's handle did not arrive")),
                Some(Ok(handle)) => {
                    let id = env.resources.track(ResourceKind::MulticastObject, 0, None, owner);
                    self.mc = Some(Multicast::new(handle, id));
                    Ok(())
                }
                Some(Err(e)) => Err(Error::driver(e, format_args!("rank {r} importing the multicast object"))),
            };
        }
        drop(parts);
        comm.vote(&label("import multicast object"), imported)?;
        let handle = self.mc_mut().handle.value;
        // Every rank adds its own device; nobody binds before all were added.
        let what = || format!("adding rank {r}'s device {dev} to the multicast object");
        lockstep(
            comm,
            env,
            &label("cuMulticastAddDevice"),
            &what,
            0,
            trim,
            || driver.multicast_add_device(handle, dev),
            |()| {},
        )?;
        let mem = self.phys.iter().find(|(rank, _)| *rank == r).expect("own memory").1.value;
        let what = || format!("binding rank {r}'s memory (device {dev}) to the multicast object");
        let bound = &mut self.mc.as_mut().expect("the multicast object exists").bound;
        lockstep(
            comm,
            env,
            &label(if addr.is_some() { "cuMulticastBindAddr" } else { "cuMulticastBindMem" }),
            &what,
            size as u64,
            trim,
            || bind(&*driver, handle, dev, addr, mem, size),
            |()| bound.push((dev, env.resources.track(ResourceKind::Binding, size as u64, Some(dev), owner))),
        )?;
        let mapped = self.map_multicast(env, shape, handle, r, trim);
        comm.vote(&label("map multicast object"), mapped)
    }
}
