//! Timing: the device time per iteration (events around eager launches, or around replays of a
//! captured CUDA graph, `-G`), and the host time of one `mcast_*` call (`--host-overhead`),
//! each rank on its own thread with its device current, as in a program with a thread per GPU.
//!
//! Streams, events and graphs are the bench's own plumbing (what a C program does with the CUDA
//! runtime), so they go through the context's driver; every mcast call goes through the C ABI.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::Instant;

use mcast::driver::{Driver, Graph, Stream};

use crate::api;
use crate::args::{runtime, with_errors, Failure, HostLaunch};
use crate::data::Shape;
use crate::procs::Exchange;
use crate::run::Bench;

/// Calls per capture (or between stream synchronizations, eager) in host-overhead mode: few
/// enough that an eager stream never fills the launch queue (which would block a call).
pub const HOST_BATCH: u32 = 64;

/// Runs `body(r)` for every rank on its own thread and collects the results in rank order.
fn per_rank<T: Send>(n: usize, body: impl Fn(usize) -> Result<T, Failure> + Sync) -> Vec<Result<T, Failure>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                scope.spawn({
                    let body = &body;
                    move || body(r)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(runtime("a rank thread panicked")))).collect()
    })
}

/// Where the ranks' timed parts start together. The ranks of this process meet at a barrier;
/// with ranks in other processes (one here) they also meet through the [`Exchange`]. Every
/// rank passes exactly once, set up or failed, and learns whether any rank failed, so a failure
/// never leaves a rank waiting there.
struct StartLine<'a> {
    barrier: Barrier,
    failed: AtomicBool,
    across: Option<&'a Exchange>,
}

impl<'a> StartLine<'a> {
    fn new(local: usize, across: Option<&'a Exchange>) -> StartLine<'a> {
        StartLine { barrier: Barrier::new(local), failed: AtomicBool::new(false), across }
    }

    /// Waits for every rank; true when any (this one if `failed_here`) failed before the line.
    fn pass(&self, failed_here: bool) -> Result<bool, Failure> {
        if failed_here {
            self.failed.store(true, Ordering::SeqCst);
        }
        self.barrier.wait();
        if let Some(x) = self.across {
            if x.any(self.failed.load(Ordering::SeqCst))? {
                self.failed.store(true, Ordering::SeqCst);
            }
        }
        Ok(self.failed.load(Ordering::SeqCst))
    }
}

impl Bench<'_> {
    /// Warm-up, then the timed loop; the slowest rank's time per iteration in microseconds.
    ///
    /// Each rank is driven by its own thread with its device current, as in a program with one
    /// thread (or process) per GPU: ranks' launches proceed in parallel, and a rank's time is
    /// its stream's, measured with events around its loop.
    ///
    /// With `graph > 0` each rank captures its `iters` iterations in a CUDA graph and replays it
    /// `graph` times between the events (see [`Bench::time_graph`]); the time is per iteration.
    ///
    /// This process's ranks only: with ranks in other processes, `across` lines them up at the
    /// start, and the caller takes the slowest time over the processes.
    pub fn time(
        &self,
        s: &Shape,
        warmup: u32,
        iters: u32,
        graph: u32,
        across: Option<&Exchange>,
    ) -> Result<f64, Failure> {
        let driver = self.plumbing.driver.as_ref();
        let rig = self.rig;
        let n = rig.streams.len();
        let start_line = StartLine::new(n, across);
        let per_rank = per_rank(n, |l| -> Result<f64, Failure> {
            let (dev, stream, r) = (rig.devices[l], rig.streams[l], self.rank(l));
            let launch = || self.run_rank(l, s, stream);
            let bound = driver.bind_thread(dev).map_err(|e| runtime(format!("rank {r}: {e}")));
            if graph > 0 {
                return self.time_graph(l, s, (warmup, iters, graph), &start_line, bound);
            }
            let warm = bound.and_then(|()| {
                for _ in 0..warmup {
                    launch()?;
                }
                driver.stream_synchronize(dev, stream).map_err(|e| runtime(format!("rank {r}: {e}")))
            });
            let failed = start_line.pass(warm.is_err())?;
            warm?;
            if failed {
                return Err(runtime(format!("rank {r}: another rank failed its warm-up")));
            }
            driver
                .event_record(dev, rig.start[l], stream)
                .map_err(|e| runtime(format!("recording rank {r}'s start event: {e}")))?;
            for _ in 0..iters {
                launch()?;
            }
            driver
                .event_record(dev, rig.end[l], stream)
                .map_err(|e| runtime(format!("recording rank {r}'s end event: {e}")))?;
            self.sync(l, stream)?;
            let ms = driver
                .event_elapsed_ms(dev, rig.start[l], rig.end[l])
                .map_err(|e| runtime(format!("reading rank {r}'s elapsed time: {e}")))?;
            Ok(f64::from(ms))
        });
        let mut ms = 0f64;
        for t in per_rank {
            ms = ms.max(t?);
        }
        Ok(ms * 1e3 / (f64::from(iters) * f64::from(graph.max(1))))
    }

