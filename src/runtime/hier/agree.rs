//! The comparison of a call across NVLink domains. A domain stage's kernels compare the user
//! call's signature inside the domain only, and the rails (NCCL, MPI) compare nothing: ranks of
//! different domains that disagree on a count would pass their engine different counts (a
//! truncation error, a hang or wrong data in MPI and NCCL alike). So, with the check on
//! (`MCAST_CHECK_CALLS`), every rank gathers every rank's 16-byte signature before any stage and
//! compares them on the host ([`judge`]): where two differ, every rank finds the same pair (the
//! lowest rank that differs from rank 0) and returns the same `InvalidArgument`, naming the
//! field, the values and the ranks; no stage runs, so no data is written and no engine call of
//! another count is made. How the signatures travel depends on the engine:
//!
//! - **Where the rail calls run stage by stage** (the engine completes each call before it
//!   returns: MPI, and NCCL on the simulator), [`across_domains`] uses the engine itself:
//!   1. its own signature is written to the scratch, the domain's slots after it zeroed;
//!   2. a domain all-gather of the signatures (the domain team's pointer form, signed as
//!      itself: every rank makes the same call whatever its user call);
//!   3. a rail all-gather of the domain's signatures (the stream synchronised first, as before
//!      every blocking rail call): each rank now holds all of them, in the same table.
//!
//!   A domain whose all-gather failed (a rank gone: its kernels record the timeout) leaves its
//!   slots zero, which no signature is (the collective field is never 0); zero slots are not
//!   compared, and that rank's stages then fail as they would without the comparison.
//! - **Where the rail calls are stream-ordered** (NCCL on GPUs), the host cannot read what the
//!   engine gathers without waiting for the stream, and a device-side verdict could not stop an
//!   NCCL call already enqueued. So [`over_bootstrap`] exchanges the signatures over the team's
//!   own connections (the bootstrap that made it: one exchange through rank 0, on the host; the
//!   stream is never waited for). In a CUDA graph the comparison runs once, at capture, on the
//!   arguments the graph replays. A rank that is gone ends the exchange within `timeout_ms`
//!   (`Timeout`), an abort at once (`Aborted`), and the team keeps the failure.
//!
//! The verdict is the same on every rank when every rank is alive.

use super::Across;
use crate::driver::{DevicePtr, Stream};
use crate::kernels::abi::signature::describe;
use crate::kernels::Collective;
use crate::runtime::collective as domain;
use crate::runtime::comm::{Dec, Enc};
use crate::runtime::error::{Error, ErrorKind, Result};

/// Bytes of one signature in the table.
const SIG: usize = 16;

/// Compares rank `h.rank`'s call signature `sig` with every rank's through the engine, where the
/// rail calls run stage by stage (see the module doc). `rail_all_gather(send, recv, words)` is
/// the rank's blocking rail all-gather of `words` 32-bit words.
pub(super) fn across_domains(
    h: &Across,
    stream: Stream,
    sig: [u64; 2],
    rail_all_gather: impl FnOnce(DevicePtr, DevicePtr, usize) -> Result<()>,
) -> Result<()> {
    let team = &h.team;
    let l = h.layout.domain_size();
    let p = h.layout.domains() * l;
    let driver = team.context().driver();
    let dev = team.devices()[h.local];
    let table = h.with_scratch(team.context(), SIG * (1 + l + p), stream, |s| {
        let (mine, gathered, all) = (s, s + SIG as u64, s + (SIG * (1 + l)) as u64);
        let mut head = vec![0u8; SIG * (1 + l)];
        head[..8].copy_from_slice(&sig[0].to_ne_bytes());
        head[8..SIG].copy_from_slice(&sig[1].to_ne_bytes());
        driver
            .memcpy_htod(dev, mine, &head)
            .map_err(|e| Error::driver(e, format_args!("writing rank {}'s call signature", h.rank)))?;
        let in_domain = domain::run_ptr(team, h.local as i32, mine, gathered, SIG, Collective::AllGather, stream);
        // The rail call runs even when the domain's failed: its members in other domains wait
        // for it (the zero slots it then carries are not compared).
        let railed = rail_all_gather(gathered, all, SIG * l / 4);
        in_domain.and(railed)?;
        let mut table = vec![0u8; SIG * p];
        driver
            .memcpy_dtoh(dev, &mut table, all)
            .map_err(|e| Error::driver(e, format_args!("reading the call signatures of rank {}'s team", h.rank)))?;
        Ok(table)
    })?;
    // Block d of the table is domain d's signatures in local order.
    let word = |i: usize| u64::from_ne_bytes(table[8 * i..8 * i + 8].try_into().expect("8 bytes"));
    let of_rank: Vec<[u64; 2]> = h
        .layout
        .place
        .iter()
        .map(|&(d, j)| {
            let at = 2 * (d * l + j);
            [word(at), word(at + 1)]
        })
        .collect();
    judge(h, &of_rank)
}

