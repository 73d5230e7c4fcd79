//! A seeded random-sequence fuzzer of the C API (the `extern "C"` functions of `mcast::capi`,
//! called as a C program would) on the simulator: contexts with small random configs, teams,
//! buffers, pointers, reads and writes, collectives issued for every rank (so the barriers
//! complete) or deliberately for only some (a tiny `timeout_ms` turns them into
//! `MCAST_ERROR_TIMEOUT`), synchronize, leak reports; with random ranks, roots, offsets, sizes,
//! unknown enum integers, zero, stale, foreign, random and double-freed handles, and NULL pointers.
//!
//! Checked on every call: the status is one of API.md's 0..=11, never
//! `MCAST_ERROR_INTERNAL` (a caught panic or broken invariant) and never `MCAST_ERROR_ABORTED`
//! (the fuzzer aborts no team: an aborted status is a team state gone wrong), a failure leaves a message naming
//! the function, out-parameters are untouched on failure. After every `mcast_context_destroy`:
//! the simulator's ledger is empty.
//!
//! `MCAST_FUZZ_CALLS` (default 100000) sets how many calls run; `MCAST_FUZZ_SEED` the seed;
//! `MCAST_FUZZ_SECONDS` (default 600) a time limit after which the run stops early (reported).
//! The figures (calls, sequences, statuses) are printed: run with `--nocapture` to see them.
//!
//! This file holds the model, the checks and the sequence; the calls by kind are in
//! `choices.rs` (the handles and arguments it picks), `objects.rs` (contexts, teams, buffers) and
//! `collectives.rs`.

mod choices;
mod collectives;
#[path = "../common/mod.rs"]
mod common;
mod objects;

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::last_error;
use mcast::capi::buffer::*;
use mcast::capi::collective::*;
use mcast::capi::config::*;
use mcast::capi::context::*;
use mcast::capi::device::*;
use mcast::capi::status::*;
use mcast::capi::team::*;
use mcast::runtime::context::Context;
use mcast::runtime::handles;

