//! Processes stopped (SIGSTOP) past the deadline at a step of an exchange of a team's
//! formation or of a split, then resumed (SIGCONT), on the simulator: every rank ends the same
//! (all succeed, or all fail: in the call, or told afterwards through the bootstrap within
//! timeout_ms + [`BOUND`] of the resume), none hangs, nothing leaks. The stopped process stops
//! itself at `MCAST_TEST_STOP_AT=LABEL@STEP` (test builds only); the labels are those a team's
//! formation and a split really use, read from a run that stops no rank.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::exchange::{Step, LABELS, STOP_AT_ENV};
use super::new_unique_id;
use crate::runtime::config::{Backend, Config, MulticastMode};
use crate::runtime::context::Context;
use crate::runtime::team::Team;

/// What a child process is: `PHASE:RANK:ID:DIR` (`form`: it forms a team of three; `split`: it
/// forms one, then splits it into one team of the three in reverse order).
const ROLE: &str = "MCAST_STOP_TEST_ROLE";
const RANKS: usize = 3;
/// timeout_ms of the children's contexts.
const TIMEOUT_MS: u32 = 600;
/// How long a rank stays stopped: past its deadline.
const PAUSE: Duration = Duration::from_millis(1000);
/// How long past timeout_ms after the resume a rank may take to learn of the failure.
const BOUND: Duration = Duration::from_millis(1000);
/// What a case says when the rank to stop never got there (the team failed earlier: a loaded
/// machine starved a rank past timeout_ms); such a case runs again, at most [`TRIES`] times.
const NOT_REACHED: &str = "the rank never stopped there";
const TRIES: usize = 3;
/// The line a child reports on.
const TAG: &str = "STOPTEST";

/// CLOCK_MONOTONIC in ns: one clock for every process of this machine.
fn mono_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> [u8; super::ID_BYTES] {
    let mut id = [0u8; super::ID_BYTES];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    id
}

/// When the parent resumed the stopped rank (its file in the case's folder), once it did.
fn resumed_at(dir: &Path) -> Option<u64> {
    std::fs::read_to_string(dir.join("resumed")).ok()?.trim().parse().ok()
}

