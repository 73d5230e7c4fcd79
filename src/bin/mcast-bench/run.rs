//! Running the collective: the rig (each rank's stream, timing events and data: mcast buffers,
//! registered `mcast_mem_alloc` memory or plain device memory), one rank's `mcast_*` call, and
//! the correctness check against the host reference.

use std::ffi::{c_int, c_void};

use mcast::capi::buffer::mcast_buffer_t;
use mcast::capi::collective::{
    mcast_all_gather, mcast_all_gather_into, mcast_all_reduce, mcast_all_reduce_into, mcast_broadcast,
    mcast_broadcast_into, mcast_dtype_t, mcast_op_t, mcast_reduce_scatter, mcast_reduce_scatter_into,
    mcast_team_all_gather, mcast_team_all_reduce, mcast_team_broadcast, mcast_team_reduce_scatter,
};
use mcast::capi::context::mcast_context_t;
use mcast::capi::mcast_status_t;
use mcast::capi::team::mcast_team_t;
use mcast::driver::{Event, Stream};

use crate::api::{self, Plumbing};
use crate::args::{runtime, DType, Failure, Memory, Op, RedOp};
use crate::data::{count_wrong, fill, Shape};

/// The streams, timing events and data of the team's ranks this process holds (every rank, or
/// one with a process per rank), indexed from 0 ("local index"); released in reverse.
pub struct Rig {
    pub devices: Vec<i32>,
    /// The team rank of local index 0: local index `l` is rank `first + l`.
    pub first: usize,
    pub streams: Vec<Stream>,
    pub start: Vec<Event>,
    pub end: Vec<Event>,
    /// The send buffer (buffer and registered memory): in place, also the result.
    pub buf: Option<mcast_buffer_t>,
    /// Out of place: the recv buffer.
    pub recv: Option<mcast_buffer_t>,
    /// Per rank: send and recv memory (`mcast_mem_alloc` for registered memory, `cuMemAlloc` for
    /// pointers); in place, recv is send.
    pub send_mem: Vec<u64>,
    pub recv_mem: Vec<u64>,
    pub memory: Memory,
    pub inplace: bool,
    /// How long the allocation (and registration) took, in milliseconds.
    pub alloc_ms: f64,
}

impl Rig {
    /// An empty rig for ranks `first..` on `devices`.
    pub fn new(devices: &[i32], first: usize) -> Rig {
        Rig {
            devices: devices.to_vec(),
            first,
            streams: vec![],
            start: vec![],
            end: vec![],
            buf: None,
            recv: None,
            send_mem: vec![],
            recv_mem: vec![],
            memory: Memory::Buffer,
            inplace: true,
            alloc_ms: 0.0,
        }
    }

    /// Creates the streams, events and a `bytes`-byte buffer. On failure what was created stays
    /// in the rig, for [`Rig::release`].
    pub fn populate(
        &mut self,
        p: &Plumbing,
        ctx: mcast_context_t,
        team: mcast_team_t,
        bytes: usize,
        memory: Memory,
        inplace: bool,
    ) -> Result<(), Failure> {
        self.memory = memory;
        self.inplace = inplace;
        let driver = &p.driver;
        for &dev in &self.devices {
            let s =
                driver.stream_create(dev).map_err(|e| runtime(format!("creating a stream on device {dev}: {e}")))?;
            self.streams.push(s);
        }
        for &dev in &self.devices {
            let event =
                || driver.event_create(dev).map_err(|e| runtime(format!("creating an event on device {dev}: {e}")));
            self.start.push(event()?);
            self.end.push(event()?);
        }
        let allocating = std::time::Instant::now();
        let copies = if inplace { 1 } else { 2 };
        match memory {
            Memory::Buffer => {
                for k in 0..copies {
                    let buf = api::buffer_alloc(team, bytes)
                        .map_err(|e| runtime(format!("allocating a {bytes}-byte buffer on every rank: {e}")))?;
                    if k == 0 {
                        self.buf = Some(buf);
                    } else {
                        self.recv = Some(buf);
                    }
                }
            }
            Memory::Registered | Memory::Pointer => {
                for k in 0..copies {
                    for &dev in &self.devices {
                        let p = match memory {
                            Memory::Registered => api::mem_alloc(ctx, dev, bytes),
                            _ => driver.mem_alloc(dev, bytes).map_err(|e| e.to_string()),
                        }
                        .map_err(|e| runtime(format!("allocating {bytes} bytes on device {dev}: {e}")))?;
                        if k == 0 {
                            self.send_mem.push(p);
                        } else {
                            self.recv_mem.push(p);
                        }
                    }
                }
                if memory == Memory::Registered {
                    self.buf = Some(
                        api::buffer_register(team, &self.send_mem, bytes)
                            .map_err(|e| runtime(format!("registering the send memory: {e}")))?,
                    );
                    if !inplace {
                        self.recv = Some(
                            api::buffer_register(team, &self.recv_mem, bytes)
                                .map_err(|e| runtime(format!("registering the recv memory: {e}")))?,
                        );
                    }
                }
            }
        }
        if inplace {
            self.recv_mem = self.send_mem.clone();
        }
        self.alloc_ms = allocating.elapsed().as_secs_f64() * 1e3;
        Ok(())
    }

