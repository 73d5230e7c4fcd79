//! Reading a team's connections. A reader thread per connection opens its frames and queues
//! them; an abort or a failure is passed on at once (the hub to every other rank), and a frame
//! that does not open or a peer that breaks a cap fails the team. A rank waiting in an exchange
//! for a frame from one peer may take that frame itself ([`Bootstrap::pump`]) once it lies
//! whole on the socket, through the same steps ([`take`]), sparing the reader thread's wake-up
//! on the exchange's path (tens of microseconds on a server). The connection's [`tcp::Opener`]
//! is locked across reading a frame and queueing it, so frames are queued in their order
//! whoever reads them.

use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use super::tcp::{self, kind};
use super::{Bootstrap, Conn, Dec, Enc, Kind, Shared, QUEUE_BYTES, QUEUE_FRAMES};

impl Conn {
    /// Copies up to `buf.len()` bytes waiting on the socket without taking them; recv(2)'s
    /// result (0: closed; negative: nothing yet, or an error). Never blocks.
    fn peek(&self, buf: &mut [u8]) -> isize {
        // SAFETY: recv(2) into `buf`, ours; MSG_PEEK leaves the bytes on the socket.
        unsafe {
            libc::recv(self.stream.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_PEEK | libc::MSG_DONTWAIT)
        }
    }

    /// True when the socket holds nothing yet (neither bytes, nor a close, nor an error for a
    /// read to report).
    fn nothing_yet(&self) -> bool {
        self.peek(&mut [0u8; 1]) < 0
            && matches!(
                std::io::Error::last_os_error().kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            )
    }

    /// True when a whole frame lies on the socket (its head and every byte the head counts),
    /// so that reading it cannot block. A frame over the cap is left to the reader thread.
    fn frame_ready(&self) -> bool {
        let mut head = [0u8; 5];
        if self.peek(&mut head) != 5 {
            return false;
        }
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if len > tcp::MAX_FRAME + tcp::TAG {
            return false;
        }
        let mut queued: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int, ours.
        let ok = unsafe { libc::ioctl(self.stream.as_raw_fd(), libc::FIONREAD, &mut queued) } == 0;
        ok && queued >= 0 && queued as usize >= 5 + len
    }

