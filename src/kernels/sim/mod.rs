//! Host execution of the collectives on the simulator: the kernel
//! [`plan`](mod@crate::kernels::abi::plan) (same kernel choice and fallbacks as on a GPU), the
//! same barrier protocol over the same sync-region words, and the same algorithms, run on the
//! simulated device's worker thread for the caller's stream: each collective's in a file of its
//! own, as in `kernels/` (`all_reduce.rs`, `reduce_scatter.rs`, `broadcast.rs`, `all_gather.rs`),
//! the LL protocol in `ll.rs`; the barrier and copy-out kernels here.
//! Multicast addresses are read and written through the simulator's translation, so the
//! MULTICAST path runs end to end without a GPU.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use half::{bf16, f16};

use super::abi::{
    plan, state_error, state_timeout, KernelId, KernelKind, Variant, BAR_SIG_MAX_RANKS, BAR_SIG_OFFSET,
    DOORBELL_OFFSET, EPOCH_OFFSET, ERROR_INFO_OFFSET, ERROR_WORD_OFFSET, ERR_NONE, ERR_TIMEOUT, MISSING_OFFSET,
    PUSH_MAX_RANKS, PUSH_SEQ_OFFSET, PUSH_SIG_OFFSET, SIGNAL_OFFSET, SIG_OFFSET, STATE_OFFSET, STATE_OK,
};
use super::select::Unit;
use super::{Collective, DType, KernelError, Launch, RedOp};
use crate::driver::sim::SimDriver;
use crate::driver::Device;

mod all_gather;
mod all_reduce;
mod broadcast;
mod ll;
mod mem;
mod push;
mod reduce_scatter;
mod sync;

use push::PushForm;
use sync::SigAt;

use mem::{copy, load, max, min, to_bytes};

/// Addresses of the same bytes in several ranks' memory.
#[derive(Clone)]
struct Targets(Vec<*mut u8>);

// SAFETY: the pointers address simulated device memory shared by the worker threads; every
// access is ordered by the barrier protocol, as on a GPU.
unsafe impl Send for Targets {}
// SAFETY: as for `Send`: a captured job (a CUDA-graph node) is shared by its replays, which run
// one after another on the stream's worker; the pointers are only read.
unsafe impl Sync for Targets {}

/// Who a wait waits for: which ranks did not arrive when it times out.
#[derive(Clone, Copy)]
enum Awaited {
    /// Every rank (a barrier): those whose barrier count is behind this rank's.
    Barrier,
    /// One rank (an LL line it stores).
    Rank(usize),
}

/// Everything one rank's job needs, captured at launch.
struct Job {
    kind: KernelKind,
    red: Option<(DType, RedOp)>,
    collective: Collective,
    rank: usize,
    nranks: usize,
    count: usize,
    /// Blocks of the kernel plan (the push kernels lay their scratch out by block).
    blocks: usize,
    /// The push kernels' bytes per block and step.
    push_row: usize,
    /// An all-gather's bytes from one block of out to the next ([`Launch::out_stride`]; 0:
    /// `count`).
    out_stride: usize,
    timeout: Option<Duration>,
    /// Each rank's data as mapped on this device.
    data: Targets,
    /// Where each rank's results go (the layout of `data`; in place, `data` itself).
    out: Targets,
    /// Each rank's sync region as mapped on this device.
    sync: Targets,
    /// The bound copies behind the multicast data address (multicast kernels that reduce).
    mc_data: Option<Targets>,
    /// The bound copies behind the multicast out address (multicast kernels that store).
    mc_out: Option<Targets>,
    /// Each rank's barrier counter behind the multicast sync address (multicast kernels).
    mc_signal: Option<Targets>,
    /// The call's signature, compared with every peer's at the entry ([`Launch::signature`]).
    sig: Option<[u64; 2]>,
}

