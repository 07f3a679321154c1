//! The strips of a few-row 16-bit `C (+)= A · B` with B untransposed (decode's `P · V`),
//! written once over the vector width: the AVX-512 and AVX2 few-row kernels take them at 16
//! and 8 lanes, each inside a function that enables its ISA.

use super::register_tile::F32Lanes;
use super::row_sweep::BElement;
use crate::GemmShape;

/// `C (+)= A · B` over all `s.n` columns in strips of `LANES V`: the whole strips through the
/// instance of [`strip`] whose width is a constant, the last, narrower strip through the
/// other.
///
/// # Safety
///
/// As [`strip`], for all `s.n` columns of B and C from `b` and `c`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn strips<W: F32Lanes, E: BElement<W>, const M: usize, const V: usize>(
    s: &GemmShape,
    a: (*const f32, usize),
    p0: usize,
    kc: usize,
    b: *const u16,
    c: *mut f32,
    load_c: bool,
) {
    let width = W::LANES * V;
    let whole = s.n - s.n % width;
    for j0 in (0..whole).step_by(width) {
        // SAFETY: forwarded, for the strip's columns from `j0 < whole <= n`.
        unsafe {
            strip::<W, E, M, V, true>(s, a, p0, kc, b.wrapping_add(j0), c.wrapping_add(j0), width, load_c)
        };
    }
    if whole < s.n {
        let (b, c) = (b.wrapping_add(whole), c.wrapping_add(whole));
        // SAFETY: as above, for the `n - whole` columns left.
        unsafe { strip::<W, E, M, V, false>(s, a, p0, kc, b, c, s.n - whole, load_c) };
    }
}

/// `width <= LANES V` columns of `C (+)= A · B` from `c` (and of B from `b`), exactly `LANES
/// V` when `WHOLE`, for `M` rows of f32 A (`lda` apart from `a`) over the slab's `kc` rows of B
/// from row `p0`: the strip held in `M V` accumulators, each row of B read once and multiplied
/// into all `M` rows. With `WHOLE` the width is a constant, so the accumulators stay in
/// registers (a width known only at run time kept them on the stack); C is read first when
/// `load_c`.
///
/// # Safety
///
/// `W`'s ISA is available (and what `E`'s loads need), enabled by the caller so that these
/// operations inline into it; rows `< M` of A hold `kc` floats; rows `p0 .. p0 + kc` of B
/// (`s.ldb` elements of `E` apart) hold the strip's `width` columns from `b`; rows `< M` of C
/// (`s.ldc` apart) the same from `c`; `width == LANES V` when `WHOLE`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn strip<W: F32Lanes, E: BElement<W>, const M: usize, const V: usize, const WHOLE: bool>(
    s: &GemmShape,
    (a, lda): (*const f32, usize),
    p0: usize,
    kc: usize,
    b: *const u16,
    c: *mut f32,
    width: usize,
    load_c: bool,
) {
    let width = if WHOLE { W::LANES * V } else { width };
    // Vectors of this strip that hold columns, and the lanes of each.
    let live = width.div_ceil(W::LANES);
    let cols = |v: usize| width.saturating_sub(W::LANES * v).min(W::LANES);
    // SAFETY: the ISA is available (this function's contract), as for every operation below.
    let zero = unsafe { W::zero() };
    let mut acc = [[zero; V]; M];
    if load_c {
        for (i, acc) in acc.iter_mut().enumerate() {
            for (v, acc) in acc.iter_mut().enumerate().take(live) {
                // SAFETY: columns `LANES v ..` of row `i < M` of C, masked to the strip.
                *acc = unsafe { W::load_lanes(c.add(i * s.ldc + W::LANES * v), W::first_lanes(cols(v))) };
            }
        }
    }
    for p in 0..kc {
        let mut bv = [zero; V];
        let row = b.wrapping_add((p0 + p) * s.ldb).cast::<u8>();
        for (v, bv) in bv.iter_mut().enumerate().take(live) {
            // SAFETY: row `p0 + p` of B holds the strip's `width` columns.
            *bv = unsafe { E::load(row.add(W::LANES * v * E::BYTES), cols(v)) };
        }
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: row `i < M` of A holds `kc > p` floats.
            let av = unsafe { W::splat(*a.add(i * lda + p)) };
            for (acc, bv) in acc.iter_mut().zip(&bv).take(live) {
                // SAFETY: the ISA is available.
                *acc = unsafe { W::mul_add(av, *bv, *acc) };
            }
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        for (v, acc) in acc.iter().enumerate().take(live) {
            // SAFETY: as for the loads of C above.
            unsafe { W::store_lanes(c.add(i * s.ldc + W::LANES * v), W::first_lanes(cols(v)), *acc) };
        }
    }
}
