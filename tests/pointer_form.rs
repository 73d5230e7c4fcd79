//! The pointer form (`mcast_team_*`, API.md "Collectives on any device pointer") on plain device
//! memory (`cuMemAlloc` memory on the simulator, outside any registered buffer): all four
//! collectives on teams of 1, 2, 3, 4, 8 and 72 ranks, both transports, in place (NCCL's
//! layouts) and out of place, odd counts, every dtype for one op and every op for one dtype,
//! per-rank misaligned pointers, sizes crossing the staging chunk, back-to-back calls with one
//! synchronize at the end, the argument doors, and an empty ledger after teardown.
// Ranks index several per-rank vectors at once: plain index loops read best.
#![allow(clippy::needless_range_loop)]

mod common;

use std::sync::Arc;

use common::*;
use mcast::driver::{DevicePtr, Stream};
use mcast::kernels::abi::STAGE_BYTES;
use mcast::kernels::{Collective, DType, RedOp};
use mcast::runtime::collective::{run_ptr, synchronize};
use mcast::runtime::config::Config;
use mcast::runtime::context::Context;
use mcast::runtime::team::{Team, Transport};
use mcast::runtime::ErrorKind;

fn context(multicast: bool, devices: u32) -> Arc<Context> {
    runtime_context(Config { sim_device_memory: 128 * MIB as u64, ..sim_runtime(multicast, devices, 30_000) })
}

/// The value rank `r` contributes at element (or byte) `i`: small integers, exact in every dtype.
fn value(r: usize, i: usize) -> i64 {
    ((r * 7 + i * 3) % 23) as i64 - 5
}

fn store(dtype: DType, p: DevicePtr, i: usize, v: f64) {
    // SAFETY: simulated device memory is host memory; callers stay within their allocation.
    unsafe {
        match dtype {
            DType::F32 => std::ptr::write_unaligned((p as *mut f32).add(i), v as f32),
            DType::F64 => std::ptr::write_unaligned((p as *mut f64).add(i), v),
            DType::F16 => std::ptr::write_unaligned((p as *mut u16).add(i), half::f16::from_f64(v).to_bits()),
            DType::BF16 => std::ptr::write_unaligned((p as *mut u16).add(i), half::bf16::from_f64(v).to_bits()),
            DType::I32 => std::ptr::write_unaligned((p as *mut i32).add(i), v as i32),
            DType::U32 => std::ptr::write_unaligned((p as *mut u32).add(i), v as i64 as u32),
            DType::I64 => std::ptr::write_unaligned((p as *mut i64).add(i), v as i64),
            DType::U64 => std::ptr::write_unaligned((p as *mut u64).add(i), v as i64 as u64),
        }
    }
}

/// Element `i` at `p` as f64 (unsigned types read as the two's complement value they hold).
fn load(dtype: DType, p: DevicePtr, i: usize) -> f64 {
    // SAFETY: as in `store`.
    unsafe {
        match dtype {
            DType::F32 => std::ptr::read_unaligned((p as *const f32).add(i)) as f64,
            DType::F64 => std::ptr::read_unaligned((p as *const f64).add(i)),
            DType::F16 => half::f16::from_bits(std::ptr::read_unaligned((p as *const u16).add(i))).to_f64(),
            DType::BF16 => half::bf16::from_bits(std::ptr::read_unaligned((p as *const u16).add(i))).to_f64(),
            DType::I32 => std::ptr::read_unaligned((p as *const i32).add(i)) as f64,
            DType::U32 => std::ptr::read_unaligned((p as *const u32).add(i)) as i32 as f64,
            DType::I64 => std::ptr::read_unaligned((p as *const i64).add(i)) as f64,
            DType::U64 => std::ptr::read_unaligned((p as *const u64).add(i)) as i64 as f64,
        }
    }
}

/// The reduction of element `i` over `n` ranks, rounded to `dtype` as the kernels do (16-bit
/// floats accumulate in f32: exact for these small integers, then one rounding).
fn reduced(dtype: DType, op: RedOp, n: usize, i: usize) -> f64 {
    let vals = (0..n).map(|r| value(r, i));
    let v = match op {
        RedOp::Sum => vals.sum::<i64>(),
        RedOp::Min => vals.min().unwrap(),
        RedOp::Max => vals.max().unwrap(),
    } as f64;
    match dtype {
        DType::F16 => half::f16::from_f64(v).to_f64(),
        DType::BF16 => half::bf16::from_f64(v).to_f64(),
        _ => v,
    }
}

