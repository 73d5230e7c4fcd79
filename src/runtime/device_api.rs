//! What an application's kernels need to use a team's memory through `mcast/device.h`: the
//! addresses and sizes of the team's device-API slots and of a buffer's copies, as one rank sees
//! them (made by the team, `team/device_view.rs`, and the buffer, `Buffer::device_view`), and the
//! errors a device-API call records. `src/capi/device_api.rs` copies the views into the C handle
//! structs. A leaf: it imports no team.

use super::error::{Error, ErrorKind, Result};
use crate::driver::DevicePtr;
use crate::kernels::abi::{DEVICE_INFO, ERR_ABORTED, ERR_INVALID, ERR_TIMEOUT};

/// A team as rank `rank`'s kernels see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TeamView {
    /// The rank.
    pub rank: i32,
    /// Ranks in the team.
    pub nranks: i32,
    /// Device-API slots reserved.
    pub nslots: u32,
    /// The team's memory has multicast addresses.
    pub multicast: bool,
    /// The team's timeout (0: none).
    pub timeout_ns: u64,
    /// Rank 0's sync region as mapped on this rank's device.
    pub sync_peer0: DevicePtr,
    /// Bytes between consecutive ranks' sync regions in that mapping.
    pub sync_stride: u64,
    /// Multicast address of the sync regions on this rank's device (0 without).
    pub sync_mc: DevicePtr,
    /// The device-API slots, from the start of a sync region.
    pub dev_offset: u64,
}

/// A buffer as rank `rank`'s kernels see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferView {
    /// The rank.
    pub rank: i32,
    /// Ranks in the team.
    pub nranks: i32,
    /// Bytes of each rank's copy.
    pub bytes: u64,
    /// This rank's copy.
    pub local: DevicePtr,
    /// Rank 0's copy as mapped on this rank's device.
    pub peer0: DevicePtr,
    /// Bytes between consecutive ranks' copies in that mapping.
    pub peer_stride: u64,
    /// Multicast address on this rank's device (0 without).
    pub mc: DevicePtr,
    /// This rank's sync region (where device-side errors are recorded).
    pub sync: DevicePtr,
}

/// The base and stride of `addrs` (rank p's at base + p * stride), or an error naming `what` when
/// they are not evenly spaced (the device API finds peers by that arithmetic).
pub(crate) fn even_stride(addrs: &[DevicePtr], what: &str) -> Result<(DevicePtr, u64)> {
    let base = addrs[0];
    let stride = if addrs.len() > 1 { addrs[1].wrapping_sub(base) } else { 0 };
    for (p, &a) in addrs.iter().enumerate() {
        if a != base.wrapping_add(stride.wrapping_mul(p as u64)) {
            return Err(Error::not_supported(format!(
                "{what}: rank {p}'s copy is at {a:#x}, not at an even stride from rank 0's ({base:#x} + {p} * \
                 {stride:#x}); the device API finds peers by that arithmetic (registered memory must lie at the same \
                 offset of every rank's allocation)"
            )));
        }
    }
    Ok((base, stride))
}

/// The error a device-API call recorded in rank `rank`'s error word (`code`, detail `info`), or
/// `None` when the library's own kernels recorded it (no [`DEVICE_INFO`] bit) and the code is
/// not the device API's own `ERR_INVALID`.
pub fn device_error(rank: i32, code: u32, info: u32, timeout_ms: u32) -> Option<Error> {
    if code != ERR_INVALID && info & DEVICE_INFO == 0 {
        return None;
    }
    let what = (info >> 24) & 0x7f;
    let value = info & 0xff_ffff;
    let call = match what {
        1 => format!("mcast_dev_barrier on slot {value}"),
        2 => format!("mcast_dev_wait on slot {value}"),
        3 => format!("slot {value} is not below the team's slot count (MCAST_DEVICE_SLOTS)"),
        4 => format!("peer {value} is not a rank of the team"),
        5 => format!("offset {value:#x} (low 24 bits) runs past the end of the buffer"),
        6 => format!("offset {value:#x} (low 24 bits) is not aligned to the access width"),
        7 => "a multimem call on a buffer without a multicast address (MCAST_DEV_TRANSPORT_MULTICAST build)".into(),
        _ => format!("detail {info:#x}"),
    };
    Some(match code {
        ERR_TIMEOUT => Error::new(
            ErrorKind::Timeout,
            format!(
                "rank {rank}: {call} timed out (the caller's timeout, or timeout_ms = {timeout_ms} ms): a peer rank \
                 did not arrive; the team reports this error until it is destroyed"
            ),
        ),
        ERR_ABORTED => Error::aborted(format!("rank {rank}: {call} ended because the team was aborted")),
        ERR_INVALID => Error::invalid_argument(format!(
            "rank {rank}: a device-API call (MCAST_DEV_DEBUG) was given a bad argument: {call}; the team is \
             unusable"
        )),
        _ => Error::internal(format!("rank {rank}: device error code {code} (info {info:#x})")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_errors_name_the_call_and_leave_the_library_s_own_alone() {
        assert!(device_error(0, ERR_TIMEOUT, (1 << 8) | 3, 100).is_none());
        let e = device_error(1, ERR_TIMEOUT, DEVICE_INFO | (1 << 24) | 7, 100).unwrap();
        assert_eq!(e.kind, ErrorKind::Timeout);
        assert!(e.message.contains("mcast_dev_barrier on slot 7"), "{}", e.message);
        let e = device_error(0, ERR_INVALID, DEVICE_INFO | (4 << 24) | 9, 100).unwrap();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("peer 9"), "{}", e.message);
        let e = device_error(0, ERR_ABORTED, DEVICE_INFO | (2 << 24) | 1, 100).unwrap();
        assert_eq!(e.kind, ErrorKind::Aborted);
    }

    #[test]
    fn even_stride_accepts_even_strides_and_names_the_odd_rank() {
        assert_eq!(even_stride(&[0x1000, 0x3000, 0x5000], "x").unwrap(), (0x1000, 0x2000));
        assert_eq!(even_stride(&[0x1000], "x").unwrap(), (0x1000, 0));
        let e = even_stride(&[0x1000, 0x3000, 0x5040], "the buffer").unwrap_err();
        assert!(e.message.contains("the buffer: rank 2"), "{}", e.message);
    }
}
