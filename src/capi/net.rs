//! `mcast_net_ops_t`: the engine between NVLink domains as a C table (`libmcast_mpi`'s, or the
//! application's own), adapted to the runtime's [`Engine`] and [`RailComm`] traits.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::{offset_of, size_of};
use std::sync::Arc;

use super::collective::{mcast_dtype_t, mcast_op_t, mcast_stream_t};
use super::context::mcast_context_t;
use super::team::mcast_oob_t;
use super::{guard, mcast_status_t};
use crate::driver::{DevicePtr, Stream};
use crate::kernels::{DType, RedOp};
use crate::runtime::net::{Engine, RailComm, RailOob};
use crate::runtime::{handles, Error, ErrorKind, Result};

/// `mcast_net_ops_t.flags`: the engine's calls enqueue on the stream they are given (NCCL);
/// without it mcast synchronises the stream before each call, and each call completes before
/// it returns (MPI). With it, on CUDA, the all-reduce of a large message (at least 32 MiB
/// through the rails) is pipelined: its rail all-reduces are given the rank's internal rail
/// stream (made with the team, non-blocking), ordered with the caller's stream by events, so
/// the engine must accept calls on any stream of the rank's device, in issue order.
pub const MCAST_NET_STREAM_ORDERED: u32 = 1;

/// Makes a communicator over one rail.
pub type mcast_net_comm_create_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        rail: c_int,
        domain: c_int,
        ndomains: c_int,
        oob: *const mcast_oob_t,
        comm: *mut *mut c_void,
    ) -> c_int,
>;
/// All-reduce on a rail.
pub type mcast_net_all_reduce_fn = Option<
    unsafe extern "C" fn(
        comm: *mut c_void,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: mcast_dtype_t,
        op: mcast_op_t,
        stream: mcast_stream_t,
    ) -> c_int,
>;
/// Reduce-scatter on a rail.
pub type mcast_net_reduce_scatter_fn = Option<
    unsafe extern "C" fn(
        comm: *mut c_void,
        send: *const c_void,
        recv: *mut c_void,
        recv_count: usize,
        dtype: mcast_dtype_t,
        op: mcast_op_t,
        stream: mcast_stream_t,
    ) -> c_int,
>;
/// All-gather on a rail.
pub type mcast_net_all_gather_fn = Option<
    unsafe extern "C" fn(
        comm: *mut c_void,
        send: *const c_void,
        recv: *mut c_void,
        send_count: usize,
        dtype: mcast_dtype_t,
        stream: mcast_stream_t,
    ) -> c_int,
>;
/// Broadcast on a rail.
pub type mcast_net_broadcast_fn = Option<
    unsafe extern "C" fn(
        comm: *mut c_void,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: mcast_dtype_t,
        root: c_int,
        stream: mcast_stream_t,
    ) -> c_int,
>;
/// Aborts or destroys a rail communicator.
pub type mcast_net_comm_fn = Option<unsafe extern "C" fn(comm: *mut c_void) -> c_int>;
/// Releases the engine's `user`.
pub type mcast_net_release_fn = Option<unsafe extern "C" fn(user: *mut c_void)>;