    /// The graph-mode timing of the rank at local index `l`, on its own thread with its device
    /// current (`bound`: whether that worked): `warmup` eager iterations; `iters` iterations
    /// captured on its stream (thread-local capture mode, as nccl-tests) and instantiated; once
    /// every rank's graph is, one untimed replay (which also uploads the graph); then, once every
    /// rank is ready, `replays` replays between the events. Returns the elapsed milliseconds of
    /// all replays. Every rank passes the start line twice, even when its setup failed (the others
    /// then skip the timed part).
    fn time_graph(
        &self,
        l: usize,
        s: &Shape,
        (warmup, iters, replays): (u32, u32, u32),
        start_line: &StartLine,
        bound: Result<(), Failure>,
    ) -> Result<f64, Failure> {
        let driver = self.plumbing.driver.as_ref();
        let rig = self.rig;
        let (dev, stream, r) = (rig.devices[l], rig.streams[l], self.rank(l));
        let setup = bound.and_then(|()| {
            for _ in 0..warmup {
                self.run_rank(l, s, stream)?;
            }
            self.sync(l, stream)?;
            let graph = capture(driver, dev, stream, || {
                for _ in 0..iters {
                    self.run_rank(l, s, stream)?;
                }
                Ok(())
            })?;
            let exec = match driver.graph_instantiate(dev, graph) {
                Ok(x) => x,
                Err(e) => {
                    let _ = driver.graph_destroy(dev, graph);
                    return Err(runtime(format!("rank {r}: instantiating the CUDA graph: {e}")));
                }
            };
            Ok((graph, exec))
        });
        // Every rank's graph is captured and instantiated before any rank replays one: a replay
        // spins in its collectives' waits until every peer's replay comes, and a peer still
        // setting up its graph may need the device to drain first (ranks sharing a GPU then
        // never meet: 8 ranks on one H200, a 32 MB reduce-scatter of the pointer form, 2026-11-28).
        let failed = start_line.pass(setup.is_err())?;
        let (g, x) = match setup {
            Ok(g) => g,
            Err(f) => {
                start_line.pass(true)?;
                return Err(f);
            }
        };
        let replay =
            |what: &str| driver.graph_launch(dev, x, stream).map_err(|e| runtime(format!("rank {r}: {what}: {e}")));
        let timed = (|| -> Result<f64, Failure> {
            if failed {
                start_line.pass(true)?;
                return Err(runtime(format!("rank {r}: another rank failed to set up its CUDA graph")));
            }
            // The untimed replay: the graph's first launch uploads it.
            let warm = replay("replaying the CUDA graph").and_then(|()| self.sync(l, stream));
            let failed = start_line.pass(warm.is_err())?;
            warm?;
            if failed {
                return Err(runtime(format!("rank {r}: another rank failed to set up its CUDA graph")));
            }
            driver
                .event_record(dev, rig.start[l], stream)
                .map_err(|e| runtime(format!("recording rank {r}'s start event: {e}")))?;
            for _ in 0..replays {
                replay("replaying the CUDA graph")?;
            }
            driver
                .event_record(dev, rig.end[l], stream)
                .map_err(|e| runtime(format!("recording rank {r}'s end event: {e}")))?;
            self.sync(l, stream)?;
            let ms = driver
                .event_elapsed_ms(dev, rig.start[l], rig.end[l])
                .map_err(|e| runtime(format!("reading rank {r}'s elapsed time: {e}")))?;
            Ok(f64::from(ms))
        })();
        let mut errors = vec![];
        if let Err(e) = driver.graph_exec_destroy(dev, x) {
            errors.push(format!("rank {r}: destroying the executable CUDA graph: {e}"));
        }
        if let Err(e) = driver.graph_destroy(dev, g) {
            errors.push(format!("rank {r}: destroying the CUDA graph: {e}"));
        }
        match timed {
            Ok(_) if !errors.is_empty() => Err(runtime(errors.join("; "))),
            other => other.map_err(|f| with_errors(f, errors)),
        }
    }

