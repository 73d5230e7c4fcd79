//! Copies between host and device memory, device-to-device copies on a stream, memset and the
//! 32-bit peeks and pokes: each checked against the mappings the device may access.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use super::state::State;
use super::{SimDriver, INVALID_VALUE, R};
use crate::driver::{CopyOps, DResult, Device, DevicePtr, Stream};

impl CopyOps for SimDriver {
    fn memcpy_htod(&self, dev: Device, dst: DevicePtr, src: &[u8]) -> DResult<()> {
        self.call("cuMemcpyHtoD", || {
            self.check_dev(dev)?;
            self.unsafe_in_capture()?;
            let st = self.state.lock();
            check_access(&st, dev, dst, src.len())?;
            // SAFETY: the whole range is mapped read-write (checked above, lock held), and `src`
            // is host memory the caller owns, so the ranges cannot overlap.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
            Ok(())
        })
    }

    fn memcpy_dtoh(&self, dev: Device, dst: &mut [u8], src: DevicePtr) -> DResult<()> {
        self.call("cuMemcpyDtoH", || {
            self.check_dev(dev)?;
            self.unsafe_in_capture()?;
            let st = self.state.lock();
            check_access(&st, dev, src, dst.len())?;
            // SAFETY: the source range is mapped read-write (checked above, lock held); `dst` is
            // a distinct host buffer borrowed mutably.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
            Ok(())
        })
    }

    fn poke_u32(&self, dev: Device, dst: DevicePtr, value: u32) -> DResult<()> {
        self.call("cuMemcpyHtoDAsync", || {
            self.check_dev(dev)?;
            self.unsafe_in_capture()?;
            let st = self.state.lock();
            word(&st, dev, dst)?.store(value, Ordering::Release);
            Ok(())
        })
    }

    fn peek_u32(&self, dev: Device, src: DevicePtr) -> DResult<u32> {
        self.call("cuMemcpyDtoHAsync", || {
            self.check_dev(dev)?;
            self.unsafe_in_capture()?;
            let st = self.state.lock();
            Ok(word(&st, dev, src)?.load(Ordering::Acquire))
        })
    }

    fn memcpy_dtod_async(
        &self,
        dev: Device,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: Stream,
    ) -> DResult<()> {
        self.call("cuMemcpyDtoDAsync", || {
            self.check_dev(dev)?;
            if bytes == 0 {
                return Ok(());
            }
            {
                let st = self.state.lock();
                check_access(&st, dev, dst, bytes)?;
                check_access(&st, dev, src, bytes)?;
            }
            if dst < src.saturating_add(bytes as u64) && src < dst.saturating_add(bytes as u64) {
                return Err(INVALID_VALUE);
            }
            let (d, s) = (dst as usize, src as usize);
            // SAFETY: both ranges were mapped for `dev` when the copy was enqueued and do not
            // overlap; the memory outlives work in flight (frees wait for streams), as on a GPU.
            self.submit(
                dev,
                stream,
                Arc::new(move || unsafe { std::ptr::copy_nonoverlapping(s as *const u8, d as *mut u8, bytes) }),
            )
        })
    }

    fn memset_d8(&self, dev: Device, dst: DevicePtr, value: u8, bytes: usize) -> DResult<()> {
        self.call("cuMemsetD8", || {
            self.check_dev(dev)?;
            self.unsafe_in_capture()?;
            let st = self.state.lock();
            check_access(&st, dev, dst, bytes)?;
            // SAFETY: the range is mapped read-write (checked above, lock held).
            unsafe { std::ptr::write_bytes(dst as *mut u8, value, bytes) };
            Ok(())
        })
    }
}

/// `[ptr, ptr + len)` lies in unicast mappings that `dev` may access, with no gap, or in one
/// `cuMemAlloc` block of `dev`.
fn check_access(st: &State, dev: Device, ptr: u64, len: usize) -> R<()> {
    if len == 0 {
        return Ok(());
    }
    if let Some((start, owner, size)) = st.plain_at(ptr) {
        let end = ptr.checked_add(len as u64).ok_or(INVALID_VALUE)?;
        return if owner == dev && end <= start + size as u64 { Ok(()) } else { Err(INVALID_VALUE) };
    }
    for start in st.covering(ptr, len)? {
        let m = st.mappings.get(&start).ok_or(INVALID_VALUE)?;
        if m.multicast || !m.access.contains(&dev) {
            return Err(INVALID_VALUE);
        }
    }
    Ok(())
}

/// The 32-bit word at `addr`, which must be 4-byte aligned and lie in memory `dev` may access,
/// for as long as the state lock `st` is held.
fn word(st: &State, dev: Device, addr: DevicePtr) -> R<&AtomicU32> {
    if !addr.is_multiple_of(4) {
        return Err(INVALID_VALUE);
    }
    check_access(st, dev, addr, 4)?;
    // SAFETY: the word is mapped read-write and 4-byte aligned (checked above); the caller
    // holds the lock, so it stays mapped while borrowed; kernels on the workers access such
    // words atomically only.
    Ok(unsafe { &*(addr as *const AtomicU32) })
}
