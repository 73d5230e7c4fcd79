//! Ranks that disagree on a collective (its kind, count, dtype, op, broadcast root or buffer
//! offsets; `src/kernels/abi/signature.rs`, `kernels/sync.cuh`): every rank's synchronize and
//! the team's asynchronous error give `InvalidArgument` naming the field, both values and the
//! ranks, within well under `timeout_ms`; no kernel writes any rank's data; the team then
//! refuses every call (sticky, like a timeout). On every route a kernel takes: the LL kernels,
//! the barrier kernels (one grid, and grids that differ), multicast, the pointer form's push
//! all-reduce, the copy-engine forms' entry barrier; one thread issuing every rank, one thread
//! per rank, and one process per rank.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use mcast::bootstrap::new_unique_id;
use mcast::driver::{DevicePtr, Stream};
use mcast::kernels::{Collective, DType, RedOp};
use mcast::runtime::buffer::Buffer;
use mcast::runtime::collective::{run, run_into, run_ptr, synchronize};
use mcast::runtime::config::{Config, LlMode, MulticastMode};
use mcast::runtime::context::Context;
use mcast::runtime::team::Team;
use mcast::runtime::ErrorKind;

/// Far above what a mismatch takes: a call that waits it out has not been caught.
const TIMEOUT_MS: u32 = 20_000;
const CAUGHT_WITHIN: Duration = Duration::from_secs(5);
const BYTES: usize = 1 << 20;

fn ar(dtype: DType, op: RedOp) -> Collective {
    Collective::AllReduce { dtype, op }
}
const F32_SUM: Collective = Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum };

/// A route: transport, LL kernels, copy-engine threshold (0: never).
#[derive(Clone, Copy, Debug)]
struct Route {
    multicast: bool,
    ll: bool,
    ce_min_bytes: u64,
}
const LL: Route = Route { multicast: false, ll: true, ce_min_bytes: 0 };
const BARRIER: Route = Route { multicast: false, ll: false, ce_min_bytes: 0 };
const MULTICAST: Route = Route { multicast: true, ll: false, ce_min_bytes: 0 };
const CE: Route = Route { multicast: false, ll: false, ce_min_bytes: 1 };

fn context(route: Route) -> Arc<Context> {
    let ctx = runtime_context(Config {
        ll: if route.ll { LlMode::On } else { LlMode::Off },
        ce_min_bytes: Some(route.ce_min_bytes),
        ..sim_runtime(route.multicast, 4, TIMEOUT_MS)
    });
    // One thread issues every rank: no call may load a module (it would wait for the others).
    load_every_module(sim(&ctx));
    ctx
}

/// Rank r's byte i before the call.
fn pattern(r: usize, i: usize) -> u8 {
    ((r * 31 + i * 7) % 251) as u8 | 1
}

fn fill(p: DevicePtr, r: usize, len: usize) {
    // SAFETY: simulated device memory is host memory; `p` has `len` bytes.
    let s = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) };
    s.iter_mut().enumerate().for_each(|(i, b)| *b = pattern(r, i));
}

/// The first byte of `len` at `p` that is not rank r's pattern.
fn changed(p: DevicePtr, r: usize, len: usize) -> Option<usize> {
    // SAFETY: as in `fill`; the streams are synchronized.
    let s = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
    s.iter().enumerate().position(|(i, &b)| b != pattern(r, i))
}

/// One rank's call: collective, count, offset.
type Call = (Collective, usize, usize);

/// Every rank's synchronize fails with `InvalidArgument` saying `says` (and the team's
/// asynchronous error agrees); the next call of every rank is refused with the same error.
fn assert_caught(team: &Arc<Team>, buf: &Buffer, says: &str, started: Instant, what: &str) {
    let n = team.size();
    for r in 0..n as i32 {
        let e = synchronize(team, r, Stream::DEFAULT).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{what}: rank {r}: {e}");
        assert!(e.message.contains(says), "{what}: rank {r}: {e}");
    }
    assert!(started.elapsed() < CAUGHT_WITHIN, "{what}: {:?}", started.elapsed());
    assert_eq!(team.async_error(), Some(ErrorKind::InvalidArgument), "{what}");
    for r in 0..n as i32 {
        let e = run(buf, r, 0, 16, F32_SUM, Stream::DEFAULT).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{what}: rank {r}'s next call: {e}");
        assert!(e.message.contains(says), "{what}: rank {r}'s next call: {e}");
    }
}

