//! Memory the application owns (API.md "Memory the application owns"): `mcast_mem_alloc`
//! memory and the caller's own `cuMemCreate` memory registered as buffers on both transports,
//! collectives on them in and out of place, every registration rule with its status and
//! message, and leak-free teardown in every order (the simulator's ledger and the registry).
// Ranks index several per-rank vectors at once: plain index loops read best.
#![allow(clippy::needless_range_loop)]

mod common;

use std::sync::Arc;

use common::*;
use mcast::driver::{DevicePtr, HandleTypes, Stream};
use mcast::kernels::{Collective, DType, RedOp};
use mcast::runtime::buffer::Buffer;
use mcast::runtime::collective::{run, run_into, run_ptr, synchronize};
use mcast::runtime::context::Context;
use mcast::runtime::team::{Team, Transport};
use mcast::runtime::ErrorKind;

fn context(multicast: bool) -> Arc<Context> {
    runtime_context(sim_runtime(multicast, 4, 20_000))
}

fn floats(p: DevicePtr, n: usize) -> &'static mut [f32] {
    // SAFETY: simulated device memory is host memory, mapped for the test's lifetime.
    unsafe { std::slice::from_raw_parts_mut(p as *mut f32, n) }
}

/// Registered memory on a team of `n`: in-place all-reduce on it, then out of place into an
/// allocated buffer and back into another registered buffer; results read through the
/// caller's own pointers.
fn collectives_on_registered(multicast: bool, n: usize) {
    let ctx = context(multicast);
    let devices: Vec<i32> = (0..n as i32).collect();
    let team = Team::create(&ctx, &devices).unwrap();
    assert_eq!(team.transport() == Transport::Multicast, multicast && n > 1);
    let count = 1000;
    let bytes = count * 4;
    let a: Vec<DevicePtr> = devices.iter().map(|&d| ctx.memory.alloc(&ctx, d, bytes).unwrap()).collect();
    let b: Vec<DevicePtr> = devices.iter().map(|&d| ctx.memory.alloc(&ctx, d, bytes).unwrap()).collect();
    for (r, &p) in a.iter().enumerate() {
        for (i, x) in floats(p, count).iter_mut().enumerate() {
            *x = (r + 1) as f32 * (i % 13) as f32;
        }
    }
    let ra = Buffer::register(&team, &a, bytes).unwrap();
    let rb = Buffer::register(&team, &b, bytes).unwrap();
    let plain = Buffer::alloc(&team, bytes).unwrap();
    for r in 0..n {
        assert_eq!(ra.local_ptr(r as i32).unwrap() % 16, a[r] % 16);
        // The buffer's copy aliases the caller's memory.
        let mut first = [0u8; 8];
        ra.read(r as i32, 0, &mut first).unwrap();
        assert_eq!(f32::from_ne_bytes(first[4..].try_into().unwrap()), (r + 1) as f32);
    }
    let sum = Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum };
    let total = (n * (n + 1) / 2) as f32;
    let s = Stream::DEFAULT;
    for r in 0..n as i32 {
        run(&ra, r, 0, count, sum, s).unwrap();
    }
    for r in 0..n as i32 {
        synchronize(&team, r, s).unwrap();
    }
    for &p in &a {
        assert!(floats(p, count).iter().enumerate().all(|(i, &x)| x == total * (i % 13) as f32));
    }
    // Out of place: registered -> allocated (max), allocated -> registered (broadcast).
    let max = Collective::AllReduce { dtype: DType::F32, op: RedOp::Max };
    for r in 0..n as i32 {
        run_into(&ra, 0, &plain, 0, r, count, max, s).unwrap();
    }
    for r in 0..n as i32 {
        run_into(&plain, 0, &rb, 0, r, bytes, Collective::Broadcast { root: (n - 1) as u32 }, s).unwrap();
    }
    for r in 0..n as i32 {
        synchronize(&team, r, s).unwrap();
    }
    for &p in &b {
        assert!(floats(p, count).iter().enumerate().all(|(i, &x)| x == total * (i % 13) as f32));
    }
    // Teardown: the buffers first, then the memory (refused while registered).
    let e = ctx.memory.free(&ctx, a[0]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InUse, "{e}");
    assert!(e.message.contains("mcast_buffer_free"), "{e}");
    ra.free().unwrap();
    rb.free().unwrap();
    plain.free().unwrap();
    // The memory is still the caller's, with the results in it.
    assert_eq!(floats(b[0], 2)[1], total);
    for p in a.into_iter().chain(b) {
        ctx.memory.free(&ctx, p).unwrap();
    }
    let e = ctx.memory.free(&ctx, 0x1000).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    team.destroy().unwrap();
    assert_clean(&ctx);
}