fn byte(r: usize, j: usize) -> u8 {
    (r * 31 + j * 7 + 1) as u8
}

/// One collective's memory on every rank: the allocations and the pointers passed.
struct Case {
    collective: Collective,
    count: usize,
    in_place: bool,
    allocs: Vec<(i32, DevicePtr)>,
    send: Vec<DevicePtr>,
    recv: Vec<DevicePtr>,
}

/// Sets up `collective` of `count` (elements, or bytes for broadcast and all-gather) on every
/// rank of `devices`, with rank r's pointers `shift(r)` bytes past a fresh allocation.
fn prepare(
    ctx: &Context,
    devices: &[i32],
    collective: Collective,
    count: usize,
    in_place: bool,
    shift: impl Fn(usize) -> usize,
) -> Case {
    let driver = ctx.driver();
    let n = devices.len();
    let (esize, dtype) = match collective {
        Collective::AllReduce { dtype, .. } | Collective::ReduceScatter { dtype, .. } => (dtype.size(), Some(dtype)),
        _ => (1, None),
    };
    let block = count * esize;
    let (send_len, recv_len) = match collective {
        Collective::AllGather => (block, n * block),
        Collective::ReduceScatter { .. } => (n * block, block),
        _ => (block, block),
    };
    let mut allocs = Vec::new();
    let mut alloc = |d: i32, len: usize| {
        let p = driver.mem_alloc(d, len + 16).unwrap();
        allocs.push((d, p));
        p
    };
    let (mut send, mut recv) = (Vec::new(), Vec::new());
    for (r, &d) in devices.iter().enumerate() {
        let k = shift(r) as u64;
        let (s, v) = if in_place {
            let big = alloc(d, send_len.max(recv_len)) + k;
            match collective {
                Collective::AllGather => (big + (r * block) as u64, big),
                Collective::ReduceScatter { .. } => (big, big + (r * block) as u64),
                _ => (big, big),
            }
        } else {
            (alloc(d, send_len) + k, alloc(d, recv_len) + k)
        };
        match (collective, dtype) {
            (Collective::Broadcast { .. } | Collective::AllGather, _) => {
                for j in 0..send_len {
                    // SAFETY: simulated device memory is host memory of send_len bytes from `s`.
                    unsafe { *((s + j as u64) as *mut u8) = byte(r, j) };
                }
            }
            (_, Some(dt)) => {
                for i in 0..send_len / esize {
                    store(dt, s, i, value(r, i) as f64);
                }
            }
            _ => unreachable!(),
        }
        send.push(s);
        recv.push(v);
    }
    Case { collective, count, in_place, allocs, send, recv }
}

/// Checks every rank's results of `c` (all of them, so a misplaced chunk cannot hide).
fn verify(c: &Case, n: usize, what: &str) {
    let block = c.count;
    for r in 0..n {
        let at = |i: usize| {
            format!("{what}: {:?} x {} rank {r} of {n} in place {} at {i}", c.collective, c.count, c.in_place)
        };
        match c.collective {
            Collective::AllReduce { dtype, op } => {
                for i in 0..c.count {
                    let got = load(dtype, c.recv[r], i);
                    let want = reduced(dtype, op, n, i);
                    assert!(got == want, "{}: {got} != {want}", at(i));
                }
            }
            Collective::ReduceScatter { dtype, op } => {
                for i in 0..c.count {
                    let got = load(dtype, c.recv[r], i);
                    let want = reduced(dtype, op, n, r * c.count + i);
                    assert!(got == want, "{}: {got} != {want}", at(i));
                }
            }
            Collective::Broadcast { root } => {
                for j in 0..block {
                    // SAFETY: simulated device memory is host memory.
                    let got = unsafe { *((c.recv[r] + j as u64) as *const u8) };
                    assert_eq!(got, byte(root as usize, j), "{}", at(j));
                }
            }
            Collective::AllGather => {
                for q in 0..n {
                    for j in 0..block {
                        // SAFETY: as above.
                        let got = unsafe { *((c.recv[r] + (q * block + j) as u64) as *const u8) };
                        assert_eq!(got, byte(q, j), "{} (block {q})", at(j));
                    }
                }
            }
        }
    }
}

fn release(ctx: &Context, c: Case) {
    for (d, p) in c.allocs {
        ctx.driver().mem_free(d, p).unwrap();
    }
}

