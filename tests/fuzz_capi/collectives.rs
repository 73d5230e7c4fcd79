//! Collectives issued for every rank or only some, single calls with arbitrary arguments,
//! synchronize, and the calls that fit nowhere else (`misc`).

use super::*;

impl Fuzzer {
    /// Arguments of one collective on a buffer of `bytes` on a team of `n`: mostly in range.
    pub(super) fn collective_args(&mut self, n: usize, bytes: usize) -> (u32, usize, usize, u32, u32, c_int) {
        let kind = self.rng.below(4) as u32;
        let dtype = if self.rng.pct(95) { self.rng.below(8) as u32 } else { self.rng.pick(&[8, 99, u32::MAX]) };
        let op = if self.rng.pct(95) { self.rng.below(3) as u32 } else { self.rng.pick(&[3, 99, u32::MAX]) };
        let esize = match dtype {
            1 | 6 | 7 => 8,
            2 | 3 => 2,
            _ => 4,
        };
        let (unit, align) = match kind {
            0 => (1, 1),
            1 => (esize, esize.max(4)),
            2 => (esize * n, esize.max(4)),
            _ => (n, 1),
        };
        let offset = if self.rng.pct(90) {
            let o = self.rng.below((bytes / 2) as u64 + 1) as usize;
            o - o % align
        } else {
            self.size_near(bytes)
        };
        let room = bytes.saturating_sub(offset) / unit;
        let count =
            if self.rng.pct(90) { 1 + self.rng.below(room.max(1) as u64) as usize } else { self.size_near(room) };
        let root = if self.rng.pct(95) { self.rng.below(n as u64) as c_int } else { self.rank(n as i32) };
        (kind, offset, count, dtype, op, root)
    }

    pub(super) fn issue(
        &mut self,
        b: mcast_buffer_t,
        rank: c_int,
        args: (u32, usize, usize, u32, u32, c_int),
        s: mcast_stream_t,
    ) {
        let (kind, offset, count, dtype, op, root) = args;
        // A third of the calls use the out-of-place form in NCCL's in-place layout (the same
        // buffer, the result where the in-place function leaves it): it must behave the same.
        let into = self.rng.pct(33);
        let (d, o) = (mcast_dtype_t(dtype), mcast_op_t(op));
        let esize = match dtype {
            1 | 6 | 7 => 8,
            2 | 3 => 2,
            _ => 4,
        };
        let block = |e: usize| (rank.max(0) as usize).wrapping_mul(count).wrapping_mul(e);
        let st = match (kind, into) {
            (0, false) => mcast_broadcast(b, rank, root, offset, count, s),
            (1, false) => mcast_all_reduce(b, rank, offset, count, d, o, s),
            (2, false) => mcast_reduce_scatter(b, rank, offset, count, d, o, s),
            (_, false) => mcast_all_gather(b, rank, offset, count, s),
            (0, true) => mcast_broadcast_into(b, offset, b, offset, rank, root, count, s),
            (1, true) => mcast_all_reduce_into(b, offset, b, offset, rank, count, d, o, s),
            (2, true) => {
                mcast_reduce_scatter_into(b, offset, b, offset.wrapping_add(block(esize)), rank, count, d, o, s)
            }
            (_, true) => mcast_all_gather_into(b, offset.wrapping_add(block(1)), b, offset, rank, count, s),
        };
        let name = match into {
            false => ["mcast_broadcast", "mcast_all_reduce", "mcast_reduce_scatter", "mcast_all_gather"],
            true => {
                ["mcast_broadcast_into", "mcast_all_reduce_into", "mcast_reduce_scatter_into", "mcast_all_gather_into"]
            }
        }[kind as usize];
        self.status(
            || format!("{name}({:#x}, rank {rank}, root {root}, off {offset}, count {count}, {dtype}/{op})", b.id),
            st,
        );
    }

