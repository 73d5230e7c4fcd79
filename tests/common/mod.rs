//! Helpers shared by the integration tests: a simulated context through the C API, a runtime
//! context through the Rust API with the leak check every test ends with, the calls the retry
//! policy covers, and the encodings of ids and elements. Each test declares `mod common;`.
#![allow(dead_code)]

use std::ffi::CStr;
use std::sync::Arc;

use mcast::driver::{CaptureMode, Device, Driver, GraphExec, Stream};
use mcast::kernels::abi::Variant;
use mcast::kernels::nvrtc::{self, Nvrtc};
use mcast::kernels::select::Unit;
use mcast::kernels::{Collective, DType, RedOp};
use mcast::runtime::config::{Backend, Config, MulticastMode};

use mcast::capi::buffer::*;
use mcast::capi::config::*;
use mcast::capi::context::*;
use mcast::capi::status::*;
use mcast::capi::team::*;
use mcast::driver::sim::{Ledger, SimDriver};
use mcast::runtime::context::Context;
use mcast::runtime::handles;
use mcast::runtime::team::{Team, Transport};

pub const OK: mcast_status_t = mcast_status_t(0);

pub fn st(code: McastStatus) -> mcast_status_t {
    mcast_status_t(code as u32)
}

pub fn last_error() -> String {
    // SAFETY: mcast_last_error never returns NULL.
    unsafe { CStr::from_ptr(mcast_last_error()) }.to_string_lossy().into_owned()
}

/// A config for the simulator with `devices` GPUs; `f` adjusts it.
pub fn sim_config(devices: u32, f: impl FnOnce(&mut mcast_config_t)) -> mcast_config_t {
    let mut c = std::mem::MaybeUninit::<mcast_config_t>::uninit();
    // SAFETY: a valid pointer to write the config into.
    unsafe { mcast_config_init(c.as_mut_ptr()) };
    // SAFETY: mcast_config_init wrote every field.
    let mut c = unsafe { c.assume_init() };
    c.backend = mcast_backend_t(McastBackend::MCAST_BACKEND_SIM as u32);
    c.multicast = mcast_multicast_t(McastMulticast::MCAST_MULTICAST_AUTO as u32);
    c.sim_devices = devices;
    c.retry_backoff_ms = 1;
    f(&mut c);
    c
}

/// A context for `config`, and the runtime object behind it (kept alive after destroy so the
/// simulator's ledger can be read). Hermetic on the simulator: the NVLS kill switches of the
/// process environment are not read (see [`hermetic`]); the context is made as
/// `mcast_context_create` makes it, with that one difference.
pub fn context(config: &mcast_config_t) -> (mcast_context_t, Arc<Context>) {
    let config = hermetic(config.to_config().unwrap_or_else(|e| panic!("{e}")));
    let ctx = Arc::new(Context::new(config).unwrap_or_else(|e| panic!("{e}")));
    (mcast_context_t { id: handles::insert_context(ctx.clone()) }, ctx)
}

/// `config` made hermetic: on the simulator the context sees no NVLS kill switch, whatever the
/// caller exported (`Config::sim_host_env`); a test that wants one sets it there. No
/// effect on CUDA, where the process environment's switches are always honoured.
pub fn hermetic(config: Config) -> Config {
    Config { sim_host_env: Some(Vec::new()), ..config }
}

/// The variables a simulator test's child process must not inherit from the caller: the NVLS
/// kill switches and the `MCAST_*` settings the tests choose themselves (as c_tests/CMakeLists.txt
/// unsets them for ctest).
pub const HERMETIC_VARIABLES: [&str; 6] = [
    "NCCL_NVLS_ENABLE",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS",
    "MSCCLPP_FORCE_DISABLE_NVLS",
    "MCAST_MULTICAST",
    "CUDA_VISIBLE_DEVICES",
];

/// `cmd` without [`HERMETIC_VARIABLES`] in its environment: a simulator child process that sets
/// the switch or multicast mode it needs itself.
pub fn hermetic_command(cmd: &mut std::process::Command) -> &mut std::process::Command {
    for v in HERMETIC_VARIABLES {
        cmd.env_remove(v);
    }
    cmd
}

pub fn sim(ctx: &Context) -> &SimDriver {
    ctx.driver().as_sim().expect("a simulated context")
}

pub fn ledger(ctx: &Context) -> Ledger {
    sim(ctx).ledger()
}

pub fn team_create(ctx: mcast_context_t, devices: &[i32]) -> Result<mcast_team_t, (mcast_status_t, String)> {
    let mut t = mcast_team_t { id: 0 };
    // SAFETY: valid pointers.
    let s = unsafe { mcast_team_create(ctx, devices.as_ptr(), devices.len() as i32, &mut t) };
    if s == OK {
        Ok(t)
    } else {
        Err((s, last_error()))
    }
}

