//! The simulator's side of kernels/sync.cuh: the counting barrier with the call signature, the
//! comparison of signatures, and the look for a peer that runs another kind of kernel.

use std::cell::Cell;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use super::{dword, word, writer_row, Awaited, Job};
use crate::kernels::abi::{
    BAR_SIG_MAX_RANKS, BAR_SIG_OFFSET, EPOCH_OFFSET, ERROR_INFO_OFFSET, ERROR_WORD_OFFSET, ERR_MISMATCH, ERR_NONE,
    LL_MAX_RANKS, LL_SEQ_OFFSET, LL_SIG_OFFSET, MISMATCH_OFFSET, PUSH_MAX_RANKS, PUSH_SEQ_OFFSET, PUSH_SIG_OFFSET,
    SIGNAL_OFFSET, STATE_MISMATCH, STATE_OFFSET, STATE_OK,
};

/// Where an entry barrier's signatures land (kernels/sync.cuh, all_reduce.cu).
#[derive(Clone, Copy)]
pub(super) enum SigAt {
    /// Two flagged lines per writer at this offset (block slot 0), stored after the signal and
    /// awaited: flagged with `flag`, or with the barrier's epoch where `None`.
    Lines { at: usize, flag: Option<u32> },
    /// 16 bytes per writer at this offset, stored before the signal.
    Words(usize),
}

/// The kind of kernel a signature wait runs in (`MCAST_KIND_*` in kernels/sync.cuh): the lines of
/// the other kinds are where [`Job::cross_found`] looks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Barrier,
    Ll,
    Push,
}

/// How long a signature wait runs before it looks for its peer in another kind of kernel
/// (`MCAST_CROSS_NS`).
const CROSS: Duration = Duration::from_micros(100);

/// Stores signature `s` as two flagged lines at `at` (kernels/sync.cuh, sig_lines_store): four
/// 8-byte lanes {4 payload bytes, `flag`}, each written in one access.
pub(super) fn store_sig(at: *mut u8, s: [u64; 2], flag: u32) {
    let lanes = [s[0] & 0xffff_ffff, s[0] >> 32, s[1] & 0xffff_ffff, s[1] >> 32];
    for (i, v) in lanes.into_iter().enumerate() {
        dword(at, 8 * i).store(v | u64::from(flag) << 32, Ordering::Release);
    }
}

/// The signature the two flagged lines at `at` carry, once every lane carries `flag`.
pub(super) fn load_sig(at: *mut u8, flag: u32) -> Option<[u64; 2]> {
    let l = [0, 1, 2, 3].map(|i| dword(at, 8 * i).load(Ordering::Acquire));
    let lane = |i: usize| l[i] & 0xffff_ffff;
    l.iter().all(|v| (v >> 32) as u32 == flag).then(|| [lane(0) | lane(1) << 32, lane(2) | lane(3) << 32])
}

impl Job {
    /// Arrives at barrier `index` (counting from 1 in this collective) and waits for every rank.
    /// False after a timeout, which is recorded in this rank's error word. With `sig_at` and a
    /// signature (the entry barrier), this rank's signature goes to every peer and every peer's is
    /// compared with it (false on a difference, recorded by [`Job::agrees`]), where [`SigAt`]
    /// says: lines, each peer's awaited and compared before the count (as the kernels' checked
    /// barrier); words, after it.
    pub(super) fn barrier(&self, index: u32, sig_at: Option<SigAt>) -> bool {
        let me = self.sync.0[self.rank];
        let sig = sig_at.zip(self.sig);
        let peers = || (0..self.nranks).filter(|&q| q != self.rank);
        if let Some((SigAt::Words(at), s)) = sig {
            for p in peers().map(|q| self.sync.0[q]) {
                dword(p, at + 16 * self.rank).store(s[0], Ordering::Relaxed);
                dword(p, at + 16 * self.rank + 8).store(s[1], Ordering::Relaxed);
            }
        }
        let epoch = word(me, EPOCH_OFFSET);
        let k = epoch.load(Ordering::Relaxed).wrapping_add(1);
        epoch.store(k, Ordering::Relaxed);
        match &self.mc_signal {
            Some(mc) => mc.0.iter().for_each(|&t| {
                word(t, 0).fetch_add(1, Ordering::Release);
            }),
            None => self.sync.0.iter().for_each(|&s| {
                word(s, SIGNAL_OFFSET).fetch_add(1, Ordering::Release);
            }),
        }
        // Rank p's signature lines from `writer` at `at` (block slot 0).
        let line = |p: usize, at: usize, writer: usize| {
            let w = writer_row(p, writer);
            self.sync.0[p].wrapping_add(at + 32 * w)
        };
        if let Some((SigAt::Lines { at, flag }, s)) = sig {
            for q in peers() {
                store_sig(line(q, at, self.rank), s, flag.unwrap_or(k));
            }
        }
        let target = k.wrapping_mul(self.nranks as u32);
        let counter = word(me, SIGNAL_OFFSET);
        let arrived = || (counter.load(Ordering::Acquire).wrapping_sub(target) as i32) >= 0;
        let Some((at, s)) = sig else { return self.wait_until(index, Awaited::Barrier, arrived) };
        match at {
            // As kernels/sync.cuh's checked_barrier: each peer's lines are awaited (looking for the
            // peer in another kind of kernel meanwhile) and compared, then the count. A peer
            // stores its lines once it has arrived, so a timeout names every rank whose barrier
            // count is behind (as the kernel's signature threads, one per peer, name theirs).
            SigAt::Lines { at, flag } => {
                let kind = if flag.is_some() { Kind::Push } else { Kind::Barrier };
                let flag = flag.unwrap_or(k);
                let agreed = peers().all(|q| {
                    let l = line(self.rank, at, q);
                    self.wait_checked(index, Awaited::Barrier, kind, q, || load_sig(l, flag).is_some())
                        && self.agrees(q, s, load_sig(l, flag).expect("the lines carry the flag awaited"))
                });
                agreed && self.wait_until(index, Awaited::Barrier, arrived)
            }
            SigAt::Words(at) => {
                self.wait_until(index, Awaited::Barrier, arrived)
                    && peers().all(|q| {
                        let theirs = [
                            dword(me, at + 16 * q).load(Ordering::Relaxed),
                            dword(me, at + 16 * q + 8).load(Ordering::Relaxed),
                        ];
                        self.agrees(q, s, theirs)
                    })
            }
        }
    }

