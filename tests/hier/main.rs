//! Teams across NVLink domains on the simulator, one process per rank (the test re-runs its own
//! binary as the ranks; `MCAST_HIER_CHILD` selects the case), with domains made by
//! `MCAST_DOMAIN` labels and a test engine registered through the runtime (`Env::set_net`): its
//! rail communicators talk over an mcast bootstrap of their own and reduce on the host (the
//! simulator's device memory is host memory: `engine.rs`).

#[path = "../common/mod.rs"]
mod common;
mod engine;

use std::process::{Command, ExitStatus};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use engine::{bytes, fold, store, TestEngine};
use mcast::bootstrap::new_unique_id;
use mcast::driver::{DevicePtr, Stream};
use mcast::kernels::{Collective, DType, RedOp};
use mcast::runtime::config::{Config, NetMode};
use mcast::runtime::context::Context;
use mcast::runtime::hier::collective::{run_ptr, Chunks, DEPTH_BYTES};
use mcast::runtime::hier::Across;
use mcast::runtime::teams::AnyTeam;
use mcast::runtime::{Error, ErrorKind, Result};

const ROLE: &str = "MCAST_HIER_CHILD";
const TIMEOUT_MS: u32 = 3000;

/// Runs `n` ranks of `case`, rank r labelled `labels[r]`.
fn spawn(case: &str, labels: &[&str]) -> Vec<ExitStatus> {
    let id = hex(&new_unique_id().unwrap());
    let exe = std::env::current_exe().unwrap();
    let n = labels.len();
    let children: Vec<_> = (0..n)
        .map(|r| {
            let mut c = Command::new(&exe);
            c.args(["--exact", "child", "--nocapture", "--test-threads=1"])
                .env(ROLE, format!("{case}:{n}:{r}:{}:{id}", labels[r]))
                .env_remove("MCAST_DOMAIN")
                .env_remove("MCAST_NET")
                .env_remove("MCAST_HOST_ID");
            hermetic_command(&mut c).spawn().unwrap()
        })
        .collect();
    children.into_iter().map(|mut c| c.wait().unwrap()).collect()
}

fn all_ok(st: &[ExitStatus]) {
    for (r, s) in st.iter().enumerate() {
        assert!(s.success(), "rank {r} failed: {s:?}");
    }
}

/// Two domains of consecutive ranks and two of interleaved ranks: creation, team info, every
/// collective (both all-reduce paths, reduce-scatter, all-gather and broadcast of odd sizes).
#[test]
fn collectives_across_two_domains() {
    all_ok(&spawn("collectives", &["A", "A", "B", "B"]));
    all_ok(&spawn("collectives", &["A", "B", "A", "B"]));
}

/// Domains of different sizes are refused on every rank, naming each domain's size.
#[test]
fn unequal_domains_are_refused_naming_their_sizes() {
    all_ok(&spawn("unequal", &["A", "A", "B"]));
}

/// The all-reduce through the rails in chunks (`hier::collective::Chunks`): sizes around the
/// pipelining threshold and above it, odd counts (a tail), every dtype and op, in place too;
/// each result equals the reduction of the inputs in rank order, element for element.
#[test]
fn chunked_all_reduce_across_two_domains() {
    all_ok(&spawn("chunked", &["A", "A", "B", "B"]));
    all_ok(&spawn("chunked", &["A", "B", "A", "B"]));
}

/// The same with a stream-ordered engine that enqueues its all-reduce on the simulator's
/// streams: the pipelined issue (rail calls on each rank's rail stream, ordered with the
/// caller's stream by events) gives the same results.
#[test]
fn pipelined_all_reduce_across_two_domains() {
    all_ok(&spawn("ordered", &["A", "A", "B", "B"]));
}

/// No engine (`MCAST_NET=none`, none registered): refused on every rank, naming the domains and
/// the engine tried.
#[test]
fn no_engine_is_refused_naming_what_was_tried() {
    all_ok(&spawn("none", &["A", "B"]));
}

/// A rail engine failing on one rank fails the team on every rank with the same status.
#[test]
fn an_engine_failure_is_every_ranks() {
    all_ok(&spawn("fail", &["A", "A", "B", "B"]));
}

