//! The device API on a real GPU (`MCAST_TEST_BACKEND=cuda`; skipped otherwise): the example
//! kernels of `examples/kernels/`, compiled with NVRTC from `mcast_device_header_source` (so no
//! CUDA toolkit is needed), on a team of two ranks sharing device 0 over P2P (multicast off:
//! never a multicast object on a shared machine), so the multimem calls run their emulation:
//! the all-reduce of one's own and the fused all-reduce + residual + RMSNorm right eager and
//! over 1000 CUDA-graph replays, signals passed 10^4 times, a barrier no peer joins returns
//! TIMEOUT within its timeout and poisons the team, an abort from another thread ends a device
//! wait within a millisecond.
#![allow(clippy::needless_range_loop)] // ranks index several parallel arrays

mod common;

use std::ffi::{c_void, CString};
use std::mem::size_of;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use mcast::capi::buffer::*;
use mcast::capi::config::*;
use mcast::capi::context::*;
use mcast::capi::device_api::*;
use mcast::capi::team::*;
use mcast::driver::{Device, DevicePtr, Driver, Function, LaunchConfig, Stream};
use mcast::kernels::nvrtc;

const RANKS: usize = 2;

struct Gpu {
    ctx: mcast_context_t,
    team: mcast_team_t,
    driver: Arc<dyn Driver>,
    dev: Device,
    streams: Vec<Stream>,
    handles: Vec<mcast_dev_team_t>,
}

fn open() -> Option<Gpu> {
    if !on_gpu() {
        eprintln!("skipped: MCAST_TEST_BACKEND is not cuda");
        return None;
    }
    let mut cfg = std::mem::MaybeUninit::<mcast_config_t>::uninit();
    // SAFETY: a valid pointer; mcast_config_init writes every field.
    let mut cfg = unsafe {
        mcast_config_init(cfg.as_mut_ptr());
        cfg.assume_init()
    };
    cfg.backend = mcast_backend_t(McastBackend::MCAST_BACKEND_CUDA as u32);
    cfg.multicast = mcast_multicast_t(McastMulticast::MCAST_MULTICAST_OFF as u32);
    let (ctx, c) = context(&cfg);
    let team = team_create(ctx, &[0; RANKS]).unwrap();
    let driver = c.driver().clone();
    let streams = (0..RANKS).map(|_| driver.stream_create(0).unwrap()).collect();
    let handles = (0..RANKS as i32)
        .map(|r| {
            let mut h = mcast_dev_team_t { struct_size: size_of::<mcast_dev_team_t>() as u32, ..Default::default() };
            // SAFETY: a valid out-pointer.
            assert_eq!(unsafe { mcast_team_device_handle(team, r, &mut h) }, OK, "{}", last_error());
            assert_eq!(h.flags & DEV_FLAG_MULTICAST, 0, "multicast is off");
            h
        })
        .collect();
    Some(Gpu { ctx, team, driver, dev: 0, streams, handles })
}