/// Issues every case on every rank (rank by rank, each on its device's default stream), with no
/// synchronize between cases, then synchronizes once and checks them all.
fn run_all(ctx: &Context, team: &Arc<Team>, cases: Vec<Case>, what: &str) {
    let n = team.size();
    let s = Stream::DEFAULT;
    for c in &cases {
        for r in 0..n {
            run_ptr(team, r as i32, c.send[r], c.recv[r], c.count, c.collective, s)
                .unwrap_or_else(|e| panic!("{what}: {:?} rank {r}: {e}", c.collective));
        }
    }
    for r in 0..n as i32 {
        synchronize(team, r, s).unwrap();
    }
    for c in cases {
        verify(&c, n, what);
        release(ctx, c);
    }
}

/// Misaligned pointers on some ranks (a multiple of `align`, different per rank).
fn shifts(align: usize) -> impl Fn(usize) -> usize {
    move |r| (r * align) % 16
}

/// The pointer alignment the API requires of `collective`: the element size (NCCL's rule).
fn align_of(collective: Collective) -> usize {
    match collective {
        Collective::AllReduce { dtype, .. } | Collective::ReduceScatter { dtype, .. } => dtype.size(),
        _ => 1,
    }
}

/// Every collective, in and out of place, odd and chunk-crossing sizes, teams of 1-4 and 8 on
/// both transports, back to back.
fn matrix(multicast: bool) {
    let ctx = context(multicast, 8);
    let f32sum = Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum };
    for n in [1usize, 2, 3, 4, 8] {
        let devices: Vec<i32> = (0..n as i32).collect();
        let team = Team::create(&ctx, &devices).unwrap();
        assert_eq!(team.transport() == Transport::Multicast, multicast && n > 1);
        // Chunk-crossing sizes: all-reduce and broadcast past STAGE_BYTES, the per-rank blocks
        // of reduce-scatter and all-gather past STAGE_BYTES / n.
        let big_ar = STAGE_BYTES / 4 + 1001;
        // Five and more push steps of 64 rows (teams of up to 4): every scratch slot reused
        // within one launch, and again by the launches after it.
        let huge_ar = if n <= 4 { 5 * STAGE_BYTES / 4 + 4099 } else { 1 };
        let big_block = STAGE_BYTES / n + 333;
        let rs = |dtype, op| Collective::ReduceScatter { dtype, op };
        let mut cases = Vec::new();
        for in_place in [false, true] {
            for (collective, count) in [
                (f32sum, 1),
                (f32sum, 1003),
                (f32sum, big_ar),
                (f32sum, huge_ar),
                (Collective::AllReduce { dtype: DType::BF16, op: RedOp::Max }, 777),
                (rs(DType::I32, RedOp::Sum), 5),
                (rs(DType::F32, RedOp::Min), big_block / 4),
                (Collective::Broadcast { root: (n - 1) as u32 }, 1),
                (Collective::Broadcast { root: 0 }, STAGE_BYTES + 17),
                (Collective::AllGather, 13),
                (Collective::AllGather, big_block),
            ] {
                cases.push(prepare(&ctx, &devices, collective, count, in_place, shifts(align_of(collective))));
            }
        }
        run_all(&ctx, &team, cases, &format!("multicast {multicast}"));
        team.destroy().unwrap();
    }
    assert_clean(&ctx);
}

#[test]
fn every_collective_on_plain_memory_multicast_teams() {
    matrix(true);
}

#[test]
fn every_collective_on_plain_memory_p2p_teams() {
    matrix(false);
}

/// Every dtype with one operator, every operator with one dtype, all-reduce and reduce-scatter,
/// odd counts, misaligned pointers, on teams of 2 and 3 (all-reduce pushed, reduce-scatter staged)
/// per transport.
#[test]
fn every_dtype_and_operator_on_plain_memory() {
    for multicast in [true, false] {
        let ctx = context(multicast, 4);
        for n in [2usize, 3] {
            let devices: Vec<i32> = (0..n as i32).collect();
            let team = Team::create(&ctx, &devices).unwrap();
            let mut reds: Vec<(DType, RedOp)> = DType::ALL.iter().map(|&d| (d, RedOp::Sum)).collect();
            reds.extend([RedOp::Min, RedOp::Max].map(|o| (DType::BF16, o)));
            reds.extend([RedOp::Min, RedOp::Max].map(|o| (DType::F32, o)));
            let mut cases = Vec::new();
            for (dtype, op) in reds {
                let align = dtype.size();
                for in_place in [false, true] {
                    for collective in [Collective::AllReduce { dtype, op }, Collective::ReduceScatter { dtype, op }] {
                        // In place, reduce-scatter's recv lies count elements per rank into send: an odd
                        // count puts odd ranks' blocks at 2 bytes mod 4 for 16-bit types.
                        let count = 301;
                        cases.push(prepare(&ctx, &devices, collective, count, in_place, shifts(align)));
                    }
                }
            }
            run_all(&ctx, &team, cases, &format!("dtypes multicast {multicast} n {n}"));
            team.destroy().unwrap();
        }
        assert_clean(&ctx);
    }
}

