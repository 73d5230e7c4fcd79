//! Streams and launch: work queued on the per-(device, stream) workers, events, stream capture
//! and CUDA graphs, modules and kernel launch.

use std::cell::Cell;
use std::ffi::{c_void, CStr};
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use super::{SimDriver, R};
use crate::driver::{
    CaptureMode, CuResult, DResult, Device, Event, ExecOps, Function, Graph, GraphExec, LaunchConfig, Module, Stream,
};

#[derive(Default)]
struct EventState {
    recorded: u64,
    reached: u64,
    time: Option<Instant>,
}

#[derive(Default)]
pub(super) struct EventCell {
    state: Mutex<EventState>,
    reached: Condvar,
    /// Created with `CU_EVENT_DISABLE_TIMING`.
    untimed: bool,
}

impl EventCell {
    fn synchronize(&self) -> Option<Instant> {
        let mut st = self.state.lock();
        while st.reached < st.recorded {
            self.reached.wait(&mut st);
        }
        st.time
    }

    /// Blocks until the `record`-th record of the event has been reached on its stream.
    fn wait_for(&self, record: u64) {
        let mut st = self.state.lock();
        while st.reached < record {
            self.reached.wait(&mut st);
        }
    }
}

/// Stream work that can run more than once: a launch recorded by a stream capture.
pub(super) type Node = Arc<dyn Fn() + Send + Sync>;

/// A stream capture in progress.
pub(super) struct Capture {
    nodes: Vec<Node>,
    /// Set by an illegal call during the capture; ending it then fails.
    invalidated: bool,
    /// The mode it was begun in.
    mode: CaptureMode,
    /// The thread that began it.
    thread: ThreadId,
}

thread_local! {
    /// The calling thread's capture interaction mode (`cuThreadExchangeStreamCaptureMode`).
    static THREAD_MODE: Cell<CaptureMode> = const { Cell::new(CaptureMode::Global) };
}

impl SimDriver {
    /// Runs `work` on the worker of `(dev, stream)` after everything enqueued there before: the
    /// simulated kernel launch (counted, and faultable, as `cuLaunchKernel`). Any `stream` value
    /// is accepted; `Stream(0)` is the legacy default stream of `dev`. On a capturing stream the
    /// work is recorded into the capture instead (so it must be able to run more than once).
    pub fn enqueue(&self, dev: Device, stream: Stream, work: impl Fn() + Send + Sync + 'static) -> DResult<()> {
        self.call("cuLaunchKernel", || {
            self.check_dev(dev)?;
            self.submit(dev, stream, Arc::new(work))
        })
    }

    /// Queues `node` on `(dev, stream)`, or records it when that stream is capturing.
    pub(super) fn submit(&self, dev: Device, stream: Stream, node: Node) -> R<()> {
        if let Some(capture) = self.state.lock().captures.get_mut(&(dev, stream.0)) {
            capture.nodes.push(node);
            return Ok(());
        }
        self.workers
            .enqueue((dev, stream.0), Box::new(move || node()))
            .map_err(|_| CuResult::ERROR_LAUNCH_OUT_OF_RESOURCES)
    }