/// The engine between NVLink domains (docs/domains.md). Each call moves
/// device memory of the calling rank's device; positions on a rail (`domain`, `root`, block
/// order) are domain indices. Every function returns 0 on success; any other value fails the
/// collective on every rank of the team with `MCAST_ERROR_DRIVER`, naming the engine, the
/// function and the value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mcast_net_ops_t {
    /// `sizeof(mcast_net_ops_t)` (a table of an earlier version, up to `destroy`, is accepted).
    pub struct_size: u32,
    /// Shown in `mcast_team_info_t.net_engine` and in messages; copied at registration.
    pub name: *const c_char,
    /// `MCAST_NET_STREAM_ORDERED` (1: the calls enqueue on the stream given; a large all-reduce
    /// then gives its rail all-reduces mcast's internal rail stream of the rank, ordered with
    /// the caller's stream by events, so the engine must accept any stream of the rank's
    /// device; with `MCAST_CHECK_CALLS` on, the ranks compare their calls over mcast's own
    /// connections, on the host, before any engine call), or 0 (each call completes before it
    /// returns: mcast synchronises the stream before it, and with `MCAST_CHECK_CALLS` on, a
    /// collective first compares the ranks' calls across the domains with one `all_gather` of
    /// 4 x domain-size `MCAST_UINT32` words).
    pub flags: u32,
    /// A communicator over one rail: the ranks with local index `rail`, this one at position
    /// `domain` of `ndomains`; `oob` is an allgather over exactly those ranks, provided by mcast,
    /// valid during this call only.
    pub comm_create: mcast_net_comm_create_fn,
    /// Element-wise reduction of every member's `send`, left in every member's `recv`.
    pub all_reduce: mcast_net_all_reduce_fn,
    /// `send` holds `ndomains` blocks of `recv_count`; member d receives the reduction of block d.
    pub reduce_scatter: mcast_net_reduce_scatter_fn,
    /// Member d's `send_count` elements land at block d of every member's `recv`.
    pub all_gather: mcast_net_all_gather_fn,
    /// `root`'s `send` lands in every member's `recv`.
    pub broadcast: mcast_net_broadcast_fn,
    /// Ends the communicator's pending and future calls (`mcast_team_abort`).
    pub abort: mcast_net_comm_fn,
    /// Releases the communicator (team destroy).
    pub destroy: mcast_net_comm_fn,
    /// Optional (NULL: nothing to release): called once with `user` when the context no longer
    /// uses the engine (the context and every team made with it destroyed, or another engine
    /// registered). Appended after `destroy`.
    pub release: mcast_net_release_fn,
}

/// The size of the first version of `mcast_net_ops_t` (up to `destroy`).
const NET_OPS_V1: usize = offset_of!(mcast_net_ops_t, release);

/// Makes `ops` the engine between NVLink domains of the teams made in `ctx` from now on (teams
/// already made keep theirs); NULL goes back to `MCAST_NET`. The table is copied (its `name`
/// too); `user` is passed to `comm_create` and, when the context no longer needs it, to
/// `release`. `MCAST_ERROR_INVALID_ARGUMENT`: `struct_size` below the table's first version, a
/// NULL `name` or function (other than `release`), unknown `flags` bits.
/// `MCAST_ERROR_INVALID_HANDLE`: `ctx` not live. On failure nothing changes (and `release` is
/// not called). Thread-safe.
///
/// # Safety
/// `ops` must be NULL or point to a table of `ops->struct_size` readable bytes whose functions
/// honour their contracts; `name` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn mcast_context_set_net(
    ctx: mcast_context_t,
    ops: *const mcast_net_ops_t,
    user: *mut c_void,
) -> mcast_status_t {
    guard("mcast_context_set_net", || {
        let context = handles::context(ctx.id)?;
        if ops.is_null() {
            context.set_net(None);
            return Ok(());
        }
        // SAFETY: non-NULL; the struct_size field comes first and is read alone.
        let given = unsafe { std::ptr::addr_of!((*ops).struct_size).read() } as usize;
        if given < NET_OPS_V1 {
            return Err(Error::invalid_argument(format!(
                "ops->struct_size is {given}; set it to sizeof(mcast_net_ops_t) ({}; at least {NET_OPS_V1})",
                size_of::<mcast_net_ops_t>()
            )));
        }
        let mut table = mcast_net_ops_t {
            struct_size: 0,
            name: std::ptr::null(),
            flags: 0,
            comm_create: None,
            all_reduce: None,
            reduce_scatter: None,
            all_gather: None,
            broadcast: None,
            abort: None,
            destroy: None,
            release: None,
        };
        let n = given.min(size_of::<mcast_net_ops_t>());
        // SAFETY: the caller's table holds `given` bytes; the first `n` are copied over a valid
        // value whose fields are all nullable pointers or integers.
        unsafe { std::ptr::copy_nonoverlapping(ops.cast::<u8>(), (&mut table as *mut mcast_net_ops_t).cast(), n) };
        let engine = CEngine::new(table, user)?;
        context.set_net(Some(Arc::new(engine)));
        Ok(())
    })
}

/// A C table as an [`Engine`].
struct CEngine {
    ops: mcast_net_ops_t,
    name: String,
    user: *mut c_void,
}

