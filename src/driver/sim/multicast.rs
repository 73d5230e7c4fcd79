//! Multicast objects: granularity, create, add device, the four binds (blocking until the team
//! is full, watched by the watchdog), unbind, and the multimem address translation.

use std::time::{Duration, Instant};

use parking_lot::MutexGuard;

use super::shared::{SharedBinding, SharedMc};
use super::state::{Binding, Exceeds, Mc, State};
use super::{SimDriver, INVALID_VALUE, R};
use crate::driver::{
    CuResult, DResult, Device, DevicePtr, Granularity, HandleTypes, MemHandle, MulticastOps, MulticastProp,
};

/// A resolved bind target.
struct BindSource {
    phys: u64,
    mem_offset: usize,
    dev: Device,
}

/// What a bind names as its memory.
#[derive(Clone, Copy)]
enum BindMemory {
    Handle(MemHandle, usize),
    Address(DevicePtr),
}

impl SimDriver {
    /// For a range of a multicast mapping lying inside one binding region, the host address of
    /// the same bytes in each bound device's memory, ordered by device ordinal (devices with no
    /// binding covering the range are absent). `None` when `addr` is not a multicast address, the
    /// range leaves the mapping, or no device has it bound. The pointers stay valid until the
    /// binding is undone.
    pub fn multicast_targets(&self, addr: DevicePtr, len: usize) -> Option<Vec<*mut u8>> {
        let st = self.state.lock();
        let (start, m) = st.mapping_at(addr)?;
        let end = addr.checked_add(len as u64)?;
        if !m.multicast || len == 0 || end > start + m.size as u64 {
            return None;
        }
        let mc = st.mcs.get(&m.handle)?;
        let off = m.offset + (addr - start) as usize;
        if let Some(sh) = &mc.shared {
            // Bindings of every process; the memory is reached through this process's import
            // of it (a process maps its peers' memory before it uses the multicast range).
            // Ordered by GPU key: the same order in every process.
            let mut hits: Vec<(u64, *mut u8)> = Vec::new();
            for b in sh.bindings() {
                if !(off >= b.mc_offset && off + len <= b.mc_offset + b.size) {
                    continue;
                }
                let phys = st.phys.values().find(|p| p.memfd.identity() == b.identity)?;
                if b.mem_offset + b.size > phys.size {
                    return None;
                }
                // SAFETY: mem_offset + size <= phys.size (checked above).
                hits.push((b.gpu, unsafe { phys.memfd.shadow().add(b.mem_offset + (off - b.mc_offset)) }));
            }
            if hits.is_empty() {
                return None;
            }
            hits.sort_by_key(|&(dev, _)| dev);
            return Some(hits.into_iter().map(|(_, p)| p).collect());
        }
        let mut hits: Vec<(Device, *mut u8)> = mc
            .bindings
            .iter()
            .filter(|b| off >= b.mc_offset && off + len <= b.mc_offset + b.size)
            .filter_map(|b| {
                let phys = st.phys.get(&b.phys)?;
                // SAFETY: mem_offset + size <= phys.size was checked at bind time, so the offset
                // stays inside the shadow mapping.
                Some((b.dev, unsafe { phys.memfd.shadow().add(b.mem_offset + (off - b.mc_offset)) }))
            })
            .collect();
        if hits.is_empty() {
            return None;
        }
        hits.sort_by_key(|&(dev, _)| dev);
        Some(hits.into_iter().map(|(_, p)| p).collect())
    }

    /// Waits until every device of `mc` was added; panics when the watchdog expires.
    pub(super) fn wait_for_team(&self, st: &mut MutexGuard<'_, State>, mc: MemHandle, func: &'static str) -> R<()> {
        let deadline = Instant::now() + self.config.watchdog;
        loop {
            let obj = st.live_mc(mc)?;
            let (added, wanted) = (obj.added(), obj.prop.num_devices as usize);
            if added >= wanted {
                return Ok(());
            }
            let timed_out = if obj.shared.is_some() {
                // Other processes add devices: poll the shared count.
                MutexGuard::unlocked(st, || std::thread::sleep(Duration::from_millis(1)));
                Instant::now() >= deadline
            } else {
                self.team_changed.wait_until(st, deadline).timed_out()
            };
            if timed_out {
                let obj = st.live_mc(mc)?;
                let added = obj.added();
                if added >= wanted {
                    return Ok(());
                }
                panic!(
                    "mcast sim watchdog: {func} on multicast object {:#x} blocked for {:?} waiting for all \
                     devices to be added ({added} of {wanted} added); real hardware would hang forever here",
                    mc.0, self.config.watchdog
                );
            }
        }
    }

