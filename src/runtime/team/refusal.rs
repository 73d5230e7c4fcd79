//! A rule broken by one rank of a one-process team refuses every rank's call of that
//! collective (API.md, "Teams: split, abort, errors").
//!
//! The ranks of a one-process team call each collective independently, from one thread or
//! several, in any order, and must not wait for each other on the host. So each rank counts
//! its collective calls (its `k`-th call is round `k`), and a rank whose call is refused for a
//! bad argument records its round ([`Refusals::refuse`]):
//! - a rank that calls that round later is refused at entry, before anything is enqueued,
//!   with a message naming the refused rank and its reason ([`Refusals::enter`]); refused calls
//!   do not count, and the refused rank's next call (the same round again) clears the refusal,
//!   so a program that corrects the call carries on;
//! - if a rank had already called that round (its work may be enqueued and waiting on the
//!   device for the refused rank), the team fails at once with `INVALID_ARGUMENT`, sticky
//!   like a timeout: the device waits end now rather than at `timeout_ms`, and every later
//!   call, synchronize and `mcast_team_get_error` reports it.
//!
//! The record and the counters are atomics: a healthy call makes one `fetch_add` on its own
//! rank's counter and one load of the record, and takes no lock. A refusal and a concurrent
//! entry order their writes and reads sequentially consistently (each writes, then reads the
//! other's word), so at least one of them sees the other: the entering rank is refused, or the
//! refusing rank sees it entered and fails the team. No enqueued work is left waiting.
//! Multi-process teams vote their arguments instead (each process holds one rank).

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::runtime::error::{Error, ErrorKind};

/// No round refused.
const NONE: u64 = u64::MAX;

/// Per-rank call rounds and the last refused round of a one-process team.
pub(super) struct Refusals {
    /// Per rank: the collective calls it made (its next call's round).
    calls: Vec<AtomicU64>,
    /// The last refused round, or [`NONE`].
    round: AtomicU64,
    /// Who was refused in `round`, and why (read on the failure path only).
    why: Mutex<(usize, String)>,
}

impl Refusals {
    /// Nothing called yet by `n` ranks.
    pub(super) fn new(n: usize) -> Refusals {
        Refusals {
            calls: (0..n).map(|_| AtomicU64::new(0)).collect(),
            round: AtomicU64::new(NONE),
            why: Mutex::new((0, String::new())),
        }
    }

    /// Rank `r` starts its next collective call: returns its round, or the refusal of that
    /// round by another rank (nothing may then be enqueued, and the call does not count). The
    /// refused rank's own next call is that round again: it clears the refusal.
    pub(super) fn enter(&self, r: usize) -> Result<u64, Error> {
        let k = self.calls[r].fetch_add(1, Ordering::SeqCst);
        if self.round.load(Ordering::SeqCst) == k {
            let why = self.why.lock();
            // Read the record under its lock: a later refusal may have replaced it.
            if self.round.load(Ordering::SeqCst) == k {
                let q = why.0;
                if q == r {
                    self.round.store(NONE, Ordering::SeqCst);
                    return Ok(k);
                }
                let e = Error::invalid_argument(format!(
                    "rank {q}'s call of this collective (its call number {k} on the team) was refused, so every \
                     rank's is, before anything is enqueued: {}",
                    why.1
                ));
                drop(why);
                self.give_back(r, k);
                return Err(e);
            }
        }
        Ok(k)
    }

