//! The ranks: what a child process runs, selected by `MCAST_MP_CHILD`.

use super::*;

const TIMEOUT_MS: u32 = 3000;

fn context(multicast: bool) -> Arc<Context> {
    let config = Config {
        multicast: if multicast { MulticastMode::Require } else { MulticastMode::Off },
        retry_backoff_ms: 1,
        // The children see only what a test gave them (`CUDA_VISIBLE_DEVICES` is cleared for the
        // others), never the caller's kill switches.
        sim_host_env: Some(
            std::env::var("CUDA_VISIBLE_DEVICES")
                .map(|v| vec![("CUDA_VISIBLE_DEVICES".to_string(), v)])
                .unwrap_or_default(),
        ),
        ..sim_runtime(multicast, 4, TIMEOUT_MS)
    }
    // The handle type and the simulated fabric support come from the environment.
    .with_env(|name| match name {
        "MCAST_HANDLE_TYPE" | "MCAST_SIM_FABRIC" | "MCAST_LL" | "MCAST_CE_MIN_BYTES" | "MCAST_SIM_IMEX"
        | "MCAST_DOMAIN" | "MCAST_MNNVL" | "MCAST_DEVICE_SLOTS" => std::env::var(name).ok(),
        _ => None,
    });
    Arc::new(Context::new(config).unwrap())
}

/// Small integers: exact in every dtype and order.
fn value(r: usize, i: usize) -> f64 {
    ((r * 7 + i * 3) % 17) as f64 - 8.0
}

fn input(d: DType, r: usize, count: usize) -> Vec<f64> {
    (0..count).map(|i| if matches!(d, DType::U32 | DType::U64) { value(r, i).abs() } else { value(r, i) }).collect()
}

fn bytes(d: DType, xs: &[f64]) -> Vec<u8> {
    xs.iter().flat_map(|&v| encode(d, v)).collect()
}

fn check_collectives(team: &Arc<Team>, n: usize, r: usize) {
    let rank = r as i32;
    let s = Stream::DEFAULT;
    let buf = Buffer::alloc(team, 3 * MIB).unwrap();
    // All-reduce, every dtype and op, a small and a large count.
    for d in DType::ALL {
        for op in RedOp::ALL {
            for count in [5usize, 70_001] {
                buf.write(rank, 0, &bytes(d, &input(d, r, count))).unwrap();
                run(&buf, rank, 0, count, Collective::AllReduce { dtype: d, op }, s).unwrap();
                synchronize(team, rank, s).unwrap();
                let inputs: Vec<Vec<f64>> = (0..n).map(|q| input(d, q, count)).collect();
                let want: Vec<f64> =
                    (0..count).map(|i| reduce(op, &inputs.iter().map(|x| x[i]).collect::<Vec<_>>())).collect();
                let mut got = vec![0u8; count * d.size()];
                buf.read(rank, 0, &mut got).unwrap();
                assert_eq!(got, bytes(d, &want), "all-reduce {d:?} {op:?} count {count} on rank {r} of {n}");
            }
        }
    }
    // Reduce-scatter.
    let (d, count) = (DType::I32, 1001usize);
    buf.write(rank, 0, &bytes(d, &input(d, r, n * count))).unwrap();
    run(&buf, rank, 0, count, Collective::ReduceScatter { dtype: d, op: RedOp::Sum }, s).unwrap();
    synchronize(team, rank, s).unwrap();
    let inputs: Vec<Vec<f64>> = (0..n).map(|q| input(d, q, n * count)).collect();
    let want: Vec<f64> = (r * count..(r + 1) * count).map(|i| inputs.iter().map(|x| x[i]).sum()).collect();
    let mut got = vec![0u8; count * 4];
    buf.read(rank, r * count * 4, &mut got).unwrap();
    assert_eq!(got, bytes(d, &want), "reduce-scatter on rank {r}");
    // Broadcast from the last rank, and all-gather.
    let block = 4099usize;
    let mine: Vec<u8> = (0..n * block).map(|i| (i * 31 + r * 7) as u8).collect();
    buf.write(rank, 0, &mine).unwrap();
    let root = n - 1;
    run(&buf, rank, 0, block, Collective::Broadcast { root: root as u32 }, s).unwrap();
    synchronize(team, rank, s).unwrap();
    let mut got = vec![0u8; block];
    buf.read(rank, 0, &mut got).unwrap();
    let want: Vec<u8> = (0..block).map(|i| (i * 31 + root * 7) as u8).collect();
    assert_eq!(got, want, "broadcast on rank {r}");
    buf.write(rank, 0, &mine).unwrap();
    run(&buf, rank, 0, block, Collective::AllGather, s).unwrap();
    synchronize(team, rank, s).unwrap();
    let mut got = vec![0u8; n * block];
    buf.read(rank, 0, &mut got).unwrap();
    let want: Vec<u8> = (0..n * block).map(|i| (i * 31 + (i / block) * 7) as u8).collect();
    assert_eq!(got, want, "all-gather on rank {r}");
    buf.free().unwrap();
}