    /// Frees everything; returns the errors.
    pub fn release(self, p: &Plumbing, ctx: mcast_context_t) -> Vec<String> {
        let driver = &p.driver;
        let mut errors = vec![];
        for &b in self.buf.iter().chain(&self.recv) {
            if let Err(e) = api::buffer_free(b) {
                errors.push(format!("freeing a buffer: {e}"));
            }
        }
        let copies = if self.inplace { 1 } else { 2 };
        let mems =
            self.send_mem.iter().chain(&self.recv_mem).take(copies * self.send_mem.len().min(self.devices.len()));
        for (i, &ptr) in mems.enumerate() {
            let dev = self.devices[i % self.devices.len()];
            let freed = match self.memory {
                Memory::Registered => api::mem_free(ctx, ptr),
                _ => driver.mem_free(dev, ptr).map_err(|e| e.to_string()),
            };
            if let Err(e) = freed {
                errors.push(format!("freeing memory on device {dev}: {e}"));
            }
        }
        let dev = |r: usize| self.devices[r];
        for (r, &ev) in self.start.iter().enumerate().chain(self.end.iter().enumerate()) {
            if let Err(e) = driver.event_destroy(dev(r), ev) {
                errors.push(format!("destroying an event: {e}"));
            }
        }
        for (r, &s) in self.streams.iter().enumerate() {
            if let Err(e) = driver.stream_destroy(dev(r), s) {
                errors.push(format!("destroying a stream: {e}"));
            }
        }
        errors
    }
}

/// One op over one rig: the calls, the inputs and the reference.
pub struct Bench<'a> {
    pub plumbing: &'a Plumbing,
    pub team: mcast_team_t,
    pub rig: &'a Rig,
    pub op: Op,
    pub dtype: DType,
    pub redop: RedOp,
    pub root: u32,
    /// Per team rank: its input data.
    pub inputs: Vec<Vec<u8>>,
    /// The reduction over ranks of the inputs.
    pub reduced: Vec<u8>,
}