/// Ranks of one domain that disagree on a call (here each domain's second rank passes half the
/// count, so the rails, which join the ranks of equal local index, agree), with a stream-ordered
/// engine: the ranks compare their calls over the team's bootstrap before any stage, so every
/// rank's call fails with INVALID_ARGUMENT naming the count and the first two ranks that differ
/// by their rank in the whole team (rank 0 and the first rank of local index 1), and no rank's
/// data is written.
#[test]
fn ranks_of_a_domain_that_disagree_are_caught() {
    all_ok(&spawn("mismatch", &["A", "A", "B", "B"]));
    all_ok(&spawn("mismatch", &["A", "B", "A", "B"]));
}

/// Ranks of different domains that disagree, each domain agreeing inside (domain B's ranks pass
/// half the count, or another root), so that only the rails would meet different calls: the
/// ranks compare their calls across the domains before any stage, through the engine where the
/// rail calls run stage by stage, over the team's bootstrap where the engine is stream-ordered
/// (`ordered-`). Every rank's call fails with INVALID_ARGUMENT naming the field, both values and
/// the ranks (rank 0 and B's first rank), no rank's data is written, and the team keeps the
/// error (synchronize and a later call report it).
#[test]
fn ranks_of_different_domains_that_disagree_are_caught_before_any_stage() {
    for case in ["across-count", "ordered-across-count"] {
        all_ok(&spawn(case, &["A", "A", "B", "B"]));
        all_ok(&spawn(case, &["A", "B", "A", "B"]));
    }
    all_ok(&spawn("across-root", &["A", "A", "B", "B"]));
    all_ok(&spawn("ordered-across-root", &["A", "B", "A", "B"]));
}

/// A rank killed before a collective: the others get TIMEOUT or ABORTED within timeout_ms + 1 s,
/// whether the engine runs stage by stage or is stream-ordered (the comparison's exchange over
/// the bootstrap is then the first to miss it).
#[test]
fn a_killed_rank_ends_the_others_in_time() {
    for case in ["killed", "ordered-killed"] {
        let st = spawn(case, &["A", "A", "B", "B"]);
        for (r, s) in st.iter().enumerate().take(3) {
            assert!(s.success(), "{case}: rank {r} failed: {s:?}");
        }
    }
}

/// Each rank of the team in turn aborts it (both layouts of two domains) while the others wait
/// in an all-reduce that cannot complete without it: every rank's call or synchronize ends with
/// ABORTED naming the rank that aborted, within a second of the abort; get_error, a later call
/// and synchronize say the same; nothing hangs and nothing is left.
#[test]
fn an_abort_from_any_rank_is_seen_by_every_rank() {
    for labels in [["A", "A", "B", "B"], ["A", "B", "A", "B"]] {
        for who in 0..4 {
            for case in [format!("abort-{who}"), format!("ordered-abort-{who}")] {
                let st = spawn(&case, &labels);
                for (r, s) in st.iter().enumerate() {
                    assert!(s.success(), "{case} {labels:?}: rank {r} failed: {s:?}");
                }
            }
        }
    }
}

/// The body of every case, in the child processes.
#[test]
fn child() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let f: Vec<&str> = role.split(':').collect();
    let (case, n, r, label) = (f[0], f[1].parse::<usize>().unwrap(), f[2].parse::<usize>().unwrap(), f[3]);
    let id = unhex(f[4]);
    let config = Config {
        domain: Some(label.to_string()),
        net: if case == "none" { NetMode::None } else { NetMode::Auto },
        ..sim_runtime(false, 4, TIMEOUT_MS)
    };
    let ctx = runtime_context(config);
    if case != "none" {
        let fail = (case == "fail").then_some(1);
        let ordered = (case == "ordered" || case == "mismatch" || case.starts_with("ordered-"))
            .then(|| (ctx.driver().clone(), (r % 4) as i32));
        ctx.set_net(Some(Arc::new(TestEngine { rank: r, fail, ordered })));
    }
    let made = AnyTeam::init_rank(&ctx, &id, n as i32, r as i32, (r % 4) as i32).map(|t| match t {
        AnyTeam::Across(a) => a,
        AnyTeam::Flat(_) => panic!("rank {r}: a flat team over two domains"),
    });
    match case {
        "collectives" => collectives(&ctx, made.unwrap(), n, r),
        "chunked" | "ordered" => chunked(&ctx, made.unwrap(), n, r),
        "unequal" => {
            let e = made.expect_err("refused");
            assert_eq!(e.kind, ErrorKind::NotSupported, "{e}");
            assert!(e.message.contains("MCAST_DOMAIN=A has 2, MCAST_DOMAIN=B has 1"), "{e}");
        }
        "none" => {
            let e = made.expect_err("refused");
            assert_eq!(e.kind, ErrorKind::NotSupported, "{e}");
            for part in ["the team spans 2 NVLink domains", "MCAST_DOMAIN=A (ranks 0)", "MCAST_NET=none"] {
                assert!(e.message.contains(part), "{part:?} in {e}");
            }
        }
        "fail" => fail(&ctx, made.unwrap(), r),
        "mismatch" => across(&ctx, made.unwrap(), r, Disagree::InDomain),
        "across-count" | "ordered-across-count" => across(&ctx, made.unwrap(), r, Disagree::Count),
        "across-root" | "ordered-across-root" => across(&ctx, made.unwrap(), r, Disagree::Root),
        "killed" | "ordered-killed" => killed(&ctx, made, r),
        c if c.trim_start_matches("ordered-").starts_with("abort-") => {
            let who = c.rsplit('-').next().unwrap().parse().unwrap();
            aborted(&ctx, made.unwrap(), r, who)
        }
        _ => panic!("unknown case {case}"),
    }
}

