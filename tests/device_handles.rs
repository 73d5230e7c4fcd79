//! The host side of the device API on the simulator: the handles of `mcast_team_device_handle`
//! and `mcast_buffer_device_handle` hold what `mcast_buffer_local_ptr` / `peer_ptr` /
//! `multicast_ptr` report and where the team's device-API slots lie (zeroed, apart from the
//! library's own state); bad arguments get their statuses and leave the out-struct untouched; an
//! error recorded by a device-API call is what `mcast_team_get_error` reports.

mod common;

use std::ffi::c_void;
use std::mem::size_of;

use common::*;
use mcast::capi::buffer::*;
use mcast::capi::context::*;
use mcast::capi::device_api::*;
use mcast::capi::status::McastStatus::*;
use mcast::capi::team::*;
use mcast::kernels::abi::{
    device_bytes, team_reserved_bytes, DEVICE_INFO, DOORBELL_OFFSET, ERROR_INFO_OFFSET, ERROR_WORD_OFFSET, ERR_INVALID,
    ERR_TIMEOUT, SYNC_USED_BYTES,
};
use mcast::runtime::handles;

fn team_handle(team: mcast_team_t, rank: i32) -> Result<mcast_dev_team_t, mcast::capi::mcast_status_t> {
    let mut h = mcast_dev_team_t { struct_size: size_of::<mcast_dev_team_t>() as u32, ..Default::default() };
    // SAFETY: a valid out-pointer with its struct_size set.
    let s = unsafe { mcast_team_device_handle(team, rank, &mut h) };
    if s == OK {
        Ok(h)
    } else {
        Err(s)
    }
}

fn buffer_handle(buf: mcast_buffer_t, rank: i32) -> Result<mcast_dev_buffer_t, mcast::capi::mcast_status_t> {
    let mut h = mcast_dev_buffer_t { struct_size: size_of::<mcast_dev_buffer_t>() as u32, ..Default::default() };
    // SAFETY: as above.
    let s = unsafe { mcast_buffer_device_handle(buf, rank, &mut h) };
    if s == OK {
        Ok(h)
    } else {
        Err(s)
    }
}

fn ptr(f: impl FnOnce(*mut *mut c_void) -> mcast::capi::mcast_status_t) -> u64 {
    let mut p = std::ptr::null_mut();
    assert_eq!(f(&mut p), OK, "{}", last_error());
    p as u64
}

#[test]
fn handles_hold_the_buffer_pointers_and_the_team_slots() {
    for multicast in [true, false] {
        let (ctx, _c) = context(&sim_config(3, |c| {
            if !multicast {
                c.multicast = mcast::capi::config::mcast_multicast_t(
                    mcast::capi::config::McastMulticast::MCAST_MULTICAST_OFF as u32,
                );
            }
        }));
        let team = team_create(ctx, &[0, 1, 2]).unwrap();
        let buf = alloc(team, 3000).unwrap();
        let any = handles::team(team.id).unwrap();
        let t = any.inner();
        for rank in 0..3 {
            let h = team_handle(team, rank).unwrap();
            assert_eq!((h.struct_size, h.version, h.rank, h.nranks, h.nslots), (128, 1, rank, 3, 256));
            assert_eq!(h.flags & DEV_FLAG_MULTICAST != 0, multicast, "multicast {multicast}");
            assert_eq!(h.sync_mc != 0, multicast);
            assert_eq!(h.timeout_ns, 30_000 * 1_000_000);
            for p in 0..3 {
                assert_eq!(
                    h.sync_peer0 + p as u64 * h.sync_stride,
                    t.sync_base(rank as usize, p),
                    "rank {rank} peer {p}"
                );
            }
            // The device-API slots lie after everything the library's own kernels use, inside the
            // first segment, and start zeroed.
            assert!(h.dev_offset as usize >= team_reserved_bytes(3, t.ll(), 0));
            assert!(h.dev_offset as usize > SYNC_USED_BYTES);
            let own = h.sync_peer0 + rank as u64 * h.sync_stride + h.dev_offset;
            // SAFETY: on the simulator device pointers are host pointers into mapped memory; the
            // team reserved device_bytes there.
            let slots = unsafe { std::slice::from_raw_parts(own as *const u8, device_bytes(3, 256)) };
            assert!(slots.iter().all(|&b| b == 0), "rank {rank}: device slots not zeroed");

            let b = buffer_handle(buf, rank).unwrap();
            assert_eq!((b.struct_size, b.version, b.rank, b.nranks, b.bytes), (128, 1, rank, 3, 3000));
            // SAFETY (all three): valid out-pointers.
            assert_eq!(b.local, ptr(|p| unsafe { mcast_buffer_local_ptr(buf, rank, p) }));
            for p in 0..3 {
                let want = ptr(|o| unsafe { mcast_buffer_peer_ptr(buf, rank, p, o) });
                assert_eq!(b.peer0 + p as u64 * b.peer_stride, want, "rank {rank} peer {p}");
            }
            if multicast {
                assert_eq!(b.mc, ptr(|o| unsafe { mcast_buffer_multicast_ptr(buf, rank, o) }));
            } else {
                assert_eq!(b.mc, 0);
            }
            assert_eq!(b.sync, t.sync_base(rank as usize, rank as usize));
            assert_eq!(b.reserved, [0; 8]);
        }
        assert_eq!(mcast_buffer_free(buf), OK);
        assert_eq!(mcast_team_destroy(team), OK);
        assert_eq!(mcast_context_destroy(ctx), OK);
    }
}

