//! `mcast_buffer_t`: symmetric buffers, the same size and layout on every rank.

use std::ffi::{c_int, c_void};

use super::team::mcast_team_t;
use super::{guard, mcast_status_t, out_ptr};
use crate::runtime::{handles, Error};

/// A symmetric buffer. Passed by value; id 0 is never valid.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct mcast_buffer_t {
    /// Opaque id.
    pub id: u64,
}

/// Allocates `bytes` on every rank of `team` (small buffers share the team's segments; the
/// memory is not zeroed). On the MULTICAST transport the buffer is bound to a multicast object
/// and mapped at a multicast address on every rank; every rank also maps every peer's copy.
/// On success `*out` holds the buffer, freed with `mcast_buffer_free`; on failure nothing is
/// left allocated. `MCAST_ERROR_INVALID_ARGUMENT`: `out` NULL or `bytes` 0;
/// `MCAST_ERROR_OUT_OF_MEMORY`: memory or multicast objects exhausted after the retry policy.
/// Thread-safe.
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn mcast_buffer_alloc(
    team: mcast_team_t,
    bytes: usize,
    out: *mut mcast_buffer_t,
) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| write!(s, "mcast_buffer_alloc bytes={bytes} team={:#x}", team.id));
    guard("mcast_buffer_alloc", || {
        // SAFETY: the caller passes NULL or a valid pointer.
        let out = unsafe { out_ptr(out, "out") }?;
        let buf = handles::team(team.id)?.alloc(bytes)?;
        *out = mcast_buffer_t { id: handles::insert_buffer(buf) };
        Ok(())
    })
}

/// Makes a symmetric buffer of memory the caller owns: `ptrs[i]` is the memory of the i-th
/// rank this process holds, in rank order (every rank for `mcast_team_create` teams, the one
/// rank for `mcast_team_init_rank`/`mcast_team_init_oob` teams), each `bytes` long, device
/// memory of that rank's device. On the MULTICAST transport each pointer is bound to a new
/// multicast object with `cuMulticastBindAddr`; on P2P (and on MULTICAST too) every rank's
/// allocation is mapped on every rank's device. With one rank per process the call is
/// collective, in the same order as `mcast_buffer_alloc`: each process's allocation travels to
/// its peers as the team's handle type (a fabric handle where every rank can export one, and
/// always across hosts; else a POSIX file descriptor between processes of one host;
/// `MCAST_HANDLE_TYPE` forces one), and a rule broken on any rank is the same error on every
/// rank, naming that rank. The buffer is used like any other (collectives, `_into` forms, read/write, pointers:
/// the local pointer aliases `ptrs[rank]`) and freed with `mcast_buffer_free`, which unbinds
/// and unmaps but leaves the memory to its owner. Memory from `mcast_mem_alloc` always
/// registers. `MCAST_ERROR_NOT_SUPPORTED`, naming the rule: memory not from `cuMemCreate` (for
/// example `cudaMalloc` memory), a pointer not aligned to the multicast granularity on
/// MULTICAST, a range (rounded to the granularity) past its allocation, with one rank per
/// process an allocation made without the team's shareable handle type.
/// `MCAST_ERROR_INVALID_ARGUMENT`: `ptrs` or `out` NULL, a NULL pointer, `bytes` 0, memory that
/// is not device memory of the rank's device, a range overlapping a live registration. On
/// failure nothing is left. Thread-safe.
///
/// # Safety
/// `ptrs` must be NULL or valid for reads of one pointer per rank this process holds; `out`
/// NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn mcast_buffer_register(
    team: mcast_team_t,
    ptrs: *const *mut c_void,
    bytes: usize,
    out: *mut mcast_buffer_t,
) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| write!(s, "mcast_buffer_register bytes={bytes} team={:#x}", team.id));
    guard("mcast_buffer_register", || {
        // SAFETY: the caller passes NULL or a valid pointer.
        let out = unsafe { out_ptr(out, "out") }?;
        let t = handles::team(team.id)?;
        if ptrs.is_null() {
            return Err(Error::invalid_argument("ptrs is NULL"));
        }
        let n = t.held();
        // SAFETY: the caller passes one pointer per rank this process holds.
        let ptrs: Vec<u64> =
            unsafe { std::slice::from_raw_parts(ptrs, n) }.iter().map(|&p| p as usize as u64).collect();
        let buf = t.register(&ptrs, bytes)?;
        *out = mcast_buffer_t { id: handles::insert_buffer(buf) };
        Ok(())
    })
}

/// Frees a buffer; its pointers become invalid. A registered buffer is unbound and unmapped,
/// and its memory stays with its owner. The zero handle is a no-op returning
/// `MCAST_SUCCESS`; a freed or unknown handle gives `MCAST_ERROR_INVALID_HANDLE`. Thread-safe.
#[no_mangle]
pub extern "C" fn mcast_buffer_free(buf: mcast_buffer_t) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| write!(s, "mcast_buffer_free buffer={:#x}", buf.id));
    guard("mcast_buffer_free", || if buf.id == 0 { Ok(()) } else { handles::free_buffer(buf.id) })
}

