//! The exported `nccl*` functions (declared in `include/mcast/nccl.h`).
//!
//! Every export runs inside `guard`: a panic becomes `ncclInternalError`, a failure its
//! `ncclResult_t` with the detail kept for `ncclGetLastError`; each call is an NVTX range named
//! by its function (`mcast::nvtx`). Out-parameters are written only on success. Enums from C are
//! checked integers.
//!
//! One file per chapter of NCCL's API reference: `errors.rs` (versions, ids, errors),
//! `communicator.rs` (creation and management), `memory.rs` (allocation, registration, windows),
//! `redop.rs` (user-defined reduction operators), `collectives.rs`, `p2p.rs` (send, recv),
//! `group_calls.rs`. This file holds what they share: the panic boundary, argument checks, and
//! the routes to mcast (`serve`) and to the fallback NCCL (`forward`).

use std::cell::{Cell, RefCell};
use std::ffi::{c_int, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use mcast::capi::collective::mcast_stream_t;
use mcast::capi::team::mcast_team_t;

use crate::comm::Comm;
use crate::fallback;
use crate::group::{self, Op};
use crate::types::{self, ncclDataType_t, ncclRedOp_t, ncclResult_t, DType, Failure, Outcome};

mod collectives;
mod communicator;
mod errors;
mod group_calls;
mod memory;
mod p2p;
mod redop;

pub use collectives::*;
pub use communicator::*;
pub use errors::*;
pub use group_calls::*;
pub use memory::*;
pub use p2p::*;
pub use redop::*;

/// `ncclComm_t`.
pub type ncclComm_t = *mut c_void;
/// `cudaStream_t`.
pub type cudaStream_t = mcast_stream_t;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    /// Device of this thread's last initialised communicator (ncclMemAlloc on the simulator).
    static LAST_DEVICE: Cell<Option<c_int>> = const { Cell::new(None) };
}

fn set_last_error(message: &str) {
    let clean: Vec<u8> = message.bytes().map(|b| if b == 0 { b'?' } else { b }).collect();
    LAST_ERROR.with(|e| *e.borrow_mut() = CString::new(clean).unwrap_or_default());
}

/// Runs the body of export `func`.
fn guard(func: &'static str, body: impl FnOnce() -> Outcome<ncclResult_t>) -> ncclResult_t {
    // A range per call in Nsight Systems; the mcast calls it makes have theirs inside it.
    let _range = mcast::nvtx::range(|s| s.write_str(func));
    // mcast's leak report names the NCCL call the user wrote, not the mcast call beneath it.
    match mcast::runtime::registry::in_call(func, || catch_unwind(AssertUnwindSafe(body))) {
        Ok(Ok(r)) => r,
        Ok(Err(f)) => {
            let message = format!("{func}: {}", f.message);
            tracing::debug!("mcast_nccl: {message}");
            set_last_error(&message);
            f.code
        }
        Err(_) => {
            set_last_error(&format!("{func}: internal error (a bug in mcast_nccl, please report it)"));
            types::INTERNAL_ERROR
        }
    }
}

fn ok() -> Outcome<ncclResult_t> {
    Ok(types::SUCCESS)
}

fn out<'a, T>(ptr: *mut T, name: &str) -> Outcome<&'a mut T> {
    // SAFETY: the caller passes NULL or a valid pointer, as NCCL's API requires.
    unsafe { ptr.as_mut() }.ok_or_else(|| Failure::new(types::INVALID_ARGUMENT, format!("{name} is NULL")))
}

fn dtype_of(d: ncclDataType_t) -> Outcome<DType> {
    types::dtype(d)
        .ok_or_else(|| Failure::new(types::INVALID_ARGUMENT, format!("datatype {d} is not an ncclDataType_t")))
}

fn op_of(op: ncclRedOp_t) -> Outcome<(&'static str, Option<u32>)> {
    types::red_op(op).ok_or_else(|| Failure::new(types::INVALID_ARGUMENT, format!("op {op} is not an ncclRedOp_t")))
}

