//! Element helpers of the simulator's collectives: `fminf`/`fmaxf` semantics, a rank's slice of
//! a range, and unaligned loads, stores and copies of simulated device memory (host memory).

/// `fminf`/`fmaxf` semantics for floats (a NaN operand yields the other), plain order otherwise.
pub(super) fn min<T: PartialOrd>(a: T, b: T) -> T {
    if b < a || a.partial_cmp(&a).is_none() {
        b
    } else {
        a
    }
}

pub(super) fn max<T: PartialOrd>(a: T, b: T) -> T {
    if b > a || a.partial_cmp(&a).is_none() {
        b
    } else {
        a
    }
}

/// Rank `r`'s slice `[lo, hi)` of `count` elements split over `n` ranks.
pub(super) fn slice(count: usize, n: usize, r: usize) -> (usize, usize) {
    let per = count.div_ceil(n);
    ((r * per).min(count), ((r + 1) * per).min(count))
}

pub(super) fn load<T: Copy>(base: *mut u8, offset: usize) -> T {
    // SAFETY: `base + offset` lies in the collective's range of mapped simulated memory.
    unsafe { std::ptr::read_unaligned(base.wrapping_add(offset) as *const T) }
}

pub(super) fn to_bytes<T: Copy>(v: T) -> Vec<u8> {
    let mut b = vec![0u8; std::mem::size_of::<T>()];
    // SAFETY: `b` holds exactly `size_of::<T>()` bytes.
    unsafe { std::ptr::write_unaligned(b.as_mut_ptr() as *mut T, v) };
    b
}

pub(super) fn write(base: *mut u8, offset: usize, bytes: &[u8]) {
    // SAFETY: the destination range lies in the collective's range of mapped memory; no other
    // rank touches it between the surrounding barriers.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.wrapping_add(offset), bytes.len()) };
}

/// Copies `[offset, offset + len)` from `src` to `dst` (bases in the same layout; a base may
/// lie before its memory when the kernel adds a block offset, hence the wrapping arithmetic).
pub(super) fn copy(src: *mut u8, dst: *mut u8, offset: usize, len: usize) {
    copy_at(src, offset, dst, offset, len);
}

/// Copies `len` bytes from `src + from` to `dst + to` (as [`copy`], the offsets apart: an
/// all-gather's out with its own block stride).
pub(super) fn copy_at(src: *mut u8, from: usize, dst: *mut u8, to: usize, len: usize) {
    let (s, d) = (src.wrapping_add(from), dst.wrapping_add(to));
    if s != d {
        // SAFETY: both ranges lie in mapped memory of the collective; distinct copies that do
        // not overlap (out-of-place ranges are checked disjoint by the runtime).
        unsafe { std::ptr::copy_nonoverlapping(s, d, len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_the_range_once() {
        for count in [0usize, 1, 5, 7, 64, 1001] {
            for n in 1..=8 {
                let mut next = 0;
                for r in 0..n {
                    let (lo, hi) = slice(count, n, r);
                    assert_eq!(lo, next.min(count));
                    assert!(hi >= lo);
                    next = hi;
                }
                assert_eq!(next, count);
            }
        }
    }

    #[test]
    fn min_max_follow_fminf() {
        assert_eq!(min(1.0f32, f32::NAN), 1.0);
        assert_eq!(min(f32::NAN, 2.0f32), 2.0);
        assert_eq!(max(-3i64, 4), 4);
        assert_eq!(min(3u32, 2), 2);
    }
}
