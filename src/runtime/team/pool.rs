//! The team's sub-allocator: buffers are ranges of segments; small buffers share a segment,
//! freed ranges are coalesced and reused, an empty segment (not the first) goes to a bounded
//! cache or back to the driver. Bookkeeping only: the driver work is the caller's.

use std::sync::Arc;

use crate::driver::DevicePtr;
use crate::runtime::error::{Error, Result};
use crate::runtime::segment::Segment;

/// Most empty segments a team keeps for reuse.
const MAX_CACHED_SEGMENTS: usize = 2;
/// Most bytes per rank a team keeps in empty segments.
const MAX_CACHED_BYTES: usize = 1 << 30;

struct SegmentSlot {
    seg: Arc<Segment>,
    /// Free ranges `(offset, len)`, sorted by offset, coalesced.
    free: Vec<(usize, usize)>,
    buffers: usize,
    /// Registered memory: the bytes registered.
    bytes: usize,
}

/// A range of a segment handed to a buffer.
#[derive(Clone)]
pub struct Allocation {
    /// The segment.
    pub seg: Arc<Segment>,
    /// Offset of the buffer in every rank's memory.
    pub offset: usize,
    /// Bytes the user asked for.
    pub bytes: usize,
    /// Bytes set aside (aligned).
    reserved: usize,
}

/// The segments of a team, its cache of empty ones and its live buffers.
#[derive(Default)]
pub(super) struct Pool {
    segments: Vec<SegmentSlot>,
    cache: Vec<Arc<Segment>>,
    /// Buffers alive.
    pub(super) buffers: usize,
    /// Set once the team released everything.
    pub(super) destroyed: bool,
}

impl Pool {
    /// Adds `seg` (of `size` bytes per rank) with `[from, size)` free.
    pub(super) fn add(&mut self, seg: Arc<Segment>, from: usize) {
        let size = seg.size;
        let free = if size > from { vec![(from, size - from)] } else { vec![] };
        self.segments.push(SegmentSlot { seg, free, buffers: 0, bytes: 0 });
    }

    /// Adds registered memory `seg` as one buffer of `bytes`.
    pub(super) fn add_registered(&mut self, seg: Arc<Segment>, bytes: usize) -> Allocation {
        self.segments.push(SegmentSlot { seg: seg.clone(), free: Vec::new(), buffers: 1, bytes });
        self.buffers += 1;
        Allocation { seg, offset: 0, bytes, reserved: 0 }
    }

    /// Sets aside `reserved` bytes for a buffer of `bytes` in the first segment with room.
    pub(super) fn carve(&mut self, bytes: usize, reserved: usize) -> Option<Allocation> {
        for slot in self.segments.iter_mut() {
            if let Some(i) = slot.free.iter().position(|&(_, len)| len >= reserved) {
                let (off, len) = slot.free[i];
                if len == reserved {
                    slot.free.remove(i);
                } else {
                    slot.free[i] = (off + reserved, len - reserved);
                }
                slot.buffers += 1;
                self.buffers += 1;
                return Some(Allocation { seg: slot.seg.clone(), offset: off, bytes, reserved });
            }
        }
        None
    }

    /// Moves a cached segment of at least `reserved` bytes back into use; false when none fits.
    pub(super) fn reuse_cached(&mut self, reserved: usize) -> bool {
        match self.cache.iter().position(|s| s.size >= reserved) {
            Some(i) => {
                let seg = self.cache.swap_remove(i);
                self.add(seg, 0);
                true
            }
            None => false,
        }
    }

    /// Empties the cache and returns it.
    pub(super) fn take_cache(&mut self) -> Vec<Arc<Segment>> {
        std::mem::take(&mut self.cache)
    }

    /// Puts back what [`Pool::take_cache`] took.
    pub(super) fn restore_cache(&mut self, cache: Vec<Arc<Segment>>) {
        self.cache = cache;
    }

    /// Returns buffer `a`'s range. Returns a segment to release, with what its release is: the
    /// registered buffer's own segment, or an empty segment (not the first) the cache has no
    /// room for.
    pub(super) fn give_back(&mut self, a: &Allocation) -> Result<Option<(Arc<Segment>, &'static str)>> {
        let index = self
            .segments
            .iter()
            .position(|s| Arc::ptr_eq(&s.seg, &a.seg))
            .ok_or_else(|| Error::internal("a buffer's segment is not in its team"))?;
        if self.segments[index].seg.is_registered() {
            let seg = self.segments.remove(index).seg;
            self.buffers -= 1;
            return Ok(Some((seg, "unbinding and unmapping registered memory")));
        }
        let slot = &mut self.segments[index];
        let at = slot.free.partition_point(|&(off, _)| off < a.offset);
        slot.free.insert(at, (a.offset, a.reserved));
        // Coalesce with the neighbours.
        if at + 1 < slot.free.len() && slot.free[at].0 + slot.free[at].1 == slot.free[at + 1].0 {
            slot.free[at].1 += slot.free[at + 1].1;
            slot.free.remove(at + 1);
        }
        if at > 0 && slot.free[at - 1].0 + slot.free[at - 1].1 == slot.free[at].0 {
            slot.free[at - 1].1 += slot.free[at].1;
            slot.free.remove(at);
        }
        slot.buffers -= 1;
        self.buffers -= 1;
        if index > 0 && self.segments[index].buffers == 0 {
            let seg = self.segments.remove(index).seg;
            let cached: usize = self.cache.iter().map(|s| s.size).sum();
            if self.cache.len() < MAX_CACHED_SEGMENTS && cached + seg.size <= MAX_CACHED_BYTES {
                self.cache.push(seg);
            } else {
                return Ok(Some((seg, "releasing an empty segment")));
            }
        }
        Ok(None)
    }

    /// The registered buffer holding `[ptr, ptr + len)` of rank `rank`'s own memory, as an
    /// allocation, with the offset of `ptr` in it.
    pub(super) fn find_registered(&self, rank: usize, ptr: DevicePtr, len: usize) -> Option<(Allocation, usize)> {
        self.segments.iter().find_map(|slot| {
            let base = slot.seg.user_ptr(rank)?;
            let bytes = slot.bytes;
            (ptr >= base && ptr.checked_add(len as u64)? <= base + bytes as u64)
                .then(|| (Allocation { seg: slot.seg.clone(), offset: 0, bytes, reserved: 0 }, (ptr - base) as usize))
        })
    }

    /// Live multicast objects and device bytes held per rank (registered memory not counted).
    pub(super) fn holdings(&self) -> (u64, u64) {
        let segs = self.segments.iter().map(|s| &s.seg).chain(self.cache.iter());
        let (mut mc, mut bytes) = (0u64, 0u64);
        for s in segs {
            mc += u64::from(s.has_multicast());
            if !s.is_registered() {
                bytes += s.size as u64;
            }
        }
        (mc, bytes)
    }

    /// Marks the pool destroyed and returns every segment, in use or cached.
    pub(super) fn drain(&mut self) -> Vec<Arc<Segment>> {
        self.destroyed = true;
        self.buffers = 0;
        self.segments.drain(..).map(|slot| slot.seg).chain(self.cache.drain(..)).collect()
    }
}
