//! Collective communication: all-reduce, reduce-scatter, all-gather, broadcast (and `ncclBcast`)
//! served by mcast; reduce, gather, scatter and all-to-all forwarded.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use mcast::capi::collective::{
    mcast_dtype_t, mcast_op_t, mcast_stream_t, mcast_team_all_gather, mcast_team_all_reduce, mcast_team_broadcast,
    mcast_team_reduce_scatter,
};
use mcast::capi::status::mcast_status_t;
use mcast::capi::team::mcast_team_t;

use crate::comm::{self, Comm};
use crate::types::{self, check, ncclDataType_t, ncclRedOp_t, ncclResult_t, Failure, Outcome};

use super::{
    check_rank, cudaStream_t, dtype_of, fallback_fn, forward, guard, ncclComm_t, ok, on_fallback, op_of, serve,
};

type ReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclRedOp_t,
    *mut c_void,
    cudaStream_t,
) -> ncclResult_t;

/// Forwards a reduction of NCCL's (send, recv, count, type, op, comm, stream) shape.
#[allow(clippy::too_many_arguments)]
fn forward_reduction(
    c: Arc<Comm>,
    name: &'static str,
    what: String,
    send: usize,
    recv: usize,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    stream: cudaStream_t,
) -> Outcome {
    let stream = stream as usize;
    forward(c, what, move |lib, fc| {
        // SAFETY: NCCL's signature of ncclAllReduce and ncclReduceScatter.
        match unsafe { fallback_fn::<ReduceFn>(lib, name) } {
            // SAFETY: the caller's arguments, forwarded as given.
            Ok(f) => unsafe {
                f(send as *const c_void, recv as *mut c_void, count, datatype, op, fc, stream as cudaStream_t)
            },
            Err(r) => r,
        }
    })
}

/// An mcast reduction of the C ABI's (team, rank, send, recv, count, dtype, op, stream) shape.
type McastReduction = extern "C" fn(
    mcast_team_t,
    c_int,
    *const c_void,
    *mut c_void,
    usize,
    mcast_dtype_t,
    mcast_op_t,
    mcast_stream_t,
) -> mcast_status_t;

/// The body of [`ncclAllReduce`] and [`ncclReduceScatter`] (`name`): `served` (`served_name`) for
/// mcast's types with sum, min and max, forwarded otherwise.
#[allow(clippy::too_many_arguments)]
fn reduction(
    name: &'static str,
    served: McastReduction,
    served_name: &'static str,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard(name, || {
        let c = comm::lookup(comm)?;
        let dt = dtype_of(datatype)?;
        let (op_name, mop) = op_of(op)?;
        let (send, recv) = (sendbuff as usize, recvbuff as usize);
        match (dt.mcast, mop) {
            (Some(d), Some(o)) if !c.whole_fallback_comm() => serve(c, stream, move |c, team, stream| {
                check(
                    served(
                        team,
                        c.rank,
                        send as *const c_void,
                        recv as *mut c_void,
                        count,
                        mcast_dtype_t(d),
                        mcast_op_t(o),
                        stream,
                    ),
                    served_name,
                )
            }),
            _ => forward_reduction(
                c,
                name,
                format!("{name} of {} with {op_name}", dt.name),
                send,
                recv,
                count,
                datatype,
                op,
                stream,
            ),
        }?;
        ok()
    })
}

/// `ncclAllReduce`: served for mcast's types with sum, min and max (`mcast_team_all_reduce`);
/// forwarded otherwise.
#[no_mangle]
pub extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    reduction(
        "ncclAllReduce",
        mcast_team_all_reduce,
        "mcast_team_all_reduce",
        sendbuff,
        recvbuff,
        count,
        datatype,
        op,
        comm,
        stream,
    )
}

/// `ncclReduceScatter`: served like [`ncclAllReduce`]; `recvcount` elements per rank.
#[no_mangle]
pub extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    reduction(
        "ncclReduceScatter",
        mcast_team_reduce_scatter,
        "mcast_team_reduce_scatter",
        sendbuff,
        recvbuff,
        recvcount,
        datatype,
        op,
        comm,
        stream,
    )
}

/// Forwards a call of NCCL's (send, recv, count, type, comm, stream) shape: `ncclAllGather`,
/// `ncclAlltoAll`.
#[allow(clippy::too_many_arguments)]
fn forward_movement(
    c: Arc<Comm>,
    name: &'static str,
    send: usize,
    recv: usize,
    count: usize,
    datatype: ncclDataType_t,
    stream: cudaStream_t,
) -> Outcome {
    type F = unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        *mut c_void,
        cudaStream_t,
    ) -> ncclResult_t;
    let stream = stream as usize;
    forward(c, name.into(), move |lib, fc| {
        // SAFETY: NCCL's signature of `name`.
        match unsafe { fallback_fn::<F>(lib, name) } {
            // SAFETY: the caller's arguments, forwarded as given.
            Ok(f) => unsafe {
                f(send as *const c_void, recv as *mut c_void, count, datatype, fc, stream as cudaStream_t)
            },
            Err(r) => r,
        }
    })
}

/// Forwards a call of NCCL's (send, recv, count, type, root, comm, stream) shape:
/// `ncclBroadcast`, `ncclGather`, `ncclScatter`.
#[allow(clippy::too_many_arguments)]
fn forward_rooted(
    c: Arc<Comm>,
    name: &'static str,
    send: usize,
    recv: usize,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    stream: cudaStream_t,
) -> Outcome {
    type F = unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        c_int,
        *mut c_void,
        cudaStream_t,
    ) -> ncclResult_t;
    let stream = stream as usize;
    forward(c, name.into(), move |lib, fc| {
        // SAFETY: NCCL's signature of `name`.
        match unsafe { fallback_fn::<F>(lib, name) } {
            // SAFETY: the caller's arguments, forwarded as given.
            Ok(f) => unsafe {
                f(send as *const c_void, recv as *mut c_void, count, datatype, root, fc, stream as cudaStream_t)
            },
            Err(r) => r,
        }
    })
}

