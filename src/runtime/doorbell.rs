//! A team's doorbell: one word of mapped host memory (`cuMemHostAlloc`, portable and mapped)
//! that the team's kernels in this process ring once they have recorded an error
//! (`mcast_dev__ring`, include/mcast/device.h; the simulator's `ring`), and that the host polls
//! with an atomic load.
//!
//! Why: `mcast_team_get_error` (and `ncclCommGetAsyncError` over it) is called all the time by
//! watchdog threads, also while another thread of the process captures a CUDA graph. Reading
//! the device's error words takes a copy and a stream synchronization, which a capture in
//! global mode forbids to every thread of the process: the capture would be invalidated. The
//! doorbell turns the healthy poll into one load of host memory, no driver call; only after it
//! rang does the host read the device words (and then through
//! [`crate::driver::RelaxedCapture`]).
//!
//! The address lives in every own rank's sync region ([`DOORBELL_OFFSET`]), written when the
//! region is zeroed at team creation. The word is a hint: [`Doorbell::rang`] clears it before
//! the host reads the device words, so an error recorded while they are read rings again.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use parking_lot::Mutex;

use super::env::{Env, Leftover};
use super::error::{Error, Result};
use super::registry::{ResourceId, ResourceKind};
use crate::driver::{CuResult, Device, DevicePtr};

#[cfg(doc)]
use crate::kernels::abi::DOORBELL_OFFSET;

/// Bytes of one doorbell allocation (the driver's page).
const BYTES: usize = 4096;

/// A team's doorbell in this process.
pub struct Doorbell {
    /// The device whose context made the allocation.
    dev: Device,
    /// Host pointer and device pointer alike (unified addressing).
    addr: DevicePtr,
    /// Its record in the context's registry, until freed.
    record: Mutex<Option<ResourceId>>,
    freed: AtomicBool,
}

impl Doorbell {
    /// A silent doorbell, made in `dev`'s context, recorded for `owner`.
    pub fn create(env: &Env, dev: Device, owner: &str) -> Result<Doorbell> {
        let addr = env.driver().host_alloc_mapped(dev, BYTES).map_err(|e| {
            Error::driver(e, format_args!("allocating the team's doorbell ({BYTES} bytes of mapped host memory)"))
        })?;
        let id = env.resources.track(ResourceKind::HostMemory, BYTES as u64, Some(dev), owner);
        Ok(Doorbell { dev, addr, record: Mutex::new(Some(id)), freed: AtomicBool::new(false) })
    }

    /// The address the kernels ring (stored in the sync regions).
    pub fn address(&self) -> DevicePtr {
        self.addr
    }

    fn word(&self) -> &AtomicU32 {
        // SAFETY: `addr` is a live, page-aligned allocation of `BYTES` bytes of host memory until
        // `release` frees it, which happens only once no reader is left (the team is released);
        // the word is only accessed atomically, here and by the kernels' system-scope store.
        unsafe { &*(self.addr as *const AtomicU32) }
    }

    /// True when a kernel rang since the last call (and silences it): the device words are
    /// then worth reading. One atomic swap of host memory; no driver call.
    pub fn rang(&self) -> bool {
        if self.freed.load(Ordering::Acquire) {
            return false;
        }
        // Checked with a load first: a healthy team's poll writes nothing to the shared line.
        self.word().load(Ordering::Acquire) != 0 && self.word().swap(0, Ordering::AcqRel) != 0
    }
}

impl Leftover for Doorbell {
    /// Frees the memory (`cuMemFreeHost`) once; the caller made sure no kernel of the team can
    /// still ring it.
    fn release(&self, env: &Env) -> Vec<Error> {
        if self.freed.load(Ordering::Acquire) {
            return Vec::new();
        }
        match env.driver().host_free_mapped(self.dev, self.addr) {
            Ok(()) => {
                self.freed.store(true, Ordering::Release);
                if let Some(id) = self.record.lock().take() {
                    env.resources.untrack(id);
                }
                Vec::new()
            }
            Err(e) if e.code == CuResult::ERROR_DEINITIALIZED => Vec::new(),
            Err(e) => vec![Error::driver(e, "freeing the team's doorbell")],
        }
    }
}
