//! NVTX ranges on the simulator: a stand-in NVTX tool (`tests/nvtx/fake_tool.c`, compiled here
//! into a shared library) is named in `NVTX_INJECTION64_PATH` of a child process of this binary
//! that runs team creation, allocation, registration and collectives through the C API; the
//! tool records every range pushed and popped, and the test reads its log: the names (call,
//! bytes, dtype, op, root, team, rank) in the `mcast` domain, balanced. Also the cases without
//! ranges: `MCAST_NVTX=off`, a tool that fails to initialise, a relative path, no tool; and a
//! tool without domains (the default domain).

mod common;

use std::ffi::c_void;
use std::path::PathBuf;
use std::process::{Command, Output};

use common::*;
use mcast::capi::buffer::*;
use mcast::capi::collective::*;
use mcast::capi::context::*;
use mcast::capi::memory::*;
use mcast::capi::team::*;
use mcast::driver::sim::{library_allocations, CountingAlloc};

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

/// Set in the child.
const CHILD: &str = "MCAST_TEST_NVTX_CHILD";

/// The warm collective calls per rank the child counts allocations over (each a range).
const CALLS: usize = 20;

/// The ranges the child opens.
const RANGES: usize = 30 + 2 * CALLS;

/// The stand-in tool, built once per test binary run at a path of its own.
fn fake_tool() -> PathBuf {
    static LIB: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    LIB.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("nvtx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lib = dir.join("libfake_nvtx_tool.so");
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&lib)
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/nvtx/fake_tool.c"))
            .output()
            .expect("cc (a C compiler) runs");
        assert!(out.status.success(), "cc failed: {}", String::from_utf8_lossy(&out.stderr));
        lib
    })
    .clone()
}