/// A one-element i32 sum over `team` from `rank`'s `value`.
fn all_reduce_i32(team: &Arc<Team>, rank: i32, value: i32) -> i32 {
    let s = Stream::DEFAULT;
    let buf = Buffer::alloc(team, 4096).unwrap();
    buf.write(rank, 0, &value.to_ne_bytes()).unwrap();
    run(&buf, rank, 0, 1, Collective::AllReduce { dtype: DType::I32, op: RedOp::Sum }, s).unwrap();
    synchronize(team, rank, s).unwrap();
    let mut got = [0u8; 4];
    buf.read(rank, 0, &mut got).unwrap();
    buf.free().unwrap();
    i32::from_ne_bytes(got)
}

#[test]
fn child() {
    let Ok(spec) = std::env::var(ROLE) else { return };
    let f: Vec<&str> = spec.split(':').collect();
    let (role, n, r, multicast, id) =
        (f[0], f[1].parse::<usize>().unwrap(), f[2].parse::<usize>().unwrap(), f[3] == "1", unhex(f[4]));
    let rank = r as i32;
    let ctx = context(multicast);
    let start = Instant::now();
    let bound = if std::env::var_os(TIGHT).is_some() {
        Duration::from_millis(u64::from(TIMEOUT_MS) + 1000)
    } else {
        Duration::from_millis(u64::from(TIMEOUT_MS) * 2 + 2000)
    };
    match role {
        "collectives" => {
            let team = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).unwrap();
            let want = if multicast { Transport::Multicast } else { Transport::P2P };
            assert_eq!(team.transport(), want);
            match std::env::var(EXPECT_HT).as_deref() {
                Ok("fabric") => assert_eq!(team.handle_type(), HandleTypes::FABRIC, "rank {r}"),
                Ok("posix") => assert_eq!(team.handle_type(), HandleTypes::POSIX_FD, "rank {r}"),
                other => panic!("rank {r}: no expected handle type ({other:?})"),
            }
            if let Ok(ll) = std::env::var(EXPECT_LL) {
                assert_eq!(team.ll(), ll == "1", "rank {r}: LL");
            }
            if let Ok(ce) = std::env::var(EXPECT_CE) {
                assert_eq!(team.ce_min_bytes().to_string(), ce, "rank {r}: copy-engine threshold");
            }
            if let Ok(slots) = std::env::var(EXPECT_SLOTS) {
                assert_eq!(team.device_slots().to_string(), slots, "rank {r}: device-API slots");
                let v = team.device_view(r as i32).unwrap();
                assert_eq!(v.nslots.to_string(), slots, "rank {r}: the handle's slots");
            }
            // Ranks of other processes are refused.
            let other = ((r + 1) % n) as i32;
            let b = Buffer::alloc(&team, 1000).unwrap();
            assert_eq!(b.local_ptr(other).unwrap_err().kind, ErrorKind::InvalidArgument);
            assert_eq!(synchronize(&team, other, Stream::DEFAULT).unwrap_err().kind, ErrorKind::InvalidArgument);
            assert!(b.peer_ptr(rank, other).is_ok());
            b.free().unwrap();
            check_collectives(&team, n, r);
            team.destroy().unwrap();
        }
        "identity" => {
            let spec = std::env::var(IDENTITY).unwrap();
            let f: Vec<&str> = spec.split(';').collect();
            let dev: i32 = f[0].parse().unwrap();
            // AUTO: the team's own facts decide the transport.
            let auto = Config { multicast: MulticastMode::Auto, ..ctx.config().clone() };
            let ctx = Arc::new(Context::new(auto).unwrap());
            let team = Team::init_rank(&ctx, &id, n as i32, rank, dev).unwrap();
            let info = team.info();
            let want = if f[1] == "multicast" { Transport::Multicast } else { Transport::P2P };
            assert_eq!(team.transport(), want, "rank {r}: {}", info.transport_reason);
            assert_eq!(team.max_blocks().to_string(), f[2], "rank {r}: grid cap");
            let uuid = mcast::driver::uuid_string(&ctx.props(dev).unwrap().uuid);
            let reason = f[3].replace("{uuid}", &uuid);
            assert!(info.transport_reason.contains(&reason), "rank {r}: {:?} lacks {reason:?}", info.transport_reason);
            if f.get(4) == Some(&"collectives") {
                check_collectives(&team, n, r);
            }
            team.destroy().unwrap();
            assert!(ctx.driver().as_sim().unwrap().ledger().is_empty());
        }
        "domains" => {
            let spec = std::env::var(DOMAINS).unwrap();
            let f: Vec<&str> = spec.split(';').collect();
            let dev: i32 = f[0].parse().unwrap();
            match f[1] {
                "ok" => {
                    let team = Team::init_rank(&ctx, &id, n as i32, rank, dev).unwrap();
                    let info = team.info();
                    assert_eq!((info.domains.to_string(), info.domain_size.to_string()), (f[2].into(), f[3].into()));
                    assert_eq!(info.net_engine, "");
                    team.destroy().unwrap();
                }
                _ => {
                    let e = Team::init_rank(&ctx, &id, n as i32, rank, dev).err().expect("several domains");
                    assert_eq!(e.kind, ErrorKind::NotSupported, "rank {r}: {}", e.message);
                    for want in f[2].split('|') {
                        assert!(e.message.contains(want), "rank {r}: {:?} lacks {want:?}", e.message);
                    }
                    assert!(start.elapsed() < bound);
                }
            }
            assert!(ctx.driver().as_sim().unwrap().ledger().is_empty(), "rank {r}");
        }
        "identity-no-access" => {
            // P2P (multicast off): the import that fails is of the peer's memory.
            let e = Team::init_rank(&ctx, &id, n as i32, rank, 0).err().expect("no peer access");
            assert_eq!(e.kind, ErrorKind::NotSupported, "rank {r}: {}", e.message);
            let other = ctx.props(0).unwrap().uuid;
            assert!(e.message.contains("no peer access"), "rank {r}: {}", e.message);
            assert!(e.message.contains(&mcast::driver::uuid_string(&other)), "rank {r}: {}", e.message);
            assert!(start.elapsed() < bound);
            assert!(ctx.driver().as_sim().unwrap().ledger().is_empty(), "rank {r}");
        }
        "fault" => {
            let team = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).unwrap();
            let e = Buffer::alloc(&team, 4 * MIB).err().expect("the buffer fails on every rank");
            assert!(e.message.contains("rank 1"), "rank {r}: {}", e.message);
            assert!(start.elapsed() < bound);
            team.destroy().unwrap();
        }
        "forced-fabric" => {
            let e = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).err().expect("setup fails");
            assert_eq!(e.kind, ErrorKind::NotSupported, "rank {r}: {}", e.message);
            assert!(e.message.contains("rank 1") && e.message.contains("fabric"), "rank {r}: {}", e.message);
            assert!(start.elapsed() < bound);
        }
        "cross-host-posix" | "cross-host-no-fabric" => {
            let e = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).err().expect("setup fails");
            assert_eq!(e.kind, ErrorKind::NotSupported, "rank {r}: {}", e.message);
            let why = if role == "cross-host-posix" { "MCAST_HANDLE_TYPE=posix" } else { "fabric handle support" };
            assert!(e.message.contains("host1") && e.message.contains(why), "rank {r}: {}", e.message);
            assert!(e.message.contains(if role == "cross-host-posix" { "rank 0" } else { "rank 1" }), "{}", e.message);
            assert!(start.elapsed() < bound);
        }
        "env-refused" => {
            let e = new_unique_id().expect_err("an id was made without a good secret");
            assert_eq!(e.kind, mcast::bootstrap::Kind::InvalidArgument, "rank {r}: {}", e.message);
            assert!(e.message.contains("MCAST_BOOTSTRAP_SECRET"), "rank {r}: {}", e.message);
            // An env-mode id (made elsewhere) is not joined from this environment either.
            let addr = std::env::var("MCAST_BOOTSTRAP_ADDR").unwrap();
            let id = mcast::bootstrap::UniqueId { addr: addr.parse().unwrap(), secret: [7; 32], rank0_listens: true };
            let e = Team::init_rank(&ctx, &id.encode(), n as i32, rank, r as i32).err().expect("init must fail");
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "rank {r}: {}", e.message);
            assert!(e.message.contains("MCAST_BOOTSTRAP_SECRET"), "rank {r}: {}", e.message);
            assert!(start.elapsed() < Duration::from_secs(2), "rank {r} took {:?}", start.elapsed());
        }
        "env-join" => {
            if let Ok(ms) = std::env::var(DELAY) {
                std::thread::sleep(Duration::from_millis(ms.parse().unwrap()));
            }
            // As a job would: form the team with whatever id the environment gives.
            let made = new_unique_id();
            if let Ok(id) = &made {
                let team = Team::init_rank(&ctx, id, n as i32, rank, r as i32).unwrap();
                assert_eq!(team.size(), n);
                assert_eq!(all_reduce_i32(&team, rank, 1 << r), (1 << n) - 1, "rank {r}: a stranger's value?");
                team.destroy().unwrap();
            }
            match (made, std::env::var_os("MCAST_BOOTSTRAP_SECRET")) {
                (Ok(_), Some(_)) => {}
                (Ok(_), None) => panic!("rank {r}: an id was made without a secret"),
                (Err(e), secret) => {
                    assert!(secret.is_none(), "rank {r}: {}", e.message);
                    assert!(e.message.contains("MCAST_BOOTSTRAP_SECRET"), "rank {r}: {}", e.message);
                }
            }
        }
        "env-split" => {
            let team = Team::init_rank(&ctx, &new_unique_id().unwrap(), n as i32, rank, r as i32).unwrap();
            let color = (r / 2) as i32;
            let made = team.split(&[color], &[rank]).unwrap();
            let [Some(sub)] = &made[..] else { panic!("rank {r}: no team for color {color}") };
            assert_eq!(sub.size(), 2, "rank {r}: the team of color {color}");
            let new_rank = sub.local_rank().unwrap();
            assert_eq!(new_rank, r % 2, "rank {r}");
            // Each rank contributes 1 << its old rank: the sum names the members.
            let want = (1 << (2 * color)) | (1 << (2 * color + 1));
            assert_eq!(all_reduce_i32(sub, new_rank as i32, 1 << r), want, "rank {r}: color {color}'s sum");
            sub.destroy().unwrap();
            // The parent team is intact.
            assert_eq!(all_reduce_i32(&team, rank, 1 << r), (1 << n) - 1, "rank {r}: the parent's sum");
            team.destroy().unwrap();
        }
        "env-id" => {
            let mine = new_unique_id().unwrap();
            assert_eq!(mine, new_unique_id().unwrap(), "the id is a function of the environment");
            let team = Team::init_rank(&ctx, &mine, n as i32, rank, r as i32).unwrap();
            check_collectives(&team, n, r);
            team.destroy().unwrap();
        }
        "form" => {
            let team = Team::init_rank(&ctx, &id, n as i32, rank, (r % 4) as i32).unwrap();
            team.destroy().unwrap();
        }
        "oom" => {
            let team = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).unwrap();
            let b = Buffer::alloc(&team, 4 * MIB).unwrap();
            b.free().unwrap();
            team.destroy().unwrap();
        }
        "die-setup" => {
            if r == 2 {
                // A hard death: no unwinding, no cleanup.
                std::panic::set_hook(Box::new(|_| std::process::abort()));
            }
            let e = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).err().expect("setup fails");
            // With fabric handles a rank may open rank 2's memory after rank 2 died: the handle
            // is stale, which is a clean error of its own instead of the timeout.
            let stale = e.message.contains("importing rank 2's memory");
            assert!(e.kind == ErrorKind::Timeout || stale, "rank {r}: {:?} {}", e.kind, e.message);
            assert!(start.elapsed() < bound, "rank {r} took {:?}", start.elapsed());
        }
        "die-collective" => {
            let team = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).unwrap();
            let buf = Buffer::alloc(&team, 4096).unwrap();
            if r == 2 {
                std::process::abort();
            }
            let t = Instant::now();
            run(&buf, rank, 0, 1024, Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum }, Stream::DEFAULT)
                .unwrap();
            let e = synchronize(&team, rank, Stream::DEFAULT).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Timeout, "{}", e.message);
            assert!(t.elapsed() < bound, "rank {r} took {:?}", t.elapsed());
            buf.free().unwrap();
            team.destroy().unwrap();
        }
        "register" => {
            let team = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).unwrap();
            match std::env::var(EXPECT_HT).as_deref() {
                Ok("fabric") => assert_eq!(team.handle_type(), HandleTypes::FABRIC, "rank {r}"),
                Ok("posix") => assert_eq!(team.handle_type(), HandleTypes::POSIX_FD, "rank {r}"),
                _ => {}
            }
            let s = Stream::DEFAULT;
            let dev = r as i32;
            let count = 20_000usize;
            let block = count * 4;
            let driver = ctx.driver().clone();
            let mem = |bytes: usize| ctx.memory.alloc(&ctx, dev, bytes).unwrap();
            // send holds n blocks (reduce-scatter), recv n blocks (all-gather).
            let (ps, pr) = (mem(n * block), mem(n * block));
            let send = Buffer::register(&team, &[ps], n * block).unwrap();
            let recv = Buffer::register(&team, &[pr], n * block).unwrap();
            assert!(send.is_registered() && recv.is_registered());
            assert_eq!(ctx.memory.registrations(), 2);
            let value = |q: usize, i: usize| ((q + 1) * (i % 13)) as i32;
            let bytes_of = |v: Vec<i32>| -> Vec<u8> { v.into_iter().flat_map(|x| x.to_ne_bytes()).collect() };
            let read = |p: u64, len: usize| {
                let mut got = vec![0u8; len];
                driver.memcpy_dtoh(dev, &mut got, p).unwrap();
                got
            };
            let mine: Vec<i32> = (0..n * count).map(|i| value(r, i)).collect();
            driver.memcpy_htod(dev, ps, &bytes_of(mine)).unwrap();
            let sum = Collective::AllReduce { dtype: DType::I32, op: RedOp::Sum };
            let tri = (n * (n + 1) / 2) as i32;
            // All-reduce into recv.
            run_into(&send, 0, &recv, 0, rank, count, sum, s).unwrap();
            synchronize(&team, rank, s).unwrap();
            let want = bytes_of((0..count).map(|i| tri * (i % 13) as i32).collect());
            assert_eq!(read(pr, block), want, "rank {r}: all-reduce into registered memory");
            // Reduce-scatter: block r of every rank's send, summed, lands in recv.
            let rs = Collective::ReduceScatter { dtype: DType::I32, op: RedOp::Sum };
            run_into(&send, 0, &recv, 0, rank, count, rs, s).unwrap();
            synchronize(&team, rank, s).unwrap();
            let want = bytes_of((0..count).map(|i| tri * ((r * count + i) % 13) as i32).collect());
            assert_eq!(read(pr, block), want, "rank {r}: reduce-scatter into registered memory");
            // All-gather: every rank's first block, in rank order.
            run_into(&send, 0, &recv, 0, rank, block, Collective::AllGather, s).unwrap();
            synchronize(&team, rank, s).unwrap();
            let want = bytes_of((0..n).flat_map(|q| (0..count).map(move |i| value(q, i))).collect());
            assert_eq!(read(pr, n * block), want, "rank {r}: all-gather into registered memory");
            // Broadcast from the last rank.
            let root = (n - 1) as u32;
            run_into(&send, 0, &recv, 0, rank, block, Collective::Broadcast { root }, s).unwrap();
            synchronize(&team, rank, s).unwrap();
            let want = bytes_of((0..count).map(|i| value(n - 1, i)).collect());
            assert_eq!(read(pr, block), want, "rank {r}: broadcast into registered memory");
            // The pointer form on the registered pointers (zero-copy path), offsets inside.
            run_ptr(&team, rank, ps + 256, pr + 512, count, sum, s).unwrap();
            synchronize(&team, rank, s).unwrap();
            let want = bytes_of((0..count).map(|i| tri * ((i + 64) % 13) as i32).collect());
            assert_eq!(read(pr + 512, block), want, "rank {r}: pointer-form all-reduce on registered memory");
            // In place on the registered send buffer.
            run(&send, rank, 0, count, sum, s).unwrap();
            synchronize(&team, rank, s).unwrap();
            let want = bytes_of((0..count).map(|i| tri * (i % 13) as i32).collect());
            assert_eq!(read(ps, block), want, "rank {r}: in-place all-reduce on registered memory");
            // The memory stays with its owner while registered, and after the free.
            assert_eq!(ctx.memory.free(&ctx, ps).unwrap_err().kind, ErrorKind::InUse);
            send.free().unwrap();
            recv.free().unwrap();
            assert_eq!(ctx.memory.registrations(), 0);
            assert_eq!(read(ps, block), want, "rank {r}: the memory outlives its registration");
            ctx.memory.free(&ctx, ps).unwrap();
            ctx.memory.free(&ctx, pr).unwrap();
            team.destroy().unwrap();
        }
        "register-errors" => {
            // A failed vote ends the team's setup calls (as for mcast_buffer_alloc): one case
            // per team.
            let case = std::env::var(CASE).unwrap();
            let team = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).unwrap();
            let dev = r as i32;
            let driver = ctx.driver().clone();
            let bytes = 4096;
            let p = ctx.memory.alloc(&ctx, dev, bytes).unwrap();
            let plain = driver.mem_alloc(dev, bytes).unwrap();
            let host = [0u8; 64];
            // The overlap case: a live registration of p, made before the team breaks.
            let live = (case == "overlap").then(|| Buffer::register(&team, &[p], bytes).unwrap());
            let q = ctx.memory.alloc(&ctx, dev, bytes).unwrap();
            let (theirs, len, kind, words) = match case.as_str() {
                "plain" => (plain, bytes, ErrorKind::NotSupported, "not memory from cuMemCreate"),
                "host" => (host.as_ptr() as u64, 64, ErrorKind::InvalidArgument, "not device memory"),
                "misaligned" => (p + 256, 256, ErrorKind::NotSupported, "not aligned"),
                "overlap" => (p, bytes, ErrorKind::InvalidArgument, "overlaps a live registration"),
                other => panic!("unknown case {other}"),
            };
            let mine = if r == 1 { theirs } else { q };
            let e = Buffer::register(&team, &[mine], len).err().expect("rank 1 breaks a rule");
            // Rank 1 has its own error; the others have rank 1's kind, with a message naming
            // rank 1 and the rule.
            assert_eq!(e.kind, kind, "rank {r}: {case}: {}", e.message);
            assert!(e.message.contains("rank 1") && e.message.contains(words), "rank {r}: {case}: {}", e.message);
            assert!(start.elapsed() < bound, "rank {r}: {case} took {:?}", start.elapsed());
            let left = usize::from(live.is_some());
            assert_eq!(ctx.memory.registrations(), left, "rank {r}: {case}: a registration was left");
            assert_eq!(team.live_buffers(), left, "rank {r}: {case}: a buffer was left");
            if let Some(b) = live {
                b.free().unwrap();
            }
            driver.mem_free(dev, plain).unwrap();
            ctx.memory.free(&ctx, p).unwrap();
            ctx.memory.free(&ctx, q).unwrap();
            team.destroy().unwrap();
        }
        "register-fault" => {
            let func = std::env::var(CASE).unwrap();
            let team = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).unwrap();
            let dev = r as i32;
            let p = ctx.memory.alloc(&ctx, dev, 4096).unwrap();
            let culprit = if func == "cuMulticastCreate" { 0 } else { 1 };
            let sim = ctx.driver().as_sim().unwrap();
            if r == culprit {
                let code = mcast::driver::CuResult::ERROR_INVALID_VALUE;
                sim.inject(&func, code, 1, Some(1));
                if func == "cuMulticastBindAddr" {
                    sim.inject("cuMulticastBindAddr_v2", code, 1, Some(1));
                }
            }
            let e = Buffer::register(&team, &[p], 4096).err().expect("the registration fails on every rank");
            let who = format!("rank {culprit}");
            assert!(e.message.contains(&who), "rank {r}: {func}: {:?} {}", e.kind, e.message);
            assert!(start.elapsed() < bound, "rank {r}: {func} took {:?}", start.elapsed());
            assert_eq!(ctx.memory.registrations(), 0, "rank {r}: {func}: a registration was left");
            assert_eq!(team.live_buffers(), 0, "rank {r}: {func}: a buffer was left");
            sim.clear_faults();
            ctx.memory.free(&ctx, p).unwrap();
            team.destroy().unwrap();
        }
        "own-memory" => {
            let team = Team::init_rank(&ctx, &id, n as i32, rank, r as i32).unwrap();
            let s = Stream::DEFAULT;
            let count = 70_000usize; // past one chunk of the pointer form's scratch for 2 ranks
            let value = |q: usize, i: usize| ((q + 1) * (i % 11)) as i32;
            let tri = (n * (n + 1) / 2) as i32;
            // Out of place across processes: send and recv buffers of the team.
            let send = Buffer::alloc(&team, count * 4).unwrap();
            let recv = Buffer::alloc(&team, count * 4 + 64).unwrap();
            let mine: Vec<u8> = (0..count).flat_map(|i| value(r, i).to_ne_bytes()).collect();
            send.write(rank, 0, &mine).unwrap();
            let sum = Collective::AllReduce { dtype: DType::I32, op: RedOp::Sum };
            run_into(&send, 0, &recv, 16, rank, count, sum, s).unwrap();
            synchronize(&team, rank, s).unwrap();
            let mut got = vec![0u8; count * 4];
            recv.read(rank, 16, &mut got).unwrap();
            let want: Vec<u8> = (0..count).flat_map(|i| (tri * (i % 11) as i32).to_ne_bytes()).collect();
            assert_eq!(got, want, "rank {r}: out-of-place all-reduce");
            // The pointer form on plain device memory of this process.
            let driver = ctx.driver().clone();
            let p = driver.mem_alloc(r as i32, count * 4).unwrap();
            driver.memcpy_htod(r as i32, p, &mine).unwrap();
            run_ptr(&team, rank, p, p, count, sum, s).unwrap();
            synchronize(&team, rank, s).unwrap();
            driver.memcpy_dtoh(r as i32, &mut got, p).unwrap();
            assert_eq!(got, want, "rank {r}: pointer-form all-reduce");
            driver.mem_free(r as i32, p).unwrap();
            send.free().unwrap();
            recv.free().unwrap();
            team.destroy().unwrap();
        }
        other => panic!("unknown role {other}"),
    }
    assert_clean(&ctx);
}
