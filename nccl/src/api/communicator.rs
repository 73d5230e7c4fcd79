//! Communicator creation and management: init (rank, config, scalable, all), finalize, destroy,
//! abort, split, shrink, and the queries (count, device, rank).

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use mcast::capi::team::{get_root_unique_id, mcast_team_split, mcast_team_t, mcast_unique_id_t};

use crate::comm::{self, Comm};
use crate::fallback;
use crate::group::{self, Op};
use crate::process::{self, ContextRef};
use crate::types::{self, check, ncclResult_t, ncclUniqueId, ConfigHead, Failure, Outcome};

use super::{guard, ncclComm_t, ok, on_fallback, out, LAST_DEVICE};

/// Creates rank `rank` of `nranks` on the calling thread's device; queued in a group.
fn init_rank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
    nonblocking: bool,
) -> Outcome<ncclResult_t> {
    let dst = out(comm, "comm")?;
    if nranks < 1 {
        return Err(Failure::new(types::INVALID_ARGUMENT, format!("nranks is {nranks}; it must be at least 1")));
    }
    if rank < 0 || rank >= nranks {
        return Err(Failure::new(
            types::INVALID_ARGUMENT,
            format!("rank {rank} is out of range for nranks = {nranks}"),
        ));
    }
    let ctx = process::acquire_context()?;
    let device = match process::current_device(&ctx, rank) {
        Ok(d) => d,
        Err(f) => {
            process::release_context();
            return Err(f);
        }
    };
    let c = Comm::new(ctx, rank, nranks, device, nonblocking);
    let key = comm::publish(c.clone());
    let finish = {
        let c = c.clone();
        move || -> Outcome { c.finish_init(&id) }
    };
    if nonblocking && !group::in_group() {
        std::thread::spawn(finish);
        // The calling thread's device (ncclMemAlloc on the simulator), not the creating thread's.
        LAST_DEVICE.with(|d| d.set(Some(device)));
        *dst = key as ncclComm_t;
        return Ok(types::IN_PROGRESS);
    }
    let submitted =
        group::submit(Op { comm: Some(c.clone()), blocking: true, forwarded: false, run: Box::new(finish) });
    if let Err(f) = submitted {
        let _ = comm::unpublish(key as *const c_void);
        let _ = c.release(false);
        return Err(f);
    }
    LAST_DEVICE.with(|d| d.set(Some(device)));
    *dst = key as ncclComm_t;
    ok()
}

fn config_nonblocking(config: *const ConfigHead) -> Outcome<bool> {
    // SAFETY: NULL or a caller's ncclConfig_t, whose first fields are ConfigHead.
    let Some(cfg) = (unsafe { config.as_ref() }) else { return Ok(false) };
    if cfg.magic != types::CONFIG_MAGIC || cfg.size < std::mem::size_of::<ConfigHead>() {
        return Err(Failure::new(
            types::INVALID_ARGUMENT,
            "config was not initialised with NCCL_CONFIG_INITIALIZER (bad magic or size)",
        ));
    }
    Ok(cfg.blocking == 0)
}

/// `ncclCommInitRank`.
#[no_mangle]
pub extern "C" fn ncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    comm_id: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    guard("ncclCommInitRank", || init_rank(comm, nranks, comm_id, rank, false))
}

/// `ncclCommInitRankConfig`: `config->blocking = 0` returns `ncclInProgress` and creates the
/// communicator in the background (poll `ncclCommGetAsyncError`). Other fields are ignored.
#[no_mangle]
pub extern "C" fn ncclCommInitRankConfig(
    comm: *mut ncclComm_t,
    nranks: c_int,
    comm_id: ncclUniqueId,
    rank: c_int,
    config: *mut c_void,
) -> ncclResult_t {
    guard("ncclCommInitRankConfig", || {
        let nonblocking = config_nonblocking(config.cast())?;
        init_rank(comm, nranks, comm_id, rank, nonblocking)
    })
}

