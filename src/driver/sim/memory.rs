//! Memory: physical allocations (`cuMemCreate`, release, export and import), address
//! reservations, mappings and access, pointer queries and plain `cuMemAlloc` memory.

use std::collections::BTreeSet;
use std::os::fd::{OwnedFd, RawFd};

use super::host::{self, Memfd};
use super::shared::SharedMc;
use super::state::{Alloc, Exceeds, Mapping, Mc, Phys, State};
use super::{fabric, SimDriver, INVALID_VALUE, R};
use crate::driver::{
    AllocationProps, CuResult, DResult, Device, DevicePtr, Granularity, HandleTypes, MemHandle, MemoryOps,
    FABRIC_HANDLE_BYTES,
};

/// Alignment of simulated `cuMemAlloc` memory (the driver guarantees at least 256 bytes).
const PLAIN_ALIGN: usize = 256;

impl SimDriver {
    /// `cuMemImportFromShareableHandle` of a descriptor for a simulator's memfd (memory or a
    /// multicast object's control block, from this or another process), which must have been
    /// created with the handle type `need`.
    fn import_fd(&self, fd: RawFd, need: HandleTypes) -> R<MemHandle> {
        let identity = host::fd_identity(fd).map_err(|_| INVALID_VALUE)?;
        let mut st = self.state.lock();
        let known = st.phys.iter().find(|(_, p)| p.memfd.identity() == identity).map(|(&id, p)| (id, p.handle_types));
        let id = match known {
            Some((id, types)) if types.contains(need) => id,
            Some(_) => return Err(INVALID_VALUE),
            // A multicast object (from this or another process): map its control block.
            None if SharedMc::import(fd).is_some() => {
                let (sh, prop) = SharedMc::import(fd).ok_or(INVALID_VALUE)?;
                if !prop.handle_types.contains(need) {
                    return Err(INVALID_VALUE);
                }
                if st.mcs.len() >= self.config.multicast_slots as usize {
                    return Err(CuResult::ERROR_OUT_OF_MEMORY);
                }
                let handle = MemHandle(st.fresh_id());
                let obj = Mc {
                    prop,
                    devices: Vec::new(),
                    imported: true,
                    bindings: Vec::new(),
                    released: false,
                    maps: 0,
                    shared: Some(sh),
                };
                st.mcs.insert(handle, obj);
                return Ok(handle);
            }
            // Memory made by the simulator of another process: adopt the descriptor.
            None => {
                let (gpu, types, size) = parse_mem_tag(fd).ok_or(INVALID_VALUE)?;
                // Memory of a GPU this process does not see (another host's, or one hidden by
                // CUDA_VISIBLE_DEVICES) imports all the same, as on CUDA; it is on no ordinal.
                let dev = self.ordinal_of_key(gpu).unwrap_or(NOT_VISIBLE);
                if !types.contains(need) {
                    return Err(INVALID_VALUE);
                }
                let own = host_dup(fd)?;
                let memfd = Memfd::adopt(own, size).map_err(|_| CuResult::ERROR_OUT_OF_MEMORY)?;
                let id = st.fresh_id();
                // The handle below holds the only reference.
                st.phys.insert(id, Phys { memfd, dev, size, handle_types: types, refs: 0 });
                id
            }
        };
        let handle = MemHandle(st.fresh_id());
        if let Some(p) = st.phys.get_mut(&id) {
            p.refs += 1;
        }
        st.allocs.insert(handle, Alloc { phys: id, imported: true, released: false, maps: 0 });
        Ok(handle)
    }

