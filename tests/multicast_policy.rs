//! The multicast policy end to end on the simulator, through the C API, in child processes of
//! this binary that each get exactly the environment of their case (a kill switch lives in the
//! process environment; the caller's own switches and `MCAST_MULTICAST` are removed first):
//! with multicast off (by the config, by `MCAST_MULTICAST=off`, or by each NVLS kill switch) no
//! `cuMulticast*` driver function is called from context creation to destroy (device info, team
//! creation, buffer alloc, `mcast_mem_alloc` and registration, collectives), the team is P2P and
//! its reason names what turned multicast off; with multicast on those calls are made. Also: a
//! simulated context's `Config::sim_host_env` is honoured like the environment.

mod common;

use std::ffi::{c_void, CStr};
use std::process::Command;

use common::*;
use mcast::capi::buffer::*;
use mcast::capi::collective::*;
use mcast::capi::config::*;
use mcast::capi::context::*;
use mcast::capi::device::*;
use mcast::capi::memory::*;
use mcast::capi::team::*;
use mcast::runtime::handles;
use mcast::runtime::team::{Team, Transport};

/// The case a child runs (see [`CASES`]); unset in the parent.
const CASE: &str = "MCAST_TEST_POLICY_CASE";

/// A case: its name, the variable set in the child's environment, and the text the transport
/// reason must contain (`None`: multicast is on).
type Case = (&'static str, Option<(&'static str, &'static str)>, Option<&'static str>);

const CASES: [Case; 7] = [
    ("on", None, None),
    ("config-off", None, Some("multicast is off")),
    ("env-off", Some(("MCAST_MULTICAST", "off")), Some("multicast is off")),
    ("nccl", Some(("NCCL_NVLS_ENABLE", "0")), Some("NCCL_NVLS_ENABLE=0")),
    ("torch", Some(("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")), Some("TORCH_SYMM_MEM_DISABLE_MULTICAST=1")),
    ("nvshmem", Some(("NVSHMEM_DISABLE_NVLS", "1")), Some("NVSHMEM_DISABLE_NVLS=1")),
    ("mscclpp", Some(("MSCCLPP_FORCE_DISABLE_NVLS", "1")), Some("MSCCLPP_FORCE_DISABLE_NVLS=1")),
];

fn c_text(chars: &[std::ffi::c_char]) -> String {
    // SAFETY: the library NUL-terminates every text field it writes.
    unsafe { CStr::from_ptr(chars.as_ptr()) }.to_string_lossy().into_owned()
}

fn ok(s: mcast::capi::status::mcast_status_t, what: &str) {
    assert_eq!(s, OK, "{what}: {}", last_error());
}

/// Runs `case` in a child process and returns its report line (`cuMulticast calls: ...`).
fn run_case(case: &str, var: Option<(&str, &str)>) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    hermetic_command(&mut cmd)
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CASE, case)
        .env_remove("MCAST_SIM_FAULTS");
    if let Some((k, v)) = var {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "case {case}: {:?}\n{text}", out.status);
    // A child that ran no test would exit 0 too: its report line proves the scenario ran.
    let marker = format!("case {case}: cuMulticast calls:");
    let line = text.lines().find_map(|l| l.find(&marker).map(|at| &l[at..]));
    let line = line.unwrap_or_else(|| panic!("case {case}: no report line\n{text}")).to_string();
    println!("{line}");
    line
}

#[test]
fn no_multicast_call_when_multicast_is_off() {
    if on_gpu() {
        return;
    }
    for (case, var, _) in &CASES[1..] {
        let line = run_case(case, *var);
        assert!(line.ends_with("cuMulticast calls: 0 []"), "{line}");
    }
}

#[test]
fn multicast_calls_are_made_when_on() {
    if on_gpu() {
        return;
    }
    let line = run_case("on", None);
    for f in ["cuMulticastGetGranularity", "cuMulticastCreate", "cuMulticastAddDevice", "cuMulticastUnbind"] {
        assert!(line.contains(f), "{line}");
    }
}