    /// Host-overhead mode: the time of each of `calls` `mcast_*` calls per rank for `count`
    /// (elements or bytes; 0 times the call's entry alone: checks, no launch), each timed alone
    /// with the monotonic clock on its rank's thread, with the heap allocations made inside it
    /// (mcast's own, and apart from them the simulated device's, see [`HostTimes`]).
    /// After `warmup` untimed eager calls (which also load the kernels; at least one before a
    /// capture), the calls go in batches
    /// of [`HOST_BATCH`]: with [`HostLaunch::Capture`] each batch is made inside a stream
    /// capture whose graph is destroyed unlaunched (the whole launch path runs, the kernels never
    /// do: the no-op path); with [`HostLaunch::Eager`] the kernels run and each batch ends with
    /// `mcast_synchronize`, outside the timing.
    pub fn host_overhead(
        &self,
        s: &Shape,
        count: usize,
        warmup: u32,
        calls: u32,
        launch: HostLaunch,
    ) -> Result<HostTimes, Failure> {
        let driver = self.plumbing.driver.as_ref();
        let rig = self.rig;
        let block = (s.count * s.es) as u64;
        // A capture needs the kernels loaded before it: at least one eager call first.
        let warmup = if launch == HostLaunch::Capture && count > 0 { warmup.max(1) } else { warmup };
        let start_line = Barrier::new(rig.streams.len());
        let per_rank = per_rank(rig.streams.len(), |r| -> Result<(Vec<u64>, u64, u64), Failure> {
            let (dev, stream) = (rig.devices[r], rig.streams[r]);
            let name = self.op.name();
            let call =
                || api::check(self.call(r, count, block, stream)).map_err(|e| runtime(format!("{name} rank {r}: {e}")));
            driver.bind_thread(dev).map_err(|e| runtime(format!("rank {r}: {e}")))?;
            let mut ns = Vec::with_capacity(calls as usize);
            let (mut allocs, mut sim_allocs) = (0u64, 0u64);
            let warm = (|| {
                for _ in 0..warmup {
                    call()?;
                }
                self.sync(r, stream)
            })();
            // Every rank passes here once, whatever happened, so no rank is left waiting.
            start_line.wait();
            warm?;
            let mut left = calls;
            while left > 0 {
                let batch = left.min(HOST_BATCH);
                let mut timed = || -> Result<(), Failure> {
                    for _ in 0..batch {
                        let (a0, s0) =
                            (mcast::driver::sim::library_allocations(), mcast::driver::sim::device_allocations());
                        let t0 = Instant::now();
                        let st = self.call(r, count, block, stream);
                        let dt = t0.elapsed();
                        allocs += mcast::driver::sim::library_allocations() - a0;
                        sim_allocs += mcast::driver::sim::device_allocations() - s0;
                        ns.push(dt.as_nanos() as u64);
                        api::check(st).map_err(|e| runtime(format!("{name} rank {r}: {e}")))?;
                    }
                    Ok(())
                };
                match launch {
                    HostLaunch::Capture => {
                        let graph = capture(driver, dev, stream, timed)?;
                        driver
                            .graph_destroy(dev, graph)
                            .map_err(|e| runtime(format!("rank {r}: destroying the CUDA graph: {e}")))?;
                    }
                    HostLaunch::Eager => {
                        timed()?;
                        self.sync(r, stream)?;
                    }
                }
                left -= batch;
            }
            Ok((ns, allocs, sim_allocs))
        });
        let mut all = Vec::with_capacity(calls as usize * rig.streams.len());
        let (mut allocs, mut sim_allocs) = (0, 0);
        for t in per_rank {
            let (ns, a, s) = t?;
            all.extend(ns);
            allocs += a;
            sim_allocs += s;
        }
        Ok(HostTimes::of(all, allocs, sim_allocs))
    }
}

