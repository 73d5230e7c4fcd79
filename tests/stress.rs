//! Concurrency stress (issue 9.3), through the C API on the simulator: 16 threads on one
//! context for a bounded time (`MCAST_STRESS_SECONDS`, default 5), creating and destroying their
//! own teams and buffers, churning allocations on shared teams, and running verified collectives
//! both on their own teams and on teams shared by every thread. A collective needs every rank:
//! a thread owns a "round" by issuing all ranks of the team, each on the team's stream for that
//! rank, under the team's issue lock (collectives of one team are ordered on its streams, as
//! NCCL requires of a communicator), then synchronizes and checks its own buffer. A watchdog
//! aborts the process with a message if no operation completes for 60 s. At the end nothing is
//! live (live counts 0, simulator ledger empty) and every result was correct. Every kernel
//! module is loaded before the threads start: a module load waits for every kernel running on
//! the device (as on CUDA), so a thread loading one while it holds a round half issued could wait
//! for another thread's kernel, whose peers that thread issues only after its own load
//! (README, "One thread driving several ranks"); the watchdog fired on exactly that.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;
use mcast::capi::buffer::*;
use mcast::capi::collective::*;
use mcast::capi::context::*;
use mcast::capi::team::*;

const THREADS: usize = 16;
const STALL: Duration = Duration::from_secs(60);

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 17
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A team shared by every thread: its handle, size, the streams of its ranks, and the lock a
/// thread holds while it issues one round (all ranks).
struct Shared {
    team: mcast_team_t,
    n: usize,
    streams: Vec<usize>,
    issue: Mutex<()>,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    AllReduceI32Sum,
    ReduceScatterI64Max,
    Broadcast(i32),
    AllGather,
}

fn write(b: mcast_buffer_t, rank: usize, data: &[u8]) {
    // SAFETY: valid pointer and length.
    let s = unsafe { mcast_buffer_write(b, rank as i32, 0, data.as_ptr().cast(), data.len()) };
    assert_eq!(s, OK, "write: {}", last_error());
}

fn read(b: mcast_buffer_t, rank: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: valid pointer and length.
    let s = unsafe { mcast_buffer_read(b, rank as i32, 0, v.as_mut_ptr().cast(), len) };
    assert_eq!(s, OK, "read: {}", last_error());
    v
}