/// The scenario of one case, in a child process (returns at once in the parent).
#[test]
fn child() {
    let Ok(case) = std::env::var(CASE) else { return };
    let (_, _, reason) = CASES.iter().find(|(c, _, _)| *c == case).expect("a known case");
    let mut config = std::mem::MaybeUninit::<mcast_config_t>::uninit();
    // SAFETY: a valid pointer; mcast_config_init writes every field (and reads MCAST_MULTICAST).
    let mut config = unsafe {
        mcast_config_init(config.as_mut_ptr());
        config.assume_init()
    };
    config.backend = mcast_backend_t(McastBackend::MCAST_BACKEND_SIM as u32);
    config.sim_devices = 2;
    config.sim_device_memory = 256 * MIB as u64;
    config.timeout_ms = 20_000;
    if case == "config-off" {
        config.multicast = mcast_multicast_t(McastMulticast::MCAST_MULTICAST_OFF as u32);
    }
    // The C entry point itself: the process environment's switches apply.
    let mut ctx = mcast_context_t { id: 0 };
    // SAFETY: valid pointers.
    ok(unsafe { mcast_context_create(&config, &mut ctx) }, "context create");
    let runtime = handles::context(ctx.id).unwrap();

    for dev in 0..2 {
        // SAFETY: all-zero is a valid mcast_device_info_t.
        let mut info: mcast_device_info_t = unsafe { std::mem::zeroed() };
        info.struct_size = std::mem::size_of::<mcast_device_info_t>() as u32;
        // SAFETY: a valid pointer.
        ok(unsafe { mcast_device_get_info(ctx, dev, &mut info) }, "device info");
        let why = c_text(&info.multicast_reason);
        match reason {
            None => {
                assert_eq!((info.multicast_usable, why.as_str()), (1, ""));
                assert!(info.granularity_min > 0 && info.granularity_recommended >= info.granularity_min);
            }
            Some(r) => {
                assert_eq!(info.multicast_usable, 0);
                assert!(why.contains(r), "device {dev}: {why}");
                assert_eq!((info.granularity_min, info.granularity_recommended), (0, 0), "device {dev}");
            }
        }
    }

    let team = team_create(ctx, &[0, 1]).unwrap_or_else(|e| panic!("team create: {e:?}"));
    let info = team_info(team);
    let why = c_text(&info.transport_reason);
    match reason {
        None => assert_eq!(info.transport.0, McastTransport::MCAST_TRANSPORT_MULTICAST as u32, "{why}"),
        Some(r) => {
            assert_eq!(info.transport.0, McastTransport::MCAST_TRANSPORT_P2P as u32);
            assert!(why.contains(r), "{why}");
            assert_eq!(info.multicast_objects, 0);
        }
    }

    // A buffer, memory of mcast_mem_alloc registered, and an all-reduce on each, one thread per
    // rank; then everything freed and destroyed.
    let buf = alloc(team, 1 << 16).unwrap_or_else(|e| panic!("buffer alloc: {e:?}"));
    let mut mem = [std::ptr::null_mut::<c_void>(); 2];
    for (dev, p) in mem.iter_mut().enumerate() {
        // SAFETY: a valid pointer.
        ok(unsafe { mcast_mem_alloc(ctx, dev as i32, 1 << 16, p) }, "mem alloc");
    }
    let mut reg = mcast_buffer_t { id: 0 };
    // SAFETY: one pointer per rank, a valid out pointer.
    ok(unsafe { mcast_buffer_register(team, mem.as_ptr(), 1 << 16, &mut reg) }, "register");
    std::thread::scope(|s| {
        for r in 0..2 {
            s.spawn(move || {
                for b in [buf, reg] {
                    let stream = (r + 1) as usize as mcast_stream_t;
                    ok(mcast_all_reduce(b, r, 0, 1024, mcast_dtype_t(4), mcast_op_t(0), stream), "all-reduce");
                    ok(mcast_synchronize(team, r, stream), "synchronize");
                }
            });
        }
    });
    ok(mcast_buffer_free(reg), "free registered");
    for p in mem {
        ok(mcast_mem_free(ctx, p), "mem free");
    }
    ok(mcast_buffer_free(buf), "buffer free");
    ok(mcast_team_destroy(team), "team destroy");
    ok(mcast_context_destroy(ctx), "context destroy");

    let sim = sim(&runtime);
    assert!(sim.ledger().is_empty(), "{}", sim.ledger());
    let mut calls: Vec<&str> = sim.call_log().into_iter().filter(|f| f.starts_with("cuMulticast")).collect();
    let n = calls.len();
    calls.sort_unstable();
    calls.dedup();
    println!("case {case}: cuMulticast calls: {n} {calls:?}");
}

/// `Config::sim_host_env` stands for the environment on the simulator: a switch set there
/// makes a two-device team P2P and names it, whatever the process environment holds.
#[test]
fn a_simulated_context_honours_the_switches_of_its_config() {
    let switch = ("NVSHMEM_DISABLE_NVLS".to_string(), "1".to_string());
    let config = mcast::runtime::config::Config { sim_host_env: Some(vec![switch]), ..sim_runtime(true, 2, 5000) };
    let ctx = runtime_context(config);
    let team = Team::create(&ctx, &[0, 1]).unwrap();
    assert_eq!(team.transport(), Transport::P2P);
    let why = team.info().transport_reason;
    assert!(why.contains("site kill switch NVSHMEM_DISABLE_NVLS=1"), "{why}");
    team.destroy().unwrap();
    assert_eq!(sim(&ctx).call_log().iter().filter(|f| f.starts_with("cuMulticast")).count(), 0);
    assert_clean(&ctx);
}
