//! Teams of more than two ranks: the kernel plan's choice table for 2 to 8 ranks (its shape: each
//! collective's algorithms in one order as sizes grow, the same choice on every rank, the
//! two-rank values as measured, the thresholds falling as the team grows, multicast only where
//! the cost model says it pays) and, on the simulator, the results of teams of 3, 4, 5 and 8
//! ranks over both transports at sizes on both sides of every threshold.

mod common;

use common::*;
use mcast::driver::Stream;
use mcast::kernels::abi::{
    broadcast_scatter_min_bytes, ll_max_payload, one_shot_max_bytes, plan, push_max_bytes, KernelKind, Plan,
    GRID_MAX_BLOCKS, LL_MAX_BYTES, LL_PART,
};
use mcast::kernels::{Collective, DType, Launch, Path, RankPtrs, RedOp};
use mcast::runtime::buffer::Buffer;
use mcast::runtime::collective::{run, synchronize};
use mcast::runtime::team::{Team, Transport};

const AR: Collective = Collective::AllReduce { dtype: DType::BF16, op: RedOp::Sum };
const RS: Collective = Collective::ReduceScatter { dtype: DType::BF16, op: RedOp::Sum };
const BC: Collective = Collective::Broadcast { root: 1 };
const AG: Collective = Collective::AllGather;

/// Rank `rank`'s launch of `collective` with `count` on a team of `n` (addresses symmetric and
/// 16-byte aligned; nothing runs).
fn launch(collective: Collective, path: Path, n: u32, rank: u32, count: u64, ll: bool) -> Launch {
    let at = |base: u64| -> RankPtrs { (0..n as u64).map(|r| base + (r << 28)).collect::<Vec<_>>().into() };
    let mc = path == Path::Multicast;
    Launch {
        collective,
        path,
        rank,
        nranks: n,
        dev: rank as i32,
        stream: Stream(0x100),
        data: at(0x10_0000_0000),
        data_mc: mc.then_some(0x90_0000_0000),
        out: RankPtrs::EMPTY,
        out_mc: None,
        sync: at(0x30_0000_0000),
        sync_mc: mc.then_some(0xb0_0000_0000),
        count,
        timeout_ns: 0,
        max_blocks: GRID_MAX_BLOCKS,
        local_only: false,
        ll,
        signature: None,
        out_stride: 0,
    }
}

/// The plan of every rank, asserted equal, for a message of `bytes` (the whole message, as
/// nccl-tests counts it).
fn agreed(collective: Collective, path: Path, n: u32, bytes: u64, ll: bool) -> Plan {
    let count = match collective {
        Collective::AllReduce { dtype, .. } => bytes / dtype.size() as u64,
        Collective::ReduceScatter { dtype, .. } => bytes / n as u64 / dtype.size() as u64,
        Collective::AllGather => bytes / n as u64,
        Collective::Broadcast { .. } => bytes,
    };
    let plans: Vec<Plan> =
        (0..n).map(|r| plan(&launch(collective, path, n, r, count.max(1), ll)).unwrap().unwrap()).collect();
    assert!(plans.iter().all(|p| *p == plans[0]), "{collective:?} {bytes} B on {n} ranks: the ranks disagree");
    plans[0]
}

/// Each collective's P2P kernels in the order the sizes must take them.
fn order(kind: KernelKind) -> u32 {
    use KernelKind::*;
    match kind {
        AllReduceLl | ReduceScatterLl | AllGatherLl | BroadcastLl => 0,
        AllReduceP2pPush | BroadcastP2p | ReduceScatterP2p | ReduceScatterP2pPush | AllGatherP2p | AllGatherP2pPush => {
            1
        }
        AllReduceP2p => 2,
        AllReduceP2pTwoShot | AllReduceP2pTwoShotPush | BroadcastP2pScatter => 3,
        other => panic!("{other:?} is not a P2P kernel"),
    }
}

fn sizes() -> impl Iterator<Item = u64> {
    (3..=30).map(|k| 1u64 << k).chain((3..=30).map(|k| 3u64 << (k - 1)))
}

