//! The exchange: every rank's labelled part gathered at the hub and sent back to all, with the
//! descriptors passed among the ranks of one host; `agree` and `broadcast` over it.

use std::os::fd::{AsRawFd, RawFd};
#[cfg(test)]
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::tcp::kind;
use super::{timeout_err, BootError, Bootstrap, Deadline, Dec, Enc, Kind, Part, Status};

/// How long a wait for a frame polls before it sleeps on the condition variable: the queue, and
/// the peer's socket, whose frame it then takes itself ([`Bootstrap::pump`]). A frame that comes
/// within it costs no thread's wake-up (the exchanges between calls, e.g. a team across NVLink
/// domains comparing each call, wait tens of microseconds).
const SPIN: Duration = Duration::from_micros(100);

/// How long a rank at its deadline waits for its reader thread to finish queueing a frame it is
/// reading (one that lies on the socket), before it gives up the wait.
const LAST_LOOK: Duration = Duration::from_millis(100);

/// Where a rank stands in an exchange: named in messages, and the places where the tests pause
/// a rank (`pause_at`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// A member, before it sends its part.
    Send,
    /// A member waiting for the result (paused here, it resumes in the wait).
    Wait,
    /// The hub, with every part gathered, before it sends the result.
    Gathered,
    /// The hub, between sending the result to its first member and to the next.
    Results,
    /// Any rank, with the result decoded, before the descriptors and the confirm round.
    Decoded,
    /// The hub of a confirmed exchange waiting for the members' acknowledgements (paused
    /// here, it resumes in the wait).
    Acks,
    /// A member of a confirmed exchange waiting for the commit (paused here, it resumes in
    /// the wait).
    Commit,
    /// The hub, between sending the commit to its first member and to the next.
    Commits,
}

impl Step {
    /// The step's name in `MCAST_TEST_STOP_AT` (tests).
    #[cfg(test)]
    pub(super) fn name(self) -> &'static str {
        match self {
            Step::Send => "send",
            Step::Wait => "wait",
            Step::Gathered => "gathered",
            Step::Results => "results",
            Step::Decoded => "decoded",
            Step::Acks => "acks",
            Step::Commit => "commit",
            Step::Commits => "commits",
        }
    }

    /// What a rank waits for at this step, in messages.
    fn awaited(self) -> &'static str {
        match self {
            Step::Acks => "the acknowledgement",
            Step::Commit | Step::Commits => "the commit",
            _ => "the result",
        }
    }
}

/// Tests only: the variable that makes a process stop itself (SIGSTOP) once, at
/// `LABEL@STEP` ([`Step::name`]), for a parent that resumes it after the deadline.
#[cfg(test)]
pub(super) const STOP_AT_ENV: &str = "MCAST_TEST_STOP_AT";

/// Tests only: the labels of this process's exchanges, in order (a confirmed one marked with a
/// trailing `*`), so that a test can stop a rank at each of them.
#[cfg(test)]
pub(super) static LABELS: parking_lot::Mutex<Vec<String>> = parking_lot::Mutex::new(Vec::new());

