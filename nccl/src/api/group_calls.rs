//! Group calls: `ncclGroupStart`, `ncclGroupEnd`, `ncclGroupSimulateEnd`.

use std::ffi::c_void;

use crate::group;
use crate::types::{self, ncclResult_t, Failure};

use super::{guard, ok};

/// `ncclGroupStart`.
#[no_mangle]
pub extern "C" fn ncclGroupStart() -> ncclResult_t {
    guard("ncclGroupStart", || {
        group::start();
        ok()
    })
}

/// `ncclGroupEnd`: runs the calls of the outermost group.
#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> ncclResult_t {
    guard("ncclGroupEnd", || {
        group::end()?;
        ok()
    })
}

/// `ncclGroupSimulateEnd`: not served.
#[no_mangle]
pub extern "C" fn ncclGroupSimulateEnd(_sim_info: *mut c_void) -> ncclResult_t {
    guard("ncclGroupSimulateEnd", || {
        Err(Failure::new(types::INVALID_USAGE, "ncclGroupSimulateEnd is not served by mcast_nccl"))
    })
}