/// 16-bit types at 2-byte alignment (NCCL takes element-aligned pointers; an in-place
/// reduce-scatter or all-gather of bf16/f16 with an odd count puts odd ranks' blocks there):
/// every collective, odd counts, in place and out of place, on every route (LL, push, staged,
/// chunk-crossing), both transports, teams of 2 to 4, every rank's pointers at 2 bytes mod 4.
#[test]
fn sixteen_bit_types_at_two_byte_alignment() {
    for multicast in [true, false] {
        let ctx = context(multicast, 4);
        for n in [2usize, 3, 4] {
            let devices: Vec<i32> = (0..n as i32).collect();
            let team = Team::create(&ctx, &devices).unwrap();
            let mut cases = Vec::new();
            for dtype in [DType::BF16, DType::F16] {
                let ar = Collective::AllReduce { dtype, op: RedOp::Sum };
                let rs = Collective::ReduceScatter { dtype, op: RedOp::Max };
                for in_place in [false, true] {
                    for (collective, count) in [
                        (ar, 1),
                        (ar, 301),
                        (ar, STAGE_BYTES / 2 + 1001),
                        (rs, 1),
                        (rs, 301),
                        (rs, STAGE_BYTES / 2 / n + 333),
                        // All-gather and broadcast of an odd count of 16-bit elements, in bytes.
                        (Collective::AllGather, 2 * 301),
                        (Collective::AllGather, 2 * (STAGE_BYTES / 2 / n + 333)),
                        (Collective::Broadcast { root: (n - 1) as u32 }, 2 * 301),
                    ] {
                        cases.push(prepare(&ctx, &devices, collective, count, in_place, |r| 2 + 4 * r));
                    }
                }
            }
            run_all(&ctx, &team, cases, &format!("16-bit at 2 bytes, multicast {multicast} n {n}"));
            team.destroy().unwrap();
        }
        assert_clean(&ctx);
    }
}

/// A team of 72 ranks (an NVL72 rack) on 72 simulated devices: every collective with small
/// counts on plain memory, both transports.
#[test]
fn team_of_72_on_plain_memory() {
    for multicast in [true, false] {
        let ctx = context(multicast, 72);
        let devices: Vec<i32> = (0..72).collect();
        let team = Team::create(&ctx, &devices).unwrap();
        assert_eq!(team.transport() == Transport::Multicast, multicast);
        let mut cases = Vec::new();
        for in_place in [false, true] {
            for (collective, count) in [
                (Collective::AllReduce { dtype: DType::BF16, op: RedOp::Sum }, 37),
                (Collective::AllReduce { dtype: DType::I64, op: RedOp::Max }, 9),
                (Collective::ReduceScatter { dtype: DType::F32, op: RedOp::Sum }, 3),
                (Collective::Broadcast { root: 71 }, 100),
                (Collective::AllGather, 7),
            ] {
                cases.push(prepare(&ctx, &devices, collective, count, in_place, shifts(align_of(collective))));
            }
        }
        run_all(&ctx, &team, cases, &format!("72 ranks multicast {multicast}"));
        team.destroy().unwrap();
        assert_clean(&ctx);
    }
}

