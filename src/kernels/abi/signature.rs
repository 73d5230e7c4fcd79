//! The signature of one rank's collective call: what every rank must pass alike (collective,
//! dtype, operator, root, count and, where the kernels address a peer's memory at this rank's
//! offsets, the buffer offsets), packed in two `u64` words (`McastArgs::sig`). Each rank
//! publishes it at the entry of its kernel, in the words its peers read there (the entry
//! barrier, the LL lines, the push flags: `kernels/sync.cuh`), and compares its peers' with its
//! own before any data is touched; on a difference it records [`ERR_MISMATCH`] with the peer's
//! signature and its own in its local state ([`MISMATCH_OFFSET`]), from which [`describe`]
//! names the field, the values and the ranks.
//!
//! Word 0: bits 0-2 the collective (1 all-reduce, 2 reduce-scatter, 3 broadcast, 4 all-gather),
//! 3-5 the dtype, 6-7 the operator, 8-14 the root, 15-16 which offsets word 1 holds
//! ([`Offsets`]), 17-63 the count. Word 1: the send (or in-place) offset in bits 0-31, the recv
//! offset in bits 32-63 (the low 32 bits of each: two offsets that differ by a multiple of 4 GiB
//! compare equal).

use super::layout::{ERR_MISMATCH, MISMATCH_OFFSET};
use crate::kernels::{Collective, DType, RedOp};

/// The offsets of a call that must agree across ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offsets {
    /// None: the kernels read and write only this rank's own memory at them (the pointer
    /// form's LL, push and staged routes).
    Free,
    /// In place on a buffer at this byte offset (the kernels address every rank's copy there).
    InPlace(u64),
    /// Out of place: the send and recv buffers' byte offsets.
    Into {
        /// Offset in the send buffer.
        send: u64,
        /// Offset in the recv buffer.
        recv: u64,
    },
}

const COUNT_SHIFT: u32 = 17;

/// The signature of a call of `collective` with `count` (the caller's count) at `offsets`.
pub fn signature(collective: Collective, count: u64, offsets: Offsets) -> [u64; 2] {
    let (kind, dtype, op, root) = match collective {
        Collective::AllReduce { dtype, op } => (1, dtype as u64, op as u64, 0),
        Collective::ReduceScatter { dtype, op } => (2, dtype as u64, op as u64, 0),
        Collective::Broadcast { root } => (3, 0, 0, u64::from(root) & 0x7f),
        Collective::AllGather => (4, 0, 0, 0),
    };
    let (form, w1) = match offsets {
        Offsets::Free => (0, 0),
        Offsets::InPlace(o) => (1, o & 0xffff_ffff),
        Offsets::Into { send, recv } => (2, (send & 0xffff_ffff) | recv << 32),
    };
    let w0 = kind | dtype << 3 | op << 6 | root << 8 | form << 15 | count << COUNT_SHIFT;
    [w0, w1]
}

