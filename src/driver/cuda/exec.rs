//! Streams and launch: streams, events and their timing, stream capture and CUDA graphs,
//! modules and kernel launch.

use std::borrow::Cow;
use std::ffi::{c_uint, c_void, CStr};
use std::ptr;

use cudarc::driver::sys as cu;

use super::symbols::{check, not_supported};
use super::CudaDriver;
use crate::driver::{
    CaptureMode, DResult, Device, Event, ExecOps, Function, Graph, GraphExec, LaunchConfig, Module, Stream,
};

/// True when `image` is a binary (ELF cubin or fatbin) rather than PTX text.
pub(super) fn is_binary_image(image: &[u8]) -> bool {
    const ELF: [u8; 4] = [0x7f, b'E', b'L', b'F'];
    const FATBIN: [u8; 4] = 0xBA55_ED50u32.to_le_bytes();
    image.starts_with(&ELF) || image.starts_with(&FATBIN)
}

/// The bytes to give `cuModuleLoadData`: a cubin or fatbin as is; PTX text NUL-terminated
/// (copied when it is not already).
pub(super) fn module_image(image: &[u8]) -> Cow<'_, [u8]> {
    if is_binary_image(image) || image.last() == Some(&0) {
        Cow::Borrowed(image)
    } else {
        let mut text = Vec::with_capacity(image.len() + 1);
        text.extend_from_slice(image);
        text.push(0);
        Cow::Owned(text)
    }
}

pub(super) fn stream_ptr(stream: Stream) -> cu::CUstream {
    stream.0 as cu::CUstream
}

pub(super) fn event_ptr(event: Event) -> cu::CUevent {
    event.0 as cu::CUevent
}

impl ExecOps for CudaDriver {
    fn stream_create(&self, dev: Device) -> DResult<Stream> {
        let _ctx = self.enter(dev)?;
        let mut stream: cu::CUstream = ptr::null_mut();
        // SAFETY: the out-pointer is a local; the flag is a valid `CUstream_flags` value.
        check("cuStreamCreate", unsafe {
            (self.api.cuStreamCreate)(&mut stream, cu::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint)
        })?;
        Ok(Stream(stream as usize))
    }

    fn stream_destroy(&self, dev: Device, stream: Stream) -> DResult<()> {
        let _ctx = self.enter(dev)?;
        // SAFETY: the stream value is the caller's; the driver validates it.
        check("cuStreamDestroy", unsafe { (self.api.cuStreamDestroy_v2)(stream_ptr(stream)) })
    }

    fn stream_synchronize(&self, dev: Device, stream: Stream) -> DResult<()> {
        let _ctx = self.enter(dev)?;
        // SAFETY: the stream value is the caller's (NULL: the legacy default stream).
        check("cuStreamSynchronize", unsafe { (self.api.cuStreamSynchronize)(stream_ptr(stream)) })
    }

    fn device_synchronize(&self, dev: Device) -> DResult<()> {
        let _ctx = self.enter(dev)?;
        // SAFETY: synchronizes the current (primary) context; no arguments.
        check("cuCtxSynchronize", unsafe { (self.api.cuCtxSynchronize)() })
    }

    fn event_create(&self, dev: Device) -> DResult<Event> {
        let _ctx = self.enter(dev)?;
        let mut event: cu::CUevent = ptr::null_mut();
        // SAFETY: the out-pointer is a local; CU_EVENT_DEFAULT keeps timing enabled.
        check("cuEventCreate", unsafe {
            (self.api.cuEventCreate)(&mut event, cu::CUevent_flags::CU_EVENT_DEFAULT as c_uint)
        })?;
        Ok(Event(event as usize))
    }

    fn event_create_untimed(&self, dev: Device) -> DResult<Event> {
        let _ctx = self.enter(dev)?;
        let mut event: cu::CUevent = ptr::null_mut();
        // SAFETY: the out-pointer is a local; the flag is a valid `CUevent_flags` value.
        check("cuEventCreate", unsafe {
            (self.api.cuEventCreate)(&mut event, cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint)
        })?;
        Ok(Event(event as usize))
    }

    fn event_record(&self, dev: Device, event: Event, stream: Stream) -> DResult<()> {
        let _ctx = self.enter(dev)?;
        // SAFETY: event and stream values are the caller's; the driver validates them.
        check("cuEventRecord", unsafe { (self.api.cuEventRecord)(event_ptr(event), stream_ptr(stream)) })
    }

    fn stream_wait_event(&self, dev: Device, stream: Stream, event: Event) -> DResult<()> {
        let _ctx = self.enter(dev)?;
        // SAFETY: stream and event values are the caller's; the driver validates them; flags 0
        // is CU_EVENT_WAIT_DEFAULT.
        check("cuStreamWaitEvent", unsafe { (self.api.cuStreamWaitEvent)(stream_ptr(stream), event_ptr(event), 0) })
    }

