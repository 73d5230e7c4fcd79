//! The LL kernels (kernels/ll.cuh: small messages, the flag carried in the data, no barrier) on
//! the simulator, which runs the same line protocol (src/kernels/sim/ll.rs), and with
//! `MCAST_TEST_BACKEND=cuda` on the GPUs there are (a device repeats where a team has more ranks
//! than the machine has GPUs; the tests that reach into device memory from the host or leave a
//! rank missing stay on the simulator): long runs of calls
//! with no synchronize between them (so ranks run apart, up to the protocol's limit), every
//! collective and grid mixed with the other kernels on one team, broadcasts from one root in a
//! row (the root receives nothing but acknowledgements), the flags wrapping around, CUDA-graph
//! replays, a missing rank, results bit-identical to the kernels without LL, and `MCAST_LL=off`.

mod common;

use std::sync::Arc;

use common::*;
use mcast::driver::Device;
use mcast::kernels::abi::{ll_bytes, ll_serves, LL_MAX_BYTES, LL_PART, LL_SEQ_OFFSET};
use mcast::kernels::{Collective, DType, RedOp};
use mcast::runtime::buffer::Buffer;
use mcast::runtime::collective::{run, synchronize};
use mcast::runtime::config::{Backend, Config, LlMode};
use mcast::runtime::context::Context;
use mcast::runtime::team::Team;
use mcast::runtime::ErrorKind;

/// A P2P context: `devices` simulated GPUs, or the CUDA backend on a GPU run.
fn context(ll: LlMode, devices: u32, timeout_ms: u32) -> Arc<Context> {
    context_on(on_gpu(), ll, devices, timeout_ms)
}

/// As [`context`], on the simulator unless `gpu`.
fn context_on(gpu: bool, ll: LlMode, devices: u32, timeout_ms: u32) -> Arc<Context> {
    let sim = Config { ll, sim_device_memory: 256 * MIB as u64, ..sim_runtime(false, devices, timeout_ms) };
    runtime_context(if gpu { Config { backend: Backend::Cuda, ..sim } } else { sim })
}

/// Devices for `ranks`: as given on the simulator, wrapped onto the GPUs there are on CUDA.
fn devs(ctx: &Context, ranks: &[Device]) -> Vec<Device> {
    let have = ctx.device_count() as Device;
    ranks.iter().map(|&d| d % have).collect()
}

/// Element `i` of rank `r`'s input for case `k`: small integers, exact in every dtype.
fn value(k: usize, r: usize, i: usize) -> i64 {
    ((k * 5 + r * 7 + i * 3) % 29) as i64 - 9
}

fn byte(k: usize, r: usize, j: usize) -> u8 {
    (k * 13 + r * 31 + j * 7 + 1) as u8
}

/// One collective at its own offset of the shared buffer.
struct Case {
    collective: Collective,
    count: usize,
    offset: usize,
}

impl Case {
    fn esize(&self) -> usize {
        match self.collective {
            Collective::AllReduce { dtype, .. } | Collective::ReduceScatter { dtype, .. } => dtype.size(),
            _ => 1,
        }
    }

    /// Bytes the case occupies on each rank.
    fn extent(&self, n: usize) -> usize {
        match self.collective {
            Collective::ReduceScatter { .. } | Collective::AllGather => n * self.count * self.esize(),
            _ => self.count * self.esize(),
        }
    }

    /// Rank `r`'s input bytes for case number `k`.
    fn input(&self, k: usize, n: usize, r: usize) -> Vec<u8> {
        match self.collective {
            Collective::AllReduce { dtype, .. } | Collective::ReduceScatter { dtype, .. } => {
                let elems = self.extent(n) / dtype.size();
                (0..elems).flat_map(|i| encode(dtype, value(k, r, i) as f64)).collect()
            }
            Collective::AllGather => {
                // Rank r's block holds its bytes; the other blocks a filler the gather overwrites.
                let b = self.count;
                (0..n * b).map(|j| if j / b == r { byte(k, r, j) } else { 0xEE }).collect()
            }
            Collective::Broadcast { .. } => (0..self.count).map(|j| byte(k, r, j)).collect(),
        }
    }

