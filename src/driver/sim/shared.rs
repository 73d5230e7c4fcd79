//! The cross-process part of a simulated multicast object: a small control block in a memfd,
//! shared by every process that created or imported the object (the descriptor travels like
//! any exported handle). It holds what every process must see: the properties, the devices
//! added (by GPU key, see `identity.rs`: ordinals differ between processes) and the bindings,
//! each naming the bound memory by its memfd's identity so that any process that imported that
//! memory can reach it. Updates are atomic
//! operations on the shared words; no lock spans processes.

use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::host::Memfd;
use crate::driver::{HandleTypes, MulticastProp};

const MAGIC: u32 = 0x4d43_5348;
/// Most bindings the shared table holds.
const SLOTS: usize = 64;
/// Most devices an object's table of members holds (a team has at most 72 ranks).
const MEMBERS: usize = 80;

#[repr(C)]
struct Slot {
    /// 0 free, 1 being written, 2 valid.
    state: AtomicU32,
    /// The GPU key of the device the binding is for.
    gpu: AtomicU64,
    mc_offset: AtomicU64,
    size: AtomicU64,
    mem_offset: AtomicU64,
    ident_dev: AtomicU64,
    ident_ino: AtomicU64,
}

#[repr(C)]
struct Block {
    magic: AtomicU32,
    num_devices: AtomicU32,
    size: AtomicU64,
    handle_types: AtomicU32,
    added: AtomicU32,
    /// GPU keys of the devices added, in the order they were; 0 = free.
    members: [AtomicU64; MEMBERS],
    slots: [Slot; SLOTS],
}

/// A binding as the shared table records it.
#[derive(Clone, Copy, Debug)]
pub(super) struct SharedBinding {
    /// GPU key of the device it is for.
    pub gpu: u64,
    pub mc_offset: usize,
    pub size: usize,
    pub mem_offset: usize,
    pub identity: (u64, u64),
}

/// One process's mapping of a multicast object's control block.
pub(super) struct SharedMc {
    memfd: Memfd,
}

impl SharedMc {
    fn block(&self) -> &Block {
        // SAFETY: the memfd is at least size_of::<Block>() bytes, page aligned, mapped for the
        // life of self; every field is an atomic.
        unsafe { &*(self.memfd.shadow() as *const Block) }
    }

    /// A fresh control block for an object with `prop`.
    pub(super) fn create(prop: &MulticastProp) -> io::Result<SharedMc> {
        let memfd = Memfd::create(std::mem::size_of::<Block>(), "mc")?;
        let s = SharedMc { memfd };
        let b = s.block();
        b.num_devices.store(prop.num_devices, Ordering::Relaxed);
        b.size.store(prop.size as u64, Ordering::Relaxed);
        b.handle_types.store(prop.handle_types.0, Ordering::Relaxed);
        b.magic.store(MAGIC, Ordering::Release);
        Ok(s)
    }

    /// Maps a control block received as `fd`; `None` when it is not one.
    pub(super) fn import(fd: RawFd) -> Option<(SharedMc, MulticastProp)> {
        let (tag, size) = super::host::memfd_tag(fd)?;
        if tag != "mc" || size < std::mem::size_of::<Block>() {
            return None;
        }
        // SAFETY: the caller's descriptor is open for the duration of the call.
        let own: OwnedFd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }.try_clone_to_owned().ok()?;
        let s = SharedMc { memfd: Memfd::adopt(own, size).ok()? };
        let b = s.block();
        if b.magic.load(Ordering::Acquire) != MAGIC {
            return None;
        }
        let prop = MulticastProp {
            num_devices: b.num_devices.load(Ordering::Relaxed),
            size: b.size.load(Ordering::Relaxed) as usize,
            handle_types: HandleTypes(b.handle_types.load(Ordering::Relaxed)),
            flags: 0,
        };
        Some((s, prop))
    }

    /// The control block's descriptor (exports duplicate it or name it).
    pub(super) fn raw_fd(&self) -> RawFd {
        self.memfd.raw_fd()
    }

    /// `(st_dev, st_ino)` of the control block's memfd.
    pub(super) fn identity(&self) -> (u64, u64) {
        self.memfd.identity()
    }

    /// Devices added, by every process.
    pub(super) fn added(&self) -> u32 {
        self.block().added.load(Ordering::Acquire)
    }

    /// True when the GPU `gpu` was added (by any process).
    pub(super) fn has(&self, gpu: u64) -> bool {
        gpu != 0 && self.block().members.iter().any(|m| m.load(Ordering::Acquire) == gpu)
    }

    /// Adds the GPU `gpu`; false when it was added already or the team is full. (Two processes
    /// adding the same GPU at the same instant could both succeed; the runtime never does that.)
    pub(super) fn add(&self, gpu: u64) -> bool {
        if gpu == 0 || self.has(gpu) {
            return false;
        }
        let b = self.block();
        let wanted = b.num_devices.load(Ordering::Relaxed);
        if b.added.fetch_add(1, Ordering::AcqRel) >= wanted {
            b.added.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        for m in &b.members {
            if m.compare_exchange(0, gpu, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                return true;
            }
        }
        b.added.fetch_sub(1, Ordering::AcqRel);
        false
    }

    /// Records a binding; false when the table is full.
    pub(super) fn bind(&self, x: SharedBinding) -> bool {
        for s in &self.block().slots {
            if s.state.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                s.gpu.store(x.gpu, Ordering::Relaxed);
                s.mc_offset.store(x.mc_offset as u64, Ordering::Relaxed);
                s.size.store(x.size as u64, Ordering::Relaxed);
                s.mem_offset.store(x.mem_offset as u64, Ordering::Relaxed);
                s.ident_dev.store(x.identity.0, Ordering::Relaxed);
                s.ident_ino.store(x.identity.1, Ordering::Relaxed);
                s.state.store(2, Ordering::Release);
                return true;
            }
        }
        false
    }

    /// Removes the binding of the GPU `gpu` at exactly `[mc_offset, +size)`.
    pub(super) fn unbind(&self, gpu: u64, mc_offset: usize, size: usize) {
        for s in &self.block().slots {
            if s.state.load(Ordering::Acquire) == 2
                && s.gpu.load(Ordering::Relaxed) == gpu
                && s.mc_offset.load(Ordering::Relaxed) == mc_offset as u64
                && s.size.load(Ordering::Relaxed) == size as u64
                && s.state.compare_exchange(2, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok()
            {
                return;
            }
        }
    }

    /// Every binding, made by any process.
    pub(super) fn bindings(&self) -> Vec<SharedBinding> {
        self.block()
            .slots
            .iter()
            .filter(|s| s.state.load(Ordering::Acquire) == 2)
            .map(|s| SharedBinding {
                gpu: s.gpu.load(Ordering::Relaxed),
                mc_offset: s.mc_offset.load(Ordering::Relaxed) as usize,
                size: s.size.load(Ordering::Relaxed) as usize,
                mem_offset: s.mem_offset.load(Ordering::Relaxed) as usize,
                identity: (s.ident_dev.load(Ordering::Relaxed), s.ident_ino.load(Ordering::Relaxed)),
            })
            .collect()
    }
}
