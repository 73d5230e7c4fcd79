//! Collectives: called once per rank with that rank's stream, ordered on it, in place on a byte
//! range of a buffer; they return once enqueued, and device-side errors (a timeout) are
//! reported by `mcast_synchronize`. Safe inside CUDA graph capture after a first call has
//! loaded the kernels. Results are bit-identical on every rank.

use std::ffi::{c_int, c_void};

use super::buffer::mcast_buffer_t;
use super::team::mcast_team_t;
use super::{guard, mcast_status_t};
use crate::driver::Stream;
use crate::kernels::{Collective, DType, RedOp};
use crate::runtime::{handles, Error};

/// The CUDA stream type (`cudaStream_t` and `CUstream` are the same type); declared, never
/// defined, so `mcast.h` needs no CUDA header.
#[repr(C)]
pub struct CUstream_st {
    _opaque: [u8; 0],
}

/// A CUDA stream; NULL is the legacy default stream of the rank's device. On the SIM backend
/// any value names a stream (each value runs in order on its own simulated stream).
pub type mcast_stream_t = *mut CUstream_st;

/// Element types.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum McastDtype {
    /// `float`.
    MCAST_FLOAT32 = 0,
    /// `double`.
    MCAST_FLOAT64 = 1,
    /// IEEE 754 half (sums accumulate in float).
    MCAST_FLOAT16 = 2,
    /// bfloat16 (sums accumulate in float).
    MCAST_BFLOAT16 = 3,
    /// `int32_t` (sums wrap).
    MCAST_INT32 = 4,
    /// `uint32_t`.
    MCAST_UINT32 = 5,
    /// `int64_t` (sums wrap).
    MCAST_INT64 = 6,
    /// `uint64_t`.
    MCAST_UINT64 = 7,
}

/// Values of `mcast_dtype_t`, carried as an integer.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct mcast_dtype_t(pub u32);

/// Reduction operators.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum McastOp {
    /// Sum.
    MCAST_SUM = 0,
    /// Minimum (for floats, a NaN operand yields the other, as `fminf`).
    MCAST_MIN = 1,
    /// Maximum (likewise `fmaxf`).
    MCAST_MAX = 2,
}

/// Values of `mcast_op_t`, carried as an integer.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct mcast_op_t(pub u32);

fn reduction(dtype: mcast_dtype_t, op: mcast_op_t) -> Result<(DType, RedOp), Error> {
    let d = DType::from_raw(dtype.0)
        .ok_or_else(|| Error::invalid_argument(format!("dtype = {} is not an mcast_dtype_t", dtype.0)))?;
    let o =
        RedOp::from_raw(op.0).ok_or_else(|| Error::invalid_argument(format!("op = {} is not an mcast_op_t", op.0)))?;
    Ok((d, o))
}

fn run(
    buf: mcast_buffer_t,
    rank: c_int,
    offset: usize,
    count: usize,
    c: Collective,
    stream: mcast_stream_t,
) -> Result<(), Error> {
    handles::buffer(buf.id)?.run(rank, offset, count, c, Stream(stream as usize))
}

#[allow(clippy::too_many_arguments)]
fn run_into(
    send: mcast_buffer_t,
    send_offset: usize,
    recv: mcast_buffer_t,
    recv_offset: usize,
    rank: c_int,
    count: usize,
    c: Collective,
    stream: mcast_stream_t,
) -> Result<(), Error> {
    let s = handles::buffer(send.id)?;
    let r = handles::buffer(recv.id)?;
    s.run_into(send_offset, &r, recv_offset, rank, count, c, Stream(stream as usize))
}

