//! One process per rank: who this process is ([`role`]), the launcher of `--procs N`
//! ([`launch`]), and the [`Exchange`] through which the ranks' processes agree on what one
//! process knows by itself (the slowest rank's time, the wrong elements, a failed setup).
//!
//! `--procs N` starts N copies of this executable with the same arguments, rank r in the r-th
//! (`MCAST_BENCH_RANK=r:N`), and writes the team's unique id (`mcast_get_unique_id`, made here,
//! whose listener lives in this process) to each copy's stdin, a pipe only that copy holds. It
//! then watches them: the first that fails or dies fails the run, and the others are killed. A
//! copy dies with its launcher (`PR_SET_PDEATHSIG`), so killing the launcher leaves nothing
//! behind either. Under `mpirun` (Open MPI's `OMPI_COMM_WORLD_RANK`/`SIZE`, or `PMI_RANK`/`SIZE`
//! of MPICH's Hydra) every process is one rank and the id comes from mcast's env mode
//! (`MCAST_BOOTSTRAP_ADDR` and `MCAST_BOOTSTRAP_SECRET`, the same in every process), so no
//! process has to hand it to the others.

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use mcast::capi::buffer::mcast_buffer_t;
use mcast::capi::team::mcast_team_t;
use mcast::driver::Stream;

use crate::api::{self, Plumbing};
use crate::args::{runtime, usage, Failure, Options};

/// The launcher's children: `r:N`, this process's rank and the team size.
const RANK_ENV: &str = "MCAST_BENCH_RANK";

/// This process's rank when it holds one rank of a team of several processes.
static RANK: OnceLock<usize> = OnceLock::new();

/// What this process does.
pub enum Role {
    /// Drives every rank of the team itself.
    One,
    /// Starts this many processes, one rank each, and watches them.
    Launch(usize),
    /// Is one rank of a team of several processes.
    Rank(RankOf),
}

/// One rank of a team of processes.
pub struct RankOf {
    pub rank: usize,
    pub nranks: usize,
    /// The rank's index among the processes of its host (its default device without `--visible`).
    pub local: usize,
    /// The team's unique id.
    pub id: [u8; 128],
}

/// True where this process prints the header and the table: one process, or rank 0.
pub fn prints() -> bool {
    RANK.get().is_none_or(|&r| r == 0)
}

/// `"rank r: "` before a message of a process holding one rank, else `""`.
pub fn who() -> String {
    RANK.get().map(|r| format!("rank {r}: ")).unwrap_or_default()
}

fn env_rank(rank: &str, size: &str) -> Option<(usize, usize)> {
    let get = |v: &str| std::env::var(v).ok()?.trim().parse::<usize>().ok();
    Some((get(rank)?, get(size)?))
}

