//! Across processes: abort during an allocation agreement and from a peer process, a killed
//! peer, split; the ranks' side (`child`, selected by `MCAST_FAIL_CHILD`).

use super::paused::pause_child;
use super::*;

fn spawn(n: usize, role: &str) {
    let id = hex(&new_unique_id().unwrap());
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..n)
        .map(|r| {
            Command::new(&exe)
                .args(["--exact", "processes::child", "--nocapture", "--test-threads=1"])
                .env(ROLE, format!("{role}:{n}:{r}:{id}"))
                .env_remove("MCAST_SIM_FAULTS")
                .spawn()
                .unwrap()
        })
        .collect();
    let st: Vec<_> = children.into_iter().map(|mut c| c.wait().unwrap()).collect();
    for (r, s) in st.iter().enumerate() {
        // The "killed" role's last rank dies on purpose.
        let dies = role == "killed" && r == n - 1;
        assert!(s.success() != dies, "{role}: rank {r}: {st:?}");
    }
}

#[test]
fn abort_during_multi_process_alloc_agreement() {
    if !on_gpu() {
        spawn(3, "abort-alloc");
    }
}

/// A peer's abort seen on the device (its state word, written through the peer mapping) before
/// the aborting process's frame reaches the hub: the process that saw it tells the connections
/// too, so the hub, waiting for it in an agreement, reports the abort and not its exit.
#[test]
fn an_abort_seen_on_the_device_reaches_the_hub_before_the_exit() {
    if !on_gpu() {
        spawn(3, "device-abort");
    }
}

#[test]
fn abort_from_a_peer_process_ends_device_waits() {
    if !on_gpu() {
        spawn(2, "abort-peer");
    }
}

#[test]
fn abort_and_destroy_after_a_peer_was_killed() {
    if !on_gpu() {
        spawn(3, "killed");
    }
}

#[test]
fn split_multi_process() {
    if !on_gpu() {
        spawn(4, "split");
    }
}

