//! The fuzzer's choice of handles (live, zero, stale, foreign, random), ranks, sizes and
//! streams.

use super::*;

impl Fuzzer {
    pub(super) fn is_live_id(&self, id: u64) -> bool {
        self.m.ctxs.iter().flatten().any(|c| c.handle.id == id)
            || self.m.teams.iter().flatten().any(|t| t.handle.id == id)
            || self.m.bufs.iter().flatten().any(|b| b.handle.id == id)
    }

    /// A handle id that is not live as `kind` (1 context, 2 team, 3 buffer): zero, stale
    /// (destroyed or freed earlier: double destroy/free), foreign (a live one of another kind),
    /// random, or forged with the right kind bits.
    pub(super) fn any_id(&mut self, kind: u64) -> u64 {
        let id = self.any_id_raw(kind);
        if id >> 56 == kind && self.is_live_id(id) {
            u64::MAX
        } else {
            id
        }
    }

    pub(super) fn any_id_raw(&mut self, kind: u64) -> u64 {
        match self.rng.below(6) {
            0 => 0,
            1 if !self.m.dead.is_empty() => self.m.dead[self.rng.below(self.m.dead.len() as u64) as usize],
            2 => self.rng.next(),
            3 => (kind << 56) | (self.rng.below(4) << 32) | self.rng.below(64),
            4 => {
                // Foreign: a live handle of another kind.
                let kinds: Vec<u64> = [
                    live(&self.m.ctxs).first().map(|&i| self.m.ctxs[i].as_ref().unwrap().handle.id),
                    live(&self.m.teams).first().map(|&i| self.m.teams[i].as_ref().unwrap().handle.id),
                    live(&self.m.bufs).first().map(|&i| self.m.bufs[i].as_ref().unwrap().handle.id),
                ]
                .into_iter()
                .flatten()
                .filter(|id| id >> 56 != kind)
                .collect();
                if kinds.is_empty() {
                    0
                } else {
                    self.rng.pick(&kinds)
                }
            }
            _ => u64::MAX,
        }
    }

    /// A live context (index and handle), or with `bad_pct` percent a bad handle.
    pub(super) fn ctx(&mut self, bad_pct: u64) -> (Option<usize>, mcast_context_t) {
        let l = live(&self.m.ctxs);
        if l.is_empty() || self.rng.pct(bad_pct) {
            return (None, mcast_context_t { id: self.any_id(1) });
        }
        let i = self.rng.pick(&l);
        (Some(i), self.m.ctxs[i].as_ref().unwrap().handle)
    }

    pub(super) fn team(&mut self, bad_pct: u64) -> (Option<usize>, mcast_team_t) {
        let l = live(&self.m.teams);
        if l.is_empty() || self.rng.pct(bad_pct) {
            return (None, mcast_team_t { id: self.any_id(2) });
        }
        let i = self.rng.pick(&l);
        (Some(i), self.m.teams[i].as_ref().unwrap().handle)
    }

    pub(super) fn buf(&mut self, bad_pct: u64) -> (Option<usize>, mcast_buffer_t) {
        let l = live(&self.m.bufs);
        if l.is_empty() || self.rng.pct(bad_pct) {
            return (None, mcast_buffer_t { id: self.any_id(3) });
        }
        let i = self.rng.pick(&l);
        (Some(i), self.m.bufs[i].as_ref().unwrap().handle)
    }

    /// A rank for a team of `n`: mostly valid, sometimes out of range.
    pub(super) fn rank(&mut self, n: i32) -> c_int {
        if self.rng.pct(90) {
            self.rng.below(n.max(1) as u64) as c_int
        } else {
            self.rng.pick(&[-1, n, n + 1, i32::MIN, i32::MAX, 16, -100])
        }
    }

    pub(super) fn size_near(&mut self, limit: usize) -> usize {
        match self.rng.below(10) {
            0 => 0,
            1 => limit,
            2 => limit + 1,
            3 => usize::MAX,
            4 => usize::MAX / 2,
            _ => self.rng.below(limit as u64 + 1) as usize,
        }
    }

    pub(super) fn stream(&mut self) -> mcast_stream_t {
        self.rng.below(6) as usize as mcast_stream_t
    }
}
