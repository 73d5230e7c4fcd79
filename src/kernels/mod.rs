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

pub use crate::types::{DType, RedOp};
pub use cuda::launch;
pub use error::KernelError;

/// Loads the module of `unit` built as `variant` on `dev`, as a kind's first call would: on
/// CUDA compiled (or read from the cache) and loaded ([`cuda::prepare`]), on the simulator its
/// simulated load ([`sim::load_module`]). Either waits, the first time, for the kernels running
/// on the device: call it before launching kernels that wait for work not yet issued.
pub fn load_module(
    driver: &dyn crate::driver::Driver,
    dev: Device,
    variant: abi::Variant,
    unit: select::Unit,
) -> Result<(), KernelError> {
    match driver.as_sim() {
        Some(s) => sim::load_module(s, dev, variant, unit),
        None => cuda::prepare(driver, dev, variant, unit).map(|_| ()),
    }
}

/// Checks the addresses of `l` for `kind`, one of the library's own kernels beside the
/// collectives' (the barrier, the copy-out), before either backend enqueues it: a rank of a team
/// of 1 to [`MAX_RANKS`], one sync and one data address per rank, and `out` empty or one per
/// rank.
pub(crate) fn check_fixed(l: &Launch, kind: abi::KernelKind) -> Result<(), KernelError> {
    let n = l.nranks as usize;
    let out_ok = l.out.is_empty() || l.out.len() == n;
    if n == 0 || l.rank >= l.nranks || l.sync.len() != n || l.data.len() != n || !out_ok || n > MAX_RANKS {
        return Err(KernelError::Unsupported(format!(
            "{kind:?} of rank {} with {} sync, {} data and {} out addresses for {n} ranks",
            l.rank,
            l.sync.len(),
            l.data.len(),
            l.out.len()
        )));
    }
    Ok(())
}

/// Most ranks a team and a collective kernel take: the 72 GPUs of an NVL72 rack.
pub const MAX_RANKS: usize = 72;

/// Bytes per rank, at the start of a team's first segment, reserved for barrier signal words
/// and the rank's device state (epochs, error word). A multiple of the multicast granularity's
/// divisors (4 KiB) so user buffers after it stay 4 KiB aligned.
pub const SYNC_BYTES: usize = 64 * 1024;

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

/// One address per rank (at most [`MAX_RANKS`]), stored inline: building a [`Launch`] allocates
/// nothing. Reads as a slice of its ranks (`len`, indexing, `iter`, `is_empty`).
#[derive(Clone, Copy)]
pub struct RankPtrs {
    len: usize,
    ptrs: [DevicePtr; MAX_RANKS],
}

impl RankPtrs {
    /// No address (an empty `out`: in place).
    pub const EMPTY: RankPtrs = RankPtrs { len: 0, ptrs: [0; MAX_RANKS] };

    /// `n` zero addresses. Panics when `n > MAX_RANKS` (a team never has more ranks).
    pub fn zeroed(n: usize) -> RankPtrs {
        assert!(n <= MAX_RANKS, "{n} ranks: at most {MAX_RANKS}");
        RankPtrs { len: n, ptrs: [0; MAX_RANKS] }
    }

    /// `f(p)` for each rank `p` of `0..n`; the first error ends it. Panics when `n > MAX_RANKS`.
    pub fn try_from_fn<E>(n: usize, mut f: impl FnMut(usize) -> Result<DevicePtr, E>) -> Result<RankPtrs, E> {
        let mut a = RankPtrs::zeroed(n);
        for (p, slot) in a.iter_mut().enumerate() {
            *slot = f(p)?;
        }
        Ok(a)
    }

    /// Appends `p`. Panics past [`MAX_RANKS`] addresses.
    pub fn push(&mut self, p: DevicePtr) {
        assert!(self.len < MAX_RANKS, "more than {MAX_RANKS} rank addresses");
        self.ptrs[self.len] = p;
        self.len += 1;
    }

    /// Removes and returns the last address.
    pub fn pop(&mut self) -> Option<DevicePtr> {
        self.len = self.len.checked_sub(1)?;
        Some(self.ptrs[self.len])
    }

    /// The addresses of `ptrs` (at most [`MAX_RANKS`]; panics beyond).
    pub fn from_slice(ptrs: &[DevicePtr]) -> RankPtrs {
        let mut a = RankPtrs::zeroed(ptrs.len());
        a.copy_from_slice(ptrs);
        a
    }
}

impl Default for RankPtrs {
    fn default() -> Self {
        RankPtrs::EMPTY
    }
}

impl std::ops::Deref for RankPtrs {
    type Target = [DevicePtr];

    fn deref(&self) -> &[DevicePtr] {
        &self.ptrs[..self.len]
    }
}

impl std::ops::DerefMut for RankPtrs {
    fn deref_mut(&mut self) -> &mut [DevicePtr] {
        &mut self.ptrs[..self.len]
    }
}

impl PartialEq for RankPtrs {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for RankPtrs {}

impl std::fmt::Debug for RankPtrs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

impl<'a> IntoIterator for &'a RankPtrs {
    type Item = &'a DevicePtr;
    type IntoIter = std::slice::Iter<'a, DevicePtr>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl From<&[DevicePtr]> for RankPtrs {
    fn from(ptrs: &[DevicePtr]) -> Self {
        RankPtrs::from_slice(ptrs)
    }
}

impl From<Vec<DevicePtr>> for RankPtrs {
    fn from(ptrs: Vec<DevicePtr>) -> Self {
        RankPtrs::from_slice(&ptrs)
    }
}

impl<const N: usize> From<[DevicePtr; N]> for RankPtrs {
    fn from(ptrs: [DevicePtr; N]) -> Self {
        RankPtrs::from_slice(&ptrs)
    }
}

impl FromIterator<DevicePtr> for RankPtrs {
    /// Panics past [`MAX_RANKS`] addresses.
    fn from_iter<I: IntoIterator<Item = DevicePtr>>(iter: I) -> Self {
        let mut a = RankPtrs::EMPTY;
        for p in iter {
            a.push(p);
        }
        a
    }
}

/// One rank's part of one collective: everything a kernel needs, as addresses valid on `dev`.
/// Built on the stack for every call (the address lists are [`RankPtrs`], not vectors).
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
    pub data: RankPtrs,
    /// Multicast address (on `dev`) of byte `offset` of the buffer, on the multicast path.
    pub data_mc: Option<DevicePtr>,
    /// Out of place: for each rank, where the results for that rank's `data` go, in the layout
    /// of `data` (all-gather and reduce-scatter bases shifted by the block offset the kernel adds,
    /// so they may not be addresses themselves). Empty: in place (`out == data`).
    pub out: RankPtrs,
    /// Multicast address of `out[rank]`, on the multicast path out of place.
    pub out_mc: Option<DevicePtr>,
    /// For each rank, the address (on `dev`) of that rank's sync region ([`SYNC_BYTES`]).
    pub sync: RankPtrs,
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
    /// The call's signature ([`abi::signature`]), published and compared with every peer's at
    /// the kernel's entry; `None` skips the check (the copy-engine forms' exit barrier).
    pub signature: Option<[u64; 2]>,
    /// All-gather out of place: bytes from one rank's block of `out` to the next, where they lie
    /// further apart than in `data` (the pointer form's staged route writes each chunk's blocks
    /// straight into `recv`); 0: `count`. Only the P2P and LL all-gather kernels honour it. Set,
    /// it also says that the peers' entries of `out` are not their results (their staging
    /// areas), so the plan runs the pulling all-gather, which writes this rank's out alone.
    pub out_stride: u64,
}
