//! User-defined reduction operators: `ncclRedOpCreatePreMulSum`, `ncclRedOpDestroy` (forwarded).

use std::ffi::{c_int, c_void};

use crate::comm;
use crate::types::{ncclDataType_t, ncclRedOp_t, ncclResult_t};

use super::{dtype_of, fallback_fn, forward, guard, ncclComm_t, ok, out};

/// `ncclRedOpCreatePreMulSum`: forwarded to the fallback NCCL (made on its communicator).
#[no_mangle]
pub extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut ncclRedOp_t,
    scalar: *mut c_void,
    datatype: ncclDataType_t,
    residence: c_int,
    comm: ncclComm_t,
) -> ncclResult_t {
    guard("ncclRedOpCreatePreMulSum", || {
        let c = comm::lookup(comm)?;
        out(op, "op")?;
        dtype_of(datatype)?;
        let (dst, scalar) = (op as usize, scalar as usize);
        forward(c, "ncclRedOpCreatePreMulSum".into(), move |lib, fc| {
            type F =
                unsafe extern "C" fn(*mut ncclRedOp_t, *mut c_void, ncclDataType_t, c_int, *mut c_void) -> ncclResult_t;
            // SAFETY: NCCL's signature.
            match unsafe { fallback_fn::<F>(lib, "ncclRedOpCreatePreMulSum") } {
                // SAFETY: the caller's pointers, forwarded as given.
                Ok(f) => unsafe { f(dst as *mut ncclRedOp_t, scalar as *mut c_void, datatype, residence, fc) },
                Err(r) => r,
            }
        })?;
        ok()
    })
}

/// `ncclRedOpDestroy`: forwarded.
#[no_mangle]
pub extern "C" fn ncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t {
    guard("ncclRedOpDestroy", || {
        let c = comm::lookup(comm)?;
        forward(c, "ncclRedOpDestroy".into(), move |lib, fc| {
            type F = unsafe extern "C" fn(ncclRedOp_t, *mut c_void) -> ncclResult_t;
            // SAFETY: NCCL's signature.
            match unsafe { fallback_fn::<F>(lib, "ncclRedOpDestroy") } {
                // SAFETY: forwarded as given.
                Ok(f) => unsafe { f(op, fc) },
                Err(r) => r,
            }
        })?;
        ok()
    })
}
