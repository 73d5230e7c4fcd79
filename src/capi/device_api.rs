//! The host side of the device API (`include/mcast/device.h`): the handle structs an
//! application passes to its own kernels, and the header's text for NVRTC.
//!
//! The structs are defined in C by `mcast/device.h` (which `mcast.h` includes); cbindgen does
//! not emit them (cbindgen.toml excludes them). The Rust mirror below is checked against the
//! header's own `MCAST_DEV__ASSERT` lines by the tests of this module.

use std::ffi::{c_char, c_int};
use std::mem::size_of;

use super::buffer::mcast_buffer_t;
use super::team::mcast_team_t;
use super::{check_struct_size, guard, mcast_status_t, out_ptr};
use crate::runtime::handles;

/// `MCAST_DEV_VERSION` of `mcast/device.h`.
pub const DEV_VERSION: u32 = 1;
/// `MCAST_DEV_FLAG_MULTICAST` of `mcast/device.h`.
pub const DEV_FLAG_MULTICAST: u32 = 1;

/// The text of `include/mcast/device.h` of this build, NUL-terminated.
const HEADER: &str = concat!(include_str!("../../include/mcast/device.h"), "\0");

/// A team as its kernels see it (`mcast_dev_team_t` of `mcast/device.h`): 128 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct mcast_dev_team_t {
    /// `sizeof(mcast_dev_team_t)`, set by the caller.
    pub struct_size: u32,
    /// `MCAST_DEV_VERSION`.
    pub version: u32,
    /// This rank.
    pub rank: c_int,
    /// Ranks in the team.
    pub nranks: c_int,
    /// Device-API slots reserved (`MCAST_DEVICE_SLOTS`).
    pub nslots: u32,
    /// `MCAST_DEV_FLAG_*`.
    pub flags: u32,
    /// The team's timeout in nanoseconds (0: none).
    pub timeout_ns: u64,
    /// Rank 0's sync region as mapped on this rank's device.
    pub sync_peer0: u64,
    /// Bytes between consecutive ranks' sync regions there.
    pub sync_stride: u64,
    /// Multicast address of the sync regions, 0 without.
    pub sync_mc: u64,
    /// The device-API slots, from the start of a sync region.
    pub dev_offset: u64,
    /// Zero.
    pub reserved: [u64; 8],
}

/// A buffer as kernels see it (`mcast_dev_buffer_t` of `mcast/device.h`): 128 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct mcast_dev_buffer_t {
    /// `sizeof(mcast_dev_buffer_t)`, set by the caller.
    pub struct_size: u32,
    /// `MCAST_DEV_VERSION`.
    pub version: u32,
    /// This rank.
    pub rank: c_int,
    /// Ranks in the team.
    pub nranks: c_int,
    /// Bytes of each rank's copy.
    pub bytes: u64,
    /// This rank's copy.
    pub local: u64,
    /// Rank 0's copy as mapped on this rank's device.
    pub peer0: u64,
    /// Rank p's copy is at `peer0 + p * peer_stride`.
    pub peer_stride: u64,
    /// Multicast address, 0 without.
    pub mc: u64,
    /// This rank's sync region (device-side errors are recorded there).
    pub sync: u64,
    /// Zero.
    pub reserved: [u64; 8],
}

/// Fills `*out` with the device handle of `team` for rank `rank` (a rank this process holds):
/// what a kernel passed it by value needs for mcast/device.h's barriers and signals. The caller
/// sets `out->struct_size` to `sizeof(mcast_dev_team_t)`. The handle is valid until the team is
/// destroyed, on rank `rank`'s device only. On error `*out` is untouched.
/// `MCAST_ERROR_INVALID_ARGUMENT`: `out` NULL, `struct_size` too small, `rank` out of range or
/// held by another process; `MCAST_ERROR_INVALID_HANDLE`: `team` not live;
/// `MCAST_ERROR_NOT_SUPPORTED`: a team across NVLink domains (no NVLink between them). Thread-safe.
///
/// # Safety
/// `out` must be NULL or valid for reading and writing `out->struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn mcast_team_device_handle(
    team: mcast_team_t,
    rank: c_int,
    out: *mut mcast_dev_team_t,
) -> mcast_status_t {
    guard("mcast_team_device_handle", || {
        // SAFETY: the caller passes NULL or a valid pointer.
        let out = unsafe { out_ptr(out, "out") }?;
        check_struct_size(out.struct_size, size_of::<mcast_dev_team_t>(), "mcast_dev_team_t")?;
        let v = handles::team(team.id)?.device_view(rank)?;
        *out = mcast_dev_team_t {
            struct_size: size_of::<mcast_dev_team_t>() as u32,
            version: DEV_VERSION,
            rank: v.rank,
            nranks: v.nranks,
            nslots: v.nslots,
            flags: if v.multicast { DEV_FLAG_MULTICAST } else { 0 },
            timeout_ns: v.timeout_ns,
            sync_peer0: v.sync_peer0,
            sync_stride: v.sync_stride,
            sync_mc: v.sync_mc,
            dev_offset: v.dev_offset,
            reserved: [0; 8],
        };
        Ok(())
    })
}