    /// Waits until the socket is readable (bytes, a close, or a shutdown of this end).
    fn wait_readable(&self) {
        let mut p = libc::pollfd { fd: self.stream.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: poll(2) on one pollfd we own; EINTR just returns, and the caller polls again.
        unsafe { libc::poll(&mut p, 1, -1) };
    }
}

/// Takes the outcome of reading one frame from `src` on rank `me` (`conns`: the rank's
/// connections, only the hub's own several): a data frame is queued for the exchanges, an abort
/// or a failure recorded and (by the hub) passed on to every other rank; a frame that did not
/// open, broke a cap or ended the connection fails the team. False when the connection is done
/// with (nothing more is to be read from it).
fn take(
    shared: &Shared,
    conns: &[Option<Arc<Conn>>],
    me: usize,
    src: usize,
    read: Result<(u8, Vec<u8>), tcp::FrameError>,
) -> bool {
    let failed = match read {
        Ok((k @ (kind::ABORT | kind::FAILED), p)) => {
            let mut d = Dec(&p);
            let what = if k == kind::ABORT { Kind::Aborted } else { d.u32().map_or(Kind::Internal, Kind::from_code) };
            let reason = d.str().unwrap_or_default();
            if shared.set_failed(what, &reason) && me == 0 {
                for (q, other) in conns.iter().enumerate() {
                    if let (Some(o), true) = (other, q != src) {
                        let _ = o.send(k, &p);
                    }
                }
            }
            return true;
        }
        Ok((k, p)) => {
            let mut q = shared.q.lock();
            if q.frames[src].len() < QUEUE_FRAMES && q.bytes[src] + p.len() <= QUEUE_BYTES {
                q.bytes[src] += p.len();
                q.frames[src].push_back((k, p));
                shared.cv.notify_all();
                return true;
            }
            format!(
                "rank {me}: rank {src} sent more than {QUEUE_FRAMES} frames or {QUEUE_BYTES} bytes that no exchange \
                 asked for; its connection is dropped"
            )
        }
        Err(tcp::FrameError::Auth) => format!(
            "rank {me}: the bootstrap connection from rank {src} failed authentication (a frame was altered, \
             replayed, reordered or injected on the network); the connection is dropped"
        ),
        Err(tcp::FrameError::TooLarge(n)) => format!(
            "rank {me}: rank {src} sent a frame of {n} bytes, above the cap of {} bytes; the connection is dropped",
            tcp::MAX_FRAME
        ),
        Err(_) => {
            let mut q = shared.q.lock();
            q.closed[src] = true;
            shared.cv.notify_all();
            return false;
        }
    };
    tracing::warn!("{failed}");
    // The failure first, then the closed connection: a wait that wakes in between must report
    // the authentication failure, not a peer that left.
    let news = shared.set_failed(Kind::Timeout, &failed);
    shared.q.lock().closed[src] = true;
    if news {
        let mut e = Enc::default();
        e.u32(Kind::Timeout.code()).str(&failed);
        // Every peer hears it: the hub tells every rank, a rank tells the hub. The direction
        // towards the peer still works when only this one failed.
        for o in conns.iter().flatten() {
            let _ = o.send(kind::FAILED, &e.0);
        }
    }
    false
}

impl Bootstrap {
    /// One reader thread per connection (see the module doc).
    pub(super) fn start_readers(&mut self) {
        let mut readers = self.readers.lock();
        for (src, c) in self.conns.iter().enumerate() {
            let Some(c) = c.clone() else { continue };
            let (shared, conns, me) = (self.shared.clone(), self.conns.clone(), self.rank);
            let t = std::thread::Builder::new().name("mcast-boot-rx".into()).spawn(move || loop {
                c.wait_readable();
                #[cfg(test)]
                if shared.readers_paused.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    continue;
                }
                let mut rx = c.rx.lock();
                // A rank in an exchange may have taken what woke this thread.
                if c.nothing_yet() {
                    continue;
                }
                let read = rx.open(&mut &c.stream, tcp::MAX_FRAME);
                if !take(&shared, &conns, me, src, read) {
                    break;
                }
            });
            if let Ok(t) = t {
                readers.push(t);
            }
        }
    }

    /// Takes the next frame from `src` here, when it lies whole on the socket and no reader is
    /// reading the connection; true when a frame was taken. Never blocks.
    pub(super) fn pump(&self, src: usize) -> bool {
        let Some(c) = self.conns.get(src).and_then(Option::as_ref) else { return false };
        let Some(mut rx) = c.rx.try_lock() else { return false };
        if !c.frame_ready() {
            return false;
        }
        let read = rx.open(&mut &c.stream, tcp::MAX_FRAME);
        if !take(&self.shared, &self.conns, self.rank, src, read) {
            // The reader thread stops at the end of the stream.
            let _ = c.stream.shutdown(Shutdown::Read);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    use super::super::tests::team;
    use super::kind;

    /// With rank 1's reader thread standing aside, rank 1 takes the frames rank 0 sends it
    /// itself, each once it lies whole on the socket (one of them larger than a loopback
    /// segment), queued in the order they were sent; with nothing on the socket it takes
    /// nothing and does not block.
    #[test]
    fn a_waiting_rank_takes_whole_frames_in_order() {
        let boots = team(2, |_| "one".into(), 30_000);
        let (hub, b) = (&boots[0], &boots[1]);
        b.shared.readers_paused.store(true, Ordering::Relaxed);
        assert!(!b.pump(0), "nothing was sent");
        let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let sent = [b"one".to_vec(), big, b"three".to_vec()];
        let to_b = hub.conns[1].as_ref().expect("the hub's connection to rank 1");
        for f in &sent {
            to_b.send(kind::EXCH, f).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut taken = 0;
        while taken < sent.len() && Instant::now() < deadline {
            if b.pump(0) {
                taken += 1;
            }
        }
        assert_eq!(taken, sent.len(), "frames taken by rank 1");
        assert!(!b.pump(0), "every frame was taken once");
        let q = b.shared.q.lock();
        let queued: Vec<&Vec<u8>> = q.frames[0].iter().map(|(_, p)| p).collect();
        assert_eq!(queued, sent.iter().collect::<Vec<_>>());
        drop(q);
        b.shared.readers_paused.store(false, Ordering::Relaxed);
    }
}