impl Gpu {
    /// The kernel `name` of examples/kernels/`file`, compiled with NVRTC for device 0.
    fn kernel(&self, file: &str, name: &str) -> Function {
        let nv = nvrtc::nvrtc().expect("NVRTC (MCAST_NVRTC_PATH)");
        let props = self.driver.device_props(self.dev).unwrap();
        let src = std::fs::read_to_string(format!("{}/examples/kernels/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let mut len = 0usize;
        // SAFETY: a valid out-pointer; the text is static and NUL-terminated.
        let header = unsafe { std::ffi::CStr::from_ptr(mcast_device_header_source(&mut len)) }.to_str().unwrap();
        let opts = vec![format!("--gpu-architecture=sm_{}{}", props.cc_major, props.cc_minor), "-std=c++17".into()];
        let out = nv.compile_with_headers(&src, file, &[("mcast/device.h", header)], &opts, file).unwrap();
        let module = self.driver.module_load(self.dev, &out.cubin).unwrap();
        self.driver.module_function(self.dev, module, &CString::new(name).unwrap()).unwrap()
    }

    fn buffer(&self, bytes: usize) -> (mcast_buffer_t, Vec<mcast_dev_buffer_t>) {
        let buf = alloc(self.team, bytes).unwrap();
        let hs = (0..RANKS as i32)
            .map(|r| {
                let mut h =
                    mcast_dev_buffer_t { struct_size: size_of::<mcast_dev_buffer_t>() as u32, ..Default::default() };
                // SAFETY: a valid out-pointer.
                assert_eq!(unsafe { mcast_buffer_device_handle(buf, r, &mut h) }, OK, "{}", last_error());
                h
            })
            .collect();
        (buf, hs)
    }

    /// Launches `f` on `stream` with `params` (pointers to each argument).
    fn launch(&self, f: Function, grid: u32, block: u32, stream: Stream, params: &mut [*mut c_void]) {
        let cfg = LaunchConfig::linear(grid, block);
        self.driver.launch(self.dev, f, &cfg, stream, params).unwrap();
    }

    fn sync(&self) {
        for &s in &self.streams {
            self.driver.stream_synchronize(self.dev, s).unwrap();
        }
    }

    fn word(&self) -> DevicePtr {
        let p = self.driver.mem_alloc(self.dev, 16).unwrap();
        self.driver.memset_d8(self.dev, p, 0, 16).unwrap();
        p
    }

    fn read_i32(&self, p: DevicePtr) -> i32 {
        let mut b = [0u8; 4];
        self.driver.memcpy_dtoh(self.dev, &mut b, p).unwrap();
        i32::from_ne_bytes(b)
    }

    fn close(self, failed: bool) {
        for s in self.streams {
            let _ = self.driver.stream_destroy(self.dev, s);
        }
        let st = mcast_team_destroy(self.team);
        assert!(failed || st == OK, "{}", last_error());
        assert_eq!(mcast_context_destroy(self.ctx), OK, "{}", last_error());
    }
}

fn write_f32(buf: mcast_buffer_t, rank: i32, v: &[f32]) {
    // SAFETY: a valid pointer and length.
    assert_eq!(unsafe { mcast_buffer_write(buf, rank, 0, v.as_ptr().cast(), v.len() * 4) }, OK);
}
fn read_f32(buf: mcast_buffer_t, rank: i32, n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    // SAFETY: a valid pointer and length.
    assert_eq!(unsafe { mcast_buffer_read(buf, rank, 0, v.as_mut_ptr().cast(), n * 4) }, OK);
    v
}

#[test]
fn gpu_own_all_reduce_eager_and_over_graph_replays() {
    let Some(g) = open() else { return };
    let f = g.kernel("all_reduce.cuh", "my_all_reduce");
    let n = 1usize << 18;
    let (buf, bh) = g.buffer(n * 4);
    let status: Vec<DevicePtr> = (0..RANKS).map(|_| g.word()).collect();
    let fill = || {
        for r in 0..RANKS {
            write_f32(buf, r as i32, &(0..n).map(|k| (r + 1 + k % 7) as f32).collect::<Vec<_>>());
        }
    };
    let check = |scale: f32, what: &str| {
        for r in 0..RANKS {
            assert_eq!(g.read_i32(status[r]), 0, "{what}: rank {r} status");
            let back = read_f32(buf, r as i32, n);
            for (k, &x) in back.iter().enumerate() {
                let want: usize = (0..RANKS).map(|q| q + 1 + k % 7).sum();
                assert_eq!(x, want as f32 * scale, "{what}: rank {r} element {k}");
            }
        }
    };
    let mut args: Vec<(mcast_dev_team_t, mcast_dev_buffer_t, u64, DevicePtr)> =
        (0..RANKS).map(|r| (g.handles[r], bh[r], n as u64, status[r])).collect();
    let mut launch = |r: usize, stream: Stream| {
        let a = &mut args[r];
        let mut p: [*mut c_void; 4] = [
            (&mut a.0 as *mut mcast_dev_team_t).cast(),
            (&mut a.1 as *mut mcast_dev_buffer_t).cast(),
            (&mut a.2 as *mut u64).cast(),
            (&mut a.3 as *mut DevicePtr).cast(),
        ];
        g.launch(f, 8, 512, stream, &mut p);
    };
    fill();
    for r in 0..RANKS {
        launch(r, g.streams[r]);
    }
    g.sync();
    check(1.0, "eager");
    let graphs = RankGraphs::capture(&g.driver, &[g.dev; RANKS], &mut launch);
    // Each replay sums again (x RANKS): refill every 16 (exact in f32 up to there).
    let mut done = 0;
    while done < 1000 {
        fill();
        graphs.replay(&g.driver, 16);
        for &s in &graphs.streams {
            g.driver.stream_synchronize(g.dev, s).unwrap();
        }
        check((RANKS as f32).powi(15), "graph replays");
        done += 16;
    }
    graphs.destroy(&g.driver);
    assert_eq!(mcast_buffer_free(buf), OK);
    g.close(false);
}

#[test]
fn gpu_signals_pass_ten_thousand_times() {
    let Some(g) = open() else { return };
    let f = g.kernel("checks.cuh", "ping_pong");
    let (buf, bh) = g.buffer(64);
    let status: Vec<DevicePtr> = (0..RANKS).map(|_| g.word()).collect();
    for pass in 0..2 {
        for r in 0..RANKS {
            let (mut t, mut b, mut slot, mut rounds, mut st) = (g.handles[r], bh[r], 7u32, 10_000u32, status[r]);
            let mut p: [*mut c_void; 5] = [
                (&mut t as *mut mcast_dev_team_t).cast(),
                (&mut b as *mut mcast_dev_buffer_t).cast(),
                (&mut slot as *mut u32).cast(),
                (&mut rounds as *mut u32).cast(),
                (&mut st as *mut DevicePtr).cast(),
            ];
            g.launch(f, 1, 32, g.streams[r], &mut p);
        }
        g.sync();
        for r in 0..RANKS {
            assert_eq!(g.read_i32(status[r]), 0, "pass {pass} rank {r}");
        }
    }
    assert_eq!(mcast_buffer_free(buf), OK);
    g.close(false);
}

fn lone_barrier(g: &Gpu, f: Function, slot: u32, timeout_ns: u64, status: DevicePtr, ended: DevicePtr) {
    let (mut t, mut s, mut tn, mut st, mut en) = (g.handles[0], slot, timeout_ns, status, ended);
    let mut p: [*mut c_void; 5] = [
        (&mut t as *mut mcast_dev_team_t).cast(),
        (&mut s as *mut u32).cast(),
        (&mut tn as *mut u64).cast(),
        (&mut st as *mut DevicePtr).cast(),
        (&mut en as *mut DevicePtr).cast(),
    ];
    g.launch(f, 1, 64, g.streams[0], &mut p);
}

#[test]
fn gpu_a_barrier_no_peer_joins_times_out_and_poisons_the_team() {
    let Some(g) = open() else { return };
    let f = g.kernel("checks.cuh", "lone_barrier");
    let (status, ended) = (g.word(), g.word());
    let t0 = Instant::now();
    lone_barrier(&g, f, 3, 50_000_000, status, ended);
    g.driver.stream_synchronize(g.dev, g.streams[0]).unwrap();
    let took = t0.elapsed();
    assert_eq!(g.read_i32(status), 9, "MCAST_ERROR_TIMEOUT");
    assert!(took >= Duration::from_millis(50) && took < Duration::from_millis(1050), "{took:?}");
    let mut e = mcast::capi::mcast_status_t(0);
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { mcast_team_get_error(g.team, &mut e) }, OK);
    assert_eq!(e, st(mcast::capi::status::McastStatus::MCAST_ERROR_TIMEOUT));
    let t1 = Instant::now();
    lone_barrier(&g, f, 4, 0, status, ended);
    g.driver.stream_synchronize(g.dev, g.streams[0]).unwrap();
    assert_eq!(g.read_i32(status), 9, "a later barrier returns the error at once");
    assert!(t1.elapsed() < Duration::from_millis(20), "{:?}", t1.elapsed());
    g.close(true);
}

#[test]
fn gpu_an_abort_from_another_thread_ends_a_device_wait_within_a_millisecond() {
    let Some(g) = open() else { return };
    let f = g.kernel("checks.cuh", "lone_barrier");
    let (status, ended) = (g.word(), g.word());
    lone_barrier(&g, f, 5, 0, status, ended);
    let team = g.team;
    // Another thread aborts once the kernel is spinning; this one waits for the kernel.
    let aborter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        assert_eq!(mcast_team_abort(team), OK);
        t
    });
    g.driver.stream_synchronize(g.dev, g.streams[0]).unwrap();
    let done = Instant::now();
    let aborted = aborter.join().unwrap();
    let took = done.saturating_duration_since(aborted);
    assert_eq!(g.read_i32(status), 11, "MCAST_ERROR_ABORTED");
    assert!(took < Duration::from_micros(1500), "the wait ended {took:?} after the abort");
    g.close(true);
}

