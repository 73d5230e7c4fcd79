//! The one-stream check every collective form makes before enqueuing: ranks of one team on one
//! device given the same stream for the same collective could never make progress.
//!
//! Only ranks that share a device can collide, so the record is kept per device, behind one
//! lock per device: ranks on different devices (the usual team, one rank per GPU) never take
//! the same lock, and a lock taken by one rank's thread only is uncontended by construction.
//! Each rank's recent rounds live in a fixed ring: a claim allocates nothing.

use parking_lot::Mutex;

use crate::driver::{Device, Stream};
use crate::runtime::error::{Error, Result};

/// How many of each rank's most recent collectives the one-stream check remembers.
const ROUNDS_KEPT: usize = 64;

/// A ring slot no round fills (rounds count up from 0).
const NO_ROUND: u64 = u64::MAX;

/// One rank's collectives, for the one-stream check: how many it issued, and the stream of each
/// of the most recent ones, round `k` in slot `k % ROUNDS_KEPT` (`(round, stream)`).
struct Rounds {
    rank: usize,
    issued: u64,
    recent: [(u64, Stream); ROUNDS_KEPT],
}

impl Rounds {
    fn new(rank: usize) -> Rounds {
        Rounds { rank, issued: 0, recent: [(NO_ROUND, Stream(0)); ROUNDS_KEPT] }
    }

    /// True when this rank issued `round` on `stream` (among its last [`ROUNDS_KEPT`]).
    fn issued_on(&self, round: u64, stream: Stream) -> bool {
        self.recent[(round % ROUNDS_KEPT as u64) as usize] == (round, stream)
    }
}

/// The streams of the collectives each rank issued last, grouped by device.
pub(super) struct Claims {
    /// Per rank: `(index of its device's group, its place in the group)`.
    place: Vec<(usize, usize)>,
    /// Per device of the team: the rounds of the ranks on it, in rank order.
    groups: Vec<(Device, Mutex<Vec<Rounds>>)>,
}

impl Claims {
    /// Nothing issued yet by the ranks on `devices` (rank `r` on `devices[r]`).
    pub(super) fn new(devices: &[Device]) -> Claims {
        let mut groups: Vec<(Device, Mutex<Vec<Rounds>>)> = Vec::new();
        let mut place = Vec::with_capacity(devices.len());
        for (r, &dev) in devices.iter().enumerate() {
            let g = match groups.iter().position(|(d, _)| *d == dev) {
                Some(g) => g,
                None => {
                    groups.push((dev, Mutex::new(Vec::new())));
                    groups.len() - 1
                }
            };
            let members = groups[g].1.get_mut();
            place.push((g, members.len()));
            members.push(Rounds::new(r));
        }
        Claims { place, groups }
    }

    /// Records that rank `r` issues its next collective on `stream`, or fails with
    /// `InvalidArgument` naming both ranks when another rank on the same device issued the same
    /// collective (by count) on that stream. Returns the round.
    pub(super) fn claim(&self, r: usize, stream: Stream) -> Result<u64> {
        let (g, i) = self.place[r];
        let (dev, group) = &self.groups[g];
        let mut rounds = group.lock();
        let round = rounds[i].issued;
        if let Some(other) = rounds.iter().find(|o| o.rank != r && o.issued_on(round, stream)) {
            let q = other.rank;
            let name = if stream.0 == 0 { "the NULL stream".to_string() } else { format!("stream {:#x}", stream.0) };
            return Err(Error::invalid_argument(format!(
                "ranks {q} and {r} are both on device {dev} and were given the same stream ({name}) for the same \
                 collective: neither could make progress (each would wait for the other behind it on the stream); \
                 give each rank on a device its own stream. Nothing was enqueued for rank {r}"
            )));
        }
        let mine = &mut rounds[i];
        mine.issued += 1;
        mine.recent[(round % ROUNDS_KEPT as u64) as usize] = (round, stream);
        Ok(round)
    }

    /// Rank `r`'s `(device group, place in it)`.
    #[cfg(test)]
    pub(super) fn place_of(&self, r: usize) -> (usize, usize) {
        self.place[r]
    }

    /// Locks device group `g` (what a claim of a rank on that device holds).
    #[cfg(test)]
    pub(super) fn group_lock(&self, g: usize) -> impl Sized + '_ {
        self.groups[g].1.lock()
    }

    /// Forgets rank `r`'s claim of `round` (its launch failed: nothing was enqueued).
    pub(super) fn unclaim(&self, r: usize, round: u64) {
        let (g, i) = self.place[r];
        let mut rounds = self.groups[g].1.lock();
        let mine = &mut rounds[i];
        if mine.issued == round + 1 {
            mine.issued = round;
            mine.recent[(round % ROUNDS_KEPT as u64) as usize] = (NO_ROUND, Stream(0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_on_one_device_may_not_share_a_stream() {
        // Ranks 0 and 2 on device 5, rank 1 alone on device 7.
        let c = Claims::new(&[5, 7, 5]);
        assert_eq!(c.groups.len(), 2);
        assert_eq!(c.claim(0, Stream(0x10)).unwrap(), 0);
        // Another device's rank may use the same stream value.
        assert_eq!(c.claim(1, Stream(0x10)).unwrap(), 0);
        let e = c.claim(2, Stream(0x10)).unwrap_err();
        assert!(e.message.contains("ranks 0 and 2 are both on device 5"), "{}", e.message);
        assert!(e.message.contains("stream 0x10"), "{}", e.message);
        // Its own stream is fine, and the failed claim took no round.
        assert_eq!(c.claim(2, Stream(0x20)).unwrap(), 0);
        assert_eq!(c.claim(2, Stream(0x10)).unwrap(), 1, "round 1: rank 0 used 0x10 in round 0 only");
        let e = c.claim(0, Stream(0x10)).unwrap_err();
        assert!(e.message.contains("ranks 2 and 0"), "{}", e.message);
    }

    #[test]
    fn an_unclaimed_round_is_forgotten_and_old_rounds_age_out() {
        let c = Claims::new(&[0, 0]);
        let k = c.claim(0, Stream(0)).unwrap();
        c.unclaim(0, k);
        assert_eq!(c.claim(1, Stream(0)).unwrap(), 0, "rank 0's round 0 was given back");
        // Rank 0 races ahead on the NULL stream; rank 1 stays behind on its own stream.
        let c = Claims::new(&[0, 0]);
        for k in 0..(ROUNDS_KEPT as u64 + 1) {
            assert_eq!(c.claim(0, Stream(0)).unwrap(), k);
        }
        // Round 0 of rank 0 aged out of the ring: it is not remembered any more.
        assert_eq!(c.claim(1, Stream(0)).unwrap(), 0);
        let e = c.claim(1, Stream(0)).unwrap_err();
        assert!(e.message.contains("the NULL stream"), "{}", e.message);
    }
}
