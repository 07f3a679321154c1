//! The AVX2+FMA form of [`super::half_rows`]: 16-bit GEMMs of at most
//! [`HALF_ROWS_MAX`](super::half_rows::HALF_ROWS_MAX) rows of A (decode's scores and `P · V`)
//! with B read once in storage order and widened to f32 in registers, 8 lanes at a time, so a
//! product with few rows of A pays no packing pass over B. bf16 widens by a shift; f16 needs
//! F16C (`vcvtph2ps`).

use std::arch::x86_64::*;

use super::half_rows::{HALF_ROWS_MAX, RowsA};
use super::widen8;
use crate::GemmShape;

/// k values of A widened per slab (into an `8 x 512` f32 buffer on the stack, 16 KiB).
const KC: usize = 512;

/// `C (+)= A · B` (or `A · B^T` with `s.b_trans`) for `s.m <= HALF_ROWS_MAX` rows, A not
/// transposed; 16-bit B (f16 when `F16`, else bf16 bits), A 16-bit alike or f32, f32 C.
///
/// # Safety
///
/// AVX2 and FMA are available, and F16C when `F16`; `1 <= s.m <= HALF_ROWS_MAX`,
/// `!s.a_trans`, `s.n > 0`, `s.k > 0`; the pointers satisfy the contract of
/// the crate's `gemm_bf16_unchecked` for `s` (A's extent counted in its own elements).
#[target_feature(enable = "avx2,fma,f16c")]
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

/// [`gemm`] for `M == s.m` rows: per slab of [`KC`] k values, A's slab widened into a local
/// buffer (rows `KC` floats apart, zero past the slab's end to a multiple of 8), then the
/// slab's product added into C (stored into it by the first slab unless accumulating).
///
/// # Safety
///
/// As [`gemm`], with `M == s.m`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn slabs<const M: usize, const F16: bool>(s: &GemmShape, a: RowsA, b: *const u16, c: *mut f32) {
    if let (true, RowsA::Single(a)) = (s.b_trans, a) {
        // An f32 A is read where it lies, all of k in one pass: each key's row of B is then
        // read once, front to back, where slabs would read it in pieces, pass after pass.
        // SAFETY: forwarded; A's rows `< m` hold `k` values `lda` apart.
        unsafe { slab_bt::<M, F16>(s, a, s.lda, 0, s.k, b, c, s.accumulate) };
        return;
    }
    // Left uninitialized: the slab kernels read only rows `< M`, columns `< kc` rounded up to
    // 8, written below.
    let mut buf = std::mem::MaybeUninit::<[f32; HALF_ROWS_MAX * KC]>::uninit();
    let wa = buf.as_mut_ptr().cast::<f32>();
    for p0 in (0..s.k).step_by(KC) {
        let kc = KC.min(s.k - p0);
        for i in 0..M {
            for p in (0..kc).step_by(8) {
                // SAFETY: row `i < m`, columns `p0 + p .. p0 + min(p + 8, kc)` of A lie in its
                // extent; `wa` holds `HALF_ROWS_MAX` rows of `KC >= kc` rounded up to 8. Past
                // `kc` the lanes are zeros, so the dot products read whole vectors.
                unsafe {
                    let at = i * s.lda + p0 + p;
                    let x = match a {
                        RowsA::Half(a) => widen8::<F16>(a.add(at), kc - p),
                        RowsA::Single(a) => _mm256_maskload_ps(a.add(at), super::avx2::lanes(kc - p)),
                    };
                    _mm256_storeu_ps(wa.add(i * KC + p), x);
                }
            }
        }
        let load_c = s.accumulate || p0 > 0;
        // SAFETY: forwarded; `wa` holds the slab's rows as documented, written above.
        unsafe {
            if s.b_trans {
                slab_bt::<M, F16>(s, wa, KC, p0, kc, b, c, load_c);
            } else {
                slab_b::<M, F16>(s, wa, p0, kc, b, c, load_c);
            }
        }
    }
}

/// One slab of `C (+)= A · B^T`, key by key: each key's row of B (its `kc` values from `p0`)
/// is read once, front to back 8 values at a time, and multiplied into all `M` rows of A.
///
/// # Safety
///
/// As [`slabs`], with `s.b_trans`, `p0 + kc <= k` and `a` holding the slab's `kc` values of
/// each row `< M`, rows `lda` floats apart.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)] // the slab's operands and extent, as its siblings take them
unsafe fn slab_bt<const M: usize, const F16: bool>(
    s: &GemmShape,
    a: *const f32,
    lda: usize,
    p0: usize,
    kc: usize,
    b: *const u16,
    c: *mut f32,
    load_c: bool,
) {
    // SAFETY: forwarded, with enough independent sums per key that the FMAs' latency does not
    // set the pace: four for one row of A, two for two, one per row beyond.
    unsafe {
        match M {
            1 => slab_bt_sums::<M, 4, F16>(s, a, lda, p0, kc, b, c, load_c),
            2 => slab_bt_sums::<M, 2, F16>(s, a, lda, p0, kc, b, c, load_c),
            _ => slab_bt_sums::<M, 1, F16>(s, a, lda, p0, kc, b, c, load_c),
        }
    }
}

