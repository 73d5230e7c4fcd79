//! CUDA graphs through the shim beside a watchdog, on the simulator: PyTorch's process group
//! polls `ncclCommGetAsyncError` from its watchdog thread without pause, also while another
//! thread captures in global mode (`torch.cuda.graph`'s default), where any potentially unsafe
//! CUDA call of any thread of the process invalidates the capture. The simulator models that
//! rule (`CaptureMode`). And a capture that is thrown away, or invalidated, leaves nothing
//! behind: the next eager calls of every rank agree and succeed.

use std::ffi::{c_int, c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcast::driver::{CaptureMode, Device, Driver, Stream};
use mcast_nccl::api::*;
use mcast_nccl::types::{self, ncclResult_t};

const N: usize = 4;
const COUNT: usize = 2048;
const NCCL_FLOAT: types::ncclDataType_t = 7;
const NCCL_SUM: types::ncclRedOp_t = 0;

fn last_error() -> String {
    // SAFETY: never NULL, NUL-terminated.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }.to_string_lossy().into_owned()
}

fn ok(r: ncclResult_t, what: &str) {
    assert_eq!(r, types::SUCCESS, "{what}: {}", last_error());
}

/// The communicators as addresses (so a watchdog thread can hold them).
struct Ranks {
    comms: Vec<usize>,
    devices: Vec<Device>,
    streams: Vec<Stream>,
    bufs: Vec<u64>,
    driver: Arc<dyn Driver>,
}

impl Ranks {
    fn write(&self, value: impl Fn(usize) -> f32) {
        for r in 0..N {
            let bytes: Vec<u8> = (0..COUNT).flat_map(|_| value(r).to_ne_bytes()).collect();
            self.driver.memcpy_htod(self.devices[r], self.bufs[r], &bytes).unwrap();
        }
    }

    fn check(&self, want: f32, what: &str) {
        for r in 0..N {
            self.driver.stream_synchronize(self.devices[r], self.streams[r]).unwrap();
            let mut bytes = vec![0u8; COUNT * 4];
            self.driver.memcpy_dtoh(self.devices[r], &mut bytes, self.bufs[r]).unwrap();
            let got: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect();
            assert!(got.iter().all(|&x| x == want), "{what}: rank {r} holds {} (and more), not {want}", got[0]);
        }
    }

    /// One in-place all-reduce on every rank, in one group.
    fn all_reduce(&self) {
        ok(ncclGroupStart(), "ncclGroupStart");
        for r in 0..N {
            let b = self.bufs[r] as *mut c_void;
            let r = ncclAllReduce(b, b, COUNT, NCCL_FLOAT, NCCL_SUM, self.comms[r] as ncclComm_t, self.stream(r));
            ok(r, "ncclAllReduce");
        }
        ok(ncclGroupEnd(), "ncclGroupEnd");
    }

    fn stream(&self, r: usize) -> cudaStream_t {
        self.streams[r].0 as cudaStream_t
    }

    fn begin_capture(&self) {
        for r in 0..N {
            self.driver.stream_begin_capture_mode(self.devices[r], self.streams[r], CaptureMode::Global).unwrap();
        }
    }

    fn async_errors(&self) -> Vec<ncclResult_t> {
        self.comms
            .iter()
            .map(|&c| {
                let mut e = types::SUCCESS;
                ok(ncclCommGetAsyncError(c as ncclComm_t, &mut e), "ncclCommGetAsyncError");
                e
            })
            .collect()
    }
}

/// A watchdog: every communicator's asynchronous error, polled without pause until stopped.
struct Watchdog {
    stop: Arc<AtomicBool>,
    polls: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<Vec<ncclResult_t>>>,
}

impl Watchdog {
    fn start(comms: &[usize]) -> Watchdog {
        let (stop, polls) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let (s, p, comms) = (stop.clone(), polls.clone(), comms.to_vec());
        let thread = std::thread::spawn(move || {
            let mut seen = Vec::new();
            while !s.load(Ordering::Acquire) {
                for &c in &comms {
                    let mut e = types::SUCCESS;
                    assert_eq!(ncclCommGetAsyncError(c as ncclComm_t, &mut e), types::SUCCESS);
                    if e != types::SUCCESS {
                        seen.push(e);
                    }
                }
                p.fetch_add(1, Ordering::AcqRel);
            }
            seen
        });
        Watchdog { stop, polls, thread: Some(thread) }
    }

    /// Returns once the watchdog has polled every communicator twice more.
    fn wait_for_polls(&self) {
        let start = self.polls.load(Ordering::Acquire);
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.polls.load(Ordering::Acquire) < start + 2 {
            assert!(Instant::now() < deadline, "the watchdog stopped polling");
            std::thread::yield_now();
        }
    }

    fn stop(mut self) -> Vec<ncclResult_t> {
        self.stop.store(true, Ordering::Release);
        self.thread.take().unwrap().join().unwrap()
    }
}

#[test]
fn graphs_captured_beside_a_polling_watchdog_and_thrown_away_captures() {
    std::env::set_var("MCAST_BACKEND", "sim");
    std::env::set_var("MCAST_SIM_DEVICES", N.to_string());
    let mut comms: [ncclComm_t; N] = [null_mut(); N];
    // SAFETY: room for N communicators; NULL devlist.
    ok(unsafe { ncclCommInitAll(comms.as_mut_ptr(), N as c_int, std::ptr::null()) }, "ncclCommInitAll");
    let process = mcast_nccl::process::acquire_context().unwrap();
    let driver = mcast::runtime::handles::context(process.ctx.id).unwrap().driver().clone();
    let devices: Vec<Device> = comms
        .iter()
        .map(|&c| {
            let mut d: c_int = -1;
            ok(ncclCommCuDevice(c, &mut d), "ncclCommCuDevice");
            d
        })
        .collect();
    let streams = devices.iter().map(|&d| driver.stream_create(d).unwrap()).collect();
    let bufs = devices.iter().map(|&d| driver.mem_alloc(d, COUNT * 4).unwrap()).collect();
    let ranks = Ranks { comms: comms.iter().map(|&c| c as usize).collect(), devices, streams, bufs, driver };
    let n = N as f32;

    // Eager first (modules loaded, as a framework's warm-up does).
    ranks.write(|r| r as f32 + 1.0);
    ranks.all_reduce();
    ranks.check(10.0, "eager");

    // A capture in global mode while the watchdog polls: it must survive.
    let watchdog = Watchdog::start(&ranks.comms);
    ranks.begin_capture();
    watchdog.wait_for_polls();
    ranks.all_reduce();
    watchdog.wait_for_polls();
    let execs: Vec<_> = (0..N)
        .map(|r| {
            let graph = ranks.driver.stream_end_capture(ranks.devices[r], ranks.streams[r]).unwrap_or_else(|e| {
                panic!("rank {r}: the capture did not survive the watchdog's ncclCommGetAsyncError: {e}")
            });
            let exec = ranks.driver.graph_instantiate(ranks.devices[r], graph).unwrap();
            ranks.driver.graph_destroy(ranks.devices[r], graph).unwrap();
            exec
        })
        .collect();
    ranks.write(|_| 1.0);
    let replays = 12;
    for _ in 0..replays {
        for (r, &exec) in execs.iter().enumerate() {
            ranks.driver.graph_launch(ranks.devices[r], exec, ranks.streams[r]).unwrap();
        }
    }
    ranks.check(n.powi(replays), "replayed beside the watchdog");
    assert_eq!(watchdog.stop(), Vec::<ncclResult_t>::new(), "the watchdog saw errors");

    // A capture thrown away (ended, never launched), then eager calls: they agree.
    ranks.begin_capture();
    ranks.all_reduce();
    ranks.all_reduce();
    for r in 0..N {
        let g = ranks.driver.stream_end_capture(ranks.devices[r], ranks.streams[r]).unwrap();
        ranks.driver.graph_destroy(ranks.devices[r], g).unwrap();
    }
    ranks.write(|r| r as f32);
    ranks.all_reduce();
    ranks.check(6.0, "eager after a capture thrown away");

    // A capture invalidated on every rank (this thread synchronizes a stream while it
    // captures): the recorded calls never run; the eager calls after agree.
    ranks.begin_capture();
    ranks.all_reduce();
    let other = ranks.driver.stream_create(ranks.devices[0]).unwrap();
    assert!(ranks.driver.stream_synchronize(ranks.devices[0], other).is_err(), "prohibited while capturing");
    for r in 0..N {
        assert!(ranks.driver.stream_end_capture(ranks.devices[r], ranks.streams[r]).is_err(), "rank {r} invalidated");
    }
    ranks.write(|r| 2.0 * r as f32);
    ranks.all_reduce();
    ranks.all_reduce();
    ranks.check(12.0 * n, "eager after an invalidated capture");
    assert_eq!(ranks.async_errors(), vec![types::SUCCESS; N]);

    for (r, exec) in execs.into_iter().enumerate() {
        ranks.driver.graph_exec_destroy(ranks.devices[r], exec).unwrap();
    }
    ranks.driver.stream_destroy(ranks.devices[0], other).unwrap();
    for r in 0..N {
        ranks.driver.stream_destroy(ranks.devices[r], ranks.streams[r]).unwrap();
        ranks.driver.mem_free(ranks.devices[r], ranks.bufs[r]).unwrap();
    }
    for c in comms {
        ok(ncclCommDestroy(c), "ncclCommDestroy");
    }
    mcast_nccl::process::release_context();
}
