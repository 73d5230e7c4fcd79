//! Collectives captured in CUDA graphs on the simulator: a capture records each rank's launches
//! without running them, and every replay of the instantiated graphs runs them again, in order,
//! with the barriers' epochs advanced on the device (so replays stay correct). Both transports.

mod common;

use common::*;
use mcast::driver::Device;
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