/// Enqueues rank `l.rank`'s part of a collective on the simulated device's worker for
/// `l.stream`. Returns once enqueued; errors found while running (a timeout) land in the rank's
/// device error word, as on a GPU.
pub fn launch(sim: &SimDriver, l: &Launch) -> Result<(), KernelError> {
    let Some(p) = plan(l).map_err(KernelError::Unsupported)? else { return Ok(()) };
    // From here on the simulated GPU's own work: its job and queue (on CUDA, cuLaunchKernel).
    let _device = crate::driver::sim::DeviceWork::enter();
    load_module(sim, l.dev, super::cuda::variant_for(l), Unit::of(p.kernel, l.ll))?;
    if let Some(why) = p.fallback {
        tracing::debug!("multicast request runs the P2P kernel: {why}");
    }
    let span = span_bytes(l);
    let is_mc = matches!(
        p.kernel.kind,
        KernelKind::AllReduceMc | KernelKind::ReduceScatterMc | KernelKind::BroadcastMc | KernelKind::AllGatherMc
    );
    let reads_mc = matches!(p.kernel.kind, KernelKind::AllReduceMc | KernelKind::ReduceScatterMc);
    let writes_mc =
        matches!(p.kernel.kind, KernelKind::AllReduceMc | KernelKind::BroadcastMc | KernelKind::AllGatherMc);
    let out: &[u64] = if l.out.is_empty() { &l.data } else { &l.out };
    let (mc_data, mc_out, mc_signal) = match (is_mc, l.data_mc, l.sync_mc) {
        (false, _, _) => (None, None, None),
        (true, Some(data_mc), Some(sync_mc)) => {
            let translate = |addr: u64, len: usize, what: &str| -> Result<Targets, KernelError> {
                sim.multicast_targets(addr, len).map(Targets).ok_or_else(|| {
                    KernelError::Unsupported(format!("{what} at {addr:#x} is not a bound multicast range"))
                })
            };
            let out_mc = l.out_mc.unwrap_or(data_mc);
            (
                if reads_mc { Some(translate(data_mc, span, "the data")?) } else { None },
                if writes_mc { Some(translate(out_mc, out_span(l), "the output")?) } else { None },
                Some(translate(sync_mc + SIGNAL_OFFSET as u64, 4, "the barrier counter")?),
            )
        }
        // Emulated multimem (no multicast object): every rank's copy through its peer mapping.
        (true, _, _) => (
            Some(Targets(l.data.iter().map(|&a| a as *mut u8).collect())),
            Some(Targets(out.iter().map(|&a| a as *mut u8).collect())),
            Some(Targets(l.sync.iter().map(|&a| (a + SIGNAL_OFFSET as u64) as *mut u8).collect())),
        ),
    };
    let job = Job {
        kind: p.kernel.kind,
        red: p.kernel.red,
        collective: l.collective,
        rank: l.rank as usize,
        nranks: l.nranks as usize,
        count: l.count as usize,
        blocks: p.blocks as usize,
        push_row: p.push_row as usize,
        out_stride: l.out_stride as usize,
        timeout: (l.timeout_ns != 0).then(|| Duration::from_nanos(l.timeout_ns)),
        data: Targets(l.data.iter().map(|&a| a as *mut u8).collect()),
        out: Targets(out.iter().map(|&a| a as *mut u8).collect()),
        sync: Targets(l.sync.iter().map(|&a| a as *mut u8).collect()),
        mc_data,
        mc_out,
        mc_signal,
        sig: l.signature,
    };
    // `run` takes `&self`: a launch captured in a CUDA graph replays the same job.
    sim.enqueue(l.dev, l.stream, move || job.run()).map_err(KernelError::Driver)
}

/// The simulated load of the module of `unit` built as `variant` on `dev`, as the CUDA path
/// loads it at a kind's first call: the first time it waits for every job queued on the
/// device ([`SimDriver::load_kernel_module`]).
/// The load runs with the calling thread in relaxed capture mode, as on CUDA ([`super::cuda::load`]).
pub fn load_module(sim: &SimDriver, dev: Device, variant: Variant, unit: Unit) -> Result<(), KernelError> {
    let _relaxed = crate::driver::RelaxedCapture::enter(sim);
    sim.load_kernel_module(dev, super::cuda::slot(variant, unit) as u64).map_err(KernelError::Driver)
}

/// Enqueues rank `l.rank`'s barrier kernel (`mcast_barrier_p2p`: one barrier across the team,
/// the same protocol and sync words as the collectives' barriers) on `l.stream`. Only `rank`,
/// `nranks`, `dev`, `stream`, `sync` and `timeout_ns` of `l` are used (`data` must hold `nranks`
/// addresses, any).
pub fn launch_barrier(sim: &SimDriver, l: &Launch) -> Result<(), KernelError> {
    launch_fixed(sim, l, KernelKind::BarrierP2p)
}

