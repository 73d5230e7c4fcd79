//! Point-to-point communication: `ncclSend`, `ncclRecv` (forwarded).

use std::ffi::{c_int, c_void};

use crate::comm;
use crate::types::{ncclDataType_t, ncclResult_t, Outcome};

use super::{check_rank, cudaStream_t, dtype_of, fallback_fn, forward, guard, ncclComm_t, ok};

/// `ncclSend` / `ncclRecv` forwarding.
fn point_to_point(
    name: &'static str,
    buff: usize,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Outcome<ncclResult_t> {
    let c = comm::lookup(comm)?;
    dtype_of(datatype)?;
    check_rank(&c, peer, "peer")?;
    let stream = stream as usize;
    forward(c, name.into(), move |lib, fc| {
        type F =
            unsafe extern "C" fn(*mut c_void, usize, ncclDataType_t, c_int, *mut c_void, cudaStream_t) -> ncclResult_t;
        // SAFETY: NCCL's signatures of ncclSend and ncclRecv have this shape (the buffer's
        // constness aside).
        match unsafe { fallback_fn::<F>(lib, name) } {
            // SAFETY: forwarded as given.
            Ok(f) => unsafe { f(buff as *mut c_void, count, datatype, peer, fc, stream as cudaStream_t) },
            Err(r) => r,
        }
    })?;
    ok()
}

/// `ncclSend`: forwarded.
#[no_mangle]
pub extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard("ncclSend", || point_to_point("ncclSend", sendbuff as usize, count, datatype, peer, comm, stream))
}

/// `ncclRecv`: forwarded.
#[no_mangle]
pub extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    guard("ncclRecv", || point_to_point("ncclRecv", recvbuff as usize, count, datatype, peer, comm, stream))
}