pub fn alloc(team: mcast_team_t, bytes: usize) -> Result<mcast_buffer_t, (mcast_status_t, String)> {
    let mut b = mcast_buffer_t { id: 0 };
    // SAFETY: valid pointer.
    let s = unsafe { mcast_buffer_alloc(team, bytes, &mut b) };
    if s == OK {
        Ok(b)
    } else {
        Err((s, last_error()))
    }
}

pub fn team_info(team: mcast_team_t) -> mcast_team_info_t {
    // SAFETY: all-zero is a valid mcast_team_info_t.
    let mut info: mcast_team_info_t = unsafe { std::mem::zeroed() };
    info.struct_size = std::mem::size_of::<mcast_team_info_t>() as u32;
    // SAFETY: valid pointer.
    assert_eq!(unsafe { mcast_team_get_info(team, &mut info) }, OK, "{}", last_error());
    info
}

pub fn live_counts(ctx: mcast_context_t) -> mcast_live_counts_t {
    let mut c =
        mcast_live_counts_t { struct_size: std::mem::size_of::<mcast_live_counts_t>() as u32, ..Default::default() };
    // SAFETY: valid pointer.
    assert_eq!(unsafe { mcast_context_live_counts(ctx, &mut c) }, OK, "{}", last_error());
    c
}

// ---- the runtime (Rust) API ----

/// Bytes in a MiB.
pub const MIB: usize = 1 << 20;

/// Driver calls made through the retry policy: a one-off retryable failure of one of them
/// recovers.
pub const RETRIED: [&str; 8] = [
    "cuMemCreate",
    "cuMemAddressReserve",
    "cuMemMap",
    "cuMemSetAccess",
    "cuMulticastCreate",
    "cuMulticastAddDevice",
    "cuMulticastBindMem_v2",
    "cuMulticastBindAddr_v2",
];

/// True when the tests that can run on a GPU should (`MCAST_TEST_BACKEND=cuda`).
pub fn on_gpu() -> bool {
    std::env::var("MCAST_TEST_BACKEND").is_ok_and(|v| v == "cuda")
}

/// A simulator of `devices` GPUs of 256 MiB each, multicast AUTO (else OFF), `timeout_ms`;
/// other fields as `Config { field: value, ..sim_runtime(..) }`.
pub fn sim_runtime(multicast: bool, devices: u32, timeout_ms: u32) -> Config {
    Config {
        backend: Backend::Sim,
        multicast: if multicast { MulticastMode::Auto } else { MulticastMode::Off },
        sim_devices: devices,
        sim_device_memory: 256 * MIB as u64,
        timeout_ms,
        ..hermetic(Config::default())
    }
}

/// A runtime context for `config`; panics when there is none.
pub fn runtime_context(config: Config) -> Arc<Context> {
    Arc::new(Context::new(config).unwrap())
}

