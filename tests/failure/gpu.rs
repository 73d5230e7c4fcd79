//! On a GPU (`MCAST_TEST_BACKEND=cuda`, `MCAST_MULTICAST=off`): the abort latency.

use super::*;

/// On 1 GPU (two ranks on device 0) and 2 GPUs: rank 0 runs an all-reduce whose peer never
/// arrives; another thread aborts; prints the time from `abort` to `synchronize` returning.
#[test]
fn gpu_abort_latency() {
    if !on_gpu() {
        return;
    }
    assert_eq!(std::env::var("MCAST_MULTICAST").as_deref(), Ok("off"), "run GPU tests with MCAST_MULTICAST=off");
    let config =
        Config { backend: Backend::Cuda, multicast: MulticastMode::Off, timeout_ms: LONG_MS, ..Config::default() };
    let ctx = match Context::new(config) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let have = ctx.device_count();
    for devices in [vec![0, 0], vec![0, 1]] {
        if devices.iter().any(|&d| d as usize >= have) {
            eprintln!("skipped devices {devices:?}: {have} GPU(s)");
            continue;
        }
        for trial in 0..5 {
            let team = Team::create(&ctx, &devices).unwrap();
            let buf = Buffer::alloc(&team, MIB).unwrap();
            let s = rank_streams(&team);
            run(&buf, 0, 0, 1024, AR, s[0]).unwrap();
            let aborter = abort_later(&team, Duration::from_millis(200));
            let began = Instant::now();
            let e = synchronize(&team, 0, s[0]).unwrap_err();
            let returned = Instant::now();
            let at = aborter.join().unwrap();
            assert_eq!(e.kind, ErrorKind::Aborted, "{e}");
            let took = returned.saturating_duration_since(at);
            println!(
                "gpu_abort_latency devices {devices:?} trial {trial}: abort -> synchronize returned in {:.1} us (waited \
                 {:.1} ms in all)",
                took.as_secs_f64() * 1e6,
                began.elapsed().as_secs_f64() * 1e3
            );
            assert!(took < Duration::from_secs(1));
            drop_rank_streams(&team, s);
            let t = Instant::now();
            team.destroy().unwrap();
            println!("  destroy after the abort: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
            drop(buf);
        }
    }
    assert_clean(&ctx);
}
