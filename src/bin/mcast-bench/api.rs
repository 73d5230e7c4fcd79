//! mcast as a C program sees it: thin wrappers over the `mcast_*` functions of `mcast.h` (the
//! crate's `extern "C"` exports, called directly), each failure turned into
//! `"mcast_<fn>: <mcast_last_error()>"`. The timed collective calls are made in `run.rs`, with
//! nothing between the bench and the export.
//!
//! One thing here reaches below the C ABI: [`Plumbing`], the context's driver, for what a C
//! program does with the CUDA runtime and not with mcast (streams, events, graph capture,
//! cudaMalloc-like memory, copies, the current device), plus the backend's name and reason for
//! the header. On the simulator there is no CUDA runtime: the simulated devices exist only in
//! the context's driver.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::size_of;
use std::sync::Arc;

use mcast::capi::buffer::{
    mcast_buffer_alloc, mcast_buffer_free, mcast_buffer_read, mcast_buffer_register, mcast_buffer_t, mcast_buffer_write,
};
use mcast::capi::collective::{mcast_all_gather, mcast_stream_t, mcast_synchronize, CUstream_st};
use mcast::capi::config::{mcast_config_init, mcast_config_t};
use mcast::capi::context::{mcast_context_create, mcast_context_destroy, mcast_context_leak_report, mcast_context_t};
use mcast::capi::device::{mcast_device_count, mcast_device_get_info, mcast_device_info_t};
use mcast::capi::mcast_status_t;
use mcast::capi::memory::{mcast_mem_alloc, mcast_mem_free};
use mcast::capi::status::mcast_last_error;
use mcast::capi::team::{
    mcast_get_unique_id, mcast_team_create, mcast_team_destroy, mcast_team_get_info, mcast_team_info_t,
    mcast_team_init_rank, mcast_team_t, mcast_unique_id_t, McastTransport,
};
use mcast::driver::{Driver, Stream};

/// `Err("<func>: <mcast_last_error()>")` unless `st` is success. The message already starts
/// with the function's name (the library prefixes it).
pub fn check(st: mcast_status_t) -> Result<(), String> {
    if st == mcast_status_t::SUCCESS {
        Ok(())
    } else {
        Err(last_error())
    }
}

/// This thread's `mcast_last_error()`.
pub fn last_error() -> String {
    // SAFETY: mcast_last_error never returns NULL; the string is NUL-terminated and stays valid
    // until this thread's next failing call, and it is copied at once.
    unsafe { CStr::from_ptr(mcast_last_error()) }.to_string_lossy().into_owned()
}

/// The stream argument of the `mcast_*` calls for a stream of the bench's plumbing.
pub fn stream(s: Stream) -> mcast_stream_t {
    s.0 as *mut CUstream_st
}