/// A runtime context for `config`, or `None`, printing "skipped" and why (no CUDA driver or
/// device where the CUDA backend was asked for).
pub fn runtime_context_or_skip(config: Config) -> Option<Arc<Context>> {
    match Context::new(config) {
        Ok(c) => Some(Arc::new(c)),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// Shuts `ctx` down and asserts that nothing is left: not in its shutdown report, not in its
/// registry, and (on the simulator) not in the simulator's ledger.
pub fn assert_clean(ctx: &Context) {
    let report = ctx.shutdown();
    assert!(report.is_empty(), "{report}");
    assert!(ctx.resources.is_empty(), "{}", ctx.resources.report());
    if let Some(sim) = ctx.driver().as_sim() {
        let ledger = sim.ledger();
        assert!(ledger.is_empty(), "{ledger}");
    }
}

/// One new stream per rank of `team`, on the rank's device.
pub fn rank_streams(team: &Team) -> Vec<Stream> {
    let d = team.context().driver();
    team.devices().iter().map(|&dev| d.stream_create(dev).unwrap()).collect()
}

/// Loads, on every device of `team`, the kernel module each of `collectives` runs from, as
/// their first calls would (compiling on CUDA; the simulator's load waits like CUDA's). A thread
/// that issues one rank's calls ahead of the other ranks' must do this first: CUDA loads a
/// module only once the device's running kernels are done, and those wait for the other ranks
/// (README, "One thread driving several ranks").
pub fn load_modules(team: &Team, collectives: &[Collective]) {
    let driver = team.context().driver();
    let variant = if team.transport() == Transport::Multicast { Variant::Multimem } else { Variant::Emulated };
    let mut devices = team.devices().to_vec();
    devices.sort_unstable();
    devices.dedup();
    for &dev in &devices {
        for &c in collectives {
            mcast::kernels::load_module(driver.as_ref(), dev, variant, Unit::of_collective(c, team.ll())).unwrap();
        }
    }
}

/// Loads every kernel module (every collective, dtype and operator, both builds, with and
/// without the LL kernels) on every device of the simulator, so that no call loads one later
/// (each load waits for the device's running kernels: see [`load_modules`]).
pub fn load_every_module(sim: &SimDriver) {
    for dev in 0..sim.config().devices as Device {
        for unit in Unit::all() {
            for ll in [false, true] {
                for variant in [Variant::Multimem, Variant::Emulated] {
                    mcast::kernels::sim::load_module(sim, dev, variant, Unit { ll, ..unit }).unwrap();
                }
            }
        }
    }
}

/// Destroys the streams [`rank_streams`] made.
pub fn drop_rank_streams(team: &Team, streams: Vec<Stream>) {
    let d = team.context().driver();
    for (r, s) in streams.into_iter().enumerate() {
        d.stream_destroy(team.devices()[r], s).unwrap();
    }
}

/// A unique id as hexadecimal text (to pass it to a child process).
pub fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// The unique id [`hex`] wrote.
pub fn unhex(s: &str) -> [u8; 128] {
    let mut id = [0u8; 128];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    id
}

/// The bytes of one element of type `d` holding `v`.
pub fn encode(d: DType, v: f64) -> Vec<u8> {
    match d {
        DType::F32 => (v as f32).to_ne_bytes().to_vec(),
        DType::F64 => v.to_ne_bytes().to_vec(),
        DType::F16 => half::f16::from_f64(v).to_bits().to_ne_bytes().to_vec(),
        DType::BF16 => half::bf16::from_f64(v).to_bits().to_ne_bytes().to_vec(),
        DType::I32 => (v as i32).to_ne_bytes().to_vec(),
        DType::U32 => (v as u32).to_ne_bytes().to_vec(),
        DType::I64 => (v as i64).to_ne_bytes().to_vec(),
        DType::U64 => (v as u64).to_ne_bytes().to_vec(),
    }
}

/// The reference reduction of `xs` by `op`, in f64.
pub fn reduce(op: RedOp, xs: &[f64]) -> f64 {
    match op {
        RedOp::Sum => xs.iter().sum(),
        RedOp::Min => xs.iter().cloned().fold(f64::INFINITY, f64::min),
        RedOp::Max => xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
    }
}

/// One CUDA graph per rank, each captured on its own new stream of the rank's device.
pub struct RankGraphs {
    /// Each rank's device.
    pub devices: Vec<Device>,
    /// Each rank's stream (the capture's, then the replays').
    pub streams: Vec<Stream>,
    execs: Vec<GraphExec>,
}

impl RankGraphs {
    /// Captures `record(rank, stream)` on a new stream per rank (nothing runs) and instantiates
    /// each capture.
    pub fn capture(driver: &Arc<dyn Driver>, devices: &[Device], record: impl FnMut(usize, Stream)) -> RankGraphs {
        RankGraphs::capture_in(driver, devices, CaptureMode::ThreadLocal, record)
    }

    /// [`RankGraphs::capture`] with the captures begun in `mode`.
    pub fn capture_in(
        driver: &Arc<dyn Driver>,
        devices: &[Device],
        mode: CaptureMode,
        mut record: impl FnMut(usize, Stream),
    ) -> RankGraphs {
        let streams: Vec<Stream> = devices.iter().map(|&d| driver.stream_create(d).unwrap()).collect();
        let mut execs = vec![];
        for (r, (&dev, &stream)) in devices.iter().zip(&streams).enumerate() {
            driver.stream_begin_capture_mode(dev, stream, mode).unwrap();
            record(r, stream);
            let graph = driver
                .stream_end_capture(dev, stream)
                .unwrap_or_else(|e| panic!("rank {r}'s capture was invalidated: {e}"));
            execs.push(driver.graph_instantiate(dev, graph).unwrap());
            driver.graph_destroy(dev, graph).unwrap();
        }
        RankGraphs { devices: devices.to_vec(), streams, execs }
    }

    /// Launches every rank's graph `times` times, rank by rank each round: the ranks' replays
    /// proceed in parallel, as on GPUs (each rank's waits wait for the others).
    pub fn replay(&self, driver: &Arc<dyn Driver>, times: u32) {
        for _ in 0..times {
            for ((&dev, &stream), &exec) in self.devices.iter().zip(&self.streams).zip(&self.execs) {
                driver.graph_launch(dev, exec, stream).unwrap();
            }
        }
    }

    /// Rank `r`'s executable graph.
    pub fn exec(&self, r: usize) -> GraphExec {
        self.execs[r]
    }

    /// Destroys the graphs and the streams.
    pub fn destroy(self, driver: &Arc<dyn Driver>) {
        for ((&dev, &stream), &exec) in self.devices.iter().zip(&self.streams).zip(&self.execs) {
            driver.graph_exec_destroy(dev, exec).unwrap();
            driver.stream_destroy(dev, stream).unwrap();
        }
    }
}

/// NVRTC, or `None` (the test is skipped, the reason printed) where it cannot be loaded, unless
/// `MCAST_REQUIRE_NVRTC=1` makes that a failure.
pub fn nvrtc_or_skip() -> Option<&'static Nvrtc> {
    match nvrtc::nvrtc() {
        Ok(nv) => Some(nv),
        Err(e) if std::env::var("MCAST_REQUIRE_NVRTC").as_deref() != Ok("1") => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}