    /// What rank `r` must hold after case number `k`.
    fn expected(&self, k: usize, n: usize, r: usize) -> Vec<u8> {
        match self.collective {
            Collective::AllReduce { dtype, op } | Collective::ReduceScatter { dtype, op } => {
                let all = matches!(self.collective, Collective::AllReduce { .. });
                let mut out = self.input(k, n, r);
                let first = if all { 0 } else { r * self.count };
                for i in first..first + self.count {
                    let vals = (0..n).map(|q| value(k, q, i));
                    let v = match op {
                        RedOp::Sum => vals.sum::<i64>(),
                        RedOp::Min => vals.min().unwrap(),
                        RedOp::Max => vals.max().unwrap(),
                    };
                    let es = dtype.size();
                    out[i * es..(i + 1) * es].copy_from_slice(&encode(dtype, v as f64));
                }
                out
            }
            Collective::AllGather => (0..n * self.count).map(|j| byte(k, j / self.count, j)).collect(),
            Collective::Broadcast { root } => (0..self.count).map(|j| byte(k, root as usize, j)).collect(),
        }
    }
}

/// Lays `specs` out in one buffer of `team`, writes the inputs, issues every case on every rank
/// with no synchronize in between (rank by rank, each on its own stream), synchronizes once
/// and checks every rank's bytes of every case.
fn run_back_to_back(team: &Arc<Team>, specs: &[(Collective, usize)], what: &str) {
    let n = team.size();
    let mut cases = Vec::new();
    let mut offset = 0;
    for &(collective, count) in specs {
        let c = Case { collective, count, offset };
        offset += c.extent(n).next_multiple_of(16) + 16 * (cases.len() % 3);
        cases.push(c);
    }
    let buf = Buffer::alloc(team, offset.max(1)).unwrap();
    let streams = rank_streams(team);
    // Rank 0's calls all go first: every kind's module must be loaded before (README).
    load_modules(team, &specs.iter().map(|&(c, _)| c).collect::<Vec<_>>());
    for r in 0..n {
        let mut bytes = vec![0u8; offset];
        for (k, c) in cases.iter().enumerate() {
            bytes[c.offset..c.offset + c.extent(n)].copy_from_slice(&c.input(k, n, r));
        }
        buf.write(r as i32, 0, &bytes).unwrap();
    }
    for (r, &s) in streams.iter().enumerate() {
        for c in &cases {
            run(&buf, r as i32, c.offset, c.count, c.collective, s).unwrap();
        }
    }
    for (r, &s) in streams.iter().enumerate() {
        synchronize(team, r as i32, s).unwrap_or_else(|e| panic!("{what}: rank {r}: {e}"));
    }
    for r in 0..n {
        let mut bytes = vec![0u8; offset];
        buf.read(r as i32, 0, &mut bytes).unwrap();
        for (k, c) in cases.iter().enumerate() {
            let got = &bytes[c.offset..c.offset + c.extent(n)];
            assert!(
                got == c.expected(k, n, r).as_slice(),
                "{what}: case {k} {:?} x {} rank {r} of {n} differs",
                c.collective,
                c.count
            );
        }
    }
    drop_rank_streams(team, streams);
    buf.free().unwrap();
}

const BF16_SUM: Collective = Collective::AllReduce { dtype: DType::BF16, op: RedOp::Sum };

