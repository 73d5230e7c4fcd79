//! The check data: small integers, exact in every dtype and in their sums over the team,
//! periodic so that a host reference of one period checks any size; and the shape of one
//! message size (elements per block, blocks).

use half::{bf16, f16};

use crate::args::{DType, Op};

/// Elements per period of the check data. Prime and odd, so it never divides a power-of-two
/// count and a block shifted by whole blocks is seen.
pub const PERIOD: usize = 1021;

/// Half-width of the check values for a team of `nranks`: 8 up to 32 ranks, smaller above, so
/// that a sum over every rank stays within 256, bf16's exact integer range.
pub fn amplitude(nranks: usize) -> i64 {
    (256 / nranks.max(1) as i64).clamp(1, 8)
}

/// Small integers in [-a, a] ([0, 2a] unsigned), a = [`amplitude`]: exact in every dtype, and
/// their sums over the team are exact too (|sum| <= nranks * a <= 256). Ranks 1..=2a (all of
/// them up to 16 ranks) differ from rank 0 at every index.
pub fn value(d: DType, nranks: usize, rank: usize, j: usize) -> i64 {
    let a = amplitude(nranks);
    let v = ((j * 7 + rank) % (2 * a as usize + 1)) as i64;
    if matches!(d, DType::U32 | DType::U64) {
        v
    } else {
        v - a
    }
}

pub fn encode(d: DType, v: i64, out: &mut Vec<u8>) {
    match d {
        DType::F32 => out.extend((v as f32).to_ne_bytes()),
        DType::F64 => out.extend((v as f64).to_ne_bytes()),
        DType::F16 => out.extend(f16::from_f64(v as f64).to_bits().to_ne_bytes()),
        DType::BF16 => out.extend(bf16::from_f64(v as f64).to_bits().to_ne_bytes()),
        DType::I32 => out.extend((v as i32).to_ne_bytes()),
        DType::U32 => out.extend((v as u32).to_ne_bytes()),
        DType::I64 => out.extend(v.to_ne_bytes()),
        DType::U64 => out.extend((v as u64).to_ne_bytes()),
    }
}

/// `PERIOD` encoded elements: element `i` of a range is `table[i % PERIOD]`.
pub fn table(d: DType, f: impl Fn(usize) -> i64) -> Vec<u8> {
    let mut t = Vec::with_capacity(PERIOD * d.size());
    for j in 0..PERIOD {
        encode(d, f(j), &mut t);
    }
    t
}

/// Fills `dst` with the elements `first..` of the periodic `table`.
pub fn fill(dst: &mut [u8], first: usize, table: &[u8], es: usize) {
    let (mut i, mut pos) = (first, 0);
    while pos < dst.len() {
        let phase = i % PERIOD;
        let n = (PERIOD - phase).min((dst.len() - pos) / es);
        dst[pos..pos + n * es].copy_from_slice(&table[phase * es..(phase + n) * es]);
        pos += n * es;
        i += n;
    }
}

/// Elements of `got` (elements `first..`) that differ from the periodic `table`.
pub fn count_wrong(got: &[u8], first: usize, table: &[u8], es: usize) -> u64 {
    let (mut i, mut pos, mut wrong) = (first, 0, 0u64);
    while pos < got.len() {
        let phase = i % PERIOD;
        let n = (PERIOD - phase).min((got.len() - pos) / es);
        let (a, b) = (&got[pos..pos + n * es], &table[phase * es..(phase + n) * es]);
        if a != b {
            wrong += a.chunks_exact(es).zip(b.chunks_exact(es)).filter(|(x, y)| x != y).count() as u64;
        }
        pos += n * es;
        i += n;
    }
    wrong
}

/// One size's shape: `count` elements per block, `blocks` blocks.
pub struct Shape {
    pub count: usize,
    pub es: usize,
    pub blocks: usize,
}

impl Shape {
    pub fn of(op: Op, dtype: DType, nranks: usize, size: u64) -> Shape {
        let (es, blocks) = (dtype.size(), op.blocks(nranks));
        let count = usize::try_from(size).unwrap_or(usize::MAX) / (es * blocks);
        Shape { count: count.max(1), es, blocks }
    }

    pub fn bytes(&self) -> usize {
        self.count * self.es * self.blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::MAX_RANKS;

    #[test]
    fn fill_and_count_wrong_follow_the_period_from_any_phase() {
        for d in DType::ALL {
            let es = d.size();
            let t = table(d, |j| value(d, 4, 1, j));
            for first in [0, 5, PERIOD - 1, PERIOD, 3 * PERIOD + 7] {
                let mut buf = vec![0u8; (2 * PERIOD + 13) * es];
                fill(&mut buf, first, &t, es);
                assert_eq!(count_wrong(&buf, first, &t, es), 0, "{d:?} from {first}");
                let mut expect = vec![];
                for i in first..first + 2 * PERIOD + 13 {
                    encode(d, value(d, 4, 1, i % PERIOD), &mut expect);
                }
                assert_eq!(buf, expect, "{d:?} from {first}");
                // Corrupt two elements; shift by one element: both are seen.
                buf[0] ^= 1;
                buf[(PERIOD + 2) * es + es - 1] ^= 0x40;
                assert_eq!(count_wrong(&buf, first, &t, es), 2, "{d:?}");
                assert!(count_wrong(&buf[es..], first, &t, es) > 0);
            }
        }
    }

    #[test]
    fn check_data_is_exact_and_differs_between_ranks() {
        for n in 1..=MAX_RANKS {
            for j in 0..PERIOD {
                let sum: i64 = (0..n).map(|r| value(DType::I32, n, r, j).abs()).sum();
                assert!(sum <= 256, "{n}-rank sums stay exact in bf16");
                for r in 1..n.min(2 * amplitude(n) as usize + 1) {
                    assert_ne!(value(DType::F32, n, 0, j), value(DType::F32, n, r, j), "{n} ranks, rank {r}");
                }
            }
        }
    }

    #[test]
    fn sizes_follow_nccl_tests() {
        let s = Shape::of(Op::AllGather, DType::F32, 4, 4096);
        assert_eq!((s.count, s.bytes()), (256, 4096));
        let s = Shape::of(Op::AllReduce, DType::BF16, 4, 4096);
        assert_eq!((s.count, s.bytes()), (2048, 4096));
        let s = Shape::of(Op::ReduceScatter, DType::F64, 8, 8);
        assert_eq!((s.count, s.bytes()), (1, 64));
        assert_eq!(Op::AllReduce.bus_factor(4), 1.5);
        assert_eq!(Op::AllGather.bus_factor(4), 0.75);
        assert_eq!(Op::Broadcast.bus_factor(4), 1.0);
    }
}