/// Polls `team`'s asynchronous error until it is set (at most 5 s).
fn wait_for_error(team: &Team) -> Option<ErrorKind> {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if let Some(k) = team.async_error() {
            return Some(k);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

#[test]
fn child() {
    let Ok(spec) = std::env::var(ROLE) else { return };
    if spec == "recovery" {
        return;
    }
    let f: Vec<&str> = spec.split(':').collect();
    let (role, n, r, id) = (f[0], f[1].parse::<usize>().unwrap(), f[2].parse::<usize>().unwrap(), unhex(f[3]));
    if role == "pause" {
        return pause_child(r, &id);
    }
    let rank = r as i32;
    let ctx = sim_context(4, LONG_MS, false);
    let team = Team::init_rank(&ctx, &id, n as i32, rank, rank).unwrap();
    match role {
        "abort-alloc" => {
            // Ranks 0 and 1 agree on an allocation that rank 2 never makes; rank 1 aborts from
            // another thread while both wait (rank 0, the hub, in its exchange too).
            match r {
                0 | 1 => {
                    let aborter = (r == 1).then(|| abort_later(&team, Duration::from_millis(200)));
                    let t = Instant::now();
                    // Past the first segment's spare room: a new segment, agreed by every rank.
                    let e = Buffer::alloc(&team, 4 * MIB).err().expect("the allocation is aborted");
                    assert_eq!(e.kind, ErrorKind::Aborted, "rank {r}: {e}");
                    assert!(t.elapsed() < Duration::from_secs(2), "rank {r} took {:?}", t.elapsed());
                    if let Some(a) = aborter {
                        a.join().unwrap();
                    }
                }
                _ => {
                    // Rank 2 is told without calling anything that waits.
                    assert_eq!(wait_for_error(&team), Some(ErrorKind::Aborted), "rank 2");
                    assert_eq!(Buffer::alloc(&team, 4096).err().unwrap().kind, ErrorKind::Aborted);
                }
            }
            team.destroy().unwrap();
        }
        "device-abort" => {
            match r {
                0 | 1 => {
                    if r == 1 {
                        // The device half of an abort whose frame never comes: rank 2's state
                        // word, through rank 1's mapping of it.
                        let at = team.sync_bases(1)[2] + mcast::kernels::abi::STATE_OFFSET as u64;
                        let aborted = mcast::kernels::abi::STATE_ABORTED;
                        ctx.driver().poke_u32(team.devices()[1], at, aborted).unwrap();
                    }
                    // Rank 0, the hub, waits in the agreement for rank 2, which leaves.
                    let e = Buffer::alloc(&team, 4 * MIB).err().expect("the allocation fails");
                    assert_eq!(e.kind, ErrorKind::Aborted, "rank {r}: {e}");
                }
                _ => {
                    assert_eq!(wait_for_error(&team), Some(ErrorKind::Aborted), "rank 2");
                }
            }
            team.destroy().unwrap();
        }
        "abort-peer" => {
            let buf = Buffer::alloc(&team, 4096).unwrap();
            if r == 0 {
                // Waits on the device for rank 1, which aborts instead of arriving.
                run(&buf, 0, 0, 256, AR, Stream::DEFAULT).unwrap();
                let t = Instant::now();
                let e = synchronize(&team, 0, Stream::DEFAULT).unwrap_err();
                assert_eq!(e.kind, ErrorKind::Aborted, "{e}");
                assert!(t.elapsed() < Duration::from_secs(3), "took {:?}", t.elapsed());
                eprintln!("rank 0: synchronize returned ABORTED {:?} after it began", t.elapsed());
            } else {
                std::thread::sleep(Duration::from_millis(300));
                team.abort();
            }
            assert_eq!(buf.free().unwrap_err().kind, ErrorKind::Aborted);
            team.destroy().unwrap();
        }
        "killed" => {
            let buf = Buffer::alloc(&team, 4096).unwrap();
            if r == 2 {
                // A hard death: no unwinding, no cleanup; the others' statuses are what counts.
                std::process::abort();
            }
            // Ranks 0 and 1 wait on the device for rank 2; a watchdog thread gives up on it.
            run(&buf, rank, 0, 256, AR, Stream::DEFAULT).unwrap();
            let aborter = abort_later(&team, Duration::from_millis(300));
            let e = synchronize(&team, rank, Stream::DEFAULT).unwrap_err();
            let returned = Instant::now();
            let at = aborter.join().unwrap();
            assert_eq!(e.kind, ErrorKind::Aborted, "rank {r}: {e}");
            assert!(returned.saturating_duration_since(at) < Duration::from_secs(1));
            let t = Instant::now();
            team.destroy().unwrap();
            assert!(t.elapsed() < Duration::from_secs(1), "rank {r}: destroy took {:?}", t.elapsed());
            drop(buf);
            assert_clean(&ctx);
            return;
        }
        "split" => {
            // Colors r % 2, keys reversing the order: {0, 2} -> ranks (2, 0), {1, 3} -> (3, 1).
            let made = team.split(&[rank % 2], &[-rank]).unwrap();
            let sub = made[0].clone().unwrap();
            assert_eq!(sub.size(), 2);
            let want_rank = if r >= 2 { 0 } else { 1 };
            assert_eq!(sub.local_rank(), Some(want_rank));
            let buf = Buffer::alloc(&sub, 4096).unwrap();
            buf.write(want_rank as i32, 0, &(rank + 1).to_ne_bytes()).unwrap();
            let ar = Collective::AllReduce { dtype: DType::I32, op: RedOp::Sum };
            run(&buf, want_rank as i32, 0, 1, ar, Stream::DEFAULT).unwrap();
            synchronize(&sub, want_rank as i32, Stream::DEFAULT).unwrap();
            let mut got = [0u8; 4];
            buf.read(want_rank as i32, 0, &mut got).unwrap();
            let color = r % 2;
            assert_eq!(i32::from_ne_bytes(got), (color + 1 + color + 3) as i32, "rank {r}");
            buf.free().unwrap();
            // Every rank is past its sub-team's collective (an agreement of the parent).
            Buffer::alloc(&team, 4 * MIB).unwrap().free().unwrap();
            // Color 0's team is aborted; color 1's and the parent are not touched.
            if color == 0 {
                sub.abort();
            }
            std::thread::sleep(Duration::from_millis(100));
            let want = if color == 0 { Some(ErrorKind::Aborted) } else { None };
            assert_eq!(sub.async_error(), want, "rank {r}");
            assert_eq!(team.async_error(), None, "rank {r}");
            sub.destroy().unwrap();
            // The parent still agrees and works.
            let b = Buffer::alloc(&team, 4096).unwrap();
            run(&b, rank, 0, 16, AR, Stream::DEFAULT).unwrap();
            synchronize(&team, rank, Stream::DEFAULT).unwrap();
            b.free().unwrap();
            team.destroy().unwrap();
        }
        other => panic!("unknown role {other}"),
    }
    assert_clean(&ctx);
}
