//! The host path of a collective call allocates nothing (issue 16 item 4).
//!
//! A counting global allocator counts, per thread, the heap allocations made while the thread
//! runs the library's code, apart from those made while it runs the simulated device's own work
//! (`mcast::driver::sim::in_device`: inside a simulated driver call, and while the simulator
//! builds and queues a collective's host-executed job; on CUDA that part is the driver's and the
//! GPU's). After a warm-up, every collective call of the C ABI, in every form (buffer in place,
//! `_into` out of place, `mcast_team_*` on plain and on registered memory, in place and out of
//! place), on a P2P and on a MULTICAST team, must make zero library allocations; the kernel
//! layer's CUDA launch path (plan, module look-up, argument) is counted the same way on modules
//! loaded into the simulator. The test checks that it can see: an allocation in the test itself
//! and a failing call's message are counted, and the simulated device's share is non-zero.

mod common;

use std::ffi::{c_int, c_void};

use common::*;
use mcast::capi::buffer::*;
use mcast::capi::collective::*;
use mcast::capi::config::*;
use mcast::capi::context::*;
use mcast::capi::memory::*;
use mcast::capi::status::*;
use mcast::capi::team::*;
use mcast::driver::sim::{device_allocations, library_allocations, CountingAlloc, SimConfig, SimDriver};
use mcast::driver::{Driver, Stream};
use mcast::kernels::abi::{plan, GRID_MAX_BLOCKS};
use mcast::kernels::cuda::{load, resolve, variant_for};
use mcast::kernels::select::Unit;
use mcast::kernels::{Collective, DType, Launch, Path, RankPtrs, RedOp};

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

/// Library allocations made by `f` on this thread.
fn library_allocs(f: impl FnOnce()) -> u64 {
    let a0 = library_allocations();
    f();
    library_allocations() - a0
}

const N: usize = 2;
/// Elements per rank block (f32).
const COUNT: usize = 1024;
const BYTES: usize = COUNT * 4;
/// Calls counted per form and rank, after the warm-up.
const CALLS: usize = 50;

fn stream(r: usize) -> mcast_stream_t {
    // Each rank on its own simulated stream (any value names one).
    (0x100 + r) as mcast_stream_t
}

/// What a form calls for rank `r`.
type Call<'a> = Box<dyn Fn(usize) -> mcast_status_t + 'a>;