    /// Rank `r`'s call of round `k` does not count (its caller calls again for that round).
    pub(super) fn give_back(&self, r: usize, k: u64) {
        let _ = self.calls[r].compare_exchange(k + 1, k, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Rank `r`'s call of round `k` was refused with `e`: records it (the call does not count);
    /// true when another rank had already called round `k` (the team must then fail).
    pub(super) fn refuse(&self, r: usize, k: u64, e: &Error) -> bool {
        {
            let mut why = self.why.lock();
            *why = (r, e.message.clone());
            self.round.store(k, Ordering::SeqCst);
        }
        self.give_back(r, k);
        self.calls.iter().enumerate().any(|(q, c)| q != r && c.load(Ordering::SeqCst) > k)
    }
}

impl Refusals {
    /// The ranks that made fewer collective calls than the most any rank made, with their
    /// counts, and that most: `None` when every rank made as many.
    fn behind(&self) -> Option<(Vec<(usize, u64)>, u64)> {
        let counts: Vec<u64> = self.calls.iter().map(|c| c.load(Ordering::SeqCst)).collect();
        let most = counts.iter().copied().max()?;
        let behind: Vec<(usize, u64)> =
            counts.iter().enumerate().filter(|&(_, &c)| c < most).map(|(q, &c)| (q, c)).collect();
        (!behind.is_empty()).then_some((behind, most))
    }
}

impl super::Team {
    /// For a timeout's message in a one-process team: the ranks that have called fewer
    /// collectives than others (they did not arrive), and the issue-order rule of a thread that
    /// drives several ranks (docs/collectives.md, "One thread driving several ranks"). Empty for
    /// multi-process teams and teams of one rank.
    pub(crate) fn timeout_hint(&self) -> String {
        let Some(rf) = &self.refusals else { return String::new() };
        let behind = match rf.behind() {
            Some((ranks, most)) => {
                let list: Vec<String> = ranks.iter().map(|(q, c)| format!("rank {q} ({c})")).collect();
                format!(
                    "; ranks that did not arrive: {} have issued fewer collective calls on the team than the {most} \
                     of the others",
                    list.join(", ")
                )
            }
            None => String::new(),
        };
        format!(
            "{behind}; where one thread drives several ranks, it must issue each collective on every rank before \
             the next collective on any rank (docs/collectives.md, \"One thread driving several ranks\": a kind's \
             first call on a device loads its kernels, which waits for the device's running kernels)"
        )
    }

    /// Rank `r` (checked) starts a collective call; `None` for multi-process teams and teams
    /// of one rank, which need no record. See the module doc.
    pub(crate) fn enter_call(&self, r: usize) -> Result<Option<u64>, Error> {
        match &self.refusals {
            Some(rf) => rf.enter(r).map(Some),
            None => Ok(None),
        }
    }

    /// Rank `r`'s call of round `k` was refused by the one-stream check, which names both
    /// ranks and is answered by calling again on another stream: that call is round `k`.
    pub(crate) fn give_back_call(&self, r: usize, k: Option<u64>) {
        if let (Some(rf), Some(k)) = (&self.refusals, k) {
            rf.give_back(r, k);
        }
    }

    /// Rank `r`'s call of round `k` (from [`enter_call`](Self::enter_call)) ended with `e`:
    /// an argument error refuses the round on every rank, failing the team when another rank
    /// had already called it.
    pub(crate) fn end_call(&self, r: usize, k: Option<u64>, e: &Error) {
        let (Some(rf), Some(k)) = (&self.refusals, k) else { return };
        // An error of a team that already failed is that failure, not a new refusal.
        if e.kind != ErrorKind::InvalidArgument || self.failed.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        if rf.refuse(r, k, e) {
            self.set_error(Error::invalid_argument(format!(
                "rank {r}'s call of a collective was refused after other ranks of the team had issued theirs, so the \
                 team failed (its device waits end now, not at timeout_ms): {}; destroy the team and make a new one",
                e.message
            )));
            self.stop_device_waits(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_round_refuses_later_callers_and_reports_earlier_ones() {
        let rf = Refusals::new(3);
        let e = Error::invalid_argument("recv is NULL");
        // Round 0: rank 0 called it before rank 1's refusal: the team must fail.
        assert_eq!(rf.enter(0).unwrap(), 0);
        let k = rf.enter(1).unwrap();
        assert!(rf.refuse(1, k, &e));
        let later = rf.enter(2).unwrap_err();
        assert!(later.message.contains("rank 1's call") && later.message.contains("recv is NULL"), "{later}");
        // Refused calls do not count: ranks 1 and 2 are still at round 0, rank 0 at round 1.
        assert_eq!(rf.behind(), Some((vec![(1, 0), (2, 0)], 1)));
        // Rank 1 calls round 0 again: its own refusal is cleared, and rank 2 then calls it too.
        assert_eq!(rf.enter(1).unwrap(), 0);
        assert_eq!(rf.enter(2).unwrap(), 0);
        assert_eq!(rf.behind(), None);
        // Round 1: rank 2 refused first, nobody had called it: the team stays usable, the others
        // are refused until rank 2 calls again.
        let k = rf.enter(2).unwrap();
        assert_eq!(k, 1);
        assert!(!rf.refuse(2, k, &e));
        assert!(rf.enter(0).is_err());
        assert!(rf.enter(1).is_err());
        assert_eq!(rf.enter(2).unwrap(), 1);
        assert_eq!(rf.enter(0).unwrap(), 1);
        assert_eq!(rf.enter(1).unwrap(), 1);
        assert_eq!(rf.behind(), None);
    }
}
