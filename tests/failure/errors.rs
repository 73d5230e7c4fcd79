//! Caught on the host: one stream for two ranks of one device, and the sticky error through the
//! C API.

use super::*;

#[test]
fn one_stream_for_two_ranks_on_one_device_fails_at_once() {
    if on_gpu() {
        return;
    }
    for c in ALL {
        for use_null in [true, false] {
            let ctx = sim_context(2, LONG_MS, false);
            // Ranks 0 and 2 on device 0, rank 1 on device 1.
            let team = Team::create(&ctx, &[0, 1, 0]).unwrap();
            let buf = Buffer::alloc(&team, 64 * 1024).unwrap();
            let other = ctx.driver().stream_create(0).unwrap();
            let shared = if use_null { Stream::DEFAULT } else { other };
            run(&buf, 0, 0, 64, c, shared).unwrap();
            run(&buf, 1, 0, 64, c, Stream::DEFAULT).unwrap();
            let t = Instant::now();
            let e = run(&buf, 2, 0, 64, c, shared).unwrap_err();
            assert!(t.elapsed() < Duration::from_millis(500));
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{c:?}: {e}");
            assert!(e.message.contains("ranks 0 and 2"), "{e}");
            assert!(e.message.contains("same stream"), "{e}");
            // Nothing was enqueued for rank 2; the call on its own stream completes the round.
            let own = if use_null { other } else { Stream::DEFAULT };
            run(&buf, 2, 0, 64, c, own).unwrap();
            synchronize(&team, 0, shared).unwrap();
            synchronize(&team, 1, Stream::DEFAULT).unwrap();
            synchronize(&team, 2, own).unwrap();
            // Next round: the same stream again for both is refused again.
            run(&buf, 0, 0, 64, c, shared).unwrap();
            assert_eq!(run(&buf, 2, 0, 64, c, shared).unwrap_err().kind, ErrorKind::InvalidArgument);
            team.abort();
            synchronize(&team, 0, shared).unwrap_err();
            buf.free().unwrap_err();
            team.destroy().unwrap();
            ctx.driver().stream_destroy(0, other).unwrap();
            assert_clean(&ctx);
        }
    }
}

#[test]
fn get_error_through_the_c_api() {
    if on_gpu() {
        return;
    }
    let ctx = sim_context(2, 30, false);
    let team = Team::create(&ctx, &[0, 1]).unwrap();
    let id = handles::insert_team(team.clone());
    let t = mcast_team_t { id };
    let mut got = mcast_status_t(77);
    // SAFETY: valid pointers.
    assert_eq!(unsafe { mcast_team_get_error(t, &mut got) }.0, 0);
    assert_eq!(got.0, 0);
    // SAFETY: NULL is checked.
    assert_eq!(unsafe { mcast_team_get_error(t, std::ptr::null_mut()) }.0, 1);
    let buf = Buffer::alloc(&team, 4096).unwrap();
    run(&buf, 0, 0, 16, AR, Stream::DEFAULT).unwrap();
    // The device's timeout is seen without a synchronize.
    let t0 = Instant::now();
    loop {
        // SAFETY: valid pointers.
        assert_eq!(unsafe { mcast_team_get_error(t, &mut got) }.0, 0);
        if got.0 != 0 || t0.elapsed() > Duration::from_secs(5) {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(got.0, 9, "MCAST_ERROR_TIMEOUT");
    assert_eq!(mcast_team_abort(t).0, 0);
    // SAFETY: valid pointers.
    assert_eq!(unsafe { mcast_team_get_error(t, &mut got) }.0, 0);
    assert_eq!(got.0, 11, "MCAST_ERROR_ABORTED wins");
    assert_eq!(mcast_team_destroy(t).0, 0);
    assert_eq!(mcast_team_abort(t).0, 2);
    // SAFETY: valid pointers.
    assert_eq!(unsafe { mcast_team_get_error(t, &mut got) }.0, 2);
    assert_clean(&ctx);
}
