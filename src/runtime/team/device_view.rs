//! What the device API's kernels see of a team (`mcast_team_device_handle`).

use super::{Team, Transport};
use crate::runtime::device_api::{even_stride, TeamView};
use crate::runtime::error::Result;

impl Team {
    /// The device view of this team for rank `rank` (a rank this process holds).
    pub fn device_view(&self, rank: i32) -> Result<TeamView> {
        let r = self.check_own_rank(rank, "rank")?;
        let n = self.size();
        let (sync_peer0, sync_stride) = even_stride(self.sync_bases(r), "the team's sync regions")?;
        let multicast = self.transport() == Transport::Multicast;
        Ok(TeamView {
            rank,
            nranks: n as i32,
            nslots: self.device_slots(),
            multicast,
            timeout_ns: u64::from(self.context().config().timeout_ms) * 1_000_000,
            sync_peer0,
            sync_stride,
            sync_mc: if multicast { self.sync_multicast(r).unwrap_or(0) } else { 0 },
            dev_offset: self.device_offset() as u64,
        })
    }
}