/// A rank of a case (see [`ROLE`]): forms (and splits), reports the call's outcome and, when
/// it succeeded, any failure its teams report up to timeout_ms + [`BOUND`] after the resume;
/// then destroys its teams, and checks that nothing is left.
#[test]
fn child() {
    let Ok(spec) = std::env::var(ROLE) else { return };
    let f: Vec<&str> = spec.splitn(4, ':').collect();
    let (phase, r, id, dir) = (f[0], f[1].parse::<i32>().unwrap(), unhex(f[2]), PathBuf::from(f[3]));
    let config = Config {
        backend: Backend::Sim,
        multicast: MulticastMode::Off,
        sim_devices: RANKS as u32,
        timeout_ms: TIMEOUT_MS,
        retry_backoff_ms: 1,
        sim_host_env: Some(Vec::new()),
        ..Config::default()
    };
    let ctx = Arc::new(Context::new(config).unwrap());
    let formed = Team::init_rank(&ctx, &id, RANKS as i32, r, r);
    let (call, teams): (Result<(), String>, Vec<Arc<Team>>) = match phase {
        "form" => (formed.as_ref().map(|_| ()).map_err(|e| e.message.clone()), formed.into_iter().collect()),
        _ => {
            let parent = formed.unwrap_or_else(|e| panic!("rank {r}: the team to split did not form: {e}"));
            // One color, keys reversing the order: the new team's hub is rank 2. (Teams of
            // two colors share no failure by design: one may form while another fails.)
            let split = parent.split(&[0], &[-r]);
            let mut teams = vec![parent];
            let call = match split {
                Ok(made) => {
                    teams.extend(made.into_iter().flatten());
                    Ok(())
                }
                Err(e) => Err(e.message),
            };
            (call, teams)
        }
    };
    let returned = mono_ns();
    match &call {
        Ok(()) => println!("{TAG} call {returned} ok"),
        Err(e) => println!("{TAG} call {returned} err {e}"),
    }
    if call.is_ok() {
        let later = loop {
            if let Some(e) = teams.iter().find_map(|t| t.error()) {
                break Some((mono_ns(), e.message));
            }
            let bound = (TIMEOUT_MS as u64) * 1_000_000 + BOUND.as_nanos() as u64;
            if resumed_at(&dir).is_some_and(|t| mono_ns() > t + bound) {
                break None;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        match later {
            Some((at, why)) => println!("{TAG} later {at} {why}"),
            None => println!("{TAG} later none"),
        }
    }
    println!("{TAG} labels {}", LABELS.lock().join("|"));
    for t in teams.iter().rev() {
        t.destroy().unwrap_or_else(|e| panic!("rank {r}: destroying a team: {e}"));
    }
    let report = ctx.shutdown();
    assert!(report.is_empty(), "rank {r}: {report}");
    let ledger = ctx.driver().as_sim().expect("a simulated context").ledger();
    assert!(ledger.is_empty(), "rank {r}: {ledger}");
    println!("{TAG} clean");
}

/// Children that are resumed and killed if the case ends before they do.
struct Ranks(Vec<Child>);

impl Drop for Ranks {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if let Ok(None) = c.try_wait() {
                // SAFETY: a signal to a child of this process that has not been reaped.
                unsafe { libc::kill(c.id() as i32, libc::SIGCONT) };
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Whether process `pid` is stopped (state `T` in /proc/PID/stat).
fn stopped(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
}

/// One rank's report.
#[derive(Debug)]
struct Report {
    /// When the call returned, and its error.
    call: (u64, Option<String>),
    /// A failure told after the call succeeded: when it was seen, and the message.
    later: Option<(u64, String)>,
    labels: Vec<String>,
}

impl Report {
    fn failed(&self) -> bool {
        self.call.1.is_some() || self.later.is_some()
    }

    fn parse(out: &str) -> Option<Report> {
        let mut call = None;
        let mut later = None;
        let mut labels = None;
        for l in out.lines().filter_map(|l| l.split_once(TAG)).map(|(_, l)| l.trim()) {
            if let Some(rest) = l.strip_prefix("call ") {
                let (at, what) = rest.split_once(' ')?;
                call = Some((at.parse().ok()?, what.strip_prefix("err ").map(str::to_string)));
            } else if let Some(rest) = l.strip_prefix("later ") {
                if rest != "none" {
                    let (at, why) = rest.split_once(' ')?;
                    later = Some((at.parse().ok()?, why.to_string()));
                }
            } else if let Some(rest) = l.strip_prefix("labels ") {
                labels = Some(rest.split('|').map(str::to_string).collect());
            }
        }
        Some(Report { call: call?, later, labels: labels? })
    }
}

/// A case: `phase` with rank `who` stopped at `LABEL@STEP` (or none stopped). Every rank's
/// report, or what went wrong (a rank that never got there, hung, failed its checks or did not
/// end like the others).
fn run_case(phase: &str, stop: Option<(usize, &str, Step)>) -> Result<Vec<Report>, String> {
    let case = match stop {
        Some((who, label, step)) => format!("{phase}: rank {who} stopped at \"{label}\"@{}", step.name()),
        None => format!("{phase}: no rank stopped"),
    };
    let id = hex(&new_unique_id().unwrap());
    // Numbered in this process (two cases run at once, run_all, and two clock readings may be
    // equal), and stamped with the clock (no folder a crashed run with this pid left is reused).
    static CASES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let k = CASES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("mcast-stop-{}-{k}-{}", std::process::id(), mono_ns()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut ranks = Ranks(Vec::new());
    for r in 0..RANKS {
        let mut c = Command::new(&exe);
        c.args(["--exact", "bootstrap::stop_tests::child", "--nocapture", "--test-threads=1"])
            .env(ROLE, format!("{phase}:{r}:{id}:{}", dir.display()))
            .env_remove(STOP_AT_ENV)
            .env_remove("MCAST_SIM_FAULTS")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some((who, label, step)) = stop {
            if who == r {
                c.env(STOP_AT_ENV, format!("{label}@{}", step.name()));
            }
        }
        ranks.0.push(c.spawn().unwrap());
    }
    let resumed = match stop {
        Some((who, ..)) => {
            let t = Instant::now();
            let pid = ranks.0[who].id();
            while !stopped(pid) {
                if ranks.0[who].try_wait().unwrap().is_some() || t.elapsed() > Duration::from_secs(60) {
                    return Err(format!("{case}: {NOT_REACHED}"));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            std::thread::sleep(PAUSE);
            let at = mono_ns();
            std::fs::write(dir.join("resumed"), at.to_string()).unwrap();
            // SAFETY: a signal to a child of this process (resumed by `Ranks` on every path).
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
            at
        }
        None => {
            let at = mono_ns();
            std::fs::write(dir.join("resumed"), at.to_string()).unwrap();
            at
        }
    };
    // Every child's waits are bounded; this only keeps a broken build from hanging the test.
    let t = Instant::now();
    while ranks.0.iter_mut().any(|c| c.try_wait().unwrap().is_none()) {
        if t.elapsed() > Duration::from_secs(60) {
            return Err(format!("{case}: a rank hung"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let mut reports = Vec::new();
    for (r, c) in ranks.0.iter_mut().enumerate() {
        let (mut out, mut err) = (String::new(), String::new());
        std::io::Read::read_to_string(&mut c.stdout.take().unwrap(), &mut out).unwrap();
        std::io::Read::read_to_string(&mut c.stderr.take().unwrap(), &mut err).unwrap();
        let st = c.wait().unwrap();
        if !st.success() || !out.contains(&format!("{TAG} clean")) {
            return Err(format!("{case}: rank {r} failed its checks ({st:?}):\n{out}\n{err}"));
        }
        reports.push(Report::parse(&out).ok_or_else(|| format!("{case}: rank {r} reported nothing:\n{out}"))?);
    }
    // One outcome, known in time: a rank that fails does so by timeout_ms (twice: a split's
    // new team forms after it) + BOUND after the resume.
    let failed: Vec<bool> = reports.iter().map(Report::failed).collect();
    if failed.iter().any(|&f| f != failed[0]) {
        return Err(format!("{case}: the ranks ended differently: {reports:#?}"));
    }
    let limit = resumed + 2 * u64::from(TIMEOUT_MS) * 1_000_000 + BOUND.as_nanos() as u64;
    for (r, rep) in reports.iter().enumerate() {
        let at = rep.later.as_ref().map_or(rep.call.0, |l| l.0);
        if at > limit {
            return Err(format!(
                "{case}: rank {r} knew its outcome {} ms after the resume",
                (at - resumed) / 1_000_000
            ));
        }
        if let Some((_, why)) = &rep.later {
            if !why.contains("rank ") || !why.contains('"') {
                return Err(format!("{case}: rank {r} is not told which rank failed and where: {why}"));
            }
        }
    }
    Ok(reports)
}

/// The steps where `rank` can be stopped in an exchange (`confirmed`: with a confirm round).
fn steps(rank: usize, confirmed: bool) -> Vec<Step> {
    let mut s = if rank == 0 {
        vec![Step::Gathered, Step::Results, Step::Decoded]
    } else {
        vec![Step::Send, Step::Wait, Step::Decoded]
    };
    if confirmed && rank == 0 {
        s.extend([Step::Acks, Step::Commits]);
    } else if confirmed {
        s.push(Step::Commit);
    }
    s
}

/// The exchanges of a formation and of a split (a confirmed one ends with `*`), read from runs
/// that stop no rank (which must succeed on every rank, with no failure told afterwards).
fn labels() -> (Vec<String>, Vec<String>) {
    // A loaded machine may starve a rank past timeout_ms: a run that failed runs again.
    let succeeded = |phase: &str| {
        let mut last = None;
        for _ in 0..TRIES {
            let reports = run_case(phase, None).unwrap_or_else(|e| panic!("{e}"));
            if reports.iter().all(|r| !r.failed()) {
                return reports;
            }
            last = Some(reports);
        }
        panic!("{phase}: no rank stopped, and it failed {TRIES} times: {last:#?}");
    };
    let form = succeeded("form");
    let split = succeeded("split");
    let mut form_labels = form[0].labels.clone();
    assert!(form_labels.last().is_some_and(|l| l.ends_with('*')), "a formation ends confirmed: {form_labels:?}");
    let formed = form_labels.len();
    // A rank stops at a label's first exchange.
    let mut seen = std::collections::HashSet::new();
    form_labels.retain(|l| seen.insert(l.clone()));
    let split_labels: Vec<String> =
        split[0].labels[formed..].iter().filter(|l| l.starts_with("split: ")).cloned().collect();
    assert_eq!(split_labels.len(), 2, "{:?}", split[0].labels);
    (form_labels, split_labels)
}

/// Runs `cases` (two at a time); fails listing every case that went wrong.
fn run_all(cases: Vec<(&'static str, usize, String, Step)>) {
    let mut wrong = Vec::new();
    for pair in cases.chunks(2) {
        std::thread::scope(|s| {
            let hs: Vec<_> = pair
                .iter()
                .map(|(phase, who, label, step)| {
                    s.spawn(move || {
                        let stop = Some((*who, label.trim_end_matches('*'), *step));
                        let mut got = run_case(phase, stop);
                        for _ in 1..TRIES {
                            match &got {
                                Err(e) if e.ends_with(NOT_REACHED) => got = run_case(phase, stop),
                                _ => break,
                            }
                        }
                        got
                    })
                })
                .collect();
            for h in hs {
                if let Err(e) = h.join().unwrap() {
                    wrong.push(e);
                }
            }
        });
    }
    assert!(wrong.is_empty(), "{} of {} cases:\n{}", wrong.len(), cases.len(), wrong.join("\n"));
}

/// Each rank in turn stopped at every step of the exchanges that end a formation and a split
/// (the formation's last, both of the split's), and at the two steps where an outcome could
/// split (the hub between its results, a member waiting for its result) of every other
/// exchange of a formation.
#[test]
fn a_stopped_rank_ends_like_the_others_in_formation_and_split() {
    let (form, split) = labels();
    let mut cases = Vec::new();
    let last = form.last().unwrap().clone();
    for label in &form[..form.len() - 1] {
        if label != &last {
            cases.push(("form", 0, label.clone(), Step::Results));
            cases.push(("form", 2, label.clone(), Step::Wait));
        }
    }
    for (phase, label) in std::iter::once(("form", &last)).chain(split.iter().map(|l| ("split", l))) {
        for r in 0..RANKS {
            for step in steps(r, label.ends_with('*')) {
                cases.push((phase, r, label.clone(), step));
            }
        }
    }
    run_all(cases);
}

/// Every rank stopped at every step of every exchange of a formation and a split (some
/// minutes: `cargo test --lib every_step_of_every -- --ignored`).
#[test]
#[ignore]
fn a_stopped_rank_ends_like_the_others_at_every_step_of_every_exchange() {
    let (form, split) = labels();
    let mut cases = Vec::new();
    for (phase, label) in form.iter().map(|l| ("form", l)).chain(split.iter().map(|l| ("split", l))) {
        for r in 0..RANKS {
            for step in steps(r, label.ends_with('*')) {
                cases.push((phase, r, label.clone(), step));
            }
        }
    }
    run_all(cases);
}
