//! Compiles every kernel variant for sm_90 with the real NVRTC code path and checks the PTX:
//! the multimem build uses `multimem.ld_reduce`, `multimem.st` and `multimem.red`, the emulated
//! build none; every entry point is present; NVRTC reports no warnings.
//!
//! Without NVRTC the test is skipped, unless `MCAST_REQUIRE_NVRTC=1` (set by
//! `scripts/check-kernels`) makes that a failure.

use mcast::kernels::abi::{self, KernelId, Variant};
use mcast::kernels::nvrtc;

#[test]
fn every_kernel_variant_compiles_for_sm_90() {
    let nv = match nvrtc::nvrtc() {
        Ok(nv) => nv,
        Err(e) if std::env::var("MCAST_REQUIRE_NVRTC").as_deref() != Ok("1") => {
            eprintln!("skipped: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    eprintln!("NVRTC {:?} from {}", nv.version(), nv.path());
    let arch = std::env::var("MCAST_CHECK_ARCH").unwrap_or_else(|_| "sm_90".into());
    std::thread::scope(|s| {
        for variant in Variant::ALL {
            let arch = arch.clone();
            s.spawn(move || {
                let target = format!("{arch} {}", variant.name());
                let opts = nvrtc::options(&arch, variant);
                let out = nv.compile(abi::SOURCE, abi::SOURCE_NAME, &opts, &target).unwrap_or_else(|e| panic!("{e}"));
                assert!(out.log.is_empty(), "{target}: NVRTC log not empty:\n{}", out.log);
                assert!(out.cubin.len() > 1024, "{target}: cubin too small");
                for id in KernelId::all().into_iter().filter(|k| k.exists()) {
                    assert!(out.ptx.contains(&format!(".entry {}(", id.name())), "{target}: no entry {}", id.name());
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
                eprintln!("{target}: ok, cubin {} bytes", out.cubin.len());
            });
        }
    });
}
