//! Contexts: each device's primary context, retained once, and the guard that makes it current
//! for one call and restores the caller's context afterwards.

use std::ptr;
use std::sync::OnceLock;

use cudarc::driver::sys as cu;

use super::symbols::{check, Api};
use super::{CudaDriver, Retained};
use crate::driver::{CuResult, DResult, Device, DriverError};

/// Pops the context it pushed when dropped, restoring the caller's current context.
pub(super) struct CtxGuard<'a> {
    api: &'a Api,
    pushed: bool,
}

impl Drop for CtxGuard<'_> {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped: cu::CUcontext = ptr::null_mut();
            // SAFETY: this guard pushed a context on this thread and nothing popped it since
            // (the guard lives only within one driver call); the out-pointer is a local.
            // A failure (e.g. `CUDA_ERROR_DEINITIALIZED` at exit) leaves nothing to undo.
            let _ = unsafe { (self.api.cuCtxPopCurrent_v2)(&mut popped) };
        }
    }
}
impl CudaDriver {
    /// `cuDeviceGet` for ordinal `dev`.
    pub(super) fn cu_device(&self, dev: Device) -> DResult<cu::CUdevice> {
        let mut device: cu::CUdevice = 0;
        // SAFETY: the out-pointer is a local; the ordinal is checked by the driver.
        check("cuDeviceGet", unsafe { (self.api.cuDeviceGet)(&mut device, dev) })?;
        Ok(device)
    }

    /// The primary context of `dev`, retained on first use. After that one atomic load: no
    /// lock (every call that takes a device asks, from every rank's thread).
    pub(super) fn primary_ctx(&self, dev: Device) -> DResult<cu::CUcontext> {
        let slot = usize::try_from(dev).ok().and_then(|i| self.contexts.get(i));
        if let Some(r) = slot.and_then(OnceLock::get) {
            return Ok(r.ctx as cu::CUcontext);
        }
        let _one = self.retaining.lock();
        if let Some(r) = slot.and_then(OnceLock::get) {
            return Ok(r.ctx as cu::CUcontext);
        }
        // An ordinal outside the devices counted at load fails here (`CUDA_ERROR_INVALID_DEVICE`).
        let device = self.cu_device(dev)?;
        let Some(slot) = slot else {
            return Err(DriverError::new("cuDeviceGet", CuResult::ERROR_INVALID_DEVICE));
        };
        let mut ctx: cu::CUcontext = ptr::null_mut();
        // SAFETY: `device` came from `cuDeviceGet`; the out-pointer is a local. The retain is
        // balanced by `cuDevicePrimaryCtxRelease` in `Drop`.
        check("cuDevicePrimaryCtxRetain", unsafe { (self.api.cuDevicePrimaryCtxRetain)(&mut ctx, device) })?;
        // Under `retaining` and checked empty above: the set succeeds.
        let _ = slot.set(Retained { device, ctx: ctx as usize });
        Ok(ctx)
    }

    /// Makes `dev`'s primary context current until the guard drops. When it already is current
    /// (a caller using the CUDA runtime on that device) nothing is pushed: one driver call on
    /// the launch path instead of three.
    pub(super) fn enter(&self, dev: Device) -> DResult<CtxGuard<'_>> {
        let ctx = self.primary_ctx(dev)?;
        let mut current: cu::CUcontext = ptr::null_mut();
        // SAFETY: the out-pointer is a local.
        let raw = unsafe { (self.api.cuCtxGetCurrent)(&mut current) };
        if raw == CuResult::SUCCESS.0 && current == ctx {
            return Ok(CtxGuard { api: &self.api, pushed: false });
        }
        // SAFETY: `ctx` is a primary context this driver retained and has not released.
        check("cuCtxPushCurrent", unsafe { (self.api.cuCtxPushCurrent_v2)(ctx) })?;
        Ok(CtxGuard { api: &self.api, pushed: true })
    }

    /// Makes sure some context is current (the caller's, else device 0's primary context),
    /// best effort: when that fails the guard does nothing and the call reports its own error.
    pub(super) fn enter_any(&self) -> CtxGuard<'_> {
        let mut current: cu::CUcontext = ptr::null_mut();
        // SAFETY: the out-pointer is a local.
        let raw = unsafe { (self.api.cuCtxGetCurrent)(&mut current) };
        if raw == CuResult::SUCCESS.0 && !current.is_null() {
            return CtxGuard { api: &self.api, pushed: false };
        }
        self.enter(0).unwrap_or(CtxGuard { api: &self.api, pushed: false })
    }
}