    fn event_elapsed_ms(&self, dev: Device, start: Event, end: Event) -> DResult<f32> {
        let _ctx = self.enter(dev)?;
        // SAFETY: the event value is the caller's; the driver validates it.
        check("cuEventSynchronize", unsafe { (self.api.cuEventSynchronize)(event_ptr(end)) })?;
        let mut ms: f32 = 0.0;
        let elapsed = match (self.api.cuEventElapsedTime_v2, self.api.cuEventElapsedTime) {
            (Some(f), _) | (None, Some(f)) => f,
            (None, None) => return Err(not_supported("cuEventElapsedTime")),
        };
        // SAFETY: the out-pointer is a local; event values are the caller's.
        check("cuEventElapsedTime", unsafe { elapsed(&mut ms, event_ptr(start), event_ptr(end)) })?;
        Ok(ms)
    }

    fn event_destroy(&self, dev: Device, event: Event) -> DResult<()> {
        let _ctx = self.enter(dev)?;
        // SAFETY: the event value is the caller's; the driver validates it.
        check("cuEventDestroy", unsafe { (self.api.cuEventDestroy_v2)(event_ptr(event)) })
    }

    fn stream_begin_capture_mode(&self, dev: Device, stream: Stream, mode: CaptureMode) -> DResult<()> {
        let begin = self.api.cuStreamBeginCapture_v2.ok_or_else(|| not_supported("cuStreamBeginCapture"))?;
        let _ctx = self.enter(dev)?;
        // SAFETY: the stream value is the caller's; the driver validates it; the mode is a valid
        // `CUstreamCaptureMode` passed as the C enum's integer.
        check("cuStreamBeginCapture", unsafe { begin(stream_ptr(stream), capture_mode(mode)) })
    }

    fn exchange_capture_mode(&self, mode: CaptureMode) -> DResult<CaptureMode> {
        let mut raw = capture_mode(mode);
        // SAFETY: a valid pointer to a `CUstreamCaptureMode` (a C enum, passed as its integer);
        // the call needs no context.
        check("cuThreadExchangeStreamCaptureMode", unsafe { (self.api.cuThreadExchangeStreamCaptureMode)(&mut raw) })?;
        Ok(match raw {
            x if x == cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED as c_uint => CaptureMode::Relaxed,
            x if x == cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL as c_uint => {
                CaptureMode::ThreadLocal
            }
            _ => CaptureMode::Global,
        })
    }

    fn stream_end_capture(&self, dev: Device, stream: Stream) -> DResult<Graph> {
        let end = self.api.cuStreamEndCapture.ok_or_else(|| not_supported("cuStreamEndCapture"))?;
        let _ctx = self.enter(dev)?;
        let mut graph: cu::CUgraph = ptr::null_mut();
        // SAFETY: the out-pointer is a local; the stream value is the caller's.
        check("cuStreamEndCapture", unsafe { end(stream_ptr(stream), &mut graph) })?;
        Ok(Graph(graph as usize))
    }

    fn graph_instantiate(&self, dev: Device, graph: Graph) -> DResult<GraphExec> {
        let instantiate =
            self.api.cuGraphInstantiateWithFlags.ok_or_else(|| not_supported("cuGraphInstantiateWithFlags"))?;
        let _ctx = self.enter(dev)?;
        let mut exec: cu::CUgraphExec = ptr::null_mut();
        // SAFETY: the out-pointer is a local; the graph value is the caller's; flags 0.
        check("cuGraphInstantiateWithFlags", unsafe { instantiate(&mut exec, graph.0 as cu::CUgraph, 0) })?;
        Ok(GraphExec(exec as usize))
    }

    fn graph_launch(&self, dev: Device, exec: GraphExec, stream: Stream) -> DResult<()> {
        let launch = self.api.cuGraphLaunch.ok_or_else(|| not_supported("cuGraphLaunch"))?;
        let _ctx = self.enter(dev)?;
        // SAFETY: executable graph and stream values are the caller's; the driver validates them.
        check("cuGraphLaunch", unsafe { launch(exec.0 as cu::CUgraphExec, stream_ptr(stream)) })
    }

    fn graph_exec_destroy(&self, dev: Device, exec: GraphExec) -> DResult<()> {
        let destroy = self.api.cuGraphExecDestroy.ok_or_else(|| not_supported("cuGraphExecDestroy"))?;
        let _ctx = self.enter(dev)?;
        // SAFETY: the executable graph value is the caller's; the driver validates it.
        check("cuGraphExecDestroy", unsafe { destroy(exec.0 as cu::CUgraphExec) })
    }

