//! Compiles every kernel variant for sm_90 with the real NVRTC code path and checks the PTX:
//! the multimem build uses `multimem.ld_reduce`, `multimem.st` and `multimem.red`, the emulated
//! build none; every entry point is present and waits at its entry (`griddepcontrol.wait`);
//! NVRTC reports no warnings.
//!
//! Each selected module (one collective, dtype and operator: the shared part of `kernels/` and its
//! collective's file, as a call compiles it) compiles to exactly its entry points.
//!
//! Without NVRTC the test is skipped, unless `MCAST_REQUIRE_NVRTC=1` (set by
//! `scripts/check-kernels`) makes that a failure.

mod common;

use common::nvrtc_or_skip;
use mcast::kernels::abi::{KernelId, Variant};
use mcast::kernels::nvrtc;
use mcast::kernels::select::{Family, Unit};
use mcast::kernels::source;
use mcast::kernels::{DType, RedOp};

#[test]
fn every_kernel_variant_compiles_for_sm_90() {
    let Some(nv) = nvrtc_or_skip() else { return };
    eprintln!("NVRTC {:?} from {}", nv.version(), nv.path());
    let arch = std::env::var("MCAST_CHECK_ARCH").unwrap_or_else(|_| "sm_90".into());
    std::thread::scope(|s| {
        for variant in Variant::ALL {
            let arch = arch.clone();
            s.spawn(move || {
                let target = format!("{arch} {}", variant.name());
                let opts = nvrtc::options(&arch, variant);
                let (wall, cpu) = (std::time::Instant::now(), cpu_seconds());
                let out =
                    nv.compile(source::SOURCE, source::SOURCE_NAME, &opts, &target).unwrap_or_else(|e| panic!("{e}"));
                let (wall, cpu) = (wall.elapsed().as_secs_f64(), cpu_seconds() - cpu);
                assert!(out.log.is_empty(), "{target}: NVRTC log not empty:\n{}", out.log);
                assert!(out.cubin.len() > 1024, "{target}: cubin too small");
                let entries: Vec<KernelId> = KernelId::all().into_iter().filter(|k| k.exists()).collect();
                for id in &entries {
                    assert!(out.ptx.contains(&format!(".entry {}(", id.name())), "{target}: no entry {}", id.name());
                }
                // Every entry point waits for the kernel before it on its stream first
                // (MCAST_ENTRY, kernels/entry.cuh: programmatic dependent launch), from sm_90 on.
                if arch.trim_start_matches("sm_").trim_end_matches('a').parse::<u32>().is_ok_and(|cc| cc >= 90) {
                    let waits = out.ptx.matches("griddepcontrol.wait").count();
                    assert!(
                        waits >= entries.len(),
                        "{target}: {waits} griddepcontrol.wait for {} entries",
                        entries.len()
                    );
                }
                let count = |pat: &str| out.ptx.matches(pat).count();
                match variant {
                    Variant::Multimem => {
                        for pat in ["multimem.ld_reduce", "multimem.st", "multimem.red", "acc::f32"] {
                            assert!(count(pat) > 0, "{target}: no {pat} in PTX");
                        }
                    }
                    Variant::Emulated => assert_eq!(count("multimem."), 0, "{target}: multimem in emulated PTX"),
                }
                if let Ok(dir) = std::env::var("MCAST_CHECK_OUT") {
                    let _ = std::fs::create_dir_all(&dir);
                    let _ = std::fs::write(format!("{dir}/collectives-{arch}-{}.ptx", variant.name()), &out.ptx);
                }
                eprintln!(
                    "{target}: ok, every entry point, cubin {} bytes, compiled in {wall:.2} s ({cpu:.2} s CPU)",
                    out.cubin.len()
                );
            });
        }
    });
}

/// The modules a call compiles: one [`Unit`] (a collective for one dtype and operator, every
/// algorithm of it). Each compiles without warnings and holds exactly its unit's entry points;
/// the time of the first bf16 all-reduce's module (what a fresh machine waits for) is printed.
/// Representative units by default (with and without the LL kernels); `MCAST_CHECK_ALL_UNITS=1`
/// compiles all 50 (with them) in both variants.
#[test]
fn selected_units_compile_to_exactly_their_entry_points() {
    let Some(nv) = nvrtc_or_skip() else { return };
    let arch = std::env::var("MCAST_CHECK_ARCH").unwrap_or_else(|_| "sm_90".into());
    let all_units = std::env::var("MCAST_CHECK_ALL_UNITS").as_deref() == Ok("1");
    // A CUDA team's first bf16 all-reduce without the LL kernels (their default there), and with.
    let bf16_sum = Unit { family: Family::AllReduce, red: Some((DType::BF16, RedOp::Sum)), ll: false };
    let units: Vec<Unit> = if all_units {
        Unit::all()
    } else {
        vec![
            bf16_sum,
            Unit { ll: true, ..bf16_sum },
            Unit { family: Family::Broadcast, red: None, ll: false },
            Unit { family: Family::AllReduce, red: Some((DType::F32, RedOp::Min)), ll: true },
            Unit { family: Family::ReduceScatter, red: Some((DType::U64, RedOp::Max)), ll: true },
            Unit { family: Family::Broadcast, red: None, ll: true },
            Unit { family: Family::AllGather, red: None, ll: true },
        ]
    };
    let every: Vec<String> = KernelId::all().into_iter().filter(|k| k.exists()).map(|k| k.name()).collect();
    for variant in Variant::ALL {
        for &unit in &units {
            let target = format!("{arch} {} {}", variant.name(), unit.name());
            let mut opts = nvrtc::options(&arch, variant);
            opts.extend(unit.defines());
            let (wall, cpu) = (std::time::Instant::now(), cpu_seconds());
            // What a call compiles: the shared part and the unit's collective file only.
            let src = source::family_source(unit.family);
            let out = nv.compile(src, source::SOURCE_NAME, &opts, &target).unwrap_or_else(|e| panic!("{e}"));
            let (wall, cpu) = (wall.elapsed().as_secs_f64(), cpu_seconds() - cpu);
            assert!(out.log.is_empty(), "{target}: NVRTC log not empty:\n{}", out.log);
            let want: Vec<String> = unit.kernels().iter().map(|k| k.name()).collect();
            for name in &every {
                let has = out.ptx.contains(&format!(".entry {name}("));
                assert_eq!(has, want.contains(name), "{target}: entry {name} present: {has}");
            }
            if variant == Variant::Emulated {
                assert_eq!(out.ptx.matches("multimem.").count(), 0, "{target}: multimem in emulated PTX");
            }
            eprintln!(
                "{target}: {} entry points, cubin {} bytes, compiled in {wall:.2} s ({cpu:.2} s CPU){}",
                want.len(),
                out.cubin.len(),
                if unit == bf16_sum { "  <- the first bf16 all-reduce's module" } else { "" }
            );
        }
    }
}

/// CPU time of the calling thread, in seconds (NVRTC compiles on the calling thread, so under a loaded
/// machine this is the figure an idle one would show as wall time).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields after the command: state is 0, utime is 11, stime is 12; 100 ticks per second (Linux).
    (ticks(11) + ticks(12)) / 100.0
}