    /// Compares rank `peer`'s signature `theirs` with this rank's `mine`: false on a difference,
    /// recorded as the kernels' `record_mismatch` does (kernels/sync.cuh): [`ERR_MISMATCH`]
    /// (first error wins) with the peer as detail and both signatures at [`MISMATCH_OFFSET`],
    /// then [`STATE_MISMATCH`] in this rank's state word.
    pub(super) fn agrees(&self, peer: usize, mine: [u64; 2], theirs: [u64; 2]) -> bool {
        if mine == theirs {
            return true;
        }
        let me = self.sync.0[self.rank];
        if word(me, ERROR_WORD_OFFSET)
            .compare_exchange(ERR_NONE, ERR_MISMATCH, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            for (i, w) in [theirs[0], theirs[1], mine[0], mine[1]].into_iter().enumerate() {
                dword(me, MISMATCH_OFFSET + 8 * i).store(w, Ordering::Relaxed);
            }
            word(me, ERROR_INFO_OFFSET).store(peer as u32, Ordering::Release);
            super::ring(me);
        }
        let _ = word(me, STATE_OFFSET).compare_exchange(STATE_OK, STATE_MISMATCH, Ordering::AcqRel, Ordering::Acquire);
        false
    }

    /// [`Job::wait_until`] for `peer`'s signature lines (`done` once they are in) in a kernel of
    /// `kind`: after [`CROSS`] it also looks for that peer in another kind of kernel
    /// ([`Job::cross_found`]); false then, the mismatch recorded.
    pub(super) fn wait_checked(
        &self,
        index: u32,
        awaited: Awaited,
        kind: Kind,
        peer: usize,
        done: impl Fn() -> bool,
    ) -> bool {
        let start = Instant::now();
        let crossed = Cell::new(false);
        let waited = self.wait_until(index, awaited, || {
            done() || {
                crossed.set(start.elapsed() >= CROSS && self.cross_found(peer, kind, &done));
                crossed.get()
            }
        });
        waited && !crossed.get()
    }

