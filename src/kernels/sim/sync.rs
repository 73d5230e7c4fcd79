//! The simulator's side of kernels/sync.cuh: the counting barrier with the call signature, the
//! comparison of signatures, and the look for a peer that runs another kind of kernel.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{dword, word, Awaited, Job};
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
        dword(at, 8 * i).store(v | u64::from(flag) << 32, Ordering::Relaxed);
    }
}

/// The signature the two flagged lines at `at` carry, once every lane carries `flag`.
pub(super) fn load_sig(at: *mut u8, flag: u32) -> Option<[u64; 2]> {
    let l = [0, 1, 2, 3].map(|i| dword(at, 8 * i).load(Ordering::Relaxed));
    let lane = |i: usize| l[i] & 0xffff_ffff;
    l.iter().all(|v| (v >> 32) as u32 == flag).then(|| [lane(0) | lane(1) << 32, lane(2) | lane(3) << 32])
}

impl Job {
    /// Arrives at barrier `index` (counting from 1 in this collective) and waits for every rank.
    /// False after a timeout, which is recorded in this rank's error word. With `sig_at` and a
    /// signature (the entry barrier), this rank's signature goes to every peer and every peer's is
    /// compared with it after the wait (false on a difference, recorded by [`Job::mismatch`]),
    /// where [`SigAt`] says.
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
            let w = if writer < p { writer } else { writer - 1 };
            self.sync.0[p].wrapping_add(at + 32 * w)
        };
        if let Some((SigAt::Lines { at, flag }, s)) = sig {
            for q in peers() {
                store_sig(line(q, at, self.rank), s, flag.unwrap_or(k));
            }
        }
        let target = k.wrapping_mul(self.nranks as u32);
        let counter = word(me, SIGNAL_OFFSET);
        // The signature threads of a checked barrier look for their peers in another kind of
        // kernel while the count is awaited (kernels/sync.cuh, cross_found).
        let kind = match sig {
            Some((SigAt::Lines { flag: None, .. }, _)) => Some(Kind::Barrier),
            Some((SigAt::Lines { flag: Some(_), .. }, _)) => Some(Kind::Push),
            _ => None,
        };
        let arrived = || (counter.load(Ordering::Acquire).wrapping_sub(target) as i32) >= 0;
        let waited = match kind {
            Some(kind) => self.wait_checked(index, Awaited::Barrier, kind, None, arrived),
            None => self.wait_until(index, Awaited::Barrier, arrived),
        };
        if !waited {
            return false;
        }
        let Some((at, s)) = sig else { return true };
        peers().all(|q| {
            let theirs = match at {
                SigAt::Lines { at, flag } => {
                    let kind = if flag.is_some() { Kind::Push } else { Kind::Barrier };
                    let (l, flag) = (line(self.rank, at, q), flag.unwrap_or(k));
                    if !self.wait_checked(index, Awaited::Rank(q), kind, Some(q), || load_sig(l, flag).is_some()) {
                        return false;
                    }
                    load_sig(l, flag).expect("the lines carry the flag awaited")
                }
                SigAt::Words(at) => {
                    [dword(me, at + 16 * q).load(Ordering::Relaxed), dword(me, at + 16 * q + 8).load(Ordering::Relaxed)]
                }
            };
            self.agrees(q, s, theirs)
        })
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
        }
        let _ = word(me, STATE_OFFSET).compare_exchange(STATE_OK, STATE_MISMATCH, Ordering::AcqRel, Ordering::Acquire);
        false
    }

    /// [`Job::wait_until`] for a signature wait in a kernel of `kind`, for `peer` (every peer
    /// where `None`): after [`CROSS`] it also looks for that peer in another kind of kernel
    /// ([`Job::cross_found`]); false then, the mismatch recorded.
    pub(super) fn wait_checked(
        &self,
        index: u32,
        awaited: Awaited,
        kind: Kind,
        peer: Option<usize>,
        done: impl Fn() -> bool,
    ) -> bool {
        let start = Instant::now();
        let crossed = Cell::new(false);
        let found = || {
            let mut peers = (0..self.nranks).filter(|&q| q != self.rank && peer.is_none_or(|p| p == q));
            start.elapsed() >= CROSS && peers.any(|q| self.cross_found(q, kind))
        };
        let waited = self.wait_until(index, awaited, || {
            done() || {
                crossed.set(found());
                crossed.get()
            }
        });
        waited && !crossed.get()
    }

    /// kernels/ll.cuh's `cross_found`, block slot 0: rank `peer`'s signature lines of the kinds
    /// other than `kind`, under the flag each would give this call; one that carries it with
    /// another signature is recorded as a mismatch (true). The simulator's push all-reduce runs
    /// on the barrier's counter, whose epoch it has taken already: the flag a barrier kernel of
    /// the peer gives this call is that epoch then.
    pub(super) fn cross_found(&self, peer: usize, kind: Kind) -> bool {
        let Some(mine) = self.sig else { return false };
        let (me, n) = (self.sync.0[self.rank], self.nranks);
        let w = if peer < self.rank { peer } else { peer - 1 };
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
        found.is_some_and(|theirs| theirs != mine && !self.agrees(peer, mine, theirs))
    }
}
