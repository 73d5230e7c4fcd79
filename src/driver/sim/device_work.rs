//! Which part of a thread's time is the simulated GPU's. On the simulator the calling thread
//! runs both the library's code and, inside every simulated driver call and the building of a
//! collective's host-executed job, the simulated device's own work (its bookkeeping, its
//! queues, the job's address lists): on CUDA that part is the driver's and the GPU's. A
//! thread-local depth marks the device's part, so a test or a benchmark can tell the two apart
//! (the allocation-counting test in `tests/host_path.rs`, `mcast-bench --host-overhead`).

use std::cell::Cell;

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
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
