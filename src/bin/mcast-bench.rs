//! `mcast-bench`: collective bandwidth in the spirit of nccl-tests.
//!
//! One process drives every rank of one team: one stream per rank, one symmetric buffer sized for
//! the largest message. Per message size it checks the result against a host reference (unless
//! `--check 0`), runs `--warmup` untimed iterations, then times `--iters` iterations with events
//! recorded on every rank's stream around the loop; the time is the slowest rank's elapsed time
//! divided by the iterations. algbw = bytes / time; busbw = algbw * NCCL's factor for the op.
//! With `-G N` (as nccl-tests' `-G`), each rank's `--iters` iterations are captured in a CUDA
//! graph, replayed N times between the events, and the time is divided by iters x N.
//! With no GPU it runs on the simulator with small default sizes.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use half::{bf16, f16};
use mcast::driver::{Device, Driver, Event, Graph, GraphExec, Stream};
use mcast::kernels::{Collective, DType, RedOp, MAX_RANKS};
use mcast::runtime::buffer::Buffer;
use mcast::runtime::collective::{run, run_into, run_ptr, synchronize};
use mcast::runtime::config::{parse_bytes, Backend, Config, MulticastMode};
use mcast::runtime::context::Context;
use mcast::runtime::team::{Team, Transport};

const HELP: &str = "\
usage: mcast-bench [options]

Times mcast collectives over a range of message sizes, nccl-tests style. One process drives every
rank. Without a GPU it runs on the simulator (small default sizes, so it finishes in seconds).

options (`--flag value` or `--flag=value`):
  --op OP            all_reduce (default), broadcast, reduce_scatter, all_gather
  -d, --dtype T      f32 (default), f64, f16, bf16, i32, u32, i64, u64
                     (nccl names too: float, double, half, bfloat16, int32, uint32, int64, uint64)
  -o, --redop OP     sum (default), min, max (all_reduce and reduce_scatter)
  -r, --root R       broadcast root rank (default 0)
  -b, --minbytes N   smallest message size in bytes; suffixes K, M, G (default 8K on CUDA, 1K on sim)
  -e, --maxbytes N   largest message size (default 1G on CUDA, 1M on sim)
  -f, --stepfactor F multiply the size by F each step, F >= 2 (default 2 on CUDA, 4 on sim)
  -n, --iters N      timed iterations per size, >= 1 (default 20 on CUDA, 5 on sim)
  -w, --warmup N     untimed iterations per size before timing (default 5 on CUDA, 1 on sim)
  -G, --graph N      CUDA-graph mode, as nccl-tests' -G: each rank's --iters iterations are
                     captured in a CUDA graph (one per rank's stream), which is replayed N
                     times between the timing events; time = elapsed / (iters x N). 0: eager
                     launches (default)
  -c, --check 0|1    check every rank against a host reference before timing (default 1);
                     the #wrong column counts wrong elements, and any makes the exit status 1
  --devices LIST     comma-separated device ordinals, one rank each, e.g. 0,1; a device may repeat
                     (0,0: two ranks on one GPU, P2P). Default: every device of the context
  --backend B        auto (default, or MCAST_BACKEND), cuda, sim
  --memory M         where the data lives: buffer (default: mcast_buffer_alloc buffers, the
                     mcast_<op> calls), registered (mcast_mem_alloc memory registered with
                     mcast_buffer_register, the same calls), pointer (plain device memory, cuMemAlloc
                     like cudaMalloc, the mcast_team_<op> calls)
  --inplace 0|1      1 (default): in place (NCCL's in-place layout); 0: out of place, send and recv
                     apart (the _into calls; pointer: send != recv), like nccl-tests' out-of-place
                     columns
  --csv FILE         also write the rows as CSV to FILE
  --json FILE        also write the run and its rows as JSON to FILE
  -q, --quiet        no progress lines on stderr
  -h, --help         this text

Sizes are nccl-tests' message sizes: for all_gather and reduce_scatter the TOTAL size over all
ranks (each rank's block is size/N); counts are rounded down to whole elements (at least one per
rank). The count column is elements per rank block. algbw = size / time; busbw = algbw * factor,
factor = 2(N-1)/N for all_reduce, (N-1)/N for reduce_scatter and all_gather, 1 for broadcast.

Multicast use follows MCAST_MULTICAST (auto, off, require) and the NVLS kill switches; the header
shows the team's transport and why. Other MCAST_* variables (MCAST_SIM_DEVICES, MCAST_TIMEOUT_MS,
...) configure the context as for any mcast program.

exit status: 0 success; 1 wrong results, a runtime error or leaked resources; 2 bad usage.";

/// Elements per period of the check data. Prime and odd, so it never divides a power-of-two
/// count and a block shifted by whole blocks is seen.
const PERIOD: usize = 1021;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    AllReduce,
    Broadcast,
    ReduceScatter,
    AllGather,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::Broadcast => "broadcast",
            Op::ReduceScatter => "reduce_scatter",
            Op::AllGather => "all_gather",
        }
    }

    fn reduces(self) -> bool {
        matches!(self, Op::AllReduce | Op::ReduceScatter)
    }

    /// Blocks of `count` elements in the buffer: one per rank for the scattered/gathered ops.
    fn blocks(self, nranks: usize) -> usize {
        match self {
            Op::ReduceScatter | Op::AllGather => nranks,
            Op::AllReduce | Op::Broadcast => 1,
        }
    }

    /// NCCL's bus bandwidth factor.
    fn bus_factor(self, nranks: usize) -> f64 {
        let n = nranks as f64;
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            Op::ReduceScatter | Op::AllGather => (n - 1.0) / n,
            Op::Broadcast => 1.0,
        }
    }
}

/// The command line.
#[derive(Debug)]
struct Options {
    op: Op,
    dtype: DType,
    redop: RedOp,
    root: u32,
    min_bytes: Option<u64>,
    max_bytes: Option<u64>,
    factor: Option<u64>,
    iters: Option<u32>,
    warmup: Option<u32>,
    /// Graph replays per size (`-G`); 0: eager.
    graph: u32,
    check: bool,
    devices: Option<Vec<i32>>,
    backend: Option<Backend>,
    csv: Option<PathBuf>,
    json: Option<PathBuf>,
    quiet: bool,
    memory: Memory,
    inplace: bool,
}