/// Enqueues rank `l.rank`'s copy-out kernel (`mcast_copy_out`) on `l.stream`: for every rank
/// slot k with `l.data[k] != 0`, `l.count` bytes from `l.data[k]` to `l.out[k]`, unless this
/// rank's error word is set (a collective before it failed); as `kernels/all_gather/service.cu`.
pub fn launch_copy_out(sim: &SimDriver, l: &Launch) -> Result<(), KernelError> {
    launch_fixed(sim, l, KernelKind::CopyOut)
}

/// Enqueues `kind`, a kernel of the all-gather module without a (dtype, operator), with the
/// arguments of `l`.
fn launch_fixed(sim: &SimDriver, l: &Launch, kind: KernelKind) -> Result<(), KernelError> {
    super::check_fixed(l, kind)?;
    let _device = crate::driver::sim::DeviceWork::enter();
    load_module(sim, l.dev, Variant::Emulated, Unit::of(KernelId { kind, red: None }, l.ll))?;
    let out: &[u64] = if l.out.is_empty() { &l.data } else { &l.out };
    let job = Job {
        kind,
        red: None,
        collective: l.collective,
        rank: l.rank as usize,
        nranks: l.nranks as usize,
        count: l.count as usize,
        blocks: 1,
        push_row: 0,
        out_stride: 0,
        timeout: (l.timeout_ns != 0).then(|| Duration::from_nanos(l.timeout_ns)),
        data: Targets(l.data.iter().map(|&a| a as *mut u8).collect()),
        out: Targets(out.iter().map(|&a| a as *mut u8).collect()),
        sync: Targets(l.sync.iter().map(|&a| a as *mut u8).collect()),
        mc_data: None,
        mc_out: None,
        mc_signal: None,
        sig: l.signature,
    };
    sim.enqueue(l.dev, l.stream, move || job.run()).map_err(KernelError::Driver)
}

/// Bytes of the symmetric range a collective touches, from `data[r]`.
fn span_bytes(l: &Launch) -> usize {
    let n = l.nranks as usize;
    let count = l.count as usize;
    match l.collective {
        Collective::Broadcast { .. } => count,
        Collective::AllGather => n * count,
        Collective::AllReduce { dtype, .. } => count * dtype.size(),
        Collective::ReduceScatter { dtype, .. } => n * count * dtype.size(),
    }
}

/// Bytes of the output range a multicast kernel stores to, from `out_mc` (or `data_mc`).
fn out_span(l: &Launch) -> usize {
    match l.collective {
        Collective::ReduceScatter { dtype, .. } => l.nranks as usize * l.count as usize * dtype.size(),
        _ => span_bytes(l),
    }
}

fn dword(base: *mut u8, offset: usize) -> &'static AtomicU64 {
    // SAFETY: `base` is a rank's sync region (8-byte aligned, mapped for the team's lifetime);
    // `offset` is a multiple of 8 within it; the words are only accessed atomically.
    unsafe { &*(base.add(offset) as *const AtomicU64) }
}

/// Where rank p keeps per-writer rows (landing rows, signature lines, push scratch rows), the
/// ranks other than p in rank order: `writer`'s index among them (kernels/sync.cuh, writer_row).
fn writer_row(p: usize, writer: usize) -> usize {
    if writer < p {
        writer
    } else {
        writer - 1
    }
}

fn word(base: *mut u8, offset: usize) -> &'static AtomicU32 {
    // SAFETY: `base` is a rank's sync region (at least SYNC_BYTES, 4-byte aligned, mapped for the
    // team's lifetime); the words are only accessed atomically.
    unsafe { &*(base.add(offset) as *const AtomicU32) }
}

/// Rings the doorbell whose address rank `me`'s sync region holds (none: nothing), after the
/// error recorded before it, as `mcast_dev__ring` does (include/mcast/device.h).
fn ring(me: *mut u8) {
    let bell = dword(me, DOORBELL_OFFSET).load(Ordering::Acquire);
    if bell != 0 {
        // SAFETY: the host wrote the address of a live, 4-byte aligned doorbell word (mapped host
        // memory the team's context keeps until the team is released); only accessed atomically.
        unsafe { &*(bell as *const AtomicU32) }.store(1, Ordering::SeqCst);
    }
}