    /// The argument rules of a bind, checked before and again after waiting for the team.
    #[allow(clippy::too_many_arguments)]
    fn bind_check(
        &self,
        st: &State,
        mc: MemHandle,
        dev: Option<Device>,
        mc_offset: usize,
        memory: BindMemory,
        size: usize,
        flags: u64,
    ) -> R<BindSource> {
        let obj = st.live_mc(mc)?;
        if let Some(dev) = dev {
            self.check_dev(dev)?;
        }
        let g = self.mc_gran();
        if flags != 0 || size == 0 || !size.is_multiple_of(g) || !mc_offset.is_multiple_of(g) {
            return Err(INVALID_VALUE);
        }
        // BindMem: `memOffset` must be a multiple; BindAddr: `memptr` itself must be.
        let (alloc, mem_offset) = match memory {
            BindMemory::Handle(handle, mem_offset) => {
                if mem_offset % g != 0 {
                    return Err(INVALID_VALUE);
                }
                (st.live_alloc(handle)?, mem_offset)
            }
            BindMemory::Address(ptr) => {
                if ptr % g as u64 != 0 {
                    return Err(INVALID_VALUE);
                }
                let (start, m) = st.mapping_at(ptr).ok_or(INVALID_VALUE)?;
                if m.multicast {
                    return Err(INVALID_VALUE);
                }
                let alloc = st.allocs.get(&m.handle).ok_or(INVALID_VALUE)?;
                (alloc, m.offset + (ptr - start) as usize)
            }
        };
        let phys = st.phys_of(alloc)?;
        if mem_offset.checked_add(size).exceeds(phys.size) {
            return Err(INVALID_VALUE);
        }
        if mc_offset.checked_add(size).exceeds(obj.prop.size) {
            return Err(INVALID_VALUE);
        }
        let mem_shareable = alloc.imported || phys.handle_types.is_shareable();
        if (obj.prop.handle_types.is_shareable() || obj.imported) && !mem_shareable {
            return Err(INVALID_VALUE);
        }
        Ok(BindSource { phys: alloc.phys, mem_offset, dev: phys.dev })
    }

    #[allow(clippy::too_many_arguments)]
    fn bind(
        &self,
        func: &'static str,
        mc: MemHandle,
        dev: Option<Device>,
        mc_offset: usize,
        memory: BindMemory,
        size: usize,
        flags: u64,
    ) -> R<()> {
        let mut st = self.state.lock();
        self.bind_check(&st, mc, dev, mc_offset, memory, size, flags)?;
        self.wait_for_team(&mut st, mc, func)?;
        let src = self.bind_check(&st, mc, dev, mc_offset, memory, size, flags)?;
        let obj = st.live_mc(mc)?;
        let target = dev.unwrap_or(src.dev);
        if src.dev != target || !obj.has_device(target, self.gpu_key(target)) {
            return Err(CuResult::ERROR_INVALID_DEVICE);
        }
        if obj
            .bindings
            .iter()
            .any(|b| b.dev == target && b.mc_offset < mc_offset + size && mc_offset < b.mc_offset + b.size)
        {
            return Err(INVALID_VALUE);
        }
        let binding = Binding { dev: target, mc_offset, size, phys: src.phys, mem_offset: src.mem_offset };
        if let Some(sh) = &obj.shared {
            let identity = st.phys.get(&src.phys).ok_or(CuResult::ERROR_UNKNOWN)?.memfd.identity();
            let record =
                SharedBinding { gpu: self.gpu_key(target), mc_offset, size, mem_offset: src.mem_offset, identity };
            if !sh.bind(record) {
                return Err(CuResult::ERROR_OUT_OF_MEMORY);
            }
        }
        if let Some(p) = st.phys.get_mut(&src.phys) {
            p.refs += 1;
        }
        if let Some(obj) = st.mcs.get_mut(&mc) {
            obj.bindings.push(binding);
        }
        Ok(())
    }
}

impl MulticastOps for SimDriver {
    fn has_multicast_api(&self) -> bool {
        true
    }

    fn has_multicast_bind_v2(&self) -> bool {
        true
    }

    fn multicast_granularity(&self, prop: &MulticastProp, option: Granularity) -> DResult<usize> {
        self.call("cuMulticastGetGranularity", || {
            if !self.config.multicast_supported {
                return Err(CuResult::ERROR_NOT_SUPPORTED);
            }
            if prop.num_devices == 0 {
                return Err(INVALID_VALUE);
            }
            Ok(match option {
                Granularity::Minimum => self.config.multicast_granularity_min,
                Granularity::Recommended => self.config.multicast_granularity_recommended,
            })
        })
    }

