//! Which backend a context runs on, and saying so: backend AUTO without a usable CUDA driver
//! runs on the simulator and warns at the default log level, once per process, naming what was
//! missing and `MCAST_BACKEND=cuda`; `mcast_context_get_info` reports the backend and why. The
//! log is the process's stderr, so each case runs in a child process of this binary with
//! `MCAST_LOG` and `MCAST_BACKEND` as the case sets them.

mod common;

use std::ffi::CStr;
use std::process::{Command, Output};

use common::*;
use mcast::capi::config::*;
use mcast::capi::context::*;

/// The case a child runs; unset in the parent.
const CASE: &str = "MCAST_TEST_BACKEND_CASE";

/// The words of the fallback warning the tests look for.
const WARNING: &str = "running on the SIMULATOR";

fn child_output(case: &str, backend: Option<&str>) -> Output {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    hermetic_command(&mut cmd)
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CASE, case)
        .env_remove("MCAST_LOG")
        .env_remove("MCAST_BACKEND")
        // Where a GPU answers AUTO, nothing here may create a multicast object on it.
        .env("MCAST_MULTICAST", "off");
    if let Some(b) = backend {
        cmd.env("MCAST_BACKEND", b);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "case {case}: {:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The child's `backend=... reason=...` line.
fn reported(out: &Output) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    // (libtest prints "test child ... " before the test's own output, on the same line.)
    let line = stdout.lines().find_map(|l| l.split_once("reported: ").map(|(_, r)| r)).expect("the report line");
    let (backend, reason) = line.split_once(" | ").unwrap();
    (backend.to_string(), reason.to_string())
}

#[test]
fn auto_without_a_driver_warns_once_at_the_default_level_and_reports_the_simulator() {
    let out = child_output("two-contexts", None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains(WARNING)).collect();
    let (backend, reason) = reported(&out);
    if backend == "CUDA" {
        // A machine with a driver and a device: AUTO is CUDA, silently.
        assert!(warnings.is_empty(), "{stderr}");
        return;
    }
    assert_eq!(backend, "SIM");
    assert_eq!(warnings.len(), 1, "one warning for two contexts:\n{stderr}");
    let w = warnings[0];
    assert!(w.contains(" WARN "), "{w}");
    assert!(w.contains("libcuda.so.1") || w.contains("no device"), "names what was missing: {w}");
    assert!(w.contains("MCAST_BACKEND=cuda"), "says how to make it an error: {w}");
    assert!(reason.contains("using the simulator") && reason.contains("MCAST_BACKEND=cuda"), "{reason}");
    assert!(reason.contains("libcuda.so.1") || reason.contains("no device"), "{reason}");
}