/// `count` elements of `size` bytes in bytes; `ncclInvalidArgument` naming `what` on overflow.
fn bytes_of(count: usize, size: usize, what: &str) -> Outcome<usize> {
    count.checked_mul(size).ok_or_else(|| Failure::new(types::INVALID_ARGUMENT, format!("{what} {count} overflows")))
}

/// `ncclAllGather`: served for every type (bytes), `sendcount` elements per rank.
#[no_mangle]
pub extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard("ncclAllGather", || {
        let c = comm::lookup(comm)?;
        let dt = dtype_of(datatype)?;
        let bytes = bytes_of(sendcount, dt.size, "sendcount")?;
        let (send, recv) = (sendbuff as usize, recvbuff as usize);
        if c.whole_fallback_comm() {
            forward_movement(c, "ncclAllGather", send, recv, sendcount, datatype, stream)?;
            return ok();
        }
        serve(c, stream, move |c, team, stream| {
            check(
                mcast_team_all_gather(team, c.rank, send as *const c_void, recv as *mut c_void, bytes, stream),
                "mcast_team_all_gather",
            )
        })?;
        ok()
    })
}

/// `ncclBroadcast`: served for every type (bytes).
// The pointers go to the fallback NCCL as given, under its contract (as every NCCL call).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    type F = unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        c_int,
        ncclComm_t,
        cudaStream_t,
    ) -> ncclResult_t;
    // SAFETY: the caller's arguments, as given (NCCL's ncclBcast calls ncclBroadcast).
    if let Some(r) = on_fallback::<F>(comm, "ncclBroadcast", |f| unsafe {
        f(sendbuff, recvbuff, count, datatype, root, comm, stream)
    }) {
        return r;
    }
    guard("ncclBroadcast", || {
        let c = comm::lookup(comm)?;
        let dt = dtype_of(datatype)?;
        check_rank(&c, root, "root")?;
        let bytes = bytes_of(count, dt.size, "count")?;
        let (send, recv) = (sendbuff as usize, recvbuff as usize);
        if c.whole_fallback_comm() {
            forward_rooted(c, "ncclBroadcast", send, recv, count, datatype, root, stream)?;
            return ok();
        }
        serve(c, stream, move |c, team, stream| {
            check(
                mcast_team_broadcast(team, c.rank, root, send as *const c_void, recv as *mut c_void, bytes, stream),
                "mcast_team_broadcast",
            )
        })?;
        ok()
    })
}

/// `ncclBcast`: in-place [`ncclBroadcast`].
#[no_mangle]
pub extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    ncclBroadcast(buff, buff, count, datatype, root, comm, stream)
}

/// `ncclReduce`: forwarded.
#[no_mangle]
pub extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard("ncclReduce", || {
        let c = comm::lookup(comm)?;
        dtype_of(datatype)?;
        op_of(op)?;
        check_rank(&c, root, "root")?;
        let (send, recv, stream) = (sendbuff as usize, recvbuff as usize, stream as usize);
        forward(c, "ncclReduce".into(), move |lib, fc| {
            type F = unsafe extern "C" fn(
                *const c_void,
                *mut c_void,
                usize,
                ncclDataType_t,
                ncclRedOp_t,
                c_int,
                *mut c_void,
                cudaStream_t,
            ) -> ncclResult_t;
            // SAFETY: NCCL's signature.
            match unsafe { fallback_fn::<F>(lib, "ncclReduce") } {
                // SAFETY: forwarded as given.
                Ok(f) => unsafe {
                    f(send as *const c_void, recv as *mut c_void, count, datatype, op, root, fc, stream as cudaStream_t)
                },
                Err(r) => r,
            }
        })?;
        ok()
    })
}

/// Forwards a call of NCCL's (send, recv, count, type, [root,] comm, stream) shape.
macro_rules! forwarded_movement {
    ($(#[$doc:meta])* $name:ident, root) => {
        $(#[$doc])*
        #[no_mangle]
        pub extern "C" fn $name(
            sendbuff: *const c_void,
            recvbuff: *mut c_void,
            count: usize,
            datatype: ncclDataType_t,
            root: c_int,
            comm: ncclComm_t,
            stream: cudaStream_t,
        ) -> ncclResult_t {
            guard(stringify!($name), || {
                let c = comm::lookup(comm)?;
                dtype_of(datatype)?;
                check_rank(&c, root, "root")?;
                forward_rooted(c, stringify!($name), sendbuff as usize, recvbuff as usize, count, datatype, root, stream)?;
                ok()
            })
        }
    };
}

forwarded_movement!(
    /// `ncclGather`: forwarded.
    ncclGather, root
);
forwarded_movement!(
    /// `ncclScatter`: forwarded.
    ncclScatter, root
);

/// `ncclAlltoAll`: forwarded.
#[no_mangle]
pub extern "C" fn ncclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard("ncclAlltoAll", || {
        let c = comm::lookup(comm)?;
        dtype_of(datatype)?;
        forward_movement(c, "ncclAlltoAll", sendbuff as usize, recvbuff as usize, count, datatype, stream)?;
        ok()
    })
}
