//! `mcast_team_t`: an ordered list of ranks, rank `i` on `devices[i]`.

use std::ffi::{c_char, c_int, c_void};
use std::mem::size_of;

use super::context::mcast_context_t;
use super::{copy_str, guard, mcast_status_t, out_ptr, set_last_error, status_of};
use crate::bootstrap;
use crate::runtime::handles;
use crate::runtime::team::{Team, Transport, SPLIT_NOCOLOR};
use crate::runtime::teams::AnyTeam;
use crate::runtime::Error;

/// A team. Passed by value; id 0 is never valid.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct mcast_team_t {
    /// Opaque id.
    pub id: u64,
}

/// How a team's ranks exchange data.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum McastTransport {
    /// Multicast objects and multimem kernels (NVLink SHARP).
    MCAST_TRANSPORT_MULTICAST = 1,
    /// Peer mappings and load/store kernels.
    MCAST_TRANSPORT_P2P = 2,
}

/// Values of `mcast_transport_t`, carried as an integer.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct mcast_transport_t(pub u32);

/// What a team is.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mcast_team_info_t {
    /// `sizeof(mcast_team_info_t)`, set by the caller.
    pub struct_size: u32,
    /// Ranks.
    pub size: i32,
    /// The transport chosen at creation.
    pub transport: mcast_transport_t,
    /// Why P2P was chosen, or `""`.
    pub transport_reason: [c_char; 160],
    /// Allocation granularity the team uses.
    pub granularity: u64,
    /// Live multicast objects held by this team.
    pub multicast_objects: u64,
    /// Device bytes held per rank, all buffers and metadata.
    pub bytes_reserved: u64,
    /// NVLink domains the team spans (1 on one host with peer access). Appended with the
    /// fields below; a `struct_size` of the earlier struct (up to `bytes_reserved`) is still
    /// accepted and filled up to its size.
    pub domains: i32,
    /// Ranks per domain; 0 when the domains differ in size.
    pub domain_size: i32,
    /// The engine between domains (`"nccl 2.27.7"`, `"mpi"`, ...), NUL-terminated, or `""`.
    pub net_engine: [c_char; 48],
}

/// The size of the first version of `mcast_team_info_t` (before `domains`).
const TEAM_INFO_V1: usize = std::mem::offset_of!(mcast_team_info_t, domains);

/// Creates a team of `ndevices` ranks, rank `i` on `devices[i]`. The transport is chosen once:
/// MULTICAST when policy allows and every device is usable and distinct and there are at least
/// two ranks; otherwise P2P when every pair of devices can access each other (a device may
/// repeat under P2P); otherwise `MCAST_ERROR_NOT_SUPPORTED`. With `MCAST_MULTICAST_REQUIRE` a
/// team that cannot use multicast fails with `MCAST_ERROR_NOT_SUPPORTED` naming the reason.
/// On success `*out` holds the team, destroyed with `mcast_team_destroy`; on failure nothing
/// is left allocated and `*out` is untouched. `MCAST_ERROR_INVALID_ARGUMENT`: `out` or
/// `devices` NULL, `ndevices` < 1 or above 72, a device out of range. Thread-safe.
///
/// # Safety
/// `devices` must be NULL or point to `ndevices` ints; `out` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn mcast_team_create(
    ctx: mcast_context_t,
    devices: *const c_int,
    ndevices: c_int,
    out: *mut mcast_team_t,
) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| write!(s, "mcast_team_create ranks={ndevices}"));
    guard("mcast_team_create", || {
        // SAFETY: the caller passes NULL or a valid pointer.
        let out = unsafe { out_ptr(out, "out") }?;
        if devices.is_null() {
            return Err(Error::invalid_argument("devices is NULL"));
        }
        if ndevices < 1 {
            return Err(Error::invalid_argument(format!("ndevices is {ndevices}; a team needs at least one")));
        }
        // SAFETY: the caller guarantees `ndevices` readable ints at `devices`.
        let list = unsafe { std::slice::from_raw_parts(devices, ndevices as usize) };
        let context = handles::context(ctx.id)?;
        let team = Team::create(&context, list)?;
        *out = mcast_team_t { id: handles::insert_team(team) };
        Ok(())
    })
}

