//! Symmetric buffers: the same size and layout on every rank of a team.

use std::sync::Arc;

use super::error::{Error, Result};
use super::team::{Allocation, Team, Transport};
use crate::driver::DevicePtr;

/// A buffer.
pub struct Buffer {
    team: Arc<Team>,
    alloc: Allocation,
}

impl Buffer {
    /// Allocates `bytes` on every rank of `team`.
    pub fn alloc(team: &Arc<Team>, bytes: usize) -> Result<Buffer> {
        let alloc = team.alloc(bytes)?;
        Ok(Buffer { team: team.clone(), alloc })
    }

    /// Waits for the team's work in flight (as `cudaFree` does), then returns the memory to the
    /// team. A failed wait is reported after the memory is returned.
    pub fn free(&self) -> Result<()> {
        // An aborted team keeps the memory until it is destroyed (its waits may not end).
        self.team.check_not_aborted("freeing a buffer")?;
        let waited = self.team.quiesce();
        self.team.free(&self.alloc)?;
        waited
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
        let dev = self.team.devices()[rank as usize];
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
        let dev = self.team.devices()[rank as usize];
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