    /// A collective issued for every rank on distinct streams (so its barriers complete), or, with
    /// a small probability, for only some ranks (the tiny timeout turns it into TIMEOUT); then
    /// usually a synchronize of every rank.
    pub(super) fn collective_round(&mut self) {
        let (i, h) = self.buf(3);
        let Some(bi) = i else {
            let args = self.collective_args(2, 4096);
            let rank = self.rank(2);
            let s = self.stream();
            return self.issue(h, rank, args, s);
        };
        let (ti, bytes) = {
            let b = self.m.bufs[bi].as_ref().unwrap();
            (b.team, b.bytes)
        };
        let (team, n) = {
            let t = self.m.teams[ti].as_ref().unwrap();
            (t.handle, t.size)
        };
        let args = self.collective_args(n as usize, bytes);
        let partial = n > 1 && self.rng.below(1000) < 5;
        // Each team's collectives are ordered on the team's own streams (collectives of one team
        // running concurrently on other streams race on its barriers, on a GPU too): rarely not.
        let base = if self.rng.pct(99) { 32 * (ti % 64) } else { self.rng.pick(&[0usize, 4096]) };
        let streams: Vec<mcast_stream_t> = (0..n as usize).map(|r| (base + r + 1) as mcast_stream_t).collect();
        for r in 0..n {
            if partial && self.rng.pct(50) {
                continue;
            }
            self.issue(h, r, args, streams[r as usize]);
        }
        if partial {
            self.stats.rounds_partial += 1;
        } else {
            self.stats.rounds_complete += 1;
        }
        if self.rng.pct(80) {
            for r in 0..n {
                let s = mcast_synchronize(team, r, streams[r as usize]);
                let s = self.status(|| format!("mcast_synchronize({:#x}, {r})", team.id), s);
                // 1: a rank's call of a round was refused after other ranks had issued theirs,
                // which fails the team with INVALID_ARGUMENT (API.md, one-process teams).
                self.check(s.0 == 0 || s.0 == 1 || s.0 == 9, || format!("synchronize of a live team gave {}", s.0));
            }
        }
    }

    /// One collective call with arbitrary arguments (usually refused; when accepted on a team of
    /// more than one rank it is a rank that never arrives for its peers).
    pub(super) fn collective_single(&mut self) {
        let (i, h) = self.buf(20);
        let (n, bytes) = i.map_or((2, 4096), |i| {
            let b = self.m.bufs[i].as_ref().unwrap();
            (self.m.teams[b.team].as_ref().unwrap().size, b.bytes)
        });
        let mut args = self.collective_args(n as usize, bytes);
        // A valid call on a team of several ranks is a rank that never arrives: every wait on
        // the team then lasts timeout_ms, so keep those rare.
        if self.rng.pct(if n > 1 { 98 } else { 70 }) {
            // Make it invalid one way or another (count 0 is a valid no-op).
            match (self.rng.below(3), args.0) {
                (0, _) => args.2 = 0,
                (1, 1 | 2) => args.3 = self.rng.pick(&[8, 99, u32::MAX]),
                (1, 0) => args.5 = n,
                (2, 1 | 2) => args.4 = self.rng.pick(&[3, 99, u32::MAX]),
                _ => args.1 = bytes + 1,
            }
        }
        let rank = self.rank(n);
        let s = self.stream();
        if self.rng.pct(20) {
            // Out of place into another (perhaps foreign, stale or zero) buffer: mostly refused.
            let (_, other) = self.buf(20);
            let (kind, offset, count, dtype, op, root) = args;
            let (d, o) = (mcast_dtype_t(dtype), mcast_op_t(op));
            let recv_offset = self.size_near(bytes);
            let st = match kind {
                0 => mcast_broadcast_into(h, offset, other, recv_offset, rank, root, count, s),
                1 => mcast_all_reduce_into(h, offset, other, recv_offset, rank, count, d, o, s),
                2 => mcast_reduce_scatter_into(h, offset, other, recv_offset, rank, count, d, o, s),
                _ => mcast_all_gather_into(h, offset, other, recv_offset, rank, count, s),
            };
            let name =
                ["mcast_broadcast_into", "mcast_all_reduce_into", "mcast_reduce_scatter_into", "mcast_all_gather_into"]
                    [kind as usize];
            self.status(
                || {
                    format!(
                        "{name}({:#x} -> {:#x}, rank {rank}, off {offset} -> {recv_offset}, count {count})",
                        h.id, other.id
                    )
                },
                st,
            );
            return;
        }
        self.issue(h, rank, args, s);
    }

    pub(super) fn synchronize(&mut self) {
        let (i, h) = self.team(20);
        let n = i.map_or(2, |i| self.m.teams[i].as_ref().unwrap().size);
        let rank = self.rank(n);
        let s = self.stream();
        let st = mcast_synchronize(h, rank, s);
        self.status(|| format!("mcast_synchronize({:#x}, {rank})", h.id), st);
    }

    pub(super) fn misc(&mut self) {
        match self.rng.below(3) {
            0 => {
                let v = self.rng.pick(&[0u32, 5, 10, 11, 99, u32::MAX]);
                let p = mcast_status_string(mcast_status_t(v));
                self.stats.calls += 1;
                // SAFETY: static NUL-terminated string.
                let name = unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("");
                self.check(name.starts_with("MCAST_"), || format!("status string {name:?}"));
            }
            1 => {
                // SAFETY: NULL is skipped.
                unsafe { mcast_config_init(std::ptr::null_mut()) };
                self.stats.calls += 1;
            }
            _ => {
                let p = mcast_last_error();
                self.stats.calls += 1;
                self.check(!p.is_null(), || "mcast_last_error returned NULL".into());
            }
        }
    }
}
