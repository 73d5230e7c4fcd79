//! Timeouts: a rank that stopped issuing learns of one at once, every rank that did not arrive
//! is named, and 100 rounds of timeout, destroy and a new working team without growth.

use super::*;

/// Runs an all-reduce of `count` f32 on every rank of the single-process `team` (`round` picks
/// the inputs) and checks the sums.
fn healthy_all_reduce(team: &Arc<Team>, buf: &Buffer, s: &[Stream], round: usize, count: usize) {
    let n = team.size();
    for r in 0..n {
        buf.write(r as i32, 0, &ar_input(r, round, count)).unwrap();
        run(buf, r as i32, 0, count, AR, s[r]).unwrap();
    }
    for r in 0..n {
        synchronize(team, r as i32, s[r]).unwrap();
        let mut got = vec![0u8; count * 4];
        buf.read(r as i32, 0, &mut got).unwrap();
        assert_eq!(got, ar_sum(n, round, count), "round {round}, rank {r}");
    }
}

/// Issue 24 (a failure is every rank's), one process driving every rank: ranks 0..2 of four run
/// an all-reduce and wait on their streams as an application does (no mcast call), while rank
/// 3 stops issuing for longer than timeout_ms (a stand-in for a paused rank): their kernels time
/// out. When rank 3 issues at last it learns at once (its kernel reads the timeout in its state
/// word), not after a timeout of its own: TIMEOUT naming the rank that timed out first and rank
/// 3 as the one that did not arrive, from synchronize and get_error on every rank. Destroy,
/// then a new team on the same devices works. Both transports; on P2P a small all-reduce (the
/// LL kernel: before, rank 3's call even succeeded, alone) and a large one (barriers).
#[test]
fn a_rank_that_stopped_issuing_learns_of_the_timeout_at_once() {
    if on_gpu() {
        return;
    }
    // Waiting out its own timeout would take 1.5 s: well past the 1 s the contract allows.
    const T: u32 = 1500;
    for (multicast, count) in [(false, 1000), (false, 100_000), (true, 1000)] {
        let ctx = sim_context(4, T, multicast);
        let team = Team::create(&ctx, &[0, 1, 2, 3]).unwrap();
        let buf = Buffer::alloc(&team, 4 * count).unwrap();
        let s = rank_streams(&team);
        healthy_all_reduce(&team, &buf, &s, 0, count);
        let driver = ctx.driver().clone();
        for r in 0..3 {
            buf.write(r as i32, 0, &ar_input(r, 1, count)).unwrap();
            run(&buf, r as i32, 0, count, AR, s[r]).unwrap();
        }
        let t = Instant::now();
        for r in 0..3 {
            driver.stream_synchronize(r as Device, s[r]).unwrap();
        }
        assert!(t.elapsed() >= Duration::from_millis(u64::from(T) * 9 / 10), "{:?}", t.elapsed());
        assert!(team.error().is_none(), "no mcast call saw the timeout yet: the device tells rank 3");
        std::thread::sleep(Duration::from_millis(200));
        // Rank 3 issues its part at last.
        let t = Instant::now();
        buf.write(3, 0, &ar_input(3, 1, count)).unwrap();
        let e = run(&buf, 3, 0, count, AR, s[3]).and_then(|()| synchronize(&team, 3, s[3])).unwrap_err();
        let took = t.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "multicast {multicast}, count {count}: rank 3 learned after {took:?}: {e}"
        );
        assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
        assert!(e.message.starts_with("rank 3: rank "), "{e}");
        assert!(e.message.contains("timed out first: rank 3 did not arrive within timeout_ms = 1500 ms"), "{e}");
        for r in 0..4 {
            let e = synchronize(&team, r, s[r as usize]).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Timeout, "rank {r}: {e}");
            assert!(e.message.contains("rank 3 did not arrive"), "rank {r}: {e}");
        }
        assert_eq!(team.async_error(), Some(ErrorKind::Timeout));
        assert_eq!(run(&buf, 0, 0, count, AR, s[0]).unwrap_err().kind, ErrorKind::Timeout);
        // Destroy, and a new team on the same devices works.
        drop_rank_streams(&team, s);
        buf.free().unwrap();
        team.destroy().unwrap();
        let team = Team::create(&ctx, &[0, 1, 2, 3]).unwrap();
        let buf = Buffer::alloc(&team, 4 * count).unwrap();
        let s = rank_streams(&team);
        healthy_all_reduce(&team, &buf, &s, 2, count);
        assert_eq!(team.async_error(), None);
        drop_rank_streams(&team, s);
        buf.free().unwrap();
        team.destroy().unwrap();
        assert_clean(&ctx);
    }
}

