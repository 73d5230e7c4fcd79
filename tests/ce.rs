//! The copy-engine forms of all-gather, broadcast and all-reduce on the P2P transport
//! (`runtime::ce`, `MCAST_CE_MIN_BYTES`), on the simulator: against a host reference for odd
//! sizes, in and out of place, teams of 1, 2, 3 and 8; back to back with the SM kernels on the
//! same buffer; captured in CUDA graphs and replayed; and a peer that never comes, an abort and a
//! failed copy, each ending with no wait left hanging and nothing leaked.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use mcast::driver::{CuResult, Device};
use mcast::kernels::{Collective, DType, RedOp};
use mcast::runtime::buffer::Buffer;
use mcast::runtime::ce;
use mcast::runtime::collective::{run, run_into, synchronize};
use mcast::runtime::config::Config;
use mcast::runtime::context::Context;
use mcast::runtime::team::{Team, Transport};
use mcast::runtime::ErrorKind;

/// A P2P simulator of 8 GPUs whose copy-engine threshold is `ce_min_bytes`.
fn context(ce_min_bytes: u64, timeout_ms: u32) -> Arc<Context> {
    runtime_context(Config { ce_min_bytes: Some(ce_min_bytes), ..sim_runtime(false, 8, timeout_ms) })
}

fn team(ctx: &Arc<Context>, n: usize) -> Arc<Team> {
    let devices: Vec<Device> = (0..n as Device).collect();
    let t = Team::create(ctx, &devices).unwrap();
    assert_eq!(t.transport(), Transport::P2P);
    t
}

fn copies(ctx: &Context) -> u64 {
    sim(ctx).call_count("cuMemcpyDtoDAsync")
}

/// Deterministic bytes for rank `r`.
fn bytes_of(seed: u64, r: usize, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (r as u64 + 1);
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) as u8
        })
        .collect()
}

fn read(buf: &Buffer, r: usize) -> Vec<u8> {
    let mut out = vec![0u8; buf.size()];
    buf.read(r as i32, 0, &mut out).unwrap();
    out
}

/// Element `i` of an all-reduce input of rank `r`: small integers, so every dtype sums exactly.
fn elem(dtype: DType, r: usize, i: usize) -> Vec<u8> {
    let v = ((i * 7 + r * 3) % 11) as i64 - 5;
    match dtype {
        DType::I32 => (v as i32).to_ne_bytes().to_vec(),
        DType::F32 => (v as f32).to_ne_bytes().to_vec(),
        DType::BF16 => half::bf16::from_f32(v as f32).to_bits().to_ne_bytes().to_vec(),
        DType::F64 => (v as f64).to_ne_bytes().to_vec(),
        _ => unreachable!(),
    }
}

fn decode(dtype: DType, b: &[u8]) -> f64 {
    match dtype {
        DType::I32 => i32::from_ne_bytes(b.try_into().unwrap()) as f64,
        DType::F32 => f32::from_ne_bytes(b.try_into().unwrap()) as f64,
        DType::BF16 => half::bf16::from_bits(u16::from_ne_bytes(b.try_into().unwrap())).to_f64(),
        DType::F64 => f64::from_ne_bytes(b.try_into().unwrap()),
        _ => unreachable!(),
    }
}

/// Where a case reads and writes.
#[derive(Clone, Copy, Debug)]
enum Place {
    InPlace,
    /// Out of place, recv a second buffer.
    OtherBuffer,
}

