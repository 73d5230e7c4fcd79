//! The broadcast's models on the simulator (kernels/broadcast/): the pull, the scatter then
//! all-gather and the multicast kernels; LL's in `ll.rs`.

use super::mem::{copy, copy_at};
use super::{writer_row, Job};
use crate::kernels::Collective;

impl Job {
    /// The broadcast by pulls (kernels/broadcast/pull.cu): every rank copies the root's data
    /// into its out.
    pub(super) fn broadcast_pull(&self, sync: &mut dyn FnMut() -> bool) {
        let (data, out) = (&self.data.0, &self.out.0);
        if !sync() {
            return;
        }
        if let Collective::Broadcast { root } = self.collective {
            copy(data[root as usize], out[self.rank], 0, self.count);
        }
        sync();
    }

    /// The scatter then all-gather (kernels/broadcast/scatter.cu, broadcast_p2p_scatter): the
    /// message cut into one slice per rank other than the root; each such rank copies its slice
    /// from the root's data into every such rank's out, between the entry and exit barriers.
    pub(super) fn broadcast_scatter(&self, sync: &mut dyn FnMut() -> bool) {
        let (n, r, count) = (self.nranks, self.rank, self.count);
        let (data, out) = (&self.data.0, &self.out.0);
        let Collective::Broadcast { root } = self.collective else { unreachable!("a broadcast kernel") };
        let root = root as usize;
        if !sync() {
            return;
        }
        if r == root {
            copy(data[root], out[r], 0, count);
        } else {
            let s = writer_row(root, r);
            let (lo, hi) = (count * s / (n - 1), count * (s + 1) / (n - 1));
            for q in (0..n).filter(|&q| q != root) {
                copy_at(data[root], lo, out[q], lo, hi - lo);
            }
        }
        sync();
    }

    /// The multicast broadcast (kernels/broadcast/multicast.cu): the root stores its data through
    /// the multicast out address into every rank's out.
    pub(super) fn broadcast_multicast(&self, sync: &mut dyn FnMut() -> bool) {
        let root = match self.collective {
            Collective::Broadcast { root } => root as usize,
            _ => self.rank,
        };
        self.multicast_store(sync, 0, root);
    }
}