/// Copies root's `[offset, offset + bytes)` of `buf` to every rank. Call once per rank.
/// `bytes` 0 is a no-op once the handle, rank and root are checked and the team has not failed
/// (a failed team's error is returned).
/// `MCAST_ERROR_INVALID_ARGUMENT`: rank or root out of range, range past the end.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn mcast_broadcast(
    buf: mcast_buffer_t,
    rank: c_int,
    root: c_int,
    offset: usize,
    bytes: usize,
    stream: mcast_stream_t,
) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| {
        crate::nvtx::collective_name(
            s,
            "mcast_broadcast",
            handles::buffer_team_id(buf.id),
            rank,
            bytes,
            None,
            Some(root),
        )
    });
    guard("mcast_broadcast", || {
        if root < 0 {
            return Err(Error::invalid_argument(format!("root {root} is negative")));
        }
        run(buf, rank, offset, bytes, Collective::Broadcast { root: root as u32 }, stream)
    })
}

/// Leaves on every rank the element-wise reduction of all ranks' `[offset, offset +
/// count * size)`. `offset` is aligned to the element size (to 4 bytes for 16-bit types).
/// `count` 0 is a no-op once the handle and rank are checked and the team has not failed.
/// `MCAST_ERROR_INVALID_ARGUMENT`: rank out of range, unknown dtype or op, misaligned offset,
/// range past the end. Thread-safe.
#[no_mangle]
pub extern "C" fn mcast_all_reduce(
    buf: mcast_buffer_t,
    rank: c_int,
    offset: usize,
    count: usize,
    dtype: mcast_dtype_t,
    op: mcast_op_t,
    stream: mcast_stream_t,
) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| {
        crate::nvtx::collective_name(
            s,
            "mcast_all_reduce",
            handles::buffer_team_id(buf.id),
            rank,
            count,
            Some((dtype.0, op.0)),
            None,
        )
    });
    guard("mcast_all_reduce", || {
        let (dtype, op) = reduction(dtype, op)?;
        run(buf, rank, offset, count, Collective::AllReduce { dtype, op }, stream)
    })
}

/// Input: `[offset, offset + N * count * esize)` on every rank, seen as N blocks of `count`
/// elements; rank r ends with the reduction of block r over all ranks, in place at
/// `[offset + r * count * esize, + count * esize)` of its own copy (NCCL's in-place
/// convention). Errors as `mcast_all_reduce`. Thread-safe.
#[no_mangle]
pub extern "C" fn mcast_reduce_scatter(
    buf: mcast_buffer_t,
    rank: c_int,
    offset: usize,
    count: usize,
    dtype: mcast_dtype_t,
    op: mcast_op_t,
    stream: mcast_stream_t,
) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| {
        crate::nvtx::collective_name(
            s,
            "mcast_reduce_scatter",
            handles::buffer_team_id(buf.id),
            rank,
            count,
            Some((dtype.0, op.0)),
            None,
        )
    });
    guard("mcast_reduce_scatter", || {
        let (dtype, op) = reduction(dtype, op)?;
        run(buf, rank, offset, count, Collective::ReduceScatter { dtype, op }, stream)
    })
}

/// Rank r contributes `[offset + r * bytes, + bytes)` of its copy; every rank ends with all N
/// blocks. `bytes` 0 is a no-op once the handle and rank are checked and the team has not failed.
/// `MCAST_ERROR_INVALID_ARGUMENT`: rank out of range, range past the end. Thread-safe.
#[no_mangle]
pub extern "C" fn mcast_all_gather(
    buf: mcast_buffer_t,
    rank: c_int,
    offset: usize,
    bytes: usize,
    stream: mcast_stream_t,
) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| {
        crate::nvtx::collective_name(s, "mcast_all_gather", handles::buffer_team_id(buf.id), rank, bytes, None, None)
    });
    guard("mcast_all_gather", || run(buf, rank, offset, bytes, Collective::AllGather, stream))
}

