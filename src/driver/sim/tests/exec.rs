//! Tests of streams and launch: worker order, events, stream capture and CUDA graphs, modules.

use super::*;

// ---- streams, events, modules ----

#[test]
fn workers_run_in_order_and_synchronize_waits() {
    let s = sim();
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let stream = s.stream_create(1).unwrap();
    assert_ne!(stream, Stream::DEFAULT);
    assert_ne!(s.stream_create(1).unwrap(), stream);
    for i in 0..50 {
        let seen = seen.clone();
        s.enqueue(
            1,
            stream,
            Box::new(move || {
                if i == 0 {
                    std::thread::sleep(Duration::from_millis(30));
                }
                seen.lock().push(i);
            }),
        )
        .unwrap();
    }
    s.stream_synchronize(1, stream).unwrap();
    assert_eq!(*seen.lock(), (0..50).collect::<Vec<_>>());
    // Any stream value works, the default stream included; synchronizing an idle one returns.
    let flag = Arc::new(AtomicUsize::new(0));
    let f = flag.clone();
    s.enqueue(0, Stream(0xdead_beef), Box::new(move || f.store(7, Ordering::SeqCst))).unwrap();
    s.stream_synchronize(0, Stream(0xdead_beef)).unwrap();
    assert_eq!(flag.load(Ordering::SeqCst), 7);
    s.stream_synchronize(3, Stream::DEFAULT).unwrap();
    assert_eq!(code(s.enqueue(4, Stream::DEFAULT, Box::new(|| {}))), ID);
    assert_eq!(code(s.stream_destroy(0, stream)), CuResult::ERROR_INVALID_HANDLE, "wrong device");
    s.stream_destroy(1, stream).unwrap();
    assert_eq!(code(s.stream_destroy(1, stream)), CuResult::ERROR_INVALID_HANDLE);
}

#[test]
fn events_time_the_work_between_them() {
    let s = sim();
    let (a, b) = (s.event_create(0).unwrap(), s.event_create(0).unwrap());
    assert_eq!(code(s.event_elapsed_ms(0, a, b)), CuResult::ERROR_INVALID_HANDLE, "never recorded");
    let st = Stream(5);
    s.event_record(0, a, st).unwrap();
    s.enqueue(0, st, Box::new(|| std::thread::sleep(Duration::from_millis(40)))).unwrap();
    s.event_record(0, b, st).unwrap();
    let ms = s.event_elapsed_ms(0, a, b).unwrap();
    assert!((35.0..1000.0).contains(&ms), "{ms} ms");
    s.event_destroy(0, a).unwrap();
    s.event_destroy(0, b).unwrap();
    assert_eq!(code(s.event_destroy(0, b)), CuResult::ERROR_INVALID_HANDLE);
    assert_eq!(code(s.event_record(0, b, st)), CuResult::ERROR_INVALID_HANDLE);
}