#[test]
fn each_collective_takes_its_algorithms_in_one_order_as_sizes_grow() {
    for n in 2..=8u32 {
        for c in [AR, RS, AG, BC] {
            for ll in [false, true] {
                let mut all: Vec<u64> = sizes().filter(|b| b % (2 * n as u64) == 0).collect();
                all.sort_unstable();
                let mut last = 0;
                for b in all {
                    let p = agreed(c, Path::P2P, n, b, ll);
                    let o = order(p.kernel.kind);
                    assert!(
                        o >= last,
                        "{c:?} on {n} ranks (ll {ll}): {:?} at {b} B after a later algorithm",
                        p.kernel.kind
                    );
                    last = o;
                    assert!(p.blocks >= 1 && p.blocks <= GRID_MAX_BLOCKS);
                }
            }
        }
    }
}

#[test]
fn two_ranks_keep_their_measured_thresholds() {
    assert_eq!(one_shot_max_bytes(2), 1 << 20);
    assert_eq!(push_max_bytes(2), 4 << 20);
    assert_eq!(broadcast_scatter_min_bytes(2), None);
    for c in [AR, RS, AG, BC] {
        assert_eq!(ll_max_payload(c, 2), LL_MAX_BYTES, "{c:?}");
    }
    // Today's choices at two ranks: LL to 256 KiB of payload, push to 4 MiB, then the pushing
    // two-shot on 64 blocks; the reduce-scatter pushes past LL; the broadcast pulls from the root.
    let kind = |c, b, ll| agreed(c, Path::P2P, 2, b, ll).kernel.kind;
    assert_eq!(kind(AR, 256 << 10, true), KernelKind::AllReduceLl);
    assert_eq!(kind(AR, (256 << 10) + 2, true), KernelKind::AllReduceP2pPush);
    assert_eq!(kind(AR, 4 << 20, false), KernelKind::AllReduceP2pPush);
    assert_eq!(kind(AR, (4 << 20) + 16, false), KernelKind::AllReduceP2pTwoShotPush);
    assert_eq!(kind(RS, 512 << 10, true), KernelKind::ReduceScatterLl);
    assert_eq!(kind(RS, (512 << 10) + 32, true), KernelKind::ReduceScatterP2pPush);
    assert_eq!(kind(RS, 1 << 30, false), KernelKind::ReduceScatterP2pPush);
    assert_eq!(kind(BC, 1 << 30, false), KernelKind::BroadcastP2p);
    assert_eq!(kind(AG, 512 << 10, true), KernelKind::AllGatherLl);
    assert_eq!(kind(AG, (512 << 10) + 4, true), KernelKind::AllGatherP2pPush);
    for (b, blocks) in [(8u64 << 20, 64u32), (1 << 20, 32), (64 << 10, 2)] {
        assert_eq!(agreed(AG, Path::P2P, 2, b, false).blocks, blocks, "all-gather {b} B");
    }
    assert_eq!(agreed(AR, Path::P2P, 2, 64 << 20, false).blocks, 64);
}

