//! The command line: `--help`, the options and their checks. Bad usage is [`Failure::Usage`]
//! (exit status 2); nothing here touches mcast.

use std::path::PathBuf;

use mcast::runtime::config::parse_bytes;
pub use mcast::types::{DType, RedOp};

pub const HELP: &str = "\
usage: mcast-bench [options]

Times mcast collectives over a range of message sizes, nccl-tests style. One process drives every
rank (or, with --procs or under mpirun, one process per rank). Without a GPU it runs on the simulator (small default sizes, so it finishes in seconds).

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
                     (0,0: two ranks on one GPU, P2P). Default: every device of the context.
                     With one process per rank: rank r's device among those its process sees
                     (default: 0 with --visible, else the rank's index on its host)
  --backend B        auto (default, or MCAST_BACKEND), cuda, sim
  --memory M         where the data lives: buffer (default: mcast_buffer_alloc buffers, the
                     mcast_<op> calls), registered (mcast_mem_alloc memory registered with
                     mcast_buffer_register, the same calls), pointer (plain device memory, cuMemAlloc
                     like cudaMalloc, the mcast_team_<op> calls)
  --inplace 0|1      1 (default): in place (NCCL's in-place layout); 0: out of place, send and recv
                     apart (the _into calls; pointer: send != recv), like nccl-tests' out-of-place
                     columns
  --ce-min-bytes N   copy-engine threshold (sets MCAST_CE_MIN_BYTES for this run): on the P2P
                     transport, all_gather, broadcast and all_reduce messages of at least N bytes
                     (the size column) move with cuMemcpyDtoDAsync peer copies between barrier
                     kernels instead of SM kernels (buffer and registered memory; the pointer
                     form's plain memory keeps the kernels); 0 = never. Default: MCAST_CE_MIN_BYTES,
                     else 64M on the simulator and off on CUDA (where 64M is the measured
                     crossover on 2 x H100)
  --host-overhead N  host-overhead mode: instead of the device time, time N calls per rank and
                     size on the host, each alone (the time spent inside the mcast_* call, not
                     on the GPU); the rows give the median, p99 and mean in ns and the heap
                     allocations per call made by mcast's code (on the simulator the simulated
                     device's own allocations are counted apart: the summary line and the CSV/JSON
                     sim_allocs_per_call). 0: off (default)
  --host-launch L    where the kernels of --host-overhead calls go: capture (the calls are made
                     inside a stream capture, so the whole launch path runs but the kernels are
                     recorded, never run: the no-op path; the default on the simulator) or eager
                     (the kernels run, each rank's stream is synchronized every 64 calls outside
                     the timing; the default on CUDA)
  --procs N          one process per rank: mcast-bench starts N copies of itself, rank r in the
                     r-th, joined into one team by mcast_get_unique_id / mcast_team_init_rank
                     (the id goes to each copy through its stdin, a pipe); rank 0 prints the
                     table. A copy that fails or dies fails the run (exit status 1, or 2 for bad
                     usage) and the others are killed. Under mpirun (OMPI_COMM_WORLD_RANK/SIZE,
                     or PMI_RANK/PMI_SIZE) every process is one rank without --procs; the id then
                     comes from MCAST_BOOTSTRAP_ADDR and MCAST_BOOTSTRAP_SECRET (env mode)
  --visible LIST     with one process per rank: each rank's CUDA_VISIBLE_DEVICES, comma-separated,
                     one entry per rank, ':' between the devices of one entry (0,1: rank 0 sees
                     GPU 0, rank 1 GPU 1, each as its device 0; 0:1,1:0: both see both GPUs)
  --domains LIST     with one process per rank: each rank's MCAST_DOMAIN label (A,A,B,B: two
                     NVLink domains of two ranks)
  --net E            the engine between NVLink domains: auto, nccl, none (MCAST_NET for every
                     rank), or mpi (under mpirun, Open MPI: libmcast_mpi loaded at run time,
                     MCAST_MPI_LIBRARY or libmcast_mpi.so, registered on every rank's context)
  --csv FILE         also write the rows as CSV to FILE
  --json FILE        also write the run and its rows as JSON to FILE
  -q, --quiet        no progress lines on stderr
  -h, --help         this text

Sizes are nccl-tests' message sizes: for all_gather and reduce_scatter the TOTAL size over all
ranks (each rank's block is size/N); counts are rounded down to whole elements (at least one per
rank). The count column is elements per rank block. algbw = size / time; busbw = algbw * factor,
factor = 2(N-1)/N for all_reduce, (N-1)/N for reduce_scatter and all_gather, 1 for broadcast.

Every mcast call goes through mcast's C ABI (the mcast_* functions of mcast.h). Multicast use
follows MCAST_MULTICAST (auto, off, require) and the NVLS kill switches; the header shows the
team's transport and why. Other MCAST_* variables (MCAST_SIM_DEVICES, MCAST_TIMEOUT_MS, ...)
configure the context as for any mcast program.

exit status: 0 success; 1 wrong results, a runtime error or leaked resources; 2 bad usage.";

/// Most ranks of a team (API.md: an NVL72 rack).
pub const MAX_RANKS: usize = 72;

/// The collective timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    AllReduce,
    Broadcast,
    ReduceScatter,
    AllGather,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::Broadcast => "broadcast",
            Op::ReduceScatter => "reduce_scatter",
            Op::AllGather => "all_gather",
        }
    }

    pub fn reduces(self) -> bool {
        matches!(self, Op::AllReduce | Op::ReduceScatter)
    }

    /// Blocks of `count` elements in the buffer: one per rank for the scattered/gathered ops.
    pub fn blocks(self, nranks: usize) -> usize {
        match self {
            Op::ReduceScatter | Op::AllGather => nranks,
            Op::AllReduce | Op::Broadcast => 1,
        }
    }

    /// NCCL's bus bandwidth factor.
    pub fn bus_factor(self, nranks: usize) -> f64 {
        let n = nranks as f64;
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            Op::ReduceScatter | Op::AllGather => (n - 1.0) / n,
            Op::Broadcast => 1.0,
        }
    }
}

