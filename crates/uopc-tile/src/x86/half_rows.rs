//! 16-bit GEMMs of at most [`HALF_ROWS_MAX`] rows of A (decode's scores and `P · V`): B is
//! read once in storage order and widened to f32 in registers, with no packing.
//!
//! The blocked bf16 driver packs B into VNNI panels and the f16 one widens B into a buffer,
//! each a pass over B that a product with few rows of A cannot amortize: with one to eight
//! rows every element of B takes part in at most eight FMAs, so the pass costs about as much
//! as the product. Widening in registers is exact (a bf16 is the top half of an f32; f16
//! converts with `vcvtph2ps`) and the products are f32 FMAs of exact values, so the result is
//! the f32 GEMM of the widened inputs; subnormal inputs count as they are (unlike AMX and
//! `vdpbf16ps`, which flush them).

use std::arch::x86_64::*;

use super::{rows_ahead, stream_row, widen16};
use crate::GemmShape;

/// Rows of A up to which a 16-bit GEMM takes this path.
pub(crate) const HALF_ROWS_MAX: usize = 8;

/// Whether a 16-bit GEMM of shape `s` streams B past A in storage order, widened in registers
/// (this path), rather than packing it: a few rows of an untransposed A cannot amortize
/// packing B.
pub(crate) fn streams_b(s: &GemmShape) -> bool {
    s.m <= HALF_ROWS_MAX && !s.a_trans
}

/// k values of A widened per slab (into an `8 x 512` f32 buffer on the stack, 16 KiB).
const KC: usize = 512;

/// The rows of A a [`gemm`] reads: 16-bit like B, or f32 (an f16 GEMM's A that its caller
/// already holds widened, such as attention's query tile).
#[derive(Clone, Copy)]
pub(crate) enum RowsA {
    /// bf16 or f16 bits, the same type as B.
    Half(*const u16),
    /// f32 values, read as they are.
    Single(*const f32),
}

/// `C (+)= A · B` (or `A · B^T` with `s.b_trans`) for `s.m <= HALF_ROWS_MAX` rows, A not
/// transposed; 16-bit B (f16 when `F16`, else bf16 bits), A 16-bit alike or f32, f32 C.
///
/// # Safety
///
/// AVX-512F and AVX-512DQ are available; `1 <= s.m <= HALF_ROWS_MAX`, `!s.a_trans`,
/// `s.n > 0`, `s.k > 0`; the pointers satisfy the contract of the crate's
/// `gemm_bf16_unchecked` for `s` (A's extent counted in its own elements).
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
pub(crate) unsafe fn gemm<const F16: bool>(s: &GemmShape, a: RowsA, b: *const u16, c: *mut f32) {
    // SAFETY: forwarded, each instance with its own row count.
    unsafe {
        match s.m {
            1 => slabs::<1, F16>(s, a, b, c),
            2 => slabs::<2, F16>(s, a, b, c),
            3 => slabs::<3, F16>(s, a, b, c),
            4 => slabs::<4, F16>(s, a, b, c),
            5 => slabs::<5, F16>(s, a, b, c),
            6 => slabs::<6, F16>(s, a, b, c),
            7 => slabs::<7, F16>(s, a, b, c),
            8 => slabs::<8, F16>(s, a, b, c),
            _ => {}
        }
    }
}