    /// The rules of `cuMemMap`; returns whether `handle` is a multicast object.
    fn map_check(&self, st: &State, ptr: u64, size: usize, offset: usize, handle: MemHandle) -> R<bool> {
        let (multicast, total, g) = if let Ok(alloc) = st.live_alloc(handle) {
            (false, st.phys_of(alloc)?.size, self.config.mem_granularity)
        } else {
            let obj = st.live_mc(handle)?;
            if offset != 0 {
                return Err(INVALID_VALUE);
            }
            (true, obj.prop.size, self.mc_gran())
        };
        if size == 0 || !size.is_multiple_of(g) || !offset.is_multiple_of(g) || !ptr.is_multiple_of(g as u64) {
            return Err(INVALID_VALUE);
        }
        if offset.checked_add(size).exceeds(total) {
            return Err(INVALID_VALUE);
        }
        let end = ptr.checked_add(size as u64).ok_or(INVALID_VALUE)?;
        let (&rstart, &rsize) = st.reservations.range(..=ptr).next_back().ok_or(INVALID_VALUE)?;
        if end > rstart + rsize as u64 {
            return Err(INVALID_VALUE);
        }
        if let Some((&mstart, m)) = st.mappings.range(..end).next_back() {
            if mstart + m.size as u64 > ptr {
                return Err(INVALID_VALUE);
            }
        }
        Ok(multicast)
    }
}

impl MemoryOps for SimDriver {
    fn mem_granularity(&self, dev: Device, _option: Granularity, _handle_types: HandleTypes) -> DResult<usize> {
        self.call("cuMemGetAllocationGranularity", || {
            self.check_dev(dev)?;
            Ok(self.config.mem_granularity)
        })
    }

    fn mem_create(&self, dev: Device, size: usize, handle_types: HandleTypes) -> DResult<MemHandle> {
        self.call("cuMemCreate", || {
            self.check_dev(dev)?;
            if size == 0 || !size.is_multiple_of(self.config.mem_granularity) {
                return Err(INVALID_VALUE);
            }
            if handle_types.contains(HandleTypes::FABRIC) && !self.config.fabric_supported {
                return Err(CuResult::ERROR_NOT_SUPPORTED);
            }
            if handle_types.contains(HandleTypes::FABRIC) && !self.config.imex {
                return Err(CuResult::ERROR_NOT_PERMITTED);
            }
            let mut st = self.state.lock();
            if st.used_bytes(dev).saturating_add(size as u64) > self.config.device_memory {
                return Err(CuResult::ERROR_OUT_OF_MEMORY);
            }
            let tag = format!("mem:gpu={:x}:types={}", self.gpu_key(dev), handle_types.0);
            let memfd = Memfd::create(size, &tag).map_err(|_| CuResult::ERROR_OUT_OF_MEMORY)?;
            let id = st.fresh_id();
            st.phys.insert(id, Phys { memfd, dev, size, handle_types, refs: 1 });
            let handle = MemHandle(st.fresh_id());
            st.allocs.insert(handle, Alloc { phys: id, imported: false, released: false, maps: 0 });
            Ok(handle)
        })
    }

    fn mem_release(&self, handle: MemHandle) -> DResult<()> {
        self.call("cuMemRelease", || {
            let mut st = self.state.lock();
            if let Some(a) = st.allocs.get_mut(&handle).filter(|a| !a.released) {
                a.released = true;
                if a.maps == 0 {
                    st.free_alloc(handle);
                }
                return Ok(());
            }
            let obj = st.mcs.get_mut(&handle).filter(|m| !m.released).ok_or(INVALID_VALUE)?;
            obj.released = true;
            if obj.maps == 0 {
                st.free_mc(handle);
            }
            // Wake binds and maps waiting on this object: they now fail.
            self.team_changed.notify_all();
            Ok(())
        })
    }

    fn mem_address_reserve(&self, size: usize, alignment: usize) -> DResult<DevicePtr> {
        self.call("cuMemAddressReserve", || {
            let g = self.config.mem_granularity;
            if size == 0 || !size.is_multiple_of(g) || (alignment != 0 && !alignment.is_power_of_two()) {
                return Err(INVALID_VALUE);
            }
            let align = alignment.max(g).next_power_of_two();
            let ptr = host::reserve(size, align).map_err(|_| CuResult::ERROR_OUT_OF_MEMORY)?;
            self.state.lock().reservations.insert(ptr, size);
            Ok(ptr)
        })
    }