fn c_text(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `mcast_config_init` (defaults, then the `MCAST_*` environment) with `backend` set if given.
pub fn config(backend: Option<u32>) -> mcast_config_t {
    let mut c = std::mem::MaybeUninit::<mcast_config_t>::zeroed();
    // SAFETY: the pointer is valid for writing one config.
    unsafe { mcast_config_init(c.as_mut_ptr()) };
    // SAFETY: mcast_config_init filled every field (and zeroed memory is a valid config anyway).
    let mut c = unsafe { c.assume_init() };
    if let Some(b) = backend {
        c.backend.0 = b;
    }
    c
}

/// `mcast_context_create`.
pub fn context_create(config: &mcast_config_t) -> Result<mcast_context_t, String> {
    let mut ctx = mcast_context_t { id: 0 };
    // SAFETY: both pointers are valid.
    check(unsafe { mcast_context_create(config, &mut ctx) })?;
    Ok(ctx)
}

/// `mcast_context_destroy`.
pub fn context_destroy(ctx: mcast_context_t) -> Result<(), String> {
    check(mcast_context_destroy(ctx))
}

/// `mcast_context_leak_report`: what the context still holds ("" when nothing).
pub fn leak_report(ctx: mcast_context_t) -> String {
    // SAFETY: NULL with length 0 asks for the length only.
    let len = unsafe { mcast_context_leak_report(ctx, std::ptr::null_mut(), 0) };
    if len == 0 {
        return String::new();
    }
    let mut buf = vec![0 as c_char; len + 1];
    // SAFETY: buf holds len + 1 bytes.
    unsafe { mcast_context_leak_report(ctx, buf.as_mut_ptr(), buf.len()) };
    c_text(&buf)
}

/// `mcast_device_count`.
pub fn device_count(ctx: mcast_context_t) -> Result<i32, String> {
    let mut n: c_int = 0;
    // SAFETY: the pointer is valid.
    check(unsafe { mcast_device_count(ctx, &mut n) })?;
    Ok(n)
}

/// The name `mcast_device_get_info` gives `device`.
pub fn device_name(ctx: mcast_context_t, device: i32) -> Result<String, String> {
    // SAFETY: an all-zero mcast_device_info_t is valid (integers and char arrays).
    let mut info: mcast_device_info_t = unsafe { std::mem::zeroed() };
    info.struct_size = size_of::<mcast_device_info_t>() as u32;
    // SAFETY: the pointer is valid and struct_size set.
    check(unsafe { mcast_device_get_info(ctx, device, &mut info) })?;
    Ok(c_text(&info.name))
}

/// `mcast_team_create` on `devices`, one rank each.
pub fn team_create(ctx: mcast_context_t, devices: &[i32]) -> Result<mcast_team_t, String> {
    let mut team = mcast_team_t { id: 0 };
    // SAFETY: `devices` holds `devices.len()` ints; `team` is valid for writes.
    check(unsafe { mcast_team_create(ctx, devices.as_ptr(), devices.len() as c_int, &mut team) })?;
    Ok(team)
}

/// `mcast_get_unique_id`: the id's bytes.
pub fn unique_id() -> Result<[u8; 128], String> {
    let mut id = mcast_unique_id_t { internal: [0; 128] };
    // SAFETY: the pointer is valid for writes.
    check(unsafe { mcast_get_unique_id(&mut id) })?;
    Ok(id.internal.map(|c| c as u8))
}

/// `mcast_team_init_rank`: this process's rank `rank` of `nranks` on `device`.
pub fn team_init_rank(
    ctx: mcast_context_t,
    id: &[u8; 128],
    nranks: usize,
    rank: usize,
    device: i32,
) -> Result<mcast_team_t, String> {
    let id = mcast_unique_id_t { internal: id.map(|b| b as c_char) };
    let mut team = mcast_team_t { id: 0 };
    // SAFETY: `team` is valid for writes.
    check(unsafe { mcast_team_init_rank(ctx, id, nranks as c_int, rank as c_int, device, &mut team) })?;
    Ok(team)
}

/// `mcast_all_gather` of `bytes` per rank at offset 0 of `buf`, rank `rank`'s part on `s`.
pub fn all_gather(buf: mcast_buffer_t, rank: usize, bytes: usize, s: Stream) -> Result<(), String> {
    check(mcast_all_gather(buf, rank as c_int, 0, bytes, stream(s)))
}

/// What the header says of a team (`mcast_team_get_info`).
pub struct TeamInfo {
    /// `"MULTICAST"` or `"P2P"`.
    pub transport: &'static str,
    pub transport_reason: String,
    pub bytes_reserved: u64,
    /// NVLink domains the team spans, ranks per domain (0: unequal), the engine between them.
    pub domains: (i32, i32, String),
}

/// `mcast_team_get_info`.
pub fn team_info(team: mcast_team_t) -> Result<TeamInfo, String> {
    // SAFETY: an all-zero mcast_team_info_t is valid (integers and a char array).
    let mut info: mcast_team_info_t = unsafe { std::mem::zeroed() };
    info.struct_size = size_of::<mcast_team_info_t>() as u32;
    // SAFETY: the pointer is valid and struct_size set.
    check(unsafe { mcast_team_get_info(team, &mut info) })?;
    Ok(TeamInfo {
        transport: if info.transport.0 == McastTransport::MCAST_TRANSPORT_MULTICAST as u32 {
            "MULTICAST"
        } else {
            "P2P"
        },
        transport_reason: c_text(&info.transport_reason),
        bytes_reserved: info.bytes_reserved,
        domains: (info.domains, info.domain_size, c_text(&info.net_engine)),
    })
}

/// What a team agreed at creation about its kernels: mcast.h does not report it, so this reads
/// the team behind the handle (below the C ABI, as [`Plumbing`] does), for the header.
pub struct TeamGrid {
    /// Most blocks per collective kernel.
    pub max_blocks: u32,
    /// The LL kernels serve small messages.
    pub ll: bool,
    /// The smallest message moved by the copy engines; 0: never.
    pub ce_min_bytes: u64,
}

/// The [`TeamGrid`] of `team`.
pub fn team_grid(team: mcast_team_t) -> Result<TeamGrid, String> {
    let any = mcast::runtime::handles::team(team.id).map_err(|e| e.to_string())?;
    let t = any.inner();
    Ok(TeamGrid { max_blocks: t.max_blocks(), ll: t.ll(), ce_min_bytes: t.ce_min_bytes() })
}

/// `mcast_team_destroy`.
pub fn team_destroy(team: mcast_team_t) -> Result<(), String> {
    check(mcast_team_destroy(team))
}

/// `mcast_buffer_alloc`.
pub fn buffer_alloc(team: mcast_team_t, bytes: usize) -> Result<mcast_buffer_t, String> {
    let mut buf = mcast_buffer_t { id: 0 };
    // SAFETY: the pointer is valid.
    check(unsafe { mcast_buffer_alloc(team, bytes, &mut buf) })?;
    Ok(buf)
}

/// `mcast_buffer_register` of one pointer per rank.
pub fn buffer_register(team: mcast_team_t, ptrs: &[u64], bytes: usize) -> Result<mcast_buffer_t, String> {
    let ptrs: Vec<*mut c_void> = ptrs.iter().map(|&p| p as usize as *mut c_void).collect();
    let mut buf = mcast_buffer_t { id: 0 };
    // SAFETY: one pointer per rank of this single-process team; `buf` is valid for writes.
    check(unsafe { mcast_buffer_register(team, ptrs.as_ptr(), bytes, &mut buf) })?;
    Ok(buf)
}

/// `mcast_buffer_free`.
pub fn buffer_free(buf: mcast_buffer_t) -> Result<(), String> {
    check(mcast_buffer_free(buf))
}

/// `mcast_buffer_write` of `data` at offset 0 of `rank`'s copy.
pub fn buffer_write(buf: mcast_buffer_t, rank: usize, data: &[u8]) -> Result<(), String> {
    // SAFETY: `data` is readable for its length.
    check(unsafe { mcast_buffer_write(buf, rank as c_int, 0, data.as_ptr().cast(), data.len()) })
}

/// `mcast_buffer_read` into `dst` from offset 0 of `rank`'s copy.
pub fn buffer_read(buf: mcast_buffer_t, rank: usize, dst: &mut [u8]) -> Result<(), String> {
    // SAFETY: `dst` is writable for its length.
    check(unsafe { mcast_buffer_read(buf, rank as c_int, 0, dst.as_mut_ptr().cast(), dst.len()) })
}

/// `mcast_mem_alloc`.
pub fn mem_alloc(ctx: mcast_context_t, device: i32, bytes: usize) -> Result<u64, String> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: the pointer is valid.
    check(unsafe { mcast_mem_alloc(ctx, device, bytes, &mut p) })?;
    Ok(p as usize as u64)
}

