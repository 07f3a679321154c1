//! AVX-512 GEMMs of few rows (at most [`DOT_MAX_ROWS`]), which read B where it lies instead of
//! packing it for the register tile: dot products against a transposed B, and B streamed
//! row by row past a few rows of A.

use std::arch::x86_64::*;

use super::avx512::lanes;
use super::{STREAM_AHEAD, rows_ahead, stream_row};

/// Rows of A up to which [`gemm_bt_dots`] beats packing `B^T` for the register tile: the
/// packed path copies and transposes every B panel however few rows then reuse it.
pub(crate) const DOT_MAX_ROWS: usize = 8;

/// `C (+)= A · B^T` with A row-major and B stored transposed (`n x k`, each row contiguous in
/// k), as dot products, for at most [`DOT_MAX_ROWS`] rows of A. No packing, so a GEMM of a
/// few query rows against a block of keys (decode) reads each key once, straight from its
/// storage.
///
/// From three rows of A on (one or two take [`dots_by_row`]), keys go in groups of `16 / m`
/// (rounded down), whose `m x (16 / m)` accumulators one shuffle tree reduces to their sums. Within a group each key's row of B is read front to back once,
/// every 16-float step of it multiplied into all `m` rows of A (read from L1): B is one
/// sequential stream, the order the hardware prefetcher follows (the group's rows read step by
/// step side by side, or a pass over the group per row of A, measured slower), and there are
/// `1 + 1 / m` loads per FMA rather than 2.
///
/// # Safety
///
/// AVX-512F and AVX-512DQ are available, `s.a_trans` is false, `s.b_trans` is true,
/// `1 <= s.m <= DOT_MAX_ROWS`, `s.k > 0`, and the pointers satisfy the crate's
/// `gemm_unchecked` for `s`.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
pub(crate) unsafe fn gemm_bt_dots(s: &crate::GemmShape, a: *const f32, b: *const f32, c: *mut f32) {
    // SAFETY: forwarded; each instance is given its own row count, with groups of 16 / m keys.
    unsafe {
        match s.m {
            1 | 2 => dots_by_row(s, a, b, c),
            3 => dots::<3, 5>(s, a, b, c),
            4 => dots::<4, 4>(s, a, b, c),
            5 => dots::<5, 3>(s, a, b, c),
            6 => dots::<6, 2>(s, a, b, c),
            7 => dots::<7, 2>(s, a, b, c),
            8 => dots::<8, 2>(s, a, b, c),
            _ => {}
        }
    }
}

/// [`gemm_bt_dots`] for `M >= 3` rows of A, `G` keys per group (`M G <= 16`).
///
/// # Safety
///
/// As [`gemm_bt_dots`], with `M == s.m`.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
unsafe fn dots<const M: usize, const G: usize>(
    s: &crate::GemmShape,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
) {
    let crate::GemmShape { n, ldc, accumulate, .. } = *s;
    let ahead = rows_ahead(4 * s.k);
    for j0 in (0..n).step_by(G) {
        let live = G.min(n - j0);
        // Accumulator `(i, g)` is lane `i G + g` of the sums.
        let mut flat = [_mm512_setzero_ps(); 16];
        for g in 0..G {
            // B's rows stream from memory once: a row a few KiB further on is requested now.
            stream_row(b.wrapping_add((j0 + g + ahead) * s.ldb), s.k);
            // SAFETY: forwarded, for key `j0 + g` of the group.
            let acc = unsafe { key_dots::<M>(s, a, b, j0 + g.min(live - 1)) };
            for (i, &acc) in acc.iter().enumerate() {
                flat[i * G + g] = acc;
            }
        }
        let sums = sum_lanes_16(&flat);
        let keep = lanes(live);
        for i in 0..M {
            // Row i's sums moved down to lanes 0..G.
            let row = _mm512_maskz_compress_ps((((1u32 << G) - 1) << (i * G)) as __mmask16, sums);
            // SAFETY: columns `j0 .. j0 + live` of row `i < M` of C, masked to `live` lanes.
            unsafe {
                let dst = c.add(i * ldc + j0);
                let r = if accumulate { _mm512_add_ps(row, _mm512_maskz_loadu_ps(keep, dst)) } else { row };
                _mm512_mask_storeu_ps(dst, keep, r);
            }
        }
    }
}