#[test]
fn thresholds_fall_as_the_team_grows_near_the_modelled_values() {
    for n in 3..8u32 {
        assert!(one_shot_max_bytes(n + 1) <= one_shot_max_bytes(n), "one-shot at {n}");
        assert!(ll_max_payload(AR, n + 1) <= ll_max_payload(AR, n), "LL at {n}");
        assert!(broadcast_scatter_min_bytes(n + 1) <= broadcast_scatter_min_bytes(n), "broadcast at {n}");
    }
    assert!(one_shot_max_bytes(3) <= one_shot_max_bytes(2) + (64 << 10));
    // The model's switch points (shared/reference/n-gpu.md): LL to two-shot about 160 KB at 4
    // ranks and 60 KB at 8; one-shot to two-shot 384-512 KB at 4 and 128-256 KB at 8.
    let within = |v: u64, lo: u64, hi: u64| lo <= v && v <= hi;
    assert!(within(ll_max_payload(AR, 4), 128 << 10, 168 << 10), "{}", ll_max_payload(AR, 4));
    assert!(within(ll_max_payload(AR, 8), 48 << 10, 64 << 10), "{}", ll_max_payload(AR, 8));
    assert!(within(one_shot_max_bytes(4), 384 << 10, 512 << 10), "{}", one_shot_max_bytes(4));
    assert!(within(one_shot_max_bytes(8), 96 << 10, 256 << 10), "{}", one_shot_max_bytes(8));
    for n in 2..=8 {
        for c in [AR, RS, AG, BC] {
            assert_eq!(ll_max_payload(c, n) % LL_PART, 0);
        }
    }
    // The plan follows them: at 4 ranks a 256 KiB all-reduce is no longer LL but still one-shot
    // (push), 1 MiB is two-shot; a 512 KiB broadcast scatters, 320 KiB (past LL) pulls from the
    // root.
    let kind = |c, n, b| agreed(c, Path::P2P, n, b, true).kernel.kind;
    assert_eq!(kind(AR, 4, 256 << 10), KernelKind::AllReduceP2pPush);
    assert_eq!(kind(AR, 4, 128 << 10), KernelKind::AllReduceLl);
    assert_eq!(kind(AR, 4, 1 << 20), KernelKind::AllReduceP2pTwoShotPush);
    assert_eq!(kind(AR, 8, 96 << 10), KernelKind::AllReduceP2p);
    // Teams of up to four keep the push scratch: their reduce-scatter past LL and their
    // two-shot push; five and more pull.
    assert_eq!(kind(RS, 4, 4 << 20), KernelKind::ReduceScatterP2pPush);
    assert_eq!(kind(RS, 5, 5 << 20), KernelKind::ReduceScatterP2p);
    assert_eq!(kind(AR, 5, 1 << 20), KernelKind::AllReduceP2pTwoShot);
    assert_eq!(kind(AR, 8, 1 << 20), KernelKind::AllReduceP2pTwoShot);
    assert_eq!(kind(BC, 4, 1 << 20), KernelKind::BroadcastP2pScatter);
    assert_eq!(kind(BC, 4, 512 << 10), KernelKind::BroadcastP2pScatter);
    assert_eq!(kind(BC, 4, 320 << 10), KernelKind::BroadcastP2p);
    assert_eq!(kind(BC, 3, 1 << 30), KernelKind::BroadcastP2pScatter);
}

#[test]
fn multicast_runs_only_where_the_cost_model_says_it_pays() {
    let is_mc = |k: KernelKind| {
        matches!(
            k,
            KernelKind::AllReduceMc | KernelKind::ReduceScatterMc | KernelKind::AllGatherMc | KernelKind::BroadcastMc
        )
    };
    for c in [AR, RS, AG, BC] {
        for b in sizes().filter(|b| b % 16 == 0) {
            // Two ranks: never (bound 0.67 B against P2P's B); the model is named as the reason.
            for ll in [false, true] {
                let p = agreed(c, Path::Multicast, 2, b, ll);
                assert!(!is_mc(p.kernel.kind), "{c:?} {b} B on 2 ranks ran {:?}", p.kernel.kind);
                assert!(p.fallback.is_some());
                assert_eq!(p.kernel.kind, agreed(c, Path::P2P, 2, b, ll).kernel.kind, "{c:?} {b} B");
            }
            for n in [3u32, 4, 8] {
                if b % (16 * n as u64) != 0 {
                    continue;
                }
                // LL where it serves, multicast above it (and everywhere without LL).
                let p = agreed(c, Path::Multicast, n, b, true);
                let ll = agreed(c, Path::P2P, n, b, true).kernel.kind.is_ll();
                assert_eq!(p.kernel.kind.is_ll(), ll, "{c:?} {b} B on {n} ranks");
                assert_eq!(is_mc(p.kernel.kind), !ll, "{c:?} {b} B on {n} ranks: {:?}", p.kernel.kind);
                assert!(is_mc(agreed(c, Path::Multicast, n, b, false).kernel.kind));
            }
        }
    }
}

/// Element `i` of rank `r`'s input for case `k` (small integers: exact in bf16 sums of 8).
fn value(k: usize, r: usize, i: usize) -> f64 {
    ((k * 5 + r * 7 + i * 3) % 19) as f64 - 9.0
}

fn byte(k: usize, r: usize, j: usize) -> u8 {
    (k * 13 + r * 31 + j * 7 + 1) as u8
}