/// Who this process is, from its options and environment. Before the context reads the
/// environment, a rank process sets its entries of `--visible` (`CUDA_VISIBLE_DEVICES`) and
/// `--domains` (`MCAST_DOMAIN`), and every process but the launcher `--net` (`MCAST_NET`, but
/// for `mpi`).
/// Must run while single-threaded.
pub fn role(o: &Options) -> Result<Role, Failure> {
    let launched = match std::env::var(RANK_ENV) {
        Ok(v) => Some(
            v.split_once(':')
                .and_then(|(r, n)| Some((r.parse::<usize>().ok()?, n.parse::<usize>().ok()?)))
                .filter(|(r, n)| r < n)
                .ok_or_else(|| runtime(format!("{RANK_ENV}={v:?}: expected rank:size")))?,
        ),
        Err(_) => None,
    };
    let mpi = env_rank("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")
        .map(|rn| (rn, env_rank("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE").map(|l| l.0)))
        .or_else(|| {
            env_rank("PMI_RANK", "PMI_SIZE").map(|rn| (rn, env_rank("MPI_LOCALRANKID", "PMI_SIZE").map(|l| l.0)))
        })
        .filter(|((_, n), _)| *n > 1);
    let (rank, nranks, local, id, mpirun) = match (launched, mpi) {
        (Some((r, n)), _) => {
            let mut hex = String::new();
            std::io::stdin()
                .take(1024)
                .read_to_string(&mut hex)
                .map_err(|e| runtime(format!("reading the team's id from the launcher: {e}")))?;
            let id = unhex(hex.trim()).ok_or_else(|| runtime("the launcher's id is not 256 hex digits"))?;
            (r, n, r, id, false)
        }
        (None, Some(((r, n), local))) => {
            if o.procs.is_some() {
                return Err(usage("--procs starts the ranks itself: under mpirun every process is already one rank"));
            }
            if std::env::var_os("MCAST_BOOTSTRAP_ADDR").is_none() {
                return Err(usage(
                    "under mpirun the ranks meet at MCAST_BOOTSTRAP_ADDR=ip:port with MCAST_BOOTSTRAP_SECRET=<32+ hex \
                     digits> (e.g. openssl rand -hex 16), both exported to every rank (mpirun -x)",
                ));
            }
            let id = api::unique_id().map_err(runtime)?;
            (r, n, local.unwrap_or(r), id, true)
        }
        (None, None) => {
            if o.net.as_deref() == Some("mpi") {
                return Err(usage("--net mpi runs under mpirun: each process one rank, MPI between the domains"));
            }
            if let Some(n) = o.procs {
                return Ok(Role::Launch(n));
            }
            for (flag, given) in [("--visible", o.visible.is_some()), ("--domains", o.domains.is_some())] {
                if given {
                    return Err(usage(format!("{flag} sets each rank's process apart: use it with --procs N")));
                }
            }
            set_net(o);
            return Ok(Role::One);
        }
    };
    let _ = RANK.set(rank);
    for (flag, list) in [("--visible", &o.visible), ("--domains", &o.domains)] {
        if let Some(l) = list.as_ref().filter(|l| l.len() != nranks) {
            return Err(usage(format!("{flag} has {} entries for {nranks} ranks: give one per rank", l.len())));
        }
    }
    if let Some(d) = o.devices.as_ref().filter(|d| d.len() != nranks) {
        return Err(usage(format!("--devices has {} entries for {nranks} ranks: give one per rank", d.len())));
    }
    if o.host_overhead > 0 {
        return Err(usage("--host-overhead times the calls of one process driving every rank"));
    }
    if let Some(v) = &o.visible {
        std::env::set_var("CUDA_VISIBLE_DEVICES", &v[rank]);
    }
    if let Some(d) = &o.domains {
        std::env::set_var("MCAST_DOMAIN", &d[rank]);
    }
    if o.net.as_deref() == Some("mpi") && !mpirun {
        return Err(usage("--net mpi runs under mpirun, not --procs: each process one rank, MPI between the domains"));
    }
    set_net(o);
    Ok(Role::Rank(RankOf { rank, nranks, local, id }))
}

/// `MCAST_NET` from `--net` (`mpi` is registered on the context instead: [`crate::mpi`]).
fn set_net(o: &Options) {
    if let Some(n) = o.net.as_deref().filter(|n| *n != "mpi") {
        std::env::set_var("MCAST_NET", n);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; 128]> {
    let mut id = [0u8; 128];
    if s.len() != 2 * id.len() || !s.is_ascii() {
        return None;
    }
    for (k, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * k..2 * k + 2], 16).ok()?;
    }
    Some(id)
}

/// What a child's exit status says.
fn describe(st: ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        _ => format!("ended: {st}"),
    }
}