/// On a new team of `calls.len()` ranks with one buffer filled with each rank's pattern, rank
/// r runs `calls[r]` (collective, count, offset) in place; every rank must fail saying `says`,
/// and with `untouched` no byte of any rank's copy may have changed.
fn disagree(ctx: &Arc<Context>, calls: &[Call], says: &str, untouched: bool) {
    let n = calls.len();
    let devices: Vec<i32> = (0..n as i32).collect();
    let team = Team::create(ctx, &devices).unwrap();
    let buf = Buffer::alloc(&team, BYTES).unwrap();
    for r in 0..n {
        fill(buf.local_ptr(r as i32).unwrap(), r, BYTES);
    }
    let what = format!("{calls:?}");
    let started = Instant::now();
    for (r, &(c, count, offset)) in calls.iter().enumerate() {
        run(&buf, r as i32, offset, count, c, Stream::DEFAULT).unwrap();
    }
    // mcast_team_get_error finds it on the device, before any mcast_synchronize.
    for (r, &dev) in team.devices().iter().enumerate() {
        ctx.driver().stream_synchronize(dev, Stream::DEFAULT).unwrap();
        assert!(team.error().is_none(), "{what}: rank {r}");
    }
    assert_eq!(team.async_error(), Some(ErrorKind::InvalidArgument), "{what}");
    let e = team.error().unwrap();
    assert!(e.message.contains(says), "{what}: {e}");
    assert_caught(&team, &buf, says, started, &what);
    if untouched {
        for r in 0..n {
            let at = changed(buf.local_ptr(r as i32).unwrap(), r, BYTES);
            assert_eq!(at, None, "{what}: rank {r}'s data was written");
        }
    }
    buf.free().unwrap();
    team.destroy().unwrap();
}

/// The five fields, two ranks, on the LL kernels, the barrier kernels and multicast.
#[test]
fn each_field_fails_every_rank_naming_it_and_writes_nothing() {
    let cases: [(&[Call], &str); 6] = [
        (&[(F32_SUM, 1024, 0), (F32_SUM, 512, 0)], "ranks disagree on count: rank 0 has 1024, rank 1 has 512"),
        (&[(F32_SUM, 1024, 0), (ar(DType::I32, RedOp::Sum), 1024, 0)], "dtype: rank 0 has f32, rank 1 has i32"),
        (
            &[(ar(DType::I32, RedOp::Sum), 1024, 0), (ar(DType::I32, RedOp::Max), 1024, 0)],
            "op: rank 0 has sum, rank 1 has max",
        ),
        (
            &[(Collective::Broadcast { root: 0 }, 4096, 0), (Collective::Broadcast { root: 1 }, 4096, 0)],
            "root: rank 0 has 0, rank 1 has 1",
        ),
        (&[(F32_SUM, 1024, 0), (F32_SUM, 1024, 4096)], "offset: rank 0 has 0, rank 1 has 4096"),
        (
            &[(Collective::AllGather, 4096, 0), (Collective::Broadcast { root: 0 }, 4096, 0)],
            "collective: rank 0 has all-gather, rank 1 has broadcast",
        ),
    ];
    for route in [LL, BARRIER, MULTICAST] {
        let ctx = context(route);
        for (calls, says) in cases {
            disagree(&ctx, calls, says, true);
        }
        assert_clean(&ctx);
    }
}

/// Counts that give different grids (1 block against 8 with the one-shot kernel): the blocks
/// no peer pairs with end too, and the ranks still report the mismatch, not a timeout.
#[test]
fn grids_that_differ_are_caught() {
    for route in [BARRIER, MULTICAST] {
        let ctx = context(route);
        disagree(&ctx, &[(F32_SUM, 1024, 0), (F32_SUM, 16384, 0)], "count: rank 0 has 1024, rank 1 has 16384", true);
        assert_clean(&ctx);
    }
}

/// Three and four ranks, one of them different: every rank names that rank.
#[test]
fn one_rank_of_several_is_named_by_every_rank() {
    for route in [LL, BARRIER] {
        let ctx = context(route);
        let mut calls = vec![(F32_SUM, 2048, 0); 4];
        calls[2] = (F32_SUM, 2048, 64);
        disagree(&ctx, &calls, "rank 2 has 64", true);
        disagree(&ctx, &calls[..3], "rank 2 has 64", true);
        assert_clean(&ctx);
    }
}