/// The lane-wise partial dot products of rows `0..M` of A with row `j` of B, whose row is read
/// front to back once. (Keys past a group's live ones read the last live key's row again and
/// their sums are dropped at the store, so every group has the same shape; two rows of B at
/// a time, sharing the loads of A, measured a third slower: two interleaved streams.)
///
/// # Safety
///
/// As [`gemm_bt_dots`], with `M == s.m` and `j < s.n`.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
#[inline]
unsafe fn key_dots<const M: usize>(
    s: &crate::GemmShape,
    a: *const f32,
    b: *const f32,
    j: usize,
) -> [__m512; M] {
    let crate::GemmShape { k, lda, ldb, .. } = *s;
    // SAFETY: `j < n`, a row of B.
    let row = unsafe { b.add(j * ldb) };
    let mut acc = [_mm512_setzero_ps(); M];
    let mut step = |p: usize, mask: __mmask16| {
        // SAFETY: columns `p ..` of this row of B and of rows `i < M` of A, masked to the
        // `k - p` floats those rows have left.
        unsafe {
            let bv = _mm512_maskz_loadu_ps(mask, row.add(p));
            for (i, acc) in acc.iter_mut().enumerate() {
                *acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, a.add(i * lda + p)), bv, *acc);
            }
        }
    };
    let kfull = k - k % 16;
    for p in (0..kfull).step_by(16) {
        step(p, 0xFFFF);
    }
    if k % 16 != 0 {
        step(kfull, lanes(k % 16));
    }
    acc
}

/// [`gemm_bt_dots`] for one or two rows of A: each row against 16 rows of B at a time, key
/// by key, in 16 accumulators (the group's rows come from L1 for the second row of A). With
/// so few rows this measured a fifth faster than [`dots`].
///
/// # Safety
///
/// As [`gemm_bt_dots`].
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
unsafe fn dots_by_row(s: &crate::GemmShape, a: *const f32, b: *const f32, c: *mut f32) {
    let crate::GemmShape { m, n, k, lda, ldb, ldc, accumulate, .. } = *s;
    let ahead = rows_ahead(4 * k);
    for j0 in (0..n).step_by(16) {
        let live = 16.min(n - j0);
        for i in 0..m {
            let mut acc = [_mm512_setzero_ps(); 16];
            for (jj, acc) in acc.iter_mut().enumerate() {
                // Past the last live key the row of the last live key is read again (its sums
                // are dropped at the store), so the loop keeps a constant trip count and the
                // accumulators stay in registers.
                let row = j0 + jj.min(live - 1);
                if i == 0 {
                    // A row a few KiB on (past the block, what follows it: the next block's
                    // keys), requested while this one is multiplied.
                    stream_row(b.wrapping_add((row + ahead) * ldb), k);
                }
                for p in (0..k).step_by(16) {
                    let mask = lanes(k - p);
                    // SAFETY: row `i < m` of A spans `k` floats from `a + i * lda`, and row
                    // `row < n` of B `k` floats from `b + row * ldb`; the loads are masked to
                    // the `k - p` of them left.
                    let (av, bv) = unsafe {
                        (
                            _mm512_maskz_loadu_ps(mask, a.add(i * lda + p)),
                            _mm512_maskz_loadu_ps(mask, b.add(row * ldb + p)),
                        )
                    };
                    *acc = _mm512_fmadd_ps(av, bv, *acc);
                }
            }
            let sums = sum_lanes_16(&acc);
            let keep = lanes(live);
            // SAFETY: columns `j0 .. j0 + live` of row `i` of C, masked to `live` lanes.
            unsafe {
                let dst = c.add(i * ldc + j0);
                let r = if accumulate { _mm512_add_ps(sums, _mm512_maskz_loadu_ps(keep, dst)) } else { sums };
                _mm512_mask_storeu_ps(dst, keep, r);
            }
        }
    }
}

/// Lane `j` of the result is the sum of the 16 lanes of `v[j]`: four levels of pairwise
/// shuffles and adds (45 instructions for 16 sums, where 16 separate reductions take about 64).
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
#[inline]
pub(crate) fn sum_lanes_16(v: &[__m512; 16]) -> __m512 {
    // Level 1: per 128-bit lane, [a0+a2, b0+b2, a1+a3, b1+b3] for the pair (a, b) = (v[2i], v[2i+1]).
    let l1: [__m512; 8] = std::array::from_fn(|i| {
        let (x, y) = (v[2 * i], v[2 * i + 1]);
        _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y))
    });
    // Level 2: per 128-bit lane, the lane's partial sums of four consecutive vectors, in order.
    let l2: [__m512; 4] = std::array::from_fn(|i| {
        let (x, y) = (_mm512_castps_pd(l1[2 * i]), _mm512_castps_pd(l1[2 * i + 1]));
        _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)))
    });
    // Levels 3 and 4: add the four 128-bit lanes' partial sums, keeping vector order.
    let fold = |x: __m512, y: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
        )
    };
    fold(fold(l2[0], l2[1]), fold(l2[2], l2[3]))
}

