//! Device kernels: NVRTC compilation, caching and launch on CUDA; host execution of the same
//! algorithms on the simulator.
//!
//! The runtime describes one rank's part of a collective with a [`Launch`] and hands it to this
//! layer; this layer knows nothing of teams or handles, only addresses.

use crate::driver::{Device, DevicePtr, Stream};

pub mod abi;
pub mod cache;
pub mod cuda;
pub mod error;
pub mod nvrtc;
pub mod select;
pub mod sim;
pub mod source;

pub use cuda::launch;
pub use error::KernelError;

/// Most ranks a team and a collective kernel take: the 72 GPUs of an NVL72 rack.
pub const MAX_RANKS: usize = 72;

/// Bytes per rank, at the start of a team's first segment, reserved for barrier signal words
/// and the rank's device state (epochs, error word). A multiple of the multicast granularity's
/// divisors (4 KiB) so user buffers after it stay 4 KiB aligned.
pub const SYNC_BYTES: usize = 64 * 1024;

/// Element types, numbered as `mcast_dtype_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// `float`.
    F32 = 0,
    /// `double`.
    F64 = 1,
    /// IEEE half.
    F16 = 2,
    /// bfloat16.
    BF16 = 3,
    /// `int32_t`.
    I32 = 4,
    /// `uint32_t`.
    U32 = 5,
    /// `int64_t`.
    I64 = 6,
    /// `uint64_t`.
    U64 = 7,
}

impl DType {
    /// Every dtype, in `mcast_dtype_t` order.
    pub const ALL: [DType; 8] =
        [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::U32, DType::I64, DType::U64];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// Short name used in kernel names and messages (`"bf16"`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::U64 => "u64",
        }
    }

    /// From the `mcast_dtype_t` integer.
    pub fn from_raw(raw: u32) -> Option<DType> {
        DType::ALL.get(raw as usize).copied()
    }
}

/// Reduction operators, numbered as `mcast_op_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedOp {
    /// Sum.
    Sum = 0,
    /// Minimum.
    Min = 1,
    /// Maximum.
    Max = 2,
}

impl RedOp {
    /// Every operator, in `mcast_op_t` order.
    pub const ALL: [RedOp; 3] = [RedOp::Sum, RedOp::Min, RedOp::Max];

    /// Short name used in kernel names and messages (`"sum"`).
    pub fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Min => "min",
            RedOp::Max => "max",
        }
    }

    /// From the `mcast_op_t` integer.
    pub fn from_raw(raw: u32) -> Option<RedOp> {
        RedOp::ALL.get(raw as usize).copied()
    }
}

/// Which collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Root's range copied to every rank; `count` is in bytes.
    Broadcast {
        /// The source rank.
        root: u32,
    },
    /// Element-wise reduction of every rank's range, left on every rank.
    AllReduce {
        /// Element type.
        dtype: DType,
        /// Operator.
        op: RedOp,
    },
    /// `nranks` blocks of `count` elements; rank r ends with the reduction of block r.
    ReduceScatter {
        /// Element type.
        dtype: DType,
        /// Operator.
        op: RedOp,
    },
    /// Rank r contributes block r of `count` bytes; every rank ends with all blocks.
    AllGather,
}

/// How ranks reach each other's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Path {
    /// `multimem` instructions on multicast addresses.
    Multicast,
    /// Loads and stores through peer mappings.
    P2P,
}

/// One rank's part of one collective: everything a kernel needs, as addresses valid on `dev`.
#[derive(Clone, Debug)]
pub struct Launch {
    /// Which collective.
    pub collective: Collective,
    /// Transport path.
    pub path: Path,
    /// This rank.
    pub rank: u32,
    /// Team size.
    pub nranks: u32,
    /// The device this rank runs on.
    pub dev: Device,
    /// The caller's stream.
    pub stream: Stream,
    /// For each rank, the address (on `dev`) of byte `offset` of that rank's copy of the buffer.
    pub data: Vec<DevicePtr>,
    /// Multicast address (on `dev`) of byte `offset` of the buffer, on the multicast path.
    pub data_mc: Option<DevicePtr>,
    /// Out of place: for each rank, where the results for that rank's `data` go, in the layout
    /// of `data` (all-gather and reduce-scatter bases shifted by the block offset the kernel adds,
    /// so they may not be addresses themselves). Empty: in place (`out == data`).
    pub out: Vec<DevicePtr>,
    /// Multicast address of `out[rank]`, on the multicast path out of place.
    pub out_mc: Option<DevicePtr>,
    /// For each rank, the address (on `dev`) of that rank's sync region ([`SYNC_BYTES`]).
    pub sync: Vec<DevicePtr>,
    /// Multicast address (on `dev`) of the sync region, on the multicast path.
    pub sync_mc: Option<DevicePtr>,
    /// Elements (all-reduce, reduce-scatter per block) or bytes (broadcast, all-gather per block).
    pub count: u64,
    /// Barrier spin bound in nanoseconds; 0 waits forever.
    pub timeout_ns: u64,
    /// Most blocks a kernel may use: every block of every rank sharing a device must be resident
    /// at once (blocks wait for their peers in barriers), so the team caps the grid by the SM
    /// count over the ranks per device. The same on every rank.
    pub max_blocks: u32,
    /// The peers' `data` and `out` are not addressable (the pointer form on memory only this
    /// rank maps): only the push all-reduce may run, which reads nothing but this rank's own
    /// memory and the scratch the peers write into.
    pub local_only: bool,
    /// The team keeps an LL landing area and runs the LL kernels where they serve
    /// ([`abi::ll_serves`]). The same on every rank.
    pub ll: bool,
}
