//! One outcome on every rank: a rank paused (as a stopped process is: its reader threads too)
//! past the deadline at each step of an exchange, plain and confirmed, on a team of three thread
//! ranks over TCP.

use std::time::{Duration, Instant};

use super::exchange::Step;
use super::tests::team;
use super::*;

/// timeout_ms of these teams, and how long the paused rank stays paused (past it).
const TIMEOUT_MS: u32 = 500;
const PAUSE_MS: u64 = 1300;
/// How long after the deadline a rank that succeeded may take to learn that another failed:
/// the paused rank's pause past the deadline, and a second for the frames and the scheduler.
const LEARN: Duration = Duration::from_millis(PAUSE_MS - TIMEOUT_MS as u64 + 1000);

/// One rank's outcome: the exchange's result, and whether its bootstrap reported a failure
/// (within [`LEARN`] past the deadline, for a rank that succeeded).
#[derive(Debug)]
struct Outcome {
    result: Result<(), BootError>,
    failed_later: Option<(Kind, String)>,
}

impl Outcome {
    fn failed(&self) -> bool {
        self.result.is_err() || self.failed_later.is_some()
    }
}

/// Rank `who` of three pauses at `step` of one agreement (`confirm`: the confirmed one);
/// every rank's outcome.
fn pause_one(who: usize, step: Step, confirm: bool) -> Vec<Outcome> {
    let boots = team(3, |_| "h".into(), TIMEOUT_MS);
    boots[who].shared.pauses.lock().push((step, PAUSE_MS));
    let start = Instant::now();
    let results: Vec<Result<(), BootError>> = std::thread::scope(|s| {
        let hs: Vec<_> = boots
            .iter()
            .map(|b| {
                s.spawn(move || {
                    let label = "paused";
                    let r = if confirm { b.allgather_confirmed(label, Ok(()), &[], &[]) } else { b.agree_parts(label) };
                    r.map(|_| ())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(boots[who].shared.pauses.lock().is_empty(), "rank {who} paused at {step:?}");
    let until = start + Duration::from_millis(TIMEOUT_MS.into()) + LEARN;
    let any_failed = results.iter().any(Result::is_err);
    results
        .into_iter()
        .zip(&boots)
        .map(|(result, b)| {
            if any_failed {
                while result.is_ok() && b.failure().is_none() && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            Outcome { failed_later: b.failure(), result }
        })
        .collect()
}

impl Bootstrap {
    fn agree_parts(&self, label: &str) -> Result<Vec<Part>, BootError> {
        self.allgather(label, Ok(()), &[], &[])
    }
}

/// The steps where `rank` can pause (a member's or the hub's), plain or confirmed.
fn steps(rank: usize, confirm: bool) -> Vec<Step> {
    match (rank, confirm) {
        (0, false) => vec![Step::Gathered, Step::Results, Step::Decoded],
        (0, true) => vec![Step::Gathered, Step::Results, Step::Decoded, Step::Acks, Step::Commits],
        (_, false) => vec![Step::Send, Step::Wait, Step::Decoded],
        (_, true) => vec![Step::Send, Step::Wait, Step::Decoded, Step::Commit],
    }
}

/// Every rank ends the same: all succeed with no failure reported afterwards, or all fail (in
/// the call, or, having succeeded it, by the bootstrap's failure within [`LEARN`] past the
/// deadline, naming the rank that failed and the exchange). `same_call`: the calls' own results
/// must be the same too. What differs, if anything.
fn differs(case: &str, out: &[Outcome], same_call: bool) -> Option<String> {
    let failed: Vec<bool> = out.iter().map(Outcome::failed).collect();
    if failed.iter().any(|&f| f != failed[0]) {
        return Some(format!("{case}: outcomes differ: {out:#?}"));
    }
    let ok: Vec<bool> = out.iter().map(|o| o.result.is_ok()).collect();
    if same_call && ok.iter().any(|&x| x != ok[0]) {
        return Some(format!("{case}: the calls' results differ: {out:#?}"));
    }
    for (r, o) in out.iter().enumerate() {
        if let (Ok(()), Some((_, why))) = (&o.result, &o.failed_later) {
            if !why.contains("\"paused\"") || !why.contains("rank ") {
                return Some(format!("{case}: rank {r} is not told which rank and exchange: {why}"));
            }
        }
    }
    None
}

/// Pauses each rank in turn at each of its steps (three cases at a time), plain or confirmed;
/// fails listing every case whose ranks did not end the same.
fn every_pause(confirm: bool) {
    let cases: Vec<(usize, Step)> = (0..3).flat_map(|r| steps(r, confirm).into_iter().map(move |s| (r, s))).collect();
    let mut wrong = Vec::new();
    std::thread::scope(|s| {
        for chunk in cases.chunks(3) {
            let hs: Vec<_> =
                chunk.iter().map(|&(r, step)| s.spawn(move || (r, step, pause_one(r, step, confirm)))).collect();
            for h in hs {
                let (r, step, out) = h.join().unwrap();
                let case = format!("rank {r} paused at {step:?}{}", if confirm { ", confirmed" } else { "" });
                // Confirmed, the calls' own results agree but where the hub pauses between its
                // commits (the rank committed first learns later).
                wrong.extend(differs(&case, &out, confirm && (r, step) != (0, Step::Commits)));
            }
        }
    });
    assert!(wrong.is_empty(), "{} of {} cases:\n{}", wrong.len(), cases.len(), wrong.join("\n"));
}

/// A rank paused at any step of a plain agreement past the deadline: every rank ends the same
/// (the hub paused between its results: the rank that had its result turns failed).
#[test]
fn a_rank_paused_at_any_step_of_an_agreement_ends_like_the_others() {
    every_pause(false);
}

/// The same for a confirmed agreement, where the call's own result is the same on every rank,
/// unless the hub pauses between its commits: then the rank committed first learns later.
#[test]
fn a_rank_paused_at_any_step_of_a_confirmed_agreement_ends_like_the_others() {
    every_pause(true);
}

/// The hub paused between its results to two ranks: rank 1 has the result, rank 2 gives up at
/// its deadline. Every rank ends failed; rank 1 and the hub are told who failed and where.
#[test]
fn a_hub_paused_between_its_results_fails_every_rank() {
    let out = pause_one(0, Step::Results, false);
    assert!(out[2].result.is_err(), "{out:#?}");
    for (r, o) in out.iter().enumerate() {
        assert!(o.failed(), "rank {r} ends failed: {out:#?}");
    }
    let e = out[2].result.as_ref().unwrap_err();
    assert_eq!(e.kind, Kind::Timeout, "{}", e.message);
    assert!(e.message.contains("the result from rank 0"), "{}", e.message);
}

/// The confirm round's cost: 2,000 agreements of 8 thread ranks over loopback TCP, plain and
/// confirmed, each rank timing its own calls; prints the median and 90th percentile per call
/// (`cargo test --release --lib agree_cost -- --ignored --nocapture`). A measurement, asserting
/// only that every agreement succeeded.
#[test]
#[ignore]
fn agree_cost_plain_and_confirmed() {
    let boots = team(8, |_| "h".into(), 30_000);
    for confirm in [false, true, false, true] {
        let times: Vec<Vec<Duration>> = std::thread::scope(|s| {
            let hs: Vec<_> = boots
                .iter()
                .map(|b| {
                    s.spawn(move || {
                        (0..2000)
                            .map(|_| {
                                let t = Instant::now();
                                if confirm {
                                    b.allgather_confirmed("cost", Ok(()), &[], &[]).unwrap();
                                } else {
                                    b.agree("cost", Ok(())).unwrap();
                                }
                                t.elapsed()
                            })
                            .collect()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all: Vec<Duration> = times.into_iter().flatten().collect();
        all.sort();
        eprintln!(
            "8 ranks, {}: median {:?}, p90 {:?}",
            if confirm { "confirmed" } else { "plain" },
            all[all.len() / 2],
            all[all.len() * 9 / 10]
        );
    }
}
