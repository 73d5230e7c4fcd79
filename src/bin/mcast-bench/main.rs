//! `mcast-bench`: collective bandwidth in the spirit of nccl-tests, on mcast's public C API.
//!
//! One process drives every rank of one team: one stream per rank, one symmetric buffer sized for
//! the largest message. Per message size it checks the result against a host reference (unless
//! `--check 0`), runs `--warmup` untimed iterations, then times `--iters` iterations with events
//! recorded on every rank's stream around the loop; the time is the slowest rank's elapsed time
//! divided by the iterations. algbw = bytes / time; busbw = algbw * NCCL's factor for the op.
//! With `-G N` (as nccl-tests' `-G`), each rank's `--iters` iterations are captured in a CUDA
//! graph, replayed N times between the events, and the time is divided by iters x N. With
//! `--host-overhead N` it times the host side of the calls instead (see [`timing`]).
//! With no GPU it runs on the simulator with small default sizes. With `--procs N` (or under
//! `mpirun`) each rank is a process of its own ([`procs`]): the same measurements, the slowest
//! rank's time and every rank's wrong elements agreed through the team itself, rank 0 printing.
//!
//! Every mcast call is a `mcast_*` function of `mcast.h` ([`api`], [`run`](mod@run)), so a regression at
//! the C boundary shows here. Modules: [`args`] (the command line), [`api`] (the C calls and the
//! bench's CUDA plumbing), [`data`] (check data), [`run`](mod@run) (rig, calls, check), [`timing`],
//! [`report`] (table, CSV, JSON).

use std::process::ExitCode;
use std::time::Instant;

use mcast::capi::config::mcast_config_t;
use mcast::capi::context::mcast_context_t;
use mcast::capi::team::mcast_team_t;

mod api;
mod args;
mod data;
mod mpi;
mod procs;
mod report;
mod run;
mod timing;

use api::Plumbing;
use args::{runtime, usage, with_errors, Failure, HostLaunch, Memory, Op, Options, RedOp};
use data::{table, value, Shape};
use procs::{Exchange, Role};
use report::{Row, RunInfo};
use run::{Bench, Rig};

/// `println!` where this process prints the table: one process, or rank 0 of several.
macro_rules! outln {
    ($($t:tt)*) => {
        if procs::prints() {
            println!($($t)*);
        }
    };
}

/// Counts each thread's heap allocations for `--host-overhead`, the simulated device's apart.
#[global_allocator]
static ALLOCATOR: mcast::driver::sim::CountingAlloc = mcast::driver::sim::CountingAlloc;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match args::parse_args(&args) {
        Ok(Some(o)) => o,
        Ok(None) => return ExitCode::SUCCESS,
        Err(f) => return fail(f),
    };
    let role = match procs::role(&opts) {
        Ok(Role::Launch(n)) => return procs::launch(n),
        Ok(role) => role,
        Err(f) => return fail(f),
    };
    // The copy-engine threshold is an environment knob of the library (not in mcast_config_t):
    // set it before the context reads the environment. Single-threaded here.
    if let Some(n) = opts.ce_min_bytes {
        std::env::set_var("MCAST_CE_MIN_BYTES", n.to_string());
    }
    // --net mpi (procs::role allowed it under mpirun only): MPI up before the context.
    let mpi = match opts.net.as_deref() {
        Some("mpi") => match mpi::Mpi::load() {
            Ok(m) => Some(m),
            Err(f) => return fail(f),
        },
        _ => None,
    };
    let code = run(&opts, &role, mpi.as_ref());
    if let Some(m) = mpi {
        m.finish();
    }
    code
}