/// Teams of more than eight ranks (10 and 9 here) carry the entry barrier's signature in per-writer words stored
/// before the signal, smaller ones in flagged lines stored after it (`kernels/sync.cuh`): both
/// catch a rank that differs (8 ranks: the lines), on the barrier kernels and multicast.
#[test]
fn teams_past_the_signature_lines_are_checked_too() {
    for route in [BARRIER, MULTICAST] {
        let ctx = runtime_context(Config {
            ll: LlMode::Off,
            ce_min_bytes: Some(0),
            sim_device_memory: 64 << 20,
            ..sim_runtime(route.multicast, 10, TIMEOUT_MS)
        });
        load_every_module(sim(&ctx));
        let mut calls = vec![(F32_SUM, 2048, 0); 10];
        calls[9] = (F32_SUM, 1024, 0);
        disagree(&ctx, &calls, "rank 9 has 1024", true);
        disagree(&ctx, &calls[1..], "rank 8 has 1024", true);
        disagree(&ctx, &calls[2..], "rank 7 has 1024", true);
        assert_clean(&ctx);
    }
}

/// The out-of-place form: send and recv offsets (recv buffers untouched).
#[test]
fn send_and_recv_offsets_are_named() {
    for route in [LL, BARRIER] {
        let ctx = context(route);
        for (recv_offsets, says) in [([0, 4096], "recv offset: rank 0 has 0, rank 1 has 4096"), ([0, 0], "")] {
            let team = Team::create(&ctx, &[0, 1]).unwrap();
            let send = Buffer::alloc(&team, BYTES).unwrap();
            let recv = Buffer::alloc(&team, BYTES).unwrap();
            for r in 0..2 {
                fill(send.local_ptr(r).unwrap(), r as usize, BYTES);
                fill(recv.local_ptr(r).unwrap(), r as usize, BYTES);
            }
            let started = Instant::now();
            for r in 0..2 {
                // Equal recv offsets: the send offsets differ instead.
                let send_offset = if says.is_empty() { 128 * r as usize } else { 0 };
                run_into(&send, send_offset, &recv, recv_offsets[r as usize], r, 1024, F32_SUM, Stream::DEFAULT)
                    .unwrap();
            }
            let says = if says.is_empty() { "send offset: rank 0 has 0, rank 1 has 128" } else { says };
            assert_caught(&team, &send, says, started, says);
            for r in 0..2 {
                assert_eq!(changed(recv.local_ptr(r).unwrap(), r as usize, BYTES), None, "{says}: rank {r}");
            }
            send.free().unwrap();
            recv.free().unwrap();
            team.destroy().unwrap();
        }
        assert_clean(&ctx);
    }
}

/// On a new team of `calls.len()` ranks (one per device) with plain device memory filled
/// with each rank's pattern, rank r runs the pointer form of `calls[r]` (collective, count; send
/// at the start of its memory, recv `PTR_RECV` bytes in): every rank must fail saying `says`,
/// and no byte of any rank's memory may have changed. `what` names the case in failures.
fn ptr_disagree(ctx: &Arc<Context>, calls: &[(Collective, usize)], says: &str, what: &str) {
    let driver = ctx.driver().clone();
    let devices: Vec<i32> = (0..calls.len() as i32).collect();
    let team = Team::create(ctx, &devices).unwrap();
    let buf = Buffer::alloc(&team, 4096).unwrap();
    let mem: Vec<DevicePtr> = devices.iter().map(|&d| driver.mem_alloc(d, 2 * PTR_RECV).unwrap()).collect();
    for (r, &m) in mem.iter().enumerate() {
        fill(m, r, 2 * PTR_RECV);
    }
    let started = Instant::now();
    for (r, &(c, count)) in calls.iter().enumerate() {
        run_ptr(&team, r as i32, mem[r], mem[r] + PTR_RECV as u64, count, c, Stream::DEFAULT).unwrap();
    }
    assert_caught(&team, &buf, says, started, what);
    for (r, &m) in mem.iter().enumerate() {
        assert_eq!(changed(m, r, 2 * PTR_RECV), None, "{what}: rank {r}");
    }
    buf.free().unwrap();
    team.destroy().unwrap();
    for (&d, p) in devices.iter().zip(mem) {
        driver.mem_free(d, p).unwrap();
    }
}