impl Job {
    fn run(&self) {
        let me = self.sync.0[self.rank];
        if word(me, ERROR_WORD_OFFSET).load(Ordering::Acquire) != ERR_NONE {
            return;
        }
        if self.kind == KernelKind::CopyOut {
            // No wait and no peer: the error word alone decides, as in the kernel.
            for (&src, &dst) in self.data.0.iter().zip(&self.out.0).filter(|(s, _)| !s.is_null()) {
                copy(src, dst, 0, self.count);
            }
            return;
        }
        let state = word(me, STATE_OFFSET).load(Ordering::Acquire);
        if state != STATE_OK {
            self.fail(state_error(state), 0);
            return;
        }
        let n = self.nranks;
        // Where the signatures of the entry barrier land (kernels/sync.cuh, kernels/push.cuh): the
        // push kernels' as lines beside their first step (block slot 0 here), flagged with their
        // first sequence number; the barrier kernels' as lines flagged with the barrier's epoch,
        // or per writer in teams past BAR_SIG_MAX_RANKS.
        let sig_at = match self.kind {
            KernelKind::AllReduceP2pPush | KernelKind::AllReduceP2pTwoShotPush | KernelKind::ReduceScatterP2pPush => {
                let y0 = word(me, PUSH_SEQ_OFFSET).load(Ordering::Relaxed).wrapping_add(1);
                let at = PUSH_SIG_OFFSET + 32 * (y0 as usize & 1) * (PUSH_MAX_RANKS as usize - 1);
                SigAt::Lines { at, flag: Some(y0) }
            }
            _ if n <= BAR_SIG_MAX_RANKS as usize => SigAt::Lines { at: BAR_SIG_OFFSET, flag: None },
            _ => SigAt::Words(SIG_OFFSET),
        };
        let mut barrier = 0u32;
        let mut sync = || -> bool {
            barrier += 1;
            self.barrier(barrier, (barrier == 1).then_some(sig_at))
        };
        match self.kind {
            KernelKind::AllReduceP2p => self.all_reduce_one_shot(&mut sync),
            KernelKind::AllReduceP2pPush => self.push(PushForm::All, &mut sync),
            KernelKind::AllReduceP2pTwoShot => self.all_reduce_two_shot(&mut sync),
            KernelKind::AllReduceP2pTwoShotPush => self.push(PushForm::TwoShot, &mut sync),
            KernelKind::AllReduceMc => self.all_reduce_multicast(&mut sync),
            KernelKind::ReduceScatterP2p => self.reduce_scatter_p2p(&mut sync),
            KernelKind::ReduceScatterP2pPush => self.push(PushForm::ReduceScatter, &mut sync),
            KernelKind::ReduceScatterMc => self.reduce_scatter_multicast(&mut sync),
            KernelKind::BroadcastP2p => self.broadcast_pull(&mut sync),
            KernelKind::BroadcastP2pScatter => self.broadcast_scatter(&mut sync),
            KernelKind::BroadcastMc => self.broadcast_multicast(&mut sync),
            KernelKind::AllGatherP2p => self.all_gather_pull(&mut sync),
            KernelKind::AllGatherP2pPush => self.all_gather_push(&mut sync),
            KernelKind::AllGatherMc => self.all_gather_multicast(&mut sync),
            KernelKind::AllReduceLl
            | KernelKind::ReduceScatterLl
            | KernelKind::AllGatherLl
            | KernelKind::BroadcastLl => self.ll(),
            KernelKind::BarrierP2p => {
                sync();
            }
            KernelKind::CopyOut => unreachable!("run before the state word is read"),
        }
    }

    /// The multicast copy kernels (broadcast, all-gather): after the entry barrier, rank `root`
    /// stores `count` bytes at `offset` of its data through the multicast out address into every
    /// rank's copy; the others take part in the barriers only.
    fn multicast_store(&self, sync: &mut dyn FnMut() -> bool, offset: usize, root: usize) {
        let (r, data) = (self.rank, &self.data.0);
        let mc = &self.mc_out.as_ref().expect("multicast targets").0;
        if !sync() {
            return;
        }
        if root == r {
            for &t in mc {
                copy(data[r], t, offset, self.count);
            }
        }
        sync();
    }