/// Out of place: copies root's `send` `[send_offset, + bytes)` to every rank's `recv`
/// `[recv_offset, + bytes)`. `send` and `recv` are buffers of the same team (allocated or
/// registered; they may be the same buffer). Every rank passes the same offsets. The same
/// buffer with `recv_offset == send_offset` is exactly `mcast_broadcast`; any other overlap of
/// the two ranges is `MCAST_ERROR_INVALID_ARGUMENT`, as are buffers of different teams, a rank
/// or root out of range and ranges past the end. `bytes` 0 is a no-op once the handles, rank
/// and root are checked and the team has not failed. The kernels read `send` and write `recv` directly (no staging copy).
/// Thread-safe.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn mcast_broadcast_into(
    send: mcast_buffer_t,
    send_offset: usize,
    recv: mcast_buffer_t,
    recv_offset: usize,
    rank: c_int,
    root: c_int,
    bytes: usize,
    stream: mcast_stream_t,
) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| {
        crate::nvtx::collective_name(
            s,
            "mcast_broadcast_into",
            handles::buffer_team_id(send.id),
            rank,
            bytes,
            None,
            Some(root),
        )
    });
    guard("mcast_broadcast_into", || {
        if root < 0 {
            return Err(Error::invalid_argument(format!("root {root} is negative")));
        }
        run_into(send, send_offset, recv, recv_offset, rank, bytes, Collective::Broadcast { root: root as u32 }, stream)
    })
}

/// Out of place: every rank's `recv` `[recv_offset, + count * esize)` receives the
/// element-wise reduction over all ranks of `send` `[send_offset, + count * esize)`. Offsets
/// are aligned to the element size (4 bytes for 16-bit types). The same buffer with equal
/// offsets is exactly `mcast_all_reduce`; other rules as `mcast_broadcast_into`. Thread-safe.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn mcast_all_reduce_into(
    send: mcast_buffer_t,
    send_offset: usize,
    recv: mcast_buffer_t,
    recv_offset: usize,
    rank: c_int,
    count: usize,
    dtype: mcast_dtype_t,
    op: mcast_op_t,
    stream: mcast_stream_t,
) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| {
        crate::nvtx::collective_name(
            s,
            "mcast_all_reduce_into",
            handles::buffer_team_id(send.id),
            rank,
            count,
            Some((dtype.0, op.0)),
            None,
        )
    });
    guard("mcast_all_reduce_into", || {
        let (dtype, op) = reduction(dtype, op)?;
        run_into(send, send_offset, recv, recv_offset, rank, count, Collective::AllReduce { dtype, op }, stream)
    })
}

/// Out of place: `send` `[send_offset, + N * count * esize)` holds N blocks of `count`
/// elements on every rank; rank r's `recv` `[recv_offset, + count * esize)` receives the
/// reduction of block r over all ranks. The same buffer with `recv_offset == send_offset + r *
/// count * esize` is exactly `mcast_reduce_scatter`; other rules as `mcast_all_reduce_into`.
/// Thread-safe.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn mcast_reduce_scatter_into(
    send: mcast_buffer_t,
    send_offset: usize,
    recv: mcast_buffer_t,
    recv_offset: usize,
    rank: c_int,
    count: usize,
    dtype: mcast_dtype_t,
    op: mcast_op_t,
    stream: mcast_stream_t,
) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| {
        crate::nvtx::collective_name(
            s,
            "mcast_reduce_scatter_into",
            handles::buffer_team_id(send.id),
            rank,
            count,
            Some((dtype.0, op.0)),
            None,
        )
    });
    guard("mcast_reduce_scatter_into", || {
        let (dtype, op) = reduction(dtype, op)?;
        run_into(send, send_offset, recv, recv_offset, rank, count, Collective::ReduceScatter { dtype, op }, stream)
    })
}

/// Out of place: each rank's `send` `[send_offset, + bytes)` becomes block r of every rank's
/// `recv` `[recv_offset, + N * bytes)`. The same buffer with `send_offset == recv_offset + r *
/// bytes` is exactly `mcast_all_gather`; other rules as `mcast_broadcast_into`. Thread-safe.
#[no_mangle]
pub extern "C" fn mcast_all_gather_into(
    send: mcast_buffer_t,
    send_offset: usize,
    recv: mcast_buffer_t,
    recv_offset: usize,
    rank: c_int,
    bytes: usize,
    stream: mcast_stream_t,
) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| {
        crate::nvtx::collective_name(
            s,
            "mcast_all_gather_into",
            handles::buffer_team_id(send.id),
            rank,
            bytes,
            None,
            None,
        )
    });
    guard("mcast_all_gather_into", || {
        run_into(send, send_offset, recv, recv_offset, rank, bytes, Collective::AllGather, stream)
    })
}