/// One collective of `bytes` (the whole message) in place on `team`, checked on every rank.
fn run_and_check(team: &std::sync::Arc<Team>, buf: &Buffer, k: usize, c: Collective, bytes: usize) {
    let n = team.size();
    let (count, extent) = match c {
        Collective::AllReduce { .. } => (bytes / 2, bytes),
        Collective::ReduceScatter { .. } => (bytes / n / 2, bytes / n / 2 * 2 * n),
        Collective::AllGather => (bytes / n, bytes / n * n),
        Collective::Broadcast { .. } => (bytes, bytes),
    };
    let input = |r: usize| -> Vec<u8> {
        match c {
            Collective::AllReduce { .. } | Collective::ReduceScatter { .. } => {
                (0..extent / 2).flat_map(|i| encode(DType::BF16, value(k, r, i))).collect()
            }
            _ => (0..extent).map(|j| byte(k, r, j)).collect(),
        }
    };
    for r in 0..n {
        buf.write(r as i32, 0, &input(r)).unwrap();
    }
    let streams = rank_streams(team);
    for (r, &s) in streams.iter().enumerate() {
        run(buf, r as i32, 0, count, c, s).unwrap();
    }
    for (r, &s) in streams.iter().enumerate() {
        synchronize(team, r as i32, s).unwrap_or_else(|e| panic!("{c:?} {bytes} B, rank {r} of {n}: {e}"));
    }
    drop_rank_streams(team, streams);
    let sum = |i: usize| encode(DType::BF16, (0..n).map(|q| value(k, q, i)).sum());
    for r in 0..n {
        let mut got = vec![0u8; extent];
        buf.read(r as i32, 0, &mut got).unwrap();
        let want: Vec<u8> = match c {
            Collective::AllReduce { .. } => (0..count).flat_map(sum).collect(),
            Collective::ReduceScatter { .. } => {
                let mut w = input(r);
                for i in r * count..(r + 1) * count {
                    w[2 * i..2 * i + 2].copy_from_slice(&sum(i));
                }
                w
            }
            Collective::AllGather => (0..extent).map(|j| byte(k, j / count, j)).collect(),
            Collective::Broadcast { root } => (0..extent).map(|j| byte(k, root as usize, j)).collect(),
        };
        assert!(got == want, "{c:?} {bytes} B: rank {r} of {n} differs");
    }
}

/// Sizes on both sides of every threshold of a team of `n` (and a broadcast of 9 MiB and more,
/// whose owners' slices end off the 16-byte grid; a two-shot all-reduce and a reduce-scatter
/// whose bytes for each destination take two steps of the push kernels' rows, the second
/// partial), multiples of 2n bytes.
fn threshold_sizes(n: usize) -> Vec<(Collective, usize)> {
    let q = 2 * n;
    let around = |t: u64| -> Vec<usize> {
        let t = t as usize / q * q;
        vec![t.saturating_sub(q).max(q), t, t + q]
    };
    let nn = n as u32;
    let mut v = vec![];
    for t in [ll_max_payload(AR, nn), one_shot_max_bytes(nn)] {
        v.extend(around(t).into_iter().map(|b| (AR, b)));
    }
    v.extend(around(ll_max_payload(RS, nn) * n as u64).into_iter().map(|b| (RS, b)));
    v.extend(around(ll_max_payload(AG, nn) * n as u64).into_iter().map(|b| (AG, b)));
    v.extend(around(ll_max_payload(BC, nn)).into_iter().map(|b| (BC, b)));
    v.extend(around(broadcast_scatter_min_bytes(nn).unwrap()).into_iter().map(|b| (BC, b)));
    v.extend([(BC, (9 << 20) + 3 * q), (AR, q), (RS, q), (AG, q), (BC, 7)]);
    v.extend([(AR, (2 << 20) * n + 3 * q), (RS, ((2 << 20) + 48) * n)]);
    v
}

#[test]
fn teams_of_3_4_5_and_8_are_right_across_every_threshold_on_both_transports() {
    for multicast in [false, true] {
        let ctx = runtime_context(sim_runtime(multicast, 8, 60_000));
        for n in [3usize, 4, 5, 8] {
            let devices: Vec<i32> = (0..n as i32).collect();
            let team = Team::create(&ctx, &devices).unwrap();
            assert_eq!(team.transport() == Transport::Multicast, multicast, "{n} ranks");
            let cases = threshold_sizes(n);
            let extent = cases.iter().map(|&(_, b)| b).max().unwrap() + 64;
            let buf = Buffer::alloc(&team, extent).unwrap();
            load_modules(&team, &[AR, RS, AG, BC]);
            for (k, &(c, b)) in cases.iter().enumerate() {
                run_and_check(&team, &buf, k, c, b);
            }
            buf.free().unwrap();
            team.destroy().unwrap();
        }
        assert_clean(&ctx);
    }
}
