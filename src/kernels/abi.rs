//! The ABI between the host and the kernel source in `kernels/`: the sync-region layout and
//! launch constants ([`layout`]), the kernel argument and its builder ([`args`]), the entry points
//! ([`entry`]) and the kernel plan ([`plan`](mod@plan)). Everything mirrored from the source is checked by
//! tests that parse it.

pub mod args;
pub mod entry;
pub mod layout;
pub mod plan;
pub mod signature;

pub use args::*;
pub use entry::*;
pub use layout::*;
pub use plan::*;

/// A two-rank launch at rank 1 (data, out and sync addresses of both ranks), for the tests.
#[cfg(test)]
pub(crate) fn test_launch(collective: super::Collective, path: super::Path, count: u64) -> super::Launch {
    super::Launch {
        collective,
        path,
        rank: 1,
        nranks: 2,
        dev: 0,
        stream: crate::driver::Stream::DEFAULT,
        data: [0x1000_0000, 0x2000_0000].into(),
        data_mc: None,
        out: super::RankPtrs::EMPTY,
        out_mc: None,
        sync: [0x3000_0000, 0x4000_0000].into(),
        sync_mc: None,
        count,
        timeout_ns: 5,
        max_blocks: GRID_MAX_BLOCKS,
        local_only: false,
        ll: false,
        signature: None,
        out_stride: 0,
    }
}