/// [`gemm`] for `M == s.m` rows. An f32 A is read where it lies, in one pass over B. A 16-bit
/// A is widened per slab of [`KC`] k values into a local buffer (rows `KC` floats apart, zero
/// past the slab's end to a multiple of 16), then the slab's product added into C (stored into
/// it by the first slab unless accumulating).
///
/// # Safety
///
/// As [`gemm`], with `M == s.m`.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
unsafe fn slabs<const M: usize, const F16: bool>(s: &GemmShape, a: RowsA, b: *const u16, c: *mut f32) {
    let a = match a {
        RowsA::Single(a) => {
            let rows = RowsF32 { at: a, stride: s.lda };
            // SAFETY: forwarded; A's rows `< m` hold `k` floats each, `lda` apart.
            unsafe { slab::<M, F16>(s, rows, 0, s.k, b, c, s.accumulate) };
            return;
        }
        RowsA::Half(a) => a,
    };
    // Left uninitialized (zeroing all of it would cost more than a one-row product): the
    // slab kernels read only rows `< M`, columns `< kc` rounded up to 16, written below.
    let mut buf = std::mem::MaybeUninit::<[f32; HALF_ROWS_MAX * KC]>::uninit();
    let wa = buf.as_mut_ptr().cast::<f32>();
    for p0 in (0..s.k).step_by(KC) {
        let kc = KC.min(s.k - p0);
        for i in 0..M {
            for p in (0..kc).step_by(16) {
                // SAFETY: row `i < m`, columns `p0 + p .. p0 + min(p + 16, kc)` of A lie in its
                // extent; `wa` holds `HALF_ROWS_MAX` rows of `KC >= kc` rounded up to 16 (KC is
                // a multiple of 16). Past `kc` the lanes are zeros.
                unsafe {
                    let x = widen16::<F16>(a.add(i * s.lda + p0 + p), kc - p);
                    _mm512_storeu_ps(wa.add(i * KC + p), x);
                }
            }
        }
        let load_c = s.accumulate || p0 > 0;
        // SAFETY: forwarded; `wa` holds the slab's rows as documented, written above.
        unsafe { slab::<M, F16>(s, RowsF32 { at: wa, stride: KC }, p0, kc, b, c, load_c) };
    }
}

/// f32 rows of A as a slab kernel reads them: row `i`'s value `t` of the slab at
/// `at + i * stride + t`.
#[derive(Clone, Copy)]
struct RowsF32 {
    at: *const f32,
    stride: usize,
}

/// One slab's product, by the layout of B: dot products against B's rows when it is
/// transposed; otherwise a sweep over B's rows for a few rows of A against a wide B (see
/// [`super::row_sweep`]), register strips for the rest.
///
/// # Safety
///
/// As [`slab_bt`] or [`slab_b`], whichever `s.b_trans` picks.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
unsafe fn slab<const M: usize, const F16: bool>(
    s: &GemmShape,
    a: RowsF32,
    p0: usize,
    kc: usize,
    b: *const u16,
    c: *mut f32,
    load_c: bool,
) {
    use super::row_sweep::{Bf16, F16 as F16Bits, Sweep, rows_swept_avx512, sweeps};
    // SAFETY: forwarded; a sweep reads the slab's rows `p0 .. p0 + kc` of B and its `kc`
    // values of A's rows, as the strips would.
    unsafe {
        if s.b_trans {
            slab_bt::<M, F16>(s, a, p0, kc, b, c, load_c);
        } else if sweeps(M, s.n, 2) {
            let sweep = Sweep::slab(s, M, a.at, a.stride, b, p0, kc, c, load_c);
            if F16 { rows_swept_avx512::<F16Bits>(&sweep) } else { rows_swept_avx512::<Bf16>(&sweep) }
        } else {
            slab_b::<M, F16>(s, a, p0, kc, b, c, load_c);
        }
    }
}

/// One slab of `C (+)= A · B^T`: keys (columns of C) in groups of `16 / M`, whose `M x (16 /
/// M)` dot products one shuffle tree sums; each key's row of B (its `kc` values from `p0`) is
/// read once, front to back 16 values at a time, and multiplied into all `M` rows of A.
///
/// # Safety
///
/// As [`slabs`], with `s.b_trans`, `p0 + kc <= k` and `a` holding the slab's `kc` values of
/// rows `< M`.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
unsafe fn slab_bt<const M: usize, const F16: bool>(
    s: &GemmShape,
    a: RowsF32,
    p0: usize,
    kc: usize,
    b: *const u16,
    c: *mut f32,
    load_c: bool,
) {
    let group = 16 / M;
    let ahead = rows_ahead(2 * kc);
    for j0 in (0..s.n).step_by(group) {
        let live = group.min(s.n - j0);
        // Accumulator `i * group + g` is row `i`, key `j0 + g`; the unused ones stay 0.
        let mut acc = [_mm512_setzero_ps(); 16];
        // Key by key, each key's row front to back: B is read as one sequential stream, the
        // order the hardware prefetcher follows (the group's rows side by side stalled on
        // their loads).
        for g in 0..group {
            // Past the last live key the last live key's row is read again (its sums are
            // dropped below), so the trip count stays constant.
            let j = j0 + g.min(live - 1);
            // A row a few KiB on, requested now (a prefetch never faults).
            stream_row(b.wrapping_add((j + ahead) * s.ldb + p0).cast(), kc.div_ceil(2));
            // SAFETY: forwarded, for key `j < n`.
            let sums = unsafe { key_sums::<M, F16>(a, b.add(j * s.ldb + p0), kc) };
            for (i, sum) in sums.into_iter().enumerate() {
                acc[i * group + g] = sum;
            }
        }
        let mut sums = [0.0f32; 16];
        // SAFETY: `sums` holds 16 floats.
        unsafe { _mm512_storeu_ps(sums.as_mut_ptr(), crate::x86::avx512_few_rows::sum_lanes_16(&acc)) };
        for i in 0..M {
            for g in 0..live {
                // SAFETY: C[i, j0 + g] with `i < m`, `j0 + g < n` lies in C's extent.
                unsafe {
                    let at = c.add(i * s.ldc + j0 + g);
                    let sum = sums[i * group + g];
                    *at = if load_c { *at + sum } else { sum };
                }
            }
        }
    }
}