#[allow(clippy::too_many_arguments)]
fn run_ptr(
    team: mcast_team_t,
    rank: c_int,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    c: Collective,
    stream: mcast_stream_t,
) -> Result<(), Error> {
    let t = handles::team(team.id)?;
    t.run_ptr(rank, send as usize as u64, recv as usize as u64, count, c, Stream(stream as usize))
}

/// NCCL's `ncclBroadcast` on device pointers of rank `rank`'s device: root's `send`
/// `[0, bytes)` to every rank's `recv` (`send == recv` in place). Where both ranges lie in
/// registered buffers of the team (`mcast_buffer_register`) it runs zero-copy, as
/// `mcast_broadcast_into`; every rank must then pass registered memory. Plain device memory
/// (`cudaMalloc`): a small message of a team with the LL kernels (teams of 2 to 8 ranks,
/// `MCAST_LL`, on by default) runs them in one launch, without staging; anything else goes through the team's
/// symmetric staging area (1 MiB per rank), in chunks: each chunk is copied in on `stream`
/// (`cuMemcpyDtoDAsync`) and broadcast, the kernel writing `recv` itself on the P2P transport,
/// else a copy-out kernel (neither writes once the collective failed); any size, any
/// alignment, every team size. `send` is read on the root only. `bytes` 0 is a no-op once the
/// handle, rank and root are checked and the team has not failed (a failed team's error is
/// returned).
/// `MCAST_ERROR_INVALID_ARGUMENT`: rank or root out of range, NULL `send`/`recv`, memory that
/// is not device memory of the rank's device, partial overlap of `send` and `recv`.
/// Thread-safe.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn mcast_team_broadcast(
    team: mcast_team_t,
    rank: c_int,
    root: c_int,
    send: *const c_void,
    recv: *mut c_void,
    bytes: usize,
    stream: mcast_stream_t,
) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| {
        crate::nvtx::collective_name(s, "mcast_team_broadcast", Some(team.id), rank, bytes, None, Some(root))
    });
    guard("mcast_team_broadcast", || {
        if root < 0 {
            return Err(Error::invalid_argument(format!("root {root} is negative")));
        }
        run_ptr(team, rank, send, recv, bytes, Collective::Broadcast { root: root as u32 }, stream)
    })
}

/// NCCL's `ncclAllReduce` on device pointers of rank `rank`'s device (`cudaMalloc` memory, a
/// framework's allocator): every rank's `recv` `[0, count * esize)` receives the element-wise
/// reduction over all ranks of `send` (`send == recv` in place). Registered memory of the team
/// runs zero-copy (every rank must then pass registered memory). Plain memory: a small message
/// of a team with the LL kernels runs them in one launch (as `mcast_team_broadcast`); otherwise
/// a team of up to 4 ranks runs the push all-reduce kernel in one launch at any size and alignment (each
/// rank stores its `send` into its peers' scratch step by step and reduces what they stored
/// into its `recv`: the copy-in is fused into the kernel); larger teams go through the staging
/// area (1 MiB per rank, chunked: copy in on `stream`, the in-place kernel of the team's
/// transport, a copy-out kernel). Every size, dtype and operator. `count` 0 is a no-op once the
/// handle and rank are checked and the team has not failed. `MCAST_ERROR_INVALID_ARGUMENT`: rank out of range, unknown dtype or op, NULL
/// `send`/`recv`, pointers not aligned to the element size (element-aligned pointers work for
/// every dtype, as in NCCL: a 16-bit type at 2 bytes too), memory that is not device memory of
/// the rank's device, partial overlap. Thread-safe.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn mcast_team_all_reduce(
    team: mcast_team_t,
    rank: c_int,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: mcast_dtype_t,
    op: mcast_op_t,
    stream: mcast_stream_t,
) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| {
        crate::nvtx::collective_name(
            s,
            "mcast_team_all_reduce",
            Some(team.id),
            rank,
            count,
            Some((dtype.0, op.0)),
            None,
        )
    });
    guard("mcast_team_all_reduce", || {
        let (dtype, op) = reduction(dtype, op)?;
        run_ptr(team, rank, send, recv, count, Collective::AllReduce { dtype, op }, stream)
    })
}