/// Allocates a buffer on `team`, writes inputs, runs `kind` for every rank (under `lock` while
/// issuing, when shared), synchronizes, checks every rank against the host reference and frees.
fn round(
    team: mcast_team_t,
    n: usize,
    streams: &[usize],
    lock: Option<&Mutex<()>>,
    kind: Kind,
    count: usize,
    seed: u64,
) {
    let (esize, blocks) = match kind {
        Kind::AllReduceI32Sum => (4, 1),
        Kind::ReduceScatterI64Max => (8, n),
        Kind::Broadcast(_) => (1, 1),
        Kind::AllGather => (1, n),
    };
    let offset = 8;
    let extent = count * esize * blocks;
    let size = offset + extent + 32;
    let buf = alloc(team, size).unwrap_or_else(|e| panic!("alloc {size}: {e:?}"));
    let val = |r: usize, i: usize| -> i64 { ((seed as usize + r * 7919 + i * 31) % 2001) as i64 - 1000 };
    let inputs: Vec<Vec<u8>> = (0..n)
        .map(|r| {
            let mut v = vec![0xEEu8; size];
            for i in 0..count * blocks {
                let at = offset + i * esize;
                match kind {
                    Kind::AllReduceI32Sum => v[at..at + 4].copy_from_slice(&(val(r, i) as i32).to_ne_bytes()),
                    Kind::ReduceScatterI64Max => v[at..at + 8].copy_from_slice(&val(r, i).to_ne_bytes()),
                    _ => v[at] = val(r, i) as u8,
                }
            }
            v
        })
        .collect();
    for (r, v) in inputs.iter().enumerate() {
        write(buf, r, v);
    }
    {
        let _guard = lock.map(|l| l.lock().unwrap());
        for (r, &s) in streams.iter().enumerate().take(n) {
            let s = s as mcast_stream_t;
            let st = match kind {
                Kind::AllReduceI32Sum => {
                    mcast_all_reduce(buf, r as i32, offset, count, mcast_dtype_t(4), mcast_op_t(0), s)
                }
                Kind::ReduceScatterI64Max => {
                    mcast_reduce_scatter(buf, r as i32, offset, count, mcast_dtype_t(6), mcast_op_t(2), s)
                }
                Kind::Broadcast(root) => mcast_broadcast(buf, r as i32, root, offset, count, s),
                Kind::AllGather => mcast_all_gather(buf, r as i32, offset, count, s),
            };
            assert_eq!(st, OK, "{kind:?} rank {r}: {}", last_error());
        }
    }
    for (r, &s) in streams.iter().enumerate().take(n) {
        assert_eq!(mcast_synchronize(team, r as i32, s as mcast_stream_t), OK, "sync: {}", last_error());
    }
    for r in 0..n {
        let out = read(buf, r, size);
        assert_eq!(out[..offset], inputs[r][..offset], "{kind:?}: rank {r} written before its range");
        assert_eq!(out[offset + extent..], inputs[r][offset + extent..], "{kind:?}: rank {r} written after its range");
        let got = &out[offset..offset + extent];
        match kind {
            Kind::AllReduceI32Sum => {
                for i in 0..count {
                    let want: i64 = (0..n).map(|q| val(q, i)).sum();
                    let g = i32::from_ne_bytes(got[i * 4..i * 4 + 4].try_into().unwrap());
                    assert_eq!(g as i64, want, "{kind:?}: rank {r} element {i} of {count}, team of {n}");
                }
            }
            Kind::ReduceScatterI64Max => {
                for i in r * count..(r + 1) * count {
                    let want = (0..n).map(|q| val(q, i)).max().unwrap();
                    let g = i64::from_ne_bytes(got[i * 8..i * 8 + 8].try_into().unwrap());
                    assert_eq!(g, want, "{kind:?}: rank {r} element {i}, team of {n}");
                }
            }
            Kind::Broadcast(root) => {
                assert_eq!(got, &inputs[root as usize][offset..offset + extent], "{kind:?}: rank {r}");
            }
            Kind::AllGather => {
                for (q, input) in inputs.iter().enumerate() {
                    let blk = offset + q * count..offset + (q + 1) * count;
                    assert_eq!(&out[blk.clone()], &input[blk], "{kind:?}: rank {r} block {q}");
                }
            }
        }
    }
    assert_eq!(mcast_buffer_free(buf), OK, "free: {}", last_error());
}

fn random_kind(rng: &mut Rng, n: usize) -> Kind {
    match rng.below(4) {
        0 => Kind::AllReduceI32Sum,
        1 => Kind::ReduceScatterI64Max,
        2 => Kind::Broadcast(rng.below(n as u64) as i32),
        _ => Kind::AllGather,
    }
}

fn random_count(rng: &mut Rng) -> usize {
    match rng.below(10) {
        0 => 70_000 + rng.below(2000) as usize, // past the one-shot limit for i32 all-reduce
        1..=3 => 1 + rng.below(4096) as usize,
        _ => 1 + rng.below(300) as usize,
    }
}