#[test]
fn a_stream_waiting_on_an_event_runs_after_the_recorded_work_only() {
    // CUDA Driver API, cuStreamWaitEvent: "Makes all future work submitted to hStream wait for
    // all work captured in hEvent. See cuEventRecord() for details on what is captured." And
    // cuEventRecord: "cuStreamWaitEvent() [...] examine or wait for completion of the work that
    // was captured" by the most recent call; "Calls to cuEventRecord() [...] after
    // cuStreamWaitEvent() [...] do not affect" the wait.
    let s = sim();
    let (a, b) = (Stream(0xa), Stream(0xb));
    let ev = s.event_create_untimed(0).unwrap();
    // Never recorded: the wait is a no-op.
    s.stream_wait_event(0, b, ev).unwrap();
    s.stream_synchronize(0, b).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    s.enqueue(
        0,
        a,
        Box::new(move || {
            std::thread::sleep(Duration::from_millis(40));
            d.store(true, Ordering::SeqCst);
        }),
    )
    .unwrap();
    s.event_record(0, ev, a).unwrap();
    s.stream_wait_event(0, b, ev).unwrap();
    let seen = Arc::new(AtomicBool::new(false));
    let (d, seen2) = (done.clone(), seen.clone());
    s.enqueue(0, b, Box::new(move || seen2.store(d.load(Ordering::SeqCst), Ordering::SeqCst))).unwrap();
    // A later record of the same event, behind work that waits for the test: b does not wait
    // for it.
    let (open, gate) = std::sync::mpsc::channel::<()>();
    let gate = parking_lot::Mutex::new(gate);
    s.enqueue(
        0,
        a,
        Box::new(move || {
            // Released by the test below; the timeout keeps a failing test from hanging.
            let _ = gate.lock().recv_timeout(Duration::from_secs(10));
        }),
    )
    .unwrap();
    s.event_record(0, ev, a).unwrap();
    let t = Instant::now();
    s.stream_synchronize(0, b).unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "b waited for the later record");
    assert!(seen.load(Ordering::SeqCst), "b's work ran before the work recorded in the event");
    open.send(()).unwrap();
    s.stream_synchronize(0, a).unwrap();
    // An untimed event cannot be timed.
    let timed = s.event_create(0).unwrap();
    s.event_record(0, timed, a).unwrap();
    assert_eq!(code(s.event_elapsed_ms(0, timed, ev)), CuResult::ERROR_INVALID_HANDLE);
    s.event_destroy(0, ev).unwrap();
    assert_eq!(code(s.stream_wait_event(0, b, ev)), CuResult::ERROR_INVALID_HANDLE);
    assert_eq!(code(s.stream_wait_event(4, b, timed)), ID);
}

// ---- stream capture and CUDA graphs ----

/// DESIGN.md (sim): launches on a capturing stream are recorded, not run; `cuGraphLaunch` runs
/// the recorded work in order, after the work queued on the stream before, once per launch.
#[test]
fn capture_records_launches_and_graph_launch_replays_them_in_order() {
    let s = sim();
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let push = |v: u32| {
        let seen = seen.clone();
        move || seen.lock().push(v)
    };
    let stream = s.stream_create(1).unwrap();
    s.stream_begin_capture(1, stream).unwrap();
    for v in 1..=3 {
        s.enqueue(1, stream, push(v)).unwrap();
    }
    // Another stream of the same device is not captured. (Its synchronization comes from
    // another thread: the capturing thread may not synchronize while it captures.)
    s.enqueue(1, Stream(77), push(100)).unwrap();
    std::thread::scope(|t| t.spawn(|| s.stream_synchronize(1, Stream(77))).join().unwrap()).unwrap();
    assert_eq!(*seen.lock(), vec![100], "captured launches must not run");
    let graph = s.stream_end_capture(1, stream).unwrap();
    assert_eq!(s.ledger().graphs, 1);
    let exec = s.graph_instantiate(1, graph).unwrap();
    // The executable graph outlives its graph.
    s.graph_destroy(1, graph).unwrap();
    seen.lock().clear();
    s.enqueue(1, stream, push(0)).unwrap();
    s.graph_launch(1, exec, stream).unwrap();
    s.graph_launch(1, exec, stream).unwrap();
    s.enqueue(1, stream, push(9)).unwrap();
    s.stream_synchronize(1, stream).unwrap();
    assert_eq!(*seen.lock(), vec![0, 1, 2, 3, 1, 2, 3, 9]);
    // Launched on another stream, the graph runs there.
    seen.lock().clear();
    s.graph_launch(1, exec, Stream(5)).unwrap();
    s.stream_synchronize(1, Stream(5)).unwrap();
    assert_eq!(*seen.lock(), vec![1, 2, 3]);
    // On another device it is not valid.
    assert_eq!(code(s.graph_launch(0, exec, Stream(5))), IV);
    s.graph_exec_destroy(1, exec).unwrap();
    assert_eq!(code(s.graph_launch(1, exec, stream)), CuResult::ERROR_INVALID_HANDLE);
    assert_eq!(code(s.graph_exec_destroy(1, exec)), IV);
    assert_eq!(code(s.graph_destroy(1, graph)), IV);
    assert_eq!(code(s.graph_instantiate(1, graph)), IV);
    s.stream_destroy(1, stream).unwrap();
    assert!(s.ledger().is_empty(), "{}", s.ledger());
}

