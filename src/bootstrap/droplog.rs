//! Rate-limited warnings about connections a listener closed: the first drop is logged at once,
//! later ones are counted by reason and logged as one line per interval. A stranger who opens
//! thousands of connections gets a few lines into the log, not thousands.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Time between two warning lines of one listener.
pub const INTERVAL: Duration = Duration::from_secs(5);

/// The drops of one listener.
pub struct DropLog {
    what: String,
    state: Mutex<State>,
}

struct State {
    /// When the last line was written (`None`: never).
    logged: Option<Instant>,
    /// Drops since the last line, by reason, in first-seen order.
    counts: Vec<(&'static str, u64)>,
    /// What the last drop said (peer, error).
    last: String,
}

impl DropLog {
    /// The drops of the listener `what` (e.g. "bootstrap root at 10.0.0.1:4000").
    pub fn new(what: String) -> DropLog {
        DropLog { what, state: Mutex::new(State { logged: None, counts: Vec::new(), last: String::new() }) }
    }

    /// Counts one closed connection; `detail` says who and what went wrong.
    pub fn note(&self, reason: &'static str, detail: String) {
        let mut s = self.state.lock();
        match s.counts.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, n)) => *n += 1,
            None => s.counts.push((reason, 1)),
        }
        s.last = detail;
        if s.logged.is_none_or(|t| t.elapsed() >= INTERVAL) {
            self.emit(&mut s);
        }
    }

    /// Writes the pending counts when the interval has passed since the last line.
    pub fn flush_if_due(&self) {
        let mut s = self.state.lock();
        if !s.counts.is_empty() && s.logged.is_none_or(|t| t.elapsed() >= INTERVAL) {
            self.emit(&mut s);
        }
    }

    fn emit(&self, s: &mut State) {
        let counts: Vec<String> = s.counts.iter().map(|(r, n)| format!("{n} {r}")).collect();
        let since = match s.logged {
            Some(t) => format!(" in the last {:.1} s", t.elapsed().as_secs_f64()),
            None => String::new(),
        };
        let last = if s.last.is_empty() { String::new() } else { format!(" (last: {})", s.last) };
        tracing::warn!("{}: closed connection(s){since}: {}{last}", self.what, counts.join(", "));
        s.counts.clear();
        s.last.clear();
        s.logged = Some(Instant::now());
    }
}

impl Drop for DropLog {
    fn drop(&mut self) {
        let mut s = self.state.lock();
        if !s.counts.is_empty() {
            self.emit(&mut s);
        }
    }
}