    fn multicast_create(&self, prop: &MulticastProp) -> DResult<MemHandle> {
        self.call("cuMulticastCreate", || {
            if !self.config.multicast_supported {
                return Err(CuResult::ERROR_NOT_SUPPORTED);
            }
            let g = self.mc_gran();
            if prop.num_devices == 0 || prop.flags != 0 || prop.size == 0 || !prop.size.is_multiple_of(g) {
                return Err(INVALID_VALUE);
            }
            if prop.handle_types.contains(HandleTypes::FABRIC) && !self.config.fabric_supported {
                return Err(CuResult::ERROR_NOT_SUPPORTED);
            }
            if prop.handle_types.contains(HandleTypes::FABRIC) && !self.config.imex {
                return Err(CuResult::ERROR_NOT_PERMITTED);
            }
            let mut st = self.state.lock();
            if st.mcs.len() >= self.config.multicast_slots as usize {
                return Err(CuResult::ERROR_OUT_OF_MEMORY);
            }
            let shared = if prop.handle_types.is_shareable() {
                Some(SharedMc::create(prop).map_err(|_| CuResult::ERROR_OUT_OF_MEMORY)?)
            } else {
                None
            };
            let handle = MemHandle(st.fresh_id());
            let obj = Mc {
                prop: *prop,
                devices: Vec::new(),
                imported: false,
                bindings: Vec::new(),
                released: false,
                maps: 0,
                shared,
            };
            st.mcs.insert(handle, obj);
            Ok(handle)
        })
    }

    fn multicast_add_device(&self, mc: MemHandle, dev: Device) -> DResult<()> {
        self.call("cuMulticastAddDevice", || {
            let mut st = self.state.lock();
            st.live_mc(mc)?;
            self.check_dev(dev)?;
            let obj = st.mcs.get_mut(&mc).ok_or(INVALID_VALUE)?;
            match &obj.shared {
                Some(sh) => {
                    if !sh.add(self.gpu_key(dev)) {
                        return Err(INVALID_VALUE);
                    }
                }
                None => {
                    if obj.devices.contains(&dev) || obj.devices.len() >= obj.prop.num_devices as usize {
                        return Err(INVALID_VALUE);
                    }
                }
            }
            obj.devices.push(dev);
            self.team_changed.notify_all();
            Ok(())
        })
    }

    fn multicast_bind_mem(
        &self,
        mc: MemHandle,
        mc_offset: usize,
        mem: MemHandle,
        mem_offset: usize,
        size: usize,
        flags: u64,
    ) -> DResult<()> {
        let f = "cuMulticastBindMem";
        self.call(f, || self.bind(f, mc, None, mc_offset, BindMemory::Handle(mem, mem_offset), size, flags))
    }

    #[allow(clippy::too_many_arguments)]
    fn multicast_bind_mem_v2(
        &self,
        mc: MemHandle,
        dev: Device,
        mc_offset: usize,
        mem: MemHandle,
        mem_offset: usize,
        size: usize,
        flags: u64,
    ) -> DResult<()> {
        let f = "cuMulticastBindMem_v2";
        self.call(f, || self.bind(f, mc, Some(dev), mc_offset, BindMemory::Handle(mem, mem_offset), size, flags))
    }

    fn multicast_bind_addr(
        &self,
        mc: MemHandle,
        mc_offset: usize,
        ptr: DevicePtr,
        size: usize,
        flags: u64,
    ) -> DResult<()> {
        let f = "cuMulticastBindAddr";
        self.call(f, || self.bind(f, mc, None, mc_offset, BindMemory::Address(ptr), size, flags))
    }

    fn multicast_bind_addr_v2(
        &self,
        mc: MemHandle,
        dev: Device,
        mc_offset: usize,
        ptr: DevicePtr,
        size: usize,
        flags: u64,
    ) -> DResult<()> {
        let f = "cuMulticastBindAddr_v2";
        self.call(f, || self.bind(f, mc, Some(dev), mc_offset, BindMemory::Address(ptr), size, flags))
    }

    fn multicast_unbind(&self, mc: MemHandle, dev: Device, mc_offset: usize, size: usize) -> DResult<()> {
        self.call("cuMulticastUnbind", || {
            let mut st = self.state.lock();
            let obj = st.live_mc(mc)?;
            self.check_dev(dev)?;
            let g = self.mc_gran();
            if size == 0
                || !size.is_multiple_of(g)
                || !mc_offset.is_multiple_of(g)
                || mc_offset.checked_add(size).exceeds(obj.prop.size)
            {
                return Err(INVALID_VALUE);
            }
            let Some(i) = obj.bindings.iter().position(|b| b.dev == dev && b.mc_offset == mc_offset && b.size == size)
            else {
                tracing::error!(
                    "mcast self: cuMulticastUnbind(mc {:#x}, dev {dev}, offset {mc_offset}, size {size}) matches no \
                 earlier bind; undefined behaviour on real hardware",
                    mc.0
                );
                return Err(INVALID_VALUE);
            };
            if let Some(sh) = &obj.shared {
                sh.unbind(self.gpu_key(dev), mc_offset, size);
            }
            let phys = st.mcs.get_mut(&mc).map(|obj| obj.bindings.remove(i).phys);
            if let Some(phys) = phys {
                st.unref_phys(phys);
            }
            Ok(())
        })
    }
}
