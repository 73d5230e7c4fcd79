//! The test engine between NVLink domains: one mcast bootstrap per rail, reductions on the host
//! (the simulator's device memory is host memory); stream-ordered on request, failing on one
//! rank on request.

use std::sync::Arc;

use mcast::bootstrap::{host, new_root_id, Bootstrap, ID_BYTES};
use mcast::driver::{Device, DevicePtr, Driver, Stream};
use mcast::kernels::{DType, RedOp};
use mcast::runtime::net::{Engine, RailComm, RailOob};
use mcast::runtime::{Error, ErrorKind, Result};

use super::TIMEOUT_MS;

/// The test engine: one mcast bootstrap per rail; reductions on the host.
pub struct TestEngine {
    pub rank: usize,
    pub fail: Option<usize>,
    /// Stream-ordered on the simulator: the all-reduce enqueues its work on the stream given
    /// (the other calls run when called).
    pub ordered: Option<(Arc<dyn Driver>, Device)>,
}

impl Engine for TestEngine {
    fn name(&self) -> &str {
        "test"
    }

    fn stream_ordered(&self) -> bool {
        self.ordered.is_some()
    }

    fn enqueues_on_sim(&self) -> bool {
        self.ordered.is_some()
    }

    fn comm_create(
        &self,
        _rail: usize,
        domain: usize,
        ndomains: usize,
        oob: &dyn RailOob,
    ) -> Result<Box<dyn RailComm>> {
        let mine = if domain == 0 { new_root_id().map_err(Error::from)? } else { [0; ID_BYTES] };
        let mut all = vec![0u8; ID_BYTES * ndomains];
        oob.allgather(&mine, &mut all)?;
        let id: [u8; ID_BYTES] = all[..ID_BYTES].try_into().unwrap();
        let boot = Bootstrap::init_id(&id, ndomains as i64, domain as i64, 72, TIMEOUT_MS, host::host_id())?;
        let (boot, rank, fail, ordered) =
            (Arc::new(boot), self.rank, self.fail == Some(self.rank), self.ordered.clone());
        Ok(Box::new(TestRail { boot, rank, fail, ordered }))
    }
}

struct TestRail {
    boot: Arc<Bootstrap>,
    rank: usize,
    fail: bool,
    ordered: Option<(Arc<dyn Driver>, Device)>,
}

/// `len` bytes of the simulator's device memory at `p` (host memory).
pub fn bytes(p: DevicePtr, len: usize) -> Vec<u8> {
    // SAFETY: simulator device memory is host memory, `len` bytes of it at `p` (the caller's range).
    unsafe { std::slice::from_raw_parts(p as usize as *const u8, len) }.to_vec()
}

pub fn store(p: DevicePtr, data: &[u8]) {
    // SAFETY: as in `bytes`, writable.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p as usize as *mut u8, data.len()) }
}

pub fn fold(parts: &[&[u8]], dtype: DType, op: RedOp) -> Result<Vec<u8>> {
    macro_rules! with {
        ($t:ty) => {{
            let n = std::mem::size_of::<$t>();
            let get = |b: &[u8], i: usize| <$t>::from_ne_bytes(b[i * n..(i + 1) * n].try_into().unwrap());
            let count = parts[0].len() / n;
            let mut out = Vec::with_capacity(parts[0].len());
            for i in 0..count {
                let mut acc = get(parts[0], i);
                for p in &parts[1..] {
                    let v = get(p, i);
                    acc = match op {
                        RedOp::Sum => acc + v,
                        RedOp::Min => {
                            if v < acc {
                                v
                            } else {
                                acc
                            }
                        }
                        RedOp::Max => {
                            if v > acc {
                                v
                            } else {
                                acc
                            }
                        }
                    };
                }
                out.extend_from_slice(&acc.to_ne_bytes());
            }
            out
        }};
    }
    Ok(match dtype {
        DType::F32 => with!(f32),
        DType::F64 => with!(f64),
        DType::I32 => with!(i32),
        DType::U32 => with!(u32),
        DType::I64 => with!(i64),
        DType::U64 => with!(u64),
        DType::F16 => with!(half::f16),
        DType::BF16 => with!(half::bf16),
    })
}

/// Every member's `mine` (of one length on every member), in pieces under the bootstrap's
/// frame cap (a frame carries every member's piece).
fn gather(boot: &Bootstrap, what: &str, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
    const PIECE: usize = 128 << 10;
    let mut all = vec![Vec::with_capacity(mine.len()); boot.nranks()];
    for piece in mine.chunks(PIECE) {
        let parts = boot.allgather(what, Ok(()), piece, &[])?;
        for (to, p) in all.iter_mut().zip(parts) {
            to.extend_from_slice(&p.bytes);
        }
    }
    Ok(all)
}

impl TestRail {
    fn gather(&self, what: &str, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        gather(&self.boot, what, mine)
    }
}

impl RailComm for TestRail {
    fn all_reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DType,
        op: RedOp,
        stream: Stream,
    ) -> Result<()> {
        if let Some((driver, dev)) = &self.ordered {
            // Enqueued: the data is read when the stream reaches the call.
            let boot = self.boot.clone();
            let work = move || {
                let all = gather(&boot, "all_reduce", &bytes(send, count * dtype.size())).unwrap();
                let parts: Vec<&[u8]> = all.iter().map(Vec::as_slice).collect();
                store(recv, &fold(&parts, dtype, op).unwrap());
            };
            return driver.as_sim().unwrap().enqueue(*dev, stream, work).map_err(|e| Error::driver(e, "enqueueing"));
        }
        let all = self.gather("all_reduce", &bytes(send, count * dtype.size()))?;
        if self.fail {
            return Err(Error::new(ErrorKind::Driver, format!("test engine: all_reduce failed on rank {}", self.rank)));
        }
        let parts: Vec<&[u8]> = all.iter().map(Vec::as_slice).collect();
        store(recv, &fold(&parts, dtype, op)?);
        Ok(())
    }

    fn reduce_scatter(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        recv_count: usize,
        dtype: DType,
        op: RedOp,
        _: Stream,
    ) -> Result<()> {
        let block = recv_count * dtype.size();
        let nd = self.boot.nranks();
        let all = self.gather("reduce_scatter", &bytes(send, nd * block))?;
        let me = self.boot.rank();
        let parts: Vec<&[u8]> = all.iter().map(|p| &p[me * block..(me + 1) * block]).collect();
        store(recv, &fold(&parts, dtype, op)?);
        Ok(())
    }

    fn all_gather(&self, send: DevicePtr, recv: DevicePtr, send_count: usize, dtype: DType, _: Stream) -> Result<()> {
        let all = self.gather("all_gather", &bytes(send, send_count * dtype.size()))?;
        store(recv, &all.concat());
        Ok(())
    }

    fn broadcast(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DType,
        root: usize,
        _: Stream,
    ) -> Result<()> {
        let len = count * dtype.size();
        let mine = if self.boot.rank() == root { bytes(send, len) } else { vec![0; len] };
        let all = self.gather("broadcast", &mine)?;
        store(recv, &all[root]);
        Ok(())
    }

    fn abort(&self) -> Result<()> {
        self.boot.abort("the team was aborted");
        Ok(())
    }

    fn destroy(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