/// Where [`ptr_disagree`]'s recv starts in each rank's memory (which is twice this).
const PTR_RECV: usize = 2 * BYTES;

/// [`ptr_disagree`] of two ranks' f32 all-reduces of `counts`.
fn ptr_counts_disagree(ctx: &Arc<Context>, counts: [usize; 2], what: &str) {
    let says = format!("count: rank 0 has {}, rank 1 has {}", counts[0], counts[1]);
    ptr_disagree(ctx, &[(F32_SUM, counts[0]), (F32_SUM, counts[1])], &says, what);
}

/// The pointer form on plain memory: the LL kernels and the push all-reduce (offsets do not
/// matter there: each rank reads only its own memory).
#[test]
fn the_pointer_form_is_checked_on_the_ll_and_push_routes() {
    for (route, counts) in [(LL, [1024, 512]), (BARRIER, [65536, 32768])] {
        let ctx = context(route);
        ptr_counts_disagree(&ctx, counts, &format!("{route:?}"));
        assert_clean(&ctx);
    }
}

/// The pointer form's staged route (plain memory: every collective but the all-reduce of up to
/// four ranks, which pushes): the results reach `recv` from kernels only, which write nothing
/// once the collective failed, so `recv` keeps its bytes; in one chunk and in several. On P2P the
/// pulling kernels write `recv` themselves (the all-reduce of five ranks is copied out); on
/// multicast every result goes through the copy-out kernel.
#[test]
fn the_staged_route_writes_nothing() {
    for multicast in [false, true] {
        let ctx =
            runtime_context(Config { ll: LlMode::Off, ce_min_bytes: Some(0), ..sim_runtime(multicast, 5, TIMEOUT_MS) });
        load_every_module(sim(&ctx));
        let rs = Collective::ReduceScatter { dtype: DType::F32, op: RedOp::Sum };
        let (ag, bc) = (Collective::AllGather, |root| Collective::Broadcast { root });
        let cases: [(&[(Collective, usize)], &str); 5] = [
            (&[(ag, 8192), (ag, 4096)], "count: rank 0 has 8192, rank 1 has 4096"),
            // Two chunks of the staging area each.
            (&[(ag, 3 * BYTES / 4), (ag, BYTES)], "count: rank 0 has 786432, rank 1 has 1048576"),
            (&[(rs, 2048), (rs, 1024)], "count: rank 0 has 2048, rank 1 has 1024"),
            (&[(bc(0), 65536), (bc(1), 65536)], "root: rank 0 has 0, rank 1 has 1"),
            (
                &[(F32_SUM, 4096), (F32_SUM, 4096), (F32_SUM, 4096), (F32_SUM, 4096), (F32_SUM, BYTES / 2)],
                "rank 4 has 524288",
            ),
        ];
        for (calls, says) in cases {
            ptr_disagree(&ctx, calls, says, &format!("multicast {multicast}: {calls:?}"));
        }
        assert_clean(&ctx);
    }
}

/// Counts so far apart that the ranks choose different kinds of kernel (the LL kernels on one, a
/// barrier kernel or the push all-reduce on the other) wait in words the other never writes: a
/// waiting signature thread finds the peer's signature among the other kind's lines after
/// 100 us, so every rank reports the mismatch, not a timeout, and nothing is written.
#[test]
fn counts_that_choose_different_kernels_are_caught() {
    let ctx = context(LL);
    let big = BYTES / 4;
    for calls in [[(F32_SUM, 1024, 0), (F32_SUM, big, 0)], [(F32_SUM, big, 0), (F32_SUM, 1024, 0)]] {
        let says = format!("count: rank 0 has {}, rank 1 has {}", calls[0].1, calls[1].1);
        disagree(&ctx, &calls, &says, true);
    }
    // The pointer form on plain memory: LL against the push all-reduce.
    ptr_counts_disagree(&ctx, [1024, BYTES / 8], "LL against push");
    assert_clean(&ctx);
}

