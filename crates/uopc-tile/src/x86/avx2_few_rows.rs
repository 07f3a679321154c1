//! AVX2+FMA GEMMs for at most [`DOT_MAX_ROWS`] rows of A (decode): dot products against a
//! transposed B and strips of C held in registers over an untransposed B, both reading B
//! where it lies, once, instead of packing panels that so few rows would barely reuse.

use std::arch::x86_64::*;

use super::avx2::lanes;
use super::{rows_ahead, stream_row};

/// Rows of A up to which [`gemm_bt_dots`] and [`gemm_rows_streamed`] beat packing B for the
/// 6 x 16 register tile.
pub(crate) const DOT_MAX_ROWS: usize = 8;

/// Vector accumulators one kernel instance holds: of the 16 ymm registers, the rest keep the
/// operands of one step (a loaded vector of B and rows of A, or in a streamed pass the fewer
/// of its B vectors and A broadcasts and one of the other).
const ACCUMULATORS: usize = 12;

/// `C (+)= A · B^T` with A row-major and B stored transposed (`n x k`, rows contiguous in k),
/// as dot products, for at most [`DOT_MAX_ROWS`] rows of A.
///
/// Keys go in groups of `8 / m` (1 from five rows on), whose `m x (8 / m)` accumulators one
/// shuffle tree reduces to their sums. Each key's row of B is read front to back once, every
/// 8-float step of it multiplied into all `m` rows of A (from L1), so B is one sequential
/// stream, with a row a few KiB on requested as it goes.
///
/// # Safety
///
/// AVX2 and FMA are available, `s.a_trans` is false, `s.b_trans` is true, `1 <= s.m <=
/// DOT_MAX_ROWS`, `s.k > 0`, and the pointers satisfy the crate's `gemm_unchecked` for `s`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn gemm_bt_dots(s: &crate::GemmShape, a: *const f32, b: *const f32, c: *mut f32) {
    // SAFETY: forwarded; each instance is given its own row count, with `M G <= 8`.
    unsafe {
        match s.m {
            1 => dots::<1, 8>(s, a, b, c),
            2 => dots::<2, 4>(s, a, b, c),
            3 => dots::<3, 2>(s, a, b, c),
            4 => dots::<4, 2>(s, a, b, c),
            5 => dots::<5, 1>(s, a, b, c),
            6 => dots::<6, 1>(s, a, b, c),
            7 => dots::<7, 1>(s, a, b, c),
            8 => dots::<8, 1>(s, a, b, c),
            _ => {}
        }
    }
}

/// [`gemm_bt_dots`] for `M` rows of A, `G` keys per group (`M G <= 8`).
///
/// # Safety
///
/// As [`gemm_bt_dots`], with `M == s.m`.
#[target_feature(enable = "avx2,fma")]
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
        // Accumulator `(i, g)` is lane `i G + g` of the sums; lanes past `M G` stay zero.
        let mut flat = [_mm256_setzero_ps(); 8];
        for g in 0..G {
            stream_row(b.wrapping_add((j0 + g + ahead) * s.ldb), s.k);
            // SAFETY: forwarded, for key `j0 + g` of the group (past the live keys the last
            // live key's row is read again and its sums dropped, so every group has one shape).
            let acc = unsafe { key_dots::<M>(s, a, b, j0 + g.min(live - 1)) };
            for (i, &acc) in acc.iter().enumerate() {
                flat[i * G + g] = acc;
            }
        }
        let mut sums = [0.0f32; 8];
        // SAFETY: 8 floats into an 8-float array.
        unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), sum_lanes_8(&flat)) };
        for i in 0..M {
            for g in 0..live {
                // SAFETY: column `j0 + g < n` of row `i < m` of C.
                unsafe {
                    let dst = c.add(i * ldc + j0 + g);
                    *dst = if accumulate { *dst + sums[i * G + g] } else { sums[i * G + g] };
                }
            }
        }
    }
}

