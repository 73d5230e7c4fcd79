//! The exchange: every rank's labelled part gathered at the hub and sent back to all, with the
//! descriptors passed among the ranks of one host; `agree` and `broadcast` over it.

use std::os::fd::{AsRawFd, RawFd};

use super::tcp::kind;
use super::{timeout_err, BootError, Bootstrap, Deadline, Dec, Enc, Kind, Part, Status};

/// How long a wait for a frame polls before it sleeps on the condition variable: the queue, and
/// the peer's socket, whose frame it then takes itself ([`Bootstrap::pump`]). A frame that comes
/// within it costs no thread's wake-up (the exchanges between calls, e.g. a team across NVLink
/// domains comparing each call, wait tens of microseconds).
const SPIN: std::time::Duration = std::time::Duration::from_micros(100);

impl Bootstrap {
    /// Waits for the next frame from `src`: `Err` on a failure of the team (abort, a rank's
    /// timeout), close or deadline.
    fn next_frame(&self, src: usize, label: &str, deadline: Deadline) -> Result<(u8, Vec<u8>), BootError> {
        let spin_until = std::time::Instant::now() + SPIN;
        let mut q = self.shared.q.lock();
        loop {
            if let Some(e) = self.failed_err() {
                return Err(e);
            }
            if let Some(f) = q.frames[src].pop_front() {
                q.bytes[src] -= f.1.len();
                return Ok(f);
            }
            if q.closed[src] {
                return Err(timeout_err(format!(
                    "rank {}: rank {src} closed its connection at \"{label}\" (the process exited or was killed)",
                    self.rank
                )));
            }
            if std::time::Instant::now() < spin_until {
                parking_lot::MutexGuard::unlocked(&mut q, || {
                    if !self.pump(src) {
                        std::thread::yield_now();
                    }
                });
                continue;
            }
            match deadline.0 {
                None => self.shared.cv.wait(&mut q),
                Some(t) => {
                    if self.shared.cv.wait_until(&mut q, t).timed_out() && q.frames[src].is_empty() {
                        if let Some(e) = self.failed_err() {
                            return Err(e);
                        }
                        return Err(timeout_err(format!(
                            "rank {}: rank {src} did not arrive within timeout_ms = {} ms at \"{label}\"",
                            self.rank, self.timeout_ms
                        )));
                    }
                }
            }
        }
    }

    /// All-gather: every rank contributes `status`, `bytes` and `fds` for the step `label`;
    /// returns every rank's part (descriptors only from ranks of this host; this rank's own
    /// part has none). When a rank reports a failure, the labels disagree, a rank does not
    /// arrive within `timeout_ms` or leaves, or the team is aborted, every rank gets an error
    /// (a rank's failure: [`Kind::Failed`] with its code, the message naming it) and the
    /// bootstrap is broken. This rank's own failure is returned as it is.
    pub fn allgather(&self, label: &str, status: Status, bytes: &[u8], fds: &[RawFd]) -> Result<Vec<Part>, BootError> {
        let mut broken = self.broken.lock();
        if let Some(e) = broken.as_ref() {
            let mut e = e.clone();
            e.message = format!("rank {}: the team's bootstrap failed earlier: {}", self.rank, e.message);
            return Err(e);
        }
        let own = status.clone();
        let result = self.exchange(label, status, bytes, fds);
        match (result, own) {
            (Ok(parts), _) => Ok(parts),
            (Err(e), Err((code, msg))) if e.kind != Kind::Aborted => {
                *broken = Some(e);
                Err(BootError::new(Kind::Failed(code), msg))
            }
            (Err(e), _) => {
                *broken = Some(e.clone());
                Err(e)
            }
        }
    }

