//! Collectives against a host reference, on the simulator's two transports (MULTICAST through
//! its address translation, and P2P) — or, with `MCAST_TEST_BACKEND=cuda`, on a real GPU over
//! P2P with every team a repetition of the visible devices (multicast forced off).
//!
//! Exactness: integers exactly; floats exactly on small-integer data; random floats within a
//! stated tolerance of an f64 reference; and the same bits on every rank, always.
//!
//! This file holds the contexts and the reference; `in_place.rs` the buffer form,
//! `out_of_place.rs` the `_into` form.

#[path = "../common/mod.rs"]
mod common;
mod in_place;
mod out_of_place;

use std::sync::Arc;

use common::*;
use half::{bf16, f16};
use mcast::driver::{Device, Stream};
use mcast::kernels::{Collective, DType, RedOp};
use mcast::runtime::buffer::Buffer;
use mcast::runtime::collective::{run, run_into, synchronize};
use mcast::runtime::config::{Backend, Config, MulticastMode};
use mcast::runtime::context::Context;
use mcast::runtime::team::{Team, Transport};
use mcast::runtime::ErrorKind;

/// A context for the chosen backend, or `None` (skipped) when CUDA was asked for and is absent.
fn context(multicast: bool, timeout_ms: u32) -> Option<Arc<Context>> {
    context_of(multicast, timeout_ms, 8)
}

/// As [`context`], with `sim_devices` simulated GPUs.
fn context_of(multicast: bool, timeout_ms: u32, sim_devices: u32) -> Option<Arc<Context>> {
    let config = if on_gpu() {
        // MCAST_LL and MCAST_CE_MIN_BYTES apply: a GPU run can try the LL and copy-engine forms.
        Config { backend: Backend::Cuda, multicast: MulticastMode::Off, timeout_ms, ..Config::from_env() }
    } else {
        sim_runtime(multicast, sim_devices, timeout_ms)
    };
    runtime_context_or_skip(config)
}

/// As [`context`] with multicast off and every all-gather, broadcast and all-reduce large
/// enough (threshold 1 byte) taking its copy-engine form (`runtime::ce`).
fn copy_engine_context() -> Option<Arc<Context>> {
    let config = if on_gpu() {
        Config { backend: Backend::Cuda, multicast: MulticastMode::Off, timeout_ms: 20_000, ..Config::from_env() }
    } else {
        sim_runtime(false, 8, 20_000)
    };
    runtime_context_or_skip(Config { ce_min_bytes: Some(1), ..config })
}

/// Devices for a team of `n` ranks: distinct on the simulator, the GPUs repeated on CUDA.
fn devices(ctx: &Context, n: usize) -> Vec<Device> {
    let have = ctx.device_count();
    (0..n).map(|i| (i % have) as Device).collect()
}

/// Deterministic pseudo-random numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 11
    }
    fn float(&mut self) -> f64 {
        (self.next() as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }
}

fn decode(d: DType, b: &[u8]) -> f64 {
    match d {
        DType::F32 => f32::from_ne_bytes(b.try_into().unwrap()) as f64,
        DType::F64 => f64::from_ne_bytes(b.try_into().unwrap()),
        DType::F16 => f16::from_bits(u16::from_ne_bytes(b.try_into().unwrap())).to_f64(),
        DType::BF16 => bf16::from_bits(u16::from_ne_bytes(b.try_into().unwrap())).to_f64(),
        DType::I32 => i32::from_ne_bytes(b.try_into().unwrap()) as f64,
        DType::U32 => u32::from_ne_bytes(b.try_into().unwrap()) as f64,
        DType::I64 => i64::from_ne_bytes(b.try_into().unwrap()) as f64,
        DType::U64 => u64::from_ne_bytes(b.try_into().unwrap()) as f64,
    }
}

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
}

/// Input values of rank `r`: small integers (exact in every dtype and every summation order) or
/// random floats in [-1, 1).
fn values(d: DType, count: usize, r: usize, seed: u64, random_floats: bool) -> Vec<f64> {
    let mut rng = Rng(seed ^ (r as u64 + 1).wrapping_mul(0x9E3779B97F4A7C15));
    (0..count)
        .map(|_| {
            if random_floats && is_float(d) {
                rng.float()
            } else {
                let v = (rng.next() % 17) as f64;
                if matches!(d, DType::U32 | DType::U64) {
                    v
                } else {
                    v - 8.0
                }
            }
        })
        .map(|v| decode(d, &encode(d, v)))
        .collect()
}

/// Allowed error of a random-float sum relative to the sum of magnitudes.
fn tolerance(d: DType) -> f64 {
    match d {
        DType::F64 => 1e-13,
        DType::F32 => 1e-6,
        DType::F16 => 2e-3,
        DType::BF16 => 1e-2,
        _ => 0.0,
    }
}

struct Case {
    collective: Collective,
    count: usize,
    offset: usize,
    random_floats: bool,
}
