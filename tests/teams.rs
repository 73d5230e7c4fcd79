//! Teams and symmetric buffers on the simulator, through the C API: transports, sharing of
//! segments, exhaustion, rollback, thread safety, and a fault-injection sweep over every driver
//! call that team creation, buffer allocation, free and team destruction make.

mod common;

use common::*;
use mcast::capi::buffer::*;
use mcast::capi::context::*;
use mcast::capi::status::mcast_status_t;
use mcast::capi::status::McastStatus::*;
use mcast::capi::team::*;
use mcast::driver::CuResult;

#[test]
fn transport_is_chosen_with_its_reason() {
    let (ctx, _c) = context(&sim_config(4, |_| {}));
    let mc = team_create(ctx, &[0, 1, 2, 3]).unwrap();
    let info = team_info(mc);
    assert_eq!(info.transport.0, McastTransport::MCAST_TRANSPORT_MULTICAST as u32);
    assert_eq!(info.size, 4);
    assert_eq!(info.multicast_objects, 1, "the first segment holds the sync regions");
    assert_eq!(info.granularity, 2 * MIB as u64);
    let one = team_create(ctx, &[2]).unwrap();
    let info = team_info(one);
    assert_eq!(info.transport.0, McastTransport::MCAST_TRANSPORT_P2P as u32);
    assert_eq!(info.multicast_objects, 0);
    // SAFETY: the reason is NUL-terminated.
    let reason = unsafe { std::ffi::CStr::from_ptr(info.transport_reason.as_ptr()) }.to_str().unwrap().to_string();
    assert!(reason.contains("one rank"), "{reason}");
    let repeated = team_create(ctx, &[1, 1, 0]).unwrap();
    assert_eq!(team_info(repeated).transport.0, McastTransport::MCAST_TRANSPORT_P2P as u32);
    assert_eq!(mcast_context_destroy(ctx), OK);
}

#[test]
fn require_fails_with_the_reason() {
    let cfg = sim_config(2, |c| c.multicast.0 = 2);
    let (ctx, _c) = context(&cfg);
    let (s, msg) = team_create(ctx, &[0, 0]).unwrap_err();
    assert_eq!(s, st(MCAST_ERROR_NOT_SUPPORTED));
    assert!(msg.contains("required") && msg.contains("device 0 appears more than once"), "{msg}");
    assert!(team_create(ctx, &[0, 1]).is_ok());
    let cfg = sim_config(2, |c| {
        c.multicast.0 = 2;
        c.sim_multicast_supported = 0;
    });
    let (ctx2, _c2) = context(&cfg);
    let (s, msg) = team_create(ctx2, &[0, 1]).unwrap_err();
    assert_eq!(s, st(MCAST_ERROR_NOT_SUPPORTED));
    assert!(msg.contains("MULTICAST_SUPPORTED"), "{msg}");
    mcast_context_destroy(ctx);
    mcast_context_destroy(ctx2);
}

#[test]
fn bad_team_arguments_are_rejected() {
    let (ctx, c) = context(&sim_config(2, |_| {}));
    assert_eq!(team_create(ctx, &[0, 2]).unwrap_err().0, st(MCAST_ERROR_INVALID_ARGUMENT));
    assert_eq!(team_create(ctx, &[-1]).unwrap_err().0, st(MCAST_ERROR_INVALID_ARGUMENT));
    assert_eq!(team_create(ctx, &[]).unwrap_err().0, st(MCAST_ERROR_INVALID_ARGUMENT));
    assert_eq!(team_create(ctx, &[0; 73]).unwrap_err().0, st(MCAST_ERROR_INVALID_ARGUMENT));
    let mut t = mcast_team_t { id: 0 };
    // SAFETY: NULL devices with a count is the error under test.
    let s = unsafe { mcast_team_create(ctx, std::ptr::null(), 2, &mut t) };
    assert_eq!(s, st(MCAST_ERROR_INVALID_ARGUMENT));
    // SAFETY: NULL out is the error under test.
    let s = unsafe { mcast_team_create(ctx, [0].as_ptr(), 1, std::ptr::null_mut()) };
    assert_eq!(s, st(MCAST_ERROR_INVALID_ARGUMENT));
    assert!(ledger(&c).allocations.iter().all(|&n| n == 0), "nothing allocated by failed creates");
    mcast_context_destroy(ctx);
}