// SAFETY: the table's functions are thread-safe by the contract of `mcast_context_set_net`;
// `user` is only handed back to them.
unsafe impl Send for CEngine {}
// SAFETY: as above.
unsafe impl Sync for CEngine {}

impl CEngine {
    fn new(ops: mcast_net_ops_t, user: *mut c_void) -> Result<CEngine> {
        if ops.name.is_null() {
            return Err(Error::invalid_argument("ops->name is NULL"));
        }
        // SAFETY: a NUL-terminated string by the caller's promise.
        let name = unsafe { CStr::from_ptr(ops.name) }.to_string_lossy().into_owned();
        let missing = [
            ("comm_create", ops.comm_create.is_none()),
            ("all_reduce", ops.all_reduce.is_none()),
            ("reduce_scatter", ops.reduce_scatter.is_none()),
            ("all_gather", ops.all_gather.is_none()),
            ("broadcast", ops.broadcast.is_none()),
            ("abort", ops.abort.is_none()),
            ("destroy", ops.destroy.is_none()),
        ];
        if let Some((f, _)) = missing.iter().find(|(_, m)| *m) {
            return Err(Error::invalid_argument(format!("ops->{f} is NULL (engine \"{name}\")")));
        }
        if ops.flags & !MCAST_NET_STREAM_ORDERED != 0 {
            return Err(Error::invalid_argument(format!(
                "ops->flags is {:#x}: only MCAST_NET_STREAM_ORDERED ({MCAST_NET_STREAM_ORDERED:#x}) is defined",
                ops.flags
            )));
        }
        let ops = mcast_net_ops_t {
            release: if ops.struct_size as usize >= size_of::<mcast_net_ops_t>() { ops.release } else { None },
            ..ops
        };
        Ok(CEngine { ops, name, user })
    }
}

impl Drop for CEngine {
    fn drop(&mut self) {
        if let Some(release) = self.ops.release {
            // SAFETY: the caller's release, once, with its user.
            unsafe { release(self.user) };
        }
    }
}

/// The error of an engine function that returned `rc`.
fn failed(engine: &str, func: &str, rc: c_int) -> Error {
    Error::new(
        ErrorKind::Driver,
        format!("the engine \"{engine}\" between NVLink domains failed: {func} returned {rc}"),
    )
}

/// What `comm_create`'s oob callback reaches: mcast's rail allgather, and its first failure.
struct OobCall<'a> {
    oob: &'a dyn RailOob,
    ndomains: usize,
    error: RefCell<Option<Error>>,
}

unsafe extern "C" fn rail_allgather(send: *const c_void, recv: *mut c_void, bytes: usize, user: *mut c_void) -> c_int {
    // SAFETY: `user` is the `OobCall` of the `comm_create` call running on this thread.
    let call = unsafe { &*(user as *const OobCall<'_>) };
    let n = call.ndomains;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if send.is_null() || recv.is_null() {
            return Err(Error::invalid_argument("the rail allgather was given a NULL buffer"));
        }
        // SAFETY: the engine passes `bytes` readable bytes and `ndomains * bytes` writable ones.
        let (s, r) = unsafe {
            (
                std::slice::from_raw_parts(send.cast::<u8>(), bytes),
                std::slice::from_raw_parts_mut(recv.cast::<u8>(), n * bytes),
            )
        };
        call.oob.allgather(s, r)
    }));
    match result {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            call.error.borrow_mut().get_or_insert(e);
            -1
        }
        Err(_) => {
            call.error.borrow_mut().get_or_insert(Error::internal("the rail allgather panicked"));
            -1
        }
    }
}

impl Engine for CEngine {
    fn name(&self) -> &str {
        &self.name
    }

    fn stream_ordered(&self) -> bool {
        self.ops.flags & MCAST_NET_STREAM_ORDERED != 0
    }