fn collectives(ctx: &Arc<Context>, team: Arc<Across>, n: usize, r: usize) {
    let info = team.info();
    assert_eq!((info.size, info.domains, info.domain_size, info.net_engine.as_str()), (n, 2, n / 2, "test"));
    let dev = team.team.devices()[team.local];
    let d = ctx.driver();
    let (send, recv) = (d.mem_alloc(dev, 1 << 20).unwrap(), d.mem_alloc(dev, 1 << 20).unwrap());
    let run = |s: DevicePtr, q: DevicePtr, count: usize, c: Collective| {
        run_ptr(&team, r as i32, s, q, count, c, Stream(0)).unwrap();
        team.synchronize(r as i32, Stream(0)).unwrap();
    };
    let value = |q: usize, i: usize| ((q * 7 + i * 3) % 11) as f32 - 5.0;
    // All-reduce: the short way (5) and the domain reduce-scatter, rail shard, domain all-gather
    // with a tail (20011 f32: over 64 KiB).
    for count in [5usize, 20011] {
        let x: Vec<u8> = (0..count).flat_map(|i| value(r, i).to_ne_bytes()).collect();
        d.memcpy_htod(dev, send, &x).unwrap();
        run(send, recv, count, Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum });
        let mut y = vec![0u8; count * 4];
        d.memcpy_dtoh(dev, &mut y, recv).unwrap();
        for (i, b) in y.chunks(4).enumerate() {
            let want: f32 = (0..n).map(|q| value(q, i)).sum();
            assert_eq!(f32::from_ne_bytes(b.try_into().unwrap()), want, "all-reduce of {count}, element {i}");
        }
    }
    // Reduce-scatter (i32 max): rank r gets block r's maximum.
    let count = 1001;
    let x: Vec<u8> = (0..n * count).flat_map(|i| (value(r, i) as i32).to_ne_bytes()).collect();
    d.memcpy_htod(dev, send, &x).unwrap();
    run(send, recv, count, Collective::ReduceScatter { dtype: DType::I32, op: RedOp::Max });
    let mut y = vec![0u8; count * 4];
    d.memcpy_dtoh(dev, &mut y, recv).unwrap();
    for (i, b) in y.chunks(4).enumerate() {
        let want = (0..n).map(|q| value(q, r * count + i) as i32).max().unwrap();
        assert_eq!(i32::from_ne_bytes(b.try_into().unwrap()), want, "reduce-scatter element {i}");
    }
    // All-gather and broadcast of odd byte counts.
    let byte = |q: usize, j: usize| (q * 31 + j * 7 + 1) as u8;
    for bytes in [1usize, 4097] {
        let x: Vec<u8> = (0..bytes).map(|j| byte(r, j)).collect();
        d.memcpy_htod(dev, send, &x).unwrap();
        run(send, recv, bytes, Collective::AllGather);
        let mut y = vec![0u8; n * bytes];
        d.memcpy_dtoh(dev, &mut y, recv).unwrap();
        for (k, &b) in y.iter().enumerate() {
            assert_eq!(b, byte(k / bytes, k % bytes), "all-gather of {bytes}, byte {k}");
        }
        for root in [n - 1, 1] {
            run(send, recv, bytes, Collective::Broadcast { root: root as u32 });
            let mut y = vec![0u8; bytes];
            d.memcpy_dtoh(dev, &mut y, recv).unwrap();
            assert!(y.iter().enumerate().all(|(j, &b)| b == byte(root, j)), "broadcast of {bytes} from {root}");
        }
    }
    d.mem_free(dev, send).unwrap();
    d.mem_free(dev, recv).unwrap();
    ranges(&team, n, r);
    team.destroy().unwrap();
    assert_clean(ctx);
}

