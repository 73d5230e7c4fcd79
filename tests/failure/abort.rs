//! Abort from another thread: a collective waiting on a missing rank, a blocked synchronize, a
//! refused destroy, and abort racing destroy from 16 threads.

use super::*;

#[test]
fn abort_from_another_thread_ends_a_collective_waiting_on_a_missing_rank() {
    if on_gpu() {
        return;
    }
    for multicast in [false, true] {
        for c in ALL {
            let ctx = sim_context(4, LONG_MS, multicast);
            let team = Team::create(&ctx, &[0, 1, 2]).unwrap();
            let buf = Buffer::alloc(&team, 64 * 1024).unwrap();
            let s = rank_streams(&team);
            // Rank 0 arrives; ranks 1 and 2 never do.
            run(&buf, 0, 0, 1024, c, s[0]).unwrap();
            let aborter = abort_later(&team, Duration::from_millis(100));
            let e = synchronize(&team, 0, s[0]).unwrap_err();
            let returned = Instant::now();
            let aborted_at = aborter.join().unwrap();
            assert_eq!(e.kind, ErrorKind::Aborted, "{c:?}: {e}");
            assert!(e.message.contains("aborted"), "{e}");
            let took = returned.saturating_duration_since(aborted_at);
            assert!(took < Duration::from_secs(1), "{c:?}: synchronize returned {took:?} after the abort");
            // Every later call returns ABORTED.
            assert_eq!(run(&buf, 1, 0, 1024, c, s[1]).unwrap_err().kind, ErrorKind::Aborted);
            assert_eq!(synchronize(&team, 2, s[2]).unwrap_err().kind, ErrorKind::Aborted);
            assert_eq!(Buffer::alloc(&team, 100).err().unwrap().kind, ErrorKind::Aborted);
            assert_eq!(team.async_error(), Some(ErrorKind::Aborted));
            assert_eq!(buf.free().unwrap_err().kind, ErrorKind::Aborted);
            // Destroy is prompt and releases everything, the live buffer included.
            drop_rank_streams(&team, s);
            let t = Instant::now();
            team.destroy().unwrap();
            assert!(t.elapsed() < Duration::from_secs(1));
            assert_clean(&ctx);
        }
    }
}

#[test]
fn abort_ends_a_synchronize_blocked_in_another_thread() {
    if on_gpu() {
        return;
    }
    let ctx = sim_context(4, LONG_MS, false);
    let team = Team::create(&ctx, &[0, 1]).unwrap();
    let buf = Buffer::alloc(&team, 4096).unwrap();
    let s = rank_streams(&team);
    run(&buf, 1, 0, 256, AR, s[1]).unwrap();
    let (t2, s1) = (team.clone(), s[1]);
    let waiter = std::thread::spawn(move || {
        let e = synchronize(&t2, 1, s1).unwrap_err();
        (e, Instant::now())
    });
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(team.async_error(), None, "nothing failed yet");
    let at = Instant::now();
    team.abort();
    team.abort(); // twice is harmless
    let (e, returned) = waiter.join().unwrap();
    assert_eq!(e.kind, ErrorKind::Aborted);
    assert!(returned.saturating_duration_since(at) < Duration::from_secs(1));
    drop_rank_streams(&team, s);
    team.destroy().unwrap();
    assert_clean(&ctx);
}

/// Destroying a timed-out team that still has a buffer is refused (IN_USE) and leaves the team
/// as it was: its device state words say rank 0 timed out, not aborted (a collective already
/// queued on a rank would otherwise end as ABORTED on a team nobody aborted), and destroy works
/// once the buffer is freed.
#[test]
fn a_refused_destroy_leaves_the_team_alone() {
    let ctx = sim_context(2, 200, false);
    let team = Team::create(&ctx, &[0, 1]).unwrap();
    let buf = Buffer::alloc(&team, 4096).unwrap();
    let s = rank_streams(&team);
    run(&buf, 0, 0, 256, AR, s[0]).unwrap();
    assert_eq!(synchronize(&team, 0, s[0]).unwrap_err().kind, ErrorKind::Timeout);
    assert_eq!(team.destroy().unwrap_err().kind, ErrorKind::InUse);
    for r in 0..2 {
        let state = team.sync_base(r, r) + mcast::kernels::abi::STATE_OFFSET as u64;
        // SAFETY: simulated device memory is host memory; the team's sync regions are live.
        let word = unsafe { (state as *const u32).read_volatile() };
        // Rank 0's timeout, which it told every rank; not an abort.
        assert_eq!(word, mcast::kernels::abi::state_timeout(0), "rank {r}'s state word after a refused destroy");
    }
    assert!(!team.is_aborted());
    assert_eq!(synchronize(&team, 1, s[1]).unwrap_err().kind, ErrorKind::Timeout);
    drop_rank_streams(&team, s);
    buf.free().unwrap();
    team.destroy().unwrap();
    assert_clean(&ctx);
}

#[test]
fn abort_racing_destroy_from_16_threads() {
    if on_gpu() {
        return;
    }
    let ctx = sim_context(4, LONG_MS, false);
    for round in 0..5 {
        let team = Team::create(&ctx, &[0, 1, 2, 3]).unwrap();
        let buf = Buffer::alloc(&team, 4096).unwrap();
        let s = rank_streams(&team);
        // Half the ranks wait on the others on the device.
        run(&buf, 0, 0, 256, AR, s[0]).unwrap();
        run(&buf, 1, 0, 256, AR, s[1]).unwrap();
        let id = handles::insert_team(team.clone());
        let gate = Arc::new(Barrier::new(16));
        let threads: Vec<_> = (0..16)
            .map(|i| {
                let gate = gate.clone();
                std::thread::spawn(move || {
                    gate.wait();
                    let t = mcast_team_t { id };
                    let st = if i % 2 == 0 { mcast_team_abort(t) } else { mcast_team_destroy(t) };
                    (i, st)
                })
            })
            .collect();
        let started = Instant::now();
        let results: Vec<(usize, mcast_status_t)> = threads.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(started.elapsed() < Duration::from_secs(5), "round {round}: {:?}", started.elapsed());
        let destroyed = results.iter().filter(|(i, st)| i % 2 == 1 && st.0 == 0).count();
        assert!(destroyed <= 1, "round {round}: {results:?}");
        for (_, st) in &results {
            // SUCCESS; INVALID_HANDLE once the team was destroyed; IN_USE for a destroy that
            // came before every abort (the team was healthy and its buffer lives).
            assert!(st.0 == 0 || st.0 == 2 || st.0 == 8, "round {round}: {results:?}");
        }
        if destroyed == 0 {
            // Every destroy came before any abort and was refused: abort, destroy.
            assert_eq!(mcast_team_abort(mcast_team_t { id }).0, 0);
            assert_eq!(mcast_team_destroy(mcast_team_t { id }).0, 0);
        }
        drop(buf);
        let d = ctx.driver();
        for (r, st) in s.into_iter().enumerate() {
            d.stream_destroy([0, 1, 2, 3][r], st).unwrap();
        }
    }
    assert_clean(&ctx);
}
