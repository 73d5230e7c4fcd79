//! Collectives against a host reference, on the simulator's two transports (MULTICAST through
//! its address translation, and P2P) — or, with `MCAST_TEST_BACKEND=cuda`, on a real GPU over
//! P2P with every team a repetition of the visible devices (multicast forced off).
//!
//! Exactness: integers exactly; floats exactly on small-integer data; random floats within a
//! stated tolerance of an f64 reference; and the same bits on every rank, always.

mod common;

use std::sync::Arc;

use common::*;
use half::{bf16, f16};
use mcast::driver::{Device, Stream};
use mcast::kernels::{Collective, DType, RedOp};
use mcast::runtime::buffer::Buffer;
use mcast::runtime::collective::{run, run_into, synchronize};
use mcast::runtime::config::{Backend, Config, MulticastMode};
use mcast::runtime::context::Context;
use mcast::runtime::team::{Team, Transport};
use mcast::runtime::ErrorKind;

/// A context for the chosen backend, or `None` (skipped) when CUDA was asked for and is absent.
fn context(multicast: bool, timeout_ms: u32) -> Option<Arc<Context>> {
    context_of(multicast, timeout_ms, 8)
}

/// As [`context`], with `sim_devices` simulated GPUs.
fn context_of(multicast: bool, timeout_ms: u32, sim_devices: u32) -> Option<Arc<Context>> {
    let config = if on_gpu() {
        // MCAST_LL and MCAST_CE_MIN_BYTES apply: a GPU run can try the LL and copy-engine forms.
        Config { backend: Backend::Cuda, multicast: MulticastMode::Off, timeout_ms, ..Config::from_env() }
    } else {
        sim_runtime(multicast, sim_devices, timeout_ms)
    };
    runtime_context_or_skip(config)
}

/// As [`context`] with multicast off and every all-gather, broadcast and all-reduce large
/// enough (threshold 1 byte) taking its copy-engine form (`runtime::ce`).
fn copy_engine_context() -> Option<Arc<Context>> {
    let config = if on_gpu() {
        Config { backend: Backend::Cuda, multicast: MulticastMode::Off, timeout_ms: 20_000, ..Config::from_env() }
    } else {
        sim_runtime(false, 8, 20_000)
    };
    runtime_context_or_skip(Config { ce_min_bytes: Some(1), ..config })
}

/// Devices for a team of `n` ranks: distinct on the simulator, the GPUs repeated on CUDA.
fn devices(ctx: &Context, n: usize) -> Vec<Device> {
    let have = ctx.device_count();
    (0..n).map(|i| (i % have) as Device).collect()
}

/// Deterministic pseudo-random numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 11
    }
    fn float(&mut self) -> f64 {
        (self.next() as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }
}

fn decode(d: DType, b: &[u8]) -> f64 {
    match d {
        DType::F32 => f32::from_ne_bytes(b.try_into().unwrap()) as f64,
        DType::F64 => f64::from_ne_bytes(b.try_into().unwrap()),
        DType::F16 => f16::from_bits(u16::from_ne_bytes(b.try_into().unwrap())).to_f64(),
        DType::BF16 => bf16::from_bits(u16::from_ne_bytes(b.try_into().unwrap())).to_f64(),
        DType::I32 => i32::from_ne_bytes(b.try_into().unwrap()) as f64,
        DType::U32 => u32::from_ne_bytes(b.try_into().unwrap()) as f64,
        DType::I64 => i64::from_ne_bytes(b.try_into().unwrap()) as f64,
        DType::U64 => u64::from_ne_bytes(b.try_into().unwrap()) as f64,
    }
}

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
}