/// Runs `collective` with `count` at byte `offset` on every rank (in place or into a second
/// buffer) and checks every rank's result and that nothing outside the range changed.
fn check(ctx: &Arc<Context>, t: &Arc<Team>, collective: Collective, count: usize, offset: usize, place: Place) {
    let n = t.size();
    let (esize, send_blocks, recv_blocks) = match collective {
        Collective::AllGather => (1, if matches!(place, Place::InPlace) { n } else { 1 }, n),
        Collective::Broadcast { .. } => (1, 1, 1),
        Collective::AllReduce { dtype, .. } => (dtype.size(), 1, 1),
        Collective::ReduceScatter { .. } => unreachable!(),
    };
    let send_len = count * esize * send_blocks;
    let recv_len = count * esize * recv_blocks;
    let size = offset + send_len.max(recv_len) + 40;
    let send = Buffer::alloc(t, size).unwrap();
    let recv = match place {
        Place::InPlace => None,
        Place::OtherBuffer => Some(Buffer::alloc(t, size).unwrap()),
    };
    let mut before = vec![];
    for r in 0..n {
        let mut b = bytes_of(count as u64 + offset as u64, r, size);
        if let Collective::AllReduce { dtype, .. } = collective {
            for i in 0..count {
                b[offset + i * esize..offset + (i + 1) * esize].copy_from_slice(&elem(dtype, r, i));
            }
        }
        send.write(r as i32, 0, &b).unwrap();
        if let Some(recv) = &recv {
            recv.write(r as i32, 0, &bytes_of(99, r, size)).unwrap();
        }
        before.push(b);
    }
    let streams = rank_streams(t);
    let copies_before = copies(ctx);
    for (r, &s) in streams.iter().enumerate() {
        match &recv {
            None => run(&send, r as i32, offset, count, collective, s).unwrap(),
            Some(recv) => run_into(&send, offset, recv, offset, r as i32, count, collective, s).unwrap(),
        }
    }
    for (r, &s) in streams.iter().enumerate() {
        synchronize(t, r as i32, s).unwrap();
    }
    let what = format!("{collective:?} count {count} offset {offset} {place:?} team of {n}");
    assert!(ce::wanted(t, collective, count), "{what}: the copy-engine form runs");
    if n > 1 {
        assert!(copies(ctx) > copies_before, "{what}: copies were made");
    }
    for r in 0..n {
        let got = read(recv.as_ref().unwrap_or(&send), r);
        let old = match &recv {
            None => before[r].clone(),
            Some(_) => bytes_of(99, r, size),
        };
        let range = offset..offset + recv_len;
        assert_eq!(got[..offset], old[..offset], "{what}: rank {r} wrote before its range");
        assert_eq!(got[range.end..], old[range.end..], "{what}: rank {r} wrote past its range");
        match collective {
            Collective::AllGather => {
                for q in 0..n {
                    let src = match place {
                        Place::InPlace => offset + q * count,
                        Place::OtherBuffer => offset,
                    };
                    assert_eq!(
                        got[offset + q * count..offset + (q + 1) * count],
                        before[q][src..src + count],
                        "{what}: rank {r} block {q}"
                    );
                }
            }
            Collective::Broadcast { root } => {
                assert_eq!(got[range.clone()], before[root as usize][range.clone()], "{what}: rank {r}");
            }
            Collective::AllReduce { dtype, op } => {
                for i in 0..count {
                    let xs: Vec<f64> = (0..n)
                        .map(|q| decode(dtype, &before[q][offset + i * esize..offset + (i + 1) * esize]))
                        .collect();
                    let want = match op {
                        RedOp::Sum => xs.iter().sum(),
                        RedOp::Min => xs.iter().copied().fold(f64::INFINITY, f64::min),
                        RedOp::Max => xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    };
                    let g = decode(dtype, &got[offset + i * esize..offset + (i + 1) * esize]);
                    assert_eq!(g, want, "{what}: rank {r} element {i}");
                }
            }
            Collective::ReduceScatter { .. } => unreachable!(),
        }
    }
    drop_rank_streams(t, streams);
    send.free().unwrap();
    if let Some(recv) = recv {
        recv.free().unwrap();
    }
}