/// The run of a process that drives ranks (all of them, or its one), with MPI registered as the
/// engine between domains when given; its exit status.
fn run(opts: &Options, role: &Role, mpi: Option<&mpi::Mpi>) -> ExitCode {
    let config = api::config(opts.backend.map(|b| b as u32));
    let ctx = match api::context_create(&config) {
        Ok(c) => c,
        Err(e) => return fail(runtime(e)),
    };
    if let Some(Err(f)) = mpi.map(|m| m.register(ctx)) {
        let _ = api::context_destroy(ctx);
        return fail(f);
    }
    // The plumbing holds the context's driver: dropped before the context is destroyed.
    let outcome = match Plumbing::of(ctx) {
        Ok(p) => bench(ctx, &p, &config, opts, role),
        Err(e) => Err(runtime(e)),
    };
    let leaks = api::leak_report(ctx);
    let destroyed = api::context_destroy(ctx);
    let mut code = match outcome {
        Ok(0) => ExitCode::SUCCESS,
        Ok(wrong) => {
            eprintln!("mcast-bench: {}{wrong} wrong element(s): the results are incorrect", procs::who());
            ExitCode::FAILURE
        }
        Err(f) => fail(f),
    };
    if !leaks.is_empty() {
        eprintln!("mcast-bench: {}left behind:\n{leaks}", procs::who());
        code = ExitCode::FAILURE;
    }
    if let Err(e) = destroyed {
        eprintln!("mcast-bench: {}{e}", procs::who());
        code = ExitCode::FAILURE;
    }
    code
}

fn fail(f: Failure) -> ExitCode {
    match f {
        Failure::Usage(msg) => {
            eprintln!("mcast-bench: {}{msg}\nTry 'mcast-bench --help'.", procs::who());
            ExitCode::from(2)
        }
        Failure::Runtime(msg) => {
            eprintln!("mcast-bench: {}{msg}", procs::who());
            ExitCode::FAILURE
        }
    }
}

/// Runs the benchmark; returns the total of wrong elements.
fn bench(
    ctx: mcast_context_t,
    p: &Plumbing,
    config: &mcast_config_t,
    o: &Options,
    role: &Role,
) -> Result<u64, Failure> {
    let sim = p.is_sim();
    let count = api::device_count(ctx).map_err(runtime)?;
    if count == 0 {
        return Err(runtime("the context has no device"));
    }
    // This process's ranks' devices: every rank's, or its one rank's among those it sees.
    let (devices, first, n) = match role {
        Role::Rank(me) => {
            let d = match &o.devices {
                Some(d) => d[me.rank],
                None if o.visible.is_some() => 0,
                None => me.local as i32,
            };
            (vec![d], me.rank, me.nranks)
        }
        _ => {
            let d = o.devices.clone().unwrap_or_else(|| (0..count).collect());
            let n = d.len();
            (d, 0, n)
        }
    };
    for &d in &devices {
        if d >= count {
            return Err(usage(format!("--devices: device {d} is out of range: this context has {count} device(s)")));
        }
    }
    if o.op == Op::Broadcast && o.root as usize >= n {
        return Err(usage(format!("--root {}: the team has {n} rank(s)", o.root)));
    }
    let (min_b, max_b, factor) = match sim {
        true => (o.min_bytes.unwrap_or(1 << 10), o.max_bytes.unwrap_or(1 << 20), o.factor.unwrap_or(4)),
        false => (o.min_bytes.unwrap_or(8 << 10), o.max_bytes.unwrap_or(1 << 30), o.factor.unwrap_or(2)),
    };
    if min_b > max_b {
        return Err(usage(format!("-b {min_b} is larger than -e {max_b}")));
    }
    let iters = o.iters.unwrap_or(if sim { 5 } else { 20 });
    let warmup = o.warmup.unwrap_or(if sim { 1 } else { 5 });
    let mut sizes = vec![];
    let mut size = Some(min_b);
    while let Some(s) = size.filter(|s| *s <= max_b) {
        sizes.push(s);
        size = s.checked_mul(factor);
    }
    let shapes: Vec<Shape> = sizes.iter().map(|&s| Shape::of(o.op, o.dtype, n, s)).collect();
    let buffer_bytes = shapes.iter().map(Shape::bytes).max().unwrap_or(1);

    let created = Instant::now();
    let team = match role {
        Role::Rank(me) => api::team_init_rank(ctx, &me.id, n, me.rank, devices[0]).map_err(|e| {
            runtime(format!("joining the team as rank {} of {n} on device {}: {e}", me.rank, devices[0]))
        })?,
        _ => api::team_create(ctx, &devices).map_err(|e| runtime(format!("creating a team on {devices:?}: {e}")))?,
    };
    let create_ms = created.elapsed().as_secs_f64() * 1e3;
    let reserved = || api::team_info(team).map(|i| i.bytes_reserved).unwrap_or(0);
    let before = reserved();
    let exchange = match role {
        Role::Rank(me) => match Exchange::new(p, team, me.rank, n, devices[0]) {
            Ok(x) => Some(x),
            Err(f) => {
                let _ = api::team_destroy(team);
                return Err(f);
            }
        },
        _ => None,
    };
    let host = (o.host_overhead > 0)
        .then(|| (o.host_overhead, o.host_launch.unwrap_or(if sim { HostLaunch::Capture } else { HostLaunch::Eager })));
    let setup = Setup {
        ctx,
        team,
        p,
        config,
        devices,
        first,
        nranks: n,
        exchange: exchange.as_ref(),
        exchange_bytes: reserved().saturating_sub(before),
        shapes,
        buffer_bytes,
        create_ms,
        iters,
        warmup,
        host,
    };
    let result = with_team(&setup, o, (min_b, max_b, factor));
    let result = match exchange.map(|x| x.release(p)).unwrap_or_default() {
        errors if errors.is_empty() => result,
        errors => match result {
            Ok(_) => Err(runtime(errors.join("; "))),
            Err(f) => Err(with_errors(f, errors)),
        },
    };
    match (result, api::team_destroy(team)) {
        (Ok(wrong), Ok(())) => Ok(wrong),
        (Ok(_), Err(e)) => Err(runtime(format!("destroying the team: {e}"))),
        (Err(f), Ok(())) => Err(f),
        (Err(f), Err(e)) => Err(with_errors(f, vec![format!("destroying the team: {e}")])),
    }
}

