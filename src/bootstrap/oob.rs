//! The caller's out-of-band allgather (`mcast_oob_t`): used once, during team setup, to swap
//! the fixed-size record every rank needs to join rank 0's hub: a tag, the team size, the
//! rank, rank 0's secret and its hub address. Afterwards the team talks over its own TCP
//! connections only.

use std::net::SocketAddr;

use super::tcp::SECRET_BYTES;
use super::{BootError, Dec, Enc, Kind};

/// The caller's allgather: `send` from every rank into `recv` in rank order; `Err`: why not.
pub type Allgather<'a> = &'a mut dyn FnMut(&[u8], &mut [u8]) -> Result<(), String>;

/// Bytes each rank gives the allgather.
pub const RECORD: usize = 256;
const TAG: u32 = 0x4f42_4d31; // "1MBO"

/// This rank's record (`problem`: why this rank cannot take part, told to every rank).
pub fn record(nranks: usize, rank: usize, secret: &[u8; SECRET_BYTES], hub: &str, problem: Option<&str>) -> Vec<u8> {
    let mut e = Enc::default();
    e.u32(TAG).u32(nranks as u32).u32(rank as u32).bytes(secret).str(hub);
    let p: String = problem.unwrap_or("").chars().take(120).collect();
    e.str(&p);
    let mut v = e.0;
    v.resize(RECORD, 0);
    v
}

/// Checks every rank's record (same tag and team size, rank `i` at place `i`) and returns rank
/// 0's secret and hub address.
pub fn read_records(all: &[u8], nranks: usize, me: usize) -> Result<([u8; SECRET_BYTES], SocketAddr), BootError> {
    let bad = |m: String| BootError::new(Kind::InvalidArgument, format!("rank {me}: {m}"));
    let mut first = None;
    for q in 0..nranks {
        let rec = &all[q * RECORD..(q + 1) * RECORD];
        let mut d = Dec(rec);
        let parsed = (|| Ok::<_, BootError>((d.u32()?, d.u32()?, d.u32()?, d.bytes()?, d.str()?, d.str()?)))();
        let Ok((TAG, n, r, secret, hub, problem)) = parsed else {
            return Err(bad(format!(
                "the allgather's block {q} is not an mcast record: the allgather must gather `bytes` from every rank \
                 in rank order"
            )));
        };
        if n as usize != nranks || r as usize != q {
            return Err(bad(format!(
                "block {q} of the allgather came from rank {r} of {n}, but this rank expects rank {q} of {nranks}: \
                 every rank must pass its own rank, the same nranks, and an allgather over the same processes"
            )));
        }
        if !problem.is_empty() {
            return Err(BootError::new(Kind::InvalidArgument, format!("rank {q} failed to set up: {problem}")));
        }
        if q == 0 {
            let s: [u8; SECRET_BYTES] = secret.try_into().map_err(|_| bad("rank 0's record is damaged".into()))?;
            let a: SocketAddr = hub.parse().map_err(|_| bad(format!("rank 0's hub address {hub:?} is damaged")))?;
            first = Some((s, a));
        }
    }
    first.ok_or_else(|| bad("no ranks".into()))
}