/// NCCL's `ncclReduceScatter` on device pointers: `send` holds N blocks of `count` elements;
/// rank r's `recv` receives the reduction of block r (`recv == send + r * count * esize` in
/// place). Registered memory of the team runs zero-copy as `mcast_reduce_scatter_into`; plain
/// device memory runs the LL kernels for a small message of a team that has them, else, where a
/// block is a multiple of 16 bytes, on a team of up to 4 ranks the push reduce-scatter kernel in
/// one launch at any size and alignment (each
/// rank stores block p of its `send` into rank p's scratch step by step and reduces what its
/// peers stored into its `recv`), else the team's staging area in chunks (a chunk of a message
/// larger than the staging area copies its N blocks one by one). Other rules as
/// `mcast_team_all_reduce`. Thread-safe.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn mcast_team_reduce_scatter(
    team: mcast_team_t,
    rank: c_int,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: mcast_dtype_t,
    op: mcast_op_t,
    stream: mcast_stream_t,
) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| {
        crate::nvtx::collective_name(
            s,
            "mcast_team_reduce_scatter",
            Some(team.id),
            rank,
            count,
            Some((dtype.0, op.0)),
            None,
        )
    });
    guard("mcast_team_reduce_scatter", || {
        let (dtype, op) = reduction(dtype, op)?;
        run_ptr(team, rank, send, recv, count, Collective::ReduceScatter { dtype, op }, stream)
    })
}

/// NCCL's `ncclAllGather` on device pointers: each rank's `send` `[0, bytes)` becomes block r
/// of every rank's `recv` `[0, N * bytes)` (`send == recv + r * bytes` in place). Registered
/// memory of the team runs zero-copy as `mcast_all_gather_into`; plain device memory runs as in
/// `mcast_team_broadcast` (the LL kernels for a small message of a team that has them, else the
/// team's staging area in chunks). Other rules as `mcast_team_broadcast`. Thread-safe.
#[no_mangle]
pub extern "C" fn mcast_team_all_gather(
    team: mcast_team_t,
    rank: c_int,
    send: *const c_void,
    recv: *mut c_void,
    bytes: usize,
    stream: mcast_stream_t,
) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| {
        crate::nvtx::collective_name(s, "mcast_team_all_gather", Some(team.id), rank, bytes, None, None)
    });
    guard("mcast_team_all_gather", || run_ptr(team, rank, send, recv, bytes, Collective::AllGather, stream))
}

/// Waits for rank `rank`'s work on `stream`, then returns the first device-side error of the
/// team: `MCAST_ERROR_TIMEOUT` when a peer did not arrive within `timeout_ms` (in a one-process
/// team the message names the ranks that did not), `MCAST_ERROR_INVALID_ARGUMENT` when the ranks
/// disagreed on a collective's count, dtype, op, root, collective or buffer offsets (found by
/// the kernels at their entry, before any data was written; the message names the field, the
/// values and the ranks) or when another rank's call of a collective this rank had issued was
/// refused (one-process teams: the wait ended at once); on a team across NVLink domains also
/// the status of a failed call of the engine between domains (usually `MCAST_ERROR_DRIVER`).
/// After any of these every later
/// collective and synchronize of the team returns it until the team is destroyed.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn mcast_synchronize(team: mcast_team_t, rank: c_int, stream: mcast_stream_t) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| write!(s, "mcast_synchronize team={:#x} rank={rank}", team.id));
    guard("mcast_synchronize", || handles::team(team.id)?.synchronize(rank, Stream(stream as usize)))
}