/// Fills `*out` with the device handle of `buf` for rank `rank` (a rank this process holds): its
/// local, peer and multicast addresses (those of mcast_buffer_local_ptr, mcast_buffer_peer_ptr
/// and mcast_buffer_multicast_ptr; `mc` 0 on a P2P team). The caller sets `out->struct_size`
/// to `sizeof(mcast_dev_buffer_t)`. Valid until the buffer is freed, on rank `rank`'s device
/// only. On error `*out` is untouched. `MCAST_ERROR_INVALID_ARGUMENT`: `out` NULL,
/// `struct_size` too small, `rank` out of range or held by another process;
/// `MCAST_ERROR_INVALID_HANDLE`: `buf` not live; `MCAST_ERROR_NOT_SUPPORTED`: registered memory
/// whose ranks' copies are not evenly spaced in the peer mapping (registered at different
/// offsets of their allocations), or a buffer of a team across NVLink domains. Thread-safe.
///
/// # Safety
/// `out` must be NULL or valid for reading and writing `out->struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn mcast_buffer_device_handle(
    buf: mcast_buffer_t,
    rank: c_int,
    out: *mut mcast_dev_buffer_t,
) -> mcast_status_t {
    guard("mcast_buffer_device_handle", || {
        // SAFETY: the caller passes NULL or a valid pointer.
        let out = unsafe { out_ptr(out, "out") }?;
        check_struct_size(out.struct_size, size_of::<mcast_dev_buffer_t>(), "mcast_dev_buffer_t")?;
        let v = handles::buffer(buf.id)?.device_view(rank)?;
        *out = mcast_dev_buffer_t {
            struct_size: size_of::<mcast_dev_buffer_t>() as u32,
            version: DEV_VERSION,
            rank: v.rank,
            nranks: v.nranks,
            bytes: v.bytes,
            local: v.local,
            peer0: v.peer0,
            peer_stride: v.peer_stride,
            mc: v.mc,
            sync: v.sync,
            reserved: [0; 8],
        };
        Ok(())
    })
}