/// `ncclCommInitRankScalable`: with one id, as `ncclCommInitRankConfig`; several ids are not
/// served (mcast's bootstrap has one root).
///
/// # Safety
/// `commIds` is NULL or points to `nId` ids, as NCCL's API requires.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankScalable(
    newcomm: *mut ncclComm_t,
    nranks: c_int,
    myrank: c_int,
    n_id: c_int,
    comm_ids: *mut ncclUniqueId,
    config: *mut c_void,
) -> ncclResult_t {
    guard("ncclCommInitRankScalable", || {
        if n_id != 1 || comm_ids.is_null() {
            return Err(Failure::new(
                types::INVALID_USAGE,
                format!("nId = {n_id}: mcast_nccl serves ncclCommInitRankScalable with exactly one unique id"),
            ));
        }
        let nonblocking = config_nonblocking(config.cast())?;
        // SAFETY: checked non-NULL; the caller passes nId ids.
        let id = unsafe { *comm_ids };
        init_rank(newcomm, nranks, id, myrank, nonblocking)
    })
}

/// `ncclCommInitAll`: one communicator per device of `devlist` (NULL: devices 0..ndev-1), all
/// in this process, made together (through a fresh id: `MCAST_BOOTSTRAP_ADDR` is not used).
///
/// # Safety
/// `comms` is NULL or has room for `ndev` communicators; `devlist` is NULL or holds `ndev` devices.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitAll(comms: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) -> ncclResult_t {
    guard("ncclCommInitAll", || {
        if comms.is_null() {
            return Err(Failure::new(types::INVALID_ARGUMENT, "comms is NULL"));
        }
        if ndev < 1 {
            return Err(Failure::new(types::INVALID_ARGUMENT, format!("ndev is {ndev}; it must be at least 1")));
        }
        let n = ndev as usize;
        let devices: Vec<c_int> = if devlist.is_null() {
            (0..ndev).collect()
        } else {
            // SAFETY: the caller passes ndev devices.
            unsafe { std::slice::from_raw_parts(devlist, n) }.to_vec()
        };
        // Every rank is in this process: a fresh root-mode id, never the job's
        // MCAST_BOOTSTRAP_ADDR (two processes' teams would meet there, as split's did).
        let mut id = mcast_unique_id_t { internal: [0; 128] };
        check(get_root_unique_id(&mut id), "mcast_get_unique_id")?;
        let nid = ncclUniqueId { internal: id.internal };
        let mut made: Vec<Arc<Comm>> = Vec::with_capacity(n);
        for (r, &d) in devices.iter().enumerate() {
            match process::acquire_context() {
                Ok(ctx) => made.push(Comm::new(ctx, r as c_int, ndev, d, false)),
                Err(f) => {
                    made.iter().for_each(|_| process::release_context());
                    return Err(f);
                }
            }
        }
        let results: Vec<Outcome> = std::thread::scope(|s| {
            let hs: Vec<_> = made.iter().map(|c| s.spawn(|| c.finish_init(&nid))).collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(Failure::new(types::INTERNAL_ERROR, "panicked"))))
                .collect()
        });
        if let Some(Err(f)) = results.into_iter().find(|r| r.is_err()) {
            for c in &made {
                let _ = c.release(true);
            }
            return Err(f);
        }
        for (r, c) in made.into_iter().enumerate() {
            // SAFETY: the caller passes room for ndev communicators.
            unsafe { *comms.add(r) = comm::publish(c) as ncclComm_t };
        }
        ok()
    })
}

/// `ncclCommFinalize`: returns once the communicator's work in flight is complete.
// The pointers go to the fallback NCCL as given, under its contract (as every NCCL call).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn ncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
    type F = unsafe extern "C" fn(ncclComm_t) -> ncclResult_t;
    // SAFETY: the caller's communicator, as given.
    if let Some(r) = on_fallback::<F>(comm, "ncclCommFinalize", |f| unsafe { f(comm) }) {
        return r;
    }
    guard("ncclCommFinalize", || {
        comm::lookup(comm)?.finalize()?;
        ok()
    })
}

