//! The all-gather's models on the simulator (kernels/all_gather/): the pull, push and multicast
//! kernels; LL's in `ll.rs`; the barrier and copy-out kernels of its module in `mod.rs`.

use super::mem::copy_at;
use super::Job;

impl Job {
    /// The all-gather by pulls (kernels/all_gather/pull.cu): every rank copies every rank's block
    /// into its out (its own only out of place), `out_stride` apart.
    pub(super) fn all_gather_pull(&self, sync: &mut dyn FnMut() -> bool) {
        let (n, r, count) = (self.nranks, self.rank, self.count);
        let (data, out) = (&self.data.0, &self.out.0);
        if !sync() {
            return;
        }
        let stride = if self.out_stride != 0 { self.out_stride } else { count };
        for q in (0..n).filter(|&q| q != r || out[r] != data[r]) {
            copy_at(data[q], q * count, out[r], q * stride, count);
        }
        sync();
    }

    /// The all-gather by pushes (kernels/all_gather/push.cu): every rank stores its block into
    /// every rank's out (its own only out of place), `out_stride` apart.
    pub(super) fn all_gather_push(&self, sync: &mut dyn FnMut() -> bool) {
        let (r, count) = (self.rank, self.count);
        if !sync() {
            return;
        }
        let stride = if self.out_stride != 0 { self.out_stride } else { count };
        for &to in &self.out.0 {
            copy_at(self.data.0[r], r * count, to, r * stride, count);
        }
        sync();
    }

    /// The multicast all-gather (kernels/all_gather/multicast.cu): each rank stores its block
    /// through the multicast out address into every rank's out.
    pub(super) fn all_gather_multicast(&self, sync: &mut dyn FnMut() -> bool) {
        self.multicast_store(sync, self.rank * self.count, self.rank);
    }
}