fn sweep(teams: &[usize]) {
    // Threshold 1 byte: every size takes the copy-engine form.
    let ctx = context(1, 20_000);
    for &n in teams {
        let t = team(&ctx, n);
        for (i, count) in [1usize, 37, 4097, 65_537, 300_003].into_iter().enumerate() {
            let offset = [0, 3, 16, 5, 0][i];
            for place in [Place::InPlace, Place::OtherBuffer] {
                check(&ctx, &t, Collective::AllGather, count, offset, place);
                check(&ctx, &t, Collective::Broadcast { root: (i % n) as u32 }, count, offset, place);
            }
        }
        // All-reduce: at least one 16-byte unit per rank; odd counts leave a tail for the kernel.
        for (dtype, op) in
            [(DType::I32, RedOp::Sum), (DType::BF16, RedOp::Sum), (DType::F32, RedOp::Max), (DType::F64, RedOp::Min)]
        {
            let unit = 16 / dtype.size();
            for (i, count) in [n * unit, n * unit + 1, 4099 * n + 3, 100_001].into_iter().enumerate() {
                let offset = [0, dtype.size().max(4), 16, 4 * dtype.size().max(4)][i];
                for place in [Place::InPlace, Place::OtherBuffer] {
                    check(&ctx, &t, Collective::AllReduce { dtype, op }, count, offset, place);
                }
            }
            assert!(!ce::wanted(&t, Collective::AllReduce { dtype, op }, n * unit - 1), "less than a unit per rank");
        }
        t.destroy().unwrap();
    }
    assert_clean(&ctx);
}

#[test]
fn copy_engine_forms_teams_of_1_2_3() {
    sweep(&[1, 2, 3]);
}

#[test]
fn copy_engine_forms_team_of_8() {
    sweep(&[8]);
}

#[test]
fn threshold_and_transport_choose_the_route() {
    let ctx = context(1 << 20, 20_000);
    let t = team(&ctx, 2);
    assert!(!ce::wanted(&t, Collective::AllGather, (1 << 19) - 1), "all-gather counts the gathered bytes");
    assert!(ce::wanted(&t, Collective::AllGather, 1 << 19));
    assert!(!ce::wanted(&t, Collective::Broadcast { root: 0 }, (1 << 20) - 1));
    assert!(ce::wanted(&t, Collective::Broadcast { root: 1 }, 1 << 20));
    assert!(ce::wanted(&t, Collective::AllReduce { dtype: DType::BF16, op: RedOp::Sum }, 1 << 19));
    assert!(!ce::wanted(&t, Collective::ReduceScatter { dtype: DType::BF16, op: RedOp::Sum }, 1 << 30));
    t.destroy().unwrap();
    assert_clean(&ctx);
    // 0 turns the copy engines off; multicast teams never use them.
    let off = context(0, 20_000);
    let t = team(&off, 2);
    assert!(!ce::wanted(&t, Collective::AllGather, 1 << 30));
    t.destroy().unwrap();
    assert_clean(&off);
    let mc = runtime_context(Config { ce_min_bytes: Some(1), ..sim_runtime(true, 2, 20_000) });
    let t = Team::create(&mc, &[0, 1]).unwrap();
    assert_eq!(t.transport(), Transport::Multicast);
    assert!(!ce::wanted(&t, Collective::AllGather, 1 << 20));
    t.destroy().unwrap();
    assert_clean(&mc);
}

fn i32s(buf: &Buffer, r: usize, at: usize, count: usize) -> Vec<i32> {
    let mut b = vec![0u8; count * 4];
    buf.read(r as i32, at, &mut b).unwrap();
    b.chunks_exact(4).map(|c| i32::from_ne_bytes(c.try_into().unwrap())).collect()
}