/// `C (+)= A · B` with A row-major and B untransposed, for at most [`DOT_MAX_ROWS`] rows of A
/// (`P · V` of decode): C is built in strips of up to 128 columns held in registers, for as
/// many rows of A at once as 16 vector accumulators allow (two rows of 128 columns, four of
/// 64), each strip and group of rows in one pass over B's rows in storage order. Each loaded
/// vector of B thus serves several rows, and at `P · V`'s widths (n = D <= 128) there are at
/// most `ceil(m / 2)` passes, the first reading B from memory and the others from L2. No
/// packing: B is read where it lies. (Blocking the passes by 32 rows of B so that the later
/// ones read L1 measured no faster, and it would add C's partial sums once per block.)
///
/// # Safety
///
/// AVX-512F and AVX-512DQ are available, `s.a_trans` and `s.b_trans` are false,
/// `s.m <= DOT_MAX_ROWS`, and the pointers satisfy the crate's `gemm_unchecked` for `s`.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
pub(crate) unsafe fn gemm_rows_streamed(s: &crate::GemmShape, a: *const f32, b: *const f32, c: *mut f32) {
    let crate::GemmShape { m, n, .. } = *s;
    if n == 0 {
        return;
    }
    // Vectors per strip, and rows per pass so that a pass holds at most 16 accumulators.
    let width = n.div_ceil(16).min(8);
    let rows = 16 / width;
    for j0 in (0..n).step_by(16 * width) {
        // The last strip takes only as many vectors as it has columns for.
        let w = (n - j0).div_ceil(16).min(width);
        for i0 in (0..m).step_by(rows) {
            let r = rows.min(m - i0);
            macro_rules! passes {
                ($(($r:literal, $w:literal))*) => {
                    match (r, w) {
                        // SAFETY: forwarded, for rows `i0 .. i0 + r <= m` and columns
                        // `j0 .. min(j0 + 16 w, n)` of C.
                        $(($r, $w) => unsafe { streamed_pass::<$r, $w>(s, a, b, c, i0, j0) },)*
                        _ => {}
                    }
                };
            }
            passes!((1, 1)(1, 2)(1, 3)(1, 4)(1, 5)(1, 6)(1, 7)(1, 8)(2, 1)(2, 2)(2, 3)(2, 4)(2, 5)(2, 6)(
                2, 7
            )(2, 8)(3, 1)(3, 2)(3, 3)(3, 4)(3, 5)(4, 1)(4, 2)(4, 3)(4, 4)(5, 1)(5, 2)(
                5, 3
            )(6, 1)(6, 2)(7, 1)(7, 2)(8, 1)(8, 2));
        }
    }
}

/// One pass of [`gemm_rows_streamed`]: `C[i0 .. i0 + R, j0 .. j0 + 16 W] (+)= A[i0 .. i0 + R, :]
/// · B[:, j0 .. j0 + 16 W]` with that block of C in `R W` registers, columns masked to `< n`.
///
/// # Safety
///
/// As [`gemm_rows_streamed`], with `i0 + R <= s.m` and `j0 < s.n`.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
unsafe fn streamed_pass<const R: usize, const W: usize>(
    s: &crate::GemmShape,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    i0: usize,
    j0: usize,
) {
    let crate::GemmShape { n, k, lda, ldb, ldc, accumulate, .. } = *s;
    let masks: [__mmask16; W] = std::array::from_fn(|v| lanes(n.saturating_sub(j0 + 16 * v)));
    let mut acc = [[_mm512_setzero_ps(); W]; R];
    for p in 0..k {
        // B's rows stream from memory once: the row STREAM_AHEAD further on is requested now.
        stream_row(b.wrapping_add((p + STREAM_AHEAD) * ldb + j0), (n - j0).min(16 * W));
        // SAFETY: row `p < k` of B, columns `j0 + 16 v ..` masked to `< n`.
        let bv: [__m512; W] =
            std::array::from_fn(|v| unsafe { _mm512_maskz_loadu_ps(masks[v], b.add(p * ldb + j0 + 16 * v)) });
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: `A[i0 + i, p]` with `i0 + i < m`, `p < k` lies in A.
            let av = _mm512_set1_ps(unsafe { *a.add((i0 + i) * lda + p) });
            for (r, &bv) in row.iter_mut().zip(&bv) {
                *r = _mm512_fmadd_ps(av, bv, *r);
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (v, &r) in row.iter().enumerate() {
            // SAFETY: row `i0 + i < m` of C, columns `j0 + 16 v ..` masked to `< n`.
            unsafe {
                let dst = c.add((i0 + i) * ldc + j0 + 16 * v);
                let r = if accumulate { _mm512_add_ps(r, _mm512_maskz_loadu_ps(masks[v], dst)) } else { r };
                _mm512_mask_storeu_ps(dst, masks[v], r);
            }
        }
    }
}
