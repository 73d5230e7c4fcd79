//! Execution: streams, events, stream capture and graphs, modules and kernel launch.

use std::ffi::{c_void, CStr};

use super::{CaptureMode, DResult, Device, Event, Function, Graph, GraphExec, LaunchConfig, Module, Stream};

/// Streams, events, graphs, modules and launches. Part of [`super::Driver`].
pub trait ExecOps {
    /// `cuStreamCreate` (non-blocking) on `dev`.
    fn stream_create(&self, dev: Device) -> DResult<Stream>;

    /// `cuStreamDestroy`.
    fn stream_destroy(&self, dev: Device, stream: Stream) -> DResult<()>;

    /// `cuStreamSynchronize`.
    fn stream_synchronize(&self, dev: Device, stream: Stream) -> DResult<()>;

    /// `cuCtxSynchronize` in `dev`'s primary context: waits for all work on the device.
    fn device_synchronize(&self, dev: Device) -> DResult<()>;

    /// `cuEventCreate` (timing enabled) on `dev`.
    fn event_create(&self, dev: Device) -> DResult<Event>;

    /// `cuEventCreate` with `CU_EVENT_DISABLE_TIMING` on `dev`: an event that only orders work
    /// between streams (a fork or a join); [`ExecOps::event_elapsed_ms`] fails on it.
    fn event_create_untimed(&self, dev: Device) -> DResult<Event>;

    /// `cuEventRecord`.
    fn event_record(&self, dev: Device, event: Event, stream: Stream) -> DResult<()>;

    /// `cuStreamWaitEvent` (flags 0): work enqueued on `stream` after this call waits for the
    /// work captured by `event`'s most recent `cuEventRecord` (none recorded: no wait). Legal in
    /// a stream capture, where it joins `event`'s captured work into the capture.
    fn stream_wait_event(&self, dev: Device, stream: Stream, event: Event) -> DResult<()>;

    /// `cuEventSynchronize`, then `cuEventElapsedTime` from `start` to `end`, in milliseconds.
    fn event_elapsed_ms(&self, dev: Device, start: Event, end: Event) -> DResult<f32>;

    /// `cuEventDestroy`.
    fn event_destroy(&self, dev: Device, event: Event) -> DResult<()>;

    /// `cuModuleLoadData` of a cubin or PTX image on `dev`.
    fn module_load(&self, dev: Device, image: &[u8]) -> DResult<Module>;

    /// `cuModuleUnload`.
    fn module_unload(&self, dev: Device, module: Module) -> DResult<()>;

    /// `cuModuleGetFunction`.
    fn module_function(&self, dev: Device, module: Module, name: &CStr) -> DResult<Function>;

    /// `cuLaunchKernel` on `stream`; `params` points at each argument. A programmatic `config`
    /// launches with `cuLaunchKernelEx` and the programmatic stream serialization attribute
    /// where the driver has it ([`LaunchConfig::programmatic`]).
    fn launch(
        &self,
        dev: Device,
        func: Function,
        config: &LaunchConfig,
        stream: Stream,
        params: &mut [*mut c_void],
    ) -> DResult<()>;

    /// `cuStreamBeginCapture` in `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL` (what nccl-tests uses):
    /// [`ExecOps::stream_begin_capture_mode`] with [`CaptureMode::ThreadLocal`].
    fn stream_begin_capture(&self, dev: Device, stream: Stream) -> DResult<()> {
        self.stream_begin_capture_mode(dev, stream, CaptureMode::ThreadLocal)
    }

    /// `cuStreamBeginCapture` in `mode`: work launched on `stream` from now on is recorded into
    /// a graph instead of running. The legacy default stream cannot be captured; a stream
    /// already capturing gives `CUDA_ERROR_ILLEGAL_STATE`. While the capture is live, `mode`
    /// decides which threads' potentially unsafe calls invalidate it (see [`CaptureMode`]).
    fn stream_begin_capture_mode(&self, dev: Device, stream: Stream, mode: CaptureMode) -> DResult<()>;

    /// `cuThreadExchangeStreamCaptureMode`: sets the calling thread's capture interaction mode
    /// and returns the one it had (every thread starts in [`CaptureMode::Global`]). The
    /// library's own calls that a capture in another thread must not see (its peeks at device
    /// words, its module loads) run in [`CaptureMode::Relaxed`] through
    /// [`crate::driver::RelaxedCapture`], and restore the caller's mode after.
    fn exchange_capture_mode(&self, mode: CaptureMode) -> DResult<CaptureMode>;

    /// `cuStreamEndCapture`: ends the capture begun on `stream` and returns the graph of what
    /// was launched on it. A capture invalidated by an illegal call made during it (such as a
    /// synchronization of the capturing stream) ends with `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`
    /// and no graph.
    fn stream_end_capture(&self, dev: Device, stream: Stream) -> DResult<Graph>;

    /// `cuGraphInstantiateWithFlags` (flags 0): an executable graph of `graph`'s work, which
    /// stays valid after `graph` is destroyed.
    fn graph_instantiate(&self, dev: Device, graph: Graph) -> DResult<GraphExec>;

    /// `cuGraphLaunch`: runs the executable graph's work on `stream`, in the captured order,
    /// after the work queued there before.
    fn graph_launch(&self, dev: Device, exec: GraphExec, stream: Stream) -> DResult<()>;

    /// `cuGraphExecDestroy`.
    fn graph_exec_destroy(&self, dev: Device, exec: GraphExec) -> DResult<()>;

    /// `cuGraphDestroy`.
    fn graph_destroy(&self, dev: Device, graph: Graph) -> DResult<()>;
}