/// Every collective call of the C ABI on `team` (`buf` in place, `send`/`recv` out of place,
/// `plain` and `reg` device pointers of each rank, each at least `N * BYTES` twice over).
fn forms<'a>(
    team: mcast_team_t,
    buf: mcast_buffer_t,
    send: mcast_buffer_t,
    recv: mcast_buffer_t,
    plain: &'a [(u64, u64)],
    reg: &'a [(u64, u64)],
) -> Vec<(String, Call<'a>)> {
    let (f32_, sum) = (mcast_dtype_t(McastDtype::MCAST_FLOAT32 as u32), mcast_op_t(McastOp::MCAST_SUM as u32));
    let ptr = |p: u64| p as usize as *mut c_void;
    let rk = |r: usize| r as c_int;
    let mut v: Vec<(String, Call<'a>)> = vec![
        ("mcast_all_reduce".into(), Box::new(move |r| mcast_all_reduce(buf, rk(r), 0, COUNT, f32_, sum, stream(r)))),
        (
            "mcast_reduce_scatter".into(),
            Box::new(move |r| mcast_reduce_scatter(buf, rk(r), 0, COUNT, f32_, sum, stream(r))),
        ),
        ("mcast_broadcast".into(), Box::new(move |r| mcast_broadcast(buf, rk(r), 1, 0, BYTES, stream(r)))),
        ("mcast_all_gather".into(), Box::new(move |r| mcast_all_gather(buf, rk(r), 0, BYTES, stream(r)))),
        (
            "mcast_all_reduce_into".into(),
            Box::new(move |r| mcast_all_reduce_into(send, 0, recv, 0, rk(r), COUNT, f32_, sum, stream(r))),
        ),
        (
            "mcast_reduce_scatter_into".into(),
            Box::new(move |r| mcast_reduce_scatter_into(send, 0, recv, 0, rk(r), COUNT, f32_, sum, stream(r))),
        ),
        (
            "mcast_broadcast_into".into(),
            Box::new(move |r| mcast_broadcast_into(send, 0, recv, 0, rk(r), 0, BYTES, stream(r))),
        ),
        (
            "mcast_all_gather_into".into(),
            Box::new(move |r| mcast_all_gather_into(send, 0, recv, 0, rk(r), BYTES, stream(r))),
        ),
    ];
    for (what, mem) in [("plain", plain), ("registered", reg)] {
        // Out of place: send and recv apart; in place: NCCL's in-place layouts.
        for inplace in [false, true] {
            let place = if inplace { "in place" } else { "out of place" };
            let pick = move |r: usize| if inplace { (mem[r].0, mem[r].0) } else { (mem[r].0, mem[r].1) };
            let block = BYTES as u64;
            v.push((
                format!("mcast_team_all_reduce, {what} memory, {place}"),
                Box::new(move |r| {
                    let (s, d) = pick(r);
                    mcast_team_all_reduce(team, rk(r), ptr(s), ptr(d), COUNT, f32_, sum, stream(r))
                }),
            ));
            v.push((
                format!("mcast_team_reduce_scatter, {what} memory, {place}"),
                Box::new(move |r| {
                    let (s, d) = pick(r);
                    let d = if inplace { s + r as u64 * block } else { d };
                    mcast_team_reduce_scatter(team, rk(r), ptr(s), ptr(d), COUNT, f32_, sum, stream(r))
                }),
            ));
            v.push((
                format!("mcast_team_broadcast, {what} memory, {place}"),
                Box::new(move |r| {
                    let (s, d) = pick(r);
                    mcast_team_broadcast(team, rk(r), 0, ptr(s), ptr(d), BYTES, stream(r))
                }),
            ));
            v.push((
                format!("mcast_team_all_gather, {what} memory, {place}"),
                Box::new(move |r| {
                    let (s, d) = pick(r);
                    let s = if inplace { d + r as u64 * block } else { s };
                    mcast_team_all_gather(team, rk(r), ptr(s), ptr(d), BYTES, stream(r))
                }),
            ));
        }
    }
    v
}

fn synchronize(team: mcast_team_t) {
    for r in 0..N {
        let st = mcast_synchronize(team, r as c_int, stream(r));
        assert_eq!(st, OK, "rank {r}: {}", last_error());
    }
}