/// Writes the size `buf` was allocated with into `*bytes`. Thread-safe.
///
/// # Safety
/// `bytes` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn mcast_buffer_size(buf: mcast_buffer_t, bytes: *mut usize) -> mcast_status_t {
    guard("mcast_buffer_size", || {
        // SAFETY: the caller passes NULL or a valid pointer.
        let out = unsafe { out_ptr(bytes, "bytes") }?;
        *out = handles::buffer(buf.id)?.size();
        Ok(())
    })
}

/// Writes the address of rank `rank`'s copy, valid on that rank's device (a host address on the
/// SIM backend), into `*ptr`. `MCAST_ERROR_INVALID_ARGUMENT`: `ptr` NULL or `rank` out of range.
/// Thread-safe.
///
/// # Safety
/// `ptr` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn mcast_buffer_local_ptr(
    buf: mcast_buffer_t,
    rank: c_int,
    ptr: *mut *mut c_void,
) -> mcast_status_t {
    guard("mcast_buffer_local_ptr", || {
        // SAFETY: the caller passes NULL or a valid pointer.
        let out = unsafe { out_ptr(ptr, "ptr") }?;
        let b = handles::buffer(buf.id)?;
        *out = b.local_ptr(rank)? as *mut c_void;
        Ok(())
    })
}

/// Writes the address of rank `peer`'s copy as mapped on rank `rank`'s device into `*ptr`.
/// `MCAST_ERROR_INVALID_ARGUMENT`: `ptr` NULL, `rank` or `peer` out of range. Thread-safe.
///
/// # Safety
/// `ptr` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn mcast_buffer_peer_ptr(
    buf: mcast_buffer_t,
    rank: c_int,
    peer: c_int,
    ptr: *mut *mut c_void,
) -> mcast_status_t {
    guard("mcast_buffer_peer_ptr", || {
        // SAFETY: the caller passes NULL or a valid pointer.
        let out = unsafe { out_ptr(ptr, "ptr") }?;
        let b = handles::buffer(buf.id)?;
        *out = b.peer_ptr(rank, peer)? as *mut c_void;
        Ok(())
    })
}

/// Writes the multicast address of `buf` on rank `rank`'s device into `*ptr`: only
/// `multimem` instructions may use it. `MCAST_ERROR_NOT_SUPPORTED` on a P2P team.
/// Thread-safe.
///
/// # Safety
/// `ptr` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn mcast_buffer_multicast_ptr(
    buf: mcast_buffer_t,
    rank: c_int,
    ptr: *mut *mut c_void,
) -> mcast_status_t {
    guard("mcast_buffer_multicast_ptr", || {
        // SAFETY: the caller passes NULL or a valid pointer.
        let out = unsafe { out_ptr(ptr, "ptr") }?;
        let b = handles::buffer(buf.id)?;
        *out = b.multicast_ptr(rank)? as *mut c_void;
        Ok(())
    })
}

/// Copies `bytes` from host memory `src` into rank `rank`'s copy at `offset`, synchronously,
/// on any backend. `MCAST_ERROR_INVALID_ARGUMENT`: `src` NULL with `bytes` > 0, `rank` out of
/// range, or the range past the end. Thread-safe.
///
/// # Safety
/// `src` must be NULL or valid for reading `bytes` bytes.
#[no_mangle]
pub unsafe extern "C" fn mcast_buffer_write(
    buf: mcast_buffer_t,
    rank: c_int,
    offset: usize,
    src: *const c_void,
    bytes: usize,
) -> mcast_status_t {
    guard("mcast_buffer_write", || {
        let b = handles::buffer(buf.id)?;
        if src.is_null() && bytes > 0 {
            return Err(Error::invalid_argument("src is NULL"));
        }
        let data: &[u8] = if bytes == 0 {
            &[]
        } else {
            // SAFETY: the caller guarantees `bytes` readable bytes at `src`.
            unsafe { std::slice::from_raw_parts(src.cast::<u8>(), bytes) }
        };
        b.write(rank, offset, data)
    })
}

/// Copies `bytes` from rank `rank`'s copy at `offset` into host memory `dst`, synchronously,
/// on any backend. `MCAST_ERROR_INVALID_ARGUMENT`: `dst` NULL with `bytes` > 0, `rank` out of
/// range, or the range past the end. Thread-safe.
///
/// # Safety
/// `dst` must be NULL or valid for writing `bytes` bytes.
#[no_mangle]
pub unsafe extern "C" fn mcast_buffer_read(
    buf: mcast_buffer_t,
    rank: c_int,
    offset: usize,
    dst: *mut c_void,
    bytes: usize,
) -> mcast_status_t {
    guard("mcast_buffer_read", || {
        let b = handles::buffer(buf.id)?;
        if dst.is_null() && bytes > 0 {
            return Err(Error::invalid_argument("dst is NULL"));
        }
        let data: &mut [u8] = if bytes == 0 {
            &mut []
        } else {
            // SAFETY: the caller guarantees `bytes` writable bytes at `dst`.
            unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), bytes) }
        };
        b.read(rank, offset, data)
    })
}