/// Where the benchmark's data lives (`--memory`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Memory {
    /// `mcast_buffer_alloc` buffers.
    Buffer,
    /// `mcast_mem_alloc` memory registered with `mcast_buffer_register`.
    Registered,
    /// Plain device memory (`cuMemAlloc`), the pointer-form calls.
    Pointer,
}

impl Memory {
    fn name(self) -> &'static str {
        match self {
            Memory::Buffer => "buffer",
            Memory::Registered => "registered",
            Memory::Pointer => "pointer",
        }
    }
}

/// Why the run stopped: bad usage (exit 2) or a runtime failure (exit 1).
enum Failure {
    Usage(String),
    Runtime(String),
}

fn usage(msg: impl Into<String>) -> Failure {
    Failure::Usage(msg.into())
}

fn runtime(msg: impl Into<String>) -> Failure {
    Failure::Runtime(msg.into())
}

fn parse_dtype(v: &str) -> Option<DType> {
    Some(match v.to_ascii_lowercase().as_str() {
        "f32" | "float" | "float32" => DType::F32,
        "f64" | "double" | "float64" => DType::F64,
        "f16" | "half" | "float16" => DType::F16,
        "bf16" | "bfloat16" => DType::BF16,
        "i32" | "int" | "int32" => DType::I32,
        "u32" | "uint32" => DType::U32,
        "i64" | "int64" => DType::I64,
        "u64" | "uint64" => DType::U64,
        _ => return None,
    })
}

fn parse_num<T: std::str::FromStr>(flag: &str, v: &str, what: &str) -> Result<T, Failure> {
    v.trim().parse::<T>().map_err(|_| usage(format!("{flag} {v:?}: expected {what}")))
}

fn parse_size(flag: &str, v: &str) -> Result<u64, Failure> {
    match parse_bytes(v) {
        Some(n) if n > 0 => Ok(n),
        _ => Err(usage(format!("{flag} {v:?}: expected a positive byte count such as 4096, 8K, 64M or 1G"))),
    }
}

/// Parses the arguments; `Ok(None)` means help was printed.
fn parse_args(args: &[String]) -> Result<Option<Options>, Failure> {
    let mut o = Options {
        op: Op::AllReduce,
        dtype: DType::F32,
        redop: RedOp::Sum,
        root: 0,
        min_bytes: None,
        max_bytes: None,
        factor: None,
        iters: None,
        warmup: None,
        graph: 0,
        check: true,
        devices: None,
        backend: None,
        csv: None,
        json: None,
        quiet: false,
        memory: Memory::Buffer,
        inplace: true,
    };
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        i += 1;
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with('-') => (f, Some(v.to_string())),
            _ => (arg, None),
        };
        match flag {
            "-h" | "--help" => {
                println!("{HELP}");
                return Ok(None);
            }
            "-q" | "--quiet" => {
                if inline.is_some() {
                    return Err(usage(format!("{flag} takes no value")));
                }
                o.quiet = true;
                continue;
            }
            _ => {}
        }
        let known = [
            "--op",
            "-d",
            "--dtype",
            "-o",
            "--redop",
            "-r",
            "--root",
            "-b",
            "--minbytes",
            "-e",
            "--maxbytes",
            "-f",
            "--stepfactor",
            "-n",
            "--iters",
            "-w",
            "--warmup",
            "-G",
            "--graph",
            "-c",
            "--check",
            "--devices",
            "--backend",
            "--csv",
            "--json",
            "--memory",
            "--inplace",
        ];
        if !known.contains(&flag) {
            return Err(usage(format!("unknown option {arg:?}")));
        }
        let v = match inline {
            Some(v) => v,
            None => {
                let Some(v) = args.get(i) else { return Err(usage(format!("{flag} needs a value"))) };
                i += 1;
                v.clone()
            }
        };
        match flag {
            "--op" => {
                o.op = match v.to_ascii_lowercase().replace('-', "_").as_str() {
                    "all_reduce" | "allreduce" => Op::AllReduce,
                    "broadcast" => Op::Broadcast,
                    "reduce_scatter" | "reducescatter" => Op::ReduceScatter,
                    "all_gather" | "allgather" => Op::AllGather,
                    _ => {
                        return Err(usage(format!(
                            "--op {v:?}: expected all_reduce, broadcast, reduce_scatter or all_gather"
                        )))
                    }
                }
            }
            "-d" | "--dtype" => {
                o.dtype = parse_dtype(&v)
                    .ok_or_else(|| usage(format!("{flag} {v:?}: expected f32, f64, f16, bf16, i32, u32, i64 or u64")))?
            }
            "-o" | "--redop" => {
                o.redop = match v.to_ascii_lowercase().as_str() {
                    "sum" => RedOp::Sum,
                    "min" => RedOp::Min,
                    "max" => RedOp::Max,
                    _ => return Err(usage(format!("{flag} {v:?}: expected sum, min or max"))),
                }
            }
            "-r" | "--root" => o.root = parse_num(flag, &v, "a rank (0, 1, ...)")?,
            "-b" | "--minbytes" => o.min_bytes = Some(parse_size(flag, &v)?),
            "-e" | "--maxbytes" => o.max_bytes = Some(parse_size(flag, &v)?),
            "-f" | "--stepfactor" => {
                let f: u64 = parse_num(flag, &v, "an integer >= 2")?;
                if f < 2 {
                    return Err(usage(format!("{flag} {v:?}: the step factor must be at least 2")));
                }
                o.factor = Some(f);
            }
            "-n" | "--iters" => {
                let n: u32 = parse_num(flag, &v, "an integer >= 1")?;
                if n == 0 {
                    return Err(usage(format!("{flag} {v:?}: at least one timed iteration is needed")));
                }
                o.iters = Some(n);
            }
            "-w" | "--warmup" => o.warmup = Some(parse_num(flag, &v, "an integer >= 0")?),
            "-G" | "--graph" => o.graph = parse_num(flag, &v, "a number of graph replays >= 0 (0: eager)")?,
            "-c" | "--check" => {
                o.check = match v.trim() {
                    "1" => true,
                    "0" => false,
                    _ => return Err(usage(format!("{flag} {v:?}: expected 0 or 1"))),
                }
            }
            "--devices" => {
                let list = v
                    .split(',')
                    .map(|d| d.trim().parse::<i32>().ok().filter(|d| *d >= 0))
                    .collect::<Option<Vec<_>>>()
                    .filter(|l| !l.is_empty())
                    .ok_or_else(|| usage(format!("--devices {v:?}: expected device ordinals like 0,1 or 0,0")))?;
                if list.len() > MAX_RANKS {
                    return Err(usage(format!("--devices {v:?}: at most {MAX_RANKS} ranks")));
                }
                o.devices = Some(list);
            }
            "--backend" => {
                o.backend = Some(match v.to_ascii_lowercase().as_str() {
                    "auto" => Backend::Auto,
                    "cuda" => Backend::Cuda,
                    "sim" => Backend::Sim,
                    _ => return Err(usage(format!("--backend {v:?}: expected auto, cuda or sim"))),
                })
            }
            "--memory" => {
                o.memory = match v.as_str() {
                    "buffer" => Memory::Buffer,
                    "registered" => Memory::Registered,
                    "pointer" => Memory::Pointer,
                    _ => return Err(usage(format!("--memory {v:?}: expected buffer, registered or pointer"))),
                }
            }
            "--inplace" => {
                o.inplace = match v.as_str() {
                    "1" => true,
                    "0" => false,
                    _ => return Err(usage(format!("--inplace {v:?}: expected 0 or 1"))),
                }
            }
            "--csv" => o.csv = Some(PathBuf::from(v)),
            "--json" => o.json = Some(PathBuf::from(v)),
            _ => unreachable!("every known flag is handled"),
        }
    }
    if let (Some(b), Some(e)) = (o.min_bytes, o.max_bytes) {
        if b > e {
            return Err(usage(format!("-b {b} is larger than -e {e}")));
        }
    }
    Ok(Some(o))
}