fn check_rank(comm: &Comm, root: c_int, what: &str) -> Outcome {
    if root < 0 || root >= comm.nranks {
        return Err(Failure::new(
            types::INVALID_ARGUMENT,
            format!("{what} {root} is out of range: the communicator has {} ranks", comm.nranks),
        ));
    }
    Ok(())
}

/// Submits a collective served by mcast.
fn serve(
    comm: Arc<Comm>,
    stream: cudaStream_t,
    call: impl FnOnce(&Comm, mcast_team_t, mcast_stream_t) -> Outcome + Send + 'static,
) -> Outcome {
    let stream = stream as usize;
    group::submit(Op {
        comm: Some(comm.clone()),
        blocking: false,
        forwarded: false,
        run: Box::new(move || {
            let team = comm.ready()?.team;
            comm.used_stream(stream as mcast_stream_t);
            call(&comm, team, stream as mcast_stream_t)?;
            comm.served.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }),
    })
}

/// Submits a call for the fallback NCCL: `call` gets the library and the fallback communicator.
fn forward(
    comm: Arc<Comm>,
    what: String,
    call: impl FnOnce(&fallback::Nccl, *mut c_void) -> ncclResult_t + Send + 'static,
) -> Outcome {
    let lib = match fallback::library() {
        Some(Ok(lib)) => lib,
        Some(Err(e)) => {
            return Err(Failure::new(types::INVALID_USAGE, format!("{what} is not served by mcast, and {e}")))
        }
        None => {
            return Err(Failure::new(
                types::INVALID_USAGE,
                format!(
                    "{what} is not served by mcast; set {}=/path/to/libnccl.so.2 to forward it to NCCL",
                    fallback::ENV
                ),
            ))
        }
    };
    let ready = comm.ready()?;
    let fc = ready.fallback.ok_or_else(|| match &ready.no_fallback {
        Some(why) => Failure::new(types::INVALID_USAGE, format!("{what} is not served by mcast, and {why}")),
        None => {
            Failure::new(types::INVALID_USAGE, format!("{what}: the communicator has no fallback NCCL communicator"))
        }
    })?;
    tracing::debug!("mcast_nccl: rank {}: {what} forwarded to {}", comm.rank, lib.path);
    group::submit(Op {
        comm: None,
        blocking: false,
        forwarded: true,
        run: Box::new(move || {
            let r = call(lib, fc as *mut c_void);
            comm.forwarded.fetch_add(1, Ordering::Relaxed);
            if r == types::SUCCESS {
                Ok(())
            } else {
                Err(Failure::new(r, format!("{what}: the fallback NCCL failed")))
            }
        }),
    })
}

/// Looks up NCCL function `name` of type `F` in the fallback library, as a failure if absent.
///
/// # Safety
/// `F` must be NCCL's signature of `name`.
unsafe fn fallback_fn<F: Copy>(lib: &fallback::Nccl, name: &str) -> Result<F, ncclResult_t> {
    // SAFETY: forwarded from the caller.
    unsafe { lib.function::<F>(name) }.map_err(|e| {
        set_last_error(&e);
        types::INVALID_USAGE
    })
}

/// Runs `call` with NCCL's own `name` when `comm` is a communicator of the fallback NCCL, not
/// one of ours: NCCL calls its exported functions through the dynamic linker, so with this
/// library in front of it (`LD_PRELOAD`, or a program that also loads `libnccl`, as PyTorch does)
/// its internal calls on its own communicators land here ([`fallback::foreign`]). `None`: ours.
fn on_fallback<F: Copy>(comm: ncclComm_t, name: &str, call: impl FnOnce(F) -> ncclResult_t) -> Option<ncclResult_t> {
    let lib = fallback::foreign(comm)?;
    // SAFETY: every caller names F as NCCL's signature of `name`.
    Some(match unsafe { fallback_fn::<F>(lib, name) } {
        Ok(f) => call(f),
        Err(r) => r,
    })
}
