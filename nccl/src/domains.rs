//! A communicator whose ranks span several NVLink domains (API.md, "Teams across NVLink
//! domains", last paragraph). `MCAST_NCCL_HIER` decides:
//!
//! - `off` (the default): mcast makes no team. With `MCAST_NCCL_FALLBACK` the communicator is the
//!   fallback NCCL's whole (its rank 0 makes the id, the connections mcast formed carry it; one
//!   WARN line at init names the domains); without it the init fails on every rank with
//!   `ncclInvalidUsage` naming the domains and the variable, never at the first collective.
//! - `on`: served hierarchically, mcast inside each domain and the fallback NCCL between them:
//!   the fallback library is registered on the process context as its engine between domains
//!   (`mcast::runtime::net::nccl`), and the team is made as any other. The flat fallback
//!   communicator over all ranks beside it (for the calls mcast does not serve) is optional
//!   there: if the fallback NCCL refuses it on any rank, no rank keeps one (`Comm::fallback_comm`
//!   agrees over the team) and those calls fail with `ncclInvalidUsage` saying why.

use std::ffi::{c_int, c_void};

use mcast::runtime::comm::Comm as RtComm;

use crate::fallback;
use crate::process::ContextRef;
use crate::types::{self, ncclResult_t, ncclUniqueId, Failure, Outcome};

/// The variable that serves communicators across domains hierarchically.
pub const HIER_ENV: &str = "MCAST_NCCL_HIER";

/// `MCAST_NCCL_HIER`: `on`/`1`, or `off`/`0`/unset/empty; anything else is `ncclInvalidUsage`.
pub fn hierarchical() -> Outcome<bool> {
    let value = std::env::var(HIER_ENV).unwrap_or_default();
    match value.trim().to_ascii_lowercase().as_str() {
        "" | "off" | "0" => Ok(false),
        "on" | "1" => Ok(true),
        _ => {
            Err(Failure::new(types::INVALID_USAGE, format!("{HIER_ENV}={value:?}: set it to on or off (the default)")))
        }
    }
}

/// With `MCAST_NCCL_HIER=on`: the fallback NCCL (when it is set and loads) as the process
/// context's engine between NVLink domains, for the teams made from now on.
pub fn use_fallback_between_domains(ctx: &ContextRef) -> Outcome {
    let Some(Ok(lib)) = fallback::library() else { return Ok(()) };
    let engine = mcast::runtime::net::nccl::load(None, Some(&lib.path)).map_err(|why| {
        Failure::new(
            types::INVALID_USAGE,
            format!("{HIER_ENV}=on: the fallback NCCL cannot be the engine between NVLink domains: {why}"),
        )
    })?;
    let context = mcast::runtime::handles::context(ctx.ctx.id)
        .map_err(|e| Failure::new(types::INTERNAL_ERROR, format!("the process context: {}", e.message)))?;
    context.env().set_net(Some(engine));
    Ok(())
}

/// The refusal of a communicator over several domains that nothing serves (`MCAST_NCCL_HIER`
/// off, no usable fallback NCCL), from the team's refusal `message`: the domains, and what to set.
pub fn refused(what: &str, message: &str) -> Failure {
    let domains = message.split(';').next().unwrap_or(message);
    let fallback = match fallback::library() {
        Some(Err(e)) => format!(" ({e})"),
        _ => String::new(),
    };
    Failure::new(
        types::INVALID_USAGE,
        format!(
            "{what}: {domains}; mcast serves one NVLink domain: set {}=/path/to/libnccl.so.2 to run such a \
             communicator on NCCL{fallback}, and {HIER_ENV}=on to run it on mcast inside each domain with that NCCL \
             between them",
            fallback::ENV
        ),
    )
}

/// A communicator over several NVLink domains, handed whole to the fallback NCCL: rank 0 makes
/// its unique id, the team's connections (`comm`) carry it, every rank joins (rank `rank` of
/// `nranks`, on `device` of `ctx`); no mcast team. Returns the fallback communicator.
pub fn whole_fallback(
    lib: &fallback::Nccl,
    comm: &RtComm,
    refusal: &str,
    ctx: &ContextRef,
    (rank, nranks, device): (c_int, c_int, c_int),
) -> Outcome<usize> {
    type GetId = unsafe extern "C" fn(*mut ncclUniqueId) -> ncclResult_t;
    type InitRank = unsafe extern "C" fn(*mut *mut c_void, c_int, ncclUniqueId, c_int) -> ncclResult_t;
    let unusable = |e: String| Failure::new(types::INVALID_USAGE, e);
    // SAFETY: the types are NCCL's documented signatures.
    let get_id: GetId = unsafe { lib.function("ncclGetUniqueId") }.map_err(unusable)?;
    // SAFETY: as above.
    let init: InitRank = unsafe { lib.function("ncclCommInitRank") }.map_err(unusable)?;
    let mut fid = ncclUniqueId { internal: [0; types::UNIQUE_ID_BYTES] };
    let mut made = Ok(());
    if rank == 0 {
        // SAFETY: a valid out-pointer.
        let r = unsafe { get_id(&mut fid) };
        if r != types::SUCCESS {
            made = Err(mcast::runtime::Error::internal(format!("the fallback NCCL's ncclGetUniqueId returned {r}")));
        }
    }
    let bytes: Vec<u8> = fid.internal.iter().map(|&b| b as u8).collect();
    let parts = comm
        .exchange("fallback NCCL id", made, &bytes, &[])
        .map_err(|e| Failure::new(types::INTERNAL_ERROR, format!("handing the fallback NCCL its id: {}", e.message)))?;
    for (d, s) in fid.internal.iter_mut().zip(&parts[0].bytes) {
        *d = *s as _;
    }
    if !ctx.sim {
        if let Ok(c) = mcast::runtime::handles::context(ctx.ctx.id) {
            c.driver().bind_thread(device).map_err(|e| Failure::new(types::UNHANDLED_CUDA_ERROR, e.to_string()))?;
        }
    }
    let domains = refusal.split(';').next().unwrap_or(refusal);
    if rank == 0 {
        tracing::warn!(
            "mcast_nccl: {domains}; mcast serves one NVLink domain, so this communicator runs whole on the \
             fallback NCCL ({}; {HIER_ENV}=on serves it on mcast inside each domain)",
            lib.path
        );
    }
    let mut fc: *mut c_void = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the id came from the fallback's rank 0.
    let r = unsafe { init(&mut fc, nranks, fid, rank) };
    if r != types::SUCCESS {
        let detail = fallback::last_error(lib);
        return Err(Failure::new(r, format!("rank {}: the fallback NCCL's ncclCommInitRank failed: {detail}", rank)));
    }
    fallback::track(fc as usize);
    Ok(fc as usize)
}