/// Input values of rank `r`: small integers (exact in every dtype and every summation order) or
/// random floats in [-1, 1).
fn values(d: DType, count: usize, r: usize, seed: u64, random_floats: bool) -> Vec<f64> {
    let mut rng = Rng(seed ^ (r as u64 + 1).wrapping_mul(0x9E3779B97F4A7C15));
    (0..count)
        .map(|_| {
            if random_floats && is_float(d) {
                rng.float()
            } else {
                let v = (rng.next() % 17) as f64;
                if matches!(d, DType::U32 | DType::U64) {
                    v
                } else {
                    v - 8.0
                }
            }
        })
        .map(|v| decode(d, &encode(d, v)))
        .collect()
}

/// Allowed error of a random-float sum relative to the sum of magnitudes.
fn tolerance(d: DType) -> f64 {
    match d {
        DType::F64 => 1e-13,
        DType::F32 => 1e-6,
        DType::F16 => 2e-3,
        DType::BF16 => 1e-2,
        _ => 0.0,
    }
}

struct Case {
    collective: Collective,
    count: usize,
    offset: usize,
    random_floats: bool,
}

/// Runs `case` on `team` and checks every rank against the reference; returns a description
/// of the first mismatch.
fn check(team: &Arc<Team>, case: &Case, seed: u64) -> Result<(), String> {
    let n = team.size();
    let (esize, blocks, dtype) = match case.collective {
        Collective::AllReduce { dtype, .. } => (dtype.size(), 1, dtype),
        Collective::ReduceScatter { dtype, .. } => (dtype.size(), n, dtype),
        Collective::AllGather => (1, n, DType::U32),
        Collective::Broadcast { .. } => (1, 1, DType::U32),
    };
    let extent = case.count * esize * blocks;
    let size = case.offset + extent + 64;
    let buf = Buffer::alloc(team, size).map_err(|e| e.to_string())?;
    let streams = rank_streams(team);
    // Inputs, with a poisoned margin around the range.
    let mut inputs = Vec::new();
    for r in 0..n {
        let mut bytes = vec![0xA5u8; size];
        let payload: Vec<u8> = match case.collective {
            Collective::AllReduce { dtype, .. } | Collective::ReduceScatter { dtype, .. } => {
                values(dtype, case.count * blocks, r, seed, case.random_floats)
                    .iter()
                    .flat_map(|&v| encode(dtype, v))
                    .collect()
            }
            _ => {
                let mut rng = Rng(seed + r as u64);
                (0..extent).map(|_| rng.next() as u8).collect()
            }
        };
        bytes[case.offset..case.offset + extent].copy_from_slice(&payload);
        buf.write(r as i32, 0, &bytes).map_err(|e| e.to_string())?;
        inputs.push(bytes);
    }
    for (r, &s) in streams.iter().enumerate() {
        run(&buf, r as i32, case.offset, case.count, case.collective, s).map_err(|e| e.to_string())?;
    }
    for (r, &s) in streams.iter().enumerate() {
        synchronize(team, r as i32, s).map_err(|e| e.to_string())?;
    }
    let outputs: Vec<Vec<u8>> = (0..n)
        .map(|r| {
            let mut out = vec![0u8; size];
            buf.read(r as i32, 0, &mut out).map(|_| out)
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    drop_rank_streams(team, streams);
    buf.free().map_err(|e| e.to_string())?;
    let what = |r: usize| format!("{:?} count {} offset {} rank {r}/{n}", case.collective, case.count, case.offset);
    for (r, out) in outputs.iter().enumerate() {
        if out[..case.offset] != inputs[r][..case.offset]
            || out[case.offset + extent..] != inputs[r][case.offset + extent..]
        {
            return Err(format!("{}: wrote outside its range", what(r)));
        }
    }
    let range = |r: usize, lo: usize, len: usize| &outputs[r][case.offset + lo..case.offset + lo + len];
    let input = |r: usize, lo: usize, len: usize| &inputs[r][case.offset + lo..case.offset + lo + len];
    match case.collective {
        Collective::Broadcast { root } => {
            for r in 0..n {
                if range(r, 0, extent) != input(root as usize, 0, extent) {
                    return Err(format!("{}: differs from the root's data", what(r)));
                }
            }
        }
        Collective::AllGather => {
            for r in 0..n {
                for q in 0..n {
                    if range(r, q * case.count, case.count) != input(q, q * case.count, case.count) {
                        return Err(format!("{}: block {q} differs from rank {q}'s", what(r)));
                    }
                }
            }
        }
        Collective::AllReduce { op, .. } | Collective::ReduceScatter { op, .. } => {
            let all_reduce = matches!(case.collective, Collective::AllReduce { .. });
            for r in 0..n {
                let first = if all_reduce { 0 } else { r * case.count };
                for i in 0..case.count {
                    let e = first + i;
                    let xs: Vec<f64> = (0..n).map(|q| decode(dtype, input(q, e * esize, esize))).collect();
                    let want = reduce(op, &xs);
                    let got = decode(dtype, range(r, e * esize, esize));
                    let exact = !(case.random_floats && is_float(dtype) && op == RedOp::Sum);
                    let ok = if exact {
                        match dtype {
                            DType::I32 | DType::U32 | DType::I64 | DType::U64 => got == want,
                            _ => got == decode(dtype, &encode(dtype, want)),
                        }
                    } else {
                        let mag: f64 = xs.iter().map(|x| x.abs()).sum();
                        (got - want).abs() <= tolerance(dtype) * mag.max(1e-30) + 1e-30
                    };
                    if !ok {
                        return Err(format!("{}: element {e}: got {got}, want {want} (inputs {xs:?})", what(r)));
                    }
                }
                if all_reduce && range(r, 0, extent) != range(0, 0, extent) {
                    return Err(format!("{}: not bit-identical to rank 0", what(r)));
                }
            }
        }
    }
    Ok(())
}

fn counts(esize: usize) -> Vec<usize> {
    // 1, odd, 4095, one granularity +- 1 (2 MiB in elements), several MB.
    let g = 2 * MIB / esize;
    vec![1, 37, 4095, g - 1, g + 1, 3 * MIB / esize + 5]
}

fn sweep(multicast: bool, sizes: &[usize], heavy: bool) {
    sweep_in(context(multicast, 20_000), multicast, sizes, heavy)
}

fn sweep_in(ctx: Option<Arc<Context>>, multicast: bool, sizes: &[usize], heavy: bool) {
    let Some(ctx) = ctx else { return };
    let mut failures = Vec::new();
    let mut ran = 0;
    for &n in sizes {
        let team = Team::create(&ctx, &devices(&ctx, n)).unwrap();
        let expect_mc = multicast && n >= 2 && !on_gpu();
        assert_eq!(team.transport() == Transport::Multicast, expect_mc, "team of {n}");
        let mut cases = Vec::new();
        for dtype in DType::ALL {
            for op in RedOp::ALL {
                for (i, &count) in counts(dtype.size()).iter().enumerate() {
                    // The large counts for every dtype with SUM, and for MIN/MAX on the heavy run.
                    let large = i >= 3;
                    if large && op != RedOp::Sum && !heavy {
                        continue;
                    }
                    let offset = if i % 2 == 0 { 0 } else { dtype.size().max(4) * 3 };
                    for random_floats in [false, true] {
                        if random_floats && !is_float(dtype) {
                            continue;
                        }
                        let rs_count = if large { count / n.max(2) + 1 } else { count };
                        cases.push(Case {
                            collective: Collective::AllReduce { dtype, op },
                            count,
                            offset,
                            random_floats,
                        });
                        cases.push(Case {
                            collective: Collective::ReduceScatter { dtype, op },
                            count: rs_count,
                            offset,
                            random_floats,
                        });
                    }
                }
            }
        }
        for (i, &bytes) in counts(1).iter().chain([2, 3, 4, 5, 16, 17].iter()).enumerate() {
            let offset = [0, 1, 4, 13][i % 4];
            cases.push(Case {
                collective: Collective::AllGather,
                count: bytes.min(3 * MIB / n + 3),
                offset,
                random_floats: false,
            });
            let root = (i % n) as u32;
            cases.push(Case { collective: Collective::Broadcast { root }, count: bytes, offset, random_floats: false });
        }
        for (k, case) in cases.iter().enumerate() {
            ran += 1;
            if let Err(e) = check(&team, case, 1000 + k as u64) {
                failures.push(format!("team of {n}: {e}"));
                if failures.len() > 10 {
                    break;
                }
            }
        }
        team.destroy().unwrap();
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    assert!(ran > 100);
    assert_clean(&ctx);
    eprintln!("{ran} cases passed");
}

#[test]
fn multicast_teams_of_1_2_3() {
    sweep(true, &[1, 2, 3], false);
}

#[test]
fn multicast_teams_of_4_8() {
    sweep(true, &[4, 8], false);
}

#[test]
fn p2p_teams_of_1_2_3() {
    sweep(false, &[1, 2, 3], false);
}

#[test]
fn p2p_teams_of_4_8() {
    sweep(false, &[4, 8], false);
}

/// The P2P sweep with the copy-engine forms of all-gather, broadcast and all-reduce (threshold
/// 1 byte; reduce-scatter and all-reduces of less than a 16-byte unit per rank keep the kernels).
#[test]
fn p2p_copy_engine_teams_of_1_2_3() {
    sweep_in(copy_engine_context(), false, &[1, 2, 3], false);
}

#[test]
fn out_of_place_p2p_copy_engine_teams_of_2_3() {
    sweep_into_in(copy_engine_context(), &[2, 3]);
}

/// The largest team, an NVL72 rack: every collective on 72 ranks, on both transports (on a GPU,
/// 72 ranks over the visible devices), with the ledger empty afterwards.
#[test]
fn teams_of_72_ranks() {
    for multicast in [true, false] {
        let Some(ctx) = context_of(multicast, 60_000, 72) else { return };
        let n = mcast::kernels::MAX_RANKS;
        assert_eq!(n, 72);
        let team = Team::create(&ctx, &devices(&ctx, n)).unwrap();
        assert_eq!(team.transport() == Transport::Multicast, multicast && !on_gpu());
        let mut cases = Vec::new();
        for (dtype, op) in [(DType::BF16, RedOp::Sum), (DType::F32, RedOp::Max), (DType::I64, RedOp::Sum)] {
            for (count, offset) in [(1, 0), (37, 24), (4099, 0), (72 * 1000 + 5, 16)] {
                cases.push(Case {
                    collective: Collective::AllReduce { dtype, op },
                    count,
                    offset,
                    random_floats: false,
                });
                cases.push(Case {
                    collective: Collective::ReduceScatter { dtype, op },
                    count: count / 36 + 1,
                    offset,
                    random_floats: false,
                });
            }
        }
        for (i, bytes) in [1usize, 17, 4096, 100_003].into_iter().enumerate() {
            let offset = [0, 1, 4, 13][i];
            cases.push(Case { collective: Collective::AllGather, count: bytes, offset, random_floats: false });
            let root = [71, 0, 35, 70][i];
            cases.push(Case { collective: Collective::Broadcast { root }, count: bytes, offset, random_floats: false });
        }
        for (k, case) in cases.iter().enumerate() {
            check(&team, case, 7200 + k as u64).unwrap_or_else(|e| panic!("multicast {multicast}: {e}"));
        }
        team.destroy().unwrap();
        // One rank more than a team holds is refused with the limit named.
        let e = Team::create(&ctx, &devices(&ctx, n + 1)).err().expect("73 ranks are refused");
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("at most 72 ranks"), "{e}");
        assert_clean(&ctx);
    }
}

#[test]
fn a_rank_that_never_arrives_times_out() {
    let Some(ctx) = context(true, 300) else { return };
    let team = Team::create(&ctx, &devices(&ctx, 2)).unwrap();
    let buf = Buffer::alloc(&team, 4096).unwrap();
    let s = rank_streams(&team);
    let ar = Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum };
    run(&buf, 0, 0, 256, ar, s[0]).unwrap();
    let started = std::time::Instant::now();
    let e = synchronize(&team, 0, s[0]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
    assert!(e.message.contains("did not arrive within timeout_ms = 300 ms"), "{e}");
    assert!(started.elapsed().as_secs_f64() < 10.0, "bounded by the timeout");
    // Sticky: every later call of the team reports it.
    assert_eq!(run(&buf, 1, 0, 256, ar, s[1]).unwrap_err().kind, ErrorKind::Timeout);
    assert_eq!(synchronize(&team, 1, s[1]).unwrap_err().kind, ErrorKind::Timeout);
    assert_eq!(run(&buf, 0, 0, 256, ar, s[0]).unwrap_err().kind, ErrorKind::Timeout);
    drop_rank_streams(&team, s);
    buf.free().unwrap();
    team.destroy().unwrap();
    assert!(ctx.shutdown().is_empty());
}

#[test]
fn invalid_arguments_are_rejected() {
    let Some(ctx) = context(true, 1000) else { return };
    let team = Team::create(&ctx, &devices(&ctx, 2)).unwrap();
    let buf = Buffer::alloc(&team, 4096).unwrap();
    let s = Stream::DEFAULT;
    let f32s = Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum };
    let bf16s = Collective::AllReduce { dtype: DType::BF16, op: RedOp::Max };
    let bad = |r: Result<(), mcast::runtime::Error>| assert_eq!(r.unwrap_err().kind, ErrorKind::InvalidArgument);
    bad(run(&buf, 2, 0, 1, f32s, s));
    bad(run(&buf, -1, 0, 1, f32s, s));
    bad(run(&buf, 0, 2, 1, f32s, s));
    bad(run(&buf, 0, 2, 1, bf16s, s));
    bad(run(&buf, 0, 0, 1025, f32s, s));
    bad(run(&buf, 0, 4092, 2, f32s, s));
    bad(run(&buf, 0, 0, usize::MAX / 2, f32s, s));
    bad(run(&buf, 0, 0, 1025, Collective::ReduceScatter { dtype: DType::I64, op: RedOp::Min }, s));
    bad(run(&buf, 0, 0, 2049, Collective::AllGather, s));
    bad(run(&buf, 0, 0, 10, Collective::Broadcast { root: 2 }, s));
    bad(run(&buf, 0, 4000, 97, Collective::Broadcast { root: 0 }, s));
    bad(synchronize(&team, 5, s));
    buf.free().unwrap();
    team.destroy().unwrap();
    assert!(ctx.shutdown().is_empty());
}

/// Where an out-of-place case puts `recv`.
#[derive(Clone, Copy, Debug)]
enum Place {
    /// A second buffer of the team, `recv` at this offset.
    Other(usize),
    /// The send buffer, `recv` after the send range at this extra offset.
    After(usize),
    /// The send buffer in NCCL's in-place layout (must behave as the in-place function).
    Nccl,
}

/// Runs `case` out of place (`run_into`) and checks every rank's `recv` range against the
/// reference, that `send` is unchanged (except in place) and that nothing outside the ranges
/// was written.
fn check_into(team: &Arc<Team>, case: &Case, place: Place, seed: u64) -> Result<(), String> {
    let n = team.size();
    let (esize, dtype) = match case.collective {
        Collective::AllReduce { dtype, .. } | Collective::ReduceScatter { dtype, .. } => (dtype.size(), dtype),
        _ => (1, DType::U32),
    };
    let block = case.count * esize;
    let (send_len, recv_len) = match case.collective {
        Collective::AllGather => (block, n * block),
        Collective::ReduceScatter { .. } => (n * block, block),
        _ => (block, block),
    };
    let so = case.offset;
    let align = if matches!(case.collective, Collective::AllReduce { .. } | Collective::ReduceScatter { .. }) {
        esize.max(4)
    } else {
        1
    };
    // Per rank offsets (NCCL's in-place layouts differ per rank: all-gather sends block r of
    // recv, reduce-scatter receives into block r of send).
    let in_place_ag = matches!(place, Place::Nccl) && matches!(case.collective, Collective::AllGather);
    let send_off = |r: usize| if in_place_ag { so + r * block } else { so };
    let recv_off = |r: usize| match place {
        Place::Other(o) => o,
        Place::After(o) => (so + send_len).next_multiple_of(align) + o,
        Place::Nccl => match case.collective {
            Collective::ReduceScatter { .. } => so + r * block,
            _ => so,
        },
    };
    let size = match place {
        Place::After(o) => (so + send_len).next_multiple_of(align) + o + recv_len + 64,
        _ => so + (n * block).max(send_len) + 64,
    };
    let send = Buffer::alloc(team, size).map_err(|e| e.to_string())?;
    let other = match place {
        Place::Other(o) => Some(Buffer::alloc(team, o + recv_len + 64).map_err(|e| e.to_string())?),
        _ => None,
    };
    let recv = other.as_ref().unwrap_or(&send);
    let streams = rank_streams(team);
    let mut inputs = Vec::new();
    for r in 0..n {
        let mut bytes = vec![0xA5u8; size];
        let payload: Vec<u8> = match case.collective {
            Collective::AllReduce { dtype, .. } | Collective::ReduceScatter { dtype, .. } => {
                values(dtype, send_len / esize, r, seed, case.random_floats)
                    .iter()
                    .flat_map(|&v| encode(dtype, v))
                    .collect()
            }
            _ => {
                let mut rng = Rng(seed + r as u64);
                (0..send_len).map(|_| rng.next() as u8).collect()
            }
        };
        bytes[send_off(r)..send_off(r) + send_len].copy_from_slice(&payload);
        send.write(r as i32, 0, &bytes).map_err(|e| e.to_string())?;
        if let Some(o) = &other {
            o.write(r as i32, 0, &vec![0x5Au8; o.size()]).map_err(|e| e.to_string())?;
        }
        inputs.push(payload);
    }
    for (r, &s) in streams.iter().enumerate() {
        run_into(&send, send_off(r), recv, recv_off(r), r as i32, case.count, case.collective, s)
            .map_err(|e| e.to_string())?;
    }
    for (r, &s) in streams.iter().enumerate() {
        synchronize(team, r as i32, s).map_err(|e| e.to_string())?;
    }
    let read = |b: &Buffer, r: usize| {
        let mut out = vec![0u8; b.size()];
        b.read(r as i32, 0, &mut out).map(|_| out).map_err(|e| e.to_string())
    };
    let what = |r: usize| format!("{:?} count {} send {so} {place:?} rank {r}/{n}", case.collective, case.count);
    let mut result = Ok(());
    'ranks: for r in 0..n {
        let sent = read(&send, r)?;
        let got = match &other {
            Some(o) => read(o, r)?,
            None => sent.clone(),
        };
        let ro = recv_off(r);
        let out = &got[ro..ro + recv_len];
        // Untouched: send (out of place), and everything outside both ranges.
        let in_place = matches!(place, Place::Nccl);
        let sr = send_off(r);
        for (i, &b) in sent.iter().enumerate() {
            let in_send = i >= sr && i < sr + send_len;
            let in_recv = other.is_none() && i >= ro && i < ro + recv_len;
            let want = if in_send { inputs[r][i - sr] } else { 0xA5 };
            let exempt = in_recv || (in_place && in_send);
            if !exempt && b != want {
                result = Err(format!("{}: send buffer byte {i} changed", what(r)));
                break 'ranks;
            }
        }
        if other.is_some() && (got[..ro].iter().chain(&got[ro + recv_len..])).any(|&b| b != 0x5A) {
            result = Err(format!("{}: wrote outside the recv range", what(r)));
            break;
        }
        let input = |q: usize, lo: usize, len: usize| &inputs[q][lo..lo + len];
        match case.collective {
            Collective::Broadcast { root } => {
                if out != input(root as usize, 0, block) {
                    result = Err(format!("{}: differs from the root's data", what(r)));
                }
            }
            Collective::AllGather => {
                for q in 0..n {
                    if out[q * block..(q + 1) * block] != *input(q, 0, block) {
                        result = Err(format!("{}: block {q} differs from rank {q}'s send", what(r)));
                    }
                }
            }
            Collective::AllReduce { op, .. } | Collective::ReduceScatter { op, .. } => {
                let first = if matches!(case.collective, Collective::AllReduce { .. }) { 0 } else { r * case.count };
                for i in 0..case.count {
                    let e = first + i;
                    let xs: Vec<f64> = (0..n).map(|q| decode(dtype, input(q, e * esize, esize))).collect();
                    let want = reduce(op, &xs);
                    let g = decode(dtype, &out[i * esize..(i + 1) * esize]);
                    let ok = if case.random_floats && is_float(dtype) && op == RedOp::Sum {
                        let mag: f64 = xs.iter().map(|x| x.abs()).sum();
                        (g - want).abs() <= tolerance(dtype) * mag.max(1e-30) + 1e-30
                    } else {
                        match dtype {
                            DType::I32 | DType::U32 | DType::I64 | DType::U64 => g == want,
                            _ => g == decode(dtype, &encode(dtype, want)),
                        }
                    };
                    if !ok {
                        result = Err(format!("{}: element {i}: got {g}, want {want}", what(r)));
                        break;
                    }
                }
            }
        }
        if result.is_err() {
            break;
        }
    }
    drop_rank_streams(team, streams);
    if let Some(o) = other {
        o.free().map_err(|e| e.to_string())?;
    }
    send.free().map_err(|e| e.to_string())?;
    result
}