/// Destroys a team and releases its memory. `MCAST_ERROR_IN_USE` while buffers of the team
/// live (nothing changes), unless the team was aborted: then its buffers are released with it
/// and their handles become invalid. After a timeout or an abort it never waits for peers
/// (kernels still waiting on the device are ended first). The zero handle is a no-op returning
/// `MCAST_SUCCESS`; a destroyed or unknown handle gives `MCAST_ERROR_INVALID_HANDLE` (also to
/// the losers of destroys racing from several threads). Teardown errors from the driver are
/// reported (the team is gone all the same). Thread-safe.
#[no_mangle]
pub extern "C" fn mcast_team_destroy(team: mcast_team_t) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| write!(s, "mcast_team_destroy team={:#x}", team.id));
    guard("mcast_team_destroy", || if team.id == 0 { Ok(()) } else { handles::destroy_team(team.id) })
}

/// Aborts `team`: ends every wait of the team promptly, host or device (well under a second,
/// whatever `timeout_ms` says): work in flight, and every later collective, synchronize, alloc
/// or free on the team, returns `MCAST_ERROR_ABORTED`. Device waits end within microseconds of
/// the abort reaching the device (every barrier spin reads the team's state word, which this
/// writes for every rank, peers in other processes included through the peer mappings); host
/// waits (rendezvous agreement in a multi-process team) within milliseconds; peer processes are
/// told over the rendezvous connections too and see `MCAST_ERROR_ABORTED`. The team can then
/// only be destroyed: `mcast_team_destroy` releases everything (live buffers included, whose
/// handles go with it) without waiting for peers. Aborting twice is harmless.
/// `MCAST_ERROR_INVALID_HANDLE`: `team` zero or not live (destroyed, also by a racing
/// destroy). Thread-safe: callable from any thread, also while other threads are blocked in
/// mcast calls on this team.
#[no_mangle]
pub extern "C" fn mcast_team_abort(team: mcast_team_t) -> mcast_status_t {
    guard("mcast_team_abort", || {
        handles::team(team.id)?.abort();
        Ok(())
    })
}

/// Writes the team's sticky asynchronous error into `*error` without waiting (like
/// `ncclCommGetAsyncError`): `MCAST_SUCCESS`, `MCAST_ERROR_TIMEOUT` (a rank did not arrive
/// within `timeout_ms`: found by `mcast_synchronize`, or on the device, which it reads without
/// waiting for any stream), `MCAST_ERROR_ABORTED` (`mcast_team_abort` here or in a peer
/// process) or `MCAST_ERROR_INVALID_ARGUMENT` (the ranks disagreed on a collective's count,
/// dtype, op, root, collective or buffer offsets, found by the kernels at their entry and read
/// from the device without waiting; or, in a one-process team, a rank's call was refused after
/// other ranks had issued theirs: their waits were ended); on a team across NVLink domains
/// also the status of a failed call of the engine between domains (usually
/// `MCAST_ERROR_DRIVER`, the message naming the engine and its code), which every rank of the
/// team is told. A timeout is every
/// rank's: the rank that timed out tells the others (through their state words and over the
/// connections of a multi-process team), so every rank reports `MCAST_ERROR_TIMEOUT`, a paused
/// or slow one within a second of running again. Once set it stays set until the team is
/// destroyed. When `*error` is not `MCAST_SUCCESS`, `mcast_last_error()` on the calling thread
/// says why (which rank, which call, which field), as after a failing call. Returns
/// `MCAST_SUCCESS` when `*error` was written; `MCAST_ERROR_INVALID_ARGUMENT`: `error` NULL;
/// `MCAST_ERROR_INVALID_HANDLE`: `team` not live (`*error` untouched). Thread-safe, and safe
/// while another thread captures a CUDA graph: a healthy team's call reads a word of host
/// memory that the team's kernels write when they record an error, and makes no CUDA call but,
/// on a team with ranks in other processes, a read of the rank's device words at most every
/// 20 ms (where a peer process's abort lands); those reads, and the ones after an error, run
/// in relaxed capture mode.
///
/// # Safety
/// `error` must be NULL or valid for writing an `mcast_status_t`.
#[no_mangle]
pub unsafe extern "C" fn mcast_team_get_error(team: mcast_team_t, error: *mut mcast_status_t) -> mcast_status_t {
    guard("mcast_team_get_error", || {
        // SAFETY: the caller passes NULL or a valid pointer.
        let out = unsafe { out_ptr(error, "error") }?;
        let t = handles::team(team.id)?;
        *out = match t.async_error() {
            Some(kind) => {
                let why = t.inner().error().map_or_else(|| format!("{kind:?}"), |e| e.message);
                set_last_error(&format!("the team's asynchronous error: {why}"));
                status_of(kind)
            }
            None => mcast_status_t::SUCCESS,
        };
        Ok(())
    })
}