impl Bench<'_> {
    fn buf(&self) -> mcast_buffer_t {
        self.rig.buf.expect("allocated")
    }

    /// `count` as the calls take it: elements for the reductions, bytes otherwise.
    pub fn call_count(&self, s: &Shape) -> usize {
        if self.op.reduces() {
            s.count
        } else {
            s.count * s.es
        }
    }

    /// The team rank of local index `l`.
    pub fn rank(&self, l: usize) -> usize {
        self.rig.first + l
    }

    /// The `mcast_*` call of the rank at local index `l` for `count` (elements or bytes, see
    /// [`Bench::call_count`]) on `stream`, as `--memory` and `--inplace` say: the in-place calls
    /// on a buffer, the `_into` calls out of place, the `mcast_team_*` pointer forms on plain
    /// memory. Nothing else: the host-overhead mode times exactly this.
    #[inline]
    pub fn call(&self, l: usize, count: usize, block: u64, stream: Stream) -> mcast_status_t {
        let rig = self.rig;
        let r = self.rank(l);
        let (rank, st) = (r as c_int, api::stream(stream));
        let (dtype, op) = (mcast_dtype_t(self.dtype as u32), mcast_op_t(self.redop as u32));
        let root = self.root as c_int;
        match (rig.memory, rig.inplace) {
            (Memory::Pointer, inplace) => {
                // NCCL's in-place layouts: all-gather sends block r of recv, reduce-scatter
                // receives into block r of send.
                let (send, recv) = (rig.send_mem[l], rig.recv_mem[l]);
                let (send, recv) = match (self.op, inplace) {
                    (Op::AllGather, true) => (send + r as u64 * block, recv),
                    (Op::ReduceScatter, true) => (send, recv + r as u64 * block),
                    _ => (send, recv),
                };
                let (send, recv) = (send as usize as *const c_void, recv as usize as *mut c_void);
                let team = self.team;
                match self.op {
                    Op::AllReduce => mcast_team_all_reduce(team, rank, send, recv, count, dtype, op, st),
                    Op::Broadcast => mcast_team_broadcast(team, rank, root, send, recv, count, st),
                    Op::ReduceScatter => mcast_team_reduce_scatter(team, rank, send, recv, count, dtype, op, st),
                    Op::AllGather => mcast_team_all_gather(team, rank, send, recv, count, st),
                }
            }
            (_, true) => {
                let buf = self.buf();
                match self.op {
                    Op::AllReduce => mcast_all_reduce(buf, rank, 0, count, dtype, op, st),
                    Op::Broadcast => mcast_broadcast(buf, rank, root, 0, count, st),
                    Op::ReduceScatter => mcast_reduce_scatter(buf, rank, 0, count, dtype, op, st),
                    Op::AllGather => mcast_all_gather(buf, rank, 0, count, st),
                }
            }
            (_, false) => {
                let (send, recv) = (self.buf(), rig.recv.expect("allocated"));
                match self.op {
                    Op::AllReduce => mcast_all_reduce_into(send, 0, recv, 0, rank, count, dtype, op, st),
                    Op::Broadcast => mcast_broadcast_into(send, 0, recv, 0, rank, root, count, st),
                    Op::ReduceScatter => mcast_reduce_scatter_into(send, 0, recv, 0, rank, count, dtype, op, st),
                    Op::AllGather => mcast_all_gather_into(send, 0, recv, 0, rank, count, st),
                }
            }
        }
    }

    /// The part of one collective of shape `s` on `stream` of the rank at local index `l`.
    pub fn run_rank(&self, l: usize, s: &Shape, stream: Stream) -> Result<(), Failure> {
        let block = (s.count * s.es) as u64;
        api::check(self.call(l, self.call_count(s), block, stream))
            .map_err(|e| runtime(format!("{} rank {}: {e}", self.op.name(), self.rank(l))))
    }

    /// This process's ranks' parts of one collective, rank by rank.
    pub fn launch(&self, s: &Shape) -> Result<(), Failure> {
        for (l, &stream) in self.rig.streams.iter().enumerate() {
            self.run_rank(l, s, stream)?;
        }
        Ok(())
    }

    /// `mcast_synchronize` of the stream of the rank at local index `l`.
    pub fn sync(&self, l: usize, stream: Stream) -> Result<(), Failure> {
        api::synchronize(self.team, self.rank(l), stream).map_err(|e| runtime(format!("{}: {e}", self.op.name())))
    }

    fn sync_all(&self) -> Result<(), Failure> {
        for (l, &stream) in self.rig.streams.iter().enumerate() {
            self.sync(l, stream)?;
        }
        Ok(())
    }

    /// Writes the input of the rank at local index `l` (`host`, the in-place layout) where the
    /// collective reads it.
    fn write_input(&self, l: usize, s: &Shape, host: &[u8]) -> Result<(), Failure> {
        let rig = self.rig;
        let r = self.rank(l);
        let block = s.count * s.es;
        // Out of place, all-gather sends only this rank's block.
        let data = match (self.op, rig.inplace) {
            (Op::AllGather, false) => &host[r * block..(r + 1) * block],
            _ => host,
        };
        let what = |e: String| runtime(format!("writing rank {r}'s input: {e}"));
        match rig.memory {
            Memory::Pointer => {
                self.plumbing.driver.memcpy_htod(rig.devices[l], rig.send_mem[l], data).map_err(|e| what(e.to_string()))
            }
            _ => api::buffer_write(self.buf(), r, data).map_err(what),
        }
    }

    /// Reads the result of the rank at local index `l` into `host`, in the in-place layout.
    fn read_output(&self, l: usize, s: &Shape, host: &mut [u8]) -> Result<(), Failure> {
        let rig = self.rig;
        let r = self.rank(l);
        let block = s.count * s.es;
        let dst = match (self.op, rig.inplace) {
            (Op::ReduceScatter, false) => &mut host[r * block..(r + 1) * block],
            _ => host,
        };
        let what = |e: String| runtime(format!("reading rank {r}'s result: {e}"));
        match (rig.memory, rig.inplace) {
            (Memory::Pointer, _) => {
                self.plumbing.driver.memcpy_dtoh(rig.devices[l], dst, rig.recv_mem[l]).map_err(|e| what(e.to_string()))
            }
            (_, true) => api::buffer_read(self.buf(), r, dst).map_err(what),
            (_, false) => api::buffer_read(rig.recv.expect("allocated"), r, dst).map_err(what),
        }
    }

    /// Fills the inputs, runs the op once and counts the wrong elements over this process's
    /// ranks.
    pub fn check(&self, s: &Shape) -> Result<u64, Failure> {
        let bytes = s.bytes();
        let mut host = vec![0u8; bytes];
        let local = self.rig.streams.len();
        for l in 0..local {
            fill(&mut host, 0, &self.inputs[self.rank(l)], s.es);
            self.write_input(l, s, &host)?;
        }
        self.launch(s)?;
        self.sync_all()?;
        let block = s.count * s.es;
        let mut wrong = 0;
        for l in 0..local {
            let r = self.rank(l);
            self.read_output(l, s, &mut host)?;
            wrong += match self.op {
                Op::AllReduce => count_wrong(&host, 0, &self.reduced, s.es),
                Op::Broadcast => count_wrong(&host, 0, &self.inputs[self.root as usize], s.es),
                Op::ReduceScatter => count_wrong(&host[r * block..(r + 1) * block], r * s.count, &self.reduced, s.es),
                Op::AllGather => (0..s.blocks)
                    .map(|b| count_wrong(&host[b * block..(b + 1) * block], b * s.count, &self.inputs[b], s.es))
                    .sum(),
            };
        }
        Ok(wrong)
    }
}