const MIB: usize = 1 << 20;
const STATUSES: usize = 12;
const INTERNAL: u32 = 10;
const ABORTED: u32 = 11;

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    /// True with probability `p` percent.
    fn pct(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

struct Ctx {
    handle: mcast_context_t,
    runtime: Arc<Context>,
    devices: i32,
}

struct Team {
    handle: mcast_team_t,
    ctx: usize,
    size: i32,
}

struct Buf {
    handle: mcast_buffer_t,
    team: usize,
    bytes: usize,
}

/// The fuzzer's model of what is live, plus the dead handles it replays.
#[derive(Default)]
struct Model {
    ctxs: Vec<Option<Ctx>>,
    teams: Vec<Option<Team>>,
    bufs: Vec<Option<Buf>>,
    dead: Vec<u64>,
}

#[derive(Default)]
struct Stats {
    calls: u64,
    sequences: u64,
    statuses: [u64; STATUSES],
    contexts: u64,
    teams: u64,
    buffers: u64,
    rounds_complete: u64,
    rounds_partial: u64,
}

struct Fuzzer {
    rng: Rng,
    m: Model,
    stats: Stats,
    trace: VecDeque<String>,
    failures: Vec<String>,
}

fn live<T>(xs: &[Option<T>]) -> Vec<usize> {
    xs.iter().enumerate().filter(|(_, x)| x.is_some()).map(|(i, _)| i).collect()
}

impl Fuzzer {
    /// Records one call's status and checks it.
    fn status(&mut self, what: impl FnOnce() -> String, s: mcast_status_t) -> mcast_status_t {
        self.stats.calls += 1;
        let desc = what();
        if self.trace.len() == 40 {
            self.trace.pop_front();
        }
        self.trace.push_back(format!("{desc} -> {}", s.0));
        if (s.0 as usize) < STATUSES {
            self.stats.statuses[s.0 as usize] += 1;
        } else {
            self.fail(format!("{desc}: status {} is not one of API.md's 0..=11", s.0));
        }
        if s.0 == ABORTED {
            self.fail(format!("{desc}: MCAST_ERROR_ABORTED, but no team was aborted: {}", last_error()));
        }
        if s.0 == INTERNAL {
            self.fail(format!("{desc}: MCAST_ERROR_INTERNAL: {}", last_error()));
        }
        if s.0 != 0 {
            let msg = last_error();
            let func = desc.split('(').next().unwrap_or("");
            if !msg.starts_with(func) {
                self.fail(format!("{desc}: status {} but last error {msg:?} does not name {func}", s.0));
            }
        }
        s
    }

    fn fail(&mut self, what: String) {
        let trace: Vec<String> = self.trace.iter().cloned().collect();
        self.failures.push(format!("{what}\n  last calls:\n    {}", trace.join("\n    ")));
    }

    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            let w = what();
            self.fail(w);
        }
    }

    fn step(&mut self) {
        match self.rng.below(100) {
            0..=2 => self.context_create(),
            3 => self.context_destroy(),
            4..=9 => self.context_queries(),
            10..=17 => self.team_create(),
            18..=22 => self.team_destroy(),
            23..=25 => self.team_info(),
            26..=37 => self.buffer_alloc(),
            38..=45 => self.buffer_free(),
            46..=59 => self.buffer_queries(),
            60..=79 => self.collective_round(),
            80..=89 => self.collective_single(),
            90..=94 => self.synchronize(),
            _ => self.misc(),
        }
    }

    /// One sequence: a context, then `len` random steps, then (usually) an orderly teardown or
    /// a context destroy that releases whatever is left.
    fn sequence(&mut self, len: u64) {
        self.m = Model::default();
        self.context_create();
        for _ in 0..len {
            if self.m.ctxs.iter().all(Option::is_none) && self.rng.pct(50) {
                self.context_create();
            }
            self.step();
        }
        if self.rng.pct(50) {
            // Orderly: buffers, then teams, then contexts.
            for i in live(&self.m.bufs) {
                let h = self.m.bufs[i].take().unwrap().handle;
                let s = mcast_buffer_free(h);
                self.status(|| format!("mcast_buffer_free({:#x}) [teardown]", h.id), s);
            }
            for i in live(&self.m.teams) {
                let h = self.m.teams[i].take().unwrap().handle;
                let s = mcast_team_destroy(h);
                self.status(|| format!("mcast_team_destroy({:#x}) [teardown]", h.id), s);
            }
        }
        for i in live(&self.m.ctxs) {
            self.destroy_context_at(i);
        }
        self.stats.sequences += 1;
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn fuzz_c_api_sequences() {
    // Only this test runs in this binary: set the environment a NULL config reads, and keep the
    // warn-level leak reports of deliberately leaky sequences off the output.
    std::env::set_var("MCAST_BACKEND", "sim");
    std::env::set_var("MCAST_TIMEOUT_MS", "50");
    std::env::set_var("MCAST_SIM_DEVICE_MEMORY", "64M");
    std::env::set_var("MCAST_RETRY_BACKOFF_MS", "0");
    if std::env::var_os("MCAST_LOG").is_none() {
        std::env::set_var("MCAST_LOG", "off");
    }
    let target = env_u64("MCAST_FUZZ_CALLS", 100_000);
    let seed = env_u64("MCAST_FUZZ_SEED", 0x6D63_6173_7421);
    let limit = Duration::from_secs(env_u64("MCAST_FUZZ_SECONDS", 600));
    let mut f = Fuzzer {
        rng: Rng(seed),
        m: Model::default(),
        stats: Stats::default(),
        trace: VecDeque::new(),
        failures: Vec::new(),
    };
    let start = Instant::now();
    let mut stopped_early = false;
    while f.stats.calls < target {
        if start.elapsed() > limit {
            stopped_early = true;
            break;
        }
        let seq_seed = f.rng.next();
        f.rng = Rng(seq_seed);
        let len = 20 + f.rng.below(400);
        let before = f.failures.len();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f.sequence(len)));
        if result.is_err() {
            f.fail(format!("a panic escaped (sequence seed {seq_seed:#x})"));
            // The model may be inconsistent: destroy what it knows.
            for c in f.m.ctxs.iter().flatten() {
                mcast_context_destroy(c.handle);
            }
        }
        if f.failures.len() > before {
            eprintln!("sequence seed {seq_seed:#x} (MCAST_FUZZ_SEED={seed:#x}) failed");
            if f.failures.len() > 5 {
                break;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let s = &f.stats;
    let names = [
        "SUCCESS",
        "INVALID_ARGUMENT",
        "INVALID_HANDLE",
        "OUT_OF_MEMORY",
        "NOT_SUPPORTED",
        "DRIVER_UNAVAILABLE",
        "DRIVER",
        "SYSTEM_NOT_READY",
        "IN_USE",
        "TIMEOUT",
        "INTERNAL",
    ];
    let hist: Vec<String> =
        names.iter().zip(s.statuses.iter()).filter(|(_, &c)| c > 0).map(|(n, c)| format!("{n} {c}")).collect();
    println!(
        "fuzz_capi: {} calls, {} sequences in {secs:.1} s (seed {seed:#x}); {} contexts, {} teams, {} buffers \
         created; {} complete and {} partial collective rounds; statuses: {}",
        s.calls,
        s.sequences,
        s.contexts,
        s.teams,
        s.buffers,
        s.rounds_complete,
        s.rounds_partial,
        hist.join(", ")
    );
    assert!(f.failures.is_empty(), "{} failure(s):\n{}", f.failures.len(), f.failures.join("\n\n"));
    assert!(!stopped_early, "stopped after {secs:.0} s at {} of {target} calls (MCAST_FUZZ_SECONDS)", s.calls);
    assert!(s.calls >= target);
}
