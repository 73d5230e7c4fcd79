//! Bootstrap tests with thread ranks over real TCP connections.

use std::io::Write;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use super::id::ID_MAGIC;
use super::tcp::SECRET_BYTES;
use super::*;

const MAX: usize = 72;

pub(super) fn team(n: usize, hosts: impl Fn(usize) -> String + Sync, timeout_ms: u32) -> Vec<Bootstrap> {
    let id = new_unique_id().unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let host = hosts(r);
                s.spawn(move || Bootstrap::init_id(&id, n as i64, r as i64, MAX, timeout_ms, host).unwrap())
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn allgather_of_72_ranks_over_tcp() {
    let t = Instant::now();
    let boots = team(72, |_| "one".into(), 30_000);
    let formed = t.elapsed();
    std::thread::scope(|s| {
        for b in &boots {
            s.spawn(move || {
                let r = b.rank();
                let parts = b.allgather("x", Ok(()), &[r as u8; 5], &[]).unwrap();
                assert_eq!(parts.len(), 72);
                for (q, p) in parts.iter().enumerate() {
                    assert_eq!(p.bytes, vec![q as u8; 5]);
                }
                assert_eq!(b.broadcast("b", 71, &[r as u8]).unwrap(), vec![71u8]);
            });
        }
    });
    eprintln!("72 thread ranks formed a bootstrap in {formed:?}");
}

/// Back-to-back exchanges, where the waiting rank takes most frames from the socket itself and
/// the reader thread the rest (`reader.rs`): every part arrives whole, in its exchange, from its
/// rank, in order (a frame taken twice, lost or queued out of order would fail a label or a
/// payload here, or time out).
#[test]
fn back_to_back_exchanges_keep_every_frame_in_order() {
    let boots = team(4, |_| "one".into(), 30_000);
    std::thread::scope(|s| {
        for b in &boots {
            s.spawn(move || {
                let r = b.rank();
                for i in 0..2000u32 {
                    let mut mine = i.to_le_bytes().to_vec();
                    // Sizes vary so that some frames arrive in pieces.
                    mine.resize(4 + (i as usize * 37 + r * 11) % 3000, r as u8);
                    let parts = b.allgather(&format!("x{}", i % 7), Ok(()), &mine, &[]).unwrap();
                    for (q, p) in parts.iter().enumerate() {
                        assert_eq!(p.bytes.len(), 4 + (i as usize * 37 + q * 11) % 3000, "exchange {i}, rank {q}");
                        assert_eq!(p.bytes[..4], i.to_le_bytes(), "exchange {i}, rank {q}");
                        assert!(p.bytes[4..].iter().all(|&x| x == q as u8), "exchange {i}, rank {q}");
                    }
                }
            });
        }
    });
}

#[test]
fn descriptors_go_only_to_ranks_of_the_same_host() {
    let boots = team(4, |r| format!("host{}", r / 2), 10_000);
    std::thread::scope(|s| {
        for b in &boots {
            s.spawn(move || {
                let r = b.rank();
                assert!(b.same_host(r, r ^ 1) && !b.same_host(r, (r + 2) % 4));
                let file = std::fs::File::open("/dev/null").unwrap();
                let parts = b.allgather("fds", Ok(()), &[], &[file.as_raw_fd()]).unwrap();
                for (q, p) in parts.iter().enumerate() {
                    let want = usize::from(q != r && b.same_host(q, r));
                    assert_eq!(p.fds.len(), want, "rank {r} from rank {q}");
                }
            });
        }
    });
}

#[test]
fn a_failure_on_one_rank_fails_every_rank_and_breaks_the_bootstrap() {
    let boots = team(3, |_| "h".into(), 10_000);
    std::thread::scope(|s| {
        for b in &boots {
            s.spawn(move || {
                let st = if b.rank() == 2 { Err((7, "boom".to_string())) } else { Ok(()) };
                let e = b.agree("v", st).unwrap_err();
                assert_eq!(e.kind, Kind::Failed(7));
                assert!(e.message.contains("boom"), "{}", e.message);
                assert!(b.agree("w", Ok(())).is_err());
            });
        }
    });
}

#[test]
fn abort_ends_waits_on_every_rank_in_milliseconds() {
    let boots = team(3, |_| "h".into(), 60_000);
    let t = Instant::now();
    std::thread::scope(|s| {
        // Ranks 0 and 1 wait in an exchange rank 2 never joins; rank 2 aborts instead.
        for b in &boots[..2] {
            s.spawn(move || {
                let e = b.agree("never", Ok(())).unwrap_err();
                assert_eq!(e.kind, Kind::Aborted, "{}", e.message);
                assert!(e.message.contains("stop now"), "{}", e.message);
            });
        }
        std::thread::sleep(Duration::from_millis(100));
        boots[2].abort("stop now");
    });
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    for b in &boots {
        assert!(b.aborted());
        assert_eq!(b.agree("after", Ok(())).unwrap_err().kind, Kind::Aborted);
    }
}

#[test]
fn an_abort_is_seen_without_an_exchange() {
    let boots = team(3, |_| "h".into(), 60_000);
    boots[1].abort("from a non-hub rank");
    let t = Instant::now();
    while !(boots[0].aborted() && boots[2].aborted()) {
        assert!(t.elapsed() < Duration::from_secs(2), "the abort did not arrive");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(boots[2].abort_reason().contains("rank 1"));
}

/// A rank's failure ([`Bootstrap::fail`], a timeout) told by a non-hub rank reaches every rank
/// without an exchange, ends a waiting exchange with that kind and reason in milliseconds, is
/// not replaced by a later failure of another kind, and an abort still travels after it.
#[test]
fn a_failure_told_by_one_rank_ends_every_rank_s_waits() {
    let boots = team(4, |r| format!("host{}", r / 2), 60_000);
    let t = Instant::now();
    std::thread::scope(|s| {
        // Ranks 0 and 1 wait in an exchange ranks 2 and 3 never join; rank 2 tells of a timeout.
        for b in &boots[..2] {
            s.spawn(move || {
                let e = b.agree("never", Ok(())).unwrap_err();
                assert_eq!(e.kind, Kind::Timeout, "{}", e.message);
                assert!(e.message.contains("rank 2 timed out first"), "{}", e.message);
            });
        }
        std::thread::sleep(Duration::from_millis(100));
        boots[2].fail(Kind::Timeout, "rank 2 timed out first");
    });
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // Rank 3 waits in nothing: it is told all the same. The hub relays the failure; a rank whose
    // exchange the hub ended with it may record the relayed word a moment later.
    while let Some(b) = boots.iter().find(|b| b.failure().is_none()) {
        assert!(t.elapsed() < Duration::from_secs(2), "the failure did not reach rank {}", b.rank());
        std::thread::sleep(Duration::from_millis(1));
    }
    for b in &boots {
        assert_eq!(b.failure(), Some((Kind::Timeout, "rank 2 timed out first".to_string())), "rank {}", b.rank());
        assert!(!b.aborted());
        assert_eq!(b.agree("after", Ok(())).unwrap_err().kind, Kind::Timeout);
    }
    // A second failure does not replace the first; an abort does, everywhere.
    boots[0].fail(Kind::Timeout, "rank 0 timed out first");
    assert_eq!(boots[0].failure().unwrap().1, "rank 2 timed out first");
    boots[3].abort("giving up");
    let t = Instant::now();
    while !boots.iter().all(|b| b.aborted()) {
        assert!(t.elapsed() < Duration::from_secs(2), "the abort did not arrive after the failure");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(boots[1].abort_reason().contains("giving up"));
    assert_eq!(boots[1].failure().unwrap().0, Kind::Aborted);
}

#[test]
fn a_dead_peer_is_a_timeout_at_once() {
    let mut boots = team(3, |_| "h".into(), 60_000);
    drop(boots.pop());
    let t = Instant::now();
    std::thread::scope(|s| {
        for b in &boots {
            s.spawn(move || {
                let e = b.agree("x", Ok(())).unwrap_err();
                assert_eq!(e.kind, Kind::Timeout, "{}", e.message);
            });
        }
    });
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

#[test]
fn a_missing_rank_times_out_within_timeout_ms() {
    let id = new_unique_id().unwrap();
    let t = Instant::now();
    let e = Bootstrap::init_id(&id, 2, 0, MAX, 300, "h".into()).unwrap_err();
    assert_eq!(e.kind, Kind::Timeout);
    assert!(t.elapsed() < Duration::from_millis(1300), "{:?}", t.elapsed());
}

#[test]
fn strangers_on_the_port_are_dropped_without_disturbing_the_team() {
    let id = new_unique_id().unwrap();
    let addr = UniqueId::decode(&id).unwrap().addr;
    // Strangers first: silent, garbage, oversized frame, wrong secret.
    let silent = TcpStream::connect(addr).unwrap();
    let mut garbage = TcpStream::connect(addr).unwrap();
    garbage.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut huge = TcpStream::connect(addr).unwrap();
    huge.write_all(&[0xff, 0xff, 0xff, 0x7f, 2]).unwrap();
    let wrong = std::thread::spawn(move || {
        tcp::connect(addr, &[0u8; SECRET_BYTES], &tcp::Bind::default(), Deadline::after_ms(3000))
    });
    let t = Instant::now();
    let n = 4;
    let boots: Vec<Bootstrap> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| s.spawn(move || Bootstrap::init_id(&id, n as i64, r as i64, MAX, 10_000, "h".into()).unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // The silent stranger holds its handshake for 2 s; the team did not wait for it.
    assert!(t.elapsed() < Duration::from_millis(1900), "{:?}", t.elapsed());
    assert!(wrong.join().unwrap().is_err());
    std::thread::scope(|s| {
        for b in &boots {
            s.spawn(move || assert_eq!(b.allgather("x", Ok(()), &[1], &[]).unwrap().len(), n));
        }
    });
    drop(silent);
}

fn oob_team(n: usize, bad: impl Fn(usize) -> (i64, Option<String>, bool) + Sync) -> Vec<Result<Bootstrap, BootError>> {
    let buf = Arc::new(parking_lot::Mutex::new(vec![0u8; n * oob::RECORD]));
    let barrier = Arc::new(Barrier::new(n));
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (buf, barrier, bad) = (buf.clone(), barrier.clone(), &bad);
                s.spawn(move || {
                    let (rank, problem, fail) = bad(r);
                    let mut calls = 0;
                    let mut gather = |send: &[u8], recv: &mut [u8]| {
                        calls += 1;
                        buf.lock()[r * send.len()..(r + 1) * send.len()].copy_from_slice(send);
                        barrier.wait();
                        recv.copy_from_slice(&buf.lock());
                        barrier.wait();
                        if fail {
                            Err("the allgather returned 3".to_string())
                        } else {
                            Ok(())
                        }
                    };
                    let b = Bootstrap::init_oob(&mut gather, n as i64, rank, MAX, 1500, "h".into(), problem);
                    assert_eq!(calls, 1);
                    b
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// A rank of another protocol revision (or version): the team does not form, and every rank's
/// message names both revisions; rank 0 and the rank that joined before do not wait out the
/// timeout.
#[test]
fn ranks_of_two_protocol_revisions_refuse_to_form_a_team_naming_both() {
    let other = tcp::PROTOCOL + 1;
    for odd in [1, 2] {
        let t = Instant::now();
        let results = oob_team(3, |r| {
            if r == odd {
                tcp::PROTOCOL_OVERRIDE.with(|c| c.set(Some(other)));
            }
            (r as i64, None, false)
        });
        let took = t.elapsed();
        for (r, b) in results.iter().enumerate() {
            let e = b.as_ref().expect_err("a team formed across two protocol revisions");
            assert_eq!(e.kind, Kind::InvalidArgument, "rank {r}: {}", e.message);
            for needle in [format!("bootstrap protocol {other}"), format!("bootstrap protocol {}", tcp::PROTOCOL)] {
                assert!(e.message.contains(&needle), "rank {r}: no {needle:?} in {}", e.message);
            }
        }
        assert!(took < Duration::from_millis(1400), "{took:?} (timeout 1500 ms)");
    }
}

/// Rank 0 stalls past the deadline in the middle of an agreement (after it gathered every part,
/// before it sent the result): when it resumes it fails with the others instead of succeeding
/// alone.
#[test]
fn a_hub_that_resumes_past_the_deadline_fails_with_the_others() {
    let n = 3;
    let id = new_unique_id().unwrap();
    let boots: Vec<Bootstrap> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| s.spawn(move || Bootstrap::init_id(&id, n as i64, r as i64, MAX, 400, "h".into()).unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    boots[0].shared.pauses.lock().push((super::exchange::Step::Gathered, 700));
    let results: Vec<Result<(), BootError>> = std::thread::scope(|s| {
        let hs: Vec<_> = boots.iter().map(|b| s.spawn(move || b.agree("paused", Ok(())))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, res) in results.iter().enumerate() {
        let e = res.as_ref().expect_err("a rank succeeded while another failed");
        assert_eq!(e.kind, Kind::Timeout, "rank {r}: {}", e.message);
    }
    let hub = results[0].as_ref().unwrap_err();
    assert!(hub.message.contains("outlived timeout_ms = 400 ms"), "{}", hub.message);
}

#[test]
fn the_callers_allgather_forms_a_team_used_once() {
    let boots: Vec<Bootstrap> = oob_team(4, |r| (r as i64, None, false)).into_iter().map(Result::unwrap).collect();
    std::thread::scope(|s| {
        for b in &boots {
            s.spawn(move || {
                let parts = b.allgather("x", Ok(()), &[b.rank() as u8], &[]).unwrap();
                assert_eq!(parts.iter().map(|p| p.bytes[0]).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
            });
        }
    });
}

#[test]
fn bad_oob_arguments_fail_on_every_rank() {
    // Rank 2 passes an out-of-range rank: every rank fails with INVALID_ARGUMENT.
    for r in oob_team(3, |r| (if r == 2 { 7 } else { r as i64 }, None, false)) {
        assert_eq!(r.unwrap_err().kind, Kind::InvalidArgument);
    }
    // Rank 1 has a local problem (a bad device): every rank fails, naming it.
    for r in oob_team(3, |r| (r as i64, (r == 1).then(|| "device 9 is out of range".to_string()), false)) {
        let e = r.unwrap_err();
        assert_eq!(e.kind, Kind::InvalidArgument);
        assert!(e.message.contains("device 9"), "{}", e.message);
    }
    // Every callback fails: every rank reports the value.
    for r in oob_team(2, |r| (r as i64, None, true)) {
        assert!(r.unwrap_err().message.contains("returned 3"));
    }
    // A team size out of range: the callback is never called.
    let mut called = false;
    let mut g = |_: &[u8], _: &mut [u8]| {
        called = true;
        Ok(())
    };
    let e = Bootstrap::init_oob(&mut g, 73, 0, MAX, 100, "h".into(), None).unwrap_err();
    assert_eq!(e.kind, Kind::InvalidArgument);
    assert!(e.message.contains("1 to 72"));
    let e = Bootstrap::init_oob(&mut g, 0, 0, MAX, 100, "h".into(), None).unwrap_err();
    assert_eq!(e.kind, Kind::InvalidArgument);
    assert!(!called);
}

#[test]
fn ids_round_trip_and_foreign_ids_are_refused() {
    let a = new_unique_id().unwrap();
    let b = new_unique_id().unwrap();
    assert_ne!(a, b);
    let id = UniqueId::decode(&a).unwrap();
    assert_eq!(id.encode(), a);
    let v6 = UniqueId { addr: "[fd00::1]:29500".parse().unwrap(), secret: [3; 32], rank0_listens: true };
    assert_eq!(UniqueId::decode(&v6.encode()).unwrap(), v6);
    let mut old = [0u8; ID_BYTES];
    old[..8].copy_from_slice(b"MCASTID1");
    let e = UniqueId::decode(&old).unwrap_err();
    assert!(e.message.contains("another version"), "{}", e.message);
    assert!(UniqueId::decode(&[0u8; ID_BYTES]).is_err());
    let e = Bootstrap::init_id(&old, 2, 0, MAX, 100, "h".into()).unwrap_err();
    assert_eq!(e.kind, Kind::InvalidArgument);
}

/// A small deterministic generator (xorshift) for the fuzz tests.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn fuzz_the_frame_decoder() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let cap = 4096;
    // A valid frame to mutate.
    let mut valid = Vec::new();
    let mut e = Enc::default();
    e.str("label").u32(0).bytes(&[1, 2, 3]).u32(0);
    tcp::write_frame(&mut valid, kind::EXCH, &e.0).unwrap();
    for i in 0..20_000 {
        let input: Vec<u8> = if i % 2 == 0 {
            let len = (rng.next() % 64) as usize;
            (0..len).map(|_| rng.next() as u8).collect()
        } else {
            let mut v = valid.clone();
            for _ in 0..1 + rng.next() % 4 {
                let at = (rng.next() as usize) % v.len();
                v[at] = rng.next() as u8;
            }
            v.truncate(v.len() - (rng.next() as usize % 3));
            v
        };
        let mut cur = std::io::Cursor::new(&input);
        while let Ok((_, payload)) = tcp::read_frame(&mut cur, cap) {
            assert!(payload.len() <= cap);
            // The decoders over a payload fail cleanly.
            let mut d = Dec(&payload);
            let _ = (d.str(), d.u32(), d.bytes(), d.u64());
        }
        let mut id = [0u8; ID_BYTES];
        for (j, b) in id.iter_mut().enumerate() {
            *b = if j < 8 && i % 3 == 0 { ID_MAGIC[j] } else { rng.next() as u8 };
        }
        let _ = UniqueId::decode(&id);
        let rec: Vec<u8> = (0..oob::RECORD * 2).map(|_| rng.next() as u8).collect();
        assert!(oob::read_records(&rec, 2, 0).is_err());
    }
    // A length above the cap is refused before anything is allocated.
    let mut cur = std::io::Cursor::new(vec![0xff, 0xff, 0xff, 0xff, 1]);
    assert!(matches!(tcp::read_frame(&mut cur, cap), Err(tcp::FrameError::TooLarge(_))));
}

/// Formation time of thread ranks over TCP at 2, 8, 32 and 72 ranks (printed with
/// --nocapture); it must stay well under the timeout even on a loaded machine.
#[test]
fn formation_time_by_team_size() {
    for n in [2, 8, 32, 72] {
        let t = Instant::now();
        let boots = team(n, |r| format!("host{}", r % 2), 30_000);
        let formed = t.elapsed();
        std::thread::scope(|s| {
            for b in &boots {
                s.spawn(move || b.agree("ready", Ok(())).unwrap());
            }
        });
        eprintln!(
            "{n} thread ranks on 2 hosts: bootstrap formed in {formed:?}, one agree in {:?}",
            t.elapsed() - formed
        );
        assert!(formed < Duration::from_secs(15), "{n} ranks took {formed:?}");
    }
}
