//! Teams and buffers on a real GPU over the P2P transport (a team may repeat one device).
//! Every test returns early, printing "skipped", where there is no CUDA driver or device.
//! Multicast is forced off: never create a multicast object on a shared machine.

mod common;

use common::*;
use mcast::runtime::buffer::Buffer;
use mcast::runtime::config::{Backend, Config, MulticastMode};
use mcast::runtime::context::Context;
use mcast::runtime::team::{Team, Transport};
use std::sync::Arc;

fn gpu_context() -> Option<Arc<Context>> {
    runtime_context_or_skip(Config { backend: Backend::Cuda, multicast: MulticastMode::Off, ..Config::default() })
}

#[test]
fn gpu_team_buffers_round_trip() {
    let Some(ctx) = gpu_context() else { return };
    let n = ctx.device_count() as i32;
    let mut device_sets = vec![vec![0], vec![0, 0], vec![0, 0, 0]];
    if n >= 2 {
        device_sets.push((0..n).collect());
    }
    for devices in device_sets {
        let team = Team::create(&ctx, &devices).unwrap();
        assert_eq!(team.transport(), Transport::P2P, "multicast is off");
        for bytes in [1usize, 4095, 3 << 20, 256 << 20] {
            let buf = Buffer::alloc(&team, bytes).unwrap();
            for rank in 0..devices.len() as i32 {
                let pattern: Vec<u8> =
                    (0..bytes).map(|i| (i as u8).wrapping_mul(31).wrapping_add(rank as u8)).collect();
                buf.write(rank, 0, &pattern).unwrap();
            }
            for rank in 0..devices.len() as i32 {
                let mut back = vec![0u8; bytes];
                buf.read(rank, 0, &mut back).unwrap();
                assert!(
                    back.iter().enumerate().all(|(i, &b)| b == (i as u8).wrapping_mul(31).wrapping_add(rank as u8)),
                    "devices {devices:?} rank {rank} bytes {bytes}"
                );
                for peer in 0..devices.len() as i32 {
                    assert_ne!(buf.peer_ptr(rank, peer).unwrap(), 0);
                }
            }
            buf.free().unwrap();
        }
        team.destroy().unwrap();
    }
    assert_clean(&ctx);
}

/// Identity on a real GPU: every device has a UUID (`cuDeviceGetUuid_v2`), distinct, printed
/// as `nvidia-smi -L` prints it, and a PCI bus id; the NVLink fabric state comes from NVML
/// (none on a machine without a fabric). A team repeating one device names the shared GPU in
/// its transport reason.
#[test]
fn gpu_devices_have_identities() {
    let Some(ctx) = gpu_context() else { return };
    let n = ctx.device_count() as i32;
    let mut seen = Vec::new();
    for d in 0..n {
        let info = ctx.device_info(d).unwrap();
        let uuid = mcast::driver::uuid_string(&info.props.uuid);
        println!("device {d}: {uuid} | PCI bus {} | fabric {:?}", info.props.pci_bus_id, info.fabric);
        assert_ne!(info.props.uuid, [0; 16], "device {d}");
        assert!(!seen.contains(&info.props.uuid), "device {d} repeats a UUID");
        seen.push(info.props.uuid);
        assert!(info.props.pci_bus_id.contains(':'), "device {d}: {:?}", info.props.pci_bus_id);
    }
    let team = Team::create(&ctx, &[0, 0]).unwrap();
    let reason = team.info().transport_reason;
    assert!(reason.contains(&mcast::driver::uuid_string(&seen[0])), "{reason}");
    team.destroy().unwrap();
    assert_clean(&ctx);
}