/// The buffer forms' range checks (the flat form's, over the whole team's blocks): a range past
/// the end of the buffer is refused before any stage, naming the range; one that fits runs.
fn ranges(team: &Arc<Across>, n: usize, r: usize) {
    let any = AnyTeam::Across(team.clone());
    let (a, b) = (any.alloc(4 * n * 64).unwrap(), any.alloc(4 * n * 64).unwrap());
    let ag = Collective::AllGather;
    let rs = Collective::ReduceScatter { dtype: DType::F32, op: RedOp::Sum };
    let refused = |got: Result<()>, says: &str| {
        let e = got.expect_err("past the end");
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        assert!(e.message.contains(says), "rank {r}: {says:?} in {e}");
    };
    // All-gather into b: n blocks of 64 x 4 bytes fit from 0, not from 4.
    refused(a.run_into(0, &b, 4, r as i32, 4 * 64, ag, Stream(0)), "the collective's recv range");
    // Reduce-scatter from a: n blocks of 64 f32 fit from 0, not from 4.
    refused(a.run_into(4, &b, 0, r as i32, 64, rs, Stream(0)), "the collective's send range");
    // In place: the all-gather's n blocks past the end.
    refused(a.run(r as i32, 4, 4 * 64, ag, Stream(0)), "the collective's range");
    a.run_into(0, &b, 0, r as i32, 4 * 64, ag, Stream(0)).unwrap();
    team.synchronize(r as i32, Stream(0)).unwrap();
    a.buf.free().unwrap();
    b.buf.free().unwrap();
}

fn chunked(ctx: &Arc<Context>, team: Arc<Across>, n: usize, r: usize) {
    let l = n / 2;
    let dev = team.team.devices()[team.local];
    let d = ctx.driver();
    const BYTES: usize = 34 << 20;
    let (send, recv) = (d.mem_alloc(dev, BYTES).unwrap(), d.mem_alloc(dev, BYTES).unwrap());
    // Small integers (exact in every dtype, whatever the order of reduction); the 64-bit
    // integers get a high part that a 32-bit path would lose.
    let input = |q: usize, count: usize, dtype: DType| -> Vec<u8> {
        (0..count)
            .flat_map(|i| {
                let v = ((q * 7 + i * 3) % 11) as i64 - 5;
                match dtype {
                    DType::F32 => (v as f32).to_ne_bytes().to_vec(),
                    DType::F64 => (v as f64).to_ne_bytes().to_vec(),
                    DType::F16 => half::f16::from_f32(v as f32).to_ne_bytes().to_vec(),
                    DType::BF16 => half::bf16::from_f32(v as f32).to_ne_bytes().to_vec(),
                    DType::I32 => (v as i32).to_ne_bytes().to_vec(),
                    DType::U32 => ((v + 5) as u32).to_ne_bytes().to_vec(),
                    DType::I64 => (v - (3 << 40)).to_ne_bytes().to_vec(),
                    DType::U64 => ((v + 5) as u64 + (5 << 40)).to_ne_bytes().to_vec(),
                }
            })
            .collect()
    };
    // Through the rails in one chunk and in two (the last one longer, as (count / L) / 2 is
    // odd), with a tail; in place once.
    let mut cases = vec![(8_388_607usize, DType::F32, RedOp::Sum, false), (8_388_611, DType::F32, RedOp::Sum, true)];
    for dtype in [DType::F64, DType::F16, DType::BF16, DType::I32, DType::U32, DType::I64, DType::U64] {
        for (count, op) in [(524_289 + 2 * l, RedOp::Sum), (262_147, RedOp::Max), (131_075, RedOp::Min)] {
            cases.push((count, dtype, op, false));
        }
    }
    cases.push((4_194_307, DType::U64, RedOp::Sum, false));
    for (count, dtype, op, in_place) in cases {
        let plan = Chunks::of(count, dtype.size(), l);
        assert_eq!(plan.k > 1, count * dtype.size() > 4 * DEPTH_BYTES, "{count} {dtype:?}: {plan:?}");
        let x = input(r, count, dtype);
        let src = if in_place { recv } else { send };
        d.memcpy_htod(dev, src, &x).unwrap();
        run_ptr(&team, r as i32, src, recv, count, Collective::AllReduce { dtype, op }, Stream(0)).unwrap();
        team.synchronize(r as i32, Stream(0)).unwrap();
        let mut y = vec![0u8; x.len()];
        d.memcpy_dtoh(dev, &mut y, recv).unwrap();
        let all: Vec<Vec<u8>> = (0..n).map(|q| input(q, count, dtype)).collect();
        let want = fold(&all.iter().map(Vec::as_slice).collect::<Vec<_>>(), dtype, op).unwrap();
        let es = dtype.size();
        if let Some(i) = (0..count).find(|&i| y[i * es..(i + 1) * es] != want[i * es..(i + 1) * es]) {
            panic!("all-reduce of {count} {dtype:?} {op:?} (in place: {in_place}, {plan:?}): element {i} differs");
        }
    }
    d.mem_free(dev, send).unwrap();
    d.mem_free(dev, recv).unwrap();
    team.destroy().unwrap();
    assert_clean(ctx);
}

