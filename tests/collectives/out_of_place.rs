//! The `_into` form (out of place): `recv` in a second buffer, after the send range, or in
//! NCCL's in-place layout; invalid arguments and count zero.

use super::*;

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
fn out_of_place_p2p_copy_engine_teams_of_2_3() {
    sweep_into_in(copy_engine_context(), &[2, 3]);
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
