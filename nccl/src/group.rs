//! `ncclGroupStart` / `ncclGroupEnd`.
//!
//! Outside a group a call runs at once. Inside one it is queued on the calling thread and runs
//! at the outermost `ncclGroupEnd`, in the order the calls were made. One thread often drives
//! every rank of a team (nccl-tests `-g`, `ncclCommInitAll` programs); calls that wait for
//! their peers (creation, split, registration) cannot then run one after another, so when the
//! group holds one, every communicator's calls run on a thread of their own, together. Calls
//! forwarded to the fallback NCCL run on the calling thread inside one of its groups. Otherwise
//! the queued calls run on the calling thread, the communicators' calls taken in turn (the first
//! of each, then the second of each, ...): CUDA loads a kernel module (each kind's first call)
//! only once the device's running kernels are done, so `{AllReduce(c0), AllGather(c0),
//! AllReduce(c1), AllGather(c1)}` run as written would wait in the all-gather's load for c0's
//! all-reduce, which waits for c1's, not yet issued. A group leaves the order across
//! communicators free; each communicator's own order is kept.

use std::cell::RefCell;
use std::sync::Arc;

use crate::comm::Comm;
use crate::fallback;
use crate::types::{self, ncclResult_t, Failure, Outcome};

/// A call run now or at the end of the group.
pub struct Op {
    /// The communicator whose calls it is ordered with (none for forwarded calls).
    pub comm: Option<Arc<Comm>>,
    /// Whether it waits for the other ranks on the host.
    pub blocking: bool,
    /// Whether it goes to the fallback NCCL.
    pub forwarded: bool,
    /// The call.
    pub run: Box<dyn FnOnce() -> Outcome + Send>,
}

#[derive(Default)]
struct Group {
    depth: u32,
    ops: Vec<Op>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// Whether the calling thread is inside a group.
pub fn in_group() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// Runs `op` now, or queues it until the end of the calling thread's group.
pub fn submit(op: Op) -> Outcome {
    let queued = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.ops.push(op);
            None
        } else {
            Some(op)
        }
    });
    match queued {
        None => Ok(()),
        Some(op) if op.forwarded => run_forwarded(vec![op]),
        Some(op) => (op.run)(),
    }
}

/// `ncclGroupStart`.
pub fn start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

/// `ncclGroupEnd`: the outermost one runs the queued calls.
pub fn end() -> Outcome {
    let ops = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Failure::new(types::INVALID_USAGE, "ncclGroupEnd without a matching ncclGroupStart"));
        }
        g.depth -= 1;
        Ok(if g.depth == 0 { std::mem::take(&mut g.ops) } else { Vec::new() })
    })?;
    run(ops)
}

fn run(ops: Vec<Op>) -> Outcome {
    let (forwarded, served): (Vec<Op>, Vec<Op>) = ops.into_iter().partition(|o| o.forwarded);
    let mut first: Outcome = Ok(());
    let blocking = served.iter().any(|o| o.blocking);
    let lanes = lanes_by(served, |op| op.comm.as_ref().map_or(0, |c| Arc::as_ptr(c) as usize));
    if blocking {
        // One thread per communicator, its calls in order.
        let results: Vec<Outcome> = std::thread::scope(|s| {
            let handles: Vec<_> = lanes
                .into_iter()
                .map(|ops| {
                    s.spawn(move || {
                        let mut r = Ok(());
                        for op in ops {
                            let out = (op.run)();
                            if r.is_ok() {
                                r = out;
                            }
                        }
                        r
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(Failure::new(types::INTERNAL_ERROR, "a group call panicked"))))
                .collect()
        });
        for r in results {
            if first.is_ok() {
                first = r;
            }
        }
    } else {
        for op in round_robin(lanes) {
            let r = (op.run)();
            if first.is_ok() {
                first = r;
            }
        }
    }
    if !forwarded.is_empty() {
        let r = run_forwarded(forwarded);
        if first.is_ok() {
            first = r;
        }
    }
    first
}

/// Runs forwarded calls inside one group of the fallback NCCL.
fn run_forwarded(ops: Vec<Op>) -> Outcome {
    type Group = unsafe extern "C" fn() -> ncclResult_t;
    let lib = match fallback::library() {
        Some(Ok(lib)) => lib,
        _ => return Err(Failure::new(types::INVALID_USAGE, "no fallback NCCL (MCAST_NCCL_FALLBACK)")),
    };
    // SAFETY: NCCL's signatures.
    let start: Group = unsafe { lib.function("ncclGroupStart") }.map_err(|e| Failure::new(types::INVALID_USAGE, e))?;
    // SAFETY: as above.
    let end: Group = unsafe { lib.function("ncclGroupEnd") }.map_err(|e| Failure::new(types::INVALID_USAGE, e))?;
    // SAFETY: no arguments.
    let r = unsafe { start() };
    if r != types::SUCCESS {
        return Err(Failure::new(r, "the fallback NCCL's ncclGroupStart failed"));
    }
    let mut first: Outcome = Ok(());
    for op in ops {
        let out = (op.run)();
        if first.is_ok() {
            first = out;
        }
    }
    // SAFETY: no arguments; closes the group opened above.
    let r = unsafe { end() };
    if r != types::SUCCESS && first.is_ok() {
        first = Err(Failure::new(r, "the fallback NCCL's ncclGroupEnd failed"));
    }
    first
}

/// `items` split by `key`: one lane per key, in the order the keys first appear, each lane in
/// the items' order.
fn lanes_by<T>(items: Vec<T>, key: impl Fn(&T) -> usize) -> Vec<Vec<T>> {
    let mut lanes: Vec<(usize, Vec<T>)> = Vec::new();
    for item in items {
        let k = key(&item);
        match lanes.iter_mut().find(|(lane, _)| *lane == k) {
            Some((_, v)) => v.push(item),
            None => lanes.push((k, vec![item])),
        }
    }
    lanes.into_iter().map(|(_, v)| v).collect()
}

/// The first item of every lane, then the second of every lane, and so on.
fn round_robin<T>(lanes: Vec<Vec<T>>) -> Vec<T> {
    let total = lanes.iter().map(Vec::len).sum();
    let mut iters: Vec<_> = lanes.into_iter().map(Vec::into_iter).collect();
    let mut out = Vec::with_capacity(total);
    while out.len() < total {
        out.extend(iters.iter_mut().filter_map(Iterator::next));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_communicators_calls_run_in_turn_each_in_its_own_order() {
        // (communicator, call): c0 made three calls, c1 two, c2 one, interleaved as a program
        // might queue them.
        let queued = vec![(0, "a0"), (0, "a1"), (1, "b0"), (0, "a2"), (2, "c0"), (1, "b1")];
        let lanes = lanes_by(queued, |&(c, _)| c);
        assert_eq!(lanes.len(), 3);
        let order: Vec<&str> = round_robin(lanes).into_iter().map(|(_, n)| n).collect();
        assert_eq!(order, ["a0", "b0", "c0", "a1", "b1", "a2"]);
        assert!(round_robin(lanes_by(Vec::<(usize, u8)>::new(), |&(c, _)| c)).is_empty());
    }
}