/// One line of results.
struct Row {
    size: usize,
    count: usize,
    time_us: f64,
    algbw: f64,
    busbw: f64,
    wrong: Option<u64>,
}

/// What the header, CSV and JSON say about the run.
struct RunInfo {
    op: Op,
    dtype: DType,
    redop: Option<RedOp>,
    root: i64,
    backend: &'static str,
    transport: &'static str,
    transport_reason: String,
    devices: Vec<Device>,
    device_name: String,
    date: String,
    iters: u32,
    warmup: u32,
    /// Graph replays per size; 0: eager.
    graph: u32,
    check: bool,
}

impl RunInfo {
    /// `"eager"` or `"graph"`.
    fn mode(&self) -> &'static str {
        if self.graph == 0 {
            "eager"
        } else {
            "graph"
        }
    }
}

/// Half-width of the check values for a team of `nranks`: 8 up to 32 ranks, smaller above, so
/// that a sum over every rank stays within 256, bf16's exact integer range.
fn amplitude(nranks: usize) -> i64 {
    (256 / nranks.max(1) as i64).clamp(1, 8)
}

/// Small integers in [-a, a] ([0, 2a] unsigned), a = [`amplitude`]: exact in every dtype, and
/// their sums over the team are exact too (|sum| <= nranks * a <= 256). Ranks 1..=2a (all of
/// them up to 16 ranks) differ from rank 0 at every index.
fn value(d: DType, nranks: usize, rank: usize, j: usize) -> i64 {
    let a = amplitude(nranks);
    let v = ((j * 7 + rank) % (2 * a as usize + 1)) as i64;
    if matches!(d, DType::U32 | DType::U64) {
        v
    } else {
        v - a
    }
}

fn encode(d: DType, v: i64, out: &mut Vec<u8>) {
    match d {
        DType::F32 => out.extend((v as f32).to_ne_bytes()),
        DType::F64 => out.extend((v as f64).to_ne_bytes()),
        DType::F16 => out.extend(f16::from_f64(v as f64).to_bits().to_ne_bytes()),
        DType::BF16 => out.extend(bf16::from_f64(v as f64).to_bits().to_ne_bytes()),
        DType::I32 => out.extend((v as i32).to_ne_bytes()),
        DType::U32 => out.extend((v as u32).to_ne_bytes()),
        DType::I64 => out.extend(v.to_ne_bytes()),
        DType::U64 => out.extend((v as u64).to_ne_bytes()),
    }
}

/// `PERIOD` encoded elements: element `i` of a range is `table[i % PERIOD]`.
fn table(d: DType, f: impl Fn(usize) -> i64) -> Vec<u8> {
    let mut t = Vec::with_capacity(PERIOD * d.size());
    for j in 0..PERIOD {
        encode(d, f(j), &mut t);
    }
    t
}

/// Fills `dst` with the elements `first..` of the periodic `table`.
fn fill(dst: &mut [u8], first: usize, table: &[u8], es: usize) {
    let (mut i, mut pos) = (first, 0);
    while pos < dst.len() {
        let phase = i % PERIOD;
        let n = (PERIOD - phase).min((dst.len() - pos) / es);
        dst[pos..pos + n * es].copy_from_slice(&table[phase * es..(phase + n) * es]);
        pos += n * es;
        i += n;
    }
}

/// Elements of `got` (elements `first..`) that differ from the periodic `table`.
fn count_wrong(got: &[u8], first: usize, table: &[u8], es: usize) -> u64 {
    let (mut i, mut pos, mut wrong) = (first, 0, 0u64);
    while pos < got.len() {
        let phase = i % PERIOD;
        let n = (PERIOD - phase).min((got.len() - pos) / es);
        let (a, b) = (&got[pos..pos + n * es], &table[phase * es..(phase + n) * es]);
        if a != b {
            wrong += a.chunks_exact(es).zip(b.chunks_exact(es)).filter(|(x, y)| x != y).count() as u64;
        }
        pos += n * es;
        i += n;
    }
    wrong
}

/// The team's streams, timing events and data; released in reverse.
struct Rig {
    devices: Vec<Device>,
    streams: Vec<Stream>,
    start: Vec<Event>,
    end: Vec<Event>,
    /// The send buffer (buffer and registered memory): in place, also the result.
    buf: Option<Buffer>,
    /// Out of place: the recv buffer.
    recv: Option<Buffer>,
    /// Per rank: send and recv memory (`mcast_mem_alloc` for registered memory, `cuMemAlloc` for
    /// pointers); in place, recv is send.
    send_mem: Vec<u64>,
    recv_mem: Vec<u64>,
    memory: Memory,
    inplace: bool,
    /// How long the allocation (and registration) took, in milliseconds.
    alloc_ms: f64,
}

impl Rig {
    /// An empty rig for `team`'s ranks.
    fn new(team: &Team) -> Rig {
        Rig {
            devices: team.devices().to_vec(),
            streams: vec![],
            start: vec![],
            end: vec![],
            buf: None,
            recv: None,
            send_mem: vec![],
            recv_mem: vec![],
            memory: Memory::Buffer,
            inplace: true,
            alloc_ms: 0.0,
        }
    }

