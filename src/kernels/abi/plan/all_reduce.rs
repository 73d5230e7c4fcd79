//! The all-reduce's plan. S: the message's bytes (count x element size), each rank's payload.
//!
//! | algorithm (kernel) | runs when | 2 ranks | 3 ranks | 4 ranks | 5 ranks | 8 ranks | grid |
//! |---|---|---|---|---|---|---|---|
//! | LL (`AllReduceLl`) | LL team | ≤ 256 KiB | ≤ 256 KiB | ≤ 152 KiB | ≤ 104 KiB | ≤ 56 KiB | ⌈S / 4 KiB⌉ up to 32 |
//! | multicast (`AllReduceMc`) | multicast team | never | any | any | any | any | ⌈S / 32 KiB⌉ |
//! | push (`AllReduceP2pPush`) | 16-byte aligned | ≤ 4 MiB | ≤ 1056 KiB | ≤ 464 KiB | never | never | ⌈S / 8 KiB⌉ |
//! | one-shot pull (`AllReduceP2p`) | always | ≤ 1 MiB | ≤ 1056 KiB | ≤ 464 KiB | ≤ 288 KiB | ≤ 128 KiB | ⌈S / 8 KiB⌉ |
//! | two-shot push (`AllReduceP2pTwoShotPush`) | 16-byte aligned | any | any | any | never | never | ⌈S / 8 KiB⌉ |
//! | two-shot (`AllReduceP2pTwoShot`) | always | any | any | any | any | any | ⌈S / 32 KiB⌉, ⌈S / 16 KiB⌉ from 3 ranks |
//!
//! LL ends at [`ll_max_payload`](super::cost::ll_max_payload) (the landing area at two and three ranks, the cost model's
//! S* = D B N / (2 (N-1)^2) above); the multicast kernels never pay at two ranks and lose to LL
//! where it serves ([`multicast_pays`](super::cost::multicast_pays)); push ends at [`push_max_bytes`] (measured at two ranks,
//! the one-shot's limit above, and only teams of up to
//! [`PUSH_MAX_RANKS`](super::super::layout::PUSH_MAX_RANKS) keep its scratch);
//! one-shot at [`one_shot_max_bytes`] (one round of the full grid at two ranks, the model's
//! S* = D B N / ((N-1)(N-2)) above). Above them the two-shot, on the push protocol where the
//! team keeps its scratch (each rank's slice pushed into its owner's scratch rows, reduced there
//! and stored into every rank's out: every byte crosses NVLink as a store, at the push rate,
//! and one barrier, at the exit), else by loads of the peers' data (two barriers, the
//! reduce-scatter half at the pull rate). The kernels: `kernels/all_reduce/` (`one_shot.cu`,
//! `push.cu` over `kernels/push.cuh`, `two_shot.cu`, `multicast.cu`; LL's in `ll.cu` over
//! `kernels/ll.cuh`).

use super::cost::{one_shot_max_bytes, push_max_bytes};
use super::{two_shot_slice_bytes, Call, Choice, ONE_SHOT_BYTES_PER_BLOCK};
use crate::kernels::abi::entry::KernelKind;

/// The all-reduce's kernel and grid (the table).
pub(super) fn choose(c: &Call) -> Choice {
    let (l, n) = (c.l, c.l.nranks);
    let push = c.push_fits(c.me | c.out_me);
    let kind = match c.mc {
        false if c.ll => KernelKind::AllReduceLl,
        _ if l.local_only && c.ll => KernelKind::AllReduceLl,
        _ if l.local_only => KernelKind::AllReduceP2pPush,
        true => KernelKind::AllReduceMc,
        false if c.bytes <= push_max_bytes(n) && push => KernelKind::AllReduceP2pPush,
        false if c.bytes <= one_shot_max_bytes(n) => KernelKind::AllReduceP2p,
        false if push => KernelKind::AllReduceP2pTwoShotPush,
        false => KernelKind::AllReduceP2pTwoShot,
    };
    match kind {
        KernelKind::AllReduceLl => c.choice(kind, c.ll_grid()),
        KernelKind::AllReduceP2pPush => c.push_choice(kind, c.bytes),
        KernelKind::AllReduceP2pTwoShotPush => c.push_choice(kind, two_shot_slice_bytes(c.bytes, n)),
        KernelKind::AllReduceP2p => c.choice(kind, c.grid(ONE_SHOT_BYTES_PER_BLOCK)),
        KernelKind::AllReduceP2pTwoShot => c.choice(kind, c.pull_grid()),
        _ => c.choice(kind, c.grid(super::BYTES_PER_BLOCK)),
    }
}
