//! Tests of the bootstrap against a network that lies: a relay between a rank and the hub that
//! alters, replays or injects frames, or only records them; the root's rank checks; queue caps.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::tcp::{self, kind, SECRET_BYTES};
use super::*;

const MAX: usize = 72;

/// What the relay does to the frames one way, counted after the handshake.
#[derive(Clone, Copy, Debug)]
enum Tamper {
    /// Relays every frame as it is.
    Nothing,
    /// Flips one bit of the last byte of frame `n`.
    Flip(usize),
    /// Sends frame `frame` again just before frame `at`.
    Replay { frame: usize, at: usize },
    /// Sends a frame of its own making just before frame `n`.
    Inject(usize),
}

/// A TCP relay between one rank and the hub that records every byte either way.
struct Relay {
    addr: SocketAddr,
    capture: Arc<Mutex<Vec<u8>>>,
}

fn is_handshake(k: u8) -> bool {
    // HELLO, PROOF and the client's nonce.
    matches!(k, 1 | 2 | 5)
}

fn pump(mut from: TcpStream, mut to: TcpStream, tamper: Tamper, capture: Arc<Mutex<Vec<u8>>>) {
    let _ = from.set_read_timeout(Some(Duration::from_secs(20)));
    let mut sent: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut head = [0u8; 5];
        if from.read_exact(&mut head).is_err() {
            break;
        }
        let len = u32::from_le_bytes(head[..4].try_into().unwrap()) as usize;
        if len > 4 << 20 {
            break;
        }
        let mut frame = head.to_vec();
        frame.resize(5 + len, 0);
        if from.read_exact(&mut frame[5..]).is_err() {
            break;
        }
        capture.lock().extend_from_slice(&frame);
        if !is_handshake(head[4]) {
            let i = sent.len();
            match tamper {
                Tamper::Flip(n) if n == i => *frame.last_mut().unwrap() ^= 1,
                Tamper::Replay { frame: old, at } if at == i => {
                    let _ = to.write_all(&sent[old]);
                }
                Tamper::Inject(n) if n == i => {
                    // What an attacker without the keys can write: a well-formed plaintext part.
                    let mut e = Enc::default();
                    e.str("x").u32(0).bytes(&[9]).u32(0);
                    let _ = tcp::write_frame(&mut to, kind::EXCH, &e.0);
                }
                _ => {}
            }
            sent.push(frame.clone());
        }
        if to.write_all(&frame).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

impl Relay {
    /// Listens on loopback; relays the first connection to `target`, doing `up` to what the
    /// client sends and `down` to what it receives.
    fn start(target: SocketAddr, up: Tamper, down: Tamper) -> Relay {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let capture = Arc::new(Mutex::new(Vec::new()));
        let cap = capture.clone();
        std::thread::spawn(move || {
            l.set_nonblocking(true).unwrap();
            let t = Instant::now();
            let client = loop {
                match l.accept() {
                    Ok((s, _)) => break s,
                    Err(_) if t.elapsed() < Duration::from_secs(20) => std::thread::sleep(Duration::from_millis(2)),
                    Err(_) => return,
                }
            };
            client.set_nonblocking(false).unwrap();
            let Ok(server) = TcpStream::connect(target) else { return };
            let (c2, s2, cap2) = (client.try_clone().unwrap(), server.try_clone().unwrap(), cap.clone());
            std::thread::spawn(move || pump(s2, c2, down, cap2));
            pump(client, server, up, cap);
        });
        Relay { addr, capture }
    }
}

/// Three ranks (on three hosts) through the caller's allgather; rank 1 reaches the hub only
/// through a relay doing `up` and `down`.
fn team_through_relay(up: Tamper, down: Tamper) -> (Vec<Bootstrap>, Relay) {
    let n = 3;
    let buf = Arc::new(Mutex::new(vec![0u8; n * oob::RECORD]));
    let barrier = Arc::new(Barrier::new(n));
    let relay: Arc<Mutex<Option<Relay>>> = Arc::default();
    let boots = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (buf, barrier, relay) = (buf.clone(), barrier.clone(), relay.clone());
                s.spawn(move || {
                    let mut gather = |send: &[u8], recv: &mut [u8]| {
                        buf.lock()[r * send.len()..(r + 1) * send.len()].copy_from_slice(send);
                        barrier.wait();
                        recv.copy_from_slice(&buf.lock());
                        barrier.wait();
                        if r == 1 {
                            // Rank 1 is told the relay's address instead of the hub's.
                            let mut d = Dec(&recv[..oob::RECORD]);
                            let _ = (d.u32(), d.u32(), d.u32());
                            let secret: [u8; SECRET_BYTES] = d.bytes().unwrap().try_into().unwrap();
                            let hub: SocketAddr = d.str().unwrap().parse().unwrap();
                            let r0 = Relay::start(hub, up, down);
                            let rec = oob::record(n, 0, &secret, &r0.addr.to_string(), None);
                            recv[..oob::RECORD].copy_from_slice(&rec);
                            *relay.lock() = Some(r0);
                        }
                        Ok(())
                    };
                    Bootstrap::init_oob(&mut gather, n as i64, r as i64, MAX, 10_000, format!("h{r}"), None).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let relay = relay.lock().take().unwrap();
    (boots, relay)
}

/// Every rank's result of one exchange "x".
fn exchange_x(boots: &[Bootstrap]) -> Vec<Result<Vec<Part>, BootError>> {
    std::thread::scope(|s| {
        let hs: Vec<_> =
            boots.iter().map(|b| s.spawn(move || b.allgather("x", Ok(()), &[b.rank() as u8], &[]))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// A frame from rank 1 that the relay altered, replayed or forged fails the exchange on every
/// rank at once with the status of a lost connection, the message naming authentication.
fn tampering_fails_every_rank(tamper: Tamper) {
    let (boots, _relay) = team_through_relay(tamper, Tamper::Nothing);
    let t = Instant::now();
    for (r, res) in exchange_x(&boots).into_iter().enumerate() {
        let e = res.expect_err(&format!("rank {r} took a tampered exchange ({tamper:?})"));
        assert_eq!(e.kind, Kind::Timeout, "rank {r}: {}", e.message);
        assert!(
            e.message.contains("connection from rank 1 failed authentication"),
            "rank {r}: {tamper:?}: {}",
            e.message
        );
    }
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // The bootstrap stays broken.
    assert!(boots[2].agree("after", Ok(())).is_err());
}

// Frames after rank 1's handshake with the hub: 0 its JOIN, 1 its part of the "bootstrap"
// exchange that ends formation, 2 its part of "x".

#[test]
fn an_altered_frame_fails_the_team_on_every_rank() {
    tampering_fails_every_rank(Tamper::Flip(2));
}

#[test]
fn a_replayed_frame_fails_the_team_on_every_rank() {
    tampering_fails_every_rank(Tamper::Replay { frame: 1, at: 2 });
}

#[test]
fn an_injected_frame_fails_the_team_on_every_rank() {
    tampering_fails_every_rank(Tamper::Inject(2));
}

/// Frames the hub sends rank 1 after the handshake: 0 WELCOME, 1 the "bootstrap" result, 2
/// the result of "x". Rank 1 sees the altered one; its sealed notice reaches the hub, which
/// passes it on, so the next exchange fails on every rank at once.
#[test]
fn an_altered_frame_from_the_hub_fails_the_team_on_every_rank() {
    let (boots, _relay) = team_through_relay(Tamper::Nothing, Tamper::Flip(2));
    let t = Instant::now();
    let x = exchange_x(&boots);
    let e = x[1].as_ref().expect_err("rank 1 took an altered result");
    assert_eq!(e.kind, Kind::Timeout, "{}", e.message);
    assert!(e.message.contains("connection from rank 0 failed authentication"), "{}", e.message);
    std::thread::scope(|s| {
        for b in &boots {
            s.spawn(move || {
                let e = b.agree("y", Ok(())).unwrap_err();
                assert_eq!(e.kind, Kind::Timeout, "rank {}: {}", b.rank(), e.message);
                assert!(e.message.contains("failed authentication"), "rank {}: {}", b.rank(), e.message);
            });
        }
    });
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

/// What a split sends (the new team's id, with its secret) never travels in the clear.
#[test]
fn a_capture_of_a_split_holds_no_team_secret() {
    let (boots, relay) = team_through_relay(Tamper::Nothing, Tamper::Nothing);
    let id = new_unique_id().unwrap();
    let secret = UniqueId::decode(&id).unwrap().secret;
    std::thread::scope(|s| {
        for b in &boots {
            s.spawn(move || {
                let mut e = Enc::default();
                e.bytes(if b.rank() == 0 { &id[..] } else { &[] });
                let parts = b.allgather("split: team ids", Ok(()), &e.0, &[]).unwrap();
                assert_eq!(Dec(&parts[0].bytes).bytes().unwrap(), id.to_vec());
            });
        }
    });
    let cap = relay.capture.lock().clone();
    assert!(cap.len() > 200, "the relay saw {} bytes", cap.len());
    let holds = |needle: &[u8]| cap.windows(needle.len()).any(|w| w == needle);
    assert!(!holds(&secret), "the capture holds the new team's secret");
    assert!(!holds(&secret[..8]), "the capture holds part of the new team's secret");
    assert!(!holds(b"MCASTID2"), "the capture holds a unique id");
}

/// A member that sends frames nobody asked for fills no unbounded queue: the hub drops it and
/// the team fails with a message that says why.
#[test]
fn a_flood_of_frames_is_capped() {
    let boots = super::tests::team(2, |r| format!("h{r}"), 10_000);
    let hub = boots[1].conns[0].as_ref().unwrap();
    for _ in 0..1000 {
        if hub.send(kind::EXCH, &[0u8; 64]).is_err() {
            break;
        }
    }
    // The hub's reader drops rank 1 once the queue is full.
    let t = Instant::now();
    while boots[0].failure().is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the hub queued {} frames",
            boots[0].shared.q.lock().frames[1].len()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(boots[0].shared.q.lock().frames[1].len() <= QUEUE_FRAMES);
    let e = boots[0].agree("x", Ok(())).unwrap_err();
    assert_eq!(e.kind, Kind::Timeout, "{}", e.message);
    assert!(e.message.contains("rank 1 sent more than"), "{}", e.message);
}

/// A root listener on loopback for `secret`.
fn root(secret: [u8; SECRET_BYTES]) -> SocketAddr {
    let l = tcp::listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    super::id::spawn_root_until(l, secret, tcp::Bind::default(), 10_000).unwrap();
    addr
}

/// Asks the root at `addr` where the hub is, as `rank` of `n` offering `hub`: (ok, message).
fn ask_root(addr: SocketAddr, secret: &[u8; SECRET_BYTES], rank: u32, n: u32, hub: &str) -> (u32, String) {
    let mut s = tcp::connect(addr, secret, &tcp::Bind::default(), Deadline::after_ms(3000)).unwrap();
    let mut e = Enc::default();
    e.u32(ASK_ROOT).u32(rank).u32(n).str(hub);
    s.send(kind::JOIN, &e.0).unwrap();
    let w = s.expect(kind::WELCOME, 4096, Deadline::after_ms(3000)).unwrap();
    let mut d = Dec(&w);
    (d.u32().unwrap(), d.str().unwrap())
}

#[test]
fn a_second_claim_of_rank_0_never_replaces_the_hub() {
    let secret = [5; SECRET_BYTES];
    let addr = root(secret);
    assert_eq!(ask_root(addr, &secret, 0, 3, "10.0.0.1:1"), (0, "10.0.0.1:1".to_string()));
    let (ok, msg) = ask_root(addr, &secret, 0, 3, "10.6.6.6:6");
    assert_eq!(ok, 1, "a second rank 0 was served: {msg}");
    assert!(msg.contains("rank 0"), "{msg}");
    assert_eq!(ask_root(addr, &secret, 1, 3, ""), (0, "10.0.0.1:1".to_string()));
    // Each rank is served once.
    let (ok, msg) = ask_root(addr, &secret, 1, 3, "");
    assert_eq!(ok, 1, "rank 1 was served twice: {msg}");
    assert!(msg.contains("rank 1"), "{msg}");
}

#[test]
fn the_root_refuses_ranks_out_of_range() {
    let secret = [6; SECRET_BYTES];
    let addr = root(secret);
    // Before rank 0 arrives (a rank beyond its own nranks) and after (beyond rank 0's).
    let (ok, msg) = ask_root(addr, &secret, 4, 3, "");
    assert_eq!(ok, 1, "{msg}");
    assert!(msg.contains("rank 4") && msg.contains("nranks"), "{msg}");
    assert_eq!(ask_root(addr, &secret, 0, 2, "10.0.0.1:1"), (0, "10.0.0.1:1".to_string()));
    let (ok, msg) = ask_root(addr, &secret, 2, 2, "");
    assert_eq!(ok, 1, "{msg}");
    assert!(msg.contains("rank 2") && msg.contains("nranks"), "{msg}");
}

/// A root listener ends with its team, or when no rank asks within its timeout: its thread
/// exits, its port refuses connections, and a rank still waiting for rank 0 is told why.
#[test]
fn the_root_listener_ends_with_its_team_or_its_timeout() {
    let secret = [8; SECRET_BYTES];
    // Formed: the only rank asked.
    let l = tcp::listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let root = super::id::spawn_root_until(l, secret, tcp::Bind::default(), 60_000).unwrap().0;
    assert_eq!(ask_root(addr, &secret, 0, 1, "10.0.0.1:1"), (0, "10.0.0.1:1".to_string()));
    let t = Instant::now();
    while !root.is_finished() {
        assert!(t.elapsed() < Duration::from_secs(3), "the root outlived its team");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Unused: rank 1 waits for a rank 0 that never comes.
    let l = tcp::listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let root = super::id::spawn_root_until(l, secret, tcp::Bind::default(), 300).unwrap().0;
    let t = Instant::now();
    let (ok, msg) = ask_root(addr, &secret, 1, 2, "");
    assert_eq!(ok, 1, "{msg}");
    assert!(msg.contains("rank 0 did not ask") && msg.contains("300 ms"), "{msg}");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    while !root.is_finished() {
        assert!(t.elapsed() < Duration::from_secs(3), "the root outlived its timeout");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err(), "the root's port still accepts");
}

/// The hub checks rank fields too: a member that joins as a rank beyond nranks fails the
/// team's formation with INVALID_ARGUMENT naming it, and hears why.
#[test]
fn the_hub_refuses_a_rank_out_of_range() {
    let rogue: Arc<Mutex<Option<std::thread::JoinHandle<String>>>> = Arc::default();
    let r2 = rogue.clone();
    let mut gather = |send: &[u8], recv: &mut [u8]| {
        recv[..oob::RECORD].copy_from_slice(send);
        let mut d = Dec(send);
        let _ = (d.u32(), d.u32(), d.u32());
        let secret: [u8; SECRET_BYTES] = d.bytes().unwrap().try_into().unwrap();
        let hub: SocketAddr = d.str().unwrap().parse().unwrap();
        recv[oob::RECORD..].copy_from_slice(&oob::record(2, 1, &secret, "", None));
        // Rank 1's place is taken by a process that claims rank 5 of 2.
        *r2.lock() = Some(std::thread::spawn(move || {
            let mut s = tcp::connect(hub, &secret, &tcp::Bind::default(), Deadline::after_ms(3000)).unwrap();
            let mut e = Enc::default();
            e.u32(JOIN_HUB).u32(5).u32(2).str("h1");
            s.send(kind::JOIN, &e.0).unwrap();
            let w = s.expect(kind::WELCOME, 4096, Deadline::after_ms(3000)).unwrap();
            let mut d = Dec(&w);
            assert_eq!(d.u32().unwrap(), 1, "the hub welcomed rank 5 of 2");
            let _ = d.u32();
            d.str().unwrap()
        }));
        Ok(())
    };
    let e = Bootstrap::init_oob(&mut gather, 2, 0, MAX, 3000, "h0".into(), None).unwrap_err();
    assert_eq!(e.kind, Kind::InvalidArgument, "{}", e.message);
    assert!(e.message.contains("rank 5 of 2"), "{}", e.message);
    let told = rogue.lock().take().unwrap().join().unwrap();
    assert!(told.contains("rank 5 of 2"), "{told}");
}