fn fail(ctx: &Arc<Context>, team: Arc<Across>, r: usize) {
    let dev = team.team.devices()[team.local];
    let d = ctx.driver();
    let buf = d.mem_alloc(dev, 4096).unwrap();
    let c = Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum };
    let got = run_ptr(&team, r as i32, buf, buf, 16, c, Stream(0));
    if r == 1 {
        let e = got.expect_err("the engine fails on rank 1");
        assert_eq!(e.kind, ErrorKind::Driver, "{e}");
        assert!(e.message.contains("test engine: all_reduce failed on rank 1"), "{e}");
    }
    // Every rank learns it (told over the team's connections) within a few seconds.
    let t0 = Instant::now();
    let e = loop {
        match team.synchronize(r as i32, Stream(0)) {
            Err(e) => break e,
            Ok(()) if t0.elapsed() < Duration::from_secs(5) => std::thread::sleep(Duration::from_millis(10)),
            Ok(()) => panic!("rank {r} was not told of the engine's failure"),
        }
    };
    assert_eq!(e.kind, ErrorKind::Driver, "{e}");
    assert!(e.message.contains("all_reduce failed on rank 1"), "{e}");
    d.mem_free(dev, buf).unwrap();
    team.destroy().unwrap();
}

/// What the ranks of `across` disagree on.
enum Disagree {
    /// The count, each domain's second rank passing half.
    InDomain,
    /// The count, domain B's ranks passing half.
    Count,
    /// The broadcast's root, domain B's ranks passing another.
    Root,
}

fn across(ctx: &Arc<Context>, team: Arc<Across>, r: usize, what: Disagree) {
    let (local, in_b) = (team.local, team.domain == 1);
    let (b0, a1) = (team.layout.rank_of(1, 0), team.layout.rank_of(0, 1));
    let dev = team.team.devices()[local];
    let d = ctx.driver();
    let buf = d.mem_alloc(dev, 8192).unwrap();
    let before: Vec<u8> = (0..8192).map(|i| (i * 7 + r) as u8).collect();
    store(buf, &before);
    let ar = Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum };
    let (c, count, says) = match what {
        Disagree::Root => {
            let c = Collective::Broadcast { root: if in_b { 1 } else { 0 } };
            (c, 4096, format!("ranks disagree on root: rank 0 has 0, rank {b0} has 1"))
        }
        Disagree::Count => {
            (ar, if in_b { 512 } else { 1024 }, format!("ranks disagree on count: rank 0 has 1024, rank {b0} has 512"))
        }
        Disagree::InDomain => (
            ar,
            if local == 1 { 512 } else { 1024 },
            format!("ranks disagree on count: rank 0 has 1024, rank {a1} has 512"),
        ),
    };
    let e = run_ptr(&team, r as i32, buf, buf, count, c, Stream(0)).expect_err("the domains disagree");
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    assert!(e.message.contains(&says), "rank {r}: {says:?} in {e}");
    assert!(e.message.starts_with(&format!("rank {r}: ")), "rank {r}: {e}");
    let e = team.synchronize(r as i32, Stream(0)).expect_err("the team keeps the error");
    assert!(e.kind == ErrorKind::InvalidArgument && e.message.contains(&says), "rank {r}: {e}");
    let e = run_ptr(&team, r as i32, buf, buf, 16, ar, Stream(0)).expect_err("a later call is refused");
    assert!(e.kind == ErrorKind::InvalidArgument && e.message.contains(&says), "rank {r}: {e}");
    assert!(bytes(buf, 8192) == before, "rank {r}: the failed call wrote data");
    d.mem_free(dev, buf).unwrap();
    team.destroy().unwrap();
}

