//! The all-gather's plan. S: one rank's block in bytes (count), each rank's payload to each
//! peer; the grid counts every rank's blocks, N S.
//!
//! | algorithm (kernel) | runs when | 2 ranks | 3 ranks | 4 ranks | 5 ranks | 8 ranks | grid |
//! |---|---|---|---|---|---|---|---|
//! | LL (`AllGatherLl`) | LL team | ≤ 256 KiB | ≤ 256 KiB | ≤ 256 KiB | ≤ 256 KiB | ≤ 200 KiB | ⌈S / 4 KiB⌉ up to 32 |
//! | multicast (`AllGatherMc`) | multicast team | never | any | any | any | any | ⌈N S / 32 KiB⌉ |
//! | push (`AllGatherP2pPush`) | always | any | any | any | any | any | ⌈N S / 32 KiB⌉, ⌈N S / 16 KiB⌉ from 3 ranks |
//!
//! LL ends at [`ll_max_payload`](super::cost::ll_max_payload) (the landing area, or the cost
//! model's P* = 2 D B / (N-1) at eight ranks); the multicast kernel never pays at two ranks and
//! loses to LL where it serves ([`multicast_pays`](super::cost::multicast_pays)). The push
//! stores each rank's block into every rank's out (SM pushes cross NVLink at 362-366 GB/s
//! against 337 for pulls on 2 x H200, shared/reference/p2p-roofline.md); the pull
//! (`AllGatherP2p`, the same grid) runs in its place where the peers' outs are not their
//! results: the pointer form's staged route, which writes each chunk's blocks straight into this
//! rank's `recv` ([`Launch::out_stride`](crate::kernels::Launch::out_stride) set). The kernels:
//! `kernels/all_gather/` (`push.cu`, `pull.cu`, `multicast.cu`; LL's in `ll.cu` over
//! `kernels/ll.cuh`; `service.cu`: the barrier and copy-out kernels of the module, which the plan
//! never picks).

use super::{Call, Choice, BYTES_PER_BLOCK};
use crate::kernels::abi::entry::KernelKind;

/// The all-gather's kernel and grid (the table).
pub(super) fn choose(c: &Call) -> Choice {
    match (c.mc && !c.l.local_only, c.ll) {
        (true, _) => c.choice(KernelKind::AllGatherMc, c.grid(BYTES_PER_BLOCK)),
        (false, true) => c.choice(KernelKind::AllGatherLl, c.ll_grid()),
        (false, false) if c.l.out_stride == 0 => c.choice(KernelKind::AllGatherP2pPush, c.pull_grid()),
        (false, false) => c.choice(KernelKind::AllGatherP2p, c.pull_grid()),
    }
}