/// Splits `team` like `MPI_Comm_split` / `ncclCommSplit`: the ranks with the same color form a
/// new team, ordered by key, then by rank in `team`. `colors[i]`, `keys[i]` and `out[i]`
/// belong to the i-th rank this process holds (every rank of a `mcast_team_create` team, in
/// rank order; the one rank of an `init_rank`/`init_oob` team). A color is >= 0, or
/// `MCAST_SPLIT_NOCOLOR`, which joins no team and gets the zero handle. In one process, the
/// ranks of one color share one new handle (destroy it once). Each new team chooses its
/// transport afresh and shares no memory, state word or rendezvous with `team` or with the
/// other new teams (across processes each new team meets through a fresh random id, never
/// through `MCAST_BOOTSTRAP_ADDR`), so one failing (abort, timeout) never reaches another; `team` stays usable
/// and is destroyed on its own. Collective over every rank of `team` (every process calls it).
/// On error `out` is untouched and nothing was created. `MCAST_ERROR_INVALID_ARGUMENT`: NULL
/// `colors`, `keys` or `out`, or a negative color other than `MCAST_SPLIT_NOCOLOR`;
/// `MCAST_ERROR_INVALID_HANDLE`: `team` not live; `MCAST_ERROR_ABORTED` or
/// `MCAST_ERROR_TIMEOUT`: `team` failed before; any status of `mcast_team_create` or
/// `mcast_team_init_rank` for the new teams. Thread-safe.
///
/// # Safety
/// `colors` and `keys` must be NULL or valid for reading, and `out` NULL or valid for writing,
/// one element per rank this process holds.
#[no_mangle]
pub unsafe extern "C" fn mcast_team_split(
    team: mcast_team_t,
    colors: *const c_int,
    keys: *const c_int,
    out: *mut mcast_team_t,
) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| write!(s, "mcast_team_split team={:#x}", team.id));
    guard("mcast_team_split", || {
        for (p, name) in [(colors.is_null(), "colors"), (keys.is_null(), "keys"), (out.is_null(), "out")] {
            if p {
                return Err(Error::invalid_argument(format!("{name} is NULL")));
            }
        }
        let t = handles::team(team.id)?;
        let n = t.held();
        // SAFETY: the caller guarantees one readable element per rank this process holds.
        let (colors, keys) = unsafe { (std::slice::from_raw_parts(colors, n), std::slice::from_raw_parts(keys, n)) };
        let made = t.split(colors, keys)?;
        let mut ids: Vec<(AnyTeam, u64)> = Vec::new();
        let handles: Vec<mcast_team_t> = made
            .into_iter()
            .map(|m| match m {
                None => mcast_team_t { id: 0 },
                Some(team) => {
                    let id = match ids.iter().find(|(k, _)| k.same(&team)) {
                        Some(&(_, id)) => id,
                        None => {
                            let id = handles::insert_team(team.clone());
                            ids.push((team, id));
                            id
                        }
                    };
                    mcast_team_t { id }
                }
            })
            .collect();
        // SAFETY: the caller guarantees `n` writable elements at `out`.
        unsafe { std::ptr::copy_nonoverlapping(handles.as_ptr(), out, n) };
        Ok(())
    })
}

const _: () = assert!(SPLIT_NOCOLOR == -1);