/// What [`bench()`] settled before the team's part.
struct Setup<'a> {
    ctx: mcast_context_t,
    team: mcast_team_t,
    p: &'a Plumbing,
    config: &'a mcast_config_t,
    /// This process's ranks' devices: every rank's, or its one rank's.
    devices: Vec<i32>,
    /// The team rank of `devices[0]`.
    first: usize,
    nranks: usize,
    /// With one process per rank: the ranks' exchange, and the device bytes it holds.
    exchange: Option<&'a Exchange>,
    exchange_bytes: u64,
    shapes: Vec<Shape>,
    buffer_bytes: usize,
    create_ms: f64,
    iters: u32,
    warmup: u32,
    host: Option<(u32, HostLaunch)>,
}

/// The header, the rig, the measurements and the files, once the team exists (the caller
/// destroys it).
fn with_team(s: &Setup, o: &Options, (min_b, max_b, factor): (u64, u64, u64)) -> Result<u64, Failure> {
    let (ctx, team, p, n) = (s.ctx, s.team, s.p, s.nranks);
    let info = api::team_info(team).map_err(runtime)?;
    let name = |d: i32| api::device_name(ctx, d).unwrap_or_else(|e| format!("unknown ({e})"));
    // Every rank's device and how the header names it; with one process per rank, from each.
    let (devices, rank_lines): (Vec<i32>, Vec<String>) = match s.exchange {
        None => (s.devices.clone(), s.devices.iter().map(|&d| format!("device {d} {}", name(d))).collect()),
        Some(x) => {
            let d = s.devices[0];
            let visible = std::env::var("CUDA_VISIBLE_DEVICES")
                .map(|v| format!(" (CUDA_VISIBLE_DEVICES={v})"))
                .unwrap_or_default();
            let lines = x.texts(&format!("device {d}{visible} {}, pid {}", name(d), std::process::id()))?;
            let devices = x.texts(&d.to_string())?.iter().map(|t| t.parse().unwrap_or(-1)).collect();
            (devices, lines)
        }
    };
    let device_name = api::device_name(ctx, s.devices[0]).unwrap_or_default();
    let run_info = RunInfo {
        op: o.op,
        dtype: o.dtype,
        redop: o.op.reduces().then_some(o.redop),
        root: if o.op == Op::Broadcast { i64::from(o.root) } else { -1 },
        backend: p.backend,
        transport: info.transport,
        transport_reason: info.transport_reason.clone(),
        devices: devices.clone(),
        device_name,
        date: report::utc_now(),
        iters: s.iters,
        warmup: s.warmup,
        graph: o.graph,
        check: o.check,
        host: s.host,
        memory: o.memory,
        inplace: o.inplace,
    };
    // mcast.h: MCAST_MULTICAST_AUTO = 0, OFF = 1, REQUIRE = 2.
    let policy = match s.config.multicast.0 {
        1 => "off",
        2 => "require",
        _ => "auto",
    };
    let procs = if s.exchange.is_some() { ", one process per rank" } else { ", one process" };
    outln!("# mcast-bench {}: {}, {n} rank(s) on devices {devices:?}{procs}", env!("CARGO_PKG_VERSION"), o.op.name());
    outln!("# backend: {} ({})", run_info.backend, p.backend_reason);
    for (r, line) in rank_lines.iter().enumerate() {
        outln!("#   rank {r:>2}: {line}");
    }
    let why = if info.transport_reason.is_empty() { String::new() } else { format!(" ({})", info.transport_reason) };
    outln!("# transport: {}{why}; multicast policy {policy} (MCAST_MULTICAST)", run_info.transport);
    let (domains, per_domain, engine) = &info.domains;
    let engine = if engine.is_empty() { String::new() } else { format!(", engine between them: {engine}") };
    outln!("# NVLink domains: {domains} ({per_domain} rank(s) each){engine}");
    let grid = api::team_grid(team).map_err(runtime)?;
    outln!(
        "# grid: transport {}, up to {} blocks per kernel, LL {}, copy engines {} (agreed by every rank)",
        run_info.transport,
        grid.max_blocks,
        if grid.ll { "on" } else { "off" },
        match grid.ce_min_bytes {
            0 => "off".to_string(),
            b => format!(">= {b} bytes"),
        }
    );
    if p.emulated_multimem {
        outln!("# MCAST_EMULATE_MULTIMEM=1: multicast kernels with emulated multimem over P2P");
    }
    // The LL kernels (small messages, P2P): MCAST_LL, auto = on.
    let ll = match mcast::runtime::config::Config::from_env().ll {
        mcast::runtime::config::LlMode::On => "on (MCAST_LL=on)",
        mcast::runtime::config::LlMode::Off => "off (MCAST_LL=off)",
        mcast::runtime::config::LlMode::Auto => "on (MCAST_LL=auto)",
    };
    outln!("# LL kernels for small messages: {ll}");
    let auto_ce = if run_info.backend == "sim" { mcast::runtime::config::DEFAULT_CE_MIN_BYTES } else { 0 };
    match mcast::runtime::config::Config::from_env().ce_min_bytes.unwrap_or(auto_ce) {
        _ if run_info.transport != "P2P" || p.emulated_multimem => {}
        0 => outln!("# copy engines: off (MCAST_CE_MIN_BYTES=0)"),
        n => outln!(
            "# copy engines: all_gather, broadcast, all_reduce of >= {n} bytes on buffer/registered memory \
             (MCAST_CE_MIN_BYTES, --ce-min-bytes)"
        ),
    }
    let check = if o.check { "on" } else { "off" };
    match s.host {
        Some((calls, _)) => outln!(
            "# sizes {min_b}..{max_b} x{factor}, {} warmup + {calls} timed call(s) per rank, check {check}",
            s.warmup
        ),
        None => outln!(
            "# sizes {min_b}..{max_b} x{factor}, {} warmup + {} timed iteration(s), check {check}",
            s.warmup,
            s.iters
        ),
    }
    outln!("{}", report::mode_line(&run_info));
    outln!(
        "# memory: {} ({}), {}",
        o.memory.name(),
        match o.memory {
            Memory::Buffer => "mcast_buffer_alloc",
            Memory::Registered => "mcast_mem_alloc + mcast_buffer_register",
            Memory::Pointer => "plain device memory, mcast_team_*",
        },
        if o.inplace { "in place" } else { "out of place" }
    );
    let mut rig = Rig::new(&s.devices, s.first);
    if let Err(f) = rig.populate(p, ctx, team, s.buffer_bytes, o.memory, o.inplace) {
        return Err(with_errors(f, rig.release(p, ctx)));
    }
    let held = api::team_info(team).map(|i| i.bytes_reserved).unwrap_or(0).saturating_sub(s.exchange_bytes);
    outln!(
        "# setup: team created in {:.1} ms; a {}-byte buffer allocated on every rank in {:.1} ms; device memory held \
         per rank {held} bytes ({} beyond the buffer)",
        s.create_ms,
        s.buffer_bytes,
        rig.alloc_ms,
        held.saturating_sub(s.buffer_bytes as u64)
    );
    outln!("#");
    outln!("{}", report::columns(&run_info));
    let reduced = table(o.dtype, |j| {
        let vals = (0..n).map(|r| value(o.dtype, n, r, j));
        match o.redop {
            RedOp::Sum => vals.sum(),
            RedOp::Min => vals.min().unwrap_or(0),
            RedOp::Max => vals.max().unwrap_or(0),
        }
    });
    let bench = Bench {
        plumbing: p,
        team,
        rig: &rig,
        op: o.op,
        dtype: o.dtype,
        redop: o.redop,
        root: o.root,
        inputs: (0..n).map(|r| table(o.dtype, |j| value(o.dtype, n, r, j))).collect(),
        reduced,
    };
    let result = measure(&bench, &s.shapes, &run_info, o, s.exchange);
    let errors = rig.release(p, ctx);
    let (rows, entry) = result.map_err(|f| with_errors(f, errors.clone()))?;
    if !errors.is_empty() {
        return Err(runtime(errors.join("; ")));
    }
    for line in report::summary(&run_info, &rows, entry) {
        outln!("{line}");
    }
    if !procs::prints() {
        return Ok(rows.iter().filter_map(|r| r.wrong).sum());
    }
    if let Some(path) = &o.csv {
        std::fs::write(path, report::csv(&run_info, &rows))
            .map_err(|e| runtime(format!("writing {}: {e}", path.display())))?;
    }
    if let Some(path) = &o.json {
        std::fs::write(path, report::json(&run_info, &rows))
            .map_err(|e| runtime(format!("writing {}: {e}", path.display())))?;
    }
    Ok(rows.iter().filter_map(|r| r.wrong).sum())
}

