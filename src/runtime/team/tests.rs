//! A rank's collective call does not wait for locks that other ranks' threads hold: the checks
//! every call makes (the sticky error, the one-stream claim, the registered-memory look-up) go
//! on while another thread holds the team's error lock, the claim lock of another device and a
//! read lock of the pool.

use std::sync::mpsc;
use std::time::Duration;

use crate::driver::Stream;
use crate::runtime::config::{Backend, Config, MulticastMode};
use crate::runtime::context::Context;

use super::Team;

/// Runs `f` on another thread and fails unless it returns within 10 s (the thread is left
/// behind then: it may wait on a lock this thread holds until the failure unwinds).
fn finishes(what: &str, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    rx.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| panic!("{what} waited for another rank's lock"));
}

#[test]
fn a_call_does_not_wait_for_locks_other_ranks_hold() {
    let config = Config {
        backend: Backend::Sim,
        multicast: MulticastMode::Off,
        sim_devices: 2,
        sim_device_memory: 256 << 20,
        ..Config::default()
    };
    let ctx = Context::new(config).unwrap();
    let team = Team::create(ctx.env(), &[0, 1]).unwrap();
    {
        // What rank 0's thread may hold at any moment of its own call.
        let _error = team.error.lock();
        let (g0, _) = team.claims.place_of(0);
        let _claims0 = team.claims.group_lock(g0);
        let _pool = team.state.read();
        let team = team.clone();
        finishes("rank 1's checks", move || {
            team.check_usable("rank 1's collective").unwrap();
            assert_eq!(team.claim_stream(1, Stream(0)).unwrap(), 0);
            assert!(team.find_registered(1, 0x1000, 16).is_none());
        });
    }
    // A failed team still reports its error (the flag leads to the lock).
    team.set_error(crate::runtime::error::Error::new(crate::runtime::error::ErrorKind::Timeout, "late peer"));
    let e = team.check_usable("rank 0's collective").unwrap_err();
    assert_eq!(e.message, "rank 0's collective: late peer");
    team.destroy().unwrap();
    let report = ctx.shutdown();
    assert!(report.is_empty(), "{report}");
}
