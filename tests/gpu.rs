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