    fn comm_create(&self, rail: usize, domain: usize, ndomains: usize, oob: &dyn RailOob) -> Result<Box<dyn RailComm>> {
        let call = OobCall { oob, ndomains, error: RefCell::new(None) };
        let table = mcast_oob_t {
            struct_size: size_of::<mcast_oob_t>() as u32,
            allgather: Some(rail_allgather),
            user: (&call as *const OobCall<'_>).cast_mut().cast(),
            rank: domain as i32,
            nranks: ndomains as i32,
        };
        let mut comm: *mut c_void = std::ptr::null_mut();
        let f = self.ops.comm_create.expect("checked at registration");
        // SAFETY: the engine's function with its user, a valid oob table living through the
        // call, and an out-pointer.
        let rc = unsafe { f(self.user, rail as c_int, domain as c_int, ndomains as c_int, &table, &mut comm) };
        if let Some(e) = call.error.into_inner() {
            if rc == 0 {
                tracing::warn!("engine \"{}\": comm_create returned 0 after its oob allgather failed", self.name);
            }
            return Err(e.context(format!("engine \"{}\": comm_create's oob allgather over rail {rail}", self.name)));
        }
        if rc != 0 {
            return Err(failed(&self.name, "comm_create", rc));
        }
        Ok(Box::new(CComm { ops: self.ops, name: self.name.clone(), comm }))
    }
}

/// One rail's communicator of a C engine.
struct CComm {
    ops: mcast_net_ops_t,
    name: String,
    comm: *mut c_void,
}

// SAFETY: the engine's functions are thread-safe by contract; `comm` is only handed to them.
unsafe impl Send for CComm {}
// SAFETY: as above.
unsafe impl Sync for CComm {}

fn stream_of(s: Stream) -> mcast_stream_t {
    s.0 as mcast_stream_t
}

fn cptr(p: DevicePtr) -> *mut c_void {
    p as usize as *mut c_void
}

impl CComm {
    fn check(&self, func: &str, rc: c_int) -> Result<()> {
        if rc == 0 {
            Ok(())
        } else {
            Err(failed(&self.name, func, rc))
        }
    }
}

impl RailComm for CComm {
    fn all_reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DType,
        op: RedOp,
        stream: Stream,
    ) -> Result<()> {
        let f = self.ops.all_reduce.expect("checked at registration");
        // SAFETY: the engine's function on its communicator with device pointers of this rank.
        let rc = unsafe {
            f(
                self.comm,
                cptr(send),
                cptr(recv),
                count,
                mcast_dtype_t(dtype as u32),
                mcast_op_t(op as u32),
                stream_of(stream),
            )
        };
        self.check("all_reduce", rc)
    }

    fn reduce_scatter(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        recv_count: usize,
        dtype: DType,
        op: RedOp,
        stream: Stream,
    ) -> Result<()> {
        let f = self.ops.reduce_scatter.expect("checked at registration");
        // SAFETY: as in all_reduce.
        let rc = unsafe {
            f(
                self.comm,
                cptr(send),
                cptr(recv),
                recv_count,
                mcast_dtype_t(dtype as u32),
                mcast_op_t(op as u32),
                stream_of(stream),
            )
        };
        self.check("reduce_scatter", rc)
    }

    fn all_gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        send_count: usize,
        dtype: DType,
        stream: Stream,
    ) -> Result<()> {
        let f = self.ops.all_gather.expect("checked at registration");
        // SAFETY: as in all_reduce.
        let rc =
            unsafe { f(self.comm, cptr(send), cptr(recv), send_count, mcast_dtype_t(dtype as u32), stream_of(stream)) };
        self.check("all_gather", rc)
    }

    fn broadcast(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DType,
        root: usize,
        stream: Stream,
    ) -> Result<()> {
        let f = self.ops.broadcast.expect("checked at registration");
        // SAFETY: as in all_reduce.
        let rc = unsafe {
            f(self.comm, cptr(send), cptr(recv), count, mcast_dtype_t(dtype as u32), root as c_int, stream_of(stream))
        };
        self.check("broadcast", rc)
    }

    fn abort(&self) -> Result<()> {
        let f = self.ops.abort.expect("checked at registration");
        // SAFETY: the engine's function on its communicator.
        self.check("abort", unsafe { f(self.comm) })
    }

    fn destroy(self: Box<Self>) -> Result<()> {
        let f = self.ops.destroy.expect("checked at registration");
        // SAFETY: the engine's function on its communicator, once.
        self.check("destroy", unsafe { f(self.comm) })
    }
}