    /// kernels/ll.cuh's `cross_found`, block slot 0: rank `peer`'s signature lines of the kinds
    /// other than `kind`, under the flag each would give this call, while its lines of this call
    /// are awaited (`awaited`: true once they are in); one that carries it with another signature
    /// is recorded as a mismatch (true), unless the awaited lines are in by then: the peer stores
    /// them before any of a later call, so then the lines found are its next call's (it may run one
    /// call ahead). The simulator's push kernels run on the barrier's counter, whose epoch they
    /// have taken already: the flag a barrier kernel of the peer gives this call is that epoch then.
    pub(super) fn cross_found(&self, peer: usize, kind: Kind, awaited: impl Fn() -> bool) -> bool {
        let Some(mine) = self.sig else { return false };
        let (me, n) = (self.sync.0[self.rank], self.nranks);
        let w = writer_row(self.rank, peer);
        let local = |off: usize| word(me, off).load(Ordering::Relaxed);
        let lines = |at: usize, flag: u32| load_sig(me.wrapping_add(at), flag);
        let mut found = None;
        if kind != Kind::Barrier && n <= BAR_SIG_MAX_RANKS as usize {
            let epoch = local(EPOCH_OFFSET);
            let flag = if kind == Kind::Push { epoch } else { epoch.wrapping_add(1) };
            found = lines(BAR_SIG_OFFSET + 32 * w, flag);
        }
        if found.is_none() && kind != Kind::Ll && n <= LL_MAX_RANKS as usize {
            let seq = local(LL_SEQ_OFFSET);
            let f = if seq >= 0xffff_fffe { 1 } else { seq + 1 };
            found = lines(LL_SIG_OFFSET + 32 * ((f & 1) as usize * (LL_MAX_RANKS as usize - 1) + w), f);
        }
        if found.is_none() && kind != Kind::Push && (2..=PUSH_MAX_RANKS as usize).contains(&n) {
            let y0 = local(PUSH_SEQ_OFFSET).wrapping_add(1);
            found = lines(PUSH_SIG_OFFSET + 32 * ((y0 & 1) as usize * (PUSH_MAX_RANKS as usize - 1) + w), y0);
        }
        match found {
            Some(theirs) if theirs != mine => {
                // The lines found were read (acquire) before the awaited ones are read again.
                fence(Ordering::Acquire);
                !awaited() && !self.agrees(peer, mine, theirs)
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::abi::{KernelKind, SYNC_USED_BYTES};
    use crate::kernels::sim::Targets;
    use crate::kernels::{Collective, DType, RedOp};

    /// Rank 0's job of a two-rank LL all-reduce over the sync regions `regions`, signature `sig`.
    fn job(regions: &mut [Vec<u64>; 2], sig: [u64; 2]) -> Job {
        let sync = Targets(regions.iter_mut().map(|r| r.as_mut_ptr() as *mut u8).collect());
        Job {
            kind: KernelKind::AllReduceLl,
            red: Some((DType::F32, RedOp::Sum)),
            collective: Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum },
            rank: 0,
            nranks: 2,
            count: 1,
            blocks: 1,
            push_row: 0,
            out_stride: 0,
            timeout: Some(Duration::from_secs(10)),
            data: Targets(vec![std::ptr::null_mut(); 2]),
            out: Targets(vec![std::ptr::null_mut(); 2]),
            sync,
            mc_data: None,
            mc_out: None,
            mc_signal: None,
            sig: Some(sig),
        }
    }

    /// A peer may run one call ahead: rank 1 stores this LL call's signature lines, finishes the
    /// call and enters its next one, a barrier kernel whose lines carry the flag a barrier kernel
    /// would give this call, between rank 0's look at the awaited lines and its look at the other
    /// kinds' (a thread descheduled between two loads). That is no mismatch: the awaited lines
    /// are in by then. With the look confirmed by nothing, it was recorded as one, rank 0 never
    /// took part in its next barrier, and rank 1 timed out there (the simulator's rare timeout
    /// under load).
    #[test]
    fn the_next_calls_lines_of_a_peer_one_call_ahead_are_no_mismatch() {
        let words = SYNC_USED_BYTES.div_ceil(8);
        let mut regions = [vec![0u64; words], vec![0u64; words]];
        let mine = [0x1111, 0x2222];
        let j = job(&mut regions, mine);
        let me = j.sync.0[0];
        // Rank 1's lines of this call, in rank 0's region, and of its next call (another
        // signature) under the flag a barrier kernel gives this call: the epoch after rank 0's.
        let this_call = me.wrapping_add(LL_SIG_OFFSET + 32 * (LL_MAX_RANKS as usize - 1));
        let next_call = me.wrapping_add(BAR_SIG_OFFSET);
        // The wait's condition, which plays rank 1: from 2 x CROSS after the wait's first look
        // (the wait's start is just before it), the look that finds this call's lines missing is
        // followed by rank 1 storing them and then its next call's, before rank 0 looks further.
        let first = std::cell::OnceCell::new();
        let awaited = || {
            let t0 = *first.get_or_init(Instant::now);
            let there = load_sig(this_call, 1).is_some();
            if !there && t0.elapsed() >= 2 * CROSS {
                store_sig(this_call, mine, 1);
                store_sig(next_call, [0x3333, 0x4444], 1);
            }
            there
        };
        assert!(j.wait_checked(1, Awaited::Rank(1), Kind::Ll, 1, awaited), "the wait ended without its lines");
        assert_eq!(word(me, ERROR_WORD_OFFSET).load(Ordering::Relaxed), ERR_NONE, "a mismatch was recorded");
        assert_eq!(word(me, STATE_OFFSET).load(Ordering::Relaxed), STATE_OK);

        // The same lines while the awaited ones never come: the peer is in a barrier kernel for
        // this call, which is a mismatch, recorded with its signature.
        let mut regions = [vec![0u64; words], vec![0u64; words]];
        let j = job(&mut regions, mine);
        let me = j.sync.0[0];
        store_sig(me.wrapping_add(BAR_SIG_OFFSET), [0x3333, 0x4444], 1);
        assert!(!j.wait_checked(1, Awaited::Rank(1), Kind::Ll, 1, || false));
        assert_eq!(word(me, ERROR_WORD_OFFSET).load(Ordering::Relaxed), ERR_MISMATCH);
        assert_eq!(word(me, ERROR_INFO_OFFSET).load(Ordering::Relaxed), 1, "the peer named");
        assert_eq!(dword(me, MISMATCH_OFFSET).load(Ordering::Relaxed), 0x3333);
    }
}
