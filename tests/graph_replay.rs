//! Collectives captured in CUDA graphs on the simulator: a capture records each rank's launches
//! without running them, and every replay of the instantiated graphs runs them again, in order,
//! with the barriers' epochs advanced on the device (so replays stay correct). Both transports.

mod common;

use common::*;
use std::sync::Arc;

use mcast::driver::{CaptureMode, Device};
use mcast::kernels::{Collective, DType, RedOp};
use mcast::runtime::buffer::Buffer;
use mcast::runtime::collective::{run, synchronize};
use mcast::runtime::team::{Team, Transport};

const COUNT: usize = 1000;

fn read_i32(buf: &Buffer, rank: i32) -> Vec<i32> {
    let mut bytes = vec![0u8; COUNT * 4];
    buf.read(rank, 0, &mut bytes).unwrap();
    bytes.chunks_exact(4).map(|c| i32::from_ne_bytes(c.try_into().unwrap())).collect()
}

/// `n` ranks, each all-reduce captured `per_graph` times, the graphs replayed `replays` times:
/// after k in-place sum all-reduces of inputs x_r, every rank holds n^(k-1) * sum_r x_r.
fn replayed_all_reduces(multicast: bool, n: usize, per_graph: u32, replays: u32) {
    let ctx = runtime_context(sim_runtime(multicast, 4, 20_000));
    let driver = ctx.driver().clone();
    let devices: Vec<Device> = (0..n as Device).collect();
    let team = Team::create(&ctx, &devices).unwrap();
    let want = if multicast { Transport::Multicast } else { Transport::P2P };
    assert_eq!(team.transport(), want);
    let buf = Buffer::alloc(&team, COUNT * 4).unwrap();
    let input = |r: usize, j: usize| ((j % 7) as i32 - 3) * (r as i32 + 1);
    for r in 0..n {
        let bytes: Vec<u8> = (0..COUNT).flat_map(|j| input(r, j).to_ne_bytes()).collect();
        buf.write(r as i32, 0, &bytes).unwrap();
    }
    let collective = Collective::AllReduce { dtype: DType::I32, op: RedOp::Sum };
    let graphs = RankGraphs::capture(&driver, &devices, |r, stream| {
        for _ in 0..per_graph {
            run(&buf, r as i32, 0, COUNT, collective, stream).unwrap();
        }
    });
    for (r, (&dev, &stream)) in devices.iter().zip(&graphs.streams).enumerate() {
        driver.stream_synchronize(dev, stream).unwrap();
        let expect: Vec<i32> = (0..COUNT).map(|j| input(r, j)).collect();
        assert_eq!(read_i32(&buf, r as i32), expect, "rank {r}: a captured launch ran");
    }
    graphs.replay(&driver, replays);
    for (r, &stream) in graphs.streams.iter().enumerate() {
        synchronize(&team, r as i32, stream).unwrap();
    }
    let k = per_graph * replays;
    let factor = (n as i32).pow(k - 1);
    let expect: Vec<i32> = (0..COUNT).map(|j| factor * (0..n).map(|r| input(r, j)).sum::<i32>()).collect();
    for r in 0..n {
        assert_eq!(read_i32(&buf, r as i32), expect, "rank {r} after {k} replayed all-reduces");
    }
    graphs.destroy(&driver);
    buf.free().unwrap();
    team.destroy().unwrap();
    assert_clean(&ctx);
}

#[test]
fn p2p_all_reduces_replayed_from_graphs() {
    replayed_all_reduces(false, 3, 2, 3);
}

#[test]
fn multicast_all_reduces_replayed_from_graphs() {
    replayed_all_reduces(true, 2, 3, 4);
}