/// [`slab_bt`] with `U` partial sums per row and key ([`super::key_dots::key_sums`] at 8
/// lanes); the row `rows_ahead` on is requested as this one starts, so a B streamed from
/// memory keeps its reads in flight.
///
/// # Safety
///
/// As [`slab_bt`].
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)] // as `slab_bt`
unsafe fn slab_bt_sums<const M: usize, const U: usize, const F16: bool>(
    s: &GemmShape,
    a: *const f32,
    lda: usize,
    p0: usize,
    kc: usize,
    b: *const u16,
    c: *mut f32,
    load_c: bool,
) {
    use super::key_dots::key_sums;
    use super::row_sweep::{Bf16, F16 as F16Bits};
    let ahead = super::rows_ahead(2 * kc);
    for j in 0..s.n {
        super::stream_row(b.wrapping_add((j + ahead) * s.ldb + p0).cast(), kc.div_ceil(2));
        let row = b.wrapping_add(j * s.ldb + p0).cast();
        // SAFETY: row `j < n` of B holds the slab's `kc` values from `p0`, and A's rows `kc`.
        let sums = unsafe {
            if F16 {
                key_sums::<__m256, M, U, F16Bits>(a, lda, row, kc)
            } else {
                key_sums::<__m256, M, U, Bf16>(a, lda, row, kc)
            }
        };
        for (i, &total) in sums.iter().enumerate() {
            let sum = super::avx2::hsum(total);
            // SAFETY: C[i, j] with `i < m`, `j < n` lies in C's extent.
            unsafe {
                let at = c.add(i * s.ldc + j);
                *at = if load_c { *at + sum } else { sum };
            }
        }
    }
}

/// One slab of `C (+)= A · B`: for a few rows of A against a wide B, a sweep over B's rows (see
/// [`super::row_sweep`]); otherwise C in strips of `8 V` columns held in `M V` accumulators,
/// each row of B's slab read once per strip and multiplied into all `M` rows.
///
/// # Safety
///
/// As [`slabs`], with `!s.b_trans`, `p0 + kc <= k` and `wa` holding the slab (rows `KC`
/// floats apart, `kc` written).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn slab_b<const M: usize, const F16: bool>(
    s: &GemmShape,
    wa: *const f32,
    p0: usize,
    kc: usize,
    b: *const u16,
    c: *mut f32,
    load_c: bool,
) {
    use super::row_sweep::{Bf16, F16 as F16Bits, Sweep, rows_swept_avx2_half, sweeps};
    if sweeps(M, s.n, 2) {
        let sweep = Sweep::slab(s, M, wa, KC, b, p0, kc, c, load_c);
        // SAFETY: forwarded; a sweep reads the slab's rows `p0 .. p0 + kc` of B and its `kc`
        // values of A's rows, as the strips would.
        unsafe {
            if F16 { rows_swept_avx2_half::<F16Bits>(&sweep) } else { rows_swept_avx2_half::<Bf16>(&sweep) }
        }
        return;
    }
    // SAFETY: forwarded, with a strip width that keeps `M V` accumulators within 8 registers.
    unsafe {
        match M {
            1 | 2 => strips::<M, 4, F16>(s, wa, p0, kc, b, c, load_c),
            3 | 4 => strips::<M, 2, F16>(s, wa, p0, kc, b, c, load_c),
            _ => strips::<M, 1, F16>(s, wa, p0, kc, b, c, load_c),
        }
    }
}

/// [`slab_b`] with strips of `V` vectors ([`super::value_strips::strips`] at 8 lanes).
///
/// # Safety
///
/// As [`slab_b`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn strips<const M: usize, const V: usize, const F16: bool>(
    s: &GemmShape,
    wa: *const f32,
    p0: usize,
    kc: usize,
    b: *const u16,
    c: *mut f32,
    load_c: bool,
) {
    use super::row_sweep::{Bf16, F16 as F16Bits};
    let a = (wa, KC);
    // SAFETY: forwarded; this function enables the ISA the strips need.
    unsafe {
        if F16 {
            super::value_strips::strips::<__m256, F16Bits, M, V>(s, a, p0, kc, b, c, load_c);
        } else {
            super::value_strips::strips::<__m256, Bf16, M, V>(s, a, p0, kc, b, c, load_c);
        }
    }
}