/// SM and copy-engine forms interleaved on one buffer with no synchronisation between them
/// (threshold 64 KiB): each reads what the one before wrote, so a copy that overtook a kernel,
/// or a barrier count the two forms disagreed on, shows as a wrong value or a timeout.
#[test]
fn back_to_back_with_the_kernels_on_the_same_buffer() {
    let ctx = context(64 << 10, 20_000);
    for n in [2usize, 3] {
        let t = team(&ctx, n);
        let big = 40_000usize; // i32 elements: 160 KB, over the threshold
        let small = 1000usize; // under it
        let buf = Buffer::alloc(&t, big * 4 * n).unwrap();
        let input = |r: usize, i: usize| ((i % 13) as i32 - 6) * (r as i32 + 1);
        for r in 0..n {
            let b: Vec<u8> = (0..big).flat_map(|i| input(r, i).to_ne_bytes()).collect();
            buf.write(r as i32, 0, &b).unwrap();
        }
        let ar = Collective::AllReduce { dtype: DType::I32, op: RedOp::Sum };
        let streams = rank_streams(&t);
        let before = copies(&ctx);
        for (r, &s) in streams.iter().enumerate() {
            let r = r as i32;
            run(&buf, r, 0, big, ar, s).unwrap(); // CE: S
            run(&buf, r, 0, small, ar, s).unwrap(); // kernel: prefix n*S
            run(&buf, r, 0, big, ar, s).unwrap(); // CE: prefix n*n*S, rest n*S
                                                  // All-gather of each rank's block of the result (CE, 160 KB gathered), then a
                                                  // small one (kernel) of the first 64 bytes per block.
            run(&buf, r, 0, big * 4 / n / 16 * 16, Collective::AllGather, s).unwrap();
            run(&buf, r, 0, 64, Collective::AllGather, s).unwrap();
            // Broadcast from the last rank: CE.
            run(&buf, r, 0, big * 4, Collective::Broadcast { root: n as u32 - 1 }, s).unwrap();
        }
        for (r, &s) in streams.iter().enumerate() {
            synchronize(&t, r as i32, s).unwrap();
        }
        assert!(copies(&ctx) > before);
        let total = |i: usize| (0..n).map(|r| input(r, i)).sum::<i32>();
        let n32 = n as i32;
        let want: Vec<i32> = (0..big).map(|i| if i < small { n32 * n32 * total(i) } else { n32 * total(i) }).collect();
        for r in 0..n {
            assert_eq!(i32s(&buf, r, 0, big), want, "rank {r} of {n}");
        }
        drop_rank_streams(&t, streams);
        buf.free().unwrap();
        t.destroy().unwrap();
    }
    assert_clean(&ctx);
}

/// The copy-engine forms captured in CUDA graphs on the simulator (memcpy nodes between the
/// barrier kernels) and replayed: k in-place all-reduces leave n^(k-1) * sum.
#[test]
fn captured_in_graphs_and_replayed() {
    let ctx = context(1, 20_000);
    let driver = ctx.driver().clone();
    let n = 3;
    let t = team(&ctx, n);
    let count = 10_001usize;
    let buf = Buffer::alloc(&t, count * 4).unwrap();
    let gather = Buffer::alloc(&t, 3 * 4096).unwrap();
    let input = |r: usize, i: usize| ((i % 5) as i32 - 2) * (r as i32 + 1);
    for r in 0..n {
        let b: Vec<u8> = (0..count).flat_map(|i| input(r, i).to_ne_bytes()).collect();
        buf.write(r as i32, 0, &b).unwrap();
        gather.write(r as i32, 0, &bytes_of(7, r, 3 * 4096)).unwrap();
    }
    let ar = Collective::AllReduce { dtype: DType::I32, op: RedOp::Sum };
    let before = copies(&ctx);
    let graphs = RankGraphs::capture(&driver, t.devices(), |r, s| {
        run(&buf, r as i32, 0, count, ar, s).unwrap();
        run(&gather, r as i32, 0, 4096, Collective::AllGather, s).unwrap();
    });
    let captured = copies(&ctx) - before;
    assert!(captured > 0, "the copies were recorded");
    for (r, &s) in graphs.streams.iter().enumerate() {
        driver.stream_synchronize(t.devices()[r], s).unwrap();
        let want: Vec<i32> = (0..count).map(|i| input(r, i)).collect();
        assert_eq!(i32s(&buf, r, 0, count), want, "rank {r}: nothing ran during the capture");
    }
    let replays = 3u32;
    graphs.replay(&driver, replays);
    for (r, &s) in graphs.streams.iter().enumerate() {
        synchronize(&t, r as i32, s).unwrap();
    }
    assert_eq!(copies(&ctx) - before, captured, "replays enqueue nothing new on the host");
    let factor = (n as i32).pow(replays - 1);
    let want: Vec<i32> = (0..count).map(|i| factor * (0..n).map(|r| input(r, i)).sum::<i32>()).collect();
    for r in 0..n {
        assert_eq!(i32s(&buf, r, 0, count), want, "rank {r} after {replays} replays");
        let got = read(&gather, r);
        for q in 0..n {
            assert_eq!(
                got[q * 4096..(q + 1) * 4096],
                bytes_of(7, q, 3 * 4096)[q * 4096..(q + 1) * 4096],
                "rank {r} block {q}"
            );
        }
    }
    graphs.destroy(&driver);
    buf.free().unwrap();
    gather.free().unwrap();
    t.destroy().unwrap();
    assert_clean(&ctx);
}

