//! Teams that fail well (issue 15): abort from another thread and from a peer process, the
//! sticky asynchronous error, destroy and recovery after a failure, split, and the one-stream
//! deadlock caught on the host. On the simulator unless `MCAST_TEST_BACKEND=cuda` (then only the
//! GPU measurement runs; multicast stays off).
//!
//! Multi-process cases re-run this binary as the ranks (`MCAST_FAIL_CHILD` selects the role).
//!
//! The tests by theme: `abort.rs`, `timeout.rs`, `split.rs`, `errors.rs` (caught on the host),
//! `processes.rs` (with the ranks' side), `paused.rs`, `gpu.rs`.

// Loops over ranks index several per-rank vectors at once.
#![allow(clippy::needless_range_loop)]

mod abort;
#[path = "../common/mod.rs"]
mod common;
mod errors;
mod gpu;
mod paused;
mod processes;
mod split;
mod timeout;

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::*;
use mcast::bootstrap::new_unique_id;
use mcast::capi::status::mcast_status_t;
use mcast::capi::team::{mcast_team_abort, mcast_team_destroy, mcast_team_get_error, mcast_team_t};
use mcast::driver::{Device, Stream};
use mcast::kernels::{Collective, DType, RedOp};
use mcast::runtime::buffer::Buffer;
use mcast::runtime::collective::{run, synchronize};
use mcast::runtime::config::{Backend, Config, MulticastMode};
use mcast::runtime::context::Context;
use mcast::runtime::handles;
use mcast::runtime::team::{Team, SPLIT_NOCOLOR};
use mcast::runtime::ErrorKind;

/// Long enough that a wait ended by an abort cannot have been ended by the timeout.
const LONG_MS: u32 = 60_000;
const ROLE: &str = "MCAST_FAIL_CHILD";

fn sim_context(devices: u32, timeout_ms: u32, multicast: bool) -> Arc<Context> {
    runtime_context(Config { retry_backoff_ms: 1, ..sim_runtime(multicast, devices, timeout_ms) })
}

const AR: Collective = Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum };
const ALL: [Collective; 4] = [
    Collective::Broadcast { root: 0 },
    AR,
    Collective::ReduceScatter { dtype: DType::I32, op: RedOp::Max },
    Collective::AllGather,
];

/// Aborts `team` from another thread after `after`; returns when the abort was made.
fn abort_later(team: &Arc<Team>, after: Duration) -> std::thread::JoinHandle<Instant> {
    let t = team.clone();
    std::thread::spawn(move || {
        std::thread::sleep(after);
        let at = Instant::now();
        t.abort();
        at
    })
}

/// Rank `r`'s input for an all-reduce of `count` f32 in round `round` (small integers: exact).
fn ar_input(r: usize, round: usize, count: usize) -> Vec<u8> {
    (0..count).flat_map(|i| (((r * 7 + i * 3 + round) % 17) as f32).to_ne_bytes()).collect()
}

/// The sum of [`ar_input`] over `n` ranks.
fn ar_sum(n: usize, round: usize, count: usize) -> Vec<u8> {
    (0..count)
        .flat_map(|i| ((0..n).map(|r| ((r * 7 + i * 3 + round) % 17) as f32).sum::<f32>()).to_ne_bytes())
        .collect()
}