#[test]
fn small_buffers_share_segments_and_fit_in_few_multicast_slots() {
    // 200 buffers of 4 KiB on a fabric of 128 multicast slots: one segment holds them all.
    let cfg = sim_config(4, |c| c.sim_multicast_slots = 128);
    let (ctx, c) = context(&cfg);
    let team = team_create(ctx, &[0, 1, 2, 3]).unwrap();
    let first = team_info(team).bytes_reserved;
    let bufs: Vec<_> = (0..200).map(|_| alloc(team, 4096).unwrap()).collect();
    let info = team_info(team);
    assert!(info.multicast_objects <= 2, "{} multicast objects for 800 KiB", info.multicast_objects);
    assert!(info.bytes_reserved <= first + 2 * MIB as u64, "{} bytes for 800 KiB", info.bytes_reserved - first);
    assert_eq!(ledger(&c).multicast_objects, info.multicast_objects);
    // Distinct, non-overlapping ranges: write a pattern per buffer, read all back.
    for (i, b) in bufs.iter().enumerate() {
        let data = vec![i as u8; 4096];
        // SAFETY: valid pointer and length.
        assert_eq!(unsafe { mcast_buffer_write(*b, 3, 0, data.as_ptr().cast(), 4096) }, OK);
    }
    for (i, b) in bufs.iter().enumerate() {
        let mut back = vec![0u8; 4096];
        // SAFETY: valid pointer and length.
        assert_eq!(unsafe { mcast_buffer_read(*b, 3, 0, back.as_mut_ptr().cast(), 4096) }, OK);
        assert!(back.iter().all(|&x| x == i as u8), "buffer {i} was overwritten");
    }
    for b in &bufs {
        assert_eq!(mcast_buffer_free(*b), OK);
    }
    // Freed ranges are reused: the same 200 allocations need no new segment.
    let before = team_info(team).bytes_reserved;
    let again: Vec<_> = (0..200).map(|_| alloc(team, 4096).unwrap()).collect();
    assert_eq!(team_info(team).bytes_reserved, before);
    again.into_iter().for_each(|b| assert_eq!(mcast_buffer_free(b), OK));
    assert_eq!(mcast_team_destroy(team), OK);
    assert_eq!(mcast_context_destroy(ctx), OK);
    assert!(ledger(&c).is_empty(), "{}", ledger(&c));
}

#[test]
fn pointers_address_every_rank_and_peer() {
    let (ctx, _c) = context(&sim_config(3, |_| {}));
    let team = team_create(ctx, &[0, 1, 2]).unwrap();
    let b = alloc(team, 1000).unwrap();
    for rank in 0..3 {
        let v = vec![rank as u8 + 1; 1000];
        // SAFETY: valid pointer and length.
        assert_eq!(unsafe { mcast_buffer_write(b, rank, 0, v.as_ptr().cast(), v.len()) }, OK);
    }
    for rank in 0..3 {
        for peer in 0..3 {
            let mut p = std::ptr::null_mut();
            // SAFETY: valid out pointer.
            assert_eq!(unsafe { mcast_buffer_peer_ptr(b, rank, peer, &mut p) }, OK);
            // SAFETY: on the simulator device pointers are host pointers into mapped memory.
            let first = unsafe { *(p as *const u8) };
            assert_eq!(first, peer as u8 + 1, "rank {rank} sees peer {peer}");
        }
        let mut m = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        assert_eq!(unsafe { mcast_buffer_multicast_ptr(b, rank, &mut m) }, OK);
        assert!(!m.is_null());
    }
    let mut p = std::ptr::null_mut();
    // SAFETY: valid out pointer; bad ranks are the errors under test.
    unsafe {
        assert_eq!(mcast_buffer_local_ptr(b, 3, &mut p), st(MCAST_ERROR_INVALID_ARGUMENT));
        assert_eq!(mcast_buffer_peer_ptr(b, 0, -1, &mut p), st(MCAST_ERROR_INVALID_ARGUMENT));
        assert_eq!(mcast_buffer_local_ptr(b, 0, std::ptr::null_mut()), st(MCAST_ERROR_INVALID_ARGUMENT));
        let mut x = [0u8; 8];
        assert_eq!(mcast_buffer_read(b, 0, 996, x.as_mut_ptr().cast(), 8), st(MCAST_ERROR_INVALID_ARGUMENT));
        assert_eq!(mcast_buffer_read(b, 0, usize::MAX, x.as_mut_ptr().cast(), 8), st(MCAST_ERROR_INVALID_ARGUMENT));
        assert_eq!(mcast_buffer_write(b, 0, 0, std::ptr::null(), 8), st(MCAST_ERROR_INVALID_ARGUMENT));
        let mut size = 0usize;
        assert_eq!(mcast_buffer_size(b, &mut size), OK);
        assert_eq!(size, 1000);
    }
    let p2p = team_create(ctx, &[0, 0]).unwrap();
    let pb = alloc(p2p, 64).unwrap();
    // SAFETY: valid out pointer.
    assert_eq!(unsafe { mcast_buffer_multicast_ptr(pb, 0, &mut p) }, st(MCAST_ERROR_NOT_SUPPORTED));
    assert_eq!(alloc(p2p, 0).unwrap_err().0, st(MCAST_ERROR_INVALID_ARGUMENT));
    assert_eq!(alloc(p2p, usize::MAX).unwrap_err().0, st(MCAST_ERROR_INVALID_ARGUMENT));
    mcast_context_destroy(ctx);
}

