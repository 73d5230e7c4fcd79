//! The reduce-scatter's models on the simulator (kernels/reduce_scatter/): the pull and the
//! multicast kernels; LL's in `ll.rs`.

use super::mem::write;
use super::Job;

impl Job {
    /// The reduce-scatter by pulls (kernels/reduce_scatter/p2p.cu): each rank reduces its own block
    /// from every rank's data.
    pub(super) fn reduce_scatter_p2p(&self, sync: &mut dyn FnMut() -> bool) {
        let r = self.rank;
        let count = self.count;
        let esize = self.red.map_or(1, |(d, _)| d.size());
        let data = &self.data.0;
        let out = &self.out.0;
        if !sync() {
            return;
        }
        let res = self.reduce(data, r * count, count);
        write(out[r], r * count * esize, &res);
        sync();
    }

    /// The multicast reduce-scatter (kernels/reduce_scatter/multicast.cu): each rank reduces its
    /// own block through the multicast data address.
    pub(super) fn reduce_scatter_multicast(&self, sync: &mut dyn FnMut() -> bool) {
        let r = self.rank;
        let count = self.count;
        let esize = self.red.map_or(1, |(d, _)| d.size());
        let out = &self.out.0;
        let mc = &self.mc_data.as_ref().expect("multicast targets").0;
        if !sync() {
            return;
        }
        let res = self.reduce(mc, r * count, count);
        write(out[r], r * count * esize, &res);
        sync();
    }
}