/// `mcast_mem_free`.
pub fn mem_free(ctx: mcast_context_t, ptr: u64) -> Result<(), String> {
    check(mcast_mem_free(ctx, ptr as usize as *mut c_void))
}

/// `mcast_synchronize`.
pub fn synchronize(team: mcast_team_t, rank: usize, s: Stream) -> Result<(), String> {
    check(mcast_synchronize(team, rank as c_int, stream(s)))
}

/// The bench's own CUDA plumbing, which mcast's API does not offer and a C program gets from
/// the CUDA runtime: streams, events, CUDA-graph capture and replay, plain device memory
/// (`cudaMalloc`), copies, the thread's current device. It is the driver of the context, the
/// only way to reach the simulated devices (they exist only in it); nothing mcast is timed on
/// is called through it.
pub struct Plumbing {
    pub driver: Arc<dyn Driver>,
    /// `"cuda"` or `"sim"`.
    pub backend: &'static str,
    /// Why the context chose its backend.
    pub backend_reason: String,
    /// `MCAST_EMULATE_MULTIMEM=1`: the multicast kernels run with emulated multimem.
    pub emulated_multimem: bool,
}

impl Plumbing {
    /// The plumbing of `ctx`.
    pub fn of(ctx: mcast_context_t) -> Result<Plumbing, String> {
        let c = mcast::runtime::handles::context(ctx.id).map_err(|e| e.to_string())?;
        let driver = c.driver().clone();
        let (_, why) = c.backend();
        Ok(Plumbing {
            backend: driver.backend_name(),
            backend_reason: why.to_string(),
            driver,
            emulated_multimem: mcast::kernels::cuda::emulate_forced(),
        })
    }

    /// True on the simulator.
    pub fn is_sim(&self) -> bool {
        self.driver.as_sim().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcast::capi::config::McastBackend;

    #[test]
    fn the_backend_values_are_the_c_enum() {
        // DType and RedOp are mcast::types', checked against the C enums there.
        use crate::args::Backend;
        assert_eq!(Backend::Auto as u32, McastBackend::MCAST_BACKEND_AUTO as u32);
        assert_eq!(Backend::Cuda as u32, McastBackend::MCAST_BACKEND_CUDA as u32);
        assert_eq!(Backend::Sim as u32, McastBackend::MCAST_BACKEND_SIM as u32);
    }

    #[test]
    fn failures_carry_the_last_error() {
        let e = team_destroy(mcast_team_t { id: 12345 }).unwrap_err();
        assert!(e.starts_with("mcast_team_destroy: ") && e.contains("not live"), "{e}");
        assert_eq!(team_destroy(mcast_team_t { id: 0 }), Ok(()), "the zero handle is a no-op");
    }
}
