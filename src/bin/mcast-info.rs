//! `mcast-info`: which backend mcast picks here, and every device with its multicast status.
//!
//! Configuration comes from the `MCAST_*` environment variables (see the README); with no GPU
//! the simulator answers.

use std::process::ExitCode;

use mcast::driver::{uuid_string, FabricState};
use mcast::runtime::config::Config;
use mcast::runtime::context::Context;

fn main() -> ExitCode {
    if std::env::args().skip(1).any(|a| a == "-h" || a == "--help") {
        println!("usage: mcast-info\n\nLists the devices mcast sees (UUID, PCI bus id, NVLink fabric) and whether");
        println!("multicast is usable on each.");
        println!("Set MCAST_BACKEND=sim|cuda|auto, MCAST_MULTICAST=auto|off|require, MCAST_SIM_DEVICES=N.");
        println!("Also prints the version, the backend and why, and whether NVTX ranges are recorded.");
        return ExitCode::SUCCESS;
    }
    let ctx = match Context::new(Config::from_env()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mcast-info: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (backend, why) = ctx.backend();
    let (major, minor, patch) =
        (env!("CARGO_PKG_VERSION_MAJOR"), env!("CARGO_PKG_VERSION_MINOR"), env!("CARGO_PKG_VERSION_PATCH"));
    println!("mcast {major}.{minor}.{patch}");
    println!("backend: {} ({backend:?}: {why})", ctx.driver().backend_name());
    match ctx.driver().driver_version() {
        Ok(v) => println!(
            "driver version: {}.{}{}",
            v / 1000,
            (v % 1000) / 10,
            if backend == mcast::runtime::config::Backend::Sim { " (simulated)" } else { "" }
        ),
        Err(e) => println!("driver version: unknown ({e})"),
    }
    println!("NVTX ranges: {}", mcast::nvtx::status().1);
    let n = ctx.device_count();
    println!("devices: {n}");
    let mut failed = false;
    for dev in 0..n as i32 {
        match ctx.device_info(dev) {
            Ok(d) => {
                println!(
                    "  [{dev}] {} | cc {}.{} | {:.1} GiB | {} SMs",
                    d.props.name,
                    d.props.cc_major,
                    d.props.cc_minor,
                    d.props.total_memory as f64 / (1u64 << 30) as f64,
                    d.props.sm_count
                );
                println!(
                    "      multicast: supported {}, usable {}{}",
                    yes(d.props.multicast_supported),
                    yes(d.multicast_usable),
                    if d.multicast_reason.is_empty() { String::new() } else { format!(" ({})", d.multicast_reason) }
                );
                println!(
                    "      multicast granularity: minimum {} B, recommended {} B; VMM {}, POSIX fd {}, fabric {}",
                    d.granularity_min,
                    d.granularity_recommended,
                    yes(d.props.vmm_supported),
                    yes(d.props.posix_fd_supported),
                    yes(d.props.fabric_supported)
                );
                let bus = if d.props.pci_bus_id.is_empty() { "unknown" } else { d.props.pci_bus_id.as_str() };
                println!("      {} | PCI bus {bus}", uuid_string(&d.props.uuid));
                let f = d.fabric;
                match f.state {
                    FabricState::None => println!("      NVLink fabric: none"),
                    state => println!(
                        "      NVLink fabric: {} | cluster {} | clique {}",
                        if state == FabricState::Completed { "completed" } else { "in progress" },
                        f.cluster_uuid.iter().map(|b| format!("{b:02x}")).collect::<String>(),
                        f.clique_id
                    ),
                }
            }
            Err(e) => {
                println!("  [{dev}] error: {e}");
                failed = true;
            }
        }
    }
    if n > 1 {
        println!("peer access (row can access column):");
        print!("     ");
        for p in 0..n {
            print!(" {p:>3}");
        }
        println!();
        for d in 0..n as i32 {
            print!("  {d:>3}");
            for p in 0..n as i32 {
                let cell = match ctx.can_access_peer(d, p) {
                    Ok(true) => "yes",
                    Ok(false) => "no",
                    Err(_) => "err",
                };
                print!(" {cell:>3}");
            }
            println!();
        }
    }
    let leaks = ctx.shutdown();
    if !leaks.is_empty() {
        eprintln!("mcast-info: left behind:\n{leaks}");
        failed = true;
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}