#[test]
fn destroy_refuses_live_buffers_and_handles_go_stale() {
    let (ctx, c) = context(&sim_config(2, |_| {}));
    let team = team_create(ctx, &[0, 1]).unwrap();
    let b = alloc(team, 10).unwrap();
    assert_eq!(mcast_team_destroy(team), st(MCAST_ERROR_IN_USE));
    assert!(last_error().contains("1 live buffer"), "{}", last_error());
    assert_eq!(mcast_buffer_free(b), OK);
    assert_eq!(mcast_buffer_free(b), st(MCAST_ERROR_INVALID_HANDLE), "double free");
    assert_eq!(mcast_buffer_free(mcast_buffer_t { id: 0 }), OK, "zero handle");
    assert_eq!(mcast_buffer_free(mcast_buffer_t { id: team.id }), st(MCAST_ERROR_INVALID_HANDLE), "foreign");
    assert_eq!(mcast_team_destroy(team), OK);
    assert_eq!(mcast_team_destroy(team), st(MCAST_ERROR_INVALID_HANDLE));
    assert_eq!(alloc(team, 10).unwrap_err().0, st(MCAST_ERROR_INVALID_HANDLE));
    // Children of a destroyed context are invalid.
    let t2 = team_create(ctx, &[0]).unwrap();
    let b2 = alloc(t2, 10).unwrap();
    assert_eq!(mcast_context_destroy(ctx), OK, "leaks are reported, not fatal");
    assert!(ledger(&c).is_empty(), "{}", ledger(&c));
    assert_eq!(mcast_buffer_free(b2), st(MCAST_ERROR_INVALID_HANDLE));
    assert_eq!(mcast_team_destroy(t2), st(MCAST_ERROR_INVALID_HANDLE));
    assert_eq!(mcast_context_destroy(ctx), st(MCAST_ERROR_INVALID_HANDLE));
}