    /// Creates the streams, events and a `bytes`-byte buffer. On failure what was created stays
    /// in the rig, for [`Rig::release`].
    fn populate(&mut self, team: &Arc<Team>, bytes: usize, memory: Memory, inplace: bool) -> Result<(), Failure> {
        self.memory = memory;
        self.inplace = inplace;
        let driver = team.context().driver().clone();
        for &dev in team.devices() {
            let s =
                driver.stream_create(dev).map_err(|e| runtime(format!("creating a stream on device {dev}: {e}")))?;
            self.streams.push(s);
        }
        for &dev in team.devices() {
            let event =
                || driver.event_create(dev).map_err(|e| runtime(format!("creating an event on device {dev}: {e}")));
            self.start.push(event()?);
            self.end.push(event()?);
        }
        let allocating = std::time::Instant::now();
        let ctx = team.context();
        let copies = if inplace { 1 } else { 2 };
        match memory {
            Memory::Buffer => {
                for k in 0..copies {
                    let buf = Buffer::alloc(team, bytes)
                        .map_err(|e| runtime(format!("allocating a {bytes}-byte buffer on every rank: {e}")))?;
                    if k == 0 {
                        self.buf = Some(buf);
                    } else {
                        self.recv = Some(buf);
                    }
                }
            }
            Memory::Registered | Memory::Pointer => {
                for k in 0..copies {
                    for &dev in team.devices() {
                        let p = match memory {
                            Memory::Registered => ctx.memory.alloc(ctx, dev, bytes).map_err(|e| e.to_string()),
                            _ => driver.mem_alloc(dev, bytes).map_err(|e| e.to_string()),
                        }
                        .map_err(|e| runtime(format!("allocating {bytes} bytes on device {dev}: {e}")))?;
                        if k == 0 {
                            self.send_mem.push(p);
                        } else {
                            self.recv_mem.push(p);
                        }
                    }
                }
                if memory == Memory::Registered {
                    self.buf = Some(
                        Buffer::register(team, &self.send_mem, bytes)
                            .map_err(|e| runtime(format!("registering the send memory: {e}")))?,
                    );
                    if !inplace {
                        self.recv = Some(
                            Buffer::register(team, &self.recv_mem, bytes)
                                .map_err(|e| runtime(format!("registering the recv memory: {e}")))?,
                        );
                    }
                }
            }
        }
        if inplace {
            self.recv_mem = self.send_mem.clone();
        }
        self.alloc_ms = allocating.elapsed().as_secs_f64() * 1e3;
        Ok(())
    }

    /// Frees everything; returns the errors.
    fn release(self, ctx: &Context) -> Vec<String> {
        let driver = ctx.driver();
        let mut errors = vec![];
        for b in self.buf.iter().chain(&self.recv) {
            if let Err(e) = b.free() {
                errors.push(format!("freeing a buffer: {e}"));
            }
        }
        let copies = if self.inplace { 1 } else { 2 };
        let mems =
            self.send_mem.iter().chain(&self.recv_mem).take(copies * self.send_mem.len().min(self.devices.len()));
        for (i, &p) in mems.enumerate() {
            let dev = self.devices[i % self.devices.len()];
            let freed = match self.memory {
                Memory::Registered => ctx.memory.free(ctx, p).map_err(|e| e.to_string()),
                _ => driver.mem_free(dev, p).map_err(|e| e.to_string()),
            };
            if let Err(e) = freed {
                errors.push(format!("freeing memory on device {dev}: {e}"));
            }
        }
        let dev = |r: usize| self.devices[r];
        for (r, &ev) in self.start.iter().enumerate().chain(self.end.iter().enumerate()) {
            if let Err(e) = driver.event_destroy(dev(r), ev) {
                errors.push(format!("destroying an event: {e}"));
            }
        }
        for (r, &s) in self.streams.iter().enumerate() {
            if let Err(e) = driver.stream_destroy(dev(r), s) {
                errors.push(format!("destroying a stream: {e}"));
            }
        }
        errors
    }
}

/// One size's shape: `count` elements per block, `blocks` blocks.
struct Shape {
    count: usize,
    es: usize,
    blocks: usize,
}

impl Shape {
    fn of(op: Op, dtype: DType, nranks: usize, size: u64) -> Shape {
        let (es, blocks) = (dtype.size(), op.blocks(nranks));
        let count = usize::try_from(size).unwrap_or(usize::MAX) / (es * blocks);
        Shape { count: count.max(1), es, blocks }
    }

    fn bytes(&self) -> usize {
        self.count * self.es * self.blocks
    }
}

struct Bench<'a> {
    team: &'a Arc<Team>,
    rig: &'a Rig,
    collective: Collective,
    op: Op,
    dtype: DType,
    /// Per rank: its input data.
    inputs: Vec<Vec<u8>>,
    /// The reduction over ranks of the inputs.
    reduced: Vec<u8>,
}

