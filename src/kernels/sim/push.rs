//! The push protocol's kernels on the simulator (kernels/push.cuh): the push all-reduce, the push
//! reduce-scatter and the pushing two-shot all-reduce, in the kernels' layout of steps, parts and
//! scratch rows; the simulator's barrier stands for each step's flags.

use super::mem::write;
use super::{word, writer_row, Job};
use crate::kernels::abi::{push_row_capacity, two_shot_slice_bytes, PUSH_SEQ_OFFSET, PUSH_SLOTS, SCRATCH_OFFSET};
use std::sync::atomic::Ordering;

/// What each destination of a push kernel gets from every rank (the kernels' `MODE`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum PushForm {
    /// The whole message (`MCAST_PUSH_ALL`, the push all-reduce).
    All,
    /// Block p, at p x the block (`MCAST_PUSH_RS`, the reduce-scatter).
    ReduceScatter,
    /// Slice p of the message, at p x P with P its bytes / N rounded up to 16
    /// (`MCAST_PUSH_TWO_SHOT`); the reduced slice goes into every rank's out, then a barrier.
    TwoShot,
}

impl Job {
    /// A push kernel of `form` (kernels/push.cuh, p2p_push): steps of `blocks` rows; in step j
    /// block b's part of each destination's bytes goes to this rank's row in slot (push
    /// sequence of b + j + 1) % PUSH_SLOTS of that peer's scratch; then each rank reduces its
    /// peers' rows and its own bytes in rank order into its out (every rank's, in the two-shot).
    pub(super) fn push(&self, form: PushForm, sync: &mut dyn FnMut() -> bool) {
        let n = self.nranks;
        let r = self.rank;
        let esize = self.red.map_or(1, |(d, _)| d.size());
        let data = &self.data.0;
        let out = &self.out.0;
        // The message (all-reduce) or one rank's block (reduce-scatter), and what each
        // destination gets of it: all of it, or (two-shot) a slice.
        let bytes = self.count * esize;
        let p_bytes =
            if form == PushForm::TwoShot { two_shot_slice_bytes(bytes as u64, n as u32) as usize } else { bytes };
        // Where destination p's bytes start, and how many of its P exist.
        let at = |p: usize| if form == PushForm::All { 0 } else { p * p_bytes };
        let len =
            |p: usize| if form == PushForm::TwoShot { bytes.saturating_sub(p * p_bytes).min(p_bytes) } else { p_bytes };
        let g = self.blocks;
        let per_step = g * self.push_row;
        let cap = push_row_capacity(n as u32) as usize;
        let steps = p_bytes.div_ceil(per_step);
        let seq = |b: usize| word(self.sync.0[r], PUSH_SEQ_OFFSET + 4 * b);
        let seq0: Vec<u32> = (0..g).map(|b| seq(b).load(Ordering::Relaxed)).collect();
        let row = |p: usize, b: usize, slot: usize, writer: usize| {
            let w = writer_row(p, writer);
            let i = ((b * PUSH_SLOTS + slot) * (n - 1) + w) * cap;
            // SAFETY: the team reserves the scratch after every rank's sync region.
            unsafe { self.sync.0[p].add(SCRATCH_OFFSET + i) }
        };
        // Block b's part of step j of destination p's bytes.
        let part = |j: usize, b: usize, p: usize| {
            let base = j * per_step;
            let step = (p_bytes - base).min(per_step);
            let c = step.div_ceil(g).div_ceil(16) * 16;
            let end = len(p);
            ((base + (b * c).min(step)).min(end), (base + ((b + 1) * c).min(step)).min(end))
        };
        let slot = |b: usize, j: usize| (seq0[b] as usize + j + 1) % PUSH_SLOTS;
        let outs: Vec<*mut u8> = if form == PushForm::TwoShot { out.clone() } else { vec![out[r]] };
        for j in 0..steps {
            for b in 0..g {
                for p in (0..n).filter(|&p| p != r) {
                    let (lo, hi) = part(j, b, p);
                    // SAFETY: lo..hi lies in destination p's bytes of this rank and in one row.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            data[r].wrapping_add(at(p) + lo),
                            row(p, b, slot(b, j), r),
                            hi - lo,
                        )
                    };
                }
            }
            if !sync() {
                return;
            }
            for b in 0..g {
                let (lo, hi) = part(j, b, r);
                let own = data[r].wrapping_add(at(r) + lo);
                let rows: Vec<*mut u8> = (0..n).map(|q| if q == r { own } else { row(r, b, slot(b, j), q) }).collect();
                let res = self.reduce(&rows, 0, (hi - lo) / esize);
                for &t in &outs {
                    write(t, at(r) + lo, &res);
                }
            }
        }
        for (b, s0) in seq0.iter().enumerate() {
            seq(b).store(s0.wrapping_add(steps as u32), Ordering::Relaxed);
        }
        if form == PushForm::TwoShot {
            sync();
        }
    }
}