/// Describes `team` in `*info`, whose `struct_size` the caller sets: at least the size of the
/// struct's first version (up to `bytes_reserved`); the first `struct_size` bytes are filled.
/// `MCAST_ERROR_INVALID_ARGUMENT`: `info` NULL or `struct_size` too small;
/// `MCAST_ERROR_INVALID_HANDLE`: `team` not live. Thread-safe.
///
/// # Safety
/// `info` must be NULL or valid for reading and writing `info->struct_size` bytes (at most
/// `sizeof(mcast_team_info_t)` are written).
#[no_mangle]
pub unsafe extern "C" fn mcast_team_get_info(team: mcast_team_t, info: *mut mcast_team_info_t) -> mcast_status_t {
    guard("mcast_team_get_info", || {
        let fill = |struct_size| {
            let t = handles::team(team.id)?.info();
            let mut v = mcast_team_info_t {
                struct_size,
                size: t.size as i32,
                transport: mcast_transport_t(match t.transport {
                    Transport::Multicast => McastTransport::MCAST_TRANSPORT_MULTICAST,
                    Transport::P2P => McastTransport::MCAST_TRANSPORT_P2P,
                } as u32),
                transport_reason: [0; 160],
                granularity: t.granularity,
                multicast_objects: t.multicast_objects,
                bytes_reserved: t.bytes_reserved,
                domains: t.domains as i32,
                domain_size: t.domain_size as i32,
                net_engine: [0; 48],
            };
            copy_str(&mut v.transport_reason, &t.transport_reason);
            copy_str(&mut v.net_engine, &t.net_engine);
            Ok(v)
        };
        // SAFETY: the caller passes NULL or a pointer to its struct of struct_size bytes.
        unsafe { super::write_versioned(info, TEAM_INFO_V1, "mcast_team_info_t", fill) }
    })
}

/// The name of a multi-process team: made once by `mcast_get_unique_id` (normally on rank 0)
/// and moved by the caller to every process (`MPI_Bcast`, a file); opaque bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct mcast_unique_id_t {
    /// Opaque: a version tag and random bytes.
    pub internal: [c_char; 128],
}

/// Writes a fresh unique id into `*id`: a version tag, the address of a bootstrap listener
/// (TCP, IPv4 or IPv6) and a random secret. The listener starts in this process, on the
/// interface `MCAST_SOCKET_IFNAME` selects (as `NCCL_SOCKET_IFNAME`: prefixes, `^` excludes,
/// `=` whole names), else the first that is up but for `lo`, `docker*` and `veth*`, else
/// loopback; this process must stay alive until every rank has joined. The listener closes
/// (its port and threads) once every rank has asked it where rank 0 is, or when
/// `MCAST_TIMEOUT_MS` of this process (default 30000; 0: never) passes without a rank asking:
/// an id nobody uses keeps nothing open, and ranks must start within that time of one another.
/// With `MCAST_BOOTSTRAP_ADDR=ip:port` no listener starts, rank 0 listens there, and every
/// process makes the same id, so each can call this itself, like `NCCL_COMM_ID`: the id's
/// secret is derived (PBKDF2-HMAC-SHA256, salted with the address) from
/// `MCAST_BOOTSTRAP_SECRET`, which must then be at least 32 hex digits (128 bits; surrounding
/// white space ignored, case does not matter), random and fresh for each job (e.g.
/// `openssl rand -hex 32`). One id names one team; every process of that team passes the same
/// bytes to `mcast_team_init_rank`. `MCAST_ERROR_INVALID_ARGUMENT`: `id` NULL,
/// `MCAST_BOOTSTRAP_ADDR` malformed, or set with `MCAST_BOOTSTRAP_SECRET` missing, shorter, not
/// hex or too regular to be random (one digit repeated, a repeated pattern, a sequence, fewer
/// than 8 distinct digits; the message names the variable and how to make one),
/// `MCAST_SOCKET_IFNAME` matching no interface. Thread-safe.
///
/// # Safety
/// `id` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn mcast_get_unique_id(id: *mut mcast_unique_id_t) -> mcast_status_t {
    guard("mcast_get_unique_id", || {
        // SAFETY: the caller passes NULL or a valid pointer.
        let out = unsafe { out_ptr(id, "id") }?;
        let bytes = bootstrap::new_unique_id()?;
        let mut v = mcast_unique_id_t { internal: [0; 128] };
        for (d, s) in v.internal.iter_mut().zip(bytes) {
            *d = s as c_char;
        }
        *out = v;
        Ok(())
    })
}

