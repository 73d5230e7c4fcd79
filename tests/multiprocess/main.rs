//! One process per rank on the simulator: the test re-runs its own binary as the ranks
//! (`MCAST_MP_CHILD` selects the role), over real processes, real file descriptors passed with
//! `SCM_RIGHTS` or the simulator's fabric handles (64 bytes naming a memfd of another process),
//! and the simulator's memfd-backed memory.
//!
//! The tests by theme: `collectives.rs`, `identity.rs` (GPUs and NVLink domains), `faults.rs`
//! (one rank's failure), `hosts.rs` (hosts, namespaces, env mode); `ranks.rs` is what each child
//! runs.

mod collectives;
#[path = "../common/mod.rs"]
mod common;
mod faults;
mod hosts;
mod identity;
mod ranks;

use std::process::{Command, ExitStatus};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use mcast::bootstrap::new_unique_id;
use mcast::driver::{HandleTypes, Stream};
use mcast::kernels::{Collective, DType, RedOp};
use mcast::runtime::buffer::Buffer;
use mcast::runtime::collective::{run, run_into, run_ptr, synchronize};
use mcast::runtime::config::{Config, MulticastMode};
use mcast::runtime::context::Context;
use mcast::runtime::team::{Team, Transport};
use mcast::runtime::ErrorKind;
/// Transports under test: P2P, and MULTICAST (the simulator's cross-process multicast).
const MODES: [bool; 2] = [false, true];
const ROLE: &str = "MCAST_MP_CHILD";
/// The handle type a child expects its team to use: `fabric` or `posix`.
const EXPECT_HT: &str = "MCAST_MP_EXPECT_HANDLE_TYPE";
/// Whether a rank expects its team to run the LL kernels ("1", "0"); unset: not checked.
const EXPECT_LL: &str = "MCAST_MP_EXPECT_LL";
/// The copy-engine threshold a rank expects its team to have agreed on; unset: not checked.
const EXPECT_CE: &str = "MCAST_MP_EXPECT_CE";
const EXPECT_SLOTS: &str = "MCAST_MP_EXPECT_SLOTS";
/// Set: a killed peer must be reported within timeout_ms + 1 s.
const TIGHT: &str = "MCAST_MP_TIGHT";
/// The case a `register-errors` child runs.
const CASE: &str = "MCAST_MP_CASE";
/// What an `identity` rank uses and expects: `device;transport;blocks;reason` (the reason a
/// substring of the team's, `{uuid}` standing for this rank's GPU's UUID; empty: none).
const IDENTITY: &str = "MCAST_MP_IDENTITY";
/// What a `domains` rank uses and expects: `device;ok;domains;domain_size` or
/// `device;refused;substring|substring...` (NOT_SUPPORTED naming each).
const DOMAINS: &str = "MCAST_MP_DOMAINS";
/// How long a delayed rank sleeps before it joins (`MCAST_MP_DELAY_MS`).
const DELAY: &str = "MCAST_MP_DELAY_MS";

/// Runs `n` ranks of `role`; `env(rank)` gives extra environment for a rank. Returns each
/// rank's exit status and how long the slowest took.
fn spawn(n: usize, role: &str, multicast: bool, env: impl Fn(usize) -> Vec<(&'static str, String)>) -> Vec<ExitStatus> {
    spawn_in(n, role, multicast, &new_unique_id().unwrap(), |_| Vec::new(), env)
}

/// [`spawn`] with a given id, each rank's command line prefixed by `wrap(rank)` (e.g. `ip netns
/// exec NAME`).
fn spawn_in(
    n: usize,
    role: &str,
    multicast: bool,
    id: &[u8],
    wrap: impl Fn(usize) -> Vec<String>,
    env: impl Fn(usize) -> Vec<(&'static str, String)>,
) -> Vec<ExitStatus> {
    let id = hex(id);
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..n)
        .map(|r| {
            let prefix = wrap(r);
            let mut c = match prefix.split_first() {
                Some((first, rest)) => {
                    let mut c = Command::new(first);
                    c.args(rest).arg(&exe);
                    c
                }
                None => Command::new(&exe),
            };
            c.args(["--exact", "ranks::child", "--nocapture", "--test-threads=1"])
                .env(ROLE, format!("{role}:{n}:{r}:{}:{id}", u8::from(multicast)))
                .env_remove("MCAST_SIM_FAULTS")
                .env_remove("MCAST_HANDLE_TYPE")
                .env_remove("MCAST_SIM_FABRIC")
                .env_remove("MCAST_LL")
                .env_remove(EXPECT_LL)
                .env_remove("MCAST_CE_MIN_BYTES")
                .env_remove(EXPECT_CE)
                .env_remove("MCAST_DEVICE_SLOTS")
                .env_remove(EXPECT_SLOTS)
                .env_remove(EXPECT_HT)
                .env_remove("MCAST_HOST_ID")
                .env_remove("MCAST_BOOTSTRAP_ADDR")
                .env_remove("MCAST_BOOTSTRAP_SECRET")
                .env_remove("CUDA_VISIBLE_DEVICES")
                .env_remove(IDENTITY)
                .env_remove(DOMAINS)
                .env_remove("MCAST_SIM_IMEX")
                .env_remove("MCAST_DOMAIN")
                .env_remove("MCAST_MNNVL")
                .env_remove(TIGHT);
            for (k, v) in env(r) {
                c.env(k, v);
            }
            c.spawn().unwrap()
        })
        .collect();
    children.into_iter().map(|mut c| c.wait().unwrap()).collect()
}

fn all_ok(st: &[ExitStatus]) {
    for (r, s) in st.iter().enumerate() {
        assert!(s.success(), "rank {r} failed: {s:?}");
    }
}

fn expect(ht: &str) -> Vec<(&'static str, String)> {
    vec![(EXPECT_HT, ht.into())]
}