    /// Spins (then yields, then sleeps) until `done`; false once the team failed (the state
    /// word: aborted, a rank timed out) or the timeout passes (then [`Job::time_out`]), recorded
    /// in this rank's error word with `index`, as a kernel's wait does.
    fn wait_until(&self, index: u32, awaited: Awaited, done: impl Fn() -> bool) -> bool {
        if done() {
            return true;
        }
        let me = self.sync.0[self.rank];
        let start = Instant::now();
        let mut spins = 0u32;
        let state = word(me, STATE_OFFSET);
        while !done() {
            // The team's state word: an abort or a rank's timeout ends the wait, as on a GPU.
            let s = state.load(Ordering::Acquire);
            if s != STATE_OK {
                self.fail(state_error(s), index);
                return false;
            }
            if self.timeout.is_some_and(|t| start.elapsed() >= t) {
                self.time_out(index, awaited);
                return false;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else if spins < 1024 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        true
    }

    /// This rank's wait `index` timed out (`record_timeout` in `kernels/sync.cuh`): records the
    /// timeout and the ranks that did not arrive, then writes "this rank timed out" into every
    /// rank's state word (its own first; a failure already there stays), so their waits end at
    /// once instead of each waiting out its own timeout.
    fn time_out(&self, index: u32, awaited: Awaited) {
        self.fail(ERR_TIMEOUT, index);
        let me = self.sync.0[self.rank];
        let mine = word(me, EPOCH_OFFSET).load(Ordering::Relaxed);
        for (q, &s) in self.sync.0.iter().enumerate() {
            let missing = match awaited {
                Awaited::Rank(p) => q == p,
                Awaited::Barrier => (word(s, EPOCH_OFFSET).load(Ordering::Relaxed).wrapping_sub(mine) as i32) < 0,
            };
            if missing {
                word(me, MISSING_OFFSET + 4 * (q / 32)).fetch_or(1 << (q % 32), Ordering::Release);
            }
        }
        let told = state_timeout(self.rank as u32);
        let tell =
            |s: *mut u8| word(s, STATE_OFFSET).compare_exchange(STATE_OK, told, Ordering::AcqRel, Ordering::Acquire);
        if tell(me).is_ok() {
            for (q, &s) in self.sync.0.iter().enumerate() {
                if q != self.rank {
                    let _ = tell(s);
                }
            }
        }
    }

    /// Records `code` in this rank's error word unless an earlier error is there (barrier
    /// `index` of the collective, 0 before the first).
    fn fail(&self, code: u32, index: u32) {
        let me = self.sync.0[self.rank];
        if word(me, ERROR_WORD_OFFSET).compare_exchange(ERR_NONE, code, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            word(me, ERROR_INFO_OFFSET).store(1 | (index << 8), Ordering::Release);
            ring(me);
        }
    }

    /// The reduction of elements `[first, first + n)` over every address in `srcs`, in order.
    fn reduce(&self, srcs: &[*mut u8], first: usize, n: usize) -> Vec<u8> {
        let (dtype, op) = self.red.expect("a reducing kernel");
        let mut out = vec![0u8; n * dtype.size()];
        macro_rules! fold {
            ($t:ty, $acc:ty, $to:expr, $from:expr, $sum:expr) => {{
                const W: usize = std::mem::size_of::<$t>();
                for i in 0..n {
                    let at = (first + i) * W;
                    let mut acc: $acc = $to(load::<$t>(srcs[0], at));
                    for &s in &srcs[1..] {
                        let x: $acc = $to(load::<$t>(s, at));
                        acc = match op {
                            RedOp::Sum => $sum(acc, x),
                            RedOp::Min => min(acc, x),
                            RedOp::Max => max(acc, x),
                        };
                    }
                    let v: $t = $from(acc);
                    out[i * W..(i + 1) * W].copy_from_slice(&to_bytes(v));
                }
            }};
        }
        match dtype {
            DType::F32 => fold!(f32, f32, |x| x, |x| x, |a, b| a + b),
            DType::F64 => fold!(f64, f64, |x| x, |x| x, |a, b| a + b),
            DType::F16 => fold!(u16, f32, |x| f16::from_bits(x).to_f32(), |x| f16::from_f32(x).to_bits(), |a, b| a + b),
            DType::BF16 => {
                fold!(u16, f32, |x| bf16::from_bits(x).to_f32(), |x| bf16::from_f32(x).to_bits(), |a, b| a + b)
            }
            DType::I32 => fold!(i32, i32, |x| x, |x| x, i32::wrapping_add),
            DType::U32 => fold!(u32, u32, |x| x, |x| x, u32::wrapping_add),
            DType::I64 => fold!(i64, i64, |x| x, |x| x, i64::wrapping_add),
            DType::U64 => fold!(u64, u64, |x| x, |x| x, u64::wrapping_add),
        }
        out
    }
}