/// Every collective, grids of 1 to 32 blocks (payloads around each block's part), the other
/// kernels in between (the push kernels among them), broadcasts from changing roots and from one
/// root in a row.
fn mixed(n: usize) -> Vec<(Collective, usize)> {
    let part = LL_PART as usize;
    let rs = Collective::ReduceScatter { dtype: DType::I32, op: RedOp::Max };
    let mut v = vec![
        (BF16_SUM, 1),
        (BF16_SUM, part / 2 - 1),
        (BF16_SUM, part / 2 + 1),
        (Collective::AllReduce { dtype: DType::F64, op: RedOp::Min }, 3 * part / 8 + 5),
        (Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum }, LL_MAX_BYTES as usize / 4),
        (Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum }, LL_MAX_BYTES as usize / 4 + 1),
        (rs, 1),
        (rs, part / 4 + 3),
        (rs, LL_MAX_BYTES as usize / 4),
        (rs, LL_MAX_BYTES as usize / 4 + 7),
        (Collective::AllGather, 1),
        (Collective::AllGather, 3 * part + 1),
        (Collective::AllGather, LL_MAX_BYTES as usize + 3),
        (Collective::Broadcast { root: 0 }, 7),
        (Collective::Broadcast { root: (n - 1) as u32 }, 2 * part + 9),
        (BF16_SUM, 1 << 20),
        // The push kernels beside LL (teams of up to 4): the reduce-scatter of whole 16-byte
        // blocks, in two steps of rows at three ranks; the two-shot of an all-reduce past the
        // push one-shot, its last slice ending off the vector grid.
        (rs, LL_MAX_BYTES as usize / 4 + 4),
        (rs, (2 << 20) / 4 + 4),
        (Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum }, (5 << 20) / 4 + 3),
        (Collective::Broadcast { root: 1 }, LL_MAX_BYTES as usize + 1),
        (Collective::AllReduce { dtype: DType::I64, op: RedOp::Sum }, 5),
        (Collective::AllReduce { dtype: DType::U32, op: RedOp::Max }, 333),
    ];
    // One root in a row: it hears only acknowledgements, nothing else holds it back.
    v.extend((0..12).map(|i| (Collective::Broadcast { root: 0 }, 100 + i * part / 3)));
    // Then every rank a root in turn, each LL call a different grid.
    v.extend((0..2 * n).map(|i| (Collective::Broadcast { root: (i % n) as u32 }, 1 + i * part)));
    v.extend((0..8).map(|i| (BF16_SUM, 1 + i * 777)));
    v
}

#[test]
fn mixed_collectives_back_to_back_on_teams_of_2_3_and_8() {
    let ctx = context(LlMode::Auto, 8, 20_000);
    for n in [2usize, 3, 8] {
        let team = Team::create(&ctx, &devs(&ctx, &(0..n as i32).collect::<Vec<_>>())).unwrap();
        assert!(team.ll(), "LL is on by default (MCAST_LL=auto), on the simulator and on CUDA");
        let specs = mixed(n);
        // The specs exercise LL and the kernels beside it.
        let lls = specs.iter().filter(|(c, k)| ll_serves(*c, n as u32, *k as u64, team.max_blocks())).count();
        assert!(lls > 20 && lls < specs.len(), "{lls} of {} cases run LL", specs.len());
        run_back_to_back(&team, &specs, &format!("team of {n}"));
        team.destroy().unwrap();
    }
    assert_clean(&ctx);
}

/// Two ranks on one device share its SMs: the grid cap halves, LL still fits.
#[test]
fn ranks_sharing_a_device() {
    let ctx = context(LlMode::Auto, 2, 20_000);
    let team = Team::create(&ctx, &devs(&ctx, &[0, 0, 1, 1])).unwrap();
    assert!(team.ll());
    run_back_to_back(&team, &mixed(4), "ranks 0,0,1,1");
    team.destroy().unwrap();
    assert_clean(&ctx);
}

/// The flags run 1..=0xfffffffe and wrap to 1 (never 0, an unwritten line), the parity still
/// alternating: ranks started just before the wrap run through it correctly.
#[test]
fn flags_wrap_around() {
    let ctx = context_on(false, LlMode::Auto, 4, 20_000);
    for n in [2usize, 3] {
        let team = Team::create(&ctx, &(0..n as i32).collect::<Vec<_>>()).unwrap();
        let seq = |r: usize, b: usize| (team.sync_base(r, r) + (LL_SEQ_OFFSET + 4 * b) as u64) as *mut u32;
        for r in 0..n {
            for b in 0..32 {
                // SAFETY: simulated device memory is host memory; the team is idle.
                unsafe { seq(r, b).write_volatile(0xffff_fffb) };
            }
        }
        // Eight one-block calls (slot 0 only), then a wide one on every slot.
        let mut specs: Vec<(Collective, usize)> = (0..8).map(|i| (BF16_SUM, 1 + 100 * i)).collect();
        specs.push((Collective::AllGather, 2 * LL_PART as usize * 10));
        specs.push((Collective::Broadcast { root: 1 }, 9));
        run_back_to_back(&team, &specs, &format!("wrap, team of {n}"));
        // Slot 0: 0xfffffffc, 0xfffffffd, 0xfffffffe, 1, 2, ... ten calls end at 7; the slots
        // only the all-gather used (1..) end at 0xfffffffc.
        for r in 0..n {
            // SAFETY: as above; the team is idle after the synchronize.
            let (s0, s1) = unsafe { (seq(r, 0).read_volatile(), seq(r, 1).read_volatile()) };
            assert_eq!((s0, s1), (7, 0xffff_fffc), "rank {r}");
        }
        team.destroy().unwrap();
    }
    assert_clean(&ctx);
}