/// The lane-wise partial dot products of rows `0..M` of A with row `j` of B, read front to
/// back once.
///
/// # Safety
///
/// As [`gemm_bt_dots`], with `M == s.m` and `j < s.n`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn key_dots<const M: usize>(
    s: &crate::GemmShape,
    a: *const f32,
    b: *const f32,
    j: usize,
) -> [__m256; M] {
    let crate::GemmShape { k, lda, ldb, .. } = *s;
    // SAFETY: `j < n`, a row of B.
    let row = unsafe { b.add(j * ldb) };
    // Two accumulators per row, for even and odd steps, halve the chain of dependent FMAs.
    let mut acc = [[_mm256_setzero_ps(); 2]; M];
    let kfull = k - k % 8;
    let mut p = 0;
    while p + 16 <= kfull {
        for half in 0..2 {
            let q = p + 8 * half;
            // SAFETY: columns `q .. q + 8 <= kfull` of this row of B and of rows `i < M` of A.
            unsafe {
                let bv = _mm256_loadu_ps(row.add(q));
                for (i, acc) in acc.iter_mut().enumerate() {
                    acc[half] = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i * lda + q)), bv, acc[half]);
                }
            }
        }
        p += 16;
    }
    if p < kfull {
        // SAFETY: as above, for the one full step left.
        unsafe {
            let bv = _mm256_loadu_ps(row.add(p));
            for (i, acc) in acc.iter_mut().enumerate() {
                acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i * lda + p)), bv, acc[0]);
            }
        }
    }
    if k % 8 != 0 {
        let mask = lanes(k % 8);
        // SAFETY: the `k % 8` floats left of this row of B and of rows `i < M` of A, masked.
        unsafe {
            let bv = _mm256_maskload_ps(row.add(kfull), mask);
            for (i, acc) in acc.iter_mut().enumerate() {
                acc[1] = _mm256_fmadd_ps(_mm256_maskload_ps(a.add(i * lda + kfull), mask), bv, acc[1]);
            }
        }
    }
    std::array::from_fn(|i| _mm256_add_ps(acc[i][0], acc[i][1]))
}

/// The strip of B one pass of [`gemm_rows_streamed`] reads: columns `j0 .. j0 + cols` of
/// the rows `ldb` apart from `b`, the last vector masked by `tail_mask` unless the strip is
/// whole vectors.
struct StripOfB {
    b: *const f32,
    ldb: usize,
    j0: usize,
    cols: usize,
    tail_mask: __m256i,
}

/// `A[0 .. R, chunk] · B[chunk, strip]` in `R W` registers. With `FULL` the strip is `W` whole
/// vectors, else its vector `cols / 8` is masked and those after it are zero; with `REQUEST`
/// the strip of the next chunk's rows is requested. Both are parameters so that neither test
/// stays in the loop.
///
/// # Safety
///
/// AVX2 and FMA are available; `a` is readable at `i * lda + p` for `i < R` and `p` in the
/// chunk, and B at the strip's columns of the chunk's rows.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn strip_products<const R: usize, const W: usize, const FULL: bool, const REQUEST: bool>(
    strip: &StripOfB,
    a: *const f32,
    lda: usize,
    chunk: &Chunk,
) -> [[__m256; W]; R] {
    let StripOfB { b, ldb, j0, cols, tail_mask } = *strip;
    let whole = cols / 8;
    let mut acc = [[_mm256_setzero_ps(); W]; R];
    for p in chunk.p0..chunk.p0 + chunk.rows {
        if REQUEST {
            stream_row(b.wrapping_add((p + CHUNK_ROWS) * ldb + j0), cols);
        }
        // SAFETY: row `p` of B at the strip's columns (the contract).
        let brow = unsafe { b.add(p * ldb + j0) };
        // SAFETY: vector `v` of the strip: whole when `FULL` or below `whole`, else the
        // masked tail; vectors past it are not read.
        let load = |v: usize| unsafe {
            if FULL || v < whole {
                _mm256_loadu_ps(brow.add(8 * v))
            } else if v == whole {
                _mm256_maskload_ps(brow.add(8 * v), tail_mask)
            } else {
                _mm256_setzero_ps()
            }
        };
        // SAFETY: `A[i, p]` (the contract).
        let broadcast = |i: usize| _mm256_set1_ps(unsafe { *a.add(i * lda + p) });
        // Of the B vectors and the broadcasts of A, the fewer stay live across the other's
        // loop: `R W` accumulators, `min(R, W)` held operands and one streamed operand fit the
        // 16 registers for every pass `gemm_rows_streamed` runs.
        if W < R {
            let bv: [__m256; W] = std::array::from_fn(load);
            for (i, row) in acc.iter_mut().enumerate() {
                let av = broadcast(i);
                for (v, acc) in row.iter_mut().enumerate() {
                    *acc = _mm256_fmadd_ps(av, bv[v], *acc);
                }
            }
        } else {
            let av: [__m256; R] = std::array::from_fn(broadcast);
            for v in 0..W {
                let bv = load(v);
                for (i, row) in acc.iter_mut().enumerate() {
                    row[v] = _mm256_fmadd_ps(av[i], bv, row[v]);
                }
            }
        }
    }
    acc
}

