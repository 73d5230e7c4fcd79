//! Symmetric buffers: the same size and layout on every rank of a team.

use std::sync::Arc;

use super::comm::Comm;
use super::device_api::{even_stride, BufferView};
use super::error::{Error, Result};
use super::segment::External;
use super::team::{Allocation, Team, Transport};
use crate::driver::{CuResult, DevicePtr, HandleTypes, MemHandle};

/// A buffer.
pub struct Buffer {
    team: Arc<Team>,
    alloc: Allocation,
    /// Memory the application registered: the context's registration serial.
    registration: Option<u64>,
}

impl Buffer {
    /// Makes a buffer of memory the application owns: `ptrs[i]` is rank i's memory, `bytes`
    /// long (single-process teams: every rank). Checks every rule with a clear error, then maps
    /// each rank's allocation on every device (P2P views) and on the multicast transport binds
    /// each pointer to a new multicast object with `cuMulticastBindAddr`.
    pub fn register(team: &Arc<Team>, ptrs: &[DevicePtr], bytes: usize) -> Result<Buffer> {
        let ctx = team.context();
        let driver = ctx.driver();
        let n = team.size();
        if let (Some(r), Some(comm)) = (team.local_rank(), team.comm()) {
            return Self::register_mp(team, comm, r, ptrs, bytes);
        }
        if ptrs.len() != n {
            return Err(Error::invalid_argument(format!("{} pointers for a team of {n} rank(s)", ptrs.len())));
        }
        if bytes == 0 {
            return Err(Error::invalid_argument("bytes is 0: a buffer needs at least one byte"));
        }
        let multicast = team.transport() == Transport::Multicast;
        let g = team.alloc_granularity();
        // Every address check first; then retain the allocations (released on any failure).
        for (i, &ptr) in ptrs.iter().enumerate() {
            let dev = team.devices()[i];
            if ptr == 0 {
                return Err(Error::invalid_argument(format!("ptrs[{i}] is NULL")));
            }
            let asking = || format!("asking which device ptrs[{i}] belongs to");
            ctx.check_pointer_device(ptr, i, dev, format_args!("ptrs[{i}] = {ptr:#x}"), "register", &asking)?;
            if ptr.checked_add(bytes as u64).is_none() {
                return Err(Error::invalid_argument(format!("ptrs[{i}] + {bytes} bytes overflows")));
            }
        }
        let mut ext: Vec<External> = Vec::with_capacity(n);
        let release = |ext: Vec<External>| {
            for e in ext {
                if let Err(u) = driver.mem_release(e.handle) {
                    tracing::error!("mcast_buffer_register: releasing a retained handle: {u}");
                }
            }
        };
        let mut sizes = Vec::with_capacity(n);
        for (i, &ptr) in ptrs.iter().enumerate() {
            let checked = (|| {
                let handle =
                    driver.mem_retain_allocation_handle(ptr).map_err(|e| {
                        if e.code != CuResult::ERROR_INVALID_VALUE {
                            return Error::driver(e, format_args!("retaining the allocation behind ptrs[{i}]"));
                        }
                        Error::not_supported(format!(
                        "ptrs[{i}] = {ptr:#x} is not memory from cuMemCreate ({e}), for example cudaMalloc memory: {} \
                         needs a cuMemCreate allocation; allocate with mcast_mem_alloc, or call the mcast_team_* \
                         collectives on plain device pointers",
                        if multicast { "cuMulticastBindAddr (the MULTICAST transport)" } else { "a peer mapping (P2P)" }
                    ))
                    })?;
                let range = driver.mem_address_range(ptr);
                Ok((handle, range))
            })();
            match checked {
                Ok((handle, Ok((base, size)))) => {
                    ext.push(External { handle, ptr, offset: (ptr - base) as usize });
                    sizes.push(size);
                }
                Ok((handle, Err(e))) => {
                    ext.push(External { handle, ptr, offset: 0 });
                    release(ext);
                    return Err(Error::driver(e, format_args!("finding the allocation behind ptrs[{i}]")));
                }
                Err(e) => {
                    release(ext);
                    return Err(e);
                }
            }
        }
        // Each rank's whole allocation is mapped (cuMemMap maps from offset 0): the views hold
        // the furthest end of any rank's range, rounded to the granularity, which must fit in
        // every allocation.
        let furthest = ext.iter().map(|e| e.offset + bytes).max().unwrap_or(bytes);
        let size = furthest.next_multiple_of(g);
        let mc_size = bytes.next_multiple_of(g);
        let rule = ext.iter().zip(&sizes).enumerate().find_map(|(i, (e, &have))| {
            if multicast && (e.ptr % g as u64 != 0) {
                Some(format!(
                    "ptrs[{i}] = {:#x} is not aligned to the multicast granularity ({g} bytes): cuMulticastBindAddr \
                     needs an aligned address (mcast_mem_alloc returns one)",
                    e.ptr
                ))
            } else if multicast && e.offset + mc_size > have {
                Some(format!(
                    "ptrs[{i}] + {bytes} bytes rounded up to the multicast granularity ({mc_size} bytes) runs past the \
                     end of its allocation ({have} bytes from {:#x}): cuMulticastBindAddr binds whole granules",
                    e.ptr - e.offset as u64
                ))
            } else if size > have {
                Some(format!(
                    "the allocation behind ptrs[{i}] ({have} bytes) is smaller than the {size} bytes every rank's \
                     mapping needs (the furthest registered end, rounded to the granularity {g}): register ranges at \
                     the same offset of equally large allocations"
                ))
            } else {
                None
            }
        });
        if let Some(rule) = rule {
            release(ext);
            return Err(Error::not_supported(rule));
        }
        let ranges: Vec<_> = ptrs.iter().enumerate().map(|(i, &p)| (team.devices()[i], p, bytes)).collect();
        let serial = match ctx.memory.register(&ranges) {
            Ok(s) => s,
            Err(e) => {
                release(ext);
                return Err(e);
            }
        };
        match team.register(ext, bytes, size, mc_size) {
            Ok(alloc) => Ok(Buffer { team: team.clone(), alloc, registration: Some(serial) }),
            Err(e) => {
                ctx.memory.unregister(serial);
                Err(e.context(format!("registering {bytes} bytes on devices {:?}", team.devices())))
            }
        }
    }