/// CUDA driver API: capture cannot begin on the legacy stream or on a stream already capturing,
/// and ending needs a capture in progress; a synchronization of a capturing stream is illegal
/// and invalidates the capture, whose end then fails.
#[test]
fn capture_rules() {
    let s = sim();
    let st = Stream(11);
    assert_eq!(code(s.stream_begin_capture(0, Stream::DEFAULT)), CuResult::ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(code(s.stream_begin_capture(9, st)), ID);
    assert_eq!(code(s.stream_end_capture(0, st)), CuResult::ERROR_ILLEGAL_STATE, "not capturing");
    s.stream_begin_capture(0, st).unwrap();
    assert_eq!(code(s.stream_begin_capture(0, st)), CuResult::ERROR_ILLEGAL_STATE, "already capturing");
    assert_eq!(s.ledger().captures, 1);
    assert!(!s.ledger().is_empty(), "an open capture is live");
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    s.enqueue(0, st, move || {
        r.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    // An event recorded in the capture only orders it: it never completes a timing.
    let ev = s.event_create(0).unwrap();
    s.event_record(0, ev, st).unwrap();
    assert_eq!(code(s.stream_synchronize(0, st)), CuResult::ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(code(s.stream_end_capture(0, st)), CuResult::ERROR_STREAM_CAPTURE_INVALIDATED);
    assert_eq!(s.ledger().captures, 0, "the invalidated capture has ended");
    assert_eq!(s.ledger().graphs, 0);
    // The stream works eagerly again; the captured launch never ran.
    s.stream_synchronize(0, st).unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    // A graph launched on a capturing stream becomes one node of the new capture.
    s.stream_begin_capture(0, st).unwrap();
    let r = ran.clone();
    s.enqueue(0, st, move || {
        r.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    let inner = s.graph_instantiate(0, s.stream_end_capture(0, st).unwrap()).unwrap();
    s.stream_begin_capture(0, st).unwrap();
    s.graph_launch(0, inner, st).unwrap();
    s.graph_launch(0, inner, st).unwrap();
    let outer = s.stream_end_capture(0, st).unwrap();
    let outer_exec = s.graph_instantiate(0, outer).unwrap();
    s.stream_synchronize(0, st).unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 0, "nothing ran while capturing");
    s.graph_launch(0, outer_exec, st).unwrap();
    s.stream_synchronize(0, st).unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 2);
    // Faults reach the new entry points like any other.
    s.inject("cuGraphLaunch", CuResult::ERROR_LAUNCH_FAILED, 1, Some(1));
    assert_eq!(code(s.graph_launch(0, outer_exec, st)), CuResult::ERROR_LAUNCH_FAILED);
    s.clear_faults();
    // Destroying a capturing stream ends its capture.
    let st2 = s.stream_create(0).unwrap();
    s.stream_begin_capture(0, st2).unwrap();
    s.stream_destroy(0, st2).unwrap();
    assert_eq!(s.ledger().captures, 0);
    for e in [inner, outer_exec] {
        s.graph_exec_destroy(0, e).unwrap();
    }
    let graphs = s.ledger().graphs;
    assert_eq!(graphs, 2, "the two graphs ended without an error are live until destroyed");
    s.event_destroy(0, ev).unwrap();
}

#[test]
fn modules_and_launch() {
    let s = sim();
    assert_eq!(code(s.module_load(0, &[])), CuResult::ERROR_INVALID_IMAGE);
    let m = s.module_load(0, b"\x7fELF cubin").unwrap();
    let f = s.module_function(0, m, c"mc_allreduce").unwrap();
    let cfg = LaunchConfig { grid: [1; 3], block: [1; 3], shared_bytes: 0, programmatic: false };
    assert_eq!(code(s.launch(0, f, &cfg, Stream::DEFAULT, &mut [])), CuResult::ERROR_NOT_SUPPORTED);
    assert_eq!(s.ledger().modules, 1);
    s.module_unload(0, m).unwrap();
    assert_eq!(code(s.module_unload(0, m)), CuResult::ERROR_INVALID_HANDLE);
    assert_eq!(code(s.module_function(0, m, c"x")), CuResult::ERROR_INVALID_HANDLE);
}

/// Rule (measured on an H200 with bench/cuda-load-wait.cu; the CUDA programming guide's lazy
/// loading hazards: loading "might require context synchronization"): a module load returns only
/// once every kernel running on the device is done; work on other devices does not hold it. A
/// kernel module's first use (`load_kernel_module`) is such a load; its later uses do not wait.
#[test]
fn module_loads_wait_for_the_devices_running_work() {
    let s = sim();
    // A "kernel" on device 1 that runs 150 ms, another on device 2 that runs until released.
    let busy = |ms: u64| move || std::thread::sleep(Duration::from_millis(ms));
    let release = Arc::new(AtomicBool::new(false));
    let r = release.clone();
    s.enqueue(2, Stream(5), move || {
        while !r.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
    })
    .unwrap();
    s.enqueue(1, Stream(7), busy(150)).unwrap();
    let t = Instant::now();
    let m = s.module_load(1, b"\x7fELF cubin").unwrap();
    assert!(t.elapsed() >= Duration::from_millis(140), "returned after {:?}", t.elapsed());
    s.module_unload(1, m).unwrap();
    // The first use of a kernel module on device 1 waits for its running work, a later one does not.
    s.enqueue(1, Stream(8), busy(150)).unwrap();
    let t = Instant::now();
    s.load_kernel_module(1, 42).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(140), "first use returned after {:?}", t.elapsed());
    s.enqueue(1, Stream(8), busy(150)).unwrap();
    let t = Instant::now();
    s.load_kernel_module(1, 42).unwrap();
    assert!(t.elapsed() < Duration::from_millis(100), "a later use waited {:?}", t.elapsed());
    // Device 2's endless kernel holds neither device 1's loads nor device 3's.
    s.load_kernel_module(3, 42).unwrap();
    s.module_unload(3, s.module_load(3, b"\x7fELF cubin").unwrap()).unwrap();
    release.store(true, Ordering::SeqCst);
    s.stream_synchronize(2, Stream(5)).unwrap();
    s.stream_synchronize(1, Stream(8)).unwrap();
}

#[test]
fn drop_runs_queued_work_and_joins_workers() {
    let s = sim();
    let token = Arc::new(());
    let ran = Arc::new(AtomicBool::new(false));
    let (t, r) = (token.clone(), ran.clone());
    s.enqueue(
        2,
        Stream(9),
        Box::new(move || {
            std::thread::sleep(Duration::from_millis(30));
            r.store(true, Ordering::SeqCst);
            let _held = &t;
        }),
    )
    .unwrap();
    assert_eq!(s.worker_threads(), 1);
    drop(s);
    assert!(ran.load(Ordering::SeqCst), "queued work ran before the drop returned");
    assert_eq!(Arc::strong_count(&token), 1, "the worker and its closure are gone");
}

/// CUDA driver API (`cuStreamBeginCapture`, `cuThreadExchangeStreamCaptureMode`): in global mode,
/// a thread is prohibited from potentially unsafe calls while any other thread has a capture
/// begun in global mode; thread-local captures only prohibit their own thread; a thread in
/// relaxed mode is never prohibited. A prohibited call fails with
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and the capture is invalidated.
#[test]
fn unsafe_calls_from_other_threads_invalidate_global_captures() {
    let s = Arc::new(sim());
    let st = s.stream_create(0).unwrap();
    let word = s.mem_alloc(1, 64).unwrap();
    let from_another_thread = |f: fn(&SimDriver, DevicePtr) -> DResult<u32>| {
        let s = s.clone();
        std::thread::spawn(move || f(&s, word)).join().unwrap()
    };
    let peek: fn(&SimDriver, DevicePtr) -> DResult<u32> = |s, w| s.peek_u32(1, w);
    let relaxed_peek: fn(&SimDriver, DevicePtr) -> DResult<u32> = |s, w| {
        let _relaxed = crate::driver::RelaxedCapture::enter(s);
        s.peek_u32(1, w)
    };

    // Thread-local (nccl-tests' mode): another thread's peek is fine.
    s.stream_begin_capture_mode(0, st, CaptureMode::ThreadLocal).unwrap();
    assert_eq!(from_another_thread(peek).unwrap(), 0);
    let g = s.stream_end_capture(0, st).unwrap();
    s.graph_destroy(0, g).unwrap();

    // Global (PyTorch's default): another thread's peek fails and invalidates the capture.
    s.stream_begin_capture_mode(0, st, CaptureMode::Global).unwrap();
    assert_eq!(code(from_another_thread(peek)), CuResult::ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(code(s.stream_end_capture(0, st)), CuResult::ERROR_STREAM_CAPTURE_INVALIDATED);

    // The same peek in relaxed mode neither fails nor invalidates it; the mode is restored.
    s.stream_begin_capture_mode(0, st, CaptureMode::Global).unwrap();
    assert_eq!(from_another_thread(relaxed_peek).unwrap(), 0);
    let g = s.stream_end_capture(0, st).unwrap();
    s.graph_destroy(0, g).unwrap();
    assert_eq!(s.exchange_capture_mode(CaptureMode::Global).unwrap(), CaptureMode::Global);

    // The capturing thread's own unsafe call invalidates even a thread-local capture; a module
    // load is potentially unsafe too.
    s.stream_begin_capture_mode(0, st, CaptureMode::ThreadLocal).unwrap();
    assert_eq!(code(s.load_kernel_module(0, 7)), CuResult::ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(code(s.stream_end_capture(0, st)), CuResult::ERROR_STREAM_CAPTURE_INVALIDATED);
    // A thread in thread-local mode ignores other threads' global captures.
    s.stream_begin_capture_mode(0, st, CaptureMode::Global).unwrap();
    let thread_local_peek: fn(&SimDriver, DevicePtr) -> DResult<u32> = |s, w| {
        assert_eq!(s.exchange_capture_mode(CaptureMode::ThreadLocal).unwrap(), CaptureMode::Global);
        s.peek_u32(1, w)
    };
    assert_eq!(from_another_thread(thread_local_peek).unwrap(), 0);
    let g = s.stream_end_capture(0, st).unwrap();
    s.graph_destroy(0, g).unwrap();

    // Mapped host memory: allocation and free are potentially unsafe too; outside captures
    // they work, zeroed, tracked by the ledger.
    let host = s.host_alloc_mapped(0, 4096).unwrap();
    // SAFETY: 4096 bytes just allocated.
    assert_eq!(unsafe { *(host as *const u32) }, 0);
    assert_eq!(s.ledger().host_allocations, 1);
    s.stream_begin_capture_mode(0, st, CaptureMode::Global).unwrap();
    let free_elsewhere = {
        let s = s.clone();
        std::thread::spawn(move || s.host_free_mapped(0, host)).join().unwrap()
    };
    assert_eq!(code(free_elsewhere), CuResult::ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(code(s.stream_end_capture(0, st)), CuResult::ERROR_STREAM_CAPTURE_INVALIDATED);
    s.host_free_mapped(0, host).unwrap();
    assert_eq!(code(s.host_free_mapped(0, host)), IV, "freed once");
    s.mem_free(1, word).unwrap();
    s.stream_destroy(0, st).unwrap();
    assert!(s.ledger().is_empty(), "{}", s.ledger());
}