#[test]
fn leak_report_and_counts() {
    let (ctx, _c) = context(&sim_config(2, |_| {}));
    let team = team_create(ctx, &[0, 1]).unwrap();
    let _b = alloc(team, 5 * MIB).unwrap();
    let counts = live_counts(ctx);
    assert_eq!((counts.teams, counts.buffers), (1, 1));
    assert_eq!(counts.multicast_objects, 2);
    assert_eq!(counts.physical_allocations, 4);
    // Per rank: the first segment (sync region, push scratch, staging and LL landing areas, 16 MiB
    // for two ranks) and a 6 MiB segment for the 5 MiB buffer.
    assert_eq!(counts.device_bytes, 2 * (16 * MIB as u64) + 2 * (6 * MIB as u64));
    // SAFETY: NULL with len 0 asks for the length.
    let need = unsafe { mcast_context_leak_report(ctx, std::ptr::null_mut(), 0) };
    let mut buf = vec![0i8; need + 1];
    // SAFETY: valid buffer of need + 1 bytes.
    let got = unsafe { mcast_context_leak_report(ctx, buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(got, need);
    // SAFETY: NUL-terminated by the call.
    let text = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr().cast()) }.to_str().unwrap().to_string();
    assert_eq!(text.len(), need);
    assert!(text.contains("team: 2 rank(s) on devices [0, 1], 1 live buffer(s)"), "{text}");
    assert!(text.contains("multicast object: 6291456 bytes"), "{text}");
    assert!(text.contains("created at src/runtime/segment/"), "{text}");
    // The user's call, not only an internal line.
    assert!(text.contains("created by mcast_buffer_alloc"), "{text}");
    assert!(text.contains("created by mcast_team_create"), "{text}");
    let mut small = [1i8; 8];
    // SAFETY: valid 8-byte buffer.
    let got = unsafe { mcast_context_leak_report(ctx, small.as_mut_ptr().cast(), 8) };
    assert_eq!(got, need, "truncation still reports the full length");
    assert_eq!(small[7], 0);
    mcast_context_destroy(ctx);
}

#[test]
fn multicast_slot_exhaustion_is_a_clean_error() {
    let cfg = sim_config(2, |c| {
        c.sim_multicast_slots = 3;
        c.oom_retries = 2;
    });
    let (ctx, c) = context(&cfg);
    let team = team_create(ctx, &[0, 1]).unwrap();
    let a = alloc(team, 3 * MIB).unwrap();
    let b = alloc(team, 3 * MIB).unwrap();
    let before = live_counts(ctx);
    let (s, msg) = alloc(team, 3 * MIB).unwrap_err();
    assert_eq!(s, st(MCAST_ERROR_OUT_OF_MEMORY));
    assert!(msg.contains("cuMulticastCreate returned CUDA_ERROR_OUT_OF_MEMORY"), "{msg}");
    assert!(msg.contains("3 multicast object(s) live") && msg.contains("after 2 retries"), "{msg}");
    assert!(msg.contains("sim_multicast_slots = 3") && msg.contains("MCAST_SIM_MULTICAST_SLOTS"), "{msg}");
    let after = live_counts(ctx);
    assert_eq!(
        (after.physical_allocations, after.mappings, after.reservations, after.multicast_objects),
        (before.physical_allocations, before.mappings, before.reservations, before.multicast_objects),
        "the failed call rolled back what it created"
    );
    // Freeing one buffer lets the next allocation succeed (the cached segment is reused).
    assert_eq!(mcast_buffer_free(a), OK);
    let a2 = alloc(team, 3 * MIB).unwrap();
    for x in [a2, b] {
        assert_eq!(mcast_buffer_free(x), OK);
    }
    assert_eq!(mcast_team_destroy(team), OK);
    mcast_context_destroy(ctx);
    assert!(ledger(&c).is_empty(), "{}", ledger(&c));
}

#[test]
fn cached_segments_are_trimmed_when_memory_runs_out() {
    // 26 MiB per device: the team (16 MiB) plus a cached 8 MiB segment leave too little for a
    // 10 MiB buffer until the cache is trimmed by the retry policy.
    let cfg = sim_config(2, |c| c.sim_device_memory = 26 * MIB as u64);
    let (ctx, c) = context(&cfg);
    let team = team_create(ctx, &[0, 1]).unwrap();
    let first = team_info(team).bytes_reserved;
    assert_eq!(first, 16 * MIB as u64, "sync region, push scratch, staging and LL landing areas of a two-rank team");
    let a = alloc(team, 8 * MIB).unwrap();
    assert_eq!(mcast_buffer_free(a), OK);
    assert_eq!(team_info(team).bytes_reserved, first + 8 * MIB as u64, "the empty segment is cached");
    let b = alloc(team, 10 * MIB).unwrap();
    assert_eq!(team_info(team).bytes_reserved, first + 10 * MIB as u64, "the cache was trimmed");
    // Past the simulated device's memory: the message names the setting and its variable.
    let (s, msg) = alloc(team, 64 * MIB).unwrap_err();
    assert_eq!(s, st(MCAST_ERROR_OUT_OF_MEMORY), "{msg}");
    assert!(msg.contains("sim_device_memory = 27262976") && msg.contains("MCAST_SIM_DEVICE_MEMORY"), "{msg}");
    assert_eq!(mcast_buffer_free(b), OK);
    mcast_context_destroy(ctx);
    assert!(ledger(&c).is_empty(), "{}", ledger(&c));
}