    fn mem_address_free(&self, ptr: DevicePtr, size: usize) -> DResult<()> {
        self.call("cuMemAddressFree", || {
            let mut st = self.state.lock();
            if st.reservations.get(&ptr) != Some(&size) {
                return Err(INVALID_VALUE);
            }
            if st.mappings.range(ptr..ptr + size as u64).next().is_some() {
                return Err(INVALID_VALUE);
            }
            st.reservations.remove(&ptr);
            host::unreserve(ptr, size);
            Ok(())
        })
    }

    fn mem_map(&self, ptr: DevicePtr, size: usize, offset: usize, handle: MemHandle) -> DResult<()> {
        self.call("cuMemMap", || {
            let mut st = self.state.lock();
            let multicast = self.map_check(&st, ptr, size, offset, handle)?;
            if multicast {
                self.wait_for_team(&mut st, handle, "cuMemMap")?;
                self.map_check(&st, ptr, size, offset, handle)?;
                // The range stays PROT_NONE: multimem goes through the translation table.
                if let Some(obj) = st.mcs.get_mut(&handle) {
                    obj.maps += 1;
                }
            } else {
                let alloc = st.live_alloc(handle)?;
                let fd = st.phys_of(alloc)?.memfd.raw_fd();
                host::map_fixed(ptr, size, fd, offset).map_err(|_| CuResult::ERROR_OUT_OF_MEMORY)?;
                if let Some(a) = st.allocs.get_mut(&handle) {
                    a.maps += 1;
                }
            }
            let mapping = Mapping { size, handle, offset, multicast, access: BTreeSet::new() };
            st.mappings.insert(ptr, mapping);
            Ok(())
        })
    }

    fn mem_unmap(&self, ptr: DevicePtr, size: usize) -> DResult<()> {
        self.call("cuMemUnmap", || {
            let mut st = self.state.lock();
            let starts = st.whole_mappings(ptr, size)?;
            for start in starts {
                let Some(m) = st.mappings.remove(&start) else {
                    continue;
                };
                if m.multicast {
                    if let Some(obj) = st.mcs.get_mut(&m.handle) {
                        obj.maps -= 1;
                        if obj.maps == 0 && obj.released {
                            st.free_mc(m.handle);
                        }
                    }
                } else {
                    host::protect_none(start, m.size).map_err(|_| CuResult::ERROR_UNKNOWN)?;
                    if let Some(a) = st.allocs.get_mut(&m.handle) {
                        a.maps -= 1;
                        if a.maps == 0 && a.released {
                            st.free_alloc(m.handle);
                        }
                    }
                }
            }
            Ok(())
        })
    }

    fn mem_set_access(&self, ptr: DevicePtr, size: usize, devices: &[Device]) -> DResult<()> {
        self.call("cuMemSetAccess", || {
            if devices.is_empty() || size == 0 {
                return Err(INVALID_VALUE);
            }
            for &dev in devices {
                self.check_dev(dev)?;
            }
            let mut st = self.state.lock();
            let starts = st.whole_mappings(ptr, size)?;
            for start in starts {
                if let Some(m) = st.mappings.get_mut(&start) {
                    m.access.extend(devices.iter().copied());
                }
            }
            Ok(())
        })
    }

    fn mem_export_fd(&self, handle: MemHandle) -> DResult<OwnedFd> {
        self.call("cuMemExportToShareableHandle", || {
            let st = self.state.lock();
            let (fd, _) = st.exportable(handle, HandleTypes::POSIX_FD)?;
            host_dup(fd)
        })
    }

    fn mem_import_fd(&self, fd: RawFd) -> DResult<MemHandle> {
        self.call("cuMemImportFromShareableHandle", || {
            // Descriptors cannot cross hosts: a simulated host is a host identity, and a
            // descriptor made under another one means the runtime routed a handle wrongly.
            if let Some(theirs) = host::memfd_host(fd) {
                let ours = crate::bootstrap::host::host_tag();
                if theirs != ours {
                    tracing::error!(
                        "simulator: a POSIX descriptor made on host {theirs} imported on host {ours}: descriptors \
                     only travel between processes of one host"
                    );
                    return Err(INVALID_VALUE);
                }
            }
            self.import_fd(fd, HandleTypes::POSIX_FD)
        })
    }

