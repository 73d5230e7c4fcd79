//! The LL protocol on the simulator (`kernels/ll.cuh`): one rank's part of an LL collective,
//! line by line over the same landing rows and flags as the kernels.

use std::sync::atomic::{AtomicU64, Ordering};

use super::mem::{copy_at, write};
use super::sync::{load_sig, store_sig, Kind};
use super::{word, writer_row, Awaited, Job};
use crate::kernels::abi::{ll_offset, LL_MAX_RANKS, LL_ROW, LL_SEQ_OFFSET, LL_SIG_OFFSET};
use crate::kernels::Collective;

impl Job {
    /// The LL kernels (kernels/ll.cuh), line by line: per block slot the next flag; this rank's
    /// part of what each receiver needs stored into the receiver's landing row as LL lines (two
    /// 8-byte lanes of {4 payload bytes, flag}; broadcast's other ranks store one acknowledgement
    /// line in every peer's landing); then the lines it needs from each sender polled until they
    /// carry the flag, and reduced (in rank order) or copied into its out.
    pub(super) fn ll(&self) {
        let (n, r) = (self.nranks, self.rank);
        let esize = self.red.map_or(1, |(d, _)| d.size());
        let size = self.count * esize;
        let (block, root) = match self.collective {
            Collective::AllReduce { .. } => (0, None),
            Collective::ReduceScatter { .. } | Collective::AllGather => (size, None),
            Collective::Broadcast { root } => (0, Some(root as usize)),
        };
        let gather = matches!(self.collective, Collective::AllGather);
        // Where the all-gather's blocks lie in out (Launch::out_stride).
        let ostride = if gather && self.out_stride != 0 { self.out_stride } else { block };
        let (data, out, me) = (&self.data.0, &self.out.0, self.sync.0[r]);
        let g = self.blocks;
        let flags: Vec<u32> = (0..g)
            .map(|b| {
                let seq = word(me, LL_SEQ_OFFSET + 4 * b);
                let s = seq.load(Ordering::Relaxed);
                let f = if s >= 0xffff_fffe { 1 } else { s + 1 };
                seq.store(f, Ordering::Relaxed);
                f
            })
            .collect();
        let c = size.div_ceil(g).div_ceil(8) * 8;
        let part = |b: usize| ((b * c).min(size), (b * c + c).min(size));
        let line = |p: usize, b: usize, writer: usize, i: usize| -> [&AtomicU64; 2] {
            let w = writer_row(p, writer);
            let row = ((b * 2 + (flags[b] & 1) as usize) * (n - 1) + w) * LL_ROW as usize;
            let at = self.sync.0[p].wrapping_add(ll_offset(n as u32) + row + 16 * i);
            // SAFETY: the team reserves the LL landing area after every rank's sync region;
            // lines are 16-byte aligned and only accessed atomically.
            unsafe { [&*(at as *const AtomicU64), &*(at.add(8) as *const AtomicU64)] }
        };
        // Rank p's signature lines from `writer` on block slot b (kernels/ll.cuh, ll_sig).
        let sig_lines = |p: usize, b: usize, writer: usize| {
            let w = writer_row(p, writer);
            let at = LL_SIG_OFFSET + 32 * ((b * 2 + (flags[b] & 1) as usize) * (LL_MAX_RANKS as usize - 1) + w);
            self.sync.0[p].wrapping_add(at)
        };
        // What this rank sends receiver q: its data from this byte offset.
        let source = |q: usize| match self.collective {
            Collective::ReduceScatter { .. } => q * block,
            _ => r * block,
        };
        let put = |[x, y]: [&AtomicU64; 2], b: usize, v: u64| {
            x.store((v & 0xffff_ffff) | u64::from(flags[b]) << 32, Ordering::Relaxed);
            y.store((v >> 32) | u64::from(flags[b]) << 32, Ordering::Relaxed);
        };
        let store = |p: usize, b: usize, i: usize, v: u64| put(line(p, b, r, i), b, v);
        // Waits until the line carries block slot b's flag; its payload, or None (an abort or a
        // timeout, recorded).
        let take = |[x, y]: [&AtomicU64; 2], b: usize, writer: usize| -> Option<u64> {
            let carries = |w: &AtomicU64| (w.load(Ordering::Relaxed) >> 32) as u32 == flags[b];
            self.wait_until(1, Awaited::Rank(writer), || carries(x) && carries(y))
                .then(|| (x.load(Ordering::Relaxed) & 0xffff_ffff) | y.load(Ordering::Relaxed) << 32)
        };
        let fetch = |b: usize, writer: usize, i: usize| take(line(r, b, writer, i), b, writer);
        // The call's signature, first, as two lines to every peer on every block slot.
        if let Some(sig) = self.sig {
            for (b, &flag) in flags.iter().enumerate() {
                for q in (0..n).filter(|&q| q != r) {
                    store_sig(sig_lines(q, b, r), sig, flag);
                }
            }
        }
        // Broadcast: the other ranks acknowledge the call to every peer (one line, payload 0).
        if root.is_some_and(|root| root != r) {
            for b in 0..g {
                (0..n).filter(|&q| q != r).for_each(|q| store(q, b, 0, 0));
            }
        }
        if root.is_none_or(|root| root == r) {
            for b in 0..g {
                let (lo, hi) = part(b);
                for q in (0..n).filter(|&q| q != r) {
                    for (i, at) in (lo..hi).step_by(8).enumerate() {
                        let mut v = [0u8; 8];
                        let len = (hi - at).min(8);
                        // SAFETY: the bytes lie in this rank's range of the collective.
                        unsafe {
                            std::ptr::copy_nonoverlapping(data[r].wrapping_add(source(q) + at), v.as_mut_ptr(), len)
                        };
                        store(q, b, i, u64::from_le_bytes(v));
                    }
                }
            }
        }
        // Every peer's signature, compared before anything of out is written.
        if let Some(sig) = self.sig {
            for (b, &flag) in flags.iter().enumerate() {
                for q in (0..n).filter(|&q| q != r) {
                    // Block slot 0's wait also looks for the peer in another kind of kernel
                    // (kernels/ll.cuh, cross_found).
                    let at = sig_lines(r, b, q);
                    let both = || load_sig(at, flag).is_some();
                    let arrived = if b == 0 {
                        self.wait_checked(1, Awaited::Rank(q), Kind::Ll, q, both)
                    } else {
                        self.wait_until(1, Awaited::Rank(q), both)
                    };
                    if !arrived {
                        return;
                    }
                    let [s0, s1] = load_sig(at, flag).expect("the lines carry the flag awaited");
                    if !self.agrees(q, sig, [s0, s1]) {
                        return;
                    }
                }
            }
        }
        if (gather || root == Some(r)) && out[r] != data[r] {
            for b in 0..g {
                let (lo, hi) = part(b);
                copy_at(data[r], r * block + lo, out[r], r * ostride + lo, hi - lo);
            }
        }
        for b in 0..g {
            let (lo, hi) = part(b);
            if let Some(root) = root {
                for q in (0..n).filter(|&q| q != r && q != root) {
                    if fetch(b, q, 0).is_none() {
                        return;
                    }
                }
            }
            let mut rows: Vec<Vec<u8>> = vec![Vec::new(); n];
            for q in (0..n).filter(|&q| q != r && root.is_none_or(|root| root == q)) {
                let mut got = vec![0u8; (hi - lo).div_ceil(8) * 8];
                for (i, chunk) in got.chunks_mut(8).enumerate() {
                    let Some(v) = fetch(b, q, i) else { return };
                    chunk.copy_from_slice(&v.to_le_bytes());
                }
                got.truncate(hi - lo);
                rows[q] = got;
            }
            match self.collective {
                Collective::AllReduce { .. } | Collective::ReduceScatter { .. } => {
                    let srcs: Vec<*mut u8> = (0..n)
                        .map(|q| if q == r { data[r].wrapping_add(r * block + lo) } else { rows[q].as_mut_ptr() })
                        .collect();
                    let res = self.reduce(&srcs, 0, (hi - lo) / esize);
                    write(out[r], r * block + lo, &res);
                }
                Collective::AllGather => {
                    for q in (0..n).filter(|&q| q != r) {
                        write(out[r], q * ostride + lo, &rows[q]);
                    }
                }
                Collective::Broadcast { root } => {
                    if root as usize != r {
                        write(out[r], lo, &rows[root as usize]);
                    }
                }
            }
        }
    }
}