/// Rust only, no C symbol (for `libmcast_nccl`'s `ncclCommInitAll`, whose ranks all live in
/// this process): a fresh id as `mcast_get_unique_id` makes without `MCAST_BOOTSTRAP_ADDR`
/// (a random secret, a listener in this process), whatever the environment. Status and
/// message as `mcast_get_unique_id`.
pub fn get_root_unique_id(id: &mut mcast_unique_id_t) -> mcast_status_t {
    guard("mcast_get_unique_id", || {
        let bytes = bootstrap::new_root_id()?;
        for (d, s) in id.internal.iter_mut().zip(bytes) {
            *d = s as c_char;
        }
        Ok(())
    })
}

/// One process per rank: joins the team named by `id` as rank `rank` of `nranks`, on
/// `device` of this process's context. Every process of the team calls it with the same `id`
/// and `nranks` and a distinct `rank`; it returns when all have joined and the team is built.
/// The processes meet over TCP through the listener `id` names (on one host or many; every
/// connection proves the id's secret first, the listener before the caller, and everything
/// after that is encrypted and authenticated: a message altered, replayed or injected on the
/// network fails the team on every rank with `MCAST_ERROR_TIMEOUT`, the message naming the
/// connection that failed authentication); memory and multicast objects travel as fabric
/// handles where every rank can export them (always between hosts), else as POSIX file
/// descriptors (`SCM_RIGHTS`) between ranks of one host (`MCAST_HANDLE_TYPE` forces one);
/// where neither works the call fails on every rank with `MCAST_ERROR_NOT_SUPPORTED`
/// naming the rank, its host and the reason.
/// The transport is chosen from every rank's capabilities, as for `mcast_team_create`. Every
/// step that can fail on one rank is agreed by all, so a failure anywhere is an error on every
/// rank (the message names the rank that failed), never a hang: a rank that does not arrive
/// within `timeout_ms`, or exits, gives `MCAST_ERROR_TIMEOUT` to the others.
/// The returned team is used as any other, except that only `rank` belongs to this process:
/// naming another rank in `mcast_buffer_*`, the collectives or `mcast_synchronize` gives
/// `MCAST_ERROR_INVALID_ARGUMENT` (peers may still be named as `peer` or `root`). Buffer
/// allocations and frees are collective: every rank makes them in the same order and sizes.
/// On failure nothing is left allocated and `*out` is untouched.
/// `MCAST_ERROR_INVALID_ARGUMENT`: `out` NULL, `id` not from `mcast_get_unique_id` or already
/// from another version of mcast, `nranks` < 1 or above 72, `rank` or `device` out of range,
/// an id of `MCAST_BOOTSTRAP_ADDR` joined from an environment whose `MCAST_BOOTSTRAP_SECRET`
/// is missing or breaks the rule of `mcast_get_unique_id`.
/// Thread-safe.
///
/// # Safety
/// `out` must be NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn mcast_team_init_rank(
    ctx: mcast_context_t,
    id: mcast_unique_id_t,
    nranks: c_int,
    rank: c_int,
    device: c_int,
    out: *mut mcast_team_t,
) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| write!(s, "mcast_team_init_rank ranks={nranks} rank={rank} device={device}"));
    guard("mcast_team_init_rank", || {
        // SAFETY: the caller passes NULL or a valid pointer.
        let out = unsafe { out_ptr(out, "out") }?;
        let context = handles::context(ctx.id)?;
        let mut bytes = [0u8; bootstrap::ID_BYTES];
        for (d, s) in bytes.iter_mut().zip(id.internal) {
            *d = s as u8;
        }
        let team = AnyTeam::init_rank(&context, &bytes, nranks, rank, device)?;
        *out = mcast_team_t { id: handles::insert_team(team) };
        Ok(())
    })
}