/// The lane-wise partial dot products of the slab's rows `< M` of A with one key's `kc` values
/// of B at `row` ([`super::key_dots::key_sums`] at 16 lanes): two partial sums per row for one
/// or two rows of A, whose chains are otherwise few; more rows are independent chains already.
///
/// # Safety
///
/// AVX-512F and AVX-512DQ are available; `row` holds `kc` 16-bit values and `a` the slab's `kc`
/// values of each row `< M`.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
#[inline]
unsafe fn key_sums<const M: usize, const F16: bool>(a: RowsF32, row: *const u16, kc: usize) -> [__m512; M] {
    use super::key_dots::key_sums as sums;
    use super::row_sweep::{Bf16, F16 as F16Bits};
    let (at, lda, row) = (a.at, a.stride, row.cast());
    // SAFETY: forwarded; this function enables the ISA the lanes need.
    unsafe {
        match (M <= 2, F16) {
            (true, true) => sums::<__m512, M, 2, F16Bits>(at, lda, row, kc),
            (true, false) => sums::<__m512, M, 2, Bf16>(at, lda, row, kc),
            (false, true) => sums::<__m512, M, 1, F16Bits>(at, lda, row, kc),
            (false, false) => sums::<__m512, M, 1, Bf16>(at, lda, row, kc),
        }
    }
}

/// One slab of `C (+)= A · B`: C in strips of `16 V` columns held in `M V` accumulators
/// (`V = 8, 8, 4, 4, 2, 2, 2, 2` vectors for 1 to 8 rows, within 16 registers up to four
/// rows), each row of B's slab read once per strip and multiplied into all `M` rows. Wide
/// strips read B's rows in long runs (at `P · V`'s widths, D <= 128, whole rows for up to two
/// rows of A), which the hardware prefetcher follows better than one 64-byte piece per row.
///
/// # Safety
///
/// As [`slabs`], with `!s.b_trans`, `p0 + kc <= k` and `a` holding the slab's `kc` values of
/// rows `< M`.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
unsafe fn slab_b<const M: usize, const F16: bool>(
    s: &GemmShape,
    a: RowsF32,
    p0: usize,
    kc: usize,
    b: *const u16,
    c: *mut f32,
    load_c: bool,
) {
    // SAFETY: forwarded, with the strip width for M rows.
    unsafe {
        match M {
            1 | 2 => strips::<M, 8, F16>(s, a, p0, kc, b, c, load_c),
            3 | 4 => strips::<M, 4, F16>(s, a, p0, kc, b, c, load_c),
            _ => strips::<M, 2, F16>(s, a, p0, kc, b, c, load_c),
        }
    }
}

/// [`slab_b`] with strips of `V` vectors ([`super::value_strips::strips`] at 16 lanes).
///
/// # Safety
///
/// As [`slab_b`].
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
unsafe fn strips<const M: usize, const V: usize, const F16: bool>(
    s: &GemmShape,
    a: RowsF32,
    p0: usize,
    kc: usize,
    b: *const u16,
    c: *mut f32,
    load_c: bool,
) {
    use super::row_sweep::{Bf16, F16 as F16Bits};
    let a = (a.at, a.stride);
    // SAFETY: forwarded; this function enables the ISA the strips need.
    unsafe {
        if F16 {
            super::value_strips::strips::<__m512, F16Bits, M, V>(s, a, p0, kc, b, c, load_c);
        } else {
            super::value_strips::strips::<__m512, Bf16, M, V>(s, a, p0, kc, b, c, load_c);
        }
    }
}
