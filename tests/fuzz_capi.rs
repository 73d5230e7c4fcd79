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

mod common;

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

    // ---- handles: live, zero, stale, foreign, random ----

    fn is_live_id(&self, id: u64) -> bool {
        self.m.ctxs.iter().flatten().any(|c| c.handle.id == id)
            || self.m.teams.iter().flatten().any(|t| t.handle.id == id)
            || self.m.bufs.iter().flatten().any(|b| b.handle.id == id)
    }

    /// A handle id that is not live as `kind` (1 context, 2 team, 3 buffer): zero, stale
    /// (destroyed or freed earlier: double destroy/free), foreign (a live one of another kind),
    /// random, or forged with the right kind bits.
    fn any_id(&mut self, kind: u64) -> u64 {
        let id = self.any_id_raw(kind);
        if id >> 56 == kind && self.is_live_id(id) {
            u64::MAX
        } else {
            id
        }
    }

    fn any_id_raw(&mut self, kind: u64) -> u64 {
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
    fn ctx(&mut self, bad_pct: u64) -> (Option<usize>, mcast_context_t) {
        let l = live(&self.m.ctxs);
        if l.is_empty() || self.rng.pct(bad_pct) {
            return (None, mcast_context_t { id: self.any_id(1) });
        }
        let i = self.rng.pick(&l);
        (Some(i), self.m.ctxs[i].as_ref().unwrap().handle)
    }

    fn team(&mut self, bad_pct: u64) -> (Option<usize>, mcast_team_t) {
        let l = live(&self.m.teams);
        if l.is_empty() || self.rng.pct(bad_pct) {
            return (None, mcast_team_t { id: self.any_id(2) });
        }
        let i = self.rng.pick(&l);
        (Some(i), self.m.teams[i].as_ref().unwrap().handle)
    }

    fn buf(&mut self, bad_pct: u64) -> (Option<usize>, mcast_buffer_t) {
        let l = live(&self.m.bufs);
        if l.is_empty() || self.rng.pct(bad_pct) {
            return (None, mcast_buffer_t { id: self.any_id(3) });
        }
        let i = self.rng.pick(&l);
        (Some(i), self.m.bufs[i].as_ref().unwrap().handle)
    }

    /// A rank for a team of `n`: mostly valid, sometimes out of range.
    fn rank(&mut self, n: i32) -> c_int {
        if self.rng.pct(90) {
            self.rng.below(n.max(1) as u64) as c_int
        } else {
            self.rng.pick(&[-1, n, n + 1, i32::MIN, i32::MAX, 16, -100])
        }
    }

    fn size_near(&mut self, limit: usize) -> usize {
        match self.rng.below(10) {
            0 => 0,
            1 => limit,
            2 => limit + 1,
            3 => usize::MAX,
            4 => usize::MAX / 2,
            _ => self.rng.below(limit as u64 + 1) as usize,
        }
    }

    fn stream(&mut self) -> mcast_stream_t {
        self.rng.below(6) as usize as mcast_stream_t
    }

    // ---- contexts ----

    fn context_create(&mut self) {
        if live(&self.m.ctxs).len() >= 3 {
            return self.context_destroy();
        }
        let mut c = std::mem::MaybeUninit::<mcast_config_t>::uninit();
        // SAFETY: a valid pointer.
        unsafe { mcast_config_init(c.as_mut_ptr()) };
        // SAFETY: mcast_config_init wrote every field.
        let mut c = unsafe { c.assume_init() };
        c.backend = mcast_backend_t(2);
        c.multicast = mcast_multicast_t(self.rng.pick(&[0, 0, 0, 1, 1, 2]));
        c.sim_devices = self.rng.pick(&[1, 2, 2, 3, 4, 4]);
        c.sim_device_memory = self.rng.pick(&[8u64, 16, 32, 64]) << 20;
        c.sim_multicast_slots = self.rng.pick(&[1, 2, 3, 8, 128]);
        c.sim_multicast_supported = u32::from(self.rng.pct(85));
        c.timeout_ms = self.rng.pick(&[20, 20, 50]);
        c.oom_retries = self.rng.pick(&[0, 0, 1, 2]);
        c.retry_backoff_ms = self.rng.pick(&[0, 1]);
        let mut null_out = false;
        let mut null_config = false;
        match self.rng.below(20) {
            0 => c.struct_size = self.rng.pick(&[0, 4, 8]),
            1 => c.backend.0 = self.rng.pick(&[3, 99, u32::MAX]),
            2 => c.multicast.0 = self.rng.pick(&[3, 99, u32::MAX]),
            3 => c.sim_devices = self.rng.pick(&[0, 73, 1000, u32::MAX]),
            4 => c.sim_device_memory = self.rng.pick(&[0, 1, u64::MAX]),
            5 => c.sim_multicast_slots = 0,
            6 => null_out = true,
            7 => null_config = true, // the environment: MCAST_BACKEND=sim, set by the test
            _ => {}
        }
        let mut out = mcast_context_t { id: 0xDEAD };
        let cfg_ptr = if null_config { std::ptr::null() } else { &c as *const _ };
        let out_ptr = if null_out { std::ptr::null_mut() } else { &mut out as *mut _ };
        // SAFETY: valid or NULL pointers.
        let s = unsafe { mcast_context_create(cfg_ptr, out_ptr) };
        let s = self.status(
            || {
                format!(
                    "mcast_context_create(devices {} mem {} slots {} mc {} supported {} size {} null {null_config}/{null_out})",
                    c.sim_devices, c.sim_device_memory, c.sim_multicast_slots, c.multicast.0, c.sim_multicast_supported,
                    c.struct_size
                )
            },
            s,
        );
        if s.0 == 0 {
            self.check(!null_out, || "context_create succeeded with a NULL out".into());
            let runtime = match handles::context(out.id) {
                Ok(r) => r,
                Err(e) => return self.fail(format!("a created context is not registered: {e}")),
            };
            if runtime.driver().as_sim().is_none() {
                self.fail("a context that is not simulated".into());
            }
            let devices = runtime.device_count() as i32;
            self.m.ctxs.push(Some(Ctx { handle: out, runtime, devices }));
            self.stats.contexts += 1;
        } else {
            self.check(out.id == 0xDEAD, || "context_create wrote its out-parameter on failure".into());
        }
    }

    /// Destroys context `i` through the C API and checks the simulator's ledger is empty.
    fn destroy_context_at(&mut self, i: usize) {
        let c = self.m.ctxs[i].take().unwrap();
        let s = mcast_context_destroy(c.handle);
        let s = self.status(|| format!("mcast_context_destroy({:#x})", c.handle.id), s);
        self.check(s.0 == 0, || format!("destroying a live context gave {}", s.0));
        let ledger = c.runtime.driver().as_sim().unwrap().ledger();
        self.check(ledger.is_empty(), || format!("context destroyed, ledger not empty: {ledger}"));
        self.m.dead.push(c.handle.id);
        for t in self.m.teams.iter_mut() {
            if t.as_ref().is_some_and(|t| t.ctx == i) {
                self.m.dead.push(t.take().unwrap().handle.id);
            }
        }
        let teams = &self.m.teams;
        for b in self.m.bufs.iter_mut() {
            if b.as_ref().is_some_and(|b| teams[b.team].is_none()) {
                self.m.dead.push(b.take().unwrap().handle.id);
            }
        }
    }

    fn context_destroy(&mut self) {
        let (i, h) = self.ctx(25);
        match i {
            Some(i) => self.destroy_context_at(i),
            None => {
                let s = mcast_context_destroy(h);
                let s = self.status(|| format!("mcast_context_destroy({:#x})", h.id), s);
                let want = if h.id == 0 { 0 } else { 2 };
                self.check(s.0 == want, || format!("destroying bad context {:#x} gave {}", h.id, s.0));
            }
        }
    }

    fn context_queries(&mut self) {
        let (i, h) = self.ctx(15);
        let _ = i;
        match self.rng.below(3) {
            0 => {
                let mut counts = mcast_live_counts_t {
                    struct_size: self.rng.pick(&[std::mem::size_of::<mcast_live_counts_t>() as u32, 0, 8, 1000]),
                    ..Default::default()
                };
                let null = self.rng.pct(10);
                let p = if null { std::ptr::null_mut() } else { &mut counts as *mut _ };
                let s = if counts.struct_size == 1000 && !null {
                    // A caller with a newer, larger struct: 1000 valid bytes.
                    let mut big = vec![0u64; 125];
                    big[0] = u64::from_ne_bytes([0xE8, 0x03, 0, 0, 0, 0, 0, 0]);
                    if cfg!(target_endian = "big") {
                        big[0] = 1000u64 << 32;
                    }
                    // SAFETY: 1000 valid, 8-aligned bytes starting with struct_size = 1000.
                    unsafe { mcast_context_live_counts(h, big.as_mut_ptr().cast()) }
                } else {
                    // SAFETY: NULL or a valid pointer.
                    unsafe { mcast_context_live_counts(h, p) }
                };
                self.status(|| format!("mcast_context_live_counts({:#x}, null {null})", h.id), s);
            }
            1 => {
                let len = self.rng.pick(&[0usize, 1, 7, 64, 4096]);
                let mut buf = vec![1 as c_char; len];
                let p = if len == 0 && self.rng.pct(50) { std::ptr::null_mut() } else { buf.as_mut_ptr() };
                // SAFETY: a buffer of len bytes (or NULL with len 0).
                let need = unsafe { mcast_context_leak_report(h, p, len) };
                self.stats.calls += 1;
                if len > 0 {
                    let nul = buf.iter().position(|&b| b == 0);
                    self.check(nul.is_some_and(|n| n == need.min(len - 1)), || {
                        format!("leak report of {need} bytes into {len}: NUL at {nul:?}")
                    });
                }
            }
            _ => {
                let devices = i.map_or(4, |i| self.m.ctxs[i].as_ref().unwrap().devices);
                let dev = self.rank(devices);
                match self.rng.below(3) {
                    0 => {
                        let mut n: c_int = -77;
                        let p = if self.rng.pct(10) { std::ptr::null_mut() } else { &mut n as *mut _ };
                        // SAFETY: NULL or valid.
                        let s = unsafe { mcast_device_count(h, p) };
                        let s = self.status(|| format!("mcast_device_count({:#x})", h.id), s);
                        if s.0 == 0 {
                            self.check(n == devices, || format!("device count {n}, config {devices}"));
                        } else {
                            self.check(n == -77, || "device_count wrote on failure".into());
                        }
                    }
                    1 => {
                        // SAFETY: all-zero is a valid info struct.
                        let mut info: mcast_device_info_t = unsafe { std::mem::zeroed() };
                        info.struct_size = self.rng.pick(&[std::mem::size_of::<mcast_device_info_t>() as u32, 0, 4]);
                        let p = if self.rng.pct(10) { std::ptr::null_mut() } else { &mut info as *mut _ };
                        // SAFETY: NULL or valid.
                        let s = unsafe { mcast_device_get_info(h, dev, p) };
                        self.status(|| format!("mcast_device_get_info({:#x}, {dev})", h.id), s);
                    }
                    _ => {
                        let peer = self.rank(devices);
                        let mut can: c_int = -1;
                        let p = if self.rng.pct(10) { std::ptr::null_mut() } else { &mut can as *mut _ };
                        // SAFETY: NULL or valid.
                        let s = unsafe { mcast_device_can_access_peer(h, dev, peer, p) };
                        self.status(|| format!("mcast_device_can_access_peer({:#x}, {dev}, {peer})", h.id), s);
                    }
                }
            }
        }
    }

    // ---- teams ----

    fn team_create(&mut self) {
        let (i, h) = self.ctx(10);
        let devices = i.map_or(4, |i| self.m.ctxs[i].as_ref().unwrap().devices);
        let n = match self.rng.below(20) {
            0 => 0,
            1 => 73,
            2 => -1,
            _ => 1 + self.rng.below(devices.max(1) as u64 + 1) as i32,
        };
        let distinct = self.rng.pct(70);
        let list: Vec<c_int> = (0..n.clamp(0, 73))
            .map(|r| {
                if self.rng.pct(3) {
                    self.rng.pick(&[-1, devices, 99])
                } else if distinct {
                    r % devices.max(1)
                } else {
                    self.rng.below(devices.max(1) as u64) as c_int
                }
            })
            .collect();
        let mut out = mcast_team_t { id: 0xDEAD };
        let null_devices = self.rng.pct(3);
        let null_out = self.rng.pct(3);
        let dp = if null_devices { std::ptr::null() } else { list.as_ptr() };
        let op = if null_out { std::ptr::null_mut() } else { &mut out as *mut _ };
        // SAFETY: `dp` is NULL or points to list.len() >= n.clamp(0, 73) ints; n = 73 with 73
        // entries; negative n is rejected before reading.
        let s = unsafe { mcast_team_create(h, dp, n, op) };
        let s = self.status(|| format!("mcast_team_create({:#x}, {list:?}, {n})", h.id), s);
        if s.0 == 0 {
            let ok = i.is_some() && !null_out && !null_devices;
            self.check(ok, || "team_create succeeded with a bad argument".into());
            if let Some(ci) = i {
                self.m.teams.push(Some(Team { handle: out, ctx: ci, size: n }));
                self.stats.teams += 1;
            }
        } else {
            self.check(out.id == 0xDEAD, || "team_create wrote its out-parameter on failure".into());
        }
    }

    fn team_destroy(&mut self) {
        let (i, h) = self.team(20);
        let s = mcast_team_destroy(h);
        let s = self.status(|| format!("mcast_team_destroy({:#x})", h.id), s);
        match i {
            Some(i) => {
                let has_bufs = self.m.bufs.iter().flatten().any(|b| b.team == i);
                if has_bufs {
                    self.check(s.0 == 8, || format!("team with buffers: destroy gave {}", s.0));
                } else {
                    // Destroyed (a teardown error is still reported, but the handle is gone).
                    self.check(s.0 != 8, || "team without buffers: IN_USE".into());
                    self.m.dead.push(h.id);
                    self.m.teams[i] = None;
                }
            }
            None => {
                let want = if h.id == 0 { 0 } else { 2 };
                self.check(s.0 == want, || format!("destroying bad team {:#x} gave {}", h.id, s.0));
            }
        }
    }

    fn team_info(&mut self) {
        let (i, h) = self.team(15);
        // SAFETY: all-zero is valid.
        let mut info: mcast_team_info_t = unsafe { std::mem::zeroed() };
        info.struct_size = self.rng.pick(&[std::mem::size_of::<mcast_team_info_t>() as u32, 0, 4]);
        let p = if self.rng.pct(5) { std::ptr::null_mut() } else { &mut info as *mut _ };
        // SAFETY: NULL or valid.
        let s = unsafe { mcast_team_get_info(h, p) };
        let s = self.status(|| format!("mcast_team_get_info({:#x})", h.id), s);
        if let (0, Some(i)) = (s.0, i) {
            let n = self.m.teams[i].as_ref().unwrap().size;
            self.check(info.size == n, || format!("team info size {} != {n}", info.size));
        }
    }

    // ---- buffers ----

    fn buffer_alloc(&mut self) {
        let (i, h) = self.team(10);
        let bytes = match self.rng.below(20) {
            0 => 0,
            1 => usize::MAX,
            2 => usize::MAX / 3,
            3 => self.rng.pick(&[3 * MIB, 9 * MIB, 40 * MIB]),
            4..=6 => 1 + self.rng.below(MIB as u64) as usize,
            _ => 1 + self.rng.below(64 * 1024) as usize,
        };
        let mut out = mcast_buffer_t { id: 0xDEAD };
        let null_out = self.rng.pct(3);
        let op = if null_out { std::ptr::null_mut() } else { &mut out as *mut _ };
        // SAFETY: NULL or valid.
        let s = unsafe { mcast_buffer_alloc(h, bytes, op) };
        let s = self.status(|| format!("mcast_buffer_alloc({:#x}, {bytes})", h.id), s);
        if s.0 == 0 {
            self.check(i.is_some() && !null_out && bytes > 0, || "alloc succeeded with a bad argument".into());
            if let Some(ti) = i {
                self.m.bufs.push(Some(Buf { handle: out, team: ti, bytes }));
                self.stats.buffers += 1;
            }
        } else {
            self.check(out.id == 0xDEAD, || "alloc wrote its out-parameter on failure".into());
        }
    }

    fn buffer_free(&mut self) {
        let (i, h) = self.buf(25);
        let s = mcast_buffer_free(h);
        let s = self.status(|| format!("mcast_buffer_free({:#x})", h.id), s);
        match i {
            Some(i) => {
                // Freed whatever the status (a failed wait is reported after the memory returns).
                self.check(s.0 != 2 && s.0 != 1, || format!("freeing a live buffer gave {}", s.0));
                self.m.dead.push(h.id);
                self.m.bufs[i] = None;
            }
            None => {
                let want = if h.id == 0 { 0 } else { 2 };
                self.check(s.0 == want, || format!("freeing bad buffer {:#x} gave {}", h.id, s.0));
            }
        }
    }

    fn buffer_queries(&mut self) {
        let (i, h) = self.buf(15);
        let n = i.map_or(2, |i| self.m.teams[self.m.bufs[i].as_ref().unwrap().team].as_ref().unwrap().size);
        let bytes = i.map_or(4096, |i| self.m.bufs[i].as_ref().unwrap().bytes);
        let null = self.rng.pct(5);
        match self.rng.below(6) {
            0 => {
                let mut size = 7usize;
                let p = if null { std::ptr::null_mut() } else { &mut size as *mut _ };
                // SAFETY: NULL or valid.
                let s = unsafe { mcast_buffer_size(h, p) };
                let s = self.status(|| format!("mcast_buffer_size({:#x})", h.id), s);
                if s.0 == 0 {
                    self.check(size == bytes, || format!("buffer size {size} != {bytes}"));
                } else {
                    self.check(size == 7, || "buffer_size wrote on failure".into());
                }
            }
            1..=3 => {
                let rank = self.rank(n);
                let peer = self.rank(n);
                let mut ptr: *mut c_void = 1 as *mut c_void;
                let p = if null { std::ptr::null_mut() } else { &mut ptr as *mut _ };
                let which = self.rng.below(3);
                // SAFETY: NULL or valid out pointers; the pointers returned are not dereferenced.
                let s = unsafe {
                    match which {
                        0 => mcast_buffer_local_ptr(h, rank, p),
                        1 => mcast_buffer_peer_ptr(h, rank, peer, p),
                        _ => mcast_buffer_multicast_ptr(h, rank, p),
                    }
                };
                let name = ["mcast_buffer_local_ptr", "mcast_buffer_peer_ptr", "mcast_buffer_multicast_ptr"];
                let s = self.status(|| format!("{}({:#x}, {rank}, {peer})", name[which as usize], h.id), s);
                if s.0 != 0 {
                    self.check(ptr == 1 as *mut c_void, || "a pointer query wrote on failure".into());
                } else {
                    self.check(!ptr.is_null(), || "a NULL pointer returned".into());
                }
            }
            _ => {
                let rank = self.rank(n);
                let offset = self.size_near(bytes);
                let len = if self.rng.pct(80) {
                    self.rng.below(bytes.saturating_sub(offset.min(bytes)) as u64 + 2) as usize
                } else {
                    self.size_near(bytes)
                };
                // A host buffer of len bytes up to 1 MiB + 2; beyond that the pointer is NULL, so
                // the library must refuse before copying.
                let host_len = if len <= MIB + 2 { len } else { 0 };
                let mut host = vec![0x5Au8; host_len];
                let null_data = null || host_len != len;
                let write = self.rng.pct(50);
                // SAFETY: the pointer is NULL or `host`, which holds len bytes.
                let s = unsafe {
                    if write {
                        let p = if null_data { std::ptr::null() } else { host.as_ptr().cast() };
                        mcast_buffer_write(h, rank, offset, p, len)
                    } else {
                        let p = if null_data { std::ptr::null_mut() } else { host.as_mut_ptr().cast() };
                        mcast_buffer_read(h, rank, offset, p, len)
                    }
                };
                let name = if write { "mcast_buffer_write" } else { "mcast_buffer_read" };
                let s = self.status(|| format!("{name}({:#x}, {rank}, {offset}, {len}, null {null_data})", h.id), s);
                if s.0 == 0 {
                    let in_range = offset.checked_add(len).is_some_and(|e| e <= bytes);
                    self.check(i.is_some() && in_range && rank >= 0 && rank < n, || {
                        format!("{name} accepted rank {rank} offset {offset} len {len} of {bytes}")
                    });
                }
            }
        }
    }

    // ---- collectives ----

    /// Arguments of one collective on a buffer of `bytes` on a team of `n`: mostly in range.
    fn collective_args(&mut self, n: usize, bytes: usize) -> (u32, usize, usize, u32, u32, c_int) {
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

    fn issue(&mut self, b: mcast_buffer_t, rank: c_int, args: (u32, usize, usize, u32, u32, c_int), s: mcast_stream_t) {
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
    fn collective_round(&mut self) {
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
    fn collective_single(&mut self) {
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

    fn synchronize(&mut self) {
        let (i, h) = self.team(20);
        let n = i.map_or(2, |i| self.m.teams[i].as_ref().unwrap().size);
        let rank = self.rank(n);
        let s = self.stream();
        let st = mcast_synchronize(h, rank, s);
        self.status(|| format!("mcast_synchronize({:#x}, {rank})", h.id), st);
    }

    fn misc(&mut self) {
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
