//! Copies between host and device memory, device-to-device copies on a stream, memset and the
//! 32-bit peeks and pokes; the synchronous ones run on a private stream.

use std::ffi::c_uint;
use std::ptr;

use cudarc::driver::sys as cu;

use super::exec::stream_ptr;
use super::symbols::{check, Api, Raw};
use super::CudaDriver;
use crate::driver::{CopyOps, DResult, Device, DevicePtr, Stream};

impl CudaDriver {
    /// Runs `copy` (named `what`) on a fresh non-blocking stream of `dev`, waits for that
    /// stream only, and destroys it: the copy neither waits for nor is waited on by work on
    /// the caller's streams (a kernel spinning in a barrier included).
    fn on_private_stream(
        &self,
        dev: Device,
        what: &'static str,
        copy: impl FnOnce(&Api, cu::CUstream) -> Raw,
    ) -> DResult<()> {
        let _ctx = self.enter(dev)?;
        let mut stream: cu::CUstream = ptr::null_mut();
        // SAFETY: the out-pointer is a local; the flag is a valid `CUstream_flags` value.
        check("cuStreamCreate", unsafe {
            (self.api.cuStreamCreate)(&mut stream, cu::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint)
        })?;
        let copied = check(what, copy(&self.api, stream));
        // SAFETY: a stream created above; synchronizing it waits only for the copy.
        let synced = check("cuStreamSynchronize", unsafe { (self.api.cuStreamSynchronize)(stream) });
        // SAFETY: the stream is idle and owned here.
        let destroyed = check("cuStreamDestroy", unsafe { (self.api.cuStreamDestroy_v2)(stream) });
        copied.and(synced).and(destroyed)
    }

    /// `cuStreamSynchronize` of the legacy default stream of the current context.
    fn sync_default_stream(&self) -> DResult<()> {
        // SAFETY: the NULL stream is the legacy default stream of the current context.
        check("cuStreamSynchronize", unsafe { (self.api.cuStreamSynchronize)(ptr::null_mut()) })
    }
}

impl CopyOps for CudaDriver {
    /// Copies, then synchronizes the legacy default stream: from pageable memory
    /// `cuMemcpyHtoD` may return before the DMA lands, and non-blocking streams do not wait
    /// for it.
    fn memcpy_htod(&self, dev: Device, dst: DevicePtr, src: &[u8]) -> DResult<()> {
        if src.is_empty() {
            return Ok(());
        }
        let _ctx = self.enter(dev)?;
        // SAFETY: `src` is readable for `src.len()` bytes for the duration of the call; the
        // driver validates `dst`.
        check("cuMemcpyHtoD", unsafe { (self.api.cuMemcpyHtoD_v2)(dst, src.as_ptr().cast(), src.len()) })?;
        self.sync_default_stream()
    }

    fn memcpy_dtoh(&self, dev: Device, dst: &mut [u8], src: DevicePtr) -> DResult<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let _ctx = self.enter(dev)?;
        // SAFETY: `dst` is writable for `dst.len()` bytes and the copy is synchronous (it
        // returns once the bytes are in `dst`); the driver validates `src`.
        check("cuMemcpyDtoH", unsafe { (self.api.cuMemcpyDtoH_v2)(dst.as_mut_ptr().cast(), src, dst.len()) })
    }

    fn poke_u32(&self, dev: Device, dst: DevicePtr, value: u32) -> DResult<()> {
        let bytes = value.to_ne_bytes();
        self.on_private_stream(dev, "cuMemcpyHtoDAsync", |api, stream| {
            // SAFETY: `bytes` lives until the stream was synchronized (below, in
            // `on_private_stream`); the driver validates `dst`.
            unsafe { (api.cuMemcpyHtoDAsync_v2)(dst, bytes.as_ptr().cast(), 4, stream) }
        })
    }

    fn peek_u32(&self, dev: Device, src: DevicePtr) -> DResult<u32> {
        let mut bytes = [0u8; 4];
        self.on_private_stream(dev, "cuMemcpyDtoHAsync", |api, stream| {
            // SAFETY: `bytes` is writable and lives until the stream was synchronized; the
            // driver validates `src`.
            unsafe { (api.cuMemcpyDtoHAsync_v2)(bytes.as_mut_ptr().cast(), src, 4, stream) }
        })?;
        Ok(u32::from_ne_bytes(bytes))
    }

    fn memcpy_dtod_async(
        &self,
        dev: Device,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: Stream,
    ) -> DResult<()> {
        if bytes == 0 {
            return Ok(());
        }
        let _ctx = self.enter(dev)?;
        // SAFETY: plain values; the driver validates both ranges and the stream.
        check("cuMemcpyDtoDAsync", unsafe { (self.api.cuMemcpyDtoDAsync_v2)(dst, src, bytes, stream_ptr(stream)) })
    }

    /// Sets, then synchronizes the legacy default stream (`cuMemsetD8` is asynchronous for
    /// device memory).
    fn memset_d8(&self, dev: Device, dst: DevicePtr, value: u8, bytes: usize) -> DResult<()> {
        if bytes == 0 {
            return Ok(());
        }
        let _ctx = self.enter(dev)?;
        // SAFETY: plain values; the driver validates the range.
        check("cuMemsetD8", unsafe { (self.api.cuMemsetD8_v2)(dst, value, bytes) })?;
        self.sync_default_stream()
    }
}