#[test]
fn registered_memory_multicast_teams_of_1_2_3_4() {
    for n in 1..=4 {
        collectives_on_registered(true, n);
    }
}

#[test]
fn registered_memory_p2p_teams_of_1_2_3_4() {
    for n in 1..=4 {
        collectives_on_registered(false, n);
    }
}

/// Every rule, each with its status and a message naming it; nothing left behind.
fn registration_rules(multicast: bool) {
    let ctx = context(multicast);
    let driver = ctx.driver().clone();
    let team = Team::create(&ctx, &[0, 1]).unwrap();
    let g = team.alloc_granularity();
    let mem: Vec<DevicePtr> = (0..2).map(|d| ctx.memory.alloc(&ctx, d, 2 * g).unwrap()).collect();
    let check = |ptrs: &[DevicePtr], bytes: usize, kind: ErrorKind, says: &str| {
        let before = (ctx.memory.registrations(), ctx.resources.counts());
        let e = Buffer::register(&team, ptrs, bytes).err().unwrap_or_else(|| panic!("{says}: registered"));
        assert_eq!(e.kind, kind, "{e}");
        assert!(e.message.contains(says), "{says}: {e}");
        assert_eq!((ctx.memory.registrations(), ctx.resources.counts()), before, "{says}: nothing left");
    };
    check(&[mem[0]], 64, ErrorKind::InvalidArgument, "1 pointers for a team of 2");
    check(&mem, 0, ErrorKind::InvalidArgument, "bytes is 0");
    check(&[mem[0], 0], 64, ErrorKind::InvalidArgument, "ptrs[1] is NULL");
    check(&[mem[1], mem[0]], 64, ErrorKind::InvalidArgument, "memory of device 1, but rank 0 runs on device 0");
    let host = vec![0u64; 64];
    check(&[mem[0], host.as_ptr() as u64], 64, ErrorKind::InvalidArgument, "not device memory");
    // cudaMalloc-style memory: no cuMemCreate allocation behind it.
    let plain: Vec<DevicePtr> = (0..2).map(|d| driver.mem_alloc(d, g).unwrap()).collect();
    check(&plain, 64, ErrorKind::NotSupported, "cudaMalloc");
    check(&[mem[0], plain[1]], 64, ErrorKind::NotSupported, "ptrs[1]");
    // Past the allocation, rounded to the granularity.
    check(&[mem[0] + g as u64, mem[1] + g as u64], g + 1, ErrorKind::NotSupported, "allocation");
    // A pointer inside an allocation: refused by BindAddr's alignment on MULTICAST, mapped on P2P.
    let inside = [mem[0] + 4096, mem[1] + 4096];
    if multicast {
        check(&inside, 64, ErrorKind::NotSupported, "multicast granularity");
    } else {
        let buf = Buffer::register(&team, &inside, 64).unwrap();
        buf.write(1, 0, &[7u8; 64]).unwrap();
        // SAFETY: simulated device memory is host memory.
        assert_eq!(unsafe { *((mem[1] + 4096 + 63) as *const u8) }, 7);
        check(&[mem[0] + 4096 + 32, mem[1] + 8192], 64, ErrorKind::InvalidArgument, "overlaps a live registration");
        buf.free().unwrap();
    }
    // Overlap with a live registration.
    let buf = Buffer::register(&team, &mem, g).unwrap();
    check(&[mem[0], mem[1] + g as u64], 64, ErrorKind::InvalidArgument, "overlaps a live registration");
    // The caller's own cuMemCreate memory (shareable or not) registers where the rules allow.
    let own: Vec<(mcast::driver::MemHandle, DevicePtr)> = (0..2)
        .map(|d| {
            let h = driver.mem_create(d, g, HandleTypes::NONE).unwrap();
            let p = driver.mem_address_reserve(g, g).unwrap();
            driver.mem_map(p, g, 0, h).unwrap();
            driver.mem_set_access(p, g, &[d]).unwrap();
            (h, p)
        })
        .collect();
    let ptrs: Vec<DevicePtr> = own.iter().map(|o| o.1).collect();
    let mine = Buffer::register(&team, &ptrs, 1000).unwrap();
    mine.write(0, 0, &[1u8; 1000]).unwrap();
    mine.write(1, 0, &[2u8; 1000]).unwrap();
    let s = Stream::DEFAULT;
    for r in 0..2 {
        run(&mine, r, 0, 250, Collective::AllReduce { dtype: DType::U32, op: RedOp::Sum }, s).unwrap();
    }
    for r in 0..2 {
        synchronize(&team, r, s).unwrap();
    }
    // SAFETY: simulated device memory is host memory.
    assert_eq!(unsafe { *(ptrs[1] as *const u32) }, 0x0303_0303);
    // Destroying the team is refused while registered buffers live.
    assert_eq!(team.destroy().unwrap_err().kind, ErrorKind::InUse);
    mine.free().unwrap();
    buf.free().unwrap();
    for (d, (h, p)) in own.into_iter().enumerate() {
        driver.mem_unmap(p, g).unwrap();
        driver.mem_address_free(p, g).unwrap();
        driver.mem_release(h).unwrap();
        driver.mem_free(d as i32, plain[d]).unwrap();
    }
    for p in mem {
        ctx.memory.free(&ctx, p).unwrap();
    }
    team.destroy().unwrap();
    assert_clean(&ctx);
}