/// One field of a signature by name, as a value to print.
fn fields(sig: [u64; 2]) -> [(&'static str, String); 8] {
    let w0 = sig[0];
    let kind = match w0 & 7 {
        1 => "all-reduce",
        2 => "reduce-scatter",
        3 => "broadcast",
        4 => "all-gather",
        _ => "no collective",
    };
    let dtype = DType::from_raw((w0 >> 3 & 7) as u32).map_or("?", DType::name);
    let op = RedOp::from_raw((w0 >> 6 & 3) as u32).map_or("?", RedOp::name);
    let form = match w0 >> 15 & 3 {
        0 => "its own memory (the pointer form)",
        1 => "one buffer in place",
        _ => "a send and a recv buffer",
    };
    let (send, recv) = (sig[1] & 0xffff_ffff, sig[1] >> 32);
    [
        ("collective", kind.to_string()),
        ("dtype", dtype.to_string()),
        ("op", op.to_string()),
        ("root", (w0 >> 8 & 0x7f).to_string()),
        ("count", (w0 >> COUNT_SHIFT).to_string()),
        ("form", form.to_string()),
        (if w0 >> 15 & 3 == 1 { "offset" } else { "send offset" }, send.to_string()),
        ("recv offset", recv.to_string()),
    ]
}

/// Names the first field in which rank `me`'s signature `mine` and rank `peer`'s `theirs`
/// differ, with both values, the lower rank first: "ranks disagree on count: rank 0 has 1024,
/// rank 1 has 512". Fields that do not apply (the dtype of a broadcast) are equal in both.
pub fn describe(me: usize, mine: [u64; 2], peer: usize, theirs: [u64; 2]) -> String {
    let (a, b) = (fields(mine), fields(theirs));
    let differ = a.iter().zip(&b).find(|(x, y)| x.1 != y.1);
    let Some(((field, va), (_, vb))) = differ else {
        return format!("ranks {me} and {peer} disagree on a collective's signature ({mine:x?} and {theirs:x?})");
    };
    let ((lo, vlo), (hi, vhi)) = if me < peer { ((me, va), (peer, vb)) } else { ((peer, vb), (me, va)) };
    format!("ranks disagree on {field}: rank {lo} has {vlo}, rank {hi} has {vhi}")
}

/// Bytes of the mismatch record at [`MISMATCH_OFFSET`]: the peer's signature, then this rank's.
pub const MISMATCH_BYTES: usize = 32;

/// Decodes the mismatch record `bytes` ([`MISMATCH_BYTES`] read at [`MISMATCH_OFFSET`]) of rank
/// `me`, whose error word is [`ERR_MISMATCH`] with detail `peer` (the rank that disagreed), the
/// ranks named as `rank_of` maps them (a team across NVLink domains: the domain team's index to
/// the whole team's rank).
pub fn describe_record(me: usize, peer: u32, bytes: &[u8; MISMATCH_BYTES], rank_of: impl Fn(usize) -> usize) -> String {
    let w = |i: usize| u64::from_ne_bytes(bytes[8 * i..8 * i + 8].try_into().expect("8 bytes"));
    describe(rank_of(me), [w(2), w(3)], rank_of(peer as usize), [w(0), w(1)])
}

const _: () = assert!(ERR_MISMATCH != 0 && MISMATCH_OFFSET.is_multiple_of(8));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_field_is_named_with_both_values_lower_rank_first() {
        let ar = |dtype, op| Collective::AllReduce { dtype, op };
        let f32sum = ar(DType::F32, RedOp::Sum);
        let s = |c, n, o| signature(c, n, o);
        let base = s(f32sum, 1024, Offsets::InPlace(0));
        assert_eq!(base, s(f32sum, 1024, Offsets::InPlace(0)));
        for (other, want) in [
            (s(f32sum, 512, Offsets::InPlace(0)), "ranks disagree on count: rank 0 has 1024, rank 1 has 512"),
            (s(ar(DType::I32, RedOp::Sum), 1024, Offsets::InPlace(0)), "dtype: rank 0 has f32, rank 1 has i32"),
            (s(ar(DType::F32, RedOp::Max), 1024, Offsets::InPlace(0)), "op: rank 0 has sum, rank 1 has max"),
            (s(f32sum, 1024, Offsets::InPlace(4096)), "offset: rank 0 has 0, rank 1 has 4096"),
            (s(Collective::AllGather, 1024, Offsets::InPlace(0)), "collective: rank 0 has all-reduce"),
        ] {
            let m = describe(0, base, 1, other);
            assert!(m.contains(want), "{m}");
            // Seen from rank 1: the same sentence.
            assert_eq!(describe(1, other, 0, base), m);
        }
        let b = |root| s(Collective::Broadcast { root }, 8, Offsets::Free);
        assert_eq!(describe(2, b(2), 0, b(0)), "ranks disagree on root: rank 0 has 0, rank 2 has 2");
        let into = |send, recv| s(Collective::AllGather, 8, Offsets::Into { send, recv });
        assert!(describe(0, into(0, 64), 1, into(0, 128)).contains("recv offset: rank 0 has 64, rank 1 has 128"));
        assert!(describe(0, into(16, 64), 1, into(0, 64)).contains("send offset: rank 0 has 16, rank 1 has 0"));
        let mut rec = [0u8; MISMATCH_BYTES];
        for (i, w) in [into(0, 128)[0], into(0, 128)[1], into(0, 64)[0], into(0, 64)[1]].iter().enumerate() {
            rec[8 * i..8 * i + 8].copy_from_slice(&w.to_ne_bytes());
        }
        assert!(describe_record(0, 1, &rec, |r| r).contains("recv offset: rank 0 has 64, rank 1 has 128"));
        // Ranks mapped (a domain team's indices 0 and 1 as ranks 4 and 1): the lower first.
        assert!(describe_record(0, 1, &rec, |r| [4, 1][r]).contains("recv offset: rank 1 has 128, rank 4 has 64"));
    }
}
