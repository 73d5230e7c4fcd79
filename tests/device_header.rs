//! `include/mcast/device.h` under NVRTC, with no include path (the header handed to NVRTC by
//! name, as an application does with `mcast_device_header_source`): every function compiles for
//! sm_90 in each transport build and with `MCAST_DEV_DEBUG`, without warnings; the PTX has
//! `multimem.` instructions exactly where the multicast path is compiled in.
//!
//! Without NVRTC the tests are skipped, unless `MCAST_REQUIRE_NVRTC=1` makes that a failure.

mod common;

use common::nvrtc_or_skip;
use mcast::kernels::nvrtc::Nvrtc;

const HEADER: &str = include_str!("../include/mcast/device.h");
const USE_ALL: &str = include_str!("device/use_all.cu");

/// Compiles `source` (which includes "mcast/device.h") for sm_90 with `defines`; returns the PTX.
fn compile(nv: &Nvrtc, source: &str, defines: &[&str]) -> String {
    let mut opts = vec!["--gpu-architecture=sm_90".to_string(), "-std=c++17".to_string()];
    opts.extend(defines.iter().map(|d| d.to_string()));
    let target = format!("sm_90 {defines:?}");
    let out = nv
        .compile_with_headers(source, "app.cu", &[("mcast/device.h", HEADER)], &opts, &target)
        .unwrap_or_else(|e| panic!("{target}: {e}"));
    assert!(out.log.is_empty(), "{target}: NVRTC log not empty:\n{}", out.log);
    out.ptx
}

#[test]
fn every_function_compiles_in_every_build() {
    let Some(nv) = nvrtc_or_skip() else { return };
    let p2p = "-DMCAST_DEV_TRANSPORT=MCAST_DEV_TRANSPORT_P2P";
    let mc = "-DMCAST_DEV_TRANSPORT=MCAST_DEV_TRANSPORT_MULTICAST";
    for debug in [None, Some("-DMCAST_DEV_DEBUG")] {
        let with =
            |d: &[&str]| -> Vec<String> { d.iter().map(|s| s.to_string()).chain(debug.map(String::from)).collect() };
        let run = |d: &[&str]| {
            let v = with(d);
            compile(nv, USE_ALL, &v.iter().map(String::as_str).collect::<Vec<_>>())
        };
        let both = run(&[]);
        let p2p_only = run(&[p2p]);
        let mc_only = run(&[mc]);
        for (name, ptx) in [("run-time choice", &both), ("MULTICAST", &mc_only)] {
            for pat in ["multimem.ld_reduce", "multimem.st", "multimem.red", "acc::f32", "fence.proxy.alias"] {
                assert!(ptx.contains(pat), "{name} {debug:?}: no {pat} in PTX");
            }
        }
        assert!(!p2p_only.contains("multimem."), "P2P {debug:?}: multimem in PTX");
        assert!(p2p_only.contains("red.release.sys"), "P2P {debug:?}: no release signal");
        assert!(both.contains("ld.acquire.sys"), "{debug:?}: no acquire wait");
        assert!(both.contains("globaltimer"), "{debug:?}: waits are not bounded by the timer");
    }
}

/// The header alone is a whole translation unit under NVRTC (nothing it needs is missing).
#[test]
fn header_alone_compiles() {
    let Some(nv) = nvrtc_or_skip() else { return };
    let ptx = compile(nv, "#include \"mcast/device.h\"\n", &[]);
    assert!(!ptx.contains(".entry"), "the header defines no kernel");
}

/// Every example kernel (`examples/kernels/`) compiles with NVRTC, with no include path, in the
/// run-time-choice build and the P2P-only one, and holds its entry points.
#[test]
fn every_example_kernel_compiles() {
    let Some(nv) = nvrtc_or_skip() else { return };
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/kernels");
    let mut files: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let entries: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("extern \"C\" __global__ void "))
            .map(|l| l.split('(').next().unwrap())
            .collect();
        assert!(!entries.is_empty(), "{f:?}: no kernel");
        for defines in [&[][..], &["-DMCAST_DEV_TRANSPORT=MCAST_DEV_TRANSPORT_P2P"][..], &["-DMCAST_DEV_DEBUG"][..]] {
            let ptx = compile(nv, &text, defines);
            for e in &entries {
                assert!(ptx.contains(&format!(".entry {e}(")), "{f:?} {defines:?}: no entry {e}");
            }
        }
    }
}