/// Only rank 0 calls: its entry barrier waits for a peer that never comes, times out (bounded),
/// and the team reports TIMEOUT; teardown leaks nothing.
#[test]
fn a_peer_that_never_comes_times_out() {
    let ctx = context(1, 300);
    let t = team(&ctx, 2);
    let buf = Buffer::alloc(&t, 1 << 16).unwrap();
    let s = rank_streams(&t);
    for collective in [Collective::AllGather, Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum }] {
        assert!(ce::wanted(&t, collective, 4096));
    }
    run(&buf, 0, 0, 4096, Collective::AllGather, s[0]).unwrap();
    let started = Instant::now();
    let e = synchronize(&t, 0, s[0]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
    assert!(started.elapsed() < Duration::from_secs(10));
    drop_rank_streams(&t, s);
    buf.free().unwrap();
    t.destroy().unwrap();
    assert_clean(&ctx);
}

/// An abort ends a copy-engine collective's barrier wait (timeout off: only the abort can).
#[test]
fn an_abort_ends_the_wait() {
    let ctx = context(1, 0);
    let t = team(&ctx, 2);
    let buf = Buffer::alloc(&t, 1 << 16).unwrap();
    let s = rank_streams(&t);
    let ar = Collective::AllReduce { dtype: DType::I32, op: RedOp::Sum };
    run(&buf, 0, 0, 8192, ar, s[0]).unwrap();
    let t2 = t.clone();
    let aborter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        t2.abort();
    });
    let started = Instant::now();
    let e = synchronize(&t, 0, s[0]).unwrap_err();
    aborter.join().unwrap();
    assert_eq!(e.kind, ErrorKind::Aborted, "{e}");
    assert!(started.elapsed() < Duration::from_secs(10));
    drop_rank_streams(&t, s);
    // An aborted team refuses frees; destroying it releases its buffers.
    assert_eq!(buf.free().unwrap_err().kind, ErrorKind::Aborted);
    t.destroy().unwrap();
    assert_clean(&ctx);
}

/// A copy that fails to enqueue: the call returns DRIVER naming the copy, the exit barrier is
/// still enqueued, so the peers' collectives complete instead of waiting for this rank.
#[test]
fn a_failed_copy_leaves_no_peer_waiting() {
    let ctx = context(1, 0);
    let t = team(&ctx, 3);
    let buf = Buffer::alloc(&t, 3 << 16).unwrap();
    let s = rank_streams(&t);
    // Rank 0 goes first: its first peer copy fails.
    sim(&ctx).inject("cuMemcpyDtoDAsync", CuResult::ERROR_INVALID_VALUE, 1, Some(1));
    let e = run(&buf, 0, 0, 1 << 16, Collective::AllGather, s[0]).unwrap_err();
    sim(&ctx).clear_faults();
    assert_eq!(e.kind, ErrorKind::Driver, "{e}");
    assert!(e.message.contains("copy engine") && e.message.contains("cuMemcpyDtoDAsync"), "{e}");
    for r in 1..3 {
        run(&buf, r, 0, 1 << 16, Collective::AllGather, s[r as usize]).unwrap();
    }
    for (r, &st) in s.iter().enumerate() {
        synchronize(&t, r as i32, st).unwrap();
    }
    drop_rank_streams(&t, s);
    buf.free().unwrap();
    t.destroy().unwrap();
    assert_clean(&ctx);
}