impl Bootstrap {
    /// Tests only: pauses this rank at `step` of the exchange `label` when a test asked for it,
    /// as a stopped process is paused (its reader threads too): once for each pause queued in
    /// `Shared::pauses`, and the whole process once at `MCAST_TEST_STOP_AT`.
    #[cfg(test)]
    fn pause_at(&self, step: Step, label: &str) {
        let ms = {
            let mut p = self.shared.pauses.lock();
            p.iter().position(|&(s, _)| s == step).map(|i| p.remove(i).1)
        };
        if let Some(ms) = ms {
            self.shared.readers_paused.store(true, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(ms));
            self.shared.readers_paused.store(false, Ordering::SeqCst);
        }
        static STOPPED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if std::env::var(STOP_AT_ENV).is_ok_and(|v| v == format!("{label}@{}", step.name()))
            && !STOPPED.swap(true, Ordering::SeqCst)
        {
            // SAFETY: raise(3) stops this process until its parent sends SIGCONT.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
    }

    #[cfg(not(test))]
    #[inline(always)]
    fn pause_at(&self, _: Step, _: &str) {}

    /// Waits for the next frame from `src`: `Err` on a failure of the team (abort, a rank's
    /// timeout), close or deadline. At the deadline it looks once more at the socket: a frame
    /// that lies there (this process was paused or starved while it came) is taken, not lost
    /// to a timeout that the sender's other peers never see.
    fn next_frame(&self, src: usize, label: &str, deadline: Deadline, step: Step) -> Result<(u8, Vec<u8>), BootError> {
        let spin_until = Instant::now() + SPIN;
        if matches!(step, Step::Wait | Step::Acks | Step::Commit) {
            self.pause_at(step, label);
        }
        let mut q = self.shared.q.lock();
        let mut looked = false;
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
            if Instant::now() < spin_until {
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
                    if Instant::now() >= t || self.shared.cv.wait_until(&mut q, t).timed_out() {
                        if !looked && q.frames[src].is_empty() {
                            looked = true;
                            parking_lot::MutexGuard::unlocked(&mut q, || self.last_look(src));
                            continue;
                        }
                        if !q.frames[src].is_empty() {
                            continue;
                        }
                        if let Some(e) = self.failed_err() {
                            return Err(e);
                        }
                        return Err(timeout_err(format!(
                            "rank {}: {} did not arrive within timeout_ms = {} ms at \"{label}\"",
                            self.rank,
                            if matches!(step, Step::Wait | Step::Commit | Step::Acks) {
                                format!("{} from rank {src}", step.awaited())
                            } else {
                                format!("rank {src}")
                            },
                            self.timeout_ms
                        )));
                    }
                }
            }
        }
    }

    /// At a deadline: takes a frame from `src` that lies whole on the socket, after the reader
    /// thread, if it is reading one, queued it (at most [`LAST_LOOK`]).
    fn last_look(&self, src: usize) {
        let Some(c) = self.conns.get(src).and_then(Option::as_ref) else { return };
        let Some(rx) = c.rx.try_lock_for(LAST_LOOK) else { return };
        drop(rx);
        self.pump(src);
    }

    /// Tells every peer that this rank failed `label` at a point where others may have
    /// succeeded it (`e`: why), unless the team's failure is known already: the peers turn
    /// failed ([`Bootstrap::fail`]), their next exchange fails and [`Bootstrap::failure`] says
    /// why. Returns `e`.
    fn tell(&self, label: &str, e: BootError) -> BootError {
        if e.kind != Kind::Aborted && self.failure().is_none() {
            self.fail(
                e.kind,
                &format!(
                    "rank {} failed at \"{label}\" after the result may have reached other ranks, which fail with it: {}",
                    self.rank, e.message
                ),
            );
        }
        e
    }

    /// All-gather: every rank contributes `status`, `bytes` and `fds` for the step `label`;
    /// returns every rank's part (descriptors only from ranks of this host; this rank's own
    /// part has none). When a rank reports a failure, the labels disagree, a rank does not
    /// arrive within `timeout_ms` or leaves, or the team is aborted, every rank gets an error
    /// (a rank's failure: [`Kind::Failed`] with its code, the message naming it) and the
    /// bootstrap is broken. This rank's own failure is returned as it is.
    ///
    /// A rank that fails after the result may have gone out (it timed out waiting for it, or
    /// passing descriptors) tells every peer through the hub ([`Bootstrap::fail`]), so a rank
    /// that succeeded the exchange finds its bootstrap failed ([`Bootstrap::failure`], and its
    /// next exchange fails) once the hub relays it. [`Bootstrap::allgather_confirmed`] also
    /// makes the call's own outcome the same on every rank but in one case.
    pub fn allgather(&self, label: &str, status: Status, bytes: &[u8], fds: &[RawFd]) -> Result<Vec<Part>, BootError> {
        self.allgather_as(label, status, bytes, fds, false)
    }

    /// [`Bootstrap::allgather`] with a confirm round: every rank that has the result (and its
    /// descriptors) acknowledges it to the hub, and returns it only once the hub, holding every
    /// acknowledgement, commits. A rank that fails before the commit fails the exchange on
    /// every rank within `timeout_ms` of the result; the one case where a rank still returns
    /// success while another fails is a hub paused past `timeout_ms` between its commits to
    /// two ranks: the ranks committed then find their bootstrap failed once it runs again.
    /// One more round trip through the hub: for the agreements that end a team's formation or
    /// a split.
    pub fn allgather_confirmed(
        &self,
        label: &str,
        status: Status,
        bytes: &[u8],
        fds: &[RawFd],
    ) -> Result<Vec<Part>, BootError> {
        self.allgather_as(label, status, bytes, fds, true)
    }

    fn allgather_as(
        &self,
        label: &str,
        status: Status,
        bytes: &[u8],
        fds: &[RawFd],
        confirm: bool,
    ) -> Result<Vec<Part>, BootError> {
        let mut broken = self.broken.lock();
        if let Some(e) = broken.as_ref() {
            let mut e = e.clone();
            e.message = format!("rank {}: the team's bootstrap failed earlier: {}", self.rank, e.message);
            return Err(e);
        }
        let own = status.clone();
        let result = self.exchange(label, status, bytes, fds, confirm);
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

    /// The hub sends `k` with `payload` to every member in rank order, for `label` at `step`;
    /// a deadline passed before a send, or a member gone, fails the team on every rank (some
    /// may have the frame already).
    fn send_all(&self, k: u8, payload: &[u8], label: &str, step: Step, deadline: Deadline) -> Result<(), BootError> {
        let mut sent = 0;
        for (q, c) in self.conns.iter().enumerate() {
            let Some(c) = c else { continue };
            if sent == 1 {
                self.pause_at(step, label);
            }
            // A hub that comes back after its deadline (paused, starved) must not succeed
            // alone: the ranks waiting for it have given up at theirs.
            let failed = if deadline.passed() {
                Some(timeout_err(format!(
                    "rank 0: the exchange at \"{label}\" outlived timeout_ms = {} ms on rank 0 before it could send \
                     {} to rank {q} (the process was paused or starved); the ranks waiting for it gave up, so it \
                     fails on every rank",
                    self.timeout_ms,
                    step.awaited()
                )))
            } else {
                c.send(k, payload)
                    .err()
                    .map(|io| timeout_err(format!("rank 0: rank {q} closed its connection at \"{label}\" ({io})")))
            };
            if let Some(f) = failed {
                if sent == 0 && k == kind::RESULT {
                    // No member has a result: the exchange's own failure.
                    let mut e = Enc::default();
                    e.u32(f.kind.code()).str(&f.message);
                    for c in self.conns.iter().flatten() {
                        let _ = c.send(kind::FAIL, &e.0);
                    }
                    return Err(f);
                }
                return Err(self.tell(label, f));
            }
            sent += 1;
        }
        Ok(())
    }

    fn exchange(
        &self,
        label: &str,
        status: Status,
        bytes: &[u8],
        fds: &[RawFd],
        confirm: bool,
    ) -> Result<Vec<Part>, BootError> {
        #[cfg(test)]
        LABELS.lock().push(format!("{label}{}", if confirm { "*" } else { "" }));
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
        // The hub's deadline for the confirm round: timeout_ms from its results, which every
        // member's (from its acknowledgement, after its result came) follows.
        let mut commit_by = None;
        let raw: Vec<Vec<u8>> = if self.nranks == 1 {
            vec![mine.0]
        } else if self.rank == 0 {
            let mut raw = vec![mine.0];
            let mut failure = None;
            for q in 1..self.nranks {
                match self.next_frame(q, label, deadline, Step::Send) {
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
            self.pause_at(Step::Gathered, label);
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
            self.send_all(kind::RESULT, &reply.0, label, Step::Results, deadline)?;
            commit_by = Some(Deadline::after(self.timeout_ms));
            raw
        } else {
            self.pause_at(Step::Send, label);
            let hub = self.conns[0].as_ref().expect("connected to the hub");
            if let Err(io) = hub.send(kind::EXCH, &mine.0) {
                return Err(timeout_err(format!(
                    "rank {}: rank 0 closed its connection at \"{label}\" ({io})",
                    self.rank
                )));
            }
            let frame = self.next_frame(0, label, deadline, Step::Wait).map_err(|e| self.tell(label, e))?;
            match frame {
                (kind::RESULT, p) => {
                    let mut d = Dec(&p);
                    let n = d.u32()? as usize;
                    if n != self.nranks {
                        return Err(self.tell(label, BootError::new(Kind::Internal, "a result of the wrong size")));
                    }
                    (0..n).map(|_| d.bytes()).collect::<Result<Vec<_>, _>>().map_err(|e| self.tell(label, e))?
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
                    let e = BootError::new(Kind::Internal, format!("rank 0 sent a frame of kind {k}"));
                    return Err(self.tell(label, e));
                }
            }
        };
        self.pause_at(Step::Decoded, label);
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
                    x => x.map_err(|e| self.tell(label, e))?,
                };
                for (i, f) in got.into_iter().enumerate() {
                    parts[local.members[i]].fds = f;
                }
            }
        }
        if confirm && self.nranks > 1 {
            self.confirm(label, commit_by)?;
        }
        Ok(parts)
    }

    /// The confirm round of [`Bootstrap::allgather_confirmed`], once this rank holds the
    /// result: members acknowledge it to the hub, the hub commits once it holds every
    /// acknowledgement. Its own deadline: `timeout_ms` from the results (the hub's
    /// `commit_by`, set when it sent them) or from the acknowledgement (a member's), so that a
    /// hub commits only while every member still waits for it.
    fn confirm(&self, label: &str, commit_by: Option<Deadline>) -> Result<(), BootError> {
        let deadline = commit_by.unwrap_or_else(|| Deadline::after(self.timeout_ms));
        if self.rank == 0 {
            for q in 1..self.nranks {
                match self.next_frame(q, label, deadline, Step::Acks) {
                    Ok((kind::ACK, _)) => {}
                    Ok((k, _)) => {
                        let e = BootError::new(
                            Kind::Internal,
                            format!("rank 0: rank {q} sent a frame of kind {k} at \"{label}\" for its acknowledgement"),
                        );
                        return Err(self.tell(label, e));
                    }
                    Err(e) => return Err(self.tell(label, e)),
                }
            }
            return self.send_all(kind::COMMIT, &[], label, Step::Commits, deadline);
        }
        let hub = self.conns[0].as_ref().expect("connected to the hub");
        if let Err(io) = hub.send(kind::ACK, &[]) {
            let e = timeout_err(format!("rank {}: rank 0 closed its connection at \"{label}\" ({io})", self.rank));
            return Err(self.tell(label, e));
        }
        match self.next_frame(0, label, deadline, Step::Commit) {
            Ok((kind::COMMIT, _)) => Ok(()),
            Ok((k, _)) => {
                let e = BootError::new(
                    Kind::Internal,
                    format!("rank {}: rank 0 sent a frame of kind {k} at \"{label}\" for its commit", self.rank),
                );
                Err(self.tell(label, e))
            }
            Err(e) => Err(self.tell(label, e)),
        }
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