/// Checks and times every size, printing a row each; in host-overhead mode also times the
/// call's entry alone (count 0).
fn measure(
    b: &Bench,
    shapes: &[Shape],
    info: &RunInfo,
    o: &Options,
    exchange: Option<&Exchange>,
) -> Result<(Vec<Row>, Option<timing::HostTimes>), Failure> {
    let started = Instant::now();
    let n = info.devices.len();
    let mut rows = vec![];
    for (k, s) in shapes.iter().enumerate() {
        let bytes = s.bytes();
        if !o.quiet && procs::prints() && started.elapsed().as_secs_f64() >= 1.0 {
            eprintln!(
                "mcast-bench: [{}/{}] {} {bytes} B ({:.1} s so far)",
                k + 1,
                shapes.len(),
                b.op.name(),
                started.elapsed().as_secs_f64()
            );
        }
        let wrong = match (o.check, exchange) {
            (false, _) => None,
            (true, None) => Some(b.check(s)?),
            (true, Some(x)) => Some(x.sum(b.check(s)?)?),
        };
        let row = match info.host {
            Some((calls, launch)) => {
                let h = b.host_overhead(s, b.call_count(s), info.warmup, calls, launch)?;
                Row { size: bytes, count: s.count, time_us: 0.0, algbw: 0.0, busbw: 0.0, wrong, host: Some(h) }
            }
            None => {
                let time_us = b.time(s, info.warmup, info.iters, info.graph, exchange)?;
                let time_us = match exchange {
                    Some(x) => x.max(time_us)?,
                    None => time_us,
                };
                let algbw = if time_us > 0.0 { bytes as f64 / time_us / 1e3 } else { 0.0 };
                Row {
                    size: bytes,
                    count: s.count,
                    time_us,
                    algbw,
                    busbw: algbw * b.op.bus_factor(n),
                    wrong,
                    host: None,
                }
            }
        };
        outln!("{}", report::row_line(info, &row));
        rows.push(row);
    }
    let entry = match (info.host, shapes.first()) {
        // Count 0 returns before any launch: eager, nothing to capture.
        (Some((calls, _)), Some(s)) => Some(b.host_overhead(s, 0, 0, calls, HostLaunch::Eager)?),
        _ => None,
    };
    Ok((rows, entry))
}
