//! The three ways to make a segment: allocated memory (one process or many), memory the
//! application registered in one process, and registered memory of a multi-process team.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{External, Parts, Segment, Shape, Tracked};
use crate::driver::{DevicePtr, MemHandle};
use crate::runtime::comm::Comm;
use crate::runtime::env::Env;
use crate::runtime::error::Result;
use crate::runtime::registry::ResourceKind;

impl Segment {
    /// Creates a segment of `size` bytes per rank for `shape` (size a multiple of the team's
    /// granularity). `trim` frees cached memory when a step runs out.
    pub fn create(env: &Env, shape: &Shape, size: usize, trim: &mut dyn FnMut() -> u64) -> Result<Segment> {
        static SERIAL: AtomicU64 = AtomicU64::new(1);
        let mut parts = Parts::new(shape, size, size, shape.comm.as_ref().map(|c| c.rank()));
        let built = match &shape.comm {
            Some(comm) => parts.build_mp(env, shape, comm, trim),
            None => parts.build(env, shape, trim),
        };
        let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
        Segment::finish(parts, built, "segment", serial, vec![0; shape.devices.len()], Vec::new(), env)
    }

    /// A segment over memory the application owns (one process holding every rank): every
    /// rank's whole allocation (its first `size` bytes, `size` a multiple of the granularity)
    /// mapped on every rank's device, and on the multicast transport a multicast object of
    /// `mc_size` bytes bound at each rank's pointer with `cuMulticastBindAddr` (`_v2` where the
    /// driver has it). Takes the retained handles (released on failure and at teardown).
    pub fn register(
        env: &Env,
        shape: &Shape,
        ext: Vec<External>,
        size: usize,
        mc_size: usize,
        trim: &mut dyn FnMut() -> u64,
    ) -> Result<Segment> {
        static SERIAL: AtomicU64 = AtomicU64::new(1 << 40);
        let mut parts = Parts::new(shape, size, mc_size, None);
        for (rank, e) in ext.iter().enumerate() {
            parts.retained(env, shape, rank, e.handle);
        }
        let handles: Vec<MemHandle> = ext.iter().map(|e| e.handle).collect();
        let built = (|| {
            for rank in 0..shape.devices.len() {
                parts.map_view(env, shape, &handles, rank, trim)?;
            }
            if shape.multicast {
                let ptrs: Vec<DevicePtr> = ext.iter().map(|e| e.ptr).collect();
                parts.build_multicast(env, shape, Some(&ptrs), trim)?;
            }
            Ok(())
        })();
        let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
        let skews = ext.iter().map(|e| e.offset as u64).collect();
        let ptrs = ext.iter().map(|e| e.ptr).collect();
        Segment::finish(parts, built, "registration", serial, skews, ptrs, env)
    }

    /// A multi-process segment over memory the application owns: this process holds rank
    /// `comm.rank()` and its retained handle `own`. The handle is exported as the team's
    /// handle type and passed to every peer (as `Parts::build_mp` passes allocated memory),
    /// every rank's whole allocation (its first `size` bytes) is mapped on this rank's device,
    /// and on the multicast transport rank 0 makes a multicast object of `mc_size` bytes that
    /// every rank binds at its own pointer with `cuMulticastBindAddr`. `skews[q]` and `ptrs[q]`
    /// are rank q's offset in its allocation and its pointer. Every step is voted; on failure
    /// everything is rolled back (the retained handle released) on every rank.
    #[allow(clippy::too_many_arguments)]
    pub fn register_mp(
        env: &Env,
        shape: &Shape,
        comm: &Comm,
        own: External,
        skews: Vec<u64>,
        ptrs: Vec<DevicePtr>,
        size: usize,
        mc_size: usize,
        trim: &mut dyn FnMut() -> u64,
    ) -> Result<Segment> {
        static SERIAL: AtomicU64 = AtomicU64::new(1 << 41);
        let r = comm.rank();
        let mut parts = Parts::new(shape, size, mc_size, Some(r));
        parts.retained(env, shape, r, own.handle);
        let prefix = format!("registration of {size} bytes: ");
        let built = parts.share_and_map(env, shape, comm, own.handle, Some(own.ptr), &prefix, trim);
        let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
        Segment::finish(parts, built, "registration", serial, skews, ptrs, env)
    }
}

impl Parts {
    /// Takes rank `rank`'s retained handle of registered memory (released at teardown).
    fn retained(&mut self, env: &Env, shape: &Shape, rank: usize, handle: MemHandle) {
        let id = env.resources.track(ResourceKind::PhysicalAllocation, 0, Some(shape.devices[rank]), &shape.owner);
        self.phys.push((rank, Tracked { value: handle, id }));
    }
}