/// The application's out-of-band allgather: gathers `bytes` bytes at `send` from every rank
/// into `recv` (`nranks * bytes`, in rank order). Returns 0 on success.
pub type mcast_oob_allgather_fn =
    Option<unsafe extern "C" fn(send: *const c_void, recv: *mut c_void, bytes: usize, user: *mut c_void) -> c_int>;

/// The application's allgather, for `mcast_team_init_oob`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mcast_oob_t {
    /// `sizeof(mcast_oob_t)`.
    pub struct_size: u32,
    /// The allgather (`MPI_Allgather`, a PMIx fence, a key-value store).
    pub allgather: mcast_oob_allgather_fn,
    /// Passed to `allgather`.
    pub user: *mut c_void,
    /// This process's rank.
    pub rank: i32,
    /// The team size.
    pub nranks: i32,
}

/// Like `mcast_team_init_rank`, bootstrapped by the caller's allgather instead of a unique id:
/// every process calls it with its own `oob->rank`, the same `oob->nranks`, and an allgather
/// over the same processes. `oob->allgather` is called only inside this call, on the calling
/// thread, the same number of times on every rank (once; none when `nranks` is out of range,
/// which every rank sees alike); afterwards the team talks over its own TCP connections, so a
/// peer that dies later gives `MCAST_ERROR_TIMEOUT`, never a hang inside the caller's MPI.
/// A rank that is out of range or a `device` out of range still takes part in the allgather,
/// so every rank fails together with `MCAST_ERROR_INVALID_ARGUMENT`. A non-zero return of the
/// callback fails the setup (`MCAST_ERROR_INVALID_ARGUMENT`, the value in the message); the
/// ranks whose callback succeeded then learn it through the team's connections or time out
/// within `timeout_ms`. `oob` is only read during the call. On failure nothing is left
/// allocated and `*out` is untouched. `MCAST_ERROR_INVALID_ARGUMENT` also: `oob` or `out`
/// NULL, `oob->struct_size` not `sizeof(mcast_oob_t)`, `oob->allgather` NULL, `nranks` < 1 or
/// above 72 (the callback is not called then). Thread-safe.
///
/// # Safety
/// `oob` must be NULL or point to a valid `mcast_oob_t`; `out` NULL or valid for writes; the
/// callback must honour its contract.
#[no_mangle]
pub unsafe extern "C" fn mcast_team_init_oob(
    ctx: mcast_context_t,
    oob: *const mcast_oob_t,
    device: c_int,
    out: *mut mcast_team_t,
) -> mcast_status_t {
    let _range = crate::nvtx::range(|s| write!(s, "mcast_team_init_oob device={device}"));
    guard("mcast_team_init_oob", || {
        // SAFETY: the caller passes NULL or a valid pointer.
        let out = unsafe { out_ptr(out, "out") }?;
        if oob.is_null() {
            return Err(Error::invalid_argument("oob is NULL"));
        }
        // SAFETY: non-NULL; the struct_size field comes first and is read alone.
        let size = unsafe { std::ptr::addr_of!((*oob).struct_size).read() };
        if size as usize != size_of::<mcast_oob_t>() {
            return Err(Error::invalid_argument(format!(
                "oob->struct_size is {size}, expected sizeof(mcast_oob_t) = {}",
                size_of::<mcast_oob_t>()
            )));
        }
        // SAFETY: a full mcast_oob_t, as its struct_size says.
        let o = unsafe { *oob };
        let Some(f) = o.allgather else {
            return Err(Error::invalid_argument("oob->allgather is NULL"));
        };
        let context = handles::context(ctx.id)?;
        let mut gather = |send: &[u8], recv: &mut [u8]| -> std::result::Result<(), String> {
            // SAFETY: the caller's allgather over buffers of the sizes it is told.
            let rc = unsafe { f(send.as_ptr().cast(), recv.as_mut_ptr().cast(), send.len(), o.user) };
            if rc == 0 {
                Ok(())
            } else {
                Err(format!("the application's allgather (oob->allgather) returned {rc}"))
            }
        };
        let team = AnyTeam::init_oob(&context, &mut gather, o.nranks, o.rank, device)?;
        *out = mcast_team_t { id: handles::insert_team(team) };
        Ok(())
    })
}