/// Per-call host times over every rank's calls.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostTimes {
    pub median_ns: f64,
    pub p99_ns: f64,
    pub mean_ns: f64,
    /// Heap allocations (and reallocations) made inside a call by mcast's own code, on
    /// average: on the simulator without the simulated device's share.
    pub allocs_per_call: f64,
    /// The simulated device's share, on average (its driver calls and host-executed jobs,
    /// which on CUDA are the driver's and the GPU's); 0 on CUDA.
    pub sim_allocs_per_call: f64,
}

impl HostTimes {
    /// The statistics of `ns`, one sample per call; `allocs` and `sim_allocs` over all of them.
    pub fn of(mut ns: Vec<u64>, allocs: u64, sim_allocs: u64) -> HostTimes {
        if ns.is_empty() {
            return HostTimes {
                median_ns: 0.0,
                p99_ns: 0.0,
                mean_ns: 0.0,
                allocs_per_call: 0.0,
                sim_allocs_per_call: 0.0,
            };
        }
        ns.sort_unstable();
        let len = ns.len();
        // Nearest rank: the smallest sample with at least p of them at or below it.
        let rank = |p: f64| ns[((p * len as f64).ceil() as usize).clamp(1, len) - 1] as f64;
        HostTimes {
            median_ns: rank(0.5),
            p99_ns: rank(0.99),
            mean_ns: ns.iter().sum::<u64>() as f64 / len as f64,
            allocs_per_call: allocs as f64 / len as f64,
            sim_allocs_per_call: sim_allocs as f64 / len as f64,
        }
    }
}

