//! `mcast-bench` with one process per rank, on the simulator: `--procs N` (the launcher starts
//! N copies of itself) and `mpirun` (each process one rank, the id from env mode): the table,
//! the header that makes the two modes comparable, and what a failing or killed rank does.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_mcast-bench");

/// `program` for the simulator, hermetic ([`common::hermetic_command`]), and without anything
/// that would make the bench a rank of someone else's team.
fn sim_command(program: &str) -> Command {
    let mut c = Command::new(program);
    common::hermetic_command(&mut c).env("MCAST_BACKEND", "sim");
    for v in [
        "MCAST_SIM_DEVICES",
        "MCAST_SIM_FAULTS",
        "MCAST_BENCH_RANK",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "PMI_RANK",
        "PMI_SIZE",
        "MCAST_DOMAIN",
        "MCAST_NET",
        "MCAST_BOOTSTRAP_ADDR",
        "MCAST_BOOTSTRAP_SECRET",
        "MCAST_HOST_ID",
    ] {
        c.env_remove(v);
    }
    c
}

fn bench_command() -> Command {
    sim_command(BIN)
}

fn bench(args: &[&str]) -> Output {
    bench_command().args(args).output().expect("mcast-bench runs")
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The result rows on stdout, split into columns.
fn rows(out: &Output) -> Vec<Vec<String>> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

/// The header line that starts with `prefix`.
fn header(out: &Output, prefix: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix:?} line: {}", text(out))).into()
}

#[test]
fn two_and_three_processes_print_one_checked_table() {
    for (n, extra) in [(2, &["-G", "2", "-d", "bf16"][..]), (3, &["--op", "reduce_scatter", "--memory", "registered"])]
    {
        let mut args = vec!["--procs", if n == 2 { "2" } else { "3" }, "-b", "1K", "-e", "16K", "-n", "2"];
        args.extend_from_slice(extra);
        let out = bench(&args);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(0), "{all}");
        // One table (rank 0's): one row per size, nothing wrong, time and busbw measured.
        let rows = rows(&out);
        assert_eq!(rows.len(), 3, "{all}");
        for row in &rows {
            assert_eq!(row.len(), 9, "{row:?}");
            assert_eq!(row[8], "0", "#wrong over every rank: {row:?}");
            // Measured (the busbw column may round to 0.000 on a loaded simulator).
            assert!(row[5].parse::<f64>().unwrap() > 0.0 && row[7].parse::<f64>().is_ok(), "{row:?}");
        }
        assert!(header(&out, "# mcast-bench").ends_with("one process per rank"), "{all}");
        // Every rank's process in the header, each with its own pid.
        let pids: std::collections::BTreeSet<String> = (0..n)
            .map(|r| header(&out, &format!("#   rank {r:>2}: device {r} ")).rsplit("pid ").next().unwrap().into())
            .collect();
        assert_eq!(pids.len(), n, "{all}");
        assert!(header(&out, "# grid: transport MULTICAST, up to 132 blocks per kernel").contains("agreed"), "{all}");
        if n == 2 {
            assert!(header(&out, "# mode: graph").contains("replayed 2 time(s)"), "{all}");
        }
    }
}

/// The point of the mode: one process per rank, each seeing one GPU as its device 0, gets the
/// transport and grid of one process driving both GPUs.
#[test]
fn one_visible_gpu_per_process_matches_one_process() {
    let common = ["-d", "bf16", "-b", "8K", "-e", "32K", "-n", "2", "-G", "2"];
    let procs = bench(&[&["--procs", "2", "--visible", "0,1"][..], &common].concat());
    let one = bench(&[&["--devices", "0,1"][..], &common].concat());
    assert_eq!(procs.status.code(), Some(0), "{}", text(&procs));
    assert_eq!(one.status.code(), Some(0), "{}", text(&one));
    assert!(header(&procs, "#   rank  1: ").contains("device 0 (CUDA_VISIBLE_DEVICES=1)"), "{}", text(&procs));
    for prefix in ["# transport:", "# NVLink domains: 1 (2 rank(s) each)", "# grid:"] {
        assert_eq!(header(&procs, prefix), header(&one, prefix), "{}\n{}", text(&procs), text(&one));
    }
    let sizes = |o: &Output| rows(o).iter().map(|r| r[..5].to_vec()).collect::<Vec<_>>();
    assert_eq!(sizes(&procs), sizes(&one));
}

/// A rank's bad usage or refused team fails the run with the rank's message; the launcher's
/// status is the rank's (2 for usage), and the other ranks are stopped.
#[test]
fn a_failing_rank_fails_the_run_with_its_message() {
    let out = bench(&["--procs", "2", "--devices", "0,9", "-b", "1K", "-e", "1K"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(2), "{all}");
    assert!(all.contains("rank 1: --devices: device 9 is out of range"), "{all}");
    assert!(all.contains("rank 1 (pid "), "{all}");

    // Several NVLink domains and no engine between them: refused, promptly, naming them.
    let started = Instant::now();
    let out = bench(&["--procs", "4", "--domains", "A,A,B,B", "--net", "none", "-b", "1K", "-e", "1K"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("2 NVLink domains: MCAST_DOMAIN=A (ranks 0, 1), MCAST_DOMAIN=B (ranks 2, 3)"), "{all}");
    assert!(started.elapsed() < Duration::from_secs(20), "{all}");

    for bad in [&["--procs", "2", "--visible", "0"][..], &["--visible", "0,1"], &["--procs", "2", "--net", "x"]] {
        assert_eq!(bench(bad).status.code(), Some(2), "{bad:?}");
    }
}

/// The pids whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let mut kids = vec![];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // pid (comm) state ppid ...: the comm may hold spaces, so split after its ')'.
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if ppid == Some(parent) {
            kids.push(pid);
        }
    }
    kids
}