/// The fused all-reduce + residual add + RMSNorm (bf16, token-sharded) against a host
/// reference: h = bf16(rank-order f32 sum rounded to bf16 + residual) exactly, the output within
/// bf16 rounding; eager, then every 100th of 1000 graph replays from fresh inputs.
#[test]
fn gpu_fused_all_reduce_rmsnorm_eager_and_over_graph_replays() {
    use half::bf16;
    let Some(g) = open() else { return };
    let f = g.kernel("fused_rmsnorm.cuh", "fused_all_reduce_rmsnorm");
    let (tokens, hidden, eps) = (37u32, 4096u32, 1e-6f32);
    let elems = (tokens * hidden) as usize;
    let input = |r: usize, e: usize| bf16::from_f32((((e * 2654435761 + r * 40503) % 17) as f32 - 8.0) / 8.0);
    let resid = |e: usize| bf16::from_f32((((e * 11) % 13) as f32 - 6.0) / 4.0);
    let weight = |i: usize| bf16::from_f32(0.5 + (i % 5) as f32 / 4.0);
    let (x, xh) = g.buffer(elems * 2);
    let (res, rh) = g.buffer(elems * 2);
    let bytes = |v: Vec<bf16>| v.iter().flat_map(|b| b.to_bits().to_ne_bytes()).collect::<Vec<u8>>();
    let w = g.driver.mem_alloc(g.dev, hidden as usize * 2).unwrap();
    g.driver.memcpy_htod(g.dev, w, &bytes((0..hidden as usize).map(weight).collect())).unwrap();
    let status: Vec<DevicePtr> = (0..RANKS).map(|_| g.word()).collect();
    let fill = || {
        for r in 0..RANKS {
            let xi = bytes((0..elems).map(|e| input(r, e)).collect());
            let ri = bytes((0..elems).map(resid).collect());
            // SAFETY: valid pointers and lengths.
            unsafe {
                assert_eq!(mcast_buffer_write(x, r as i32, 0, xi.as_ptr().cast(), xi.len()), OK);
                assert_eq!(mcast_buffer_write(res, r as i32, 0, ri.as_ptr().cast(), ri.len()), OK);
            }
        }
    };
    let read = |b: mcast_buffer_t, r: usize| -> Vec<bf16> {
        let mut v = vec![0u8; elems * 2];
        // SAFETY: a valid pointer and length.
        assert_eq!(unsafe { mcast_buffer_read(b, r as i32, 0, v.as_mut_ptr().cast(), v.len()) }, OK);
        v.chunks(2).map(|c| bf16::from_bits(u16::from_ne_bytes([c[0], c[1]]))).collect()
    };
    let check = |what: &str| {
        for r in 0..RANKS {
            assert_eq!(g.read_i32(status[r]), 0, "{what}: rank {r} status");
            let (out, h) = (read(x, r), read(res, r));
            for t in 0..tokens as usize {
                let mut ss = 0f64;
                let mut hr = vec![0f32; hidden as usize];
                for k in 0..hidden as usize {
                    let e = t * hidden as usize + k;
                    let sum: f32 = (0..RANKS).map(|q| input(q, e).to_f32()).sum();
                    hr[k] = bf16::from_f32(bf16::from_f32(sum).to_f32() + resid(e).to_f32()).to_f32();
                    ss += f64::from(hr[k]) * f64::from(hr[k]);
                    assert_eq!(h[e].to_f32(), hr[k], "{what}: rank {r} token {t} h[{k}]");
                }
                let rstd = 1.0 / (ss / f64::from(hidden) + f64::from(eps)).sqrt();
                for k in 0..hidden as usize {
                    let want = f64::from(hr[k]) * rstd * f64::from(weight(k).to_f32());
                    let got = f64::from(out[t * hidden as usize + k].to_f32());
                    assert!(
                        (got - want).abs() <= 1e-2 * want.abs() + 1e-3,
                        "{what}: rank {r} token {t} out[{k}] {got} {want}"
                    );
                }
            }
        }
    };
    let grid = (tokens as usize).div_ceil(RANKS).min(32) as u32;
    let mut args: Vec<_> =
        (0..RANKS).map(|r| (g.handles[r], xh[r], rh[r], w, tokens, hidden, eps, status[r])).collect();
    let mut launch = |r: usize, stream: Stream| {
        let a = &mut args[r];
        let mut p: [*mut c_void; 8] = [
            (&mut a.0 as *mut mcast_dev_team_t).cast(),
            (&mut a.1 as *mut mcast_dev_buffer_t).cast(),
            (&mut a.2 as *mut mcast_dev_buffer_t).cast(),
            (&mut a.3 as *mut DevicePtr).cast(),
            (&mut a.4 as *mut u32).cast(),
            (&mut a.5 as *mut u32).cast(),
            (&mut a.6 as *mut f32).cast(),
            (&mut a.7 as *mut DevicePtr).cast(),
        ];
        g.launch(f, grid, hidden / 8 / 4, stream, &mut p);
    };
    fill();
    for r in 0..RANKS {
        launch(r, g.streams[r]);
    }
    g.sync();
    check("eager");
    let graphs = RankGraphs::capture(&g.driver, &[g.dev; RANKS], &mut launch);
    for round in 0..10 {
        fill();
        graphs.replay(&g.driver, 1);
        for &s in &graphs.streams {
            g.driver.stream_synchronize(g.dev, s).unwrap();
        }
        check(&format!("graph round {round}"));
        // 99 more replays on the previous outputs: barriers and slots used every time.
        graphs.replay(&g.driver, 99);
        for &s in &graphs.streams {
            g.driver.stream_synchronize(g.dev, s).unwrap();
        }
    }
    graphs.destroy(&g.driver);
    g.driver.mem_free(g.dev, w).unwrap();
    assert_eq!(mcast_buffer_free(x), OK);
    assert_eq!(mcast_buffer_free(res), OK);
    g.close(false);
}