/// Runs every form on a team of `N` simulated GPUs (`multicast`: a MULTICAST team), asserting
/// zero library allocations per call after the warm-up; returns the simulated device's
/// allocations seen on this thread.
fn every_form_allocates_nothing(multicast: bool) -> u64 {
    let config = sim_config(N as u32, |c| {
        if !multicast {
            c.multicast = mcast_multicast_t(McastMulticast::MCAST_MULTICAST_OFF as u32);
        }
    });
    let (ctx, rt) = context(&config);
    let devices: Vec<i32> = (0..N as i32).collect();
    let team = team_create(ctx, &devices).unwrap();
    let info = team_info(team);
    let want = if multicast { McastTransport::MCAST_TRANSPORT_MULTICAST } else { McastTransport::MCAST_TRANSPORT_P2P };
    assert_eq!(info.transport.0, want as u32, "the team's transport");
    let buf = alloc(team, N * BYTES).unwrap();
    let send = alloc(team, N * BYTES).unwrap();
    let recv = alloc(team, N * BYTES).unwrap();
    let driver = rt.driver().clone();
    let plain: Vec<(u64, u64)> = (0..N as i32)
        .map(|d| (driver.mem_alloc(d, N * BYTES).unwrap(), driver.mem_alloc(d, N * BYTES).unwrap()))
        .collect();
    let mut mem = |d: i32| {
        let mut p = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { mcast_mem_alloc(ctx, d, 2 * N * BYTES, &mut p) }, OK, "{}", last_error());
        p
    };
    let reg_mem: Vec<*mut c_void> = (0..N as i32).map(&mut mem).collect();
    let mut reg_buf = mcast_buffer_t { id: 0 };
    // SAFETY: one pointer per rank, each of 2 * N * BYTES.
    let st = unsafe { mcast_buffer_register(team, reg_mem.as_ptr(), 2 * N * BYTES, &mut reg_buf) };
    assert_eq!(st, OK, "{}", last_error());
    let reg: Vec<(u64, u64)> =
        reg_mem.iter().map(|&p| (p as usize as u64, p as usize as u64 + (N * BYTES) as u64)).collect();

    let d0 = device_allocations();
    let mut failures = vec![];
    for (name, call) in forms(team, buf, send, recv, &plain, &reg) {
        // Warm-up: first calls make the simulator's stream workers, fill the one-stream
        // check's ring, the thread-local caches.
        for _ in 0..3 {
            for r in 0..N {
                assert_eq!(call(r), OK, "{name}, rank {r}: {}", last_error());
            }
        }
        synchronize(team);
        let mut allocs = 0;
        for _ in 0..CALLS {
            for r in 0..N {
                let mut st = OK;
                allocs += library_allocs(|| st = call(r));
                assert_eq!(st, OK, "{name}, rank {r}: {}", last_error());
            }
        }
        synchronize(team);
        if allocs != 0 {
            failures.push(format!("{name}: {allocs} allocation(s) in {} calls", CALLS * N));
        }
    }
    let device_allocs = device_allocations() - d0;

    assert_eq!(mcast_buffer_free(reg_buf), OK, "{}", last_error());
    for p in reg_mem {
        assert_eq!(mcast_mem_free(ctx, p), OK, "{}", last_error());
    }
    for (s, d) in plain.iter().zip(0..) {
        driver.mem_free(d, s.0).unwrap();
        driver.mem_free(d, s.1).unwrap();
    }
    for b in [buf, send, recv] {
        assert_eq!(mcast_buffer_free(b), OK, "{}", last_error());
    }
    assert_eq!(mcast_team_destroy(team), OK, "{}", last_error());
    drop(driver);
    assert_eq!(mcast_context_destroy(ctx), OK, "{}", last_error());
    let ledger = ledger(&rt);
    assert!(ledger.is_empty(), "{ledger}");
    assert!(failures.is_empty(), "library allocations on the success path:\n{}", failures.join("\n"));
    device_allocs
}

#[test]
fn the_counter_sees_allocations_in_the_test_and_in_a_failing_call() {
    // The allocator is installed and counts this thread.
    let n = library_allocs(|| drop(std::hint::black_box(vec![1u8; 3])));
    assert_eq!(n, 1);
    // A failing call builds its message on the library's side: counted.
    let config = sim_config(N as u32, |_| {});
    let (ctx, _rt) = context(&config);
    let team = team_create(ctx, &[0, 1]).unwrap();
    let buf = alloc(team, BYTES).unwrap();
    let f32_ = mcast_dtype_t(McastDtype::MCAST_FLOAT32 as u32);
    let sum = mcast_op_t(McastOp::MCAST_SUM as u32);
    let mut st = OK;
    let n = library_allocs(|| st = mcast_all_reduce(buf, 7, 0, 16, f32_, sum, std::ptr::null_mut()));
    assert_eq!(st, common::st(McastStatus::MCAST_ERROR_INVALID_ARGUMENT));
    assert!(n > 0, "the error message is an allocation the counter must see");
    assert!(last_error().contains("rank 7 is out of range"), "{}", last_error());
    assert_eq!(mcast_buffer_free(buf), OK);
    assert_eq!(mcast_team_destroy(team), OK);
    assert_eq!(mcast_context_destroy(ctx), OK);
}