#[test]
fn bad_arguments_get_their_status_and_leave_out_untouched() {
    let (ctx, _c) = context(&sim_config(2, |_| {}));
    let team = team_create(ctx, &[0, 1]).unwrap();
    let buf = alloc(team, 64).unwrap();
    let invalid = st(MCAST_ERROR_INVALID_ARGUMENT);
    // SAFETY: NULL out-pointers are the errors under test.
    unsafe {
        assert_eq!(mcast_team_device_handle(team, 0, std::ptr::null_mut()), invalid);
        assert!(last_error().contains("out is NULL"), "{}", last_error());
        assert_eq!(mcast_buffer_device_handle(buf, 0, std::ptr::null_mut()), invalid);
        assert!(last_error().contains("out is NULL"), "{}", last_error());
    }
    for (rank, size, want, says) in [
        (2, 128, invalid, "rank 2"),
        (-1, 128, invalid, "rank -1"),
        (0, 64, invalid, "struct_size"),
        (0, 0, invalid, "struct_size"),
    ] {
        let mut h = mcast_dev_team_t { struct_size: size, nslots: 77, ..Default::default() };
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { mcast_team_device_handle(team, rank, &mut h) }, want);
        assert!(last_error().contains(says), "{}", last_error());
        assert_eq!((h.struct_size, h.nslots), (size, 77), "out touched on error");
        let mut b = mcast_dev_buffer_t { struct_size: size, bytes: 77, ..Default::default() };
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { mcast_buffer_device_handle(buf, rank, &mut b) }, want);
        assert!(last_error().contains(says), "{}", last_error());
        assert_eq!((b.struct_size, b.bytes), (size, 77), "out touched on error");
    }
    assert_eq!(mcast_buffer_free(buf), OK);
    assert_eq!(buffer_handle(buf, 0).unwrap_err(), st(MCAST_ERROR_INVALID_HANDLE));
    assert_eq!(team_handle(mcast_team_t { id: 0 }, 0).unwrap_err(), st(MCAST_ERROR_INVALID_HANDLE));
    assert_eq!(mcast_team_destroy(team), OK);
    assert_eq!(team_handle(team, 0).unwrap_err(), st(MCAST_ERROR_INVALID_HANDLE));
    assert_eq!(mcast_context_destroy(ctx), OK);
}

