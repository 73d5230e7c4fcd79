//! A paused rank (issue 24: a failure is every rank's): it learns of the timeout within a second
//! of resuming, on its host or another.

use super::*;

/// What a paused-rank child needs besides its role: the second team's id, whether the pause
/// outlasts the timeout, the transport and the folder the ranks meet in.
const PAUSE: &str = "MCAST_FAIL_PAUSE";
/// timeout_ms of the paused-rank teams: waiting it out would take three times the 1 s the
/// contract allows a resumed rank to learn of a failure (and four processes starting at once on
/// a loaded machine form their team well within it).
const PAUSE_TIMEOUT_MS: u32 = 3000;
/// The line the paused rank prints once it learned of the failure: this, then the time
/// ([`mono_ns`]).
const LEARNED: &str = "MCAST_PAUSED_RANK_LEARNED";

/// CLOCK_MONOTONIC in ns: one clock for every process of this machine.
fn mono_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Waits until `path` exists (at most `limit`).
fn wait_for(path: &std::path::Path, limit: Duration) {
    let t = Instant::now();
    while !path.exists() {
        assert!(t.elapsed() < limit, "{} did not appear within {limit:?}", path.display());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Child processes that are resumed and killed if the test ends before they do: none is left
/// stopped or running.
struct Ranks(Vec<Child>);

impl Drop for Ranks {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if let Ok(None) = c.try_wait() {
                // SAFETY: a signal to a child process of this one that has not been reaped.
                unsafe { libc::kill(c.id() as i32, libc::SIGCONT) };
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Four ranks, one process each, on `hosts` simulated hosts (`MCAST_HOST_ID`), P2P or
/// multicast, in a loop of all-reduces; rank 3's process is stopped (SIGSTOP) for `pause`, then
/// resumed (SIGCONT). Every rank checks its own statuses and results (see [`pause_child`]);
/// returns how long after SIGCONT rank 3 learned of the failure when the pause outlasted
/// timeout_ms.
fn pause_rank_3(pause: Duration, multicast: bool, hosts: usize) -> Option<Duration> {
    let long = pause > Duration::from_millis(PAUSE_TIMEOUT_MS.into());
    let (id, id2) = (hex(&new_unique_id().unwrap()), hex(&new_unique_id().unwrap()));
    let dir = std::env::temp_dir().join(format!("mcast-pause-{}-{}", std::process::id(), mono_ns()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut ranks = Ranks(Vec::new());
    for r in 0..4 {
        let mut c = Command::new(&exe);
        c.args(["--exact", "processes::child", "--nocapture", "--test-threads=1"])
            .env(ROLE, format!("pause:4:{r}:{id}"))
            .env(PAUSE, format!("{id2}:{}:{}:{}", u8::from(long), u8::from(multicast), dir.display()))
            .env("MCAST_HOST_ID", format!("host{}", r * hosts / 4))
            .env_remove("MCAST_SIM_FAULTS")
            .stdout(Stdio::piped());
        ranks.0.push(c.spawn().unwrap());
    }
    // Rank 3 is in its loop: stop it there.
    wait_for(&dir.join("running"), Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(100));
    let pid = ranks.0[3].id() as i32;
    // SAFETY: signals to a child process of this one (resumed by `Ranks` on every path).
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    std::thread::sleep(pause);
    let resumed = mono_ns();
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    // Every child's waits are bounded; this bound only keeps a broken build from hanging.
    let t = Instant::now();
    while ranks.0.iter_mut().any(|c| c.try_wait().unwrap().is_none()) {
        assert!(t.elapsed() < Duration::from_secs(120), "a rank did not finish");
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let mut outputs = Vec::new();
    for (r, c) in ranks.0.iter_mut().enumerate() {
        let mut out = String::new();
        std::io::Read::read_to_string(&mut c.stdout.take().unwrap(), &mut out).unwrap();
        let st = c.wait().unwrap();
        assert!(st.success(), "pause {pause:?}, multicast {multicast}, {hosts} host(s): rank {r}: {st:?}\n{out}");
        outputs.push(out);
    }
    long.then(|| {
        let line = outputs[3]
            .lines()
            .find_map(|l| l.split_once(LEARNED).map(|(_, at)| at))
            .unwrap_or_else(|| panic!("rank 3 says when it learned: {}", outputs[3]));
        let learned: u64 = line.trim().parse().unwrap();
        Duration::from_nanos(learned.saturating_sub(resumed))
    })
}

/// A rank of [`pause_rank_3`]: all-reduces, each checked, until one fails (a pause longer than
/// timeout_ms: every rank must get TIMEOUT naming the rank that timed out first and rank 3 as
/// the one that did not arrive, from the call or synchronize and from get_error, and an
/// allocation that needs the ranks' agreement must fail at once; rank 3 prints when it learned;
/// then every rank destroys the team and a new one on the same devices works) or, for a
/// shorter pause, 150 of them all succeed. Nothing is left on any rank.
pub(super) fn pause_child(r: usize, id: &[u8; 128]) {
    let spec = std::env::var(PAUSE).unwrap();
    let f: Vec<&str> = spec.splitn(4, ':').collect();
    let (id2, long, multicast, dir) = (unhex(f[0]), f[1] == "1", f[2] == "1", std::path::PathBuf::from(f[3]));
    let (n, rank, count) = (4usize, r as i32, 1000usize);
    let ctx = sim_context(4, PAUSE_TIMEOUT_MS, multicast);
    let all_reduce = |team: &Arc<Team>, buf: &Buffer, round: usize| -> Result<(), mcast::runtime::Error> {
        buf.write(rank, 0, &ar_input(r, round, count)).unwrap();
        run(buf, rank, 0, count, AR, Stream::DEFAULT).and_then(|()| synchronize(team, rank, Stream::DEFAULT))?;
        let mut got = vec![0u8; count * 4];
        buf.read(rank, 0, &mut got).unwrap();
        assert_eq!(got, ar_sum(n, round, count), "rank {r}, round {round}");
        Ok(())
    };
    let team = Team::init_rank(&ctx, id, n as i32, rank, rank).unwrap();
    let want =
        if multicast { mcast::runtime::team::Transport::Multicast } else { mcast::runtime::team::Transport::P2P };
    assert_eq!(team.transport(), want, "rank {r}");
    let buf = Buffer::alloc(&team, 64 * 1024).unwrap();
    let start = Instant::now();
    let rounds = if long { usize::MAX } else { 150 };
    let mut failure = None;
    for round in 0..rounds {
        assert!(start.elapsed() < Duration::from_secs(60), "rank {r}: no failure in {round} rounds");
        if let Err(e) = all_reduce(&team, &buf, round) {
            failure = Some((e, mono_ns()));
            break;
        }
        if r == 3 && round == 2 {
            std::fs::write(dir.join("running"), b"").unwrap();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if !long {
        assert!(failure.is_none(), "rank {r}: a pause shorter than timeout_ms failed the team: {failure:?}");
        assert_eq!(team.async_error(), None, "rank {r}");
        buf.free().unwrap();
        team.destroy().unwrap();
        assert_clean(&ctx);
        return;
    }
    let (e, at) = failure.expect("a failure");
    assert_eq!(e.kind, ErrorKind::Timeout, "rank {r}: {e}");
    let what = format!("timed out first: rank 3 did not arrive within timeout_ms = {PAUSE_TIMEOUT_MS} ms");
    assert!(e.message.contains(&what), "rank {r}: {e}");
    assert_eq!(team.async_error(), Some(ErrorKind::Timeout), "rank {r}");
    // Host waits end at once too: an allocation that needs the ranks' agreement (a new
    // segment) fails at once, whichever rank comes when.
    let t = Instant::now();
    let e = Buffer::alloc(&team, 32 * MIB).err().expect("a failed team agrees on nothing");
    assert_eq!(e.kind, ErrorKind::Timeout, "rank {r}: {e}");
    assert!(e.message.contains("timed out first"), "rank {r}: {e}");
    assert!(t.elapsed() < Duration::from_secs(1), "rank {r}: the allocation failed after {:?}", t.elapsed());
    if r == 3 {
        println!("{LEARNED} {at}");
        std::fs::write(dir.join("learned"), b"").unwrap();
    } else {
        // The new team forms once rank 3 is back.
        wait_for(&dir.join("learned"), Duration::from_secs(60));
    }
    buf.free().unwrap();
    team.destroy().unwrap();
    let team = Team::init_rank(&ctx, &id2, n as i32, rank, rank).unwrap();
    let buf = Buffer::alloc(&team, 64 * 1024).unwrap();
    for round in 0..3 {
        all_reduce(&team, &buf, round).unwrap();
    }
    assert_eq!(team.async_error(), None, "rank {r}");
    buf.free().unwrap();
    team.destroy().unwrap();
    assert_clean(&ctx);
}

/// Issue 24, one process per rank: rank 3 of four is paused (SIGSTOP) longer than timeout_ms
/// in a stream of all-reduces; the others get TIMEOUT, and rank 3, resumed, gets TIMEOUT within
/// 1 s (its own timeout would take 3 s), naming the rank that timed out first and itself as the
/// one that did not arrive; destroy and a new team work. One host, P2P.
#[test]
fn a_paused_rank_learns_of_the_timeout_within_a_second_of_resuming() {
    if on_gpu() {
        return;
    }
    let took = pause_rank_3(Duration::from_millis(u64::from(PAUSE_TIMEOUT_MS) + 1000), false, 1).unwrap();
    eprintln!("one host, P2P: rank 3 learned of the failure {took:?} after it was resumed");
    assert!(took < Duration::from_secs(1), "rank 3 learned of the failure {took:?} after it was resumed");
}

/// The same with the ranks on two simulated hosts (fabric handles) and the multicast transport.
#[test]
fn a_paused_rank_on_another_host_learns_of_the_timeout_within_a_second() {
    if on_gpu() {
        return;
    }
    let took = pause_rank_3(Duration::from_millis(u64::from(PAUSE_TIMEOUT_MS) + 1000), true, 2).unwrap();
    eprintln!("two hosts, multicast: rank 3 learned of the failure {took:?} after it was resumed");
    assert!(took < Duration::from_secs(1), "rank 3 learned of the failure {took:?} after it was resumed");
}

/// A pause shorter than timeout_ms changes nothing: every all-reduce succeeds with the right
/// sums on every rank.
#[test]
fn a_pause_shorter_than_the_timeout_changes_nothing() {
    if on_gpu() {
        return;
    }
    assert_eq!(pause_rank_3(Duration::from_millis(300), false, 1), None);
}
