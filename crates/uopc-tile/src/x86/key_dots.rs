//! The dot products of one key's row of B (a 16-bit `B^T`, as decode's weights and attention's
//! keys are stored) with a few rows of f32 A, written once over the vector width: the AVX-512
//! and AVX2 few-rows kernels take them at 16 and 8 lanes, each inside a function that enables
//! its ISA, and reduce the lanes their own way.

use super::register_tile::F32Lanes;
use super::row_sweep::{BElement, load};

/// The lane-wise partial dot products of rows `< M` of A (`lda` floats apart from `a`) with the
/// `kc` elements of B at `row`: `U` partial sums per row over interleaved vectors of the key's
/// row, added together at its end, so that a chain a few dozen FMAs long is not paced by the
/// FMA's latency. The last, short vector is a masked load.
///
/// # Safety
///
/// `W`'s ISA is available (and what `E`'s loads need); `row` is readable for `kc` elements of
/// `E` and every row `i < M` of A for `kc` floats. The caller enables the ISA, so that these
/// operations inline into it.
#[inline(always)]
pub(crate) unsafe fn key_sums<W: F32Lanes, const M: usize, const U: usize, E: BElement<W>>(
    a: *const f32,
    lda: usize,
    row: *const u8,
    kc: usize,
) -> [W; M] {
    // SAFETY: the ISA is available (this function's contract), as for every operation below.
    let zero = unsafe { W::zero() };
    let mut acc = [[zero; U]; M];
    let step = W::LANES * U;
    let whole = kc - kc % step;
    for t in (0..whole).step_by(step) {
        for u in 0..U {
            let at = t + W::LANES * u;
            // SAFETY: the key's elements `at .. at + LANES <= kc`.
            let bv = unsafe { E::load(row.add(at * E::BYTES), W::LANES) };
            for (i, acc) in acc.iter_mut().enumerate() {
                // SAFETY: row `i < M` of A holds `at + LANES <= kc` floats.
                acc[u] = unsafe { W::mul_add(W::load(a.add(i * lda + at)), bv, acc[u]) };
            }
        }
    }
    for t in (whole..kc).step_by(W::LANES) {
        // SAFETY: the key's elements `t .. t + min(LANES, kc - t)`; the loads are limited to
        // the `kc - t` left.
        let bv = unsafe { E::load(row.add(t * E::BYTES), kc - t) };
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: as above, for row `i < M` of A.
            acc[0] = unsafe { W::mul_add(load::<W>(a.add(i * lda + t), kc - t), bv, acc[0]) };
        }
    }
    // SAFETY: the ISA is available.
    std::array::from_fn(|i| acc[i][1..].iter().fold(acc[i][0], |x, &y| unsafe { W::add(x, y) }))
}
