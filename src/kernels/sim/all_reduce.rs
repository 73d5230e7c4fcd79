//! The all-reduce's models on the simulator (kernels/all_reduce/): the one-shot pull, the push,
//! the two-shot and the multicast kernels; LL's in `ll.rs`.

use super::mem::{slice, write};
use super::{word, writer_row, Job};
use crate::kernels::abi::{push_row_capacity, PUSH_SEQ_OFFSET, PUSH_SLOTS, SCRATCH_OFFSET};
use std::sync::atomic::Ordering;

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

    /// The push all-reduce, in the kernel's layout (kernels/all_reduce/push.cu,
    /// all_reduce_p2p_push): steps of `blocks` rows; in step j block b's part goes to this rank's
    /// row in slot (push sequence of b + j + 1) % PUSH_SLOTS of every peer's scratch; the
    /// simulator's barrier stands for the flags; then each rank reduces its peers' rows and its
    /// own data in rank order into its out.
    pub(super) fn all_reduce_push(&self, sync: &mut dyn FnMut() -> bool) {
        let n = self.nranks;
        let r = self.rank;
        let count = self.count;
        let esize = self.red.map_or(1, |(d, _)| d.size());
        let data = &self.data.0;
        let out = &self.out.0;
        let bytes = count * esize;
        let g = self.blocks;
        let per_step = g * self.push_row;
        let cap = push_row_capacity(n as u32) as usize;
        let steps = bytes.div_ceil(per_step);
        let seq = |b: usize| word(self.sync.0[r], PUSH_SEQ_OFFSET + 4 * b);
        let seq0: Vec<u32> = (0..g).map(|b| seq(b).load(Ordering::Relaxed)).collect();
        let row = |p: usize, b: usize, slot: usize, writer: usize| {
            let w = writer_row(p, writer);
            let i = ((b * PUSH_SLOTS + slot) * (n - 1) + w) * cap;
            // SAFETY: the team reserves the scratch after every rank's sync region.
            unsafe { self.sync.0[p].add(SCRATCH_OFFSET + i) }
        };
        let part = |j: usize, b: usize| {
            let base = j * per_step;
            let len = (bytes - base).min(per_step);
            let c = len.div_ceil(g).div_ceil(16) * 16;
            (base + (b * c).min(len), base + ((b + 1) * c).min(len))
        };
        let slot = |b: usize, j: usize| (seq0[b] as usize + j + 1) % PUSH_SLOTS;
        for j in 0..steps {
            for b in 0..g {
                let (lo, hi) = part(j, b);
                for p in (0..n).filter(|&p| p != r) {
                    // SAFETY: lo..hi lies in this rank's range and in one scratch row.
                    unsafe {
                        std::ptr::copy_nonoverlapping(data[r].wrapping_add(lo), row(p, b, slot(b, j), r), hi - lo)
                    };
                }
            }
            if !sync() {
                return;
            }
            for b in 0..g {
                let (lo, hi) = part(j, b);
                let rows: Vec<*mut u8> =
                    (0..n).map(|q| if q == r { data[r].wrapping_add(lo) } else { row(r, b, slot(b, j), q) }).collect();
                let res = self.reduce(&rows, 0, (hi - lo) / esize);
                write(out[r], lo, &res);
            }
        }
        for (b, s0) in seq0.iter().enumerate() {
            seq(b).store(s0.wrapping_add(steps as u32), Ordering::Relaxed);
        }
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