/// Calls captured in CUDA graphs and replayed: the flags live in device memory, so every
/// replay runs with new ones. Three LL calls per replay, each checked after the last replay.
#[test]
fn replayed_from_graphs() {
    let ctx = context(LlMode::Auto, 3, 20_000);
    let driver = ctx.driver().clone();
    let devices = devs(&ctx, &[0, 1, 2]);
    let team = Team::create(&ctx, &devices).unwrap();
    let count = 3000usize;
    // Bytes: the all-reduce's i32s at 0, the broadcast's 100 bytes at BC, the all-gather's three
    // 10-byte blocks at AG.
    const BC: usize = 4 * 3000;
    const AG: usize = BC + 128;
    let buf = Buffer::alloc(&team, AG + 30).unwrap();
    let v = |j: usize| (j % 5) as i32 - 2;
    for r in 0..3 {
        let mut bytes: Vec<u8> = (0..count).flat_map(|j| (v(j) * (r as i32 + 1)).to_ne_bytes()).collect();
        bytes.extend((0..128).map(|j| byte(0, r, j)));
        bytes.extend((0..30).map(|j| if j / 10 == r { byte(1, r, j) } else { 0xEE }));
        buf.write(r as i32, 0, &bytes).unwrap();
    }
    let i32_sum = Collective::AllReduce { dtype: DType::I32, op: RedOp::Sum };
    let graphs = RankGraphs::capture(&driver, &devices, |r, stream| {
        run(&buf, r as i32, 0, count, i32_sum, stream).unwrap();
        run(&buf, r as i32, BC, 100, Collective::Broadcast { root: 2 }, stream).unwrap();
        run(&buf, r as i32, AG, 10, Collective::AllGather, stream).unwrap();
    });
    let replays = 5;
    graphs.replay(&driver, replays);
    for (r, &s) in graphs.streams.iter().enumerate() {
        synchronize(&team, r as i32, s).unwrap();
    }
    // The first all-reduce sums x_r = v * (r + 1) to 6v; each later one multiplies by 3.
    let want: Vec<i32> = (0..count).map(|j| v(j) * 6 * 3i32.pow(replays - 1)).collect();
    for r in 0..3 {
        let mut bytes = vec![0u8; AG + 30];
        buf.read(r as i32, 0, &mut bytes).unwrap();
        let got: Vec<i32> = bytes[..BC].chunks_exact(4).map(|c| i32::from_ne_bytes(c.try_into().unwrap())).collect();
        assert_eq!(got, want, "rank {r}: all-reduce");
        let root: Vec<u8> = (0..100).map(|j| byte(0, 2, j)).collect();
        assert_eq!(bytes[BC..BC + 100], root[..], "rank {r}: broadcast");
        assert!(
            bytes[BC + 100..AG].iter().enumerate().all(|(j, &b)| b == byte(0, r, 100 + j)),
            "rank {r}: past the broadcast"
        );
        let gathered: Vec<u8> = (0..30).map(|j| byte(1, j / 10, j)).collect();
        assert_eq!(bytes[AG..], gathered[..], "rank {r}: all-gather");
    }
    graphs.destroy(&driver);
    buf.free().unwrap();
    team.destroy().unwrap();
    assert_clean(&ctx);
}