/// The argument doors of every collective of the pointer form: NULL, misaligned, host memory,
/// another device's memory, partial overlap, and count 0 as a no-op; nothing is enqueued, so
/// a correct call afterwards works and nothing leaks.
#[test]
fn bad_arguments_of_the_pointer_form() {
    let ctx = context(false, 4);
    let driver = ctx.driver().clone();
    let team = Team::create(&ctx, &[0, 1, 2]).unwrap();
    let s = Stream::DEFAULT;
    let mem: Vec<DevicePtr> = (0..3).map(|d| driver.mem_alloc(d, 64 * 1024).unwrap()).collect();
    let host = [0u64; 1024];
    let hp = host.as_ptr() as u64;
    let bad = |res: mcast::runtime::Result<()>, says: &str| {
        let e = res.unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{says}: {e}");
        assert!(e.message.contains(says), "{says}: {e}");
    };
    let m = mem[0];
    let f16 = Collective::AllReduce { dtype: DType::F16, op: RedOp::Sum };
    for collective in [
        Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum },
        Collective::ReduceScatter { dtype: DType::I64, op: RedOp::Min },
        Collective::Broadcast { root: 1 },
        Collective::AllGather,
    ] {
        bad(run_ptr(&team, 0, 0, m, 16, collective, s), "send is NULL");
        bad(run_ptr(&team, 0, m, 0, 16, collective, s), "recv is NULL");
        bad(run_ptr(&team, 0, hp, m, 16, collective, s), "not device memory");
        bad(run_ptr(&team, 0, m, hp, 16, collective, s), "not device memory");
        bad(run_ptr(&team, 0, mem[1], m, 16, collective, s), "device 1, but rank 0");
        bad(run_ptr(&team, 0, m, mem[2] + 4096, 16, collective, s), "device 2, but rank 0");
        // Overlapping, not NCCL's in-place layout.
        bad(run_ptr(&team, 0, m + 8, m + 16, 16, collective, s), "overlap");
        // Past the end of the allocation.
        bad(run_ptr(&team, 0, m + 64 * 1024 - 8, m, 16, collective, s), "not device memory");
        // Count 0: a no-op after the rank check.
        run_ptr(&team, 0, 0, 0, 0, collective, s).unwrap();
    }
    bad(run_ptr(&team, 0, m + 1, m + 1024, 16, f16, s), "multiple of 2");
    bad(
        run_ptr(&team, 0, m + 2, m + 1024, 16, Collective::AllReduce { dtype: DType::I32, op: RedOp::Sum }, s),
        "multiple of 4",
    );
    let e = run_ptr(&team, 3, m, m, 16, f16, s).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    // Nothing was enqueued: a correct all-gather on every rank still works.
    let c = prepare(&ctx, &[0, 1, 2], Collective::AllGather, 100, false, |_| 0);
    run_all(&ctx, &team, vec![c], "after the bad calls");
    for (d, p) in mem.into_iter().enumerate() {
        driver.mem_free(d as i32, p).unwrap();
    }
    team.destroy().unwrap();
    assert_clean(&ctx);
}

/// Two ranks of one device given the same stream: the pointer form (staged and push routes)
/// refuses the second rank at once (the one-stream check), enqueuing nothing for it.
#[test]
fn one_stream_check_on_the_pointer_form() {
    let ctx = context(false, 2);
    let driver = ctx.driver().clone();
    for n in [3usize, 5] {
        let devices: Vec<i32> = (0..n as i32).map(|r| if r == 1 { 0 } else { r % 2 }).collect();
        let team = Team::create(&ctx, &devices).unwrap();
        let mem: Vec<DevicePtr> = devices.iter().map(|&d| driver.mem_alloc(d, 4096).unwrap()).collect();
        let ar = Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum };
        let s = Stream::DEFAULT;
        run_ptr(&team, 0, mem[0], mem[0], 16, ar, s).unwrap();
        let e = run_ptr(&team, 1, mem[1], mem[1], 16, ar, s).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        assert!(e.message.contains("rank"), "{e}");
        // Rank 0's collective cannot complete: abort ends it; destroy then releases everything.
        team.abort();
        let _ = synchronize(&team, 0, s);
        team.destroy().unwrap();
        for (&d, p) in devices.iter().zip(mem) {
            driver.mem_free(d, p).unwrap();
        }
    }
    assert_clean(&ctx);
}