fn alive(pid: u32) -> bool {
    // A zombie is dead: it only waits to be reaped.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next().map(|st| st != "Z")))
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// A rank killed mid-run: the launcher stops the other, exits non-zero naming the signal, and
/// leaves no process behind.
#[test]
fn a_killed_rank_fails_the_run_and_leaves_no_process() {
    let mut launcher = bench_command()
        .args(["--procs", "2", "-b", "1K", "-e", "1K", "-n", "1000000", "-w", "0", "-c", "0", "-q"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let kids = loop {
        let kids = children_of(launcher.id());
        if kids.len() == 2 || Instant::now() > deadline {
            break kids;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(kids.len(), 2, "the launcher starts two processes");
    // Let them join the team and start timing.
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill(2) on a child of our child, found just above.
    assert_eq!(unsafe { libc::kill(kids[1] as i32, libc::SIGKILL) }, 0);
    let status = loop {
        if let Some(st) = launcher.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = launcher.kill();
            panic!("the launcher did not end after its rank was killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut launcher.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("rank 1 (pid {}) was killed by signal 9", kids[1])), "{stderr}");
    for pid in kids {
        assert!(!alive(pid), "rank process {pid} outlived the launcher");
    }
}

/// `mpirun -np n` of the bench with `args` on the simulator, the ranks meeting at a free port of
/// loopback (env mode), `env` exported to every rank too; `None` where mpirun is not installed.
fn mpirun(n: usize, args: &[&str], env: &[(&str, &str)]) -> Option<Command> {
    if Command::new("mpirun").arg("--version").output().is_err() {
        eprintln!("mpirun not found: skipped");
        return None;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut c = sim_command("mpirun");
    c.env("MCAST_BOOTSTRAP_ADDR", format!("127.0.0.1:{port}"))
        .env("MCAST_BOOTSTRAP_SECRET", "5b0e9d27c4f1a3866a1fd0c3e97b4528")
        .args(["-np", &n.to_string(), "--allow-run-as-root", "--oversubscribe"])
        .args(["-x", "MCAST_BACKEND", "-x", "MCAST_BOOTSTRAP_ADDR", "-x", "MCAST_BOOTSTRAP_SECRET"]);
    for &(k, v) in env {
        c.env(k, v).args(["-x", k]);
    }
    c.arg(BIN).args(args);
    Some(c)
}

/// Under mpirun every process is one rank; the ranks meet at MCAST_BOOTSTRAP_ADDR (env mode).
/// Skipped where mpirun is not installed.
#[test]
fn under_mpirun_each_process_is_a_rank() {
    let Some(mut mpirun) = mpirun(2, &["-b", "1K", "-e", "4K", "-n", "2"], &[]) else { return };
    let out = mpirun.output().unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert_eq!(rows(&out).len(), 2, "rank 0's table only: {all}");
    assert!(header(&out, "# mcast-bench").ends_with("one process per rank"), "{all}");

    // Without the address: a usage error saying what to set.
    let out = mpirun.env_remove("MCAST_BOOTSTRAP_ADDR").output().unwrap();
    assert!(!text(&out).contains("# mcast-bench"), "no rank ran: {}", text(&out));
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("MCAST_BOOTSTRAP_ADDR"), "{}", text(&out));
}

/// `--net mpi` under mpirun: libmcast_mpi (built here with mpicc from mpi/mcast_mpi.c, loaded by
/// the bench at run time) carries the rails of a team of 2 domains (`--domains`), and every op's
/// results check. Without mpirun it is a usage error. Skipped where mpicc is not installed.
#[test]
fn under_mpirun_mpi_is_the_engine_between_domains() {
    assert_eq!(bench(&["--procs", "2", "--net", "mpi"]).status.code(), Some(2));
    assert_eq!(bench(&["--net", "mpi"]).status.code(), Some(2));
    if Command::new("mpicc").arg("--version").output().is_err() {
        eprintln!("mpicc not found: skipped");
        return;
    }
    let lib = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("bench_procs-{}-libmcast_mpi.so", std::process::id()));
    let root = env!("CARGO_MANIFEST_DIR");
    let built = Command::new("mpicc")
        .args(["-O2", "-shared", "-fPIC", "-I", &format!("{root}/include"), &format!("{root}/mpi/mcast_mpi.c")])
        .arg("-o")
        .arg(&lib)
        .args(["-lm", "-ldl"])
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", text(&built));
    for op in ["all_reduce", "reduce_scatter", "all_gather", "broadcast"] {
        let args = ["--net", "mpi", "--domains", "A,A,B,B", "--op", op, "-b", "4K", "-e", "16K", "-n", "2"];
        let Some(mut c) = mpirun(4, &args, &[("MCAST_MPI_LIBRARY", lib.to_str().unwrap())]) else { return };
        let out = c.output().unwrap();
        let all = text(&out);
        assert_eq!(out.status.code(), Some(0), "{op}: {all}");
        assert_eq!(header(&out, "# NVLink domains:"), "# NVLink domains: 2 (2 rank(s) each), engine between them: mpi");
        let rows = rows(&out);
        assert_eq!(rows.len(), 2, "{op}: {all}");
        assert!(rows.iter().all(|r| r[8] == "0"), "{op}: {all}");
    }
}