fn sweep_into(multicast: bool, sizes: &[usize]) {
    sweep_into_in(context(multicast, 20_000), sizes)
}

fn sweep_into_in(ctx: Option<Arc<Context>>, sizes: &[usize]) {
    let Some(ctx) = ctx else { return };
    let mut failures = Vec::new();
    let mut ran = 0;
    for &n in sizes {
        let team = Team::create(&ctx, &devices(&ctx, n)).unwrap();
        let mut cases = Vec::new();
        for dtype in DType::ALL {
            for op in RedOp::ALL {
                let large = 2 * MIB / dtype.size() + 1;
                for (i, &count) in [1, 37, 4095, large].iter().enumerate() {
                    if i == 3 && op != RedOp::Sum {
                        continue;
                    }
                    let unit = dtype.size().max(4);
                    let offset = [0, unit * 3, 16, unit][i];
                    let random_floats = is_float(dtype) && i % 2 == 1;
                    let rs_count = if i == 3 { count / n + 1 } else { count };
                    // recv aligned like send, 4 bytes off modulo 16, or after send in one buffer.
                    let place = [Place::Other(0), Place::Other(unit), Place::After(unit * 5), Place::Nccl][i];
                    let ar = Collective::AllReduce { dtype, op };
                    let rs = Collective::ReduceScatter { dtype, op };
                    cases.push((Case { collective: ar, count, offset, random_floats }, place));
                    cases.push((Case { collective: rs, count: rs_count, offset, random_floats }, place));
                }
            }
        }
        for (i, &bytes) in [1usize, 4, 17, 4096, 100_003, 3 * MIB / n + 3].iter().enumerate() {
            let offset = [0, 1, 4, 13, 16, 8][i];
            for (k, place) in [Place::Other(3), Place::Other(0), Place::After(4), Place::Nccl].into_iter().enumerate() {
                cases.push((
                    Case { collective: Collective::AllGather, count: bytes, offset, random_floats: false },
                    place,
                ));
                let root = ((i + k) % n) as u32;
                cases.push((
                    Case { collective: Collective::Broadcast { root }, count: bytes, offset, random_floats: false },
                    place,
                ));
            }
        }
        for (k, (case, place)) in cases.iter().enumerate() {
            ran += 1;
            if let Err(e) = check_into(&team, case, *place, 5000 + k as u64) {
                failures.push(format!("team of {n}: {e}"));
                if failures.len() > 10 {
                    break;
                }
            }
        }
        assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
        team.destroy().unwrap();
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    assert!(ran > 100);
    assert_clean(&ctx);
    eprintln!("{ran} out-of-place cases passed");
}

#[test]
fn out_of_place_multicast_teams_of_1_2_3() {
    sweep_into(true, &[1, 2, 3]);
}

#[test]
fn out_of_place_multicast_teams_of_4_8() {
    sweep_into(true, &[4, 8]);
}

#[test]
fn out_of_place_p2p_teams_of_1_2_3() {
    sweep_into(false, &[1, 2, 3]);
}

#[test]
fn out_of_place_p2p_teams_of_4_8() {
    sweep_into(false, &[4, 8]);
}

#[test]
fn out_of_place_invalid_arguments_and_count_zero() {
    let Some(ctx) = context(true, 1000) else { return };
    let team = Team::create(&ctx, &devices(&ctx, 2)).unwrap();
    let other = Team::create(&ctx, &devices(&ctx, 2)).unwrap();
    let a = Buffer::alloc(&team, 4096).unwrap();
    let b = Buffer::alloc(&team, 4096).unwrap();
    let foreign = Buffer::alloc(&other, 4096).unwrap();
    let s = Stream::DEFAULT;
    let f32s = Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum };
    let rs = Collective::ReduceScatter { dtype: DType::F32, op: RedOp::Sum };
    let bad = |r: Result<(), mcast::runtime::Error>, says: &str| {
        let e = r.unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        assert!(e.message.contains(says), "{e}");
    };
    bad(run_into(&a, 0, &foreign, 0, 0, 4, f32s, s), "different teams");
    bad(run_into(&a, 0, &a, 8, 0, 4, f32s, s), "overlap");
    bad(run_into(&a, 0, &a, 8, 0, 16, Collective::Broadcast { root: 0 }, s), "overlap");
    // Reduce-scatter's in-place form for rank 1 is recv = send + 1 block; rank 0's layout is not.
    bad(run_into(&a, 0, &a, 16, 0, 4, rs, s), "overlap");
    bad(run_into(&a, 0, &b, 4092, 0, 4, f32s, s), "past");
    // All-gather's in-place form for rank 0 (send == recv) still needs room for every block.
    bad(run_into(&a, 4000, &a, 4000, 0, 64, Collective::AllGather, s), "past");
    bad(run_into(&a, 4092, &b, 0, 0, 4, f32s, s), "past");
    bad(run_into(&a, 0, &b, 2, 0, 4, f32s, s), "multiple of 4");
    bad(run_into(&a, 0, &b, 0, 2, 4, f32s, s), "rank");
    bad(run_into(&a, 0, &b, 0, 0, 4, Collective::Broadcast { root: 2 }, s), "root");
    // Count 0: a no-op after the handle and rank checks, in place and out of place, even with
    // offsets past the end.
    for c in [f32s, rs, Collective::AllGather, Collective::Broadcast { root: 1 }] {
        run(&a, 0, 1 << 40, 0, c, s).unwrap();
        run_into(&a, 1 << 40, &b, 0, 1, 0, c, s).unwrap();
        bad(run(&a, 3, 0, 0, c, s), "rank");
        bad(run_into(&a, 0, &b, 0, -1, 0, c, s), "rank");
        bad(run_into(&a, 0, &foreign, 0, 0, 0, c, s), "different teams");
    }
    bad(run(&a, 0, 0, 0, Collective::Broadcast { root: 5 }, s), "root");
    for r in 0..2 {
        synchronize(&team, r, s).unwrap();
    }
    foreign.free().unwrap();
    a.free().unwrap();
    b.free().unwrap();
    other.destroy().unwrap();
    team.destroy().unwrap();
    assert!(ctx.shutdown().is_empty());
}
