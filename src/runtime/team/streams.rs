//! The one-stream check every collective form makes before enqueuing: ranks of one team on one
//! device given the same stream for the same collective could never make progress.

use std::collections::VecDeque;

use parking_lot::Mutex;

use crate::driver::{Device, Stream};
use crate::runtime::error::{Error, Result};

/// How many of each rank's most recent collectives the one-stream check remembers.
const ROUNDS_KEPT: usize = 64;

/// One rank's collectives, for the one-stream check: how many it issued, and the device and
/// stream of the most recent ones (`(round, stream)`).
#[derive(Default)]
struct Rounds {
    issued: u64,
    recent: VecDeque<(u64, Stream)>,
}

/// The streams of the collectives each rank issued last.
pub(super) struct Claims(Mutex<Vec<Rounds>>);

impl Claims {
    /// Nothing issued yet by any of `n` ranks.
    pub(super) fn new(n: usize) -> Claims {
        Claims(Mutex::new((0..n).map(|_| Rounds::default()).collect()))
    }

    /// Records that rank `r` (of ranks on `devices`) issues its next collective on `stream`, or
    /// fails with `InvalidArgument` naming both ranks when another rank on the same device
    /// issued the same collective (by count) on that stream. Returns the round.
    pub(super) fn claim(&self, devices: &[Device], r: usize, stream: Stream) -> Result<u64> {
        let mut rounds = self.0.lock();
        let round = rounds[r].issued;
        let dev = devices[r];
        for (q, other) in rounds.iter().enumerate() {
            if q == r || devices[q] != dev {
                continue;
            }
            if other.recent.iter().any(|&(k, s)| k == round && s == stream) {
                let name =
                    if stream.0 == 0 { "the NULL stream".to_string() } else { format!("stream {:#x}", stream.0) };
                return Err(Error::invalid_argument(format!(
                    "ranks {q} and {r} are both on device {dev} and were given the same stream ({name}) for the same \
                     collective: neither could make progress (each would wait for the other behind it on the \
                     stream); give each rank on a device its own stream. Nothing was enqueued for rank {r}"
                )));
            }
        }
        let mine = &mut rounds[r];
        mine.issued += 1;
        mine.recent.push_back((round, stream));
        if mine.recent.len() > ROUNDS_KEPT {
            mine.recent.pop_front();
        }
        Ok(round)
    }

    /// Forgets rank `r`'s claim of `round` (its launch failed: nothing was enqueued).
    pub(super) fn unclaim(&self, r: usize, round: u64) {
        let mut rounds = self.0.lock();
        let mine = &mut rounds[r];
        if mine.issued == round + 1 {
            mine.issued = round;
            mine.recent.retain(|&(k, _)| k != round);
        }
    }
}