/// Lane `j` of the result is the sum of the 8 lanes of `v[j]`: two levels of horizontal adds
/// within 128-bit halves, then one add of the halves.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn sum_lanes_8(v: &[__m256; 8]) -> __m256 {
    // Per 128-bit half: [a0+a1, a2+a3, b0+b1, b2+b3] for (a, b) = (v[2i], v[2i+1]).
    let l1: [__m256; 4] = std::array::from_fn(|i| _mm256_hadd_ps(v[2 * i], v[2 * i + 1]));
    // Per 128-bit half: the half's sums of v[4i .. 4i + 4], in order.
    let l2 = [_mm256_hadd_ps(l1[0], l1[1]), _mm256_hadd_ps(l1[2], l1[3])];
    _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(l2[0], l2[1]), _mm256_permute2f128_ps::<0x31>(l2[0], l2[1]))
}

/// Rows of B one round of [`gemm_rows_streamed`]'s passes covers: 32 rows of up to 128
/// floats (16 KiB) stay in L1 while every strip's pass reads them, and each pass requesting
/// its strip of the next chunk gives the requests a whole round to arrive.
const CHUNK_ROWS: usize = 32;

/// `C (+)= A · B` with A row-major and B untransposed, for at most [`DOT_MAX_ROWS`] rows of A
/// (`P · V` of decode): C in strips of columns held in registers, for as many rows of A at
/// once as [`ACCUMULATORS`] allow (up to 6 rows, in two groups above), over B in chunks of
/// [`CHUNK_ROWS`] rows. Each pass over a chunk requests its strip of the next chunk (the
/// first chunk is requested whole up front), so B comes from memory once, a round ahead of
/// its use; C's strips are added to once per chunk. Every loaded vector of B serves all rows
/// of a group. No packing: B is read where it lies.
///
/// # Safety
///
/// AVX2 and FMA are available, `s.a_trans` and `s.b_trans` are false, `s.m <= DOT_MAX_ROWS`,
/// and the pointers satisfy the crate's `gemm_unchecked` for `s`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn gemm_rows_streamed(s: &crate::GemmShape, a: *const f32, b: *const f32, c: *mut f32) {
    let crate::GemmShape { m, n, k, accumulate, .. } = *s;
    if n == 0 || m == 0 {
        return;
    }
    let groups = m.div_ceil(6);
    let rows = m.div_ceil(groups);
    // Vectors per strip: as many as the accumulators allow.
    let fit = ACCUMULATORS / rows;
    let width = fit.min(n.div_ceil(8));
    for p in 0..CHUNK_ROWS.min(k) {
        stream_row(b.wrapping_add(p * s.ldb), n);
    }
    // With k = 0 one round stores zeros (or leaves C) as a product over no rows does.
    for p0 in (0..k.max(1)).step_by(CHUNK_ROWS) {
        let chunk = Chunk { p0, rows: CHUNK_ROWS.min(k - p0.min(k)), accumulate: accumulate || p0 > 0 };
        for j0 in (0..n).step_by(8 * width) {
            let w = (n - j0).div_ceil(8).min(width);
            for i0 in (0..m).step_by(rows) {
                let r = rows.min(m - i0);
                // The group of rows after the first reads the strip from L1.
                let request = i0 == 0;
                macro_rules! passes {
                    ($(($r:literal, $w:literal))*) => {
                        match (r, w) {
                            // SAFETY: forwarded, for rows `i0 .. i0 + r <= m` and columns
                            // `j0 .. min(j0 + 8 w, n)` of C, rows `p0 ..` of B in `0..k`.
                            $(($r, $w) => unsafe { streamed_pass::<$r, $w>(s, a, b, c, i0, j0, &chunk, request) },)*
                            // Every `(rows, width)` above is listed: rows `<= 6`, `rows width <= 12`.
                            _ => unreachable!("no streamed pass for {r} rows x {w} vectors"),
                        }
                    };
                }
                passes!((1, 1)(1, 2)(1, 3)(1, 4)(1, 5)(1, 6)(1, 7)(1, 8)(1, 9)(1, 10)(1, 11)(1, 12)(2, 1)(
                    2, 2
                )(2, 3)(2, 4)(2, 5)(2, 6)(3, 1)(3, 2)(3, 3)(3, 4)(4, 1)(4, 2)(4, 3)(
                    5, 1
                )(5, 2)(6, 1)(6, 2));
            }
        }
    }
}