#[test]
fn sixteen_threads_on_one_context() {
    let seconds: u64 = std::env::var("MCAST_STRESS_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    let (ctx, c) = context(&sim_config(4, |cfg| {
        cfg.timeout_ms = 120_000;
        cfg.sim_device_memory = 4 << 30;
    }));
    load_every_module(sim(&c));
    let shared: Vec<Shared> = [&[0, 1, 2, 3][..], &[1, 2], &[3, 3, 0]]
        .iter()
        .enumerate()
        .map(|(k, devs)| Shared {
            team: team_create(ctx, devs).unwrap(),
            n: devs.len(),
            streams: (0..devs.len()).map(|r| 0x10000 * (k + 1) + r + 1).collect(),
            issue: Mutex::new(()),
        })
        .collect();
    let progress = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let counts = [(); 4].map(|_| AtomicU64::new(0)); // shared rounds, own rounds, own teams, churn
    let deadline = Instant::now() + Duration::from_secs(seconds);
    std::thread::scope(|s| {
        // The watchdog: abort (the test cannot otherwise fail a hung thread) on 60 s without progress.
        s.spawn(|| {
            let mut last = (progress.load(Ordering::SeqCst), Instant::now());
            while !done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(100));
                let now = progress.load(Ordering::SeqCst);
                if now != last.0 {
                    last = (now, Instant::now());
                } else if last.1.elapsed() > STALL {
                    eprintln!(
                        "stress: WATCHDOG: no operation completed for {} s ({now} done so far): a deadlock or a \
                         lost wake-up; aborting",
                        STALL.as_secs()
                    );
                    std::process::abort();
                }
            }
        });
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (shared, progress, counts) = (&shared, &progress, &counts);
                s.spawn(move || {
                    let mut rng = Rng(0x5EED + t as u64);
                    let mut kept: Vec<mcast_buffer_t> = Vec::new();
                    let mut seed = t as u64 * 1_000_003;
                    while Instant::now() < deadline {
                        seed += 1;
                        match rng.below(10) {
                            // A verified round on a shared team.
                            0..=4 => {
                                let sh = &shared[rng.below(shared.len() as u64) as usize];
                                let kind = random_kind(&mut rng, sh.n);
                                let count = random_count(&mut rng);
                                round(sh.team, sh.n, &sh.streams, Some(&sh.issue), kind, count, seed);
                                counts[0].fetch_add(1, Ordering::Relaxed);
                            }
                            // An own team: create, a few verified rounds, destroy.
                            5..=6 => {
                                let n = 1 + rng.below(4) as usize;
                                let devs: Vec<i32> = if rng.below(2) == 0 {
                                    (0..n as i32).collect()
                                } else {
                                    (0..n).map(|_| rng.below(4) as i32).collect()
                                };
                                let team = team_create(ctx, &devs).unwrap_or_else(|e| panic!("{devs:?}: {e:?}"));
                                // Streams of this thread only: sharing a stream with another team
                                // whose ranks are issued in another order can deadlock (as on a GPU).
                                let streams: Vec<usize> = (0..n).map(|r| 0x100 * (t + 1) + r + 1).collect();
                                for _ in 0..1 + rng.below(3) {
                                    let kind = random_kind(&mut rng, n);
                                    round(team, n, &streams, None, kind, random_count(&mut rng), seed);
                                    counts[1].fetch_add(1, Ordering::Relaxed);
                                }
                                assert_eq!(mcast_team_destroy(team), OK, "{}", last_error());
                                counts[2].fetch_add(1, Ordering::Relaxed);
                            }
                            // Allocation churn on the shared teams, some kept across iterations.
                            _ => {
                                let sh = &shared[rng.below(shared.len() as u64) as usize];
                                let max = if rng.below(8) == 0 { 5 * MIB } else { 64 * 1024 };
                                let bytes = 1 + rng.below(max as u64);
                                kept.push(alloc(sh.team, bytes as usize).unwrap());
                                while kept.len() > 3 || (!kept.is_empty() && rng.below(2) == 0) {
                                    let b = kept.swap_remove(rng.below(kept.len() as u64) as usize);
                                    assert_eq!(mcast_buffer_free(b), OK, "{}", last_error());
                                }
                                counts[3].fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        progress.fetch_add(1, Ordering::SeqCst);
                    }
                    for b in kept {
                        assert_eq!(mcast_buffer_free(b), OK, "{}", last_error());
                    }
                })
            })
            .collect();
        let mut panicked = 0;
        for w in workers {
            if w.join().is_err() {
                panicked += 1;
            }
        }
        done.store(true, Ordering::SeqCst);
        assert_eq!(panicked, 0, "{panicked} worker thread(s) failed (see above)");
    });
    let live = live_counts(ctx);
    assert_eq!((live.teams, live.buffers), (shared.len() as u64, 0), "only the shared teams are left");
    for sh in &shared {
        assert_eq!(mcast_team_destroy(sh.team), OK, "{}", last_error());
    }
    let live = live_counts(ctx);
    assert_eq!((live.teams, live.buffers, live.multicast_objects), (0, 0, 0), "{live:?}");
    let [a, b, d, e] = counts.map(|x| x.into_inner());
    println!(
        "stress: {THREADS} threads, {seconds} s: {} operations: {a} verified rounds on shared teams, {b} on {d} own \
         teams created and destroyed, {e} allocation churns; {} simulator worker threads",
        progress.load(Ordering::SeqCst),
        sim(&c).worker_threads()
    );
    assert!(a > 0 && b > 0 && e > 0, "every kind of operation ran");
    assert_eq!(mcast_context_destroy(ctx), OK);
    assert!(ledger(&c).is_empty(), "{}", ledger(&c));
}
