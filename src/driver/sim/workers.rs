//! One worker thread per (device, stream): the simulated device's in-order stream execution.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use crate::driver::Device;

/// Work for a stream.
pub(super) type Work = Box<dyn FnOnce() + Send>;

enum Job {
    Run(Work),
    Stop,
}

struct Worker {
    tx: mpsc::Sender<Job>,
    thread: JoinHandle<()>,
}

/// The workers, created lazily per `(device, stream)` key.
#[derive(Default)]
pub(super) struct Workers {
    live: Mutex<HashMap<(Device, usize), Worker>>,
    retired: Mutex<Vec<JoinHandle<()>>>,
}

impl Workers {
    /// Runs `work` after everything enqueued before on `key`. Fails only when no thread can be
    /// started.
    pub(super) fn enqueue(&self, key: (Device, usize), work: Work) -> std::io::Result<()> {
        let mut live = self.live.lock();
        let worker = match live.entry(key) {
            Entry::Occupied(slot) => slot.into_mut(),
            Entry::Vacant(slot) => {
                let (tx, rx) = mpsc::channel::<Job>();
                let thread = std::thread::Builder::new()
                    .name(format!("mcast-sim-d{}-s{:x}", key.0, key.1))
                    .spawn(move || run(rx))?;
                slot.insert(Worker { tx, thread })
            }
        };
        // The receiver lives as long as the worker thread, which only ends on `Stop`.
        worker.tx.send(Job::Run(work)).map_err(|_| std::io::Error::other("worker stopped"))
    }

    /// Waits until everything enqueued so far on `key` has run.
    pub(super) fn synchronize(&self, key: (Device, usize)) {
        let (tx, rx) = mpsc::sync_channel::<()>(1);
        {
            let live = self.live.lock();
            let Some(worker) = live.get(&key) else { return };
            let marker: Work = Box::new(move || {
                let _ = tx.send(());
            });
            if worker.tx.send(Job::Run(marker)).is_err() {
                return;
            }
        }
        // Err only if the worker is gone, in which case nothing is left to wait for.
        let _ = rx.recv();
    }

    /// Waits until everything enqueued so far on every stream of `dev` has run.
    pub(super) fn synchronize_device(&self, dev: Device) {
        let keys: Vec<(Device, usize)> = self.live.lock().keys().filter(|k| k.0 == dev).copied().collect();
        for key in keys {
            self.synchronize(key);
        }
    }

    /// Stops the worker of `key` once its queued work has run, without waiting for it.
    pub(super) fn retire(&self, key: (Device, usize)) {
        let Some(worker) = self.live.lock().remove(&key) else {
            return;
        };
        let _ = worker.tx.send(Job::Stop);
        let mut retired = self.retired.lock();
        retired.retain(|t| !t.is_finished());
        retired.push(worker.thread);
    }

    /// Number of worker threads alive (including retired ones still draining).
    pub(super) fn threads(&self) -> usize {
        let retired = self.retired.lock().iter().filter(|t| !t.is_finished()).count();
        self.live.lock().len() + retired
    }

    /// Stops every worker after its queued work and joins them all.
    pub(super) fn shutdown(&self) {
        let live: Vec<Worker> = self.live.lock().drain().map(|(_, w)| w).collect();
        let mut threads: Vec<JoinHandle<()>> = self.retired.lock().drain(..).collect();
        for worker in live {
            let _ = worker.tx.send(Job::Stop);
            threads.push(worker.thread);
        }
        for thread in threads {
            let _ = thread.join();
        }
    }
}

fn run(rx: mpsc::Receiver<Job>) {
    while let Ok(Job::Run(work)) = rx.recv() {
        if catch_unwind(AssertUnwindSafe(work)).is_err() {
            tracing::error!("mcast sim: a stream work item panicked; the stream goes on with the next one");
        }
    }
}