/// Runs the scenario in a child with `vars` set (`NVTX_INJECTION64_PATH`, `MCAST_NVTX` and
/// `FAKE_NVTX_MODE` removed first) and returns its output and the tool's log ("" where the
/// tool wrote none).
fn run(case: &str, vars: &[(&str, &str)]) -> (Output, String) {
    let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("nvtx-{}-{case}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    hermetic_command(&mut cmd)
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("FAKE_NVTX_LOG", &log)
        .env_remove("NVTX_INJECTION64_PATH")
        .env_remove("MCAST_NVTX")
        .env_remove("FAKE_NVTX_MODE")
        .env_remove("MCAST_LOG");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "case {case}: {:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, std::fs::read_to_string(&log).unwrap_or_default())
}

/// The team handle the child printed.
fn team_of(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let at = stdout.find("nvtx-team=").expect("the child's team line");
    stdout[at + "nvtx-team=".len()..].split_whitespace().next().unwrap().to_string()
}

fn pushes(log: &str) -> Vec<&str> {
    log.lines().filter_map(|l| l.strip_prefix("push ")).collect()
}

/// Every pop closes a push of the same domain, and every push is closed.
fn assert_balanced(log: &str) {
    let mut open: Vec<&str> = Vec::new();
    for l in log.lines() {
        if let Some(rest) = l.strip_prefix("push ") {
            open.push(rest.split(' ').next().unwrap());
        } else if let Some(domain) = l.strip_prefix("pop ") {
            assert_eq!(open.pop(), Some(domain), "a pop without its push:\n{log}");
        }
    }
    assert!(open.is_empty(), "ranges left open: {open:?}\n{log}");
}

#[test]
fn every_collective_team_creation_and_registration_is_a_named_range() {
    let lib = fake_tool();
    let (out, log) = run("domain", &[("NVTX_INJECTION64_PATH", lib.to_str().unwrap())]);
    let team = team_of(&out);
    assert!(log.starts_with("init 16 16 3\ncreate mcast\n"), "the tool attached through the protocol:\n{log}");
    assert!(!log.contains("bad-attributes"), "{log}");
    assert_balanced(&log);
    let got = pushes(&log);
    let want = [
        "mcast mcast_team_create ranks=2".to_string(),
        format!("mcast mcast_buffer_alloc bytes=16384 team={team}"),
        format!("mcast mcast_all_reduce bytes=4096 dtype=f32 op=sum team={team} rank=0"),
        format!("mcast mcast_all_reduce bytes=4096 dtype=f32 op=sum team={team} rank=1"),
        format!("mcast mcast_all_gather bytes=2048 team={team} rank=1"),
        format!("mcast mcast_reduce_scatter_into bytes=1024 dtype=bf16 op=max team={team} rank=0"),
        format!("mcast mcast_synchronize team={team} rank=1"),
        "mcast mcast_mem_alloc bytes=4096 device=1".to_string(),
        format!("mcast mcast_buffer_register bytes=4096 team={team}"),
        format!("mcast mcast_team_broadcast bytes=256 root=1 team={team} rank=0"),
        format!("mcast mcast_team_all_reduce bytes=1024 dtype=i64 op=min team={team} rank=1"),
        "mcast mcast_buffer_free buffer=".to_string(),
        format!("mcast mcast_team_destroy team={team}"),
    ];
    for w in &want {
        assert!(got.iter().any(|g| g.starts_with(w.as_str())), "no range {w:?} in:\n{log}");
    }
    // Every range of the scenario, and nothing else: one per call made.
    assert_eq!(got.len(), RANGES, "{log}");
    // With a tool attached a warm call still allocates nothing: the name is written into the
    // thread's buffer, which the tool copies.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("nvtx-allocs=0"), "{stdout}");
}

#[test]
fn a_tool_without_domains_gets_ranges_in_the_default_domain() {
    let lib = fake_tool();
    let (out, log) = run("core", &[("NVTX_INJECTION64_PATH", lib.to_str().unwrap()), ("FAKE_NVTX_MODE", "core")]);
    let team = team_of(&out);
    assert!(!log.lines().any(|l| l.starts_with("create ")), "no domain: {log}");
    assert_balanced(&log);
    let want = format!("- mcast_all_reduce bytes=4096 dtype=f32 op=sum team={team} rank=1");
    assert!(pushes(&log).contains(&want.as_str()), "{log}");
}

#[test]
fn no_ranges_when_off_or_without_a_working_tool() {
    let lib = fake_tool();
    let lib = lib.to_str().unwrap();
    // MCAST_NVTX=off: the tool is never loaded.
    let (_, log) = run("off", &[("NVTX_INJECTION64_PATH", lib), ("MCAST_NVTX", "off")]);
    assert_eq!(log, "", "MCAST_NVTX=off");
    // No tool attached.
    let (out, log) = run("unset", &[]);
    assert_eq!(log, "");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("NVTX"), "nothing to say without a tool");
    // A tool whose InitializeInjectionNvtx2 fails: loaded, asked, then no ranges, and a warning.
    let (out, log) = run("fail", &[("NVTX_INJECTION64_PATH", lib), ("FAKE_NVTX_MODE", "fail")]);
    assert!(log.starts_with("init ") && pushes(&log).is_empty(), "{log}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("InitializeInjectionNvtx2 returned 0") && stderr.contains(lib), "{stderr}");
    // A relative path is refused by the rule for libraries named by variables.
    let (out, log) = run("relative", &[("NVTX_INJECTION64_PATH", "libfake_nvtx_tool.so")]);
    assert_eq!(log, "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("NVTX_INJECTION64_PATH=libfake_nvtx_tool.so: must be an absolute path"), "{stderr}");
    // A library that is not a tool.
    let (out, _) = run("not-a-tool", &[("NVTX_INJECTION64_PATH", "/nonexistent/libtool.so")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("NVTX_INJECTION64_PATH=/nonexistent/libtool.so: cannot be loaded"), "{stderr}");
    // MCAST_NVTX with a value it does not know: a warning, then as auto.
    let (out, log) = run("bad-mode", &[("NVTX_INJECTION64_PATH", lib), ("MCAST_NVTX", "yes")]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("MCAST_NVTX=\"yes\" is not one of auto, on, off"));
    assert!(!pushes(&log).is_empty());
}

fn ok(s: mcast::capi::status::mcast_status_t) {
    assert_eq!(s, OK, "{}", last_error());
}

/// The scenario: `RANGES` calls that open a range (see the list in the first test).
#[test]
fn child() {
    if std::env::var(CHILD).is_err() {
        return;
    }
    let mut ctx = mcast_context_t { id: 0 };
    let config = sim_config(2, |c| c.sim_device_memory = 256 << 20);
    // SAFETY: valid pointers.
    ok(unsafe { mcast_context_create(&config, &mut ctx) });
    let team = team_create(ctx, &[0, 1]).unwrap(); // 1
    println!("nvtx-team={:#x}", team.id);
    let buf = alloc(team, 16384).unwrap(); // 2
    let f32_ = mcast_dtype_t(McastDtype::MCAST_FLOAT32 as u32);
    let sum = mcast_op_t(McastOp::MCAST_SUM as u32);
    let (null, s) = (std::ptr::null_mut(), std::ptr::null_mut());
    for rank in 0..2 {
        ok(mcast_all_reduce(buf, rank, 0, 1024, f32_, sum, s)); // 3, 4
    }
    for rank in 0..2 {
        ok(mcast_all_gather(buf, rank, 0, 2048, s)); // 5, 6
    }
    // Once warm, a collective's call allocates nothing, its range's name included (counted on
    // this thread, without the simulated device's own work); uncounted calls are ranges too.
    let a0 = library_allocations();
    for _ in 0..CALLS {
        for rank in 0..2 {
            ok(mcast_all_reduce(buf, rank, 0, 1024, f32_, sum, s));
        }
    }
    println!("nvtx-allocs={}", library_allocations() - a0);
    let bf16 = mcast_dtype_t(McastDtype::MCAST_BFLOAT16 as u32);
    let max = mcast_op_t(McastOp::MCAST_MAX as u32);
    for rank in 0..2 {
        ok(mcast_reduce_scatter_into(buf, 0, buf, 8192, rank, 512, bf16, max, s));
        // 7, 8
    }
    for rank in 0..2 {
        ok(mcast_synchronize(team, rank, s)); // 9, 10
    }
    let mut mem: [*mut c_void; 2] = [null; 2];
    for (dev, m) in mem.iter_mut().enumerate() {
        // SAFETY: a valid out-pointer.
        ok(unsafe { mcast_mem_alloc(ctx, dev as i32, 4096, m) }); // 11, 12
    }
    let mut reg = mcast_buffer_t { id: 0 };
    // SAFETY: one pointer per rank, a valid out-pointer.
    ok(unsafe { mcast_buffer_register(team, mem.as_ptr(), 4096, &mut reg) }); // 13
    for rank in 0..2 {
        let m = mem[rank as usize];
        ok(mcast_team_broadcast(team, rank, 1, m, m, 256, s)); // 14, 15
    }
    let i64_ = mcast_dtype_t(McastDtype::MCAST_INT64 as u32);
    let min = mcast_op_t(McastOp::MCAST_MIN as u32);
    for rank in 0..2 {
        let m = mem[rank as usize];
        ok(mcast_team_all_reduce(team, rank, m, m, 128, i64_, min, s)); // 16, 17
    }
    for rank in 0..2 {
        ok(mcast_synchronize(team, rank, s)); // 18, 19
    }
    ok(mcast_buffer_free(reg)); // 20
    for m in mem {
        ok(mcast_mem_free(ctx, m)); // 21, 22
    }
    ok(mcast_buffer_free(buf)); // 23
    ok(mcast_team_destroy(team)); // 24
                                  // A split: the parent and each new team.
    let team = team_create(ctx, &[0, 1]).unwrap(); // 25
    let mut halves = [mcast_team_t { id: 0 }; 2];
    // SAFETY: one color, key and out element per rank.
    ok(unsafe { mcast_team_split(team, [0, 1].as_ptr(), [0, 0].as_ptr(), halves.as_mut_ptr()) }); // 26
    for h in halves {
        ok(mcast_team_destroy(h)); // 27, 28
    }
    ok(mcast_team_destroy(team)); // 29
    ok(mcast_team_destroy(mcast_team_t { id: 0 })); // 30: the zero handle, a range all the same
    ok(mcast_context_destroy(ctx));
}