/// `--backend`, as the `mcast_backend_t` value it sets in the config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Auto = 0,
    Cuda = 1,
    Sim = 2,
}

/// Where the benchmark's data lives (`--memory`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// `mcast_buffer_alloc` buffers.
    Buffer,
    /// `mcast_mem_alloc` memory registered with `mcast_buffer_register`.
    Registered,
    /// Plain device memory (`cuMemAlloc`), the pointer-form calls.
    Pointer,
}

impl Memory {
    pub fn name(self) -> &'static str {
        match self {
            Memory::Buffer => "buffer",
            Memory::Registered => "registered",
            Memory::Pointer => "pointer",
        }
    }
}

/// Where the kernels of the host-overhead calls go (`--host-launch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostLaunch {
    /// Inside a stream capture: recorded, never run.
    Capture,
    /// Enqueued and run.
    Eager,
}

/// The command line.
#[derive(Debug)]
pub struct Options {
    pub op: Op,
    pub dtype: DType,
    pub redop: RedOp,
    pub root: u32,
    pub min_bytes: Option<u64>,
    pub max_bytes: Option<u64>,
    pub factor: Option<u64>,
    pub iters: Option<u32>,
    pub warmup: Option<u32>,
    /// Graph replays per size (`-G`); 0: eager.
    pub graph: u32,
    pub check: bool,
    pub devices: Option<Vec<i32>>,
    pub backend: Option<Backend>,
    pub csv: Option<PathBuf>,
    pub json: Option<PathBuf>,
    pub quiet: bool,
    pub memory: Memory,
    pub inplace: bool,
    /// Timed calls per rank and size in host-overhead mode; 0: off.
    pub host_overhead: u32,
    /// `--host-launch`; `None`: the backend's default.
    pub host_launch: Option<HostLaunch>,
    /// `--ce-min-bytes`: the copy-engine threshold to export as `MCAST_CE_MIN_BYTES`.
    pub ce_min_bytes: Option<u64>,
    /// `--procs`: processes to start, one rank each.
    pub procs: Option<usize>,
    /// `--visible`: each rank's `CUDA_VISIBLE_DEVICES`.
    pub visible: Option<Vec<String>>,
    /// `--domains`: each rank's `MCAST_DOMAIN`.
    pub domains: Option<Vec<String>>,
    /// `--net`: `MCAST_NET` for every rank.
    pub net: Option<String>,
}