    fn mem_export_fabric(&self, handle: MemHandle) -> DResult<[u8; FABRIC_HANDLE_BYTES]> {
        self.call("cuMemExportToShareableHandle", || {
            if !self.config.fabric_supported {
                return Err(CuResult::ERROR_NOT_SUPPORTED);
            }
            let st = self.state.lock();
            let (fd, identity) = st.exportable(handle, HandleTypes::FABRIC)?;
            if !self.config.imex {
                return Err(CuResult::ERROR_NOT_PERMITTED);
            }
            Ok(fabric::encode(std::process::id(), fd, identity, fabric::fabric_id(&self.config.fabric)))
        })
    }

    fn mem_import_fabric(&self, data: &[u8; FABRIC_HANDLE_BYTES]) -> DResult<MemHandle> {
        self.call("cuMemImportFromShareableHandle", || {
            if !self.config.fabric_supported {
                return Err(CuResult::ERROR_NOT_SUPPORTED);
            }
            // Memory of another NVLink fabric is out of reach: the handle names nothing here.
            if fabric::fabric_of(data).is_some_and(|f| f != fabric::fabric_id(&self.config.fabric)) {
                return Err(CuResult::ERROR_INVALID_HANDLE);
            }
            if !self.config.imex {
                return Err(CuResult::ERROR_NOT_PERMITTED);
            }
            let fd = fabric::open(data)?;
            self.import_fd(std::os::fd::AsRawFd::as_raw_fd(&fd), HandleTypes::FABRIC)
        })
    }

    fn mem_retain_allocation_handle(&self, ptr: DevicePtr) -> DResult<MemHandle> {
        self.call("cuMemRetainAllocationHandle", || {
            let mut st = self.state.lock();
            let (_, m) = st.mapping_at(ptr).ok_or(INVALID_VALUE)?;
            if m.multicast {
                return Err(INVALID_VALUE);
            }
            let alloc = st.allocs.get(&m.handle).ok_or(INVALID_VALUE)?;
            let (phys, imported) = (alloc.phys, alloc.imported);
            st.phys.get_mut(&phys).ok_or(CuResult::ERROR_UNKNOWN)?.refs += 1;
            let handle = MemHandle(st.fresh_id());
            st.allocs.insert(handle, Alloc { phys, imported, released: false, maps: 0 });
            Ok(handle)
        })
    }

    fn mem_allocation_props(&self, handle: MemHandle) -> DResult<AllocationProps> {
        self.call("cuMemGetAllocationPropertiesFromHandle", || {
            let st = self.state.lock();
            let phys = st.phys_of(st.live_alloc(handle)?)?;
            Ok(AllocationProps { dev: phys.dev, handle_types: phys.handle_types })
        })
    }

    fn mem_address_range(&self, ptr: DevicePtr) -> DResult<(DevicePtr, usize)> {
        self.call("cuMemGetAddressRange", || {
            let st = self.state.lock();
            if let Some((start, _, size)) = st.plain_at(ptr) {
                return Ok((start, size));
            }
            let (start, m) = st.mapping_at(ptr).ok_or(INVALID_VALUE)?;
            Ok((start, m.size))
        })
    }

    fn pointer_device(&self, ptr: DevicePtr) -> DResult<Device> {
        self.call("cuPointerGetAttribute", || {
            let st = self.state.lock();
            if let Some((_, dev, _)) = st.plain_at(ptr) {
                return Ok(dev);
            }
            let (_, m) = st.mapping_at(ptr).ok_or(INVALID_VALUE)?;
            if m.multicast {
                return Err(INVALID_VALUE);
            }
            let alloc = st.allocs.get(&m.handle).ok_or(INVALID_VALUE)?;
            Ok(st.phys_of(alloc)?.dev)
        })
    }