/// A rank that never arrives: the others' LL waits end at the timeout (a broadcast's root
/// too: it waits for the acknowledgements), the error is sticky, destroy releases everything.
#[test]
fn a_missing_rank_times_out() {
    for c in [BF16_SUM, Collective::Broadcast { root: 0 }, Collective::AllGather] {
        let ctx = context_on(false, LlMode::Auto, 2, 300);
        let team = Team::create(&ctx, &[0, 1]).unwrap();
        let buf = Buffer::alloc(&team, 4096).unwrap();
        let s = rank_streams(&team);
        run(&buf, 0, 0, 256, c, s[0]).unwrap();
        let started = std::time::Instant::now();
        let e = synchronize(&team, 0, s[0]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Timeout, "{c:?}: {e}");
        assert!(e.message.contains("timeout_ms = 300 ms"), "{e}");
        // The rank whose lines never came is named.
        assert!(e.message.contains("rank 0 timed out first: rank 1 did not arrive"), "{c:?}: {e}");
        assert!(started.elapsed().as_secs_f64() < 10.0);
        assert_eq!(run(&buf, 1, 0, 256, c, s[1]).unwrap_err().kind, ErrorKind::Timeout);
        drop_rank_streams(&team, s);
        buf.free().unwrap();
        team.destroy().unwrap();
        assert!(ctx.shutdown().is_empty());
    }
}

/// LL reduces in rank order with one rounding, as the other kernels: random floats give the same
/// bits with LL on and off. Off, a team keeps no landing area.
#[test]
fn same_bits_with_ll_off_and_no_landing_area() {
    let specs: Vec<(Collective, usize)> = [DType::BF16, DType::F16, DType::F32, DType::F64]
        .iter()
        .flat_map(|&dtype| {
            [
                (Collective::AllReduce { dtype, op: RedOp::Sum }, 5000),
                (Collective::ReduceScatter { dtype, op: RedOp::Sum }, 999),
            ]
        })
        .collect();
    let mut results = Vec::new();
    for mode in [LlMode::On, LlMode::Off] {
        let ctx = context(mode, 3, 20_000);
        let team = Team::create(&ctx, &devs(&ctx, &[0, 1, 2])).unwrap();
        assert_eq!(team.ll(), mode == LlMode::On);
        results.push((team.info().bytes_reserved, random_results(&team, &specs)));
        team.destroy().unwrap();
        assert_clean(&ctx);
    }
    assert_eq!(results[0].1, results[1].1, "LL and the other kernels agree bit for bit");
    assert!(
        results[0].0 >= results[1].0 + ll_bytes(3) as u64,
        "reserved {} with LL, {} without",
        results[0].0,
        results[1].0
    );
}

/// Runs `specs` in place on random float inputs (the same on every call of this function) and
/// returns every rank's bytes.
fn random_results(team: &Arc<Team>, specs: &[(Collective, usize)]) -> Vec<Vec<u8>> {
    let n = team.size();
    let mut out = Vec::new();
    for (k, &(c, count)) in specs.iter().enumerate() {
        let (Collective::AllReduce { dtype, .. } | Collective::ReduceScatter { dtype, .. }) = c else { unreachable!() };
        let elems = if matches!(c, Collective::ReduceScatter { .. }) { n * count } else { count };
        let buf = Buffer::alloc(team, elems * dtype.size()).unwrap();
        for r in 0..n {
            // Scattered values with long mantissas (their sums round).
            let x = |i: usize| ((k * 7919 + r * 104_729 + i * 15_485_863) % 20_011) as f64 / 997.0 - 10.0;
            let bytes: Vec<u8> = (0..elems).flat_map(|i| encode(dtype, x(i))).collect();
            buf.write(r as i32, 0, &bytes).unwrap();
        }
        let s = rank_streams(team);
        for (r, &stream) in s.iter().enumerate() {
            run(&buf, r as i32, 0, count, c, stream).unwrap();
        }
        for (r, &stream) in s.iter().enumerate() {
            synchronize(team, r as i32, stream).unwrap();
            let mut bytes = vec![0u8; elems * dtype.size()];
            buf.read(r as i32, 0, &mut bytes).unwrap();
            out.push(bytes);
        }
        drop_rank_streams(team, s);
        buf.free().unwrap();
    }
    out
}