/// The text of `mcast/device.h` of this build, NUL-terminated, for NVRTC
/// (`nvrtcCreateProgram(..., 1, &text, &"mcast/device.h")`); its length without the NUL goes to
/// `*len` unless `len` is NULL. Static: never freed. Never fails. Thread-safe.
///
/// # Safety
/// `len` must be NULL or valid for writing a `size_t`.
#[no_mangle]
pub unsafe extern "C" fn mcast_device_header_source(len: *mut usize) -> *const c_char {
    // SAFETY: the caller passes NULL or a valid pointer.
    if let Some(l) = unsafe { len.as_mut() } {
        *l = HEADER.len() - 1;
    }
    HEADER.as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// The layout the header asserts, parsed from its `MCAST_DEV__ASSERT(x, sizeof(T) == n)` and
    /// `MCAST_DEV__OFFSET_ASSERT(x, T, f, n)` lines: (type, field or "sizeof", value).
    fn asserted() -> Vec<(String, String, usize)> {
        let mut v = Vec::new();
        for line in HEADER.lines() {
            if let Some(rest) = line.strip_prefix("MCAST_DEV__OFFSET_ASSERT(") {
                let args: Vec<&str> = rest.trim_end_matches(");").split(", ").collect();
                let [_, t, f, n] = args[..] else { panic!("four arguments: {line}") };
                v.push((t.to_string(), f.to_string(), n.parse().expect("a number")));
            } else if let Some(rest) = line.strip_prefix("MCAST_DEV__ASSERT(") {
                let body = rest.split_once(", ").expect("two arguments").1;
                let (lhs, rhs) = body.split_once(" == ").expect("a comparison");
                let t = lhs.strip_prefix("sizeof(").expect("a size").trim_end_matches(')');
                v.push((t.to_string(), "sizeof".to_string(), rhs.trim_end_matches(");").parse().expect("a number")));
            }
        }
        v
    }

    #[test]
    fn rust_mirror_matches_the_header_asserts() {
        let v = asserted();
        assert_eq!(v.len(), 23, "every field of both structs asserted: {v:?}");
        for (t, f, n) in &v {
            let rust = match (t.as_str(), f.as_str()) {
                ("mcast_dev_team_t", "sizeof") => size_of::<mcast_dev_team_t>(),
                ("mcast_dev_team_t", "version") => offset_of!(mcast_dev_team_t, version),
                ("mcast_dev_team_t", "rank") => offset_of!(mcast_dev_team_t, rank),
                ("mcast_dev_team_t", "nranks") => offset_of!(mcast_dev_team_t, nranks),
                ("mcast_dev_team_t", "nslots") => offset_of!(mcast_dev_team_t, nslots),
                ("mcast_dev_team_t", "flags") => offset_of!(mcast_dev_team_t, flags),
                ("mcast_dev_team_t", "timeout_ns") => offset_of!(mcast_dev_team_t, timeout_ns),
                ("mcast_dev_team_t", "sync_peer0") => offset_of!(mcast_dev_team_t, sync_peer0),
                ("mcast_dev_team_t", "sync_stride") => offset_of!(mcast_dev_team_t, sync_stride),
                ("mcast_dev_team_t", "sync_mc") => offset_of!(mcast_dev_team_t, sync_mc),
                ("mcast_dev_team_t", "dev_offset") => offset_of!(mcast_dev_team_t, dev_offset),
                ("mcast_dev_team_t", "reserved") => offset_of!(mcast_dev_team_t, reserved),
                ("mcast_dev_buffer_t", "sizeof") => size_of::<mcast_dev_buffer_t>(),
                ("mcast_dev_buffer_t", "version") => offset_of!(mcast_dev_buffer_t, version),
                ("mcast_dev_buffer_t", "rank") => offset_of!(mcast_dev_buffer_t, rank),
                ("mcast_dev_buffer_t", "nranks") => offset_of!(mcast_dev_buffer_t, nranks),
                ("mcast_dev_buffer_t", "bytes") => offset_of!(mcast_dev_buffer_t, bytes),
                ("mcast_dev_buffer_t", "local") => offset_of!(mcast_dev_buffer_t, local),
                ("mcast_dev_buffer_t", "peer0") => offset_of!(mcast_dev_buffer_t, peer0),
                ("mcast_dev_buffer_t", "peer_stride") => offset_of!(mcast_dev_buffer_t, peer_stride),
                ("mcast_dev_buffer_t", "mc") => offset_of!(mcast_dev_buffer_t, mc),
                ("mcast_dev_buffer_t", "sync") => offset_of!(mcast_dev_buffer_t, sync),
                ("mcast_dev_buffer_t", "reserved") => offset_of!(mcast_dev_buffer_t, reserved),
                other => panic!("the header asserts {other:?}, which the Rust mirror does not check"),
            };
            assert_eq!(rust, *n, "{t}.{f}");
        }
        assert_eq!(size_of::<mcast_dev_team_t>(), 128);
        assert_eq!(size_of::<mcast_dev_buffer_t>(), 128);
    }

    /// The header's numbers the library relies on: the version, the flag, the status values,
    /// the error and state words of the sync region, and the default slot count.
    #[test]
    fn header_constants_match_the_library() {
        use crate::kernels::abi::{
            DEVICE_INFO, ERROR_INFO_OFFSET, ERROR_WORD_OFFSET, ERR_ABORTED, ERR_INVALID, ERR_MISMATCH, ERR_NONE,
            ERR_TIMEOUT, MISSING_OFFSET, MISSING_WORDS, STATE_ABORTED, STATE_MISMATCH, STATE_OFFSET, STATE_OK,
            STATE_TIMEOUT,
        };
        use crate::runtime::config::DEFAULT_DEVICE_SLOTS;
        use crate::runtime::ErrorKind;
        let define = |name: &str| -> u64 {
            let prefix = format!("#define {name} ");
            let line = HEADER.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("{name} missing"));
            let v = line[prefix.len()..].trim().trim_end_matches('u');
            match v.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16).unwrap(),
                None => v.parse().unwrap_or_else(|_| panic!("{line}")),
            }
        };
        assert_eq!(define("MCAST_DEV_VERSION"), u64::from(DEV_VERSION));
        assert_eq!(define("MCAST_DEV_FLAG_MULTICAST"), u64::from(DEV_FLAG_MULTICAST));
        assert_eq!(define("MCAST_DEV_DEFAULT_SLOTS"), u64::from(DEFAULT_DEVICE_SLOTS));
        assert_eq!(define("MCAST_DEV_ERROR_OFFSET"), ERROR_WORD_OFFSET as u64);
        assert_eq!(define("MCAST_DEV_ERROR_INFO_OFFSET"), ERROR_INFO_OFFSET as u64);
        assert_eq!(define("MCAST_DEV_STATE_OFFSET"), STATE_OFFSET as u64);
        assert_eq!(define("MCAST_DEV_MISSING_OFFSET"), MISSING_OFFSET as u64);
        assert_eq!(define("MCAST_DEV_MISSING_WORDS"), MISSING_WORDS as u64);
        assert_eq!(define("MCAST_DEV_STATE_OK"), u64::from(STATE_OK));
        assert_eq!(define("MCAST_DEV_STATE_TIMEOUT"), u64::from(STATE_TIMEOUT));
        assert_eq!(define("MCAST_DEV_STATE_ABORTED"), u64::from(STATE_ABORTED));
        assert_eq!(define("MCAST_DEV_ERR_NONE"), u64::from(ERR_NONE));
        assert_eq!(define("MCAST_DEV_ERR_TIMEOUT"), u64::from(ERR_TIMEOUT));
        assert_eq!(define("MCAST_DEV_ERR_ABORTED"), u64::from(ERR_ABORTED));
        assert_eq!(define("MCAST_DEV_ERR_INVALID"), u64::from(ERR_INVALID));
        assert_eq!(define("MCAST_DEV_ERR_MISMATCH"), u64::from(ERR_MISMATCH));
        assert_eq!(define("MCAST_DEV_STATE_MISMATCH"), u64::from(STATE_MISMATCH));
        assert_eq!(define("MCAST_DEV_INFO_DEVICE_API"), u64::from(DEVICE_INFO));
        for (name, kind) in [
            ("MCAST_DEV_SUCCESS", None),
            ("MCAST_DEV_ERROR_INVALID_ARGUMENT", Some(ErrorKind::InvalidArgument)),
            ("MCAST_DEV_ERROR_NOT_SUPPORTED", Some(ErrorKind::NotSupported)),
            ("MCAST_DEV_ERROR_TIMEOUT", Some(ErrorKind::Timeout)),
            ("MCAST_DEV_ERROR_ABORTED", Some(ErrorKind::Aborted)),
        ] {
            let status = kind.map_or(0, |k| super::super::status_of(k).0);
            assert_eq!(define(name), u64::from(status), "{name}");
        }
    }

    #[test]
    fn header_source_is_the_header_with_its_length() {
        let mut len = 0usize;
        // SAFETY: a valid out-pointer; the result is a static NUL-terminated string.
        let p = unsafe { mcast_device_header_source(&mut len) };
        // SAFETY: as above.
        let text = unsafe { std::ffi::CStr::from_ptr(p) }.to_str().unwrap();
        assert_eq!(text.len(), len);
        assert!(text.starts_with("/*\n * mcast/device.h"));
        assert!(text.contains("mcast_dev_barrier"));
        // SAFETY: NULL is allowed.
        assert_eq!(unsafe { mcast_device_header_source(std::ptr::null_mut()) }, p);
    }
}
