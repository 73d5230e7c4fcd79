//! Helpers shared by the integration tests: a simulated context through the C API.
#![allow(dead_code)]

use std::ffi::CStr;
use std::sync::Arc;

use mcast::capi::buffer::*;
use mcast::capi::config::*;
use mcast::capi::context::*;
use mcast::capi::status::*;
use mcast::capi::team::*;
use mcast::driver::sim::{Ledger, SimDriver};
use mcast::runtime::context::Context;
use mcast::runtime::handles;

pub const OK: mcast_status_t = mcast_status_t(0);

pub fn st(code: McastStatus) -> mcast_status_t {
    mcast_status_t(code as u32)
}

pub fn last_error() -> String {
    // SAFETY: mcast_last_error never returns NULL.
    unsafe { CStr::from_ptr(mcast_last_error()) }.to_string_lossy().into_owned()
}

/// A config for the simulator with `devices` GPUs; `f` adjusts it.
pub fn sim_config(devices: u32, f: impl FnOnce(&mut mcast_config_t)) -> mcast_config_t {
    let mut c = std::mem::MaybeUninit::<mcast_config_t>::uninit();
    // SAFETY: a valid pointer to write the config into.
    unsafe { mcast_config_init(c.as_mut_ptr()) };
    // SAFETY: mcast_config_init wrote every field.
    let mut c = unsafe { c.assume_init() };
    c.backend = mcast_backend_t(McastBackend::MCAST_BACKEND_SIM as u32);
    c.multicast = mcast_multicast_t(McastMulticast::MCAST_MULTICAST_AUTO as u32);
    c.sim_devices = devices;
    c.retry_backoff_ms = 1;
    f(&mut c);
    c
}

/// A context for `config`, and the runtime object behind it (kept alive after destroy so the
/// simulator's ledger can be read).
pub fn context(config: &mcast_config_t) -> (mcast_context_t, Arc<Context>) {
    let mut ctx = mcast_context_t { id: 0 };
    // SAFETY: valid pointers.
    let s = unsafe { mcast_context_create(config, &mut ctx) };
    assert_eq!(s, OK, "{}", last_error());
    (ctx, handles::context(ctx.id).unwrap())
}

pub fn sim(ctx: &Context) -> &SimDriver {
    ctx.driver().as_sim().expect("a simulated context")
}

pub fn ledger(ctx: &Context) -> Ledger {
    sim(ctx).ledger()
}

pub fn team_create(ctx: mcast_context_t, devices: &[i32]) -> Result<mcast_team_t, (mcast_status_t, String)> {
    let mut t = mcast_team_t { id: 0 };
    // SAFETY: valid pointers.
    let s = unsafe { mcast_team_create(ctx, devices.as_ptr(), devices.len() as i32, &mut t) };
    if s == OK {
        Ok(t)
    } else {
        Err((s, last_error()))
    }
}

pub fn alloc(team: mcast_team_t, bytes: usize) -> Result<mcast_buffer_t, (mcast_status_t, String)> {
    let mut b = mcast_buffer_t { id: 0 };
    // SAFETY: valid pointer.
    let s = unsafe { mcast_buffer_alloc(team, bytes, &mut b) };
    if s == OK {
        Ok(b)
    } else {
        Err((s, last_error()))
    }
}

pub fn team_info(team: mcast_team_t) -> mcast_team_info_t {
    // SAFETY: all-zero is a valid mcast_team_info_t.
    let mut info: mcast_team_info_t = unsafe { std::mem::zeroed() };
    info.struct_size = std::mem::size_of::<mcast_team_info_t>() as u32;
    // SAFETY: valid pointer.
    assert_eq!(unsafe { mcast_team_get_info(team, &mut info) }, OK, "{}", last_error());
    info
}

pub fn live_counts(ctx: mcast_context_t) -> mcast_live_counts_t {
    let mut c =
        mcast_live_counts_t { struct_size: std::mem::size_of::<mcast_live_counts_t>() as u32, ..Default::default() };
    // SAFETY: valid pointer.
    assert_eq!(unsafe { mcast_context_live_counts(ctx, &mut c) }, OK, "{}", last_error());
    c
}