#[test]
fn registration_rules_multicast() {
    registration_rules(true);
}

#[test]
fn registration_rules_p2p() {
    registration_rules(false);
}

/// Context destroy with the team, the registered buffer and the memory all alive: everything
/// is released (and reported), in the right order.
#[test]
fn context_destroy_with_registered_memory_alive() {
    for multicast in [true, false] {
        let ctx = context(multicast);
        let team = Team::create(&ctx, &[0, 1, 2]).unwrap();
        let mem: Vec<DevicePtr> = (0..3).map(|d| ctx.memory.alloc(&ctx, d, 3 * MIB).unwrap()).collect();
        let _buf = Buffer::register(&team, &mem, 3 * MIB).unwrap();
        let report = ctx.shutdown();
        assert!(report.contains("mcast_mem_alloc allocation(s) were not freed"), "{report}");
        let ledger = ctx.driver().as_sim().unwrap().ledger();
        assert!(ledger.is_empty(), "{ledger}");
        assert!(ctx.resources.is_empty(), "{}", ctx.resources.report());
    }
}

/// mcast_mem_alloc: granularity-aligned, retried and rolled back on out-of-memory.
#[test]
fn mem_alloc_rules_and_out_of_memory() {
    let ctx = context(true);
    let p = ctx.memory.alloc(&ctx, 3, 100).unwrap();
    assert_eq!(p % (2 * MIB) as u64, 0);
    assert_eq!(ctx.driver().pointer_device(p).unwrap(), 3);
    assert_eq!(ctx.memory.alloc(&ctx, 4, 100).unwrap_err().kind, ErrorKind::InvalidArgument);
    assert_eq!(ctx.memory.alloc(&ctx, 0, 0).unwrap_err().kind, ErrorKind::InvalidArgument);
    let e = ctx.memory.alloc(&ctx, 0, 300 * MIB).unwrap_err();
    assert_eq!(e.kind, ErrorKind::OutOfMemory, "{e}");
    assert_eq!(ctx.memory.live(), 1);
    ctx.memory.free(&ctx, p).unwrap();
    assert_eq!(ctx.memory.free(&ctx, p).unwrap_err().kind, ErrorKind::InvalidArgument, "freed twice");
    ctx.memory.free(&ctx, 0).unwrap();
    assert_clean(&ctx);
}

/// A device that reports fabric support but refuses fabric allocations (no IMEX channel:
/// `cuMemCreate` gives NOT_PERMITTED, seen on 2 x H200) still gets memory, with POSIX
/// descriptors only; any other failure is not retried that way.
#[test]
fn mem_alloc_without_fabric_handles_falls_back_to_posix_descriptors() {
    let ctx = context(true);
    let sim = ctx.driver().as_sim().expect("the simulator");
    sim.inject("cuMemCreate", mcast::driver::CuResult::ERROR_NOT_PERMITTED, 1, Some(1));
    let p = ctx.memory.alloc(&ctx, 1, 100).unwrap();
    assert_eq!(ctx.memory.live(), 1);
    ctx.memory.free(&ctx, p).unwrap();
    sim.inject("cuMemCreate", mcast::driver::CuResult::ERROR_INVALID_VALUE, 1, Some(1));
    let e = ctx.memory.alloc(&ctx, 1, 100).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Driver, "{e}");
    assert_clean(&ctx);
}

