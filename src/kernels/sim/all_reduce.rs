//! The all-reduce's models on the simulator (kernels/all_reduce/): the one-shot pull, the
//! two-shot and the multicast kernels; the push kernels' in `push.rs`, LL's in `ll.rs`.

use super::mem::{slice, write};
use super::Job;

impl Job {
    /// The one-shot all-reduce (kernels/all_reduce/one_shot.cu): every rank reduces every rank's
    /// data, then stores its own copy after a barrier.
    pub(super) fn all_reduce_one_shot(&self, sync: &mut dyn FnMut() -> bool) {
        let r = self.rank;
        let count = self.count;
        let data = &self.data.0;
        let out = &self.out.0;
        if !sync() {
            return;
        }
        let res = self.reduce(data, 0, count);
        if !sync() {
            return;
        }
        write(out[r], 0, &res);
        sync();
    }

    /// The two-shot all-reduce (kernels/all_reduce/two_shot.cu): between the entry and exit
    /// barriers each rank reduces its slice of every rank's data and stores it into every
    /// rank's out (no rank touches another's slice, so in place needs no barrier between).
    pub(super) fn all_reduce_two_shot(&self, sync: &mut dyn FnMut() -> bool) {
        let n = self.nranks;
        let r = self.rank;
        let esize = self.red.map_or(1, |(d, _)| d.size());
        let (lo, hi) = slice(self.count, n, r);
        if !sync() {
            return;
        }
        let res = self.reduce(&self.data.0, lo, hi - lo);
        for &t in &self.out.0 {
            write(t, lo * esize, &res);
        }
        sync();
    }

    /// The multicast all-reduce (kernels/all_reduce/multicast.cu): each rank reduces its slice
    /// through the multicast data address and stores it to every rank's out.
    pub(super) fn all_reduce_multicast(&self, sync: &mut dyn FnMut() -> bool) {
        let n = self.nranks;
        let r = self.rank;
        let count = self.count;
        let esize = self.red.map_or(1, |(d, _)| d.size());
        let mc = &self.mc_data.as_ref().expect("multicast targets").0;
        let mc_out = &self.mc_out.as_ref().expect("multicast targets").0;
        let (lo, hi) = slice(count, n, r);
        if !sync() {
            return;
        }
        let res = self.reduce(mc, lo, hi - lo);
        for &t in mc_out {
            write(t, lo * esize, &res);
        }
        sync();
    }
}