#[test]
fn p2p_collectives_allocate_nothing_on_the_host_path() {
    let device_allocs = every_form_allocates_nothing(false);
    // The simulated device's own work (its jobs and queues) allocates, on this thread, and is
    // told apart: the split is real.
    assert!(device_allocs > 0, "the simulator's share was not seen");
}

#[test]
fn multicast_collectives_allocate_nothing_on_the_host_path() {
    every_form_allocates_nothing(true);
}

/// A two-rank launch at rank 0 with addresses that need not be mapped (nothing runs).
fn launch(collective: Collective, path: Path, out_of_place: bool) -> Launch {
    Launch {
        collective,
        path,
        rank: 0,
        nranks: 2,
        dev: 0,
        stream: Stream(0x100),
        data: [0x1000_0000, 0x2000_0000].into(),
        data_mc: (path == Path::Multicast).then_some(0x9000_0000),
        out: if out_of_place { [0x5000_0000, 0x6000_0000].into() } else { RankPtrs::EMPTY },
        out_mc: (path == Path::Multicast && out_of_place).then_some(0xa000_0000),
        sync: [0x3000_0000, 0x4000_0000].into(),
        sync_mc: (path == Path::Multicast).then_some(0xb000_0000),
        count: 4096,
        timeout_ns: 0,
        max_blocks: GRID_MAX_BLOCKS,
        local_only: false,
        ll: false,
        signature: Some([1, 2]),
        out_stride: 0,
    }
}

/// The CUDA launch path of the kernel layer (`kernels::cuda::launch` before `cuLaunchKernel`:
/// plan, module table, argument) on modules loaded into the simulator: nothing allocated once
/// each module is loaded.
#[test]
fn the_cuda_launch_path_allocates_nothing_once_loaded() {
    let sim = SimDriver::new(SimConfig { devices: 2, ..SimConfig::default() });
    let driver: &dyn Driver = &sim;
    let ar = |dtype, op| Collective::AllReduce { dtype, op };
    let collectives = [
        ar(DType::F32, RedOp::Sum),
        ar(DType::BF16, RedOp::Max),
        Collective::ReduceScatter { dtype: DType::F16, op: RedOp::Sum },
        Collective::Broadcast { root: 1 },
        Collective::AllGather,
    ];
    let mut launches = vec![];
    for c in collectives {
        for path in [Path::P2P, Path::Multicast] {
            for (out_of_place, ll) in [(false, false), (true, false), (false, true)] {
                let l = Launch { ll, ..launch(c, path, out_of_place) };
                let kernel = plan(&l).unwrap().unwrap().kernel;
                load(driver, l.dev, variant_for(&l), Unit::of(kernel, l.ll), b"stand-in image").unwrap();
                launches.push(l);
            }
        }
    }
    // First look-ups fill this thread's cache.
    for l in &launches {
        resolve(driver, l).unwrap().unwrap();
    }
    for l in &launches {
        let mut got = None;
        let n = library_allocs(|| got = Some(resolve(driver, l)));
        let k = got.unwrap().unwrap().unwrap();
        assert_eq!(n, 0, "{:?} {:?}: {n} allocation(s)", l.collective, l.path);
        assert_eq!((k.args.nranks, k.args.count, k.args.data[1]), (2, 4096, 0x2000_0000));
    }
    // Another thread finds the same modules without loading anything.
    std::thread::scope(|s| {
        s.spawn(|| {
            for l in &launches {
                resolve(driver, l).unwrap().unwrap();
            }
            for l in &launches {
                let n = library_allocs(|| drop(resolve(driver, l)));
                assert_eq!(n, 0, "{:?} {:?} on a second thread", l.collective, l.path);
            }
        });
    });
}