/// The pointer form on plain device memory (`cudaMalloc`-style): all-reduce in and out of
/// place, chunked past the scratch, every dtype's alignment, teams of 1-4 on both transports.
#[test]
fn team_all_reduce_on_plain_device_memory() {
    for multicast in [true, false] {
        let ctx = context(multicast);
        let driver = ctx.driver().clone();
        for n in 1..=4usize {
            let team = Team::create(&ctx, &(0..n as i32).collect::<Vec<_>>()).unwrap();
            for (dtype, count) in
                [(DType::F32, 1usize), (DType::I32, 37), (DType::BF16, 1001), (DType::F64, 3 * MIB / 8 + 3)]
            {
                let es = dtype.size();
                let send: Vec<DevicePtr> = (0..n).map(|d| driver.mem_alloc(d as i32, count * es).unwrap()).collect();
                let recv: Vec<DevicePtr> = (0..n).map(|d| driver.mem_alloc(d as i32, count * es).unwrap()).collect();
                let value = |r: usize, i: usize| ((r + 1) * (i % 7)) as f64;
                for (r, &p) in send.iter().enumerate() {
                    for i in 0..count {
                        // SAFETY: simulated device memory is host memory of `count * es` bytes.
                        unsafe {
                            match dtype {
                                DType::F32 => *(p as *mut f32).add(i) = value(r, i) as f32,
                                DType::I32 => *(p as *mut i32).add(i) = value(r, i) as i32,
                                DType::BF16 => *(p as *mut u16).add(i) = half::bf16::from_f64(value(r, i)).to_bits(),
                                _ => *(p as *mut f64).add(i) = value(r, i),
                            }
                        }
                    }
                }
                let sum = Collective::AllReduce { dtype, op: RedOp::Sum };
                let s = Stream::DEFAULT;
                for in_place in [false, true] {
                    for r in 0..n {
                        let dst = if in_place { send[r] } else { recv[r] };
                        run_ptr(&team, r as i32, send[r], dst, count, sum, s).unwrap();
                    }
                    for r in 0..n as i32 {
                        synchronize(&team, r, s).unwrap();
                    }
                    let tri = (n * (n + 1) / 2) as f64;
                    for r in 0..n {
                        let p = if in_place { send[r] } else { recv[r] };
                        for i in [0, count / 2, count - 1] {
                            // SAFETY: as above.
                            let got = unsafe {
                                match dtype {
                                    DType::F32 => *(p as *const f32).add(i) as f64,
                                    DType::I32 => *(p as *const i32).add(i) as f64,
                                    DType::BF16 => half::bf16::from_bits(*(p as *const u16).add(i)).to_f64(),
                                    _ => *(p as *const f64).add(i),
                                }
                            };
                            let want = (i % 7) as f64 * tri;
                            assert_eq!(
                                got, want,
                                "{dtype:?} x {count} team of {n} rank {r} element {i} in place {in_place}"
                            );
                        }
                    }
                }
                for (d, p) in send.into_iter().chain(recv).enumerate() {
                    driver.mem_free((d % n) as i32, p).unwrap();
                }
            }
            team.destroy().unwrap();
        }
        assert_clean(&ctx);
    }
}