#[test]
fn device_memory_exhaustion_leaves_the_team_usable() {
    let cfg = sim_config(2, |c| c.sim_device_memory = 40 * MIB as u64);
    let (ctx, c) = context(&cfg);
    let team = team_create(ctx, &[0, 1]).unwrap();
    let mut live = Vec::new();
    let err = loop {
        match alloc(team, 4 * MIB) {
            Ok(b) => live.push(b),
            Err(e) => break e,
        }
        assert!(live.len() < 100, "the budget never ran out");
    };
    assert_eq!(err.0, st(MCAST_ERROR_OUT_OF_MEMORY));
    assert!(err.1.contains("cuMemCreate returned CUDA_ERROR_OUT_OF_MEMORY"), "{}", err.1);
    assert!(err.1.contains("asked for 4194304 bytes"), "{}", err.1);
    assert_eq!(live.len(), 6, "16 MiB for the team, then 6 x 4 MiB in 40 MiB");
    // Still usable: write, read, free one, allocate again.
    let v = [7u8; 16];
    // SAFETY: valid pointer and length.
    assert_eq!(unsafe { mcast_buffer_write(live[0], 1, 0, v.as_ptr().cast(), 16) }, OK);
    assert_eq!(mcast_buffer_free(live.pop().unwrap()), OK);
    live.push(alloc(team, 4 * MIB).unwrap());
    for b in live {
        assert_eq!(mcast_buffer_free(b), OK);
    }
    assert_eq!(mcast_team_destroy(team), OK);
    mcast_context_destroy(ctx);
    assert!(ledger(&c).is_empty(), "{}", ledger(&c));
}

#[test]
fn eight_threads_allocate_and_free_on_one_team() {
    let (ctx, c) = context(&sim_config(4, |_| {}));
    let team = team_create(ctx, &[0, 1, 2, 3]).unwrap();
    std::thread::scope(|s| {
        for t in 0..8u8 {
            s.spawn(move || {
                let mut mine = Vec::new();
                for i in 0..60usize {
                    let bytes = 1 + (i * 7919 + t as usize * 104729) % (3 * MIB);
                    let b = alloc(team, bytes).unwrap();
                    let tag = [t; 8];
                    // SAFETY: valid pointer and length.
                    assert_eq!(
                        unsafe { mcast_buffer_write(b, (i % 4) as i32, 0, tag.as_ptr().cast(), 8.min(bytes)) },
                        OK
                    );
                    mine.push((b, bytes, (i % 4) as i32));
                    if i % 3 == 2 {
                        let (b, bytes, rank) = mine.remove(0);
                        let mut back = [0u8; 8];
                        let n = 8.min(bytes);
                        // SAFETY: valid pointer and length.
                        assert_eq!(unsafe { mcast_buffer_read(b, rank, 0, back.as_mut_ptr().cast(), n) }, OK);
                        assert!(back[..n].iter().all(|&x| x == t), "another thread wrote into this buffer");
                        assert_eq!(mcast_buffer_free(b), OK);
                    }
                }
                for (b, _, _) in mine {
                    assert_eq!(mcast_buffer_free(b), OK);
                }
            });
        }
    });
    assert_eq!(live_counts(ctx).buffers, 0);
    assert_eq!(mcast_team_destroy(team), OK);
    mcast_context_destroy(ctx);
    assert!(ledger(&c).is_empty(), "{}", ledger(&c));
}