    /// [`Buffer::register`] in a team of one rank per process (`ptrs` holds this process's
    /// rank's pointer): collective, with the agreement of `mcast_buffer_alloc`. Each rank
    /// checks its own pointer and retains its allocation (voted, with every rank's offset into
    /// its allocation, its size and its pointer), then checks the rules that need every rank's
    /// range and its overlap with live registrations (voted), then the segment shares the
    /// handles and maps or binds ([`Team::register_mp`]). A failure anywhere is the same error
    /// on every rank, naming the rank; nothing is left on any rank.
    fn register_mp(team: &Arc<Team>, comm: &Arc<Comm>, r: usize, ptrs: &[DevicePtr], bytes: usize) -> Result<Buffer> {
        let ctx = team.context();
        let driver = ctx.driver();
        let dev = team.devices()[r];
        let multicast = team.transport() == Transport::Multicast;
        let g = team.alloc_granularity();
        let ht = team.handle_type();
        let ptr = ptrs.first().copied().unwrap_or(0);
        let mut retained = None;
        let checked = (|| -> Result<(u64, u64)> {
            team.check_not_aborted("registering memory")?;
            if ptrs.len() != 1 {
                return Err(Error::invalid_argument(format!(
                    "rank {r}: {} pointers, but this process holds one rank of the team",
                    ptrs.len()
                )));
            }
            if bytes == 0 {
                return Err(Error::invalid_argument(format!("rank {r}: bytes is 0: a buffer needs at least one byte")));
            }
            if ptr == 0 {
                return Err(Error::invalid_argument(format!("rank {r}: its pointer (ptrs[0]) is NULL")));
            }
            let asking = || format!("rank {r}: asking which device {ptr:#x} belongs to");
            ctx.check_pointer_device(ptr, r, dev, format_args!("rank {r}: its pointer {ptr:#x}"), "register", &asking)?;
            if ptr.checked_add(bytes as u64).is_none() {
                return Err(Error::invalid_argument(format!(
                    "rank {r}: its pointer {ptr:#x} + {bytes} bytes overflows"
                )));
            }
            let handle = driver.mem_retain_allocation_handle(ptr).map_err(|e| {
                if e.code != CuResult::ERROR_INVALID_VALUE {
                    return Error::driver(e, format_args!("rank {r}: retaining the allocation behind {ptr:#x}"));
                }
                Error::not_supported(format!(
                    "rank {r}: its pointer {ptr:#x} is not memory from cuMemCreate ({e}), for example cudaMalloc \
                     memory: sharing it with the other processes needs a cuMemCreate allocation with a shareable \
                     handle type; allocate with mcast_mem_alloc, or call the mcast_team_* collectives on plain \
                     device pointers"
                ))
            })?;
            retained = Some(handle);
            let props = driver.mem_allocation_props(handle).map_err(|e| {
                Error::driver(e, format_args!("rank {r}: reading the properties of {ptr:#x}'s allocation"))
            })?;
            if !props.handle_types.contains(ht) {
                return Err(Error::not_supported(format!(
                    "rank {r}: the allocation behind {ptr:#x} was created without {} handles, which this team uses \
                     to pass memory between its processes: allocate with mcast_mem_alloc, or cuMemCreate with that \
                     handle type in requestedHandleTypes",
                    handle_type_label(ht)
                )));
            }
            let (base, have) = driver
                .mem_address_range(ptr)
                .map_err(|e| Error::driver(e, format_args!("rank {r}: finding the allocation behind {ptr:#x}")))?;
            Ok((ptr - base, have as u64))
        })();
        let release = |h: Option<MemHandle>| {
            if let Some(h) = h {
                if let Err(u) = driver.mem_release(h) {
                    tracing::error!("mcast_buffer_register: releasing a retained handle: {u}");
                }
            }
        };
        let mut payload = Vec::with_capacity(24);
        if let Ok((offset, have)) = &checked {
            for v in [*offset, *have, ptr] {
                payload.extend_from_slice(&v.to_le_bytes());
            }
        }
        let parts = match comm.exchange("registration: check pointers", checked.map(|_| ()), &payload, &[]) {
            Ok(p) => p,
            Err(e) => {
                release(retained);
                return Err(e);
            }
        };
        let handle = retained.expect("every rank retained its allocation");
        let mut skews = Vec::with_capacity(parts.len());
        let mut haves = Vec::with_capacity(parts.len());
        let mut all_ptrs = Vec::with_capacity(parts.len());
        for (q, p) in parts.iter().enumerate() {
            let word =
                |i: usize| p.bytes.get(8 * i..8 * i + 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
            match (word(0), word(1), word(2)) {
                (Some(o), Some(h), Some(x)) => {
                    skews.push(o);
                    haves.push(h);
                    all_ptrs.push(x);
                }
                _ => {
                    release(Some(handle));
                    return Err(Error::internal(format!("rank {q}'s registration record is malformed")));
                }
            }
        }
        // The rules that need every rank's range: each rank checks its own, and the vote
        // carries the failure (with this rank's overlap check) to every rank.
        let furthest = skews.iter().map(|&o| o as usize + bytes).max().unwrap_or(bytes);
        let size = furthest.next_multiple_of(g);
        let mc_size = bytes.next_multiple_of(g);
        let (offset, have) = (skews[r] as usize, haves[r] as usize);
        let rule = if multicast && ptr % g as u64 != 0 {
            Some(format!(
                "rank {r}: its pointer {ptr:#x} is not aligned to the multicast granularity ({g} bytes): \
                 cuMulticastBindAddr needs an aligned address (mcast_mem_alloc returns one)"
            ))
        } else if multicast && offset + mc_size > have {
            Some(format!(
                "rank {r}: its pointer {ptr:#x} + {bytes} bytes rounded up to the multicast granularity ({mc_size} \
                 bytes) runs past the end of its allocation ({have} bytes from {:#x}): cuMulticastBindAddr binds whole \
                 granules",
                ptr - offset as u64
            ))
        } else if size > have {
            Some(format!(
                "rank {r}: the allocation behind its pointer {ptr:#x} ({have} bytes) is smaller than the {size} bytes \
                 every rank's mapping needs (the furthest registered end, rounded to the granularity {g}): register \
                 ranges at the same offset of equally large allocations"
            ))
        } else {
            None
        };
        let registered = match rule {
            Some(rule) => Err(Error::not_supported(rule)),
            None => ctx
                .memory
                .register(&[(dev, ptr, bytes)])
                .map_err(|e| Error::new(e.kind, format!("rank {r}: {}", e.message))),
        };
        let serial = registered.as_ref().ok().copied();
        if let Err(e) = comm.vote("registration: rules", registered.map(|_| ())) {
            if let Some(s) = serial {
                ctx.memory.unregister(s);
            }
            release(Some(handle));
            return Err(e);
        }
        let serial = serial.expect("every rank registered its range");
        let own = External { handle, ptr, offset };
        match team.register_mp(own, skews, all_ptrs, bytes, size, mc_size) {
            Ok(alloc) => Ok(Buffer { team: team.clone(), alloc, registration: Some(serial) }),
            Err(e) => {
                ctx.memory.unregister(serial);
                Err(e.context(format!("registering {bytes} bytes on rank {r} (device {dev})")))
            }
        }
    }

    /// Allocates `bytes` on every rank of `team`.
    pub fn alloc(team: &Arc<Team>, bytes: usize) -> Result<Buffer> {
        let alloc = team.alloc(bytes)?;
        Ok(Buffer { team: team.clone(), alloc, registration: None })
    }

    /// Waits for the team's work in flight (as `cudaFree` does), then returns the memory to the
    /// team. A failed wait is reported after the memory is returned.
    pub fn free(&self) -> Result<()> {
        // An aborted team keeps the memory until it is destroyed (its waits may not end).
        self.team.check_not_aborted("freeing a buffer")?;
        let waited = self.team.quiesce();
        let freed = self.team.free(&self.alloc);
        if let Some(serial) = self.registration {
            self.team.context().memory.unregister(serial);
        }
        freed?;
        waited
    }

    /// A transient view of registered memory found by [`Team::find_registered`], for running a
    /// collective on it zero-copy. Never freed: the registered buffer owns the memory.
    pub(crate) fn view(team: &Arc<Team>, alloc: Allocation) -> Buffer {
        Buffer { team: team.clone(), alloc, registration: None }
    }

    /// True for memory the application registered.
    pub fn is_registered(&self) -> bool {
        self.registration.is_some()
    }

    /// The team.
    pub fn team(&self) -> &Arc<Team> {
        &self.team
    }

    /// Bytes the user asked for.
    pub fn size(&self) -> usize {
        self.alloc.bytes
    }

    /// Offset of this buffer in its segment.
    pub fn segment_offset(&self) -> usize {
        self.alloc.offset
    }

    /// The device view of this buffer for rank `rank` (a rank this process holds).
    pub fn device_view(&self, rank: i32) -> Result<BufferView> {
        let team = &self.team;
        let r = team.check_own_rank(rank, "rank")?;
        let n = team.size();
        let peers = (0..n as i32).map(|p| self.peer_ptr(rank, p)).collect::<Result<Vec<_>>>()?;
        let (peer0, peer_stride) = even_stride(&peers, "the buffer")?;
        let mc = if team.transport() == Transport::Multicast { self.multicast_ptr(rank)? } else { 0 };
        Ok(BufferView {
            rank,
            nranks: n as i32,
            bytes: self.size() as u64,
            local: self.local_ptr(rank)?,
            peer0,
            peer_stride,
            mc,
            sync: team.sync_base(r, r),
        })
    }

    /// Rank `rank`'s copy, on its device.
    pub fn local_ptr(&self, rank: i32) -> Result<DevicePtr> {
        let r = self.team.check_own_rank(rank, "rank")?;
        Ok(self.alloc.seg.peer_base(r, r) + self.alloc.offset as u64)
    }

    /// Rank `peer`'s copy as mapped on rank `rank`'s device.
    pub fn peer_ptr(&self, rank: i32, peer: i32) -> Result<DevicePtr> {
        let r = self.team.check_own_rank(rank, "rank")?;
        let p = self.team.check_rank(peer, "peer")?;
        Ok(self.alloc.seg.peer_base(r, p) + self.alloc.offset as u64)
    }

    /// The multicast address on rank `rank`'s device.
    pub fn multicast_ptr(&self, rank: i32) -> Result<DevicePtr> {
        let r = self.team.check_own_rank(rank, "rank")?;
        match self.alloc.seg.multicast_base(r) {
            Some(base) if self.team.transport() == Transport::Multicast => Ok(base + self.alloc.offset as u64),
            _ => Err(Error::not_supported(
                "the team uses the P2P transport: its buffers have no multicast address (see mcast_team_get_info)",
            )),
        }
    }

    fn check_range(&self, offset: usize, bytes: usize) -> Result<()> {
        match offset.checked_add(bytes) {
            Some(end) if end <= self.alloc.bytes => Ok(()),
            _ => Err(Error::invalid_argument(format!(
                "range [{offset}, {offset} + {bytes}) is past the end of the {}-byte buffer",
                self.alloc.bytes
            ))),
        }
    }

    /// Copies `src` into rank `rank`'s copy at `offset`, synchronously.
    pub fn write(&self, rank: i32, offset: usize, src: &[u8]) -> Result<()> {
        self.check_range(offset, src.len())?;
        let dst = self.local_ptr(rank)? + offset as u64;
        let dev = self.team.devices()[self.team.check_own_rank(rank, "rank")?];
        if src.is_empty() {
            return Ok(());
        }
        self.team
            .context()
            .driver()
            .memcpy_htod(dev, dst, src)
            .map_err(|e| Error::driver(e, format_args!("writing {} bytes to rank {rank}", src.len())))
    }

    /// Copies rank `rank`'s copy at `offset` into `dst`, synchronously.
    pub fn read(&self, rank: i32, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_range(offset, dst.len())?;
        let src = self.local_ptr(rank)? + offset as u64;
        let dev = self.team.devices()[self.team.check_own_rank(rank, "rank")?];
        if dst.is_empty() {
            return Ok(());
        }
        let n = dst.len();
        self.team
            .context()
            .driver()
            .memcpy_dtoh(dev, dst, src)
            .map_err(|e| Error::driver(e, format_args!("reading {n} bytes from rank {rank}")))
    }
}

/// How a handle type is named in registration errors.
fn handle_type_label(ht: HandleTypes) -> &'static str {
    if ht == HandleTypes::FABRIC {
        "fabric"
    } else {
        "POSIX file descriptor"
    }
}