/// Rows `p0 .. p0 + rows` of B that one round of [`gemm_rows_streamed`]'s passes covers, and
/// whether its passes add to C (every chunk after the first does).
struct Chunk {
    p0: usize,
    rows: usize,
    accumulate: bool,
}

/// One pass of [`gemm_rows_streamed`]: `C[i0 .. i0 + R, j0 .. j0 + 8 W] (+)= A[i0 .. i0 + R,
/// chunk] · B[chunk, j0 .. j0 + 8 W]` with that block of C in `R W` registers, columns masked
/// to `< n`; with `request_next`, the same strip of the next chunk's rows is requested.
///
/// # Safety
///
/// As [`gemm_rows_streamed`], with `i0 + R <= s.m`, `j0 < s.n` and `chunk.p0 + chunk.rows <=
/// s.k`.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn streamed_pass<const R: usize, const W: usize>(
    s: &crate::GemmShape,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    i0: usize,
    j0: usize,
    chunk: &Chunk,
    request_next: bool,
) {
    let crate::GemmShape { n, lda, ldb, ldc, .. } = *s;
    let cols = (n - j0).min(8 * W);
    // The last vector of the strip may be partial; the others are whole.
    let (whole, tail) = (cols / 8, cols % 8);
    let tail_mask = lanes(tail);
    let strip = StripOfB { b, ldb, j0, cols, tail_mask };
    // SAFETY: row `i0 < m` of A.
    let a_rows = unsafe { a.add(i0 * lda) };
    // SAFETY: forwarded: rows `chunk.p0 ..` of B, the strip's columns, rows `i0 .. i0 + R` of A.
    let acc: [[__m256; W]; R] = unsafe {
        match (whole == W, request_next) {
            (true, true) => strip_products::<R, W, true, true>(&strip, a_rows, lda, chunk),
            (true, false) => strip_products::<R, W, true, false>(&strip, a_rows, lda, chunk),
            (false, true) => strip_products::<R, W, false, true>(&strip, a_rows, lda, chunk),
            (false, false) => strip_products::<R, W, false, false>(&strip, a_rows, lda, chunk),
        }
    };
    for (i, row) in acc.iter().enumerate() {
        for (v, &r) in row.iter().enumerate() {
            // SAFETY: row `i0 + i < m` of C, columns `j0 + 8 v ..`: whole vectors, then the
            // tail masked to `< n`; vectors past it are not touched.
            unsafe {
                let dst = c.add((i0 + i) * ldc + j0 + 8 * v);
                if v < whole {
                    let r = if chunk.accumulate { _mm256_add_ps(r, _mm256_loadu_ps(dst)) } else { r };
                    _mm256_storeu_ps(dst, r);
                } else if v == whole && tail > 0 {
                    let r = if chunk.accumulate {
                        _mm256_add_ps(r, _mm256_maskload_ps(dst, tail_mask))
                    } else {
                        r
                    };
                    _mm256_maskstore_ps(dst, tail_mask, r);
                }
            }
        }
    }
}
