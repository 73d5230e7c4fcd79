//! Which part of a thread's time is the simulated GPU's. On the simulator the calling thread
//! runs both the library's code and, inside every simulated driver call and the building of a
//! collective's host-executed job, the simulated device's own work (its bookkeeping, its
//! queues, the job's address lists): on CUDA that part is the driver's and the GPU's. A
//! thread-local depth marks the device's part, so a test or a benchmark can tell the two apart:
//! [`CountingAlloc`], installed as the global allocator by the allocation-counting test in
//! `tests/host_path.rs` and by `mcast-bench` (`--host-overhead`), counts each part's allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// Allocations (and reallocations) this thread made outside the simulated device's work.
    static LIBRARY: Cell<u64> = const { Cell::new(0) };
    /// Those it made while running the simulated device's work.
    static DEVICE: Cell<u64> = const { Cell::new(0) };
}

/// True while this thread runs the simulated device's own work (inside a [`DeviceWork`]).
/// Cheap and allocation-free: callable from a global allocator.
pub fn in_device() -> bool {
    DEPTH.try_with(|d| d.get() > 0).unwrap_or(false)
}

/// Marks this thread as running simulated device work until dropped (nests).
#[must_use = "the mark lasts as long as the guard"]
pub struct DeviceWork(());

impl DeviceWork {
    /// Enters the simulated device's part of this thread's work.
    pub fn enter() -> DeviceWork {
        let _ = DEPTH.try_with(|d| d.set(d.get() + 1));
        DeviceWork(())
    }
}

impl Drop for DeviceWork {
    fn drop(&mut self) {
        let _ = DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// The system allocator, counting each thread's allocations and reallocations, those made in
/// the simulated device's work ([`in_device`]) apart. Counts only when a program installs it
/// with `#[global_allocator]`; read with [`library_allocations`] and [`device_allocations`].
pub struct CountingAlloc;

fn count() {
    let which = if in_device() { &DEVICE } else { &LIBRARY };
    let _ = which.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every call is forwarded to the system allocator unchanged.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Allocations this thread has made so far outside the simulated device's work (0 unless
/// [`CountingAlloc`] is the global allocator).
pub fn library_allocations() -> u64 {
    LIBRARY.try_with(Cell::get).unwrap_or(0)
}

/// Allocations this thread has made so far in the simulated device's work.
pub fn device_allocations() -> u64 {
    DEVICE.try_with(Cell::get).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_nests_and_ends() {
        assert!(!in_device());
        {
            let _a = DeviceWork::enter();
            assert!(in_device());
            {
                let _b = DeviceWork::enter();
                assert!(in_device());
            }
            assert!(in_device());
        }
        assert!(!in_device());
    }
}