/// Why the run stopped: bad usage (exit 2) or a runtime failure (exit 1).
pub enum Failure {
    Usage(String),
    Runtime(String),
}

pub fn usage(msg: impl Into<String>) -> Failure {
    Failure::Usage(msg.into())
}

pub fn runtime(msg: impl Into<String>) -> Failure {
    Failure::Runtime(msg.into())
}

/// `f` with `errors` (from cleaning up after it) appended to its message.
pub fn with_errors(f: Failure, errors: Vec<String>) -> Failure {
    match f {
        Failure::Runtime(m) if !errors.is_empty() => runtime(format!("{m}; then, cleaning up: {}", errors.join("; "))),
        other => other,
    }
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

/// Options that take a value.
const VALUED: [&str; 34] = [
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
    "--ce-min-bytes",
    "--host-overhead",
    "--host-launch",
    "--procs",
    "--visible",
    "--domains",
    "--net",
];

/// Parses the arguments; `Ok(None)` means help was printed.
pub fn parse_args(args: &[String]) -> Result<Option<Options>, Failure> {
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
        host_overhead: 0,
        host_launch: None,
        ce_min_bytes: None,
        procs: None,
        visible: None,
        domains: None,
        net: None,
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
        if !VALUED.contains(&flag) {
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
        set(&mut o, flag, v)?;
    }
    if let (Some(b), Some(e)) = (o.min_bytes, o.max_bytes) {
        if b > e {
            return Err(usage(format!("-b {b} is larger than -e {e}")));
        }
    }
    if o.host_overhead > 0 && o.graph > 0 {
        return Err(usage(
            "-G times the device and --host-overhead the host: give one (--host-launch capture records the calls in \
             a CUDA graph)",
        ));
    }
    if o.host_launch.is_some() && o.host_overhead == 0 {
        return Err(usage("--host-launch applies to --host-overhead N only"));
    }
    if let Some(n) = o.procs {
        for (flag, list) in [("--visible", &o.visible), ("--domains", &o.domains)] {
            if let Some(l) = list.as_ref().filter(|l| l.len() != n) {
                return Err(usage(format!("{flag} has {} entries for --procs {n}: give one per rank", l.len())));
            }
        }
        if let Some(d) = o.devices.as_ref().filter(|d| d.len() != n) {
            return Err(usage(format!(
                "--devices has {} entries for --procs {n}: with one process per rank give one device per rank",
                d.len()
            )));
        }
        if o.host_overhead > 0 {
            return Err(usage("--host-overhead times the calls of one process driving every rank: drop --procs"));
        }
    }
    Ok(Some(o))
}

/// Sets the option `flag` (one of [`VALUED`]) to `v`.
fn set(o: &mut Options, flag: &str, v: String) -> Result<(), Failure> {
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
            o.dtype = DType::parse(&v)
                .ok_or_else(|| usage(format!("{flag} {v:?}: expected f32, f64, f16, bf16, i32, u32, i64 or u64")))?
        }
        "-o" | "--redop" => {
            o.redop = RedOp::parse(&v).ok_or_else(|| usage(format!("{flag} {v:?}: expected sum, min or max")))?
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
        "--host-overhead" => {
            o.host_overhead = parse_num(flag, &v, "a number of timed calls per rank and size >= 0 (0: off)")?
        }
        "--host-launch" => {
            o.host_launch = Some(match v.as_str() {
                "capture" => HostLaunch::Capture,
                "eager" => HostLaunch::Eager,
                _ => return Err(usage(format!("--host-launch {v:?}: expected capture or eager"))),
            })
        }
        "--ce-min-bytes" => match parse_bytes(&v) {
            Some(n) => o.ce_min_bytes = Some(n),
            None => return Err(usage(format!("--ce-min-bytes {v:?}: expected a byte count such as 64M, or 0 (off)"))),
        },
        "--procs" => {
            let n: usize = parse_num(flag, &v, "a number of processes >= 1")?;
            if n == 0 || n > MAX_RANKS {
                return Err(usage(format!("{flag} {v:?}: between 1 and {MAX_RANKS} processes")));
            }
            o.procs = Some(n);
        }
        "--visible" => {
            let list: Vec<String> = v.split(',').map(|e| e.trim().replace(':', ",")).collect();
            let ok = |e: &String| e.split(',').all(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()));
            if !list.iter().all(ok) {
                return Err(usage(format!(
                    "--visible {v:?}: expected one device list per rank, like 0,1 (':' within a rank's list: 0:1,1:0)"
                )));
            }
            o.visible = Some(list);
        }
        "--domains" => {
            let list: Vec<String> = v.split(',').map(|e| e.trim().to_string()).collect();
            if list.iter().any(|e| e.is_empty() || e.contains(char::is_whitespace)) {
                return Err(usage(format!("--domains {v:?}: expected one label per rank, like A,A,B,B")));
            }
            o.domains = Some(list);
        }
        "--net" => {
            o.net = match v.as_str() {
                "auto" | "nccl" | "none" | "mpi" => Some(v),
                _ => return Err(usage(format!("--net {v:?}: expected auto, nccl, none or mpi"))),
            }
        }
        "--csv" => o.csv = Some(PathBuf::from(v)),
        "--json" => o.json = Some(PathBuf::from(v)),
        _ => unreachable!("every valued flag is handled"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Result<Option<Options>, Failure> {
        parse_args(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn bad_arguments_are_usage_errors() {
        for bad in [
            &["--nope"][..],
            &["-b"],
            &["-b", "0"],
            &["-f", "1"],
            &["--devices", ""],
            &["-c", "yes"],
            &["--host-overhead", "-3"],
            &["--host-overhead", "10", "-G", "2"],
            &["--host-launch", "capture"],
            &["--host-overhead", "10", "--host-launch", "later"],
            &["--procs", "0"],
            &["--procs", "2", "--visible", "0"],
            &["--procs", "2", "--visible", "0,x"],
            &["--procs", "2", "--domains", "A,B,C"],
            &["--procs", "2", "--devices", "0"],
            &["--procs", "2", "--host-overhead", "10"],
            &["--net", "carrier-pigeon"],
        ] {
            assert!(matches!(args(bad), Err(Failure::Usage(_))), "{bad:?}");
        }
        let o = args(&["--op=all_gather", "-d", "bfloat16", "-b", "8K", "--devices", "0,0"]).ok().flatten().unwrap();
        assert_eq!((o.op, o.dtype, o.min_bytes, o.devices), (Op::AllGather, DType::BF16, Some(8192), Some(vec![0, 0])));
        let o = args(&["--host-overhead=500", "--host-launch", "eager"]).ok().flatten().unwrap();
        assert_eq!((o.host_overhead, o.host_launch), (500, Some(HostLaunch::Eager)));
        let o = args(&["--ce-min-bytes", "256M"]).ok().flatten().unwrap();
        assert_eq!(o.ce_min_bytes, Some(256 << 20));
        assert_eq!(args(&["--ce-min-bytes=0"]).ok().flatten().unwrap().ce_min_bytes, Some(0));
        assert!(matches!(args(&["--ce-min-bytes", "lots"]), Err(Failure::Usage(_))));
        let o = args(&["--procs", "2", "--visible=0:1,1", "--domains", "A,B", "--net", "nccl"]).ok().flatten().unwrap();
        assert_eq!(o.procs, Some(2));
        assert_eq!(o.visible, Some(vec!["0,1".to_string(), "1".to_string()]));
        assert_eq!((o.domains, o.net), (Some(vec!["A".to_string(), "B".to_string()]), Some("nccl".to_string())));
    }
}