/// Compares rank `h.rank`'s call signature `sig` with every rank's over the team's bootstrap,
/// where the rail calls are stream-ordered (see the module doc).
pub(super) fn over_bootstrap(h: &Across, sig: [u64; 2]) -> Result<()> {
    let mut mine = Enc::default();
    mine.u64(sig[0]).u64(sig[1]);
    let parts = h.global.exchange("call signatures", Ok(()), &mine.0, &[]).map_err(|e| {
        let e = e.context(format!("rank {}: comparing the ranks' calls", h.rank));
        if e.kind != ErrorKind::Aborted {
            h.team.set_error(e.clone());
        }
        e
    })?;
    let of_rank = parts
        .iter()
        .map(|p| {
            let mut d = Dec(&p.bytes);
            Ok([d.u64()?, d.u64()?])
        })
        .collect::<Result<Vec<[u64; 2]>>>()?;
    judge(h, &of_rank)
}

/// The verdict on every rank's signature, the same on every rank: `Ok` when they agree (unknown
/// ones skipped), else the team keeps the `InvalidArgument` naming the first pair that differs
/// (its later calls and synchronize report it, as after a mismatch found by the kernels).
fn judge(h: &Across, of_rank: &[[u64; 2]]) -> Result<()> {
    let Some((a, b)) = first_disagreement(of_rank) else { return Ok(()) };
    let e = Error::invalid_argument(format!(
        "rank {}: {}: every rank must pass the same collective, count, dtype, op, root and buffer offsets; the \
         team's {} NVLink domains compared their ranks' calls before any stage and wrote no data; every rank of \
         the team reports this error until it is destroyed: destroy it and make a new one",
        h.rank,
        describe(a, of_rank[a], b, of_rank[b]),
        h.layout.domains()
    ));
    h.team.set_error(e.clone());
    Err(e)
}

/// The first known signature and the lowest rank whose known signature differs from it
/// (unknown: zero, see the module doc).
fn first_disagreement(sigs: &[[u64; 2]]) -> Option<(usize, usize)> {
    let known = |s: &[u64; 2]| s[0] != 0;
    let a = sigs.iter().position(known)?;
    let b = sigs.iter().enumerate().skip(a + 1).position(|(_, s)| known(s) && *s != sigs[a])?;
    Some((a, a + 1 + b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::abi::signature::{signature, Offsets};
    use crate::kernels::{DType, RedOp};

    #[test]
    fn the_first_known_pair_that_differs_is_named_and_unknown_slots_are_skipped() {
        let ar = |n| signature(Collective::AllReduce { dtype: DType::F32, op: RedOp::Sum }, n, Offsets::Free);
        let zero = [0u64; 2];
        assert_eq!(first_disagreement(&[ar(8), ar(8), ar(8), ar(8)]), None);
        assert_eq!(first_disagreement(&[ar(8), ar(8), ar(4), ar(4)]), Some((0, 2)));
        assert_eq!(first_disagreement(&[ar(8), ar(4), ar(8), ar(4)]), Some((0, 1)));
        assert_eq!(first_disagreement(&[zero, ar(8), zero, ar(8)]), None);
        assert_eq!(first_disagreement(&[zero, ar(8), zero, ar(4)]), Some((1, 3)));
        assert_eq!(first_disagreement(&[zero, zero]), None);
        // Every signature a call can have is known (the collective field is never 0).
        assert!(ar(0)[0] != 0 && signature(Collective::AllGather, 0, Offsets::Free)[0] != 0);
    }
}