/// A thread polls `mcast_team_get_error` (`Team::async_error`) without pause while this thread
/// captures every rank's all-reduces in global mode (PyTorch's default, where a potentially
/// unsafe CUDA call of any thread invalidates the capture): the captures survive, the replays
/// are right, and the poller saw no error. Then a team that fails on the device (a mismatch)
/// is seen by the poller, with the reason.
fn captured_beside_a_poller(multicast: bool, n: usize) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let ctx = runtime_context(sim_runtime(multicast, n as u32, 20_000));
    let driver = ctx.driver().clone();
    let devices: Vec<Device> = (0..n as Device).collect();
    let team = Team::create(&ctx, &devices).unwrap();
    let buf = Buffer::alloc(&team, COUNT * 4).unwrap();
    let collective = Collective::AllReduce { dtype: DType::I32, op: RedOp::Sum };
    load_modules(&team, &[collective]);
    let (stop, polls) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let poller = {
        let (team, stop, polls) = (team.clone(), stop.clone(), polls.clone());
        std::thread::spawn(move || {
            let mut seen = None;
            while !stop.load(Ordering::Acquire) && seen.is_none() {
                seen = team.async_error();
                polls.fetch_add(1, Ordering::AcqRel);
            }
            seen
        })
    };
    let wait_for_polls = || {
        let start = polls.load(Ordering::Acquire);
        while polls.load(Ordering::Acquire) < start + 2 {
            std::thread::yield_now();
        }
    };
    let graphs = RankGraphs::capture_in(&driver, &devices, CaptureMode::Global, |r, stream| {
        wait_for_polls();
        run(&buf, r as i32, 0, COUNT, collective, stream).unwrap();
        wait_for_polls();
    });
    for r in 0..n {
        buf.write(r as i32, 0, &vec![1u8; COUNT * 4]).unwrap();
    }
    graphs.replay(&driver, 3);
    for (r, &stream) in graphs.streams.iter().enumerate() {
        synchronize(&team, r as i32, stream).unwrap();
    }
    let one = i32::from_ne_bytes([1; 4]);
    for r in 0..n {
        assert!(read_i32(&buf, r as i32).iter().all(|&x| x == one.wrapping_mul((n as i32).pow(3))), "rank {r}");
    }
    stop.store(true, Ordering::Release);
    assert_eq!(poller.join().unwrap(), None, "the poller saw an error");
    graphs.destroy(&driver);

    // The poller still sees device errors: rank 0 all-reduces fewer elements than the others.
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (team, stop) = (team.clone(), stop.clone());
        std::thread::spawn(move || loop {
            if let Some(kind) = team.async_error() {
                return Some(kind);
            }
            if stop.load(Ordering::Acquire) {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        })
    };
    let streams = rank_streams(&team);
    for (r, &stream) in streams.iter().enumerate() {
        let count = if r == 0 { COUNT - 1 } else { COUNT };
        // The ranks launched first may already have met the mismatch and failed the team:
        // a later rank's call is then refused with the same error instead of launching.
        if let Err(e) = run(&buf, r as i32, 0, count, collective, stream) {
            assert!(r > 0, "rank 0 launches first, before any mismatch: {}", e.message);
            assert_eq!(e.kind, mcast::runtime::error::ErrorKind::InvalidArgument, "rank {r}: {}", e.message);
            assert!(e.message.contains("count"), "rank {r}'s refusal names the field: {}", e.message);
        }
    }
    let seen = poller.join().unwrap();
    assert_eq!(seen, Some(mcast::runtime::error::ErrorKind::InvalidArgument));
    let e = team.error().unwrap();
    assert!(e.message.contains("count"), "the reason names the field: {}", e.message);
    for (r, &stream) in streams.iter().enumerate() {
        let _ = synchronize(&team, r as i32, stream);
        driver.stream_destroy(devices[r], stream).unwrap();
    }
    stop.store(true, Ordering::Release);
    buf.free().unwrap();
    team.destroy().unwrap();
    assert_clean(&ctx);
}

#[test]
fn p2p_captured_in_global_mode_beside_a_poller() {
    captured_beside_a_poller(false, 4);
}

#[test]
fn multicast_captured_in_global_mode_beside_a_poller() {
    captured_beside_a_poller(true, 2);
}

/// A graph replayed on some ranks only (the application's bug) is named, not hung on: rank
/// n - 1 skips the last replay and calls an all-gather next, which meets the others' replayed
/// all-reduce: every rank reports `INVALID_ARGUMENT` naming the two calls and a rank.
#[test]
fn a_graph_replayed_on_some_ranks_only_is_named() {
    let n = 3;
    let ctx = runtime_context(sim_runtime(false, n as u32, 20_000));
    let driver = ctx.driver().clone();
    let devices: Vec<Device> = (0..n as Device).collect();
    let team = Team::create(&ctx, &devices).unwrap();
    let buf = Buffer::alloc(&team, COUNT * 4 * n).unwrap();
    let all_reduce = Collective::AllReduce { dtype: DType::I32, op: RedOp::Sum };
    load_modules(&team, &[all_reduce, Collective::AllGather]);
    let graphs = RankGraphs::capture(&driver, &devices, |r, stream| {
        run(&buf, r as i32, 0, COUNT, all_reduce, stream).unwrap();
    });
    graphs.replay(&driver, 2);
    for (r, (&dev, &stream)) in graphs.devices.iter().zip(&graphs.streams).enumerate() {
        if r + 1 < n {
            let exec = graphs.exec(r);
            driver.graph_launch(dev, exec, stream).unwrap();
        }
    }
    for (r, &stream) in graphs.streams.iter().enumerate() {
        run(&buf, r as i32, 0, COUNT * 4, Collective::AllGather, stream).unwrap();
    }
    for (r, &stream) in graphs.streams.iter().enumerate() {
        let e = synchronize(&team, r as i32, stream).unwrap_err();
        assert_eq!(e.kind, mcast::runtime::error::ErrorKind::InvalidArgument, "rank {r}: {}", e.message);
        let m = &e.message;
        assert!(m.contains("all-reduce") && m.contains("all-gather") && m.contains("rank"), "rank {r}: {m}");
    }
    graphs.destroy(&driver);
    buf.free().unwrap();
    team.destroy().unwrap();
    assert_clean(&ctx);
}