    fn mem_alloc(&self, dev: Device, size: usize) -> DResult<DevicePtr> {
        self.call("cuMemAlloc", || {
            self.check_dev(dev)?;
            self.unsafe_in_capture()?;
            if size == 0 {
                return Err(INVALID_VALUE);
            }
            let mut st = self.state.lock();
            if st.used_bytes(dev).saturating_add(size as u64) > self.config.device_memory {
                return Err(CuResult::ERROR_OUT_OF_MEMORY);
            }
            // SAFETY: the layout has a non-zero size.
            let ptr = unsafe { std::alloc::alloc_zeroed(plain_layout(size)) };
            if ptr.is_null() {
                return Err(CuResult::ERROR_OUT_OF_MEMORY);
            }
            st.plain.insert(ptr as u64, (dev, size));
            Ok(ptr as u64)
        })
    }

    fn mem_free(&self, dev: Device, ptr: DevicePtr) -> DResult<()> {
        self.call("cuMemFree", || {
            self.check_dev(dev)?;
            self.unsafe_in_capture()?;
            let mut st = self.state.lock();
            let size = match st.plain.get(&ptr) {
                Some(&(_, size)) => size,
                None => return Err(INVALID_VALUE),
            };
            st.plain.remove(&ptr);
            // SAFETY: allocated by `mem_alloc` with this layout; removed from the table first,
            // so it is freed once.
            unsafe { std::alloc::dealloc(ptr as *mut u8, plain_layout(size)) };
            Ok(())
        })
    }

    /// Host memory, zeroed and page-aligned; its address is the device pointer on every device
    /// (as with unified addressing), and kernels store to it directly. Not charged to a
    /// device's budget (it is host memory).
    fn host_alloc_mapped(&self, dev: Device, size: usize) -> DResult<DevicePtr> {
        self.call("cuMemHostAlloc", || {
            self.check_dev(dev)?;
            self.unsafe_in_capture()?;
            if size == 0 {
                return Err(INVALID_VALUE);
            }
            // SAFETY: the layout has a non-zero size.
            let ptr = unsafe { std::alloc::alloc_zeroed(host_layout(size)) };
            if ptr.is_null() {
                return Err(CuResult::ERROR_OUT_OF_MEMORY);
            }
            self.state.lock().host_mapped.insert(ptr as u64, (dev, size));
            Ok(ptr as u64)
        })
    }

    fn host_free_mapped(&self, dev: Device, ptr: DevicePtr) -> DResult<()> {
        self.call("cuMemFreeHost", || {
            self.check_dev(dev)?;
            self.unsafe_in_capture()?;
            let size = self.state.lock().host_mapped.remove(&ptr).map(|(_, size)| size).ok_or(INVALID_VALUE)?;
            // SAFETY: allocated by `host_alloc_mapped` with this layout; removed from the table
            // first, so it is freed once.
            unsafe { std::alloc::dealloc(ptr as *mut u8, host_layout(size)) };
            Ok(())
        })
    }
}

/// The GPU key (see `identity::key`), handle types and size of memory made by
/// [`MemoryOps::mem_create`] in any process.
fn parse_mem_tag(fd: RawFd) -> Option<(u64, HandleTypes, usize)> {
    let (tag, size) = host::memfd_tag(fd)?;
    let rest = tag.strip_prefix("mem:gpu=")?;
    let (gpu, types) = rest.split_once(":types=")?;
    Some((u64::from_str_radix(gpu, 16).ok()?, HandleTypes(types.parse().ok()?), size))
}

/// The device of imported memory whose GPU this process does not see.
pub(super) const NOT_VISIBLE: Device = -1;

/// A close-on-exec duplicate of `fd`.
fn host_dup(fd: RawFd) -> R<OwnedFd> {
    // SAFETY: the caller's descriptor is open for the duration of the call.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    borrowed.try_clone_to_owned().map_err(|_| CuResult::ERROR_OUT_OF_MEMORY)
}

/// The layout of a simulated `cuMemAlloc` block of `size` bytes.
/// The layout of [`MemoryOps::host_alloc_mapped`] memory: page-aligned, as `cuMemHostAlloc`'s.
pub(super) fn host_layout(size: usize) -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(size.max(1), 4096).expect("a valid layout")
}

pub(super) fn plain_layout(size: usize) -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(size.max(1), PLAIN_ALIGN).expect("a valid layout")
}