    /// The check CUDA makes at the start of a potentially unsafe call (see [`CaptureMode`]):
    /// when a live capture prohibits the calling thread from such calls (its own capture not
    /// begun relaxed; or, the thread in global mode, another thread's capture begun global),
    /// every such capture is invalidated and the call fails with
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`.
    pub(super) fn unsafe_in_capture(&self) -> R<()> {
        let mode = THREAD_MODE.with(Cell::get);
        if mode == CaptureMode::Relaxed {
            return Ok(());
        }
        let me = std::thread::current().id();
        let mut prohibited = false;
        for capture in self.state.lock().captures.values_mut() {
            let own = capture.thread == me && capture.mode != CaptureMode::Relaxed;
            let global = mode == CaptureMode::Global && capture.thread != me && capture.mode == CaptureMode::Global;
            if own || global {
                capture.invalidated = true;
                prohibited = true;
            }
        }
        if prohibited {
            Err(CuResult::ERROR_STREAM_CAPTURE_UNSUPPORTED)
        } else {
            Ok(())
        }
    }

    /// True when `(dev, stream)` is capturing; the capture is then invalidated (what an illegal
    /// call during a capture does).
    fn invalidate_capture(&self, dev: Device, stream: Stream) -> bool {
        match self.state.lock().captures.get_mut(&(dev, stream.0)) {
            Some(capture) => {
                capture.invalidated = true;
                true
            }
            None => false,
        }
    }
}

impl SimDriver {
    /// `cuEventCreate`, with `CU_EVENT_DISABLE_TIMING` when `untimed`.
    fn new_event(&self, dev: Device, untimed: bool) -> DResult<Event> {
        self.call("cuEventCreate", || {
            self.check_dev(dev)?;
            let mut st = self.state.lock();
            let id = st.fresh_id() as usize;
            st.events.insert(id, (dev, Arc::new(EventCell { untimed, ..EventCell::default() })));
            Ok(Event(id))
        })
    }
}

impl ExecOps for SimDriver {
    fn stream_create(&self, dev: Device) -> DResult<Stream> {
        self.call("cuStreamCreate", || {
            self.check_dev(dev)?;
            let mut st = self.state.lock();
            let id = st.fresh_id() as usize;
            st.streams.insert(id, dev);
            Ok(Stream(id))
        })
    }

    fn stream_destroy(&self, dev: Device, stream: Stream) -> DResult<()> {
        self.call("cuStreamDestroy", || {
            self.check_dev(dev)?;
            let mut st = self.state.lock();
            if st.streams.get(&stream.0) != Some(&dev) {
                return Err(CuResult::ERROR_INVALID_HANDLE);
            }
            st.streams.remove(&stream.0);
            // A capture still open on it ends with the stream.
            st.captures.remove(&(dev, stream.0));
            drop(st);
            // Work already queued still runs, as on hardware.
            self.workers.retire((dev, stream.0));
            Ok(())
        })
    }

    fn stream_synchronize(&self, dev: Device, stream: Stream) -> DResult<()> {
        self.call("cuStreamSynchronize", || {
            self.check_dev(dev)?;
            if self.invalidate_capture(dev, stream) {
                return Err(CuResult::ERROR_STREAM_CAPTURE_UNSUPPORTED);
            }
            self.unsafe_in_capture()?;
            self.workers.synchronize((dev, stream.0));
            Ok(())
        })
    }

    fn device_synchronize(&self, dev: Device) -> DResult<()> {
        self.call("cuCtxSynchronize", || {
            self.check_dev(dev)?;
            self.unsafe_in_capture()?;
            self.workers.synchronize_device(dev);
            Ok(())
        })
    }

    fn event_create(&self, dev: Device) -> DResult<Event> {
        self.new_event(dev, false)
    }

    fn event_create_untimed(&self, dev: Device) -> DResult<Event> {
        self.new_event(dev, true)
    }

    /// The waiting stream's worker blocks, at this point of its queue, until the event's most
    /// recent record (as of this call) is reached on the recording stream's worker: cross-stream
    /// order as on hardware. On a capturing stream it adds nothing (the simulator's captures
    /// are of one stream).
    fn stream_wait_event(&self, dev: Device, stream: Stream, event: Event) -> DResult<()> {
        self.call("cuStreamWaitEvent", || {
            self.check_dev(dev)?;
            let cell = {
                let st = self.state.lock();
                let cell = st.events.get(&event.0).map(|(_, c)| c.clone()).ok_or(CuResult::ERROR_INVALID_HANDLE)?;
                if st.captures.contains_key(&(dev, stream.0)) {
                    return Ok(());
                }
                cell
            };
            let record = cell.state.lock().recorded;
            if record == 0 {
                return Ok(());
            }
            self.workers
                .enqueue((dev, stream.0), Box::new(move || cell.wait_for(record)))
                .map_err(|_| CuResult::ERROR_LAUNCH_OUT_OF_RESOURCES)
        })
    }

    fn event_record(&self, dev: Device, event: Event, stream: Stream) -> DResult<()> {
        self.call("cuEventRecord", || {
            self.check_dev(dev)?;
            let cell = {
                let st = self.state.lock();
                let cell = st.events.get(&event.0).map(|(_, c)| c.clone()).ok_or(CuResult::ERROR_INVALID_HANDLE)?;
                if st.captures.contains_key(&(dev, stream.0)) {
                    // In a capture an event only orders the captured work: no node, no time.
                    return Ok(());
                }
                cell
            };
            cell.state.lock().recorded += 1;
            let reach = cell.clone();
            let work: Box<dyn FnOnce() + Send> = Box::new(move || {
                let mut st = reach.state.lock();
                st.reached += 1;
                st.time = Some(Instant::now());
                reach.reached.notify_all();
            });
            self.workers.enqueue((dev, stream.0), work).map_err(|_| {
                cell.state.lock().recorded -= 1;
                CuResult::ERROR_LAUNCH_OUT_OF_RESOURCES
            })
        })
    }

    fn event_elapsed_ms(&self, dev: Device, start: Event, end: Event) -> DResult<f32> {
        self.call("cuEventElapsedTime", || {
            self.check_dev(dev)?;
            self.unsafe_in_capture()?;
            let (a, b) = {
                let st = self.state.lock();
                let get = |e: Event| st.events.get(&e.0).map(|(_, c)| c.clone()).ok_or(CuResult::ERROR_INVALID_HANDLE);
                (get(start)?, get(end)?)
            };
            if a.untimed || b.untimed {
                return Err(CuResult::ERROR_INVALID_HANDLE);
            }
            let (Some(t0), Some(t1)) = (a.synchronize(), b.synchronize()) else {
                return Err(CuResult::ERROR_INVALID_HANDLE);
            };
            let ms = if t1 >= t0 {
                t1.duration_since(t0).as_secs_f64() * 1e3
            } else {
                -(t0.duration_since(t1).as_secs_f64() * 1e3)
            };
            Ok(ms as f32)
        })
    }

    fn event_destroy(&self, dev: Device, event: Event) -> DResult<()> {
        self.call("cuEventDestroy", || {
            self.check_dev(dev)?;
            self.state.lock().events.remove(&event.0).map(|_| ()).ok_or(CuResult::ERROR_INVALID_HANDLE)
        })
    }

    fn stream_begin_capture_mode(&self, dev: Device, stream: Stream, mode: CaptureMode) -> DResult<()> {
        self.call("cuStreamBeginCapture", || {
            self.check_dev(dev)?;
            if stream == Stream::DEFAULT {
                // The legacy default stream cannot be captured.
                return Err(CuResult::ERROR_STREAM_CAPTURE_UNSUPPORTED);
            }
            let mut st = self.state.lock();
            if st.captures.contains_key(&(dev, stream.0)) {
                return Err(CuResult::ERROR_ILLEGAL_STATE);
            }
            let capture = Capture { nodes: Vec::new(), invalidated: false, mode, thread: std::thread::current().id() };
            st.captures.insert((dev, stream.0), capture);
            Ok(())
        })
    }

    fn exchange_capture_mode(&self, mode: CaptureMode) -> DResult<CaptureMode> {
        self.call("cuThreadExchangeStreamCaptureMode", || Ok(THREAD_MODE.with(|m| m.replace(mode))))
    }

    fn stream_end_capture(&self, dev: Device, stream: Stream) -> DResult<Graph> {
        self.call("cuStreamEndCapture", || {
            self.check_dev(dev)?;
            let mut st = self.state.lock();
            let capture = st.captures.remove(&(dev, stream.0)).ok_or(CuResult::ERROR_ILLEGAL_STATE)?;
            if capture.invalidated {
                return Err(CuResult::ERROR_STREAM_CAPTURE_INVALIDATED);
            }
            let id = st.fresh_id() as usize;
            st.graphs.insert(id, Arc::new(capture.nodes));
            Ok(Graph(id))
        })
    }

    fn graph_instantiate(&self, dev: Device, graph: Graph) -> DResult<GraphExec> {
        self.call("cuGraphInstantiateWithFlags", || {
            self.check_dev(dev)?;
            let mut st = self.state.lock();
            let nodes = st.graphs.get(&graph.0).cloned().ok_or(CuResult::ERROR_INVALID_VALUE)?;
            let id = st.fresh_id() as usize;
            st.graph_execs.insert(id, (dev, nodes));
            Ok(GraphExec(id))
        })
    }

    fn graph_launch(&self, dev: Device, exec: GraphExec, stream: Stream) -> DResult<()> {
        self.call("cuGraphLaunch", || {
            self.check_dev(dev)?;
            let nodes = match self.state.lock().graph_execs.get(&exec.0) {
                Some((on, nodes)) if *on == dev => nodes.clone(),
                Some(_) => return Err(CuResult::ERROR_INVALID_VALUE),
                None => return Err(CuResult::ERROR_INVALID_HANDLE),
            };
            // One stream item runs the graph's work in the captured order; on a capturing
            // stream it becomes one node (a child graph).
            self.submit(dev, stream, Arc::new(move || nodes.iter().for_each(|node| node())))
        })
    }

    fn graph_exec_destroy(&self, dev: Device, exec: GraphExec) -> DResult<()> {
        self.call("cuGraphExecDestroy", || {
            self.check_dev(dev)?;
            // Replays already queued keep their work alive until they have run.
            self.state.lock().graph_execs.remove(&exec.0).map(|_| ()).ok_or(CuResult::ERROR_INVALID_VALUE)
        })
    }

    fn graph_destroy(&self, dev: Device, graph: Graph) -> DResult<()> {
        self.call("cuGraphDestroy", || {
            self.check_dev(dev)?;
            self.state.lock().graphs.remove(&graph.0).map(|_| ()).ok_or(CuResult::ERROR_INVALID_VALUE)
        })
    }

    /// `cuModuleLoadData` returns only once every kernel running on the device is done (see
    /// [`SimDriver::load_kernel_module`]).
    fn module_load(&self, dev: Device, image: &[u8]) -> DResult<Module> {
        self.call("cuModuleLoadData", || {
            self.check_dev(dev)?;
            self.unsafe_in_capture()?;
            if image.is_empty() {
                return Err(CuResult::ERROR_INVALID_IMAGE);
            }
            self.workers.synchronize_device(dev);
            let mut st = self.state.lock();
            let id = st.fresh_id() as usize;
            st.modules.insert(id, (dev, Vec::new()));
            Ok(Module(id))
        })
    }

    fn module_unload(&self, dev: Device, module: Module) -> DResult<()> {
        self.call("cuModuleUnload", || {
            self.check_dev(dev)?;
            self.state.lock().modules.remove(&module.0).map(|_| ()).ok_or(CuResult::ERROR_INVALID_HANDLE)
        })
    }

    fn module_function(&self, dev: Device, module: Module, name: &CStr) -> DResult<Function> {
        self.call("cuModuleGetFunction", || {
            self.check_dev(dev)?;
            let mut st = self.state.lock();
            if !st.modules.contains_key(&module.0) {
                return Err(CuResult::ERROR_INVALID_HANDLE);
            }
            if name.is_empty() {
                return Err(CuResult::ERROR_NOT_FOUND);
            }
            let id = st.fresh_id() as usize;
            if let Some((_, functions)) = st.modules.get_mut(&module.0) {
                functions.push(id);
            }
            Ok(Function(id))
        })
    }

    fn launch(
        &self,
        dev: Device,
        _func: Function,
        _config: &LaunchConfig,
        _stream: Stream,
        _params: &mut [*mut c_void],
    ) -> DResult<()> {
        self.call("cuLaunchKernel", || {
            self.check_dev(dev)?;
            // The simulator cannot run cubins; the kernels layer runs host code through `enqueue`.
            Err(CuResult::ERROR_NOT_SUPPORTED)
        })
    }
}
