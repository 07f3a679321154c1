//! `C (+)= A · B` for a few rows of A and a wide row-major B (a linear layer's `(in, out)`
//! weight during decode): B is read in storage order, a few rows at a time, each row's stretch
//! of columns front to back, and the products are added into C where it lies.
//!
//! [`super::avx512_few_rows::gemm_rows_streamed`] keeps a strip of C in registers and walks B
//! down its columns, one short piece per row: fine for attention's narrow `V` (a row is the
//! whole strip), but a weight matrix thousands of columns wide is then read in pieces a page
//! apart, which the hardware prefetcher does not follow. Here every read of B is a long
//! contiguous run instead, and C (at most a few KiB per row of A) stays in L1 between the rows
//! of B that update it.

use std::arch::x86_64::*;

/// Rows of B added into C per sweep over a stretch of columns: four loads of B per load and
/// store of C.
const ROWS_PER_STEP: usize = 4;

/// Floats of C one sweep updates, over all rows of A: 16 KiB, half of L1, so that they stay
/// there while B's rows stream past (a whole row of a weight matrix up to 4096 wide for one
/// row of A).
const STRETCH_FLOATS: usize = 4096;

/// Rows of A up to which this kernel beats keeping C in registers: each row adds a load and a
/// store of C per four loads of B, and from about eight rows that traffic, not B's, sets the
/// pace (measured on Zen 4: the register strips win at 8 rows, this wins at 1, 2 and 4).
pub(crate) const SWEEP_MAX_ROWS: usize = 4;

/// Columns from which this kernel is taken: past one register strip (128 columns) the strips
/// read each row of B in several pieces a row apart.
pub(crate) const SWEEP_MIN_COLUMNS: usize = 129;

/// Lane mask of the first `n` (clamped to 16) lanes.
#[inline]
fn lanes(n: usize) -> __mmask16 {
    if n >= 16 { 0xFFFF } else { (1u16 << n) - 1 }
}

/// `C (+)= A · B`, B row-major and read in storage order (see the module docs).
///
/// # Safety
///
/// AVX-512F is available, `s.a_trans` and `s.b_trans` are false, `1 <= s.m <= 8`, and the
/// pointers satisfy the crate's `gemm_unchecked` for `s`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn gemm_rows_swept(s: &crate::GemmShape, a: *const f32, b: *const f32, c: *mut f32) {
    // SAFETY: forwarded, each instance for its own row count.
    unsafe {
        match s.m {
            1 => swept::<1>(s, a, b, c),
            2 => swept::<2>(s, a, b, c),
            3 => swept::<3>(s, a, b, c),
            4 => swept::<4>(s, a, b, c),
            5 => swept::<5>(s, a, b, c),
            6 => swept::<6>(s, a, b, c),
            7 => swept::<7>(s, a, b, c),
            8 => swept::<8>(s, a, b, c),
            _ => {}
        }
    }
}

/// [`gemm_rows_swept`] for `M == s.m` rows.
///
/// # Safety
///
/// As [`gemm_rows_swept`], with `M == s.m`.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn swept<const M: usize>(s: &crate::GemmShape, a: *const f32, b: *const f32, c: *mut f32) {
    let crate::GemmShape { n, k, lda, ldb, ldc, accumulate, .. } = *s;
    let stretch = STRETCH_FLOATS / M;
    for j0 in (0..n).step_by(stretch) {
        let cols = stretch.min(n - j0);
        if !accumulate {
            for i in 0..M {
                for v in (0..cols).step_by(16) {
                    // SAFETY: columns `j0 + v ..` of row `i < m` of C, masked to the stretch.
                    unsafe {
                        _mm512_mask_storeu_ps(c.add(i * ldc + j0 + v), lanes(cols - v), _mm512_setzero_ps())
                    };
                }
            }
        }
        let mut p = 0;
        while p < k {
            let rows = ROWS_PER_STEP.min(k - p);
            // SAFETY: rows `p .. p + rows <= k` of B and columns `p ..` of A's rows `< M`.
            unsafe { add_rows::<M>(a.add(p), lda, b.add(p * ldb + j0), ldb, c.add(j0), ldc, rows, cols) };
            p += rows;
        }
    }
}

/// `C[i, 0..cols] += sum_{r < rows} A[i, r] B[r, 0..cols]` for `i < M`, `rows <= 4`.
///
/// # Safety
///
/// AVX-512F is available; `a` is readable at `i * lda + r`, `b` at `r * ldb + j` and `c`
/// readable and writable at `i * ldc + j`, for `i < M`, `r < rows`, `j < cols`.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
#[allow(clippy::too_many_arguments)] // the three operands' pointers and strides, and the block
unsafe fn add_rows<const M: usize>(
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
) {
    // A's values for these rows of B, 0 past `rows` (their rows of B are not read).
    let mut av = [[_mm512_setzero_ps(); ROWS_PER_STEP]; M];
    for (i, av) in av.iter_mut().enumerate() {
        for (r, av) in av.iter_mut().enumerate().take(rows) {
            // SAFETY: `A[i, r]` with `i < M`, `r < rows`.
            *av = _mm512_set1_ps(unsafe { *a.add(i * lda + r) });
        }
    }
    for v in (0..cols).step_by(16) {
        let mask = lanes(cols - v);
        let mut bv = [_mm512_setzero_ps(); ROWS_PER_STEP];
        for (r, bv) in bv.iter_mut().enumerate().take(rows) {
            // SAFETY: row `r < rows` of B, columns `v ..` masked to `cols`.
            *bv = unsafe { _mm512_maskz_loadu_ps(mask, b.add(r * ldb + v)) };
        }
        for (i, av) in av.iter().enumerate() {
            // SAFETY: row `i < M` of C, columns `v ..` masked to `cols`.
            unsafe {
                let dst = c.add(i * ldc + v);
                let mut acc = _mm512_maskz_loadu_ps(mask, dst);
                for (av, bv) in av.iter().zip(&bv) {
                    acc = _mm512_fmadd_ps(*av, *bv, acc);
                }
                _mm512_mask_storeu_ps(dst, mask, acc);
            }
        }
    }
}
