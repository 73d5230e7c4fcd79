//! Copies between host and device, and between device addresses.

use super::{DResult, Device, DevicePtr, Stream};

/// Copies and sets of device memory. Part of [`super::Driver`].
pub trait CopyOps {
    /// Synchronous `cuMemcpyHtoD` into memory `dev` can access.
    fn memcpy_htod(&self, dev: Device, dst: DevicePtr, src: &[u8]) -> DResult<()>;

    /// Synchronous `cuMemcpyDtoH` from memory `dev` can access.
    fn memcpy_dtoh(&self, dev: Device, dst: &mut [u8], src: DevicePtr) -> DResult<()>;

    /// Writes one 32-bit word of memory `dev` can access (its own or a peer's through a
    /// mapping) without waiting for work on any stream: `cuMemcpyHtoDAsync` on a private
    /// non-blocking stream, which only that copy joins. Kernels spinning on the word see it
    /// within microseconds; used to abort a team. Potentially unsafe in a stream capture (it
    /// synchronizes its stream): callers that may run beside another thread's capture wrap it
    /// in [`crate::driver::RelaxedCapture`].
    fn poke_u32(&self, dev: Device, dst: DevicePtr, value: u32) -> DResult<()>;

    /// Reads one 32-bit word of memory `dev` can access without waiting for work on any
    /// stream (`cuMemcpyDtoHAsync` on a private non-blocking stream). Potentially unsafe in a
    /// stream capture, as [`CopyOps::poke_u32`].
    fn peek_u32(&self, dev: Device, src: DevicePtr) -> DResult<u32>;

    /// `cuMemcpyDtoDAsync`: enqueues a copy of `bytes` bytes from `src` to `dst` (both memory
    /// `dev` can access; they must not overlap) on `stream`, ordered with the stream's other
    /// work (and recorded when the stream is capturing). Returns once enqueued.
    fn memcpy_dtod_async(
        &self,
        dev: Device,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: Stream,
    ) -> DResult<()>;

    /// Synchronous `cuMemsetD8`.
    fn memset_d8(&self, dev: Device, dst: DevicePtr, value: u8, bytes: usize) -> DResult<()>;
}