/// The pointer form on registered memory runs zero-copy for all four collectives, in and out of
/// place; the rules give their status (plain memory: tests/pointer_form.rs).
#[test]
fn team_collectives_on_registered_pointers_and_rules() {
    for multicast in [true, false] {
        let ctx = context(multicast);
        let n = 3;
        let team = Team::create(&ctx, &[0, 1, 2]).unwrap();
        let bytes = 3 * 4096;
        let mem: Vec<DevicePtr> = (0..n).map(|d| ctx.memory.alloc(&ctx, d as i32, 2 * bytes).unwrap()).collect();
        let buf = Buffer::register(&team, &mem, 2 * bytes).unwrap();
        let s = Stream::DEFAULT;
        let fill = |r: usize, off: usize, len: usize, v: u8| {
            // SAFETY: simulated device memory is host memory.
            unsafe { std::ptr::write_bytes((mem[r] + off as u64) as *mut u8, v, len) };
        };
        let byte = |r: usize, off: usize| unsafe { *((mem[r] + off as u64) as *const u8) };
        // All-gather, out of place: send at bytes + 0, recv at 0.
        for r in 0..n {
            fill(r, bytes, 4096, r as u8 + 10);
        }
        for r in 0..n {
            run_ptr(&team, r as i32, mem[r] + bytes as u64, mem[r], 4096, Collective::AllGather, s).unwrap();
        }
        for r in 0..n as i32 {
            synchronize(&team, r, s).unwrap();
        }
        for r in 0..n {
            for q in 0..n {
                assert_eq!(byte(r, q * 4096 + 7), q as u8 + 10);
            }
        }
        // Broadcast in place from rank 2, reduce-scatter in NCCL's in-place form.
        fill(2, 0, 100, 77);
        for r in 0..n {
            run_ptr(&team, r as i32, mem[r], mem[r], 100, Collective::Broadcast { root: 2 }, s).unwrap();
        }
        // The broadcast is done before the host overwrites its range (a late write of 77 would
        // turn the reduce-scatter's 3 into 155).
        for r in 0..n as i32 {
            synchronize(&team, r, s).unwrap();
        }
        for r in 0..n {
            fill(r, 0, bytes, 1);
        }
        let rs = Collective::ReduceScatter { dtype: DType::U32, op: RedOp::Sum };
        for r in 0..n {
            run_ptr(&team, r as i32, mem[r], mem[r] + (r * 4096) as u64, 1024, rs, s).unwrap();
        }
        for r in 0..n as i32 {
            synchronize(&team, r, s).unwrap();
        }
        for r in 0..n {
            assert_eq!(byte(r, r * 4096), 3, "reduce-scatter rank {r}");
        }
        // bf16 in NCCL's in-place form with an odd count: rank 1's recv is 2 bytes mod 4, and
        // element-aligned registered pointers run zero-copy as plain ones do.
        let count = 1001usize;
        let bf = |v: f32| half::bf16::from_f32(v).to_bits();
        for r in 0..n {
            for i in 0..n * count {
                // SAFETY: simulated device memory is host memory; n * count * 2 < bytes.
                unsafe { *((mem[r] + 2 * i as u64) as *mut u16) = bf((r + i % 5) as f32) };
            }
        }
        let rs16 = Collective::ReduceScatter { dtype: DType::BF16, op: RedOp::Sum };
        for r in 0..n {
            run_ptr(&team, r as i32, mem[r], mem[r] + (2 * r * count) as u64, count, rs16, s).unwrap();
        }
        for r in 0..n as i32 {
            synchronize(&team, r, s).unwrap();
        }
        for r in 0..n {
            for i in 0..count {
                // SAFETY: as above.
                let got = unsafe { *((mem[r] + (2 * (r * count + i)) as u64) as *const u16) };
                let want = bf((0..n).map(|q| (q + (r * count + i) % 5) as f32).sum());
                assert_eq!(got, want, "bf16 reduce-scatter rank {r} element {i}");
            }
        }
        // Rules.
        let bad = |res: mcast::runtime::Result<()>, kind: ErrorKind, says: &str| {
            let e = res.unwrap_err();
            assert_eq!(e.kind, kind, "{e}");
            assert!(e.message.contains(says), "{says}: {e}");
        };
        let ar = Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum };
        bad(run_ptr(&team, 0, 0, mem[0], 4, ar, s), ErrorKind::InvalidArgument, "send is NULL");
        bad(run_ptr(&team, 0, mem[0], mem[0] + 2, 4, ar, s), ErrorKind::InvalidArgument, "multiple of 4");
        let bf16 = Collective::AllReduce { dtype: DType::BF16, op: RedOp::Sum };
        bad(run_ptr(&team, 0, mem[0], mem[0] + 1001, 4, bf16, s), ErrorKind::InvalidArgument, "multiple of 2");
        bad(run_ptr(&team, 0, mem[0], mem[0] + 4, 4, ar, s), ErrorKind::InvalidArgument, "overlap");
        bad(run_ptr(&team, 0, mem[1], mem[1], 4, ar, s), ErrorKind::InvalidArgument, "device 1, but rank 0");
        let host = [0u64; 8];
        bad(run_ptr(&team, 0, host.as_ptr() as u64, mem[0], 4, ar, s), ErrorKind::InvalidArgument, "not device memory");
        bad(run_ptr(&team, 3, mem[0], mem[0], 4, ar, s), ErrorKind::InvalidArgument, "rank");
        // Count 0: a no-op after the rank check, whatever the pointers.
        run_ptr(&team, 0, 0, 0, 0, ar, s).unwrap();
        buf.free().unwrap();
        for p in mem {
            ctx.memory.free(&ctx, p).unwrap();
        }
        team.destroy().unwrap();
        assert_clean(&ctx);
    }
}