fn killed(ctx: &Arc<Context>, made: Result<Arc<Across>>, r: usize) {
    if r == 3 {
        std::process::exit(0);
    }
    // Rank 3 leaves as soon as its own creation returns: a rank whose creation was still ending
    // then may learn of the failure there (a peer's rail call failed and told every rank).
    let team = match made {
        Ok(team) => team,
        Err(e) => {
            assert!(matches!(e.kind, ErrorKind::Timeout | ErrorKind::Aborted), "rank {r}: {e}");
            return;
        }
    };
    let dev = team.team.devices()[team.local];
    let d = ctx.driver();
    let buf = d.mem_alloc(dev, 1 << 20).unwrap();
    let c = Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum };
    let t0 = Instant::now();
    let e = run_ptr(&team, r as i32, buf, buf, 100_000, c, Stream(0))
        .and_then(|()| team.synchronize(r as i32, Stream(0)))
        .expect_err("a rank is gone");
    let took = t0.elapsed();
    assert!(matches!(e.kind, ErrorKind::Timeout | ErrorKind::Aborted), "{e}");
    assert!(took <= Duration::from_millis(u64::from(TIMEOUT_MS) + 1000), "rank {r} took {took:?}: {e}");
    let _ = team.destroy();
}

/// Rank `who` aborts after the others entered an all-reduce it never joins (see
/// [`an_abort_from_any_rank_is_seen_by_every_rank`]).
fn aborted(ctx: &Arc<Context>, team: Arc<Across>, r: usize, who: usize) {
    let dev = team.team.devices()[team.local];
    let d = ctx.driver();
    let buf = d.mem_alloc(dev, 1 << 16).unwrap();
    let c = Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum };
    // One all-reduce that works first: the team is whole before the abort.
    run_ptr(&team, r as i32, buf, buf, 1024, c, Stream(0))
        .and_then(|()| team.synchronize(r as i32, Stream(0)))
        .unwrap();
    let says = format!("mcast_team_abort by rank {who}'s process");
    let check = |e: &Error, what: &str| {
        assert_eq!(e.kind, ErrorKind::Aborted, "rank {r}, {what}: {e}");
        assert!(e.message.contains(&says), "rank {r}, {what}: {says:?} in {e}");
    };
    let t0 = Instant::now();
    if r == who {
        std::thread::sleep(Duration::from_millis(300));
        team.abort();
    } else {
        let e = run_ptr(&team, r as i32, buf, buf, 1024, c, Stream(0))
            .and_then(|()| team.synchronize(r as i32, Stream(0)))
            .expect_err("the all-reduce cannot complete: a rank aborted instead");
        check(&e, "the waiting all-reduce");
        let took = t0.elapsed();
        assert!(took < Duration::from_millis(300 + 1000), "rank {r} saw the abort after {took:?}");
    }
    check(&team.error().expect("the team keeps the abort"), "error");
    assert_eq!(team.async_error(), Some(ErrorKind::Aborted), "rank {r}");
    let t1 = Instant::now();
    let e = run_ptr(&team, r as i32, buf, buf, 16, c, Stream(0)).expect_err("a later call is refused");
    check(&e, "a later call");
    check(&team.synchronize(r as i32, Stream(0)).expect_err("synchronize reports it"), "synchronize");
    assert!(t1.elapsed() < Duration::from_millis(500), "rank {r}: calls after the abort took {:?}", t1.elapsed());
    d.mem_free(dev, buf).unwrap();
    team.destroy().unwrap();
    assert_clean(ctx);
}