/// Captures what `body` launches on `stream` into a graph. The capture is ended on every path,
/// so the stream never stays capturing; a graph made before a failure is destroyed.
pub fn capture(
    driver: &dyn Driver,
    dev: i32,
    stream: Stream,
    body: impl FnOnce() -> Result<(), Failure>,
) -> Result<Graph, Failure> {
    driver.stream_begin_capture(dev, stream).map_err(|e| runtime(format!("beginning a CUDA graph capture: {e}")))?;
    let launched = body();
    let ended = driver.stream_end_capture(dev, stream);
    match (launched, ended) {
        (Ok(()), Ok(graph)) => Ok(graph),
        (Ok(()), Err(e)) => Err(runtime(format!("ending the CUDA graph capture: {e}"))),
        (Err(f), ended) => {
            if let Ok(graph) = ended {
                let _ = driver.graph_destroy(dev, graph);
            }
            Err(f)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api;

    #[test]
    fn host_times_are_nearest_rank_percentiles() {
        let t = HostTimes::of((1..=100).rev().collect(), 250, 50);
        assert_eq!((t.median_ns, t.p99_ns, t.mean_ns, t.allocs_per_call), (50.0, 99.0, 50.5, 2.5));
        assert_eq!(t.sim_allocs_per_call, 0.5);
        let t = HostTimes::of(vec![7], 0, 0);
        assert_eq!((t.median_ns, t.p99_ns), (7.0, 7.0));
        let t = HostTimes::of(vec![1, 1, 1, 1000], 4, 0);
        assert_eq!((t.median_ns, t.p99_ns, t.allocs_per_call), (1.0, 1000.0, 1.0));
        assert_eq!(HostTimes::of(vec![], 0, 0).median_ns, 0.0);
    }

    /// Host-overhead mode on a simulated 2-rank team: capture runs the whole call (the calls
    /// succeed and reach the launch, mcast's code allocates nothing, the simulated device's
    /// capture does and is counted apart) but never the kernel (only the
    /// eager warm-up's all-reduce changed the data); eager runs them (the all-reduce sums); count
    /// 0 makes no launch at all. Nothing is left behind.
    #[test]
    fn capture_is_the_no_op_path_and_eager_runs_the_kernels() {
        use crate::args::{DType, Memory, Op, RedOp};
        use crate::run::{Bench, Rig};
        let mut config = api::config(Some(crate::args::Backend::Sim as u32));
        config.sim_devices = 2;
        config.multicast.0 = 1; // MCAST_MULTICAST_OFF: P2P
        let ctx = api::context_create(&config).unwrap();
        let p = api::Plumbing::of(ctx).unwrap();
        let team = api::team_create(ctx, &[0, 1]).unwrap();
        let mut rig = Rig::new(&[0, 1], 0);
        rig.populate(&p, ctx, team, 4096, Memory::Buffer, true).unwrap_or_else(|_| panic!("rig"));
        let ones: Vec<u8> = [1.0f32; 1024].iter().flat_map(|x| x.to_ne_bytes()).collect();
        let b = Bench {
            plumbing: &p,
            team,
            rig: &rig,
            op: Op::AllReduce,
            dtype: DType::F32,
            redop: RedOp::Sum,
            root: 0,
            inputs: vec![],
            reduced: vec![],
        };
        let s = Shape::of(Op::AllReduce, DType::F32, 2, 4096);
        let buf = rig.buf.unwrap();
        let read = |r| {
            let mut got = vec![0u8; 4096];
            api::buffer_read(buf, r, &mut got).unwrap();
            got
        };
        for r in 0..2 {
            api::buffer_write(buf, r, &ones).unwrap();
        }
        let sim = p.driver.as_sim().expect("the simulator");
        let launches = sim.call_count("cuLaunchKernel");
        let ok = |r: Result<HostTimes, Failure>| r.unwrap_or_else(|_| panic!("host_overhead failed"));
        let twos: Vec<u8> = [2.0f32; 1024].iter().flat_map(|x| x.to_ne_bytes()).collect();
        let fours: Vec<u8> = [4.0f32; 1024].iter().flat_map(|x| x.to_ne_bytes()).collect();
        // One eager warm-up call per rank (a capture needs the kernels loaded), then 100
        // captured calls per rank that never run.
        let t = ok(b.host_overhead(&s, 1024, 0, 100, HostLaunch::Capture));
        assert!(t.median_ns > 0.0 && t.p99_ns >= t.median_ns, "{t:?}");
        assert!(t.allocs_per_call == 0.0 && t.sim_allocs_per_call >= 1.0, "{t:?}");
        assert_eq!(sim.call_count("cuLaunchKernel") - launches, 2 + 200, "every call reached the launch");
        assert_eq!((read(0), read(1)), (twos.clone(), twos.clone()), "only the warm-up all-reduce ran");
        let t = ok(b.host_overhead(&s, 0, 0, 50, HostLaunch::Eager));
        assert_eq!(sim.call_count("cuLaunchKernel") - launches, 202, "count 0 launches nothing");
        assert!(t.median_ns > 0.0 && t.allocs_per_call == 0.0, "{t:?}");
        ok(b.host_overhead(&s, 1024, 0, 1, HostLaunch::Eager));
        assert_eq!((read(0), read(1)), (fours.clone(), fours), "eager ran one all-reduce");
        assert!(rig.release(&p, ctx).is_empty());
        api::team_destroy(team).unwrap();
        drop(p);
        assert_eq!(api::leak_report(ctx), "");
        api::context_destroy(ctx).unwrap();
    }
}
