//! The listeners under attack: connections that trickle, a process out of descriptors, and
//! other users at the host-local descriptor socket. Each case runs in a child process (this
//! test binary run again with `FLOOD_CHILD` naming the case), so its thread count, CPU time and
//! descriptor limit are its own and not those of the tests running beside it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use super::fdpass::{self, Local, Ready};
use super::tcp::{self, kind, SECRET_BYTES};
use super::*;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

mod floods;
mod misuse;
mod socket;
mod trickle;

use floods::*;
use misuse::*;
use socket::*;
use trickle::*;

const CHILD: &str = "FLOOD_CHILD";
const MAX: usize = 72;

/// Runs the case `case` in a child process, killed after `limit`; returns its output after
/// asserting it passed.
fn run_child(case: &str, prefix: &[&str], limit: Duration) -> String {
    run_child_env(case, prefix, &[], limit)
}

/// [`run_child`] with variables `env` set in the child.
fn run_child_env(case: &str, prefix: &[&str], env: &[(&str, &str)], limit: Duration) -> String {
    let exe = std::env::current_exe().unwrap();
    let mut c = match prefix.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    c.args(["--exact", "bootstrap::flood_tests::child", "--nocapture", "--test-threads=1"])
        .env(CHILD, case)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = c.spawn().unwrap();
    let pid = child.id() as libc::pid_t;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    let out = match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SAFETY: kill(2) of the child this test started (not yet reaped: the waiting
            // thread still holds it).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let out = rx.recv().unwrap().unwrap();
            panic!("case {case} ran past {limit:?}:\n{}", String::from_utf8_lossy(&out.stderr));
        }
    };
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "case {case} failed:\n{text}");
    assert!(text.contains("1 passed"), "case {case} did not run:\n{text}");
    text
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

/// CPU time (user + system) of this process so far.
fn cpu_time() -> Duration {
    // SAFETY: rusage is plain old data filled by getrusage.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// `n` thread ranks join the team of `id`; every rank on one host.
fn form(id: &[u8; ID_BYTES], n: usize) -> Vec<Bootstrap> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| s.spawn(move || Bootstrap::init_id(id, n as i64, r as i64, MAX, 10_000, "one".into()).unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The child side: runs the case named by `FLOOD_CHILD`; nothing without it.
#[test]
fn child() {
    // A process that only makes an id must log its listener's drops without this ("idlog").
    if std::env::var_os(CHILD).is_some_and(|c| c != "idlog") {
        crate::logging::init();
    }
    match std::env::var(CHILD).as_deref() {
        Ok("trickle") => trickle_case(),
        Ok("far") => far_case(),
        Ok("threads") => threads_case(),
        Ok("fdlimit") => fdlimit_case(),
        Ok("trickler") => trickler_case(),
        Ok("idlog") => idlog_case(),
        Ok("jobs") => jobs_case(),
        Ok("job-b") => job_b_case(),
        Ok("emfile") => emfile_case(),
        Ok("nobody") => nobody_case(),
        Ok(other) => panic!("unknown case {other}"),
        Err(_) => {}
    }
}
