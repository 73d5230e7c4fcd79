//! Engines between NVLink domains: what a team that spans several domains uses on its *rails*
//! (the ranks with the same index inside their domain). An engine is an existing, proven library
//! (NCCL loaded at run time, MPI through `libmcast_mpi`, or one the application registers with
//! `mcast_context_set_net`); mcast never moves data between domains itself.
//!
//! The C table `mcast_net_ops_t` is adapted to these traits in `capi`; built-in engines
//! implement them directly.

pub mod nccl;

use crate::driver::{DevicePtr, Stream};
use crate::kernels::{DType, RedOp};

use super::error::Result;

/// An allgather over exactly the ranks of one rail, provided by mcast (over its bootstrap) to
/// [`Engine::comm_create`].
pub trait RailOob: Sync {
    /// Every rail member passes `send` of the same length; `recv` (length `ndomains *
    /// send.len()`) receives them in domain order.
    fn allgather(&self, send: &[u8], recv: &mut [u8]) -> Result<()>;
}

/// An engine: makes one communicator per rail.
pub trait Engine: Send + Sync {
    /// Shown in `mcast_team_info_t.net_engine` and in messages (`"nccl 2.27.7"`, `"mpi"`).
    fn name(&self) -> &str;

    /// True when calls enqueue on the given stream (NCCL); false when mcast must synchronise
    /// the stream first and each call completes before it returns (MPI).
    fn stream_ordered(&self) -> bool;

    /// True when a stream-ordered engine's calls enqueue their work on the simulator's streams
    /// (through `SimDriver::enqueue`), so that the simulator can run its rail calls on the
    /// stream they are given; false (the default) when they run when called there, as the
    /// NCCL engine's do.
    fn enqueues_on_sim(&self) -> bool {
        false
    }

    /// A communicator over rail `rail`, this rank at position `domain` of `ndomains`.
    fn comm_create(&self, rail: usize, domain: usize, ndomains: usize, oob: &dyn RailOob) -> Result<Box<dyn RailComm>>;
}

/// One rail's communicator. Pointers are device memory of the calling rank's device; counts are
/// in elements of `dtype`. Positions (`root`, block order) are domain indices on the rail.
pub trait RailComm: Send + Sync {
    /// Element-wise reduction of every member's `send`, left in every member's `recv`.
    fn all_reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DType,
        op: RedOp,
        stream: Stream,
    ) -> Result<()>;

    /// `send` holds `ndomains` blocks of `recv_count`; member d receives the reduction of block d.
    fn reduce_scatter(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        recv_count: usize,
        dtype: DType,
        op: RedOp,
        stream: Stream,
    ) -> Result<()>;

    /// Member d's `send_count` elements land at block d of every member's `recv`.
    fn all_gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        send_count: usize,
        dtype: DType,
        stream: Stream,
    ) -> Result<()>;

    /// `root`'s `send` lands in every member's `recv`.
    fn broadcast(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DType,
        root: usize,
        stream: Stream,
    ) -> Result<()>;

    /// Ends every pending and future call of this communicator (the team was aborted).
    fn abort(&self) -> Result<()>;

    /// Releases the communicator.
    fn destroy(self: Box<Self>) -> Result<()>;
}

mod choose;

pub use choose::choose;