    fn graph_destroy(&self, dev: Device, graph: Graph) -> DResult<()> {
        let destroy = self.api.cuGraphDestroy.ok_or_else(|| not_supported("cuGraphDestroy"))?;
        let _ctx = self.enter(dev)?;
        // SAFETY: the graph value is the caller's; the driver validates it.
        check("cuGraphDestroy", unsafe { destroy(graph.0 as cu::CUgraph) })
    }

    /// A cubin or fatbin is passed as is; PTX text is NUL-terminated first (copied when it is
    /// not already).
    fn module_load(&self, dev: Device, image: &[u8]) -> DResult<Module> {
        let data = module_image(image);
        let _ctx = self.enter(dev)?;
        let mut module: cu::CUmodule = ptr::null_mut();
        // SAFETY: `data` is a complete binary image or NUL-terminated text that outlives the
        // call (the driver copies what it keeps); the out-pointer is a local.
        check("cuModuleLoadData", unsafe { (self.api.cuModuleLoadData)(&mut module, data.as_ptr().cast()) })?;
        Ok(Module(module as usize))
    }

    fn module_unload(&self, dev: Device, module: Module) -> DResult<()> {
        let _ctx = self.enter(dev)?;
        // SAFETY: the module value is the caller's; the driver validates it.
        check("cuModuleUnload", unsafe { (self.api.cuModuleUnload)(module.0 as cu::CUmodule) })
    }

    /// `cuModuleGetFunction`, then `cuFuncLoad` (CUDA 12.4+, skipped where the driver lacks it):
    /// under lazy loading (the default since CUDA 12.2) a function is otherwise loaded at its first
    /// launch, and loading may wait for the context's running kernels. A collective's kernel spins
    /// until its peers' kernels run: if the thread that launched it then launched a kernel never
    /// launched before (another dtype, say) before the peers' kernels, that launch waited for the
    /// spinning kernel, which waited for the peers: deadlock until the timeout (found on one H200
    /// with the ranks of a team sharing it, tests/ll). Loaded here, with the module, no launch loads.
    fn module_function(&self, dev: Device, module: Module, name: &CStr) -> DResult<Function> {
        let _ctx = self.enter(dev)?;
        let mut func: cu::CUfunction = ptr::null_mut();
        // SAFETY: `name` is NUL-terminated and outlives the call; the out-pointer is a local.
        check("cuModuleGetFunction", unsafe {
            (self.api.cuModuleGetFunction)(&mut func, module.0 as cu::CUmodule, name.as_ptr())
        })?;
        if let Some(load) = self.api.cuFuncLoad {
            // SAFETY: `func` is the function handle the driver just returned.
            check("cuFuncLoad", unsafe { load(func) })?;
        }
        Ok(Function(func as usize))
    }

    fn launch(
        &self,
        dev: Device,
        func: Function,
        config: &LaunchConfig,
        stream: Stream,
        params: &mut [*mut c_void],
    ) -> DResult<()> {
        let params_ptr = if params.is_empty() { ptr::null_mut() } else { params.as_mut_ptr() };
        let _ctx = self.enter(dev)?;
        let [gx, gy, gz] = config.grid;
        let [bx, by, bz] = config.block;
        if let (true, Some(launch_ex)) = (config.programmatic, self.api.cuLaunchKernelEx) {
            // SAFETY: an all-zero attribute is a valid value of the plain-data C struct.
            let mut attr: cu::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id = cu::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let ex = cu::CUlaunchConfig {
                gridDimX: gx,
                gridDimY: gy,
                gridDimZ: gz,
                blockDimX: bx,
                blockDimY: by,
                blockDimZ: bz,
                sharedMemBytes: config.shared_bytes,
                hStream: stream_ptr(stream),
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: `ex` and the attribute it points at live across the call, which reads
            // them; `params` as for `cuLaunchKernel` below; `extra` is NULL.
            return check("cuLaunchKernelEx", unsafe {
                launch_ex(&ex, func.0 as cu::CUfunction, params_ptr, ptr::null_mut())
            });
        }
        // SAFETY: `params` holds one pointer per kernel argument, each pointing at a live value
        // of the argument's type (the caller's contract); the driver copies the argument
        // values before returning. `extra` is NULL.
        check("cuLaunchKernel", unsafe {
            (self.api.cuLaunchKernel)(
                func.0 as cu::CUfunction,
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                config.shared_bytes,
                stream_ptr(stream),
                params_ptr,
                ptr::null_mut(),
            )
        })
    }
}

/// `mode` as the integer of its `CUstreamCaptureMode`.
fn capture_mode(mode: CaptureMode) -> c_uint {
    (match mode {
        CaptureMode::Global => cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        CaptureMode::ThreadLocal => cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        CaptureMode::Relaxed => cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
    }) as c_uint
}