/// The copy-engine forms: their entry barrier kernel compares the calls, so every rank reports
/// the mismatch (the peer copies enqueued after it still run: a kernel cannot cancel them).
#[test]
fn the_copy_engine_forms_report_it() {
    let ctx = context(CE);
    let bc = |root| Collective::Broadcast { root };
    disagree(&ctx, &[(bc(0), 8192, 0), (bc(1), 8192, 0)], "root: rank 0 has 0, rank 1 has 1", false);
    disagree(
        &ctx,
        &[(Collective::AllGather, 8192, 0), (Collective::AllGather, 4096, 0)],
        "count: rank 0 has 8192",
        false,
    );
    disagree(&ctx, &[(F32_SUM, 8192, 0), (F32_SUM, 8192, 256)], "offset: rank 0 has 0, rank 1 has 256", false);
    assert_clean(&ctx);
}

/// One thread per rank, each with its own stream, as applications drive a one-process team.
#[test]
fn one_thread_per_rank() {
    let ctx = runtime_context(Config { ll: LlMode::On, ..sim_runtime(false, 4, TIMEOUT_MS) });
    let team = Team::create(&ctx, &[0, 1, 2, 3]).unwrap();
    let buf = Arc::new(Buffer::alloc(&team, BYTES).unwrap());
    for r in 0..4 {
        fill(buf.local_ptr(r as i32).unwrap(), r, BYTES);
    }
    let started = Instant::now();
    let errors: Vec<_> = (0..4)
        .map(|r| {
            let (team, buf) = (team.clone(), buf.clone());
            std::thread::spawn(move || {
                let stream = team.context().driver().stream_create(r).unwrap();
                let c = if r == 3 { ar(DType::F32, RedOp::Min) } else { F32_SUM };
                // From the call where the others' kernels found it before this thread called
                // (the team's error is then sticky), else from the synchronize.
                let e = match run(&buf, r, 0, 4096, c, stream) {
                    Ok(()) => synchronize(&team, r, stream).unwrap_err(),
                    Err(e) => e,
                };
                team.context().driver().stream_destroy(r, stream).unwrap();
                e
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    assert!(started.elapsed() < CAUGHT_WITHIN, "{:?}", started.elapsed());
    for (r, e) in errors.iter().enumerate() {
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "rank {r}: {e}");
        assert!(e.message.contains("op: ") && e.message.contains("rank 3 has min"), "rank {r}: {e}");
        assert_eq!(changed(buf.local_ptr(r as i32).unwrap(), r, BYTES), None, "rank {r}");
    }
    Arc::try_unwrap(buf).ok().unwrap().free().unwrap();
    team.destroy().unwrap();
    assert_clean(&ctx);
}

const ROLE: &str = "MCAST_MISMATCH_CHILD";

/// One process per rank (both transports, LL on and off): rank 1 passes another count.
#[test]
fn one_process_per_rank() {
    for (multicast, ll) in [(false, true), (false, false), (true, false)] {
        let id = hex(&new_unique_id().unwrap());
        let exe = std::env::current_exe().unwrap();
        let children: Vec<_> = (0..2)
            .map(|r| {
                let mut c = std::process::Command::new(&exe);
                c.args(["--exact", "child", "--nocapture", "--test-threads=1"])
                    .env(ROLE, format!("{r}:{}:{}:{id}", u8::from(multicast), u8::from(ll)));
                hermetic_command(&mut c).spawn().unwrap()
            })
            .collect();
        for (r, mut c) in children.into_iter().enumerate() {
            let st = c.wait().unwrap();
            assert!(st.success(), "multicast {multicast}, LL {ll}: rank {r}: {st:?}");
        }
    }
}

/// A rank of [`one_process_per_rank`] (a no-op unless the test spawned it).
#[test]
fn child() {
    let Ok(spec) = std::env::var(ROLE) else { return };
    let f: Vec<&str> = spec.split(':').collect();
    let (r, multicast, ll, id) = (f[0].parse::<usize>().unwrap(), f[1] == "1", f[2] == "1", unhex(f[3]));
    let ctx = runtime_context(Config {
        multicast: if multicast { MulticastMode::Require } else { MulticastMode::Off },
        ll: if ll { LlMode::On } else { LlMode::Off },
        ce_min_bytes: Some(0),
        sim_host_env: Some(vec![]),
        ..sim_runtime(multicast, 2, TIMEOUT_MS)
    });
    let team = Team::init_rank(&ctx, &id, 2, r as i32, r as i32).unwrap();
    let buf = Buffer::alloc(&team, BYTES).unwrap();
    fill(buf.local_ptr(r as i32).unwrap(), r, BYTES);
    let started = Instant::now();
    run(&buf, r as i32, 0, [2048, 1024][r], F32_SUM, Stream::DEFAULT).unwrap();
    let e = synchronize(&team, r as i32, Stream::DEFAULT).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "rank {r}: {e}");
    assert!(e.message.contains("count: rank 0 has 2048, rank 1 has 1024"), "rank {r}: {e}");
    assert!(started.elapsed() < CAUGHT_WITHIN, "rank {r}: {:?}", started.elapsed());
    assert_eq!(changed(buf.local_ptr(r as i32).unwrap(), r, BYTES), None, "rank {r}");
    assert_eq!(team.async_error(), Some(ErrorKind::InvalidArgument));
    buf.free().unwrap();
    team.destroy().unwrap();
    assert_clean(&ctx);
}

/// `MCAST_CHECK_CALLS=off` (config `check_calls: false` on every rank) turns the check off, as
/// documented for latency-critical programs that trust their calls: a broadcast whose ranks
/// name different roots is not refused (each rank copies from the root it named), and the team
/// stays usable. With it on in any one rank, the team checks.
#[test]
fn the_check_can_be_turned_off() {
    for route in [LL, BARRIER] {
        let ctx = runtime_context(Config {
            check_calls: false,
            ll: if route.ll { LlMode::On } else { LlMode::Off },
            ..sim_runtime(false, 4, TIMEOUT_MS)
        });
        load_every_module(sim(&ctx));
        let team = Team::create(&ctx, &[0, 1]).unwrap();
        assert!(!team.check_calls());
        let buf = Buffer::alloc(&team, BYTES).unwrap();
        for r in 0..2 {
            fill(buf.local_ptr(r as i32).unwrap(), r, BYTES);
        }
        for (r, root) in [(0, 0), (1, 1)] {
            run(&buf, r, 0, 4096, Collective::Broadcast { root }, Stream::DEFAULT).unwrap();
        }
        for r in 0..2 {
            synchronize(&team, r, Stream::DEFAULT).unwrap();
        }
        assert_eq!(team.async_error(), None, "{route:?}");
        buf.free().unwrap();
        team.destroy().unwrap();
        assert_clean(&ctx);
    }
    let ctx = context(BARRIER);
    assert!(Team::create(&ctx, &[0, 1]).unwrap().check_calls(), "on by default");
}

/// One thread driving several ranks (or one rank's thread late): ranks 0, 1 and 3 call, rank 3
/// (which disagrees) reports the mismatch; only then does rank 2 call, and its call is refused
/// with the team's error. Ranks 0 and 1, whose kernels wait for rank 2's lines, end at once
/// with the mismatch: they waited out the whole timeout before.
#[test]
fn a_rank_that_calls_after_the_mismatch_is_refused_and_its_peers_end() {
    let ctx = runtime_context(Config { ll: LlMode::On, ..sim_runtime(false, 4, TIMEOUT_MS) });
    let team = Team::create(&ctx, &[0, 1, 2, 3]).unwrap();
    let buf = Buffer::alloc(&team, BYTES).unwrap();
    for r in 0..4 {
        fill(buf.local_ptr(r as i32).unwrap(), r, BYTES);
    }
    let driver = team.context().driver().clone();
    let streams: Vec<_> = (0..4).map(|r| driver.stream_create(r).unwrap()).collect();
    let started = Instant::now();
    for r in [0, 1, 3] {
        let c = if r == 3 { ar(DType::F32, RedOp::Min) } else { F32_SUM };
        run(&buf, r, 0, 4096, c, streams[r as usize]).unwrap();
    }
    let mut errors = vec![synchronize(&team, 3, streams[3]).unwrap_err()];
    errors.push(run(&buf, 2, 0, 4096, F32_SUM, streams[2]).expect_err("rank 2's call is refused"));
    for r in [0, 1] {
        errors.push(synchronize(&team, r, streams[r as usize]).unwrap_err());
    }
    assert!(started.elapsed() < CAUGHT_WITHIN, "{:?}", started.elapsed());
    for e in &errors {
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        assert!(e.message.contains("op: rank 0 has sum, rank 3 has min"), "{e}");
    }
    for (r, &stream) in streams.iter().enumerate() {
        assert_eq!(changed(buf.local_ptr(r as i32).unwrap(), r, BYTES), None, "rank {r}");
        driver.stream_destroy(r as i32, stream).unwrap();
    }
    buf.free().unwrap();
    team.destroy().unwrap();
    assert_clean(&ctx);
}