/// `ncclCommDestroy`: waits for the work in flight, then releases everything. NULL: no-op.
// The pointers go to the fallback NCCL as given, under its contract (as every NCCL call).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn ncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
    type F = unsafe extern "C" fn(ncclComm_t) -> ncclResult_t;
    // SAFETY: the caller's communicator, as given.
    if let Some(r) = on_fallback::<F>(comm, "ncclCommDestroy", |f| unsafe { f(comm) }) {
        return r;
    }
    guard("ncclCommDestroy", || {
        if comm.is_null() {
            return ok();
        }
        let c = comm::unpublish(comm)?;
        let fin = c.finalize();
        let rel = c.release(false);
        fin.and(rel)?;
        ok()
    })
}

/// `ncclCommAbort`: ends every wait of the team (`mcast_team_abort`) and releases the
/// communicator without waiting for peers. NULL: no-op.
// The pointers go to the fallback NCCL as given, under its contract (as every NCCL call).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
    type F = unsafe extern "C" fn(ncclComm_t) -> ncclResult_t;
    // SAFETY: the caller's communicator, as given.
    if let Some(r) = on_fallback::<F>(comm, "ncclCommAbort", |f| unsafe { f(comm) }) {
        return r;
    }
    guard("ncclCommAbort", || {
        if comm.is_null() {
            return ok();
        }
        comm::unpublish(comm)?.release(true)?;
        ok()
    })
}

/// `ncclCommSplit`: MPI_Comm_split over the ranks of `comm` (`mcast_team_split`); color
/// `NCCL_SPLIT_NOCOLOR` gives NULL. Queued in a group (written at `ncclGroupEnd`).
#[no_mangle]
pub extern "C" fn ncclCommSplit(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut c_void,
) -> ncclResult_t {
    guard("ncclCommSplit", || {
        let c = comm::lookup(comm)?;
        out(newcomm, "newcomm")?;
        config_nonblocking(config.cast())?;
        if color < 0 && color != types::SPLIT_NOCOLOR {
            return Err(Failure::new(
                types::INVALID_ARGUMENT,
                format!("color {color} is negative and not NCCL_SPLIT_NOCOLOR"),
            ));
        }
        let dst = newcomm as usize;
        let parent = c.clone();
        group::submit(Op {
            comm: Some(c),
            blocking: true,
            forwarded: false,
            run: Box::new(move || {
                if parent.whole_fallback_comm() {
                    return Err(Failure::new(
                        types::INVALID_USAGE,
                        "ncclCommSplit of a communicator that runs whole on the fallback NCCL (it spans several \
                         NVLink domains) is not served yet",
                    ));
                }
                let team = parent.ready()?.team;
                let mut new_team = mcast_team_t { id: 0 };
                let (colors, keys) = ([color], [key]);
                // SAFETY: one color and key for the one rank this process holds.
                check(
                    unsafe { mcast_team_split(team, colors.as_ptr(), keys.as_ptr(), &mut new_team) },
                    "mcast_team_split",
                )?;
                let fallback = split_fallback(&parent, color, key)?;
                let made = if new_team.id == 0 {
                    std::ptr::null_mut()
                } else {
                    child(&parent, new_team, fallback)? as ncclComm_t
                };
                // SAFETY: the caller's out-pointer, valid until the group ends.
                unsafe { *(dst as *mut ncclComm_t) = made };
                Ok(())
            }),
        })?;
        ok()
    })
}