/// `--procs n`: starts the ranks' processes and waits for them; the exit status is the run's.
pub fn launch(n: usize) -> ExitCode {
    match launched(n) {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("mcast-bench: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn launched(n: usize) -> Result<ExitCode, String> {
    let id = hex(&api::unique_id()?);
    let exe = std::env::current_exe().map_err(|e| format!("finding this executable: {e}"))?;
    let parent = std::process::id() as libc::pid_t;
    let mut children: Vec<Option<Child>> = vec![];
    for r in 0..n {
        let mut c = Command::new(&exe);
        c.args(std::env::args_os().skip(1)).env(RANK_ENV, format!("{r}:{n}")).stdin(Stdio::piped());
        // SAFETY: the closure runs in the child between fork and exec and calls only
        // async-signal-safe functions (prctl, getppid, _exit).
        unsafe {
            c.pre_exec(move || {
                // Die with the launcher; if it is already gone, do not start.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        match c.spawn() {
            Ok(child) => children.push(Some(child)),
            Err(e) => {
                stop(&mut children);
                return Err(format!("starting rank {r}'s process ({}): {e}", exe.display()));
            }
        }
    }
    for child in children.iter_mut().flatten() {
        // A child that is already gone shows in its exit status below.
        if let Some(mut pipe) = child.stdin.take() {
            let _ = pipe.write_all(format!("{id}\n").as_bytes());
        }
    }
    let mut code = ExitCode::SUCCESS;
    while children.iter().any(Option::is_some) {
        let mut failed = None;
        for (r, slot) in children.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            match child.try_wait() {
                Ok(None) => {}
                Ok(Some(st)) => {
                    let pid = child.id();
                    *slot = None;
                    if !st.success() {
                        failed = Some((r, pid, st));
                        break;
                    }
                }
                Err(e) => return Err(format!("waiting for rank {r}'s process: {e}")),
            }
        }
        if let Some((r, pid, st)) = failed {
            let others = stop(&mut children);
            let stopped =
                if others > 0 { format!("; stopped the {others} other rank(s) still running") } else { String::new() };
            eprintln!("mcast-bench: rank {r} (pid {pid}) {}{stopped}", describe(st));
            code = if st.code() == Some(2) { ExitCode::from(2) } else { ExitCode::FAILURE };
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(code)
}

/// Kills and reaps every child still running; returns how many there were.
fn stop(children: &mut [Option<Child>]) -> usize {
    let mut n = 0;
    for mut child in children.iter_mut().filter_map(Option::take) {
        if let Ok(None) = child.try_wait() {
            n += 1;
            let _ = child.kill();
        }
        let _ = child.wait();
    }
    n
}

/// Bytes each rank contributes to one exchange.
const RECORD: usize = 128;

/// The ranks' processes' own all-gather: a small buffer of the team and `mcast_all_gather` on a
/// stream of its own, then `mcast_synchronize`, so it is also a barrier. Made and freed
/// collectively (every rank at the same step).
pub struct Exchange {
    team: mcast_team_t,
    rank: usize,
    nranks: usize,
    device: i32,
    buf: mcast_buffer_t,
    stream: Stream,
}

impl Exchange {
    /// The exchange of `rank` of `nranks` on `device`.
    pub fn new(p: &Plumbing, team: mcast_team_t, rank: usize, nranks: usize, device: i32) -> Result<Exchange, Failure> {
        let stream = p.driver.stream_create(device).map_err(|e| runtime(format!("creating a stream: {e}")))?;
        match api::buffer_alloc(team, nranks * RECORD) {
            Ok(buf) => Ok(Exchange { team, rank, nranks, device, buf, stream }),
            Err(e) => {
                let _ = p.driver.stream_destroy(device, stream);
                Err(runtime(format!("allocating the ranks' exchange buffer: {e}")))
            }
        }
    }

    /// Every rank's `mine` (at most [`RECORD`] bytes, zero-padded), in rank order.
    pub fn gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, Failure> {
        let mut all = vec![0u8; self.nranks * RECORD];
        let len = mine.len().min(RECORD);
        all[self.rank * RECORD..self.rank * RECORD + len].copy_from_slice(&mine[..len]);
        let what = |e: String| runtime(format!("exchanging with the other ranks: {e}"));
        api::buffer_write(self.buf, self.rank, &all).map_err(what)?;
        api::all_gather(self.buf, self.rank, RECORD, self.stream).map_err(what)?;
        api::synchronize(self.team, self.rank, self.stream).map_err(what)?;
        api::buffer_read(self.buf, self.rank, &mut all).map_err(what)?;
        Ok(all.chunks(RECORD).map(<[u8]>::to_vec).collect())
    }

    /// The largest of every rank's `x`.
    pub fn max(&self, x: f64) -> Result<f64, Failure> {
        let all = self.gather(&x.to_le_bytes())?;
        Ok(all.iter().map(|b| f64::from_le_bytes(b[..8].try_into().expect("8 bytes"))).fold(f64::MIN, f64::max))
    }

    /// The sum of every rank's `x`.
    pub fn sum(&self, x: u64) -> Result<u64, Failure> {
        let all = self.gather(&x.to_le_bytes())?;
        Ok(all.iter().map(|b| u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))).sum())
    }

    /// True when any rank's `flag` is.
    pub fn any(&self, flag: bool) -> Result<bool, Failure> {
        Ok(self.gather(&[u8::from(flag)])?.iter().any(|b| b[0] != 0))
    }

    /// Every rank's `text` (cut to [`RECORD`] bytes).
    pub fn texts(&self, text: &str) -> Result<Vec<String>, Failure> {
        let all = self.gather(text.as_bytes())?;
        Ok(all.iter().map(|b| String::from_utf8_lossy(b).trim_end_matches('\0').to_string()).collect())
    }

    /// Frees the buffer (collectively) and the stream; returns the errors.
    pub fn release(self, p: &Plumbing) -> Vec<String> {
        let mut errors = vec![];
        if let Err(e) = api::buffer_free(self.buf) {
            errors.push(format!("freeing the exchange buffer: {e}"));
        }
        if let Err(e) = p.driver.stream_destroy(self.device, self.stream) {
            errors.push(format!("destroying the exchange stream: {e}"));
        }
        errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_travel_as_hex() {
        let id: [u8; 128] = std::array::from_fn(|k| (k * 7) as u8);
        assert_eq!(unhex(&hex(&id)), Some(id));
        assert_eq!(unhex(&hex(&id)[1..]), None);
        assert_eq!(unhex(&"zz".repeat(128)), None);
    }
}