/// Ranks 2 and 3 of four never arrive: the timeout names both (the barrier's wait reads every
/// rank's barrier count when it times out), on both ranks that waited, on either transport.
#[test]
fn every_rank_that_did_not_arrive_is_named() {
    if on_gpu() {
        return;
    }
    // Past the LL kernels' size: barriers (an LL wait names the rank whose line it waited for).
    let count = 100_000;
    for multicast in [false, true] {
        let ctx = sim_context(4, 200, multicast);
        let team = Team::create(&ctx, &[0, 1, 2, 3]).unwrap();
        let buf = Buffer::alloc(&team, 4 * count).unwrap();
        let s = rank_streams(&team);
        for r in 0..2 {
            run(&buf, r, 0, count, AR, s[r as usize]).unwrap();
        }
        for r in 0..2 {
            let e = synchronize(&team, r, s[r as usize]).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
            assert!(
                e.message.contains("timed out first: ranks 2 and 3 did not arrive within timeout_ms = 200 ms"),
                "{e}"
            );
        }
        assert_eq!(team.async_error(), Some(ErrorKind::Timeout));
        drop_rank_streams(&team, s);
        buf.free().unwrap();
        team.destroy().unwrap();
        assert_clean(&ctx);
    }
}

fn count_dir(path: &str) -> usize {
    std::fs::read_dir(path).map(|d| d.count()).unwrap_or(0)
}

/// Runs in a process of its own (the counts of descriptors and threads are per process, and
/// the other tests of this binary run beside it).
#[test]
fn timeout_then_recovery_100_rounds_without_growth() {
    if on_gpu() {
        return;
    }
    if std::env::var(ROLE).as_deref() != Ok("recovery") {
        let st = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "timeout::timeout_then_recovery_100_rounds_without_growth",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE, "recovery")
            .status()
            .unwrap();
        assert!(st.success(), "{st:?}");
        return;
    }
    let ctx = sim_context(4, 20, false);
    let sim = ctx.driver().as_sim().unwrap();
    let mut baseline = None;
    for round in 0..100 {
        // A team whose rank 1 never arrives: rank 0 times out.
        let team = Team::create(&ctx, &[0, 1]).unwrap();
        let buf = Buffer::alloc(&team, 4096).unwrap();
        run(&buf, 0, 0, 256, AR, Stream::DEFAULT).unwrap();
        assert_eq!(synchronize(&team, 0, Stream::DEFAULT).unwrap_err().kind, ErrorKind::Timeout);
        assert_eq!(team.async_error(), Some(ErrorKind::Timeout));
        // The buffer is freed and the team destroyed at once (no peer is waited for).
        let t = Instant::now();
        buf.free().unwrap();
        team.destroy().unwrap();
        assert!(t.elapsed() < Duration::from_secs(1), "round {round}: destroy took {:?}", t.elapsed());
        assert!(sim.ledger().is_empty(), "round {round}: {}", sim.ledger());
        // A new team on the same devices works.
        let team = Team::create(&ctx, &[0, 1]).unwrap();
        let buf = Buffer::alloc(&team, 4096).unwrap();
        for r in 0..2 {
            buf.write(r, 0, &(r as f32 + 1.0).to_ne_bytes()).unwrap();
        }
        for r in 0..2 {
            run(&buf, r, 0, 1, AR, Stream::DEFAULT).unwrap();
        }
        for r in 0..2 {
            synchronize(&team, r, Stream::DEFAULT).unwrap();
            let mut got = [0u8; 4];
            buf.read(r, 0, &mut got).unwrap();
            assert_eq!(f32::from_ne_bytes(got), 3.0, "round {round}, rank {r}");
        }
        assert_eq!(team.async_error(), None);
        buf.free().unwrap();
        team.destroy().unwrap();
        assert!(sim.ledger().is_empty(), "round {round}: {}", sim.ledger());
        let now = (count_dir("/proc/self/fd"), count_dir("/proc/self/task"), sim.worker_threads());
        match baseline {
            None if round == 4 => baseline = Some(now),
            Some(b) => assert!(
                now.0 <= b.0 && now.1 <= b.1 && now.2 <= b.2,
                "round {round}: (fds, threads, sim workers) grew from {b:?} to {now:?}"
            ),
            None => {}
        }
    }
    assert_clean(&ctx);
}