/// What a kernel's failing device-API call leaves in the error word (written here by hand, as the
/// simulator runs no device code, with the doorbell rung after it as `mcast_dev__record` does)
/// is the team's error: `mcast_team_get_error` reports it.
#[test]
fn a_device_api_error_is_the_team_error() {
    for (code, info, want) in [
        (ERR_INVALID, DEVICE_INFO | (3 << 24) | 300, MCAST_ERROR_INVALID_ARGUMENT),
        (ERR_TIMEOUT, DEVICE_INFO | (1 << 24) | 5, MCAST_ERROR_TIMEOUT),
    ] {
        let (ctx, _c) = context(&sim_config(2, |_| {}));
        let team = team_create(ctx, &[0, 1]).unwrap();
        let h = team_handle(team, 1).unwrap();
        let own = h.sync_peer0 + h.sync_stride;
        // SAFETY: on the simulator device pointers are host pointers; the words are in rank 1's
        // sync region, which no kernel is using.
        unsafe {
            *((own + ERROR_INFO_OFFSET as u64) as *mut u32) = info;
            *((own + ERROR_WORD_OFFSET as u64) as *mut u32) = code;
            let bell = *((own + DOORBELL_OFFSET as u64) as *const u64);
            assert_ne!(bell, 0, "every rank's sync region holds its team's doorbell");
            (*(bell as *const std::sync::atomic::AtomicU32)).store(1, std::sync::atomic::Ordering::SeqCst);
        }
        let mut e = mcast::capi::mcast_status_t(0);
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { mcast_team_get_error(team, &mut e) }, OK);
        assert_eq!(e, st(want), "code {code}");
        assert_eq!(mcast_team_destroy(team), OK);
        assert_eq!(mcast_context_destroy(ctx), OK);
    }
}

/// `MCAST_DEVICE_SLOTS` (the config field behind it) sets the slots a team reserves.
#[test]
fn the_slot_count_comes_from_the_config() {
    use mcast::runtime::team::Team;
    let cfg = mcast::runtime::config::Config { device_slots: 1000, ..sim_runtime(true, 2, 1000) };
    let ctx = runtime_context(cfg);
    let team = Team::create(ctx.env(), &[0, 1]).unwrap();
    let v = team.device_view(0).unwrap();
    assert_eq!(v.nslots, 1000);
    assert_eq!(v.timeout_ns, 1_000_000_000);
    let own = v.sync_peer0 + v.dev_offset;
    // SAFETY: as above: host pointers on the simulator, device_bytes reserved there.
    let slots = unsafe { std::slice::from_raw_parts(own as *const u8, device_bytes(2, 1000)) };
    assert!(slots.iter().all(|&b| b == 0));
    team.destroy().unwrap();
    assert_clean(&ctx);
}

/// Registered memory whose ranks' copies lie at different offsets of their allocations is not
/// evenly spaced in the peer mapping (with three ranks or more): the buffer handle is refused
/// with NOT_SUPPORTED naming the rank (the device API finds peers by base + rank * stride); at
/// equal offsets it is served.
#[test]
fn registered_memory_at_different_offsets_is_not_supported() {
    use mcast::capi::memory::{mcast_mem_alloc, mcast_mem_free};
    let (ctx, _c) = context(&sim_config(3, |c| {
        c.multicast =
            mcast::capi::config::mcast_multicast_t(mcast::capi::config::McastMulticast::MCAST_MULTICAST_OFF as u32);
    }));
    let team = team_create(ctx, &[0, 1, 2]).unwrap();
    let mut mem = [std::ptr::null_mut::<c_void>(); 3];
    for (d, m) in mem.iter_mut().enumerate() {
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { mcast_mem_alloc(ctx, d as i32, 4 << 20, m) }, OK, "{}", last_error());
    }
    for (skews, ok) in [([4096usize, 4096, 4096], true), ([4096, 0, 4096], false)] {
        // SAFETY: pointers inside the allocations just made.
        let ptrs: Vec<*mut c_void> =
            (0..3).map(|r| unsafe { mem[r].cast::<u8>().add(skews[r]).cast::<c_void>() }).collect();
        let mut buf = mcast_buffer_t { id: 0 };
        // SAFETY: valid pointers.
        assert_eq!(unsafe { mcast_buffer_register(team, ptrs.as_ptr(), 65536, &mut buf) }, OK, "{}", last_error());
        let got = buffer_handle(buf, 0);
        if ok {
            let h = got.unwrap();
            // SAFETY: a valid out-pointer.
            assert_eq!(h.peer0 + 2 * h.peer_stride, ptr(|o| unsafe { mcast_buffer_peer_ptr(buf, 0, 2, o) }));
        } else {
            assert_eq!(got.unwrap_err(), st(MCAST_ERROR_NOT_SUPPORTED));
            assert!(last_error().contains("rank 2"), "{}", last_error());
        }
        assert_eq!(mcast_buffer_free(buf), OK);
    }
    for m in mem {
        assert_eq!(mcast_mem_free(ctx, m), OK);
    }
    assert_eq!(mcast_team_destroy(team), OK);
    assert_eq!(mcast_context_destroy(ctx), OK);
}