/// Team create, two buffers (the second needs its own segment), free both, team destroy. Stops
/// at the first failure and returns it; cleans up whatever was created either way.
fn scenario(ctx: mcast_context_t, devices: &[i32]) -> Option<(usize, mcast_status_t, String)> {
    let team = match team_create(ctx, devices) {
        Ok(t) => t,
        Err((s, m)) => return Some((0, s, m)),
    };
    let mut failure = None;
    let mut bufs = Vec::new();
    for (step, bytes) in [(1, 4096), (2, 3 * MIB)] {
        match alloc(team, bytes) {
            Ok(b) => bufs.push(b),
            Err((s, m)) => {
                failure = Some((step, s, m));
                break;
            }
        }
    }
    for b in bufs {
        let s = mcast_buffer_free(b);
        if s != OK && failure.is_none() {
            failure = Some((3, s, last_error()));
        }
    }
    let s = mcast_team_destroy(team);
    if s != OK && failure.is_none() {
        failure = Some((4, s, last_error()));
    }
    failure
}

fn sweep(multicast: bool) {
    let devices = [0, 1];
    let cfg = sim_config(2, |c| {
        c.multicast.0 = if multicast { 0 } else { 1 };
        c.oom_retries = 2;
    });
    // The calls a clean run makes.
    let (ctx, c) = context(&cfg);
    sim(&c).reset_call_log();
    assert!(scenario(ctx, &devices).is_none());
    let calls = sim(&c).call_log();
    mcast_context_destroy(ctx);
    assert!(calls.contains(&if multicast { "cuMulticastBindMem_v2" } else { "cuMemMap" }));
    let mut injected = 0;
    for (i, &func) in calls.iter().enumerate() {
        let nth = calls[..=i].iter().filter(|&&f| f == func).count() as u64;
        for persistent in [false, true] {
            for code in [CuResult::ERROR_OUT_OF_MEMORY, CuResult::ERROR_SYSTEM_NOT_READY, CuResult::ERROR_INVALID_VALUE]
            {
                let (ctx, c) = context(&cfg);
                sim(&c).inject(func, code, nth, if persistent { None } else { Some(1) });
                let failure = scenario(ctx, &devices);
                sim(&c).clear_faults();
                injected += 1;
                let what =
                    format!("{func} call #{nth} failing {code:?} {}", if persistent { "always" } else { "once" });
                let retryable = code != CuResult::ERROR_INVALID_VALUE;
                if RETRIED.contains(&func) && retryable && !persistent {
                    assert!(failure.is_none(), "{what}: the retry should recover, got {failure:?}");
                } else {
                    let (step, s, msg) = failure.unwrap_or_else(|| panic!("{what}: no error surfaced"));
                    let expected = match code {
                        CuResult::ERROR_OUT_OF_MEMORY => MCAST_ERROR_OUT_OF_MEMORY,
                        CuResult::ERROR_SYSTEM_NOT_READY => MCAST_ERROR_SYSTEM_NOT_READY,
                        _ => MCAST_ERROR_DRIVER,
                    };
                    assert_eq!(s, st(expected), "{what} (step {step}): {msg}");
                    let named = func.trim_end_matches("_v2");
                    assert!(msg.contains(named) && msg.contains(code.name()), "{what}: message {msg:?}");
                }
                assert_eq!(mcast_context_destroy(ctx), OK);
                assert!(ledger(&c).is_empty(), "{what}: leaked {}", ledger(&c));
            }
        }
    }
    assert!(injected >= 6 * 40, "only {injected} injections");
}

#[test]
fn fault_sweep_multicast() {
    sweep(true);
}

#[test]
fn fault_sweep_p2p() {
    sweep(false);
}

#[test]
fn grid_is_capped_so_ranks_sharing_a_device_stay_resident() {
    let (ctx, c) = context(&sim_config(2, |_| {}));
    let sms = c.props(0).unwrap().sm_count as u32;
    let spread = team_create(ctx, &[0, 1]).unwrap();
    let shared = team_create(ctx, &[0, 0, 0, 0, 0, 0, 0, 1]).unwrap();
    let cap = |t: mcast_team_t| mcast::runtime::handles::team(t.id).unwrap().inner().max_blocks();
    assert_eq!(cap(spread), sms);
    assert_eq!(cap(shared), sms / 7, "7 ranks share device 0");
    mcast_context_destroy(ctx);
}
