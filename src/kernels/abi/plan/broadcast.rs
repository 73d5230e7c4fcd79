//! The broadcast's plan. S: the message's bytes (count), the root's payload to each peer.
//!
//! | algorithm (kernel) | runs when | 2 ranks | 3 ranks | 4 ranks | 5 ranks | 8 ranks | grid |
//! |---|---|---|---|---|---|---|---|
//! | LL (`BroadcastLl`) | LL team | ≤ 256 KiB | ≤ 256 KiB | ≤ 256 KiB | ≤ 256 KiB | ≤ 200 KiB | ⌈S / 4 KiB⌉ up to 32 |
//! | multicast (`BroadcastMc`) | multicast team | never | any | any | any | any | ⌈S / 32 KiB⌉ |
//! | scatter then all-gather (`BroadcastP2pScatter`) | always | never | ≥ 720 KiB | ≥ 368 KiB | ≥ 240 KiB | ≥ 128 KiB | ⌈S / 16 KiB⌉ |
//! | pull (`BroadcastP2p`) | always | any | any | any | any | any | ⌈S / 32 KiB⌉, ⌈S / 16 KiB⌉ from 3 ranks |
//!
//! LL ends at [`ll_max_payload`](super::cost::ll_max_payload) (the landing area, or the cost
//! model's P* = 2 D B / (N-1) at eight ranks); the multicast kernel never pays at two ranks and
//! loses to LL where it serves ([`multicast_pays`](super::cost::multicast_pays)); the scatter
//! starts at [`broadcast_scatter_min_bytes`], the model's S* = D B / (N-2), where the root's
//! egress carrying the message N - 1 times costs more than the owners' forwarding hop. The kernels: `kernels/broadcast/` (`pull.cu`, `scatter.cu`, `multicast.cu`; LL's in
//! `ll.cu` over `kernels/ll.cuh`).

use super::cost::broadcast_scatter_min_bytes;
use super::{Call, Choice, BYTES_PER_BLOCK};
use crate::kernels::abi::entry::KernelKind;

/// The broadcast's kernel and grid (the table).
pub(super) fn choose(c: &Call) -> Choice {
    let scatter = broadcast_scatter_min_bytes(c.l.nranks).is_some_and(|min| c.l.count >= min);
    match (c.mc && !c.l.local_only, c.ll) {
        (true, _) => c.choice(KernelKind::BroadcastMc, c.grid(BYTES_PER_BLOCK)),
        (false, true) => c.choice(KernelKind::BroadcastLl, c.ll_grid()),
        (false, false) if scatter => c.choice(KernelKind::BroadcastP2pScatter, c.pull_grid()),
        (false, false) => c.choice(KernelKind::BroadcastP2p, c.pull_grid()),
    }
}
