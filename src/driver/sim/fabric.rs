//! The simulator's `CU_MEM_HANDLE_TYPE_FABRIC` handles: 64 bytes that name an allocation (or a
//! multicast object's control block) so that another process can open it without being passed
//! a descriptor, as a real fabric handle names memory anywhere in an NVLink domain.
//!
//! Layout (native endianness): magic `u32`, version `u32`, exporting process id `u32`, its
//! descriptor number `i32`, the memfd's `st_dev` `u64` and `st_ino` `u64`, the exporter's
//! fabric (`u64`, see [`fabric_id`]), then zeros. The importer opens `/proc/<pid>/fd/<fd>` and
//! checks that what it opened is the same file, so a stale handle (the exporter released the
//! memory, the number was reused) is refused; a handle of another fabric is refused first.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::host;
use crate::driver::{CuResult, FABRIC_HANDLE_BYTES};

const MAGIC: u32 = 0x4246_434d; // "MCFB"
const VERSION: u32 = 2;

/// The cluster UUID of the simulated fabric `name`.
pub(super) fn cluster_uuid(name: &str) -> [u8; 16] {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(format!("mcast-sim-fabric/{name}").as_bytes());
    d[..16].try_into().expect("16 bytes")
}

/// How a handle names the fabric (name and clique) it was made in; never 0.
pub(super) fn fabric_id(fabric: &(String, u32)) -> u64 {
    let u = cluster_uuid(&format!("{}:{}", fabric.0, fabric.1));
    u64::from_ne_bytes(u[..8].try_into().expect("8 bytes")) | 1
}

/// The handle of descriptor `fd` of process `pid`, a memfd with `identity`, made in fabric
/// `fabric` (see [`fabric_id`]).
pub(super) fn encode(pid: u32, fd: RawFd, identity: (u64, u64), fabric: u64) -> [u8; FABRIC_HANDLE_BYTES] {
    let mut out = [0u8; FABRIC_HANDLE_BYTES];
    out[0..4].copy_from_slice(&MAGIC.to_ne_bytes());
    out[4..8].copy_from_slice(&VERSION.to_ne_bytes());
    out[8..12].copy_from_slice(&pid.to_ne_bytes());
    out[12..16].copy_from_slice(&fd.to_ne_bytes());
    out[16..24].copy_from_slice(&identity.0.to_ne_bytes());
    out[24..32].copy_from_slice(&identity.1.to_ne_bytes());
    out[32..40].copy_from_slice(&fabric.to_ne_bytes());
    out
}

/// The fabric a well-formed handle was made in.
pub(super) fn fabric_of(data: &[u8; FABRIC_HANDLE_BYTES]) -> Option<u64> {
    decode(data).map(|_| u64::from_ne_bytes(data[32..40].try_into().expect("8 bytes")))
}

/// Process id, descriptor and identity of a well-formed handle.
fn decode(data: &[u8; FABRIC_HANDLE_BYTES]) -> Option<(u32, RawFd, (u64, u64))> {
    let u32_at = |i: usize| u32::from_ne_bytes(data[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_ne_bytes(data[i..i + 8].try_into().expect("8 bytes"));
    if u32_at(0) != MAGIC || u32_at(4) != VERSION || data[40..].iter().any(|&b| b != 0) {
        return None;
    }
    let fd = u32_at(12) as RawFd;
    if u32_at(8) == 0 || fd < 0 {
        return None;
    }
    Some((u32_at(8), fd, (u64_at(16), u64_at(24))))
}

/// Opens the file a handle names. Garbage is `INVALID_VALUE`; so is a handle whose process or
/// descriptor is gone or now names another file; a process this one may not look into is
/// `NOT_PERMITTED`.
pub(super) fn open(data: &[u8; FABRIC_HANDLE_BYTES]) -> Result<OwnedFd, CuResult> {
    let (pid, fd, identity) = decode(data).ok_or(CuResult::ERROR_INVALID_VALUE)?;
    let path = std::ffi::CString::new(format!("/proc/{pid}/fd/{fd}")).expect("no NUL");
    // SAFETY: a valid NUL-terminated path; the result is checked.
    let raw = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        let err = std::io::Error::last_os_error();
        return Err(match err.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => CuResult::ERROR_NOT_PERMITTED,
            _ => CuResult::ERROR_INVALID_VALUE,
        });
    }
    // SAFETY: `raw` is a fresh descriptor that nothing else owns.
    let own = unsafe { OwnedFd::from_raw_fd(raw) };
    if host::fd_identity(own.as_raw_fd()).ok() != Some(identity) {
        return Err(CuResult::ERROR_INVALID_VALUE);
    }
    Ok(own)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_garbage_is_refused() {
        let h = encode(42, 7, (1, 2), 9);
        assert_eq!(decode(&h), Some((42, 7, (1, 2))));
        assert_eq!(fabric_of(&h), Some(9));
        assert_eq!(decode(&[0u8; FABRIC_HANDLE_BYTES]), None);
        let mut tail = h;
        tail[63] = 1;
        assert_eq!(decode(&tail), None);
        assert_eq!(open(&[0xa5u8; FABRIC_HANDLE_BYTES]).unwrap_err(), CuResult::ERROR_INVALID_VALUE);
    }
}
