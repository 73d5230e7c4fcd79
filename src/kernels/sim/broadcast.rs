//! The broadcast's models on the simulator (kernels/broadcast/): the pull, the scatter then
//! all-gather and the multicast kernels; LL's in `ll.rs`.

use super::mem::copy;
use super::{writer_row, Job};
use crate::kernels::abi::broadcast_chunk_bytes;
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

    /// The scatter then all-gather (kernels/broadcast/scatter.cu, broadcast_p2p_scatter): chunks
    /// cut into one slice per rank other than the root; round k pulls this rank's slice of chunk
    /// k from the root and the other owners' slices of chunk k - 1 from their outs; a barrier per
    /// round.
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
        }
        let chunk = broadcast_chunk_bytes(count as u64) as usize;
        let chunks = count.div_ceil(chunk);
        let part = |k: usize, s: usize| {
            let c0 = k * chunk;
            let len = (count - c0).min(chunk);
            (c0 + len * s / (n - 1), c0 + len * (s + 1) / (n - 1))
        };
        for k in 0..=chunks {
            if r != root {
                if k < chunks {
                    let (lo, hi) = part(k, writer_row(root, r));
                    copy(data[root], out[r], lo, hi - lo);
                }
                if k > 0 {
                    for q in (0..n).filter(|&q| q != r && q != root) {
                        let (lo, hi) = part(k - 1, writer_row(root, q));
                        copy(out[q], out[r], lo, hi - lo);
                    }
                }
            }
            if !sync() {
                return;
            }
        }
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
