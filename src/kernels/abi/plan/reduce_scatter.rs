//! The reduce-scatter's plan. S: one rank's block in bytes (count x element size), each rank's
//! payload to each peer.
//!
//! | algorithm (kernel) | runs when | 2 ranks | 3 ranks | 4 ranks | 5 ranks | 8 ranks | grid |
//! |---|---|---|---|---|---|---|---|
//! | LL (`ReduceScatterLl`) | LL team | ≤ 256 KiB | ≤ 256 KiB | ≤ 256 KiB | ≤ 256 KiB | ≤ 200 KiB | ⌈S / 4 KiB⌉ up to 32 |
//! | multicast (`ReduceScatterMc`) | multicast team | never | any | any | any | any | ⌈S / 32 KiB⌉ |
//! | push (`ReduceScatterP2pPush`) | 16-byte aligned blocks | any | any | any | never | never | ⌈S / 8 KiB⌉ |
//! | pull (`ReduceScatterP2p`) | always | any | any | any | any | any | ⌈S / 32 KiB⌉, ⌈S / 16 KiB⌉ from 3 ranks |
//!
//! LL ends at [`ll_max_payload`](super::cost::ll_max_payload) (the landing area, or the cost
//! model's P* = 2 D B / (N-1) at eight ranks); the multicast kernel never pays at two ranks and
//! loses to LL where it serves ([`multicast_pays`](super::cost::multicast_pays)). Above LL the
//! push where the team keeps its scratch (at most
//! [`PUSH_MAX_RANKS`](super::super::layout::PUSH_MAX_RANKS) ranks) and every block is whole
//! 16-byte vectors (this rank's data aligned, S a multiple of 16): each rank stores block
//! p of its data into rank p's scratch rows and reduces its own block from what its peers stored,
//! with no barrier (kernels/push.cuh); else the pull, two barriers around loads of every peer's
//! block. The pointer form's one-launch route (`local_only`) runs the push at any size and
//! alignment where the blocks are whole 16-byte vectors ([`push_serves_local`](super::push_serves_local)). The kernels: `kernels/reduce_scatter/` (`p2p.cu`, `push.cu`, `multicast.cu`; LL's
//! in `ll.cu` over `kernels/ll.cuh`).

use super::{Call, Choice, BYTES_PER_BLOCK};
use crate::kernels::abi::entry::KernelKind;

/// The reduce-scatter's kernel and grid (the table).
pub(super) fn choose(c: &Call) -> Choice {
    let kind = match c.mc {
        false if c.ll => KernelKind::ReduceScatterLl,
        _ if c.l.local_only && c.ll => KernelKind::ReduceScatterLl,
        _ if c.l.local_only => KernelKind::ReduceScatterP2pPush,
        true => KernelKind::ReduceScatterMc,
        // Every destination's block 16-byte aligned: this rank's data and the block size, equal
        // on every rank. Not its out: the staged route's is the caller's recv, of this rank's
        // own alignment, which decides only whether the kernel's stores into it are vectors.
        false if c.push_fits(c.me | c.bytes) => KernelKind::ReduceScatterP2pPush,
        false => KernelKind::ReduceScatterP2p,
    };
    match kind {
        KernelKind::ReduceScatterLl => c.choice(kind, c.ll_grid()),
        KernelKind::ReduceScatterP2pPush => c.push_choice(kind, c.bytes),
        KernelKind::ReduceScatterP2p => c.choice(kind, c.pull_grid()),
        _ => c.choice(kind, c.grid(BYTES_PER_BLOCK)),
    }
}
