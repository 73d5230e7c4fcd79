//! The buffer form (in place): every collective, dtype and op on teams of 1 to 8 (and 72)
//! ranks on both transports and the copy engine, a rank that never arrives, invalid arguments.

use super::*;

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