/// A rule broken by one rank of a one-process team refuses every rank's call (API.md): rank 2
/// of 4 passes a misaligned, NULL or overlapping pointer after ranks 0 and 1 issued theirs.
/// Rank 2 and rank 3 (calling after it) are refused by the call, ranks 0 and 1 by their next
/// synchronize and the team's error, all with INVALID_ARGUMENT, well before timeout_ms (30 s),
/// and no rank's recv was written. A refusal by the first rank to call leaves the team usable:
/// the others are refused before enqueuing anything, and the next collective works.
#[test]
fn a_rule_broken_by_one_rank_refuses_every_rank() {
    let ctx = context(false, 4);
    let driver = ctx.driver().clone();
    let ar = Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum };
    let s = Stream::DEFAULT;
    let count = 64usize;
    for (what, says) in [("misaligned", "multiple of 4"), ("NULL", "is NULL"), ("overlapping", "overlap")] {
        let team = Team::create(&ctx, &[0, 1, 2, 3]).unwrap();
        let mem: Vec<DevicePtr> = (0..4).map(|d| driver.mem_alloc(d, 4096).unwrap()).collect();
        let recv = |r: usize| mem[r] + 2048;
        for (r, &m) in mem.iter().enumerate() {
            for i in 0..count {
                store(DType::F32, m, i, value(r, i) as f64);
                store(DType::F32, recv(r), i, -1000.0);
            }
        }
        let started = std::time::Instant::now();
        for r in 0..2 {
            run_ptr(&team, r as i32, mem[r], recv(r), count, ar, s).unwrap();
        }
        let (send2, recv2) = match what {
            "misaligned" => (mem[2] + 2, recv(2)),
            "NULL" => (mem[2], 0),
            _ => (mem[2], mem[2] + 8),
        };
        let e = run_ptr(&team, 2, send2, recv2, count, ar, s).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{what}: {e}");
        assert!(e.message.contains(says), "{what}: {e}");
        let e = run_ptr(&team, 3, mem[3], recv(3), count, ar, s).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{what}: {e}");
        assert!(e.message.contains("rank 2") && e.message.contains(says), "{what}: {e}");
        for r in 0..4 {
            let e = synchronize(&team, r, s).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{what} rank {r}: {e}");
        }
        assert_eq!(team.async_error(), Some(ErrorKind::InvalidArgument), "{what}");
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "{what}: {:?}", started.elapsed());
        for r in 0..4 {
            for i in 0..count {
                assert_eq!(load(DType::F32, recv(r), i), -1000.0, "{what}: rank {r}'s recv was written at {i}");
            }
        }
        team.destroy().unwrap();
        for (d, p) in mem.into_iter().enumerate() {
            driver.mem_free(d as i32, p).unwrap();
        }
    }
    // The first rank to call breaks the rule: nothing was enqueued anywhere, the team stays
    // usable.
    let team = Team::create(&ctx, &[0, 1, 2, 3]).unwrap();
    let mem: Vec<DevicePtr> = (0..4).map(|d| driver.mem_alloc(d, 4096).unwrap()).collect();
    let e = run_ptr(&team, 0, mem[0], 0, count, ar, s).unwrap_err();
    assert!(e.message.contains("recv is NULL"), "{e}");
    for r in 1..4 {
        let e = run_ptr(&team, r, mem[r as usize], mem[r as usize], count, ar, s).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "rank {r}: {e}");
        assert!(e.message.contains("rank 0") && e.message.contains("recv is NULL"), "rank {r}: {e}");
    }
    assert_eq!(team.async_error(), None);
    let c = prepare(&ctx, &[0, 1, 2, 3], ar, count, false, |_| 0);
    run_all(&ctx, &team, vec![c], "after a refused round");
    team.destroy().unwrap();
    for (d, p) in mem.into_iter().enumerate() {
        driver.mem_free(d as i32, p).unwrap();
    }
    assert_clean(&ctx);
}

/// A timeout in a one-process team names the ranks that did not arrive (those that called fewer
/// collectives) and points to the issue-order rule of a thread that drives several ranks.
#[test]
fn a_timeout_names_the_ranks_that_did_not_arrive() {
    let ctx = runtime_context(Config { sim_device_memory: 128 * MIB as u64, ..sim_runtime(false, 4, 200) });
    let driver = ctx.driver().clone();
    let team = Team::create(&ctx, &[0, 1, 2]).unwrap();
    let mem: Vec<DevicePtr> = (0..3).map(|d| driver.mem_alloc(d, 4096).unwrap()).collect();
    let ar = Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum };
    for r in 0..2 {
        run_ptr(&team, r as i32, mem[r], mem[r], 16, ar, Stream::DEFAULT).unwrap();
    }
    let e = synchronize(&team, 0, Stream::DEFAULT).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
    assert!(e.message.contains("did not arrive: rank 2 (0)"), "{e}");
    assert!(e.message.contains("docs/collectives.md, \"One thread driving several ranks\""), "{e}");
    // The page and section the message names exist.
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/collectives.md")).unwrap();
    assert!(page.lines().any(|l| l == "## One thread driving several ranks"), "docs/collectives.md lacks the section");
    let _ = synchronize(&team, 1, Stream::DEFAULT);
    team.destroy().unwrap();
    for (d, p) in mem.into_iter().enumerate() {
        driver.mem_free(d as i32, p).unwrap();
    }
    assert_clean(&ctx);
}