impl Bench<'_> {
    fn buf(&self) -> &Buffer {
        self.rig.buf.as_ref().expect("allocated")
    }

    /// `count` as `collective::run` takes it: elements for the reductions, bytes otherwise.
    fn run_count(&self, s: &Shape) -> usize {
        if self.op.reduces() {
            s.count
        } else {
            s.count * s.es
        }
    }

    /// Rank `r`'s part of one collective on `stream` (`--memory`, `--inplace`).
    fn run_rank(&self, r: usize, s: &Shape, stream: Stream) -> Result<(), Failure> {
        let count = self.run_count(s);
        let rig = self.rig;
        let block = (s.count * s.es) as u64;
        let result = match (rig.memory, rig.inplace) {
            (Memory::Pointer, _) => {
                // NCCL's in-place layouts: all-gather sends block r of recv, reduce-scatter
                // receives into block r of send.
                let (send, recv) = (rig.send_mem[r], rig.recv_mem[r]);
                let (send, recv) = match (self.collective, rig.inplace) {
                    (Collective::AllGather, true) => (send + r as u64 * block, recv),
                    (Collective::ReduceScatter { .. }, true) => (send, recv + r as u64 * block),
                    _ => (send, recv),
                };
                run_ptr(self.team, r as i32, send, recv, count, self.collective, stream)
            }
            (_, true) => run(self.buf(), r as i32, 0, count, self.collective, stream),
            (_, false) => {
                let recv = rig.recv.as_ref().expect("allocated");
                run_into(self.buf(), 0, recv, 0, r as i32, count, self.collective, stream)
            }
        };
        result.map_err(|e| runtime(format!("{} rank {r}: {e}", self.op.name())))
    }

    /// Every rank's part of one collective, rank by rank.
    fn launch(&self, s: &Shape) -> Result<(), Failure> {
        for (r, &stream) in self.rig.streams.iter().enumerate() {
            self.run_rank(r, s, stream)?;
        }
        Ok(())
    }

    /// Writes rank `r`'s input (`host`, the in-place layout) where the collective reads it.
    fn write_input(&self, r: usize, s: &Shape, host: &[u8]) -> Result<(), Failure> {
        let rig = self.rig;
        let block = s.count * s.es;
        // Out of place, all-gather sends only this rank's block.
        let data = match (self.collective, rig.inplace) {
            (Collective::AllGather, false) => &host[r * block..(r + 1) * block],
            _ => host,
        };
        let what = |e: String| runtime(format!("writing rank {r}'s input: {e}"));
        match rig.memory {
            Memory::Pointer => {
                let driver = self.team.context().driver();
                driver.memcpy_htod(rig.devices[r], rig.send_mem[r], data).map_err(|e| what(e.to_string()))
            }
            _ => self.buf().write(r as i32, 0, data).map_err(|e| what(e.to_string())),
        }
    }

    /// Reads rank `r`'s result into `host`, in the in-place layout.
    fn read_output(&self, r: usize, s: &Shape, host: &mut [u8]) -> Result<(), Failure> {
        let rig = self.rig;
        let block = s.count * s.es;
        let dst = match (self.collective, rig.inplace) {
            (Collective::ReduceScatter { .. }, false) => &mut host[r * block..(r + 1) * block],
            _ => host,
        };
        let what = |e: String| runtime(format!("reading rank {r}'s result: {e}"));
        match (rig.memory, rig.inplace) {
            (Memory::Pointer, _) => {
                let driver = self.team.context().driver();
                driver.memcpy_dtoh(rig.devices[r], dst, rig.recv_mem[r]).map_err(|e| what(e.to_string()))
            }
            (_, true) => self.buf().read(r as i32, 0, dst).map_err(|e| what(e.to_string())),
            (_, false) => rig.recv.as_ref().expect("allocated").read(r as i32, 0, dst).map_err(|e| what(e.to_string())),
        }
    }

    fn sync_all(&self) -> Result<(), Failure> {
        for (r, &stream) in self.rig.streams.iter().enumerate() {
            synchronize(self.team, r as i32, stream).map_err(|e| runtime(format!("{}: {e}", self.op.name())))?;
        }
        Ok(())
    }

    /// Fills the inputs, runs the op once and counts the wrong elements over every rank.
    fn check(&self, s: &Shape) -> Result<u64, Failure> {
        let bytes = s.bytes();
        let mut host = vec![0u8; bytes];
        for (r, input) in self.inputs.iter().enumerate() {
            fill(&mut host, 0, input, s.es);
            self.write_input(r, s, &host)?;
        }
        self.launch(s)?;
        self.sync_all()?;
        let block = s.count * s.es;
        let mut wrong = 0;
        for r in 0..self.inputs.len() {
            self.read_output(r, s, &mut host)?;
            wrong += match self.collective {
                Collective::AllReduce { .. } => count_wrong(&host, 0, &self.reduced, s.es),
                Collective::Broadcast { root } => count_wrong(&host, 0, &self.inputs[root as usize], s.es),
                Collective::ReduceScatter { .. } => {
                    count_wrong(&host[r * block..(r + 1) * block], r * s.count, &self.reduced, s.es)
                }
                Collective::AllGather => (0..s.blocks)
                    .map(|b| count_wrong(&host[b * block..(b + 1) * block], b * s.count, &self.inputs[b], s.es))
                    .sum(),
            };
        }
        Ok(wrong)
    }

    /// Warm-up, then the timed loop; the slowest rank's time per iteration in microseconds.
    ///
    /// Each rank is driven by its own thread with its device current, as in a program with one
    /// thread (or process) per GPU: ranks' launches proceed in parallel, and a rank's time is
    /// its stream's, measured with events around its loop.
    ///
    /// With `graph > 0` each rank captures its `iters` iterations in a CUDA graph and replays it
    /// `graph` times between the events (see [`Bench::time_graph`]); the time is per iteration.
    fn time(&self, s: &Shape, warmup: u32, iters: u32, graph: u32) -> Result<f64, Failure> {
        let driver = self.team.context().driver();
        let rig = self.rig;
        let n = rig.streams.len();
        let start_line = std::sync::Barrier::new(n);
        let failed = std::sync::atomic::AtomicBool::new(false);
        let per_rank: Vec<Result<f64, Failure>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..n)
                .map(|r| {
                    let (start_line, failed) = (&start_line, &failed);
                    scope.spawn(move || -> Result<f64, Failure> {
                        let (dev, stream) = (rig.devices[r], rig.streams[r]);
                        let name = self.op.name();
                        let launch = || self.run_rank(r, s, stream);
                        driver.bind_thread(dev).map_err(|e| runtime(format!("rank {r}: {e}")))?;
                        if graph > 0 {
                            return self.time_graph(r, s, warmup, iters, graph, start_line, failed);
                        }
                        for _ in 0..warmup {
                            launch()?;
                        }
                        driver.stream_synchronize(dev, stream).map_err(|e| runtime(format!("rank {r}: {e}")))?;
                        start_line.wait();
                        driver
                            .event_record(dev, rig.start[r], stream)
                            .map_err(|e| runtime(format!("recording rank {r}'s start event: {e}")))?;
                        for _ in 0..iters {
                            launch()?;
                        }
                        driver
                            .event_record(dev, rig.end[r], stream)
                            .map_err(|e| runtime(format!("recording rank {r}'s end event: {e}")))?;
                        synchronize(self.team, r as i32, stream).map_err(|e| runtime(format!("{name}: {e}")))?;
                        let ms = driver
                            .event_elapsed_ms(dev, rig.start[r], rig.end[r])
                            .map_err(|e| runtime(format!("reading rank {r}'s elapsed time: {e}")))?;
                        Ok(f64::from(ms))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(runtime("a rank thread panicked")))).collect()
        });
        let mut ms = 0f64;
        for t in per_rank {
            ms = ms.max(t?);
        }
        Ok(ms * 1e3 / (f64::from(iters) * f64::from(graph.max(1))))
    }

    /// Rank `r`'s graph-mode timing, on its own thread with its device current: `warmup` eager
    /// iterations; `iters` iterations captured on its stream (thread-local capture mode, as
    /// nccl-tests) and instantiated; one untimed replay (which also uploads the graph); then,
    /// once every rank is ready, `replays` replays between the events. Returns the elapsed
    /// milliseconds of all replays. Every rank reaches the start line exactly once, even when its
    /// setup failed (`failed` tells the others, which then skip the timed part), so a failure
    /// never leaves a rank waiting there.
    #[allow(clippy::too_many_arguments)]
    fn time_graph(
        &self,
        r: usize,
        s: &Shape,
        warmup: u32,
        iters: u32,
        replays: u32,
        start_line: &std::sync::Barrier,
        failed: &std::sync::atomic::AtomicBool,
    ) -> Result<f64, Failure> {
        use std::sync::atomic::Ordering;
        let driver = self.team.context().driver();
        let rig = self.rig;
        let (dev, stream) = (rig.devices[r], rig.streams[r]);
        let name = self.op.name();
        let setup = (|| -> Result<(Graph, GraphExec), Failure> {
            for _ in 0..warmup {
                self.run_rank(r, s, stream)?;
            }
            synchronize(self.team, r as i32, stream).map_err(|e| runtime(format!("{name}: {e}")))?;
            let graph = capture(driver.as_ref(), dev, stream, || {
                for _ in 0..iters {
                    self.run_rank(r, s, stream)?;
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
        })();
        let graph = match setup {
            Ok(g) => Some(g),
            Err(f) => {
                failed.store(true, Ordering::SeqCst);
                start_line.wait();
                return Err(f);
            }
        };
        let (g, x) = graph.expect("set up");
        let replay =
            |what: &str| driver.graph_launch(dev, x, stream).map_err(|e| runtime(format!("rank {r}: {what}: {e}")));
        let timed = (|| -> Result<f64, Failure> {
            // The untimed replay: the graph's first launch uploads it.
            let warm = replay("replaying the CUDA graph")
                .and_then(|()| synchronize(self.team, r as i32, stream).map_err(|e| runtime(format!("{name}: {e}"))));
            if warm.is_err() {
                failed.store(true, Ordering::SeqCst);
            }
            // Every rank passes here exactly once, set up or failed; the flag is final after it.
            start_line.wait();
            warm?;
            if failed.load(Ordering::SeqCst) {
                return Err(runtime(format!("rank {r}: another rank failed to set up its CUDA graph")));
            }
            driver
                .event_record(dev, rig.start[r], stream)
                .map_err(|e| runtime(format!("recording rank {r}'s start event: {e}")))?;
            for _ in 0..replays {
                replay("replaying the CUDA graph")?;
            }
            driver
                .event_record(dev, rig.end[r], stream)
                .map_err(|e| runtime(format!("recording rank {r}'s end event: {e}")))?;
            synchronize(self.team, r as i32, stream).map_err(|e| runtime(format!("{name}: {e}")))?;
            let ms = driver
                .event_elapsed_ms(dev, rig.start[r], rig.end[r])
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
}

/// Captures what `body` launches on `stream` into a graph. The capture is ended on every path,
/// so the stream never stays capturing; a graph made before a failure is destroyed.
fn capture(
    driver: &dyn Driver,
    dev: Device,
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

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse_args(&args) {
        Ok(Some(o)) => o,
        Ok(None) => return ExitCode::SUCCESS,
        Err(f) => return fail(f),
    };
    let mut config = Config::from_env();
    if let Some(b) = opts.backend {
        config.backend = b;
    }
    let ctx = match Context::new(config) {
        Ok(c) => Arc::new(c),
        Err(e) => return fail(runtime(e.to_string())),
    };
    let outcome = bench(&ctx, &opts);
    let leaks = ctx.shutdown();
    let mut code = match outcome {
        Ok(0) => ExitCode::SUCCESS,
        Ok(wrong) => {
            eprintln!("mcast-bench: {wrong} wrong element(s): the results are incorrect");
            ExitCode::FAILURE
        }
        Err(f) => fail(f),
    };
    if !leaks.is_empty() {
        eprintln!("mcast-bench: left behind:\n{leaks}");
        code = ExitCode::FAILURE;
    }
    code
}

fn fail(f: Failure) -> ExitCode {
    match f {
        Failure::Usage(msg) => {
            eprintln!("mcast-bench: {msg}\nTry 'mcast-bench --help'.");
            ExitCode::from(2)
        }
        Failure::Runtime(msg) => {
            eprintln!("mcast-bench: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the benchmark; returns the total of wrong elements.
fn bench(ctx: &Arc<Context>, o: &Options) -> Result<u64, Failure> {
    let (backend, backend_why) = ctx.backend();
    let sim = backend == Backend::Sim;
    let devices = o.devices.clone().unwrap_or_else(|| (0..ctx.device_count() as i32).collect());
    if devices.is_empty() {
        return Err(runtime("the context has no device"));
    }
    for &d in &devices {
        ctx.check_device(d, "--devices: device").map_err(|e| usage(e.to_string()))?;
    }
    let n = devices.len();
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

    let created = std::time::Instant::now();
    let team = Team::create(ctx, &devices).map_err(|e| runtime(format!("creating a team on {devices:?}: {e}")))?;
    let create_ms = created.elapsed().as_secs_f64() * 1e3;
    let info = team.info();
    let device_name = ctx.props(devices[0]).map(|p| p.name).unwrap_or_default();
    let run_info = RunInfo {
        op: o.op,
        dtype: o.dtype,
        redop: o.op.reduces().then_some(o.redop),
        root: if o.op == Op::Broadcast { i64::from(o.root) } else { -1 },
        backend: ctx.driver().backend_name(),
        transport: match info.transport {
            Transport::Multicast => "MULTICAST",
            Transport::P2P => "P2P",
        },
        transport_reason: info.transport_reason.clone(),
        devices: devices.clone(),
        device_name,
        date: utc_now(),
        iters,
        warmup,
        graph: o.graph,
        check: o.check,
    };
    let policy = match ctx.config().multicast {
        MulticastMode::Auto => "auto",
        MulticastMode::Off => "off",
        MulticastMode::Require => "require",
    };
    println!("# mcast-bench {}: {}, {n} rank(s) on devices {devices:?}", env!("CARGO_PKG_VERSION"), o.op.name());
    println!("# backend: {} ({backend_why})", run_info.backend);
    for (r, &d) in devices.iter().enumerate() {
        let name = ctx.props(d).map(|p| p.name).unwrap_or_else(|e| format!("unknown ({e})"));
        println!("#   rank {r:>2}: device {d} {name}");
    }
    let why = if info.transport_reason.is_empty() { String::new() } else { format!(" ({})", info.transport_reason) };
    println!("# transport: {}{why}; multicast policy {policy} (MCAST_MULTICAST)", run_info.transport);
    if mcast::kernels::cuda::emulate_forced() {
        println!("# MCAST_EMULATE_MULTIMEM=1: multicast kernels with emulated multimem over P2P");
    }
    println!(
        "# sizes {min_b}..{max_b} x{factor}, {warmup} warmup + {iters} timed iteration(s), check {}",
        if o.check { "on" } else { "off" }
    );
    match o.graph {
        0 => println!("# mode: eager (a launch per iteration)"),
        g => println!(
            "# mode: graph (each rank's {iters} iteration(s) captured in a CUDA graph, replayed {g} time(s); time per \
             iteration = elapsed / {})",
            u64::from(iters) * u64::from(g)
        ),
    }
    println!(
        "# memory: {} ({}), {}",
        o.memory.name(),
        match o.memory {
            Memory::Buffer => "mcast_buffer_alloc",
            Memory::Registered => "mcast_mem_alloc + mcast_buffer_register",
            Memory::Pointer => "plain device memory, mcast_team_*",
        },
        if o.inplace { "in place" } else { "out of place" }
    );
    let mut rig = Rig::new(&team);
    if let Err(f) = rig.populate(&team, buffer_bytes, o.memory, o.inplace) {
        let mut errors = rig.release(ctx);
        if let Err(e) = team.destroy() {
            errors.push(format!("destroying the team: {e}"));
        }
        return Err(with_errors(f, errors));
    }
    let held = team.info().bytes_reserved;
    println!(
        "# setup: team created in {create_ms:.1} ms; a {buffer_bytes}-byte buffer allocated on every rank in {:.1} ms; \
         device memory held per rank {held} bytes ({} beyond the buffer)",
        rig.alloc_ms,
        held.saturating_sub(buffer_bytes as u64)
    );
    println!("#");
    println!(
        "# {:>10} {:>12} {:>6} {:>6} {:>5} {:>10} {:>12} {:>12} {:>7}",
        "size", "count", "type", "redop", "root", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong"
    );
    let collective = match o.op {
        Op::AllReduce => Collective::AllReduce { dtype: o.dtype, op: o.redop },
        Op::ReduceScatter => Collective::ReduceScatter { dtype: o.dtype, op: o.redop },
        Op::Broadcast => Collective::Broadcast { root: o.root },
        Op::AllGather => Collective::AllGather,
    };
    let reduced = table(o.dtype, |j| {
        let vals = (0..n).map(|r| value(o.dtype, n, r, j));
        match o.redop {
            RedOp::Sum => vals.sum(),
            RedOp::Min => vals.min().unwrap_or(0),
            RedOp::Max => vals.max().unwrap_or(0),
        }
    });
    let bench = Bench {
        team: &team,
        rig: &rig,
        collective,
        op: o.op,
        dtype: o.dtype,
        inputs: (0..n).map(|r| table(o.dtype, |j| value(o.dtype, n, r, j))).collect(),
        reduced,
    };
    let result = measure(&bench, &shapes, &run_info, o);
    let mut errors = rig.release(ctx);
    if let Err(e) = team.destroy() {
        errors.push(format!("destroying the team: {e}"));
    }
    let rows = result.map_err(|f| with_errors(f, errors.clone()))?;
    if !errors.is_empty() {
        return Err(runtime(errors.join("; ")));
    }
    let wrong: u64 = rows.iter().filter_map(|r| r.wrong).sum();
    if !rows.is_empty() {
        let avg = rows.iter().map(|r| r.busbw).sum::<f64>() / rows.len() as f64;
        println!("# wrong elements: {}", if o.check { wrong.to_string() } else { "not checked".into() });
        println!("# avg bus bandwidth: {avg:.3} GB/s");
    }
    if let Some(path) = &o.csv {
        std::fs::write(path, csv(&run_info, &rows)).map_err(|e| runtime(format!("writing {}: {e}", path.display())))?;
    }
    if let Some(path) = &o.json {
        std::fs::write(path, json(&run_info, &rows))
            .map_err(|e| runtime(format!("writing {}: {e}", path.display())))?;
    }
    Ok(wrong)
}

fn with_errors(f: Failure, errors: Vec<String>) -> Failure {
    match f {
        Failure::Runtime(m) if !errors.is_empty() => runtime(format!("{m}; then, cleaning up: {}", errors.join("; "))),
        other => other,
    }
}

/// Checks and times every size, printing a row each.
fn measure(b: &Bench, shapes: &[Shape], info: &RunInfo, o: &Options) -> Result<Vec<Row>, Failure> {
    let started = Instant::now();
    let n = b.team.size();
    let mut rows = vec![];
    for (k, s) in shapes.iter().enumerate() {
        let bytes = s.bytes();
        if !o.quiet && started.elapsed().as_secs_f64() >= 1.0 {
            eprintln!(
                "mcast-bench: [{}/{}] {} {bytes} B ({:.1} s so far)",
                k + 1,
                shapes.len(),
                b.op.name(),
                started.elapsed().as_secs_f64()
            );
        }
        let wrong = if o.check { Some(b.check(s)?) } else { None };
        let time_us = b.time(s, info.warmup, info.iters, info.graph)?;
        let algbw = if time_us > 0.0 { bytes as f64 / time_us / 1e3 } else { 0.0 };
        let row = Row { size: bytes, count: s.count, time_us, algbw, busbw: algbw * b.op.bus_factor(n), wrong };
        println!(
            "  {:>10} {:>12} {:>6} {:>6} {:>5} {:>10.2} {:>12.3} {:>12.3} {:>7}",
            row.size,
            row.count,
            b.dtype.name(),
            info.redop.map_or("none", RedOp::name),
            info.root,
            row.time_us,
            row.algbw,
            row.busbw,
            row.wrong.map_or("N/A".to_string(), |w| w.to_string())
        );
        rows.push(row);
    }
    Ok(rows)
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn csv(info: &RunInfo, rows: &[Row]) -> String {
    let mut out = String::from(
        "op,size,count,type,redop,root,time_us,algbw_gbps,busbw_gbps,wrong,nranks,backend,transport,device,date,mode,\
         graph_launches\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{:.3},{:.6},{:.6},{},{},{},{},{},{},{},{}",
            info.op.name(),
            r.size,
            r.count,
            info.dtype.name(),
            info.redop.map_or("none", RedOp::name),
            info.root,
            r.time_us,
            r.algbw,
            r.busbw,
            r.wrong.map_or(String::new(), |w| w.to_string()),
            info.devices.len(),
            info.backend,
            info.transport,
            csv_field(&info.device_name),
            info.date,
            info.mode(),
            info.graph
        );
    }
    out
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_num(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "null".into()
    }
}

fn json(info: &RunInfo, rows: &[Row]) -> String {
    let mut out = String::from("{\n");
    let devices = info.devices.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
    let _ = writeln!(out, "  \"tool\": \"mcast-bench\",");
    let _ = writeln!(out, "  \"version\": {},", json_str(env!("CARGO_PKG_VERSION")));
    let _ = writeln!(out, "  \"date\": {},", json_str(&info.date));
    let _ = writeln!(out, "  \"op\": {},", json_str(info.op.name()));
    let _ = writeln!(out, "  \"type\": {},", json_str(info.dtype.name()));
    let _ = writeln!(out, "  \"redop\": {},", json_str(info.redop.map_or("none", RedOp::name)));
    let _ = writeln!(out, "  \"root\": {},", info.root);
    let _ = writeln!(out, "  \"nranks\": {},", info.devices.len());
    let _ = writeln!(out, "  \"devices\": [{devices}],");
    let _ = writeln!(out, "  \"device\": {},", json_str(&info.device_name));
    let _ = writeln!(out, "  \"backend\": {},", json_str(info.backend));
    let _ = writeln!(out, "  \"transport\": {},", json_str(info.transport));
    let _ = writeln!(out, "  \"transport_reason\": {},", json_str(&info.transport_reason));
    let _ = writeln!(out, "  \"iters\": {},", info.iters);
    let _ = writeln!(out, "  \"warmup\": {},", info.warmup);
    let _ = writeln!(out, "  \"mode\": {},", json_str(info.mode()));
    let _ = writeln!(out, "  \"graph_launches\": {},", info.graph);
    let _ = writeln!(out, "  \"check\": {},", info.check);
    out.push_str("  \"rows\": [");
    for (i, r) in rows.iter().enumerate() {
        let _ = write!(
            out,
            "{}\n    {{\"size\": {}, \"count\": {}, \"time_us\": {}, \"algbw_gbps\": {}, \"busbw_gbps\": {}, \
             \"wrong\": {}}}",
            if i == 0 { "" } else { "," },
            r.size,
            r.count,
            json_num(r.time_us),
            json_num(r.algbw),
            json_num(r.busbw),
            r.wrong.map_or("null".to_string(), |w| w.to_string())
        );
    }
    out.push_str(if rows.is_empty() { "]\n}\n" } else { "\n  ]\n}\n" });
    out
}

/// Now, as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc_now() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_and_count_wrong_follow_the_period_from_any_phase() {
        for d in DType::ALL {
            let es = d.size();
            let t = table(d, |j| value(d, 4, 1, j));
            for first in [0, 5, PERIOD - 1, PERIOD, 3 * PERIOD + 7] {
                let mut buf = vec![0u8; (2 * PERIOD + 13) * es];
                fill(&mut buf, first, &t, es);
                assert_eq!(count_wrong(&buf, first, &t, es), 0, "{d:?} from {first}");
                let mut expect = vec![];
                for i in first..first + 2 * PERIOD + 13 {
                    encode(d, value(d, 4, 1, i % PERIOD), &mut expect);
                }
                assert_eq!(buf, expect, "{d:?} from {first}");
                // Corrupt two elements; shift by one element: both are seen.
                buf[0] ^= 1;
                buf[(PERIOD + 2) * es + es - 1] ^= 0x40;
                assert_eq!(count_wrong(&buf, first, &t, es), 2, "{d:?}");
                assert!(count_wrong(&buf[es..], first, &t, es) > 0);
            }
        }
    }

    #[test]
    fn check_data_is_exact_and_differs_between_ranks() {
        for n in 1..=MAX_RANKS {
            for j in 0..PERIOD {
                let sum: i64 = (0..n).map(|r| value(DType::I32, n, r, j).abs()).sum();
                assert!(sum <= 256, "{n}-rank sums stay exact in bf16");
                for r in 1..n.min(2 * amplitude(n) as usize + 1) {
                    assert_ne!(value(DType::F32, n, 0, j), value(DType::F32, n, r, j), "{n} ranks, rank {r}");
                }
            }
        }
    }

    #[test]
    fn sizes_follow_nccl_tests() {
        let s = Shape::of(Op::AllGather, DType::F32, 4, 4096);
        assert_eq!((s.count, s.bytes()), (256, 4096));
        let s = Shape::of(Op::AllReduce, DType::BF16, 4, 4096);
        assert_eq!((s.count, s.bytes()), (2048, 4096));
        let s = Shape::of(Op::ReduceScatter, DType::F64, 8, 8);
        assert_eq!((s.count, s.bytes()), (1, 64));
        assert_eq!(Op::AllReduce.bus_factor(4), 1.5);
        assert_eq!(Op::AllGather.bus_factor(4), 0.75);
        assert_eq!(Op::Broadcast.bus_factor(4), 1.0);
    }

    #[test]
    fn bad_arguments_are_usage_errors() {
        let args = |a: &[&str]| parse_args(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        for bad in [&["--nope"][..], &["-b"], &["-b", "0"], &["-f", "1"], &["--devices", ""], &["-c", "yes"]] {
            assert!(matches!(args(bad), Err(Failure::Usage(_))), "{bad:?}");
        }
        let o = args(&["--op=all_gather", "-d", "bfloat16", "-b", "8K", "--devices", "0,0"]).ok().flatten().unwrap();
        assert_eq!((o.op, o.dtype, o.min_bytes, o.devices), (Op::AllGather, DType::BF16, Some(8192), Some(vec![0, 0])));
    }

    #[test]
    fn dates_are_iso_8601() {
        let d = utc_now();
        assert_eq!(d.len(), 20, "{d}");
        assert!(d.starts_with("20") && d.ends_with('Z'));
    }
}