/// Splits the parent's fallback NCCL communicator the same way (every rank of the parent
/// takes part, as in mcast's split).
fn split_fallback(parent: &Comm, color: c_int, key: c_int) -> Outcome<Option<usize>> {
    let (Some(fc), Some(Ok(lib))) = (parent.ready()?.fallback, fallback::library()) else { return Ok(None) };
    type F = unsafe extern "C" fn(*mut c_void, c_int, c_int, *mut *mut c_void, *mut c_void) -> ncclResult_t;
    // SAFETY: NCCL's signature of ncclCommSplit.
    let f = unsafe { lib.function::<F>("ncclCommSplit") }.map_err(|e| Failure::new(types::INVALID_USAGE, e))?;
    let mut new: *mut c_void = std::ptr::null_mut();
    // SAFETY: the fallback communicator of the parent; a valid out-pointer; no config.
    let r = unsafe { f(fc as *mut c_void, color, key, &mut new, std::ptr::null_mut()) };
    if r != types::SUCCESS {
        return Err(Failure::new(r, "the fallback NCCL's ncclCommSplit failed"));
    }
    if !new.is_null() {
        fallback::track(new as usize);
    }
    Ok((!new.is_null()).then_some(new as usize))
}

/// A communicator over `team`, split from `parent`.
fn child(parent: &Comm, team: mcast_team_t, fallback: Option<usize>) -> Outcome<usize> {
    let t = mcast::runtime::handles::team(team.id).map_err(|e| Failure::new(types::INTERNAL_ERROR, e.message))?;
    // A team across NVLink domains (MCAST_NCCL_HIER=on) numbers its ranks in the whole team.
    let (rank, nranks) = (t.local_rank().unwrap_or(0) as c_int, t.size() as c_int);
    let ctx: ContextRef = process::acquire_context()?;
    let c = Comm::new(ctx, rank, nranks, parent.device, parent.nonblocking);
    let no_fallback = if fallback.is_none() { parent.ready()?.no_fallback.clone() } else { None };
    c.adopt(team, fallback, no_fallback);
    Ok(comm::publish(c))
}

/// `ncclCommShrink`: not served (forwarded).
#[no_mangle]
pub extern "C" fn ncclCommShrink(
    comm: ncclComm_t,
    _exclude_ranks_list: *mut c_int,
    _exclude_ranks_count: c_int,
    _newcomm: *mut ncclComm_t,
    _config: *mut c_void,
    _shrink_flags: c_int,
) -> ncclResult_t {
    guard("ncclCommShrink", || {
        comm::lookup(comm)?;
        Err(Failure::new(
            types::INVALID_USAGE,
            "ncclCommShrink is not served by mcast_nccl: use ncclCommSplit with NCCL_SPLIT_NOCOLOR on the excluded ranks",
        ))
    })
}

/// `ncclCommCount`.
// The pointers go to the fallback NCCL as given, under its contract (as every NCCL call).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn ncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
    type F = unsafe extern "C" fn(ncclComm_t, *mut c_int) -> ncclResult_t;
    // SAFETY: the caller's arguments, as given.
    if let Some(r) = on_fallback::<F>(comm, "ncclCommCount", |f| unsafe { f(comm, count) }) {
        return r;
    }
    guard("ncclCommCount", || {
        let c = comm::lookup(comm)?;
        *out(count, "count")? = c.nranks;
        ok()
    })
}

/// `ncclCommCuDevice`.
// The pointers go to the fallback NCCL as given, under its contract (as every NCCL call).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn ncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
    type F = unsafe extern "C" fn(ncclComm_t, *mut c_int) -> ncclResult_t;
    // SAFETY: the caller's arguments, as given.
    if let Some(r) = on_fallback::<F>(comm, "ncclCommCuDevice", |f| unsafe { f(comm, device) }) {
        return r;
    }
    guard("ncclCommCuDevice", || {
        let c = comm::lookup(comm)?;
        *out(device, "device")? = c.device;
        ok()
    })
}

/// `ncclCommUserRank`.
// The pointers go to the fallback NCCL as given, under its contract (as every NCCL call).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn ncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
    type F = unsafe extern "C" fn(ncclComm_t, *mut c_int) -> ncclResult_t;
    // SAFETY: the caller's arguments, as given.
    if let Some(r) = on_fallback::<F>(comm, "ncclCommUserRank", |f| unsafe { f(comm, rank) }) {
        return r;
    }
    guard("ncclCommUserRank", || {
        let c = comm::lookup(comm)?;
        *out(rank, "rank")? = c.rank;
        ok()
    })
}
