//! The pointer form's staged route on a real GPU: plain memory (`cuMemAlloc`, in no registered
//! buffer) with the LL kernels off, so every collective but the all-reduce of a small team goes
//! through the team's staging area. Its results leave the staging area through the copy-out
//! kernel (`mcast_copy_out`): right in one chunk and in several, and nothing written where the
//! ranks disagree. Skipped where there is no CUDA driver or device; multicast is forced off.

mod common;

use std::sync::Arc;

use common::*;
use mcast::driver::{DevicePtr, Driver, Stream};
use mcast::kernels::{Collective, DType, RedOp};
use mcast::runtime::collective::{run_ptr, synchronize};
use mcast::runtime::config::{Backend, Config, LlMode, MulticastMode};
use mcast::runtime::context::Context;
use mcast::runtime::team::Team;
use mcast::runtime::ErrorKind;

fn gpu_context() -> Option<Arc<Context>> {
    runtime_context_or_skip(Config {
        backend: Backend::Cuda,
        multicast: MulticastMode::Off,
        ll: LlMode::Off,
        ce_min_bytes: Some(0),
        timeout_ms: 20_000,
        ..Config::default()
    })
}

/// Two ranks: on two GPUs where there are two, else twice on one (each rank its own stream).
struct Pair {
    ctx: Arc<Context>,
    team: Arc<Team>,
    devices: [i32; 2],
    streams: [Stream; 2],
    mem: [DevicePtr; 2],
}

/// Bytes of each rank's memory: send at 0, recv at `RECV`.
const RECV: usize = 4 << 20;

impl Pair {
    fn new(ctx: &Arc<Context>) -> Pair {
        let devices = if ctx.device_count() >= 2 { [0, 1] } else { [0, 0] };
        let team = Team::create(ctx, &devices).unwrap();
        let d = ctx.driver();
        let streams = devices.map(|dev| d.stream_create(dev).unwrap());
        let mem = devices.map(|dev| d.mem_alloc(dev, 2 * RECV).unwrap());
        Pair { ctx: ctx.clone(), team, devices, streams, mem }
    }

    fn driver(&self) -> &Arc<dyn Driver> {
        self.ctx.driver()
    }

    fn write(&self, r: usize, at: usize, bytes: &[u8]) {
        self.driver().memcpy_htod(self.devices[r], self.mem[r] + at as u64, bytes).unwrap();
    }

    fn read(&self, r: usize, at: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.driver().memcpy_dtoh(self.devices[r], &mut v, self.mem[r] + at as u64).unwrap();
        v
    }

    /// Rank r's call of `c` with `count` (send at 0, recv at `RECV`), both ranks, then each
    /// rank's synchronize.
    fn run(&self, calls: [(Collective, usize); 2]) -> [Result<(), mcast::runtime::Error>; 2] {
        for (r, (c, count)) in calls.into_iter().enumerate() {
            let m = self.mem[r];
            run_ptr(&self.team, r as i32, m, m + RECV as u64, count, c, self.streams[r]).unwrap();
        }
        [0, 1].map(|r| synchronize(&self.team, r, self.streams[r as usize]))
    }

    fn destroy(self) {
        self.team.destroy().unwrap();
        for r in 0..2 {
            self.driver().stream_destroy(self.devices[r], self.streams[r]).unwrap();
            self.driver().mem_free(self.devices[r], self.mem[r]).unwrap();
        }
    }
}

fn pattern(r: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| ((r * 31 + i * 7) % 251) as u8 | 1).collect()
}

/// All-gather, reduce-scatter and broadcast through the staging area, in one chunk and in
/// several (the staging area is 1 MiB per rank: all-gather and reduce-scatter chunks of 512
/// KiB on two ranks), each byte checked.
#[test]
fn gpu_staged_results_are_right() {
    let Some(ctx) = gpu_context() else { return };
    let p = Pair::new(&ctx);
    for bytes in [1001usize, 1_400_000] {
        // All-gather: rank q's block lands at q * bytes of every rank's recv.
        for r in 0..2 {
            p.write(r, 0, &pattern(r, bytes));
        }
        let res = p.run([(Collective::AllGather, bytes); 2]);
        assert!(res.iter().all(Result::is_ok), "all-gather of {bytes}: {res:?}");
        for r in 0..2 {
            let got = p.read(r, RECV, 2 * bytes);
            for q in 0..2 {
                assert!(
                    got[q * bytes..(q + 1) * bytes] == pattern(q, bytes)[..],
                    "all-gather {bytes}: rank {r}, block {q}"
                );
            }
        }
        // Broadcast from rank 1.
        let res = p.run([(Collective::Broadcast { root: 1 }, bytes); 2]);
        assert!(res.iter().all(Result::is_ok), "broadcast of {bytes}: {res:?}");
        for r in 0..2 {
            assert!(p.read(r, RECV, bytes) == pattern(1, bytes), "broadcast {bytes}: rank {r}");
        }
        // Reduce-scatter of i32 sums: rank r gets block r of the element-wise sum.
        let count = bytes / 4;
        let input = |r: usize| -> Vec<i32> { (0..2 * count).map(|i| (r * 1000 + i % 977) as i32).collect() };
        for r in 0..2 {
            let b: Vec<u8> = input(r).iter().flat_map(|v| v.to_ne_bytes()).collect();
            p.write(r, 0, &b);
        }
        let rs = Collective::ReduceScatter { dtype: DType::I32, op: RedOp::Sum };
        let res = p.run([(rs, count); 2]);
        assert!(res.iter().all(Result::is_ok), "reduce-scatter of {count}: {res:?}");
        let (a, b) = (input(0), input(1));
        for r in 0..2 {
            let got = p.read(r, RECV, count * 4);
            for i in 0..count {
                let v = i32::from_ne_bytes(got[4 * i..4 * i + 4].try_into().unwrap());
                assert_eq!(v, a[r * count + i] + b[r * count + i], "reduce-scatter {count}: rank {r}, element {i}");
            }
        }
    }
    p.destroy();
    assert_clean(&ctx);
}

/// Ranks that disagree on an all-gather's count: both fail naming it, and neither rank's recv
/// changes (the copy-out kernel writes nothing after the mismatch).
#[test]
fn gpu_staged_mismatch_writes_nothing() {
    let Some(ctx) = gpu_context() else { return };
    let p = Pair::new(&ctx);
    for r in 0..2 {
        p.write(r, 0, &pattern(r, 2 * RECV));
    }
    let res = p.run([(Collective::AllGather, 8192), (Collective::AllGather, 4096)]);
    for (r, e) in res.iter().enumerate() {
        let e = e.as_ref().expect_err("a mismatch");
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "rank {r}: {e}");
        assert!(e.message.contains("count: rank 0 has 8192, rank 1 has 4096"), "rank {r}: {e}");
    }
    for r in 0..2 {
        assert!(p.read(r, 0, 2 * RECV) == pattern(r, 2 * RECV), "rank {r}'s memory was written");
    }
    p.destroy();
    assert_clean(&ctx);
}