#[test]
fn asking_for_the_simulator_does_not_warn() {
    let out = child_output("two-contexts", Some("sim"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains(WARNING), "{stderr}");
    assert_eq!(reported(&out), ("SIM".to_string(), "backend SIM requested".to_string()));
}

#[test]
fn asking_for_cuda_without_a_driver_is_an_error_naming_the_library() {
    let out = child_output("cuda", Some("cuda"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    if stdout.contains("reported: CUDA") {
        return; // a machine with a driver and a device
    }
    let line = stdout.lines().find_map(|l| l.split_once("refused: ").map(|(_, r)| r)).expect("the refusal line");
    assert!(line.starts_with("MCAST_ERROR_DRIVER_UNAVAILABLE"), "{line}");
    assert!(line.contains("libcuda.so.1") || line.contains("no device"), "{line}");
    assert!(!String::from_utf8_lossy(&out.stderr).contains(WARNING));
}

fn context_info(ctx: mcast_context_t) -> mcast_context_info_t {
    // SAFETY: all-zero is a valid mcast_context_info_t.
    let mut info: mcast_context_info_t = unsafe { std::mem::zeroed() };
    info.struct_size = std::mem::size_of::<mcast_context_info_t>() as u32;
    // SAFETY: a valid pointer whose struct_size is set.
    let s = unsafe { mcast_context_get_info(ctx, &mut info) };
    assert_eq!(s, st(mcast::capi::status::McastStatus::MCAST_SUCCESS), "{}", last_error());
    info
}

fn report(info: &mcast_context_info_t) {
    let backend = match info.backend.0 {
        b if b == McastBackend::MCAST_BACKEND_SIM as u32 => "SIM",
        b if b == McastBackend::MCAST_BACKEND_CUDA as u32 => "CUDA",
        b => panic!("backend {b} is neither SIM nor CUDA"),
    };
    // SAFETY: the library NUL-terminates the reason.
    let reason = unsafe { CStr::from_ptr(info.backend_reason.as_ptr()) }.to_string_lossy();
    println!("reported: {backend} | {reason}");
}

/// The child: `two-contexts` makes two contexts from the environment (`mcast_context_create`
/// with NULL), `cuda` one with backend CUDA, and prints what they report.
#[test]
fn child() {
    let Ok(case) = std::env::var(CASE) else { return };
    match case.as_str() {
        "two-contexts" => {
            let (mut a, mut b) = (mcast_context_t { id: 0 }, mcast_context_t { id: 0 });
            // SAFETY: valid out-pointers; NULL config means mcast_config_init's.
            unsafe {
                assert_eq!(mcast_context_create(std::ptr::null(), &mut a).0, 0, "{}", last_error());
                assert_eq!(mcast_context_create(std::ptr::null(), &mut b).0, 0, "{}", last_error());
            }
            let (ia, ib) = (context_info(a), context_info(b));
            assert_eq!(ia.backend, ib.backend);
            report(&ia);
            assert_eq!(mcast_context_destroy(a).0, 0);
            assert_eq!(mcast_context_destroy(b).0, 0);
        }
        "cuda" => {
            let mut config = std::mem::MaybeUninit::<mcast_config_t>::uninit();
            // SAFETY: a valid pointer; mcast_config_init writes every field.
            let mut config = unsafe {
                mcast_config_init(config.as_mut_ptr());
                config.assume_init()
            };
            config.backend = mcast_backend_t(McastBackend::MCAST_BACKEND_CUDA as u32);
            let mut ctx = mcast_context_t { id: 0 };
            // SAFETY: valid pointers.
            let s = unsafe { mcast_context_create(&config, &mut ctx) };
            if s.0 == 0 {
                report(&context_info(ctx));
                assert_eq!(mcast_context_destroy(ctx).0, 0);
            } else {
                // SAFETY: mcast_status_string returns a static NUL-terminated string.
                let name = unsafe { CStr::from_ptr(mcast::capi::status::mcast_status_string(s)) };
                println!("refused: {} {}", name.to_string_lossy(), last_error());
            }
        }
        other => panic!("unknown case {other}"),
    }
}

/// `mcast-info` or `mcast-bench` with backend AUTO and the default log level.
fn tool(bin: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(bin);
    hermetic_command(&mut cmd).env_remove("MCAST_LOG").env_remove("MCAST_BACKEND").env("MCAST_MULTICAST", "off");
    let out = cmd.args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{bin}: {:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn mcast_info_and_the_bench_header_print_the_version_and_the_backend() {
    let version = env!("CARGO_PKG_VERSION");
    let out = tool(env!("CARGO_BIN_EXE_mcast-info"), &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.lines().any(|l| l == format!("mcast {version}")), "{stdout}");
    let backend = stdout.lines().find(|l| l.starts_with("backend: ")).expect("a backend line");
    if backend.starts_with("backend: cuda") {
        return; // a machine with a driver and a device: the bench would time the GPU
    }
    assert!(backend.starts_with("backend: sim (") && backend.contains("MCAST_BACKEND=cuda"), "{backend}");
    assert_eq!(stderr.matches(WARNING).count(), 1, "{stderr}");

    let out = tool(env!("CARGO_BIN_EXE_mcast-bench"), &["-b", "1K", "-e", "1K", "--iters", "1", "--warmup", "0"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let header: Vec<&str> = stdout.lines().filter(|l| l.starts_with('#')).collect();
    assert!(header[0].starts_with(&format!("# mcast-bench {version}: ")), "{stdout}");
    let backend = header.iter().find(|l| l.starts_with("# backend: ")).expect("a backend line");
    assert!(backend.starts_with("# backend: sim (") && backend.contains("MCAST_BACKEND=cuda"), "{backend}");
    assert_eq!(String::from_utf8_lossy(&out.stderr).matches(WARNING).count(), 1);
}