    fn exchange(&self, label: &str, status: Status, bytes: &[u8], fds: &[RawFd]) -> Result<Vec<Part>, BootError> {
        if let Some(e) = self.failed_err() {
            return Err(e);
        }
        let deadline = Deadline::after(self.timeout_ms);
        let mut mine = Enc::default();
        mine.str(label);
        match &status {
            Ok(()) => mine.u32(0),
            Err((code, msg)) => mine.u32(1).u32(*code).str(msg),
        };
        mine.bytes(bytes).u32(fds.len() as u32);
        let raw: Vec<Vec<u8>> = if self.nranks == 1 {
            vec![mine.0]
        } else if self.rank == 0 {
            let mut raw = vec![mine.0];
            let mut failure = None;
            for q in 1..self.nranks {
                match self.next_frame(q, label, deadline) {
                    Ok((kind::EXCH, p)) => raw.push(p),
                    Ok((k, _)) => {
                        failure = Some(BootError::new(
                            Kind::Internal,
                            format!("rank 0: rank {q} sent a frame of kind {k} at \"{label}\""),
                        ));
                        break;
                    }
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
            #[cfg(test)]
            std::thread::sleep(std::time::Duration::from_millis(
                self.shared.hub_stall_ms.load(std::sync::atomic::Ordering::Relaxed),
            ));
            // A hub that comes back after its deadline (paused, starved) must not succeed
            // alone: the ranks waiting for its result have given up at theirs.
            if failure.is_none() && deadline.passed() {
                failure = Some(timeout_err(format!(
                    "rank 0: the exchange at \"{label}\" outlived timeout_ms = {} ms on rank 0 before it could send \
                     the result (the process was paused or starved); the other ranks gave up waiting, so it fails on \
                     every rank",
                    self.timeout_ms
                )));
            }
            if let Some(f) = failure {
                let mut e = Enc::default();
                e.u32(f.kind.code()).str(&f.message);
                for c in self.conns.iter().flatten() {
                    let _ = c.send(kind::FAIL, &e.0);
                }
                return Err(f);
            }
            let mut reply = Enc::default();
            reply.u32(self.nranks as u32);
            for p in &raw {
                reply.bytes(p);
            }
            for (q, c) in self.conns.iter().enumerate() {
                if let Some(c) = c {
                    if let Err(io) = c.send(kind::RESULT, &reply.0) {
                        let f = timeout_err(format!("rank 0: rank {q} closed its connection at \"{label}\" ({io})"));
                        let mut e = Enc::default();
                        e.u32(f.kind.code()).str(&f.message);
                        for c in self.conns.iter().flatten() {
                            let _ = c.send(kind::FAIL, &e.0);
                        }
                        return Err(f);
                    }
                }
            }
            raw
        } else {
            let hub = self.conns[0].as_ref().expect("connected to the hub");
            if let Err(io) = hub.send(kind::EXCH, &mine.0) {
                return Err(timeout_err(format!(
                    "rank {}: rank 0 closed its connection at \"{label}\" ({io})",
                    self.rank
                )));
            }
            match self.next_frame(0, label, deadline)? {
                (kind::RESULT, p) => {
                    let mut d = Dec(&p);
                    let n = d.u32()? as usize;
                    if n != self.nranks {
                        return Err(BootError::new(Kind::Internal, "a result of the wrong size"));
                    }
                    (0..n).map(|_| d.bytes()).collect::<Result<Vec<_>, _>>()?
                }
                (kind::FAIL, p) => {
                    let mut d = Dec(&p);
                    let k = Kind::from_code(d.u32()?);
                    let message = d.str()?;
                    if k == Kind::Aborted {
                        // The relayed abort may still be on its way: the hub's word is enough.
                        self.shared.set_aborted(&message);
                    }
                    return Err(BootError::new(k, message));
                }
                (k, _) => {
                    return Err(BootError::new(Kind::Internal, format!("rank 0 sent a frame of kind {k}")));
                }
            }
        };
        // Every rank decodes the same parts the same way.
        let mut parts = Vec::with_capacity(self.nranks);
        let mut counts = Vec::with_capacity(self.nranks);
        let mut first_err: Option<BootError> = None;
        for (q, msg) in raw.iter().enumerate() {
            let mut d = Dec(msg);
            let their_label = d.str()?;
            if their_label != label && first_err.is_none() {
                first_err = Some(BootError::new(
                    Kind::InvalidArgument,
                    format!(
                        "rank {}: the ranks disagree: rank {q} is at \"{their_label}\" while this rank is at \
                         \"{label}\"; every rank must make the same calls (buffer allocations and frees in the same \
                         order and sizes)",
                        self.rank
                    ),
                ));
            }
            if d.u32()? != 0 {
                let code = d.u32()?;
                let message = d.str()?;
                if first_err.is_none() {
                    first_err =
                        Some(BootError::new(Kind::Failed(code), format!("rank {q} failed at \"{label}\": {message}")));
                }
            }
            let b = d.bytes()?;
            counts.push(d.u32()? as usize);
            parts.push(Part { bytes: b, fds: Vec::new() });
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        if let Some(local) = &self.local {
            let local_counts: Vec<usize> = local.members.iter().map(|&m| counts[m]).collect();
            if local_counts.iter().sum::<usize>() > 0 {
                let got = local.allgather(fds, &local_counts, deadline, self.shared.wake.as_raw_fd());
                let got = match got {
                    Err(e) if e.kind == Kind::Aborted => return Err(self.failed_err().unwrap_or(e)),
                    x => x?,
                };
                for (i, f) in got.into_iter().enumerate() {
                    parts[local.members[i]].fds = f;
                }
            }
        }
        Ok(parts)
    }

    /// Every rank reports `status`; all succeed together or all fail with the first failure.
    pub fn agree(&self, label: &str, status: Status) -> Result<(), BootError> {
        self.allgather(label, status, &[], &[]).map(|_| ())
    }

    /// Rank `root`'s `bytes` (other ranks' are ignored), on every rank.
    pub fn broadcast(&self, label: &str, root: usize, bytes: &[u8]) -> Result<Vec<u8>, BootError> {
        let mine = if self.rank == root { bytes } else { &[] };
        let mut parts = self.allgather(label, Ok(()), mine, &[])?;
        Ok(std::mem::take(&mut parts[root].bytes))
    }
}
