//! AVX-512 kernels: an 8 x 32 register tile (16 zmm accumulators) and the softmax update.

use std::arch::x86_64::*;

use crate::blocked::{Tile, TileKernel};
use crate::softmax::{EXP2_C, EXP2_HI, EXP2_LO, EXP2_ZERO_BELOW, SoftmaxShape};
use crate::softmax_grad::ScoreTileShape;

/// The AVX-512 GEMM kernel.
pub(crate) struct Kernel;

impl TileKernel for Kernel {
    const MR: usize = 8;
    const NR: usize = 32;

    unsafe fn tile(t: &Tile) {
        // SAFETY: forwarded from the trait contract.
        unsafe { tile(t) }
    }

    unsafe fn pack_b(dst: *mut f32, src: *const f32, ldb: usize, kc: usize, nr: usize) {
        // SAFETY: forwarded from the trait contract.
        unsafe { super::pack_b::<32>(dst, src, ldb, kc, nr) }
    }

    unsafe fn pack_bt(dst: *mut f32, src: *const f32, ldb: usize, kc: usize, nr: usize) {
        // SAFETY: forwarded from the trait contract (AVX-512 implies AVX).
        unsafe { super::pack_bt::<32>(dst, src, ldb, kc, nr) }
    }
}

/// Picks the monomorphized tile for `t`'s row count, width and A layout.
///
/// # Safety
///
/// AVX-512F is available and `t` is valid as [`Tile`] describes, with `mr <= 8`, `nr <= 32`.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn tile(t: &Tile) {
    macro_rules! by_rows {
        ($($mr:literal)*) => {
            match t.mr {
                $($mr => match (t.nr > 16, t.a_colmajor) {
                    // SAFETY: forwarded from this function's contract.
                    (true, true) => unsafe { tile_n::<$mr, 2, true>(t) },
                    // SAFETY: as above.
                    (true, false) => unsafe { tile_n::<$mr, 2, false>(t) },
                    // SAFETY: as above.
                    (false, true) => unsafe { tile_n::<$mr, 1, true>(t) },
                    // SAFETY: as above.
                    (false, false) => unsafe { tile_n::<$mr, 1, false>(t) },
                },)*
                _ => {}
            }
        };
    }
    by_rows!(1 2 3 4 5 6 7 8);
}

/// Lane mask selecting the first `cols` (clamped to 16) floats of a vector.
#[inline]
fn lanes(cols: usize) -> __mmask16 {
    if cols >= 16 { 0xFFFF } else { (1u16 << cols) - 1 }
}

/// `M x (16 V)` tile: per k step, `V` vector loads of B, `M` broadcasts of A, `M V` FMAs.
///
/// # Safety
///
/// As [`tile`], with `M == t.mr` and `V == 2` iff `t.nr > 16`.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn tile_n<const M: usize, const V: usize, const COLMAJOR: bool>(t: &Tile) {
    let (a, lda, b, ldb) = (t.a, t.lda, t.b, t.ldb);
    let mut acc = [[_mm512_setzero_ps(); V]; M];
    // Not unrolled by hand: LLVM then hoists the broadcasts of later steps and spills them.
    for p in 0..t.kc {
        let mut bv = [_mm512_setzero_ps(); V];
        for (v, bx) in bv.iter_mut().enumerate() {
            // SAFETY: row `p < kc` of the B panel has `16 V` readable floats (Tile contract).
            *bx = unsafe { _mm512_loadu_ps(b.add(p * ldb + 16 * v)) };
        }
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: `A[i, p]` with `i < mr`, `p < kc` is inside A (Tile contract).
            let x = unsafe { if COLMAJOR { *a.add(p * lda + i) } else { *a.add(i * lda + p) } };
            let av = _mm512_set1_ps(x);
            for (r, &bx) in row.iter_mut().zip(&bv) {
                *r = _mm512_fmadd_ps(av, bx, *r);
            }
        }
    }
    let masks = [lanes(t.nr), lanes(t.nr.saturating_sub(16))];
    for (i, row) in acc.iter().enumerate() {
        for (v, &r) in row.iter().enumerate() {
            // SAFETY: row `i < mr` of C, columns `16 v ..` masked to `< nr`; masked-off lanes
            // are neither read nor written.
            unsafe {
                let dst = t.c.add(i * t.ldc + 16 * v);
                let r = if t.accumulate { _mm512_add_ps(r, _mm512_maskz_loadu_ps(masks[v], dst)) } else { r };
                _mm512_mask_storeu_ps(dst, masks[v], r);
            }
        }
    }
}

/// `2^x` per lane; see [`crate::softmax_update`] for the method and its accuracy.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
fn exp2(x: __m512) -> __m512 {
    // The clamp bound is the first operand: MAXPS/MINPS return the second one when either is
    // NaN, so a NaN input stays NaN through the clamp (and through the result).
    let x = _mm512_min_ps(_mm512_set1_ps(EXP2_HI), _mm512_max_ps(_mm512_set1_ps(EXP2_LO), x));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
    let f = _mm512_sub_ps(x, n);
    let mut p = _mm512_set1_ps(EXP2_C[6]);
    for &c in EXP2_C[..6].iter().rev() {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    }
    // 2^n from its bit pattern; n = 128 gives +inf. Inputs at or below -126.5 give 0; NaN is
    // unordered, so it stays live and `p` (NaN) makes the product NaN.
    let scale = _mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)));
    let live = _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(x, _mm512_set1_ps(EXP2_ZERO_BELOW));
    _mm512_maskz_mul_ps(live, p, _mm512_castsi512_ps(scale))
}

/// The softmax update over all rows (see [`crate::softmax_update`]).
///
/// # Safety
///
/// AVX-512F is available and the pointers satisfy [`crate::softmax_update_unchecked`].
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn softmax_update(
    sh: &SoftmaxShape,
    s: *mut f32,
    row_max: *mut f32,
    row_sum: *mut f32,
    o: *mut f32,
) {
    let SoftmaxShape { rows, cols, lds, ldo, d } = *sh;
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    let (cfull, dfull) = (cols - cols % 16, d - d % 16);
    let (ctail, dtail) = (lanes(cols % 16), lanes(d % 16));
    for r in 0..rows {
        // SAFETY: row `r < rows` of S spans `cols` floats and of O `d` floats; full vectors end
        // at `cfull`/`dfull`, and the tails are masked, so nothing outside the rows is touched.
        unsafe {
            let srow = s.add(r * lds);
            let mut mx = neg_inf;
            for j in (0..cfull).step_by(16) {
                mx = _mm512_max_ps(mx, _mm512_loadu_ps(srow.add(j)));
            }
            if ctail != 0 {
                mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(neg_inf, ctail, srow.add(cfull)));
            }
            let m_old = *row_max.add(r);
            let m_new = m_old.max(_mm512_reduce_max_ps(mx));
            if m_new == f32::NEG_INFINITY {
                // Nothing seen yet: P = 0, and the running sum and output stay as they are.
                for j in (0..cfull).step_by(16) {
                    _mm512_storeu_ps(srow.add(j), _mm512_setzero_ps());
                }
                _mm512_mask_storeu_ps(srow.add(cfull), ctail, _mm512_setzero_ps());
                continue;
            }
            let alpha = _mm512_cvtss_f32(exp2(_mm512_set1_ps(m_old - m_new)));
            let mv = _mm512_set1_ps(m_new);
            let mut sum = _mm512_setzero_ps();
            for j in (0..cfull).step_by(16) {
                let e = exp2(_mm512_sub_ps(_mm512_loadu_ps(srow.add(j)), mv));
                _mm512_storeu_ps(srow.add(j), e);
                sum = _mm512_add_ps(sum, e);
            }
            if ctail != 0 {
                let e = exp2(_mm512_sub_ps(_mm512_maskz_loadu_ps(ctail, srow.add(cfull)), mv));
                _mm512_mask_storeu_ps(srow.add(cfull), ctail, e);
                sum = _mm512_mask_add_ps(sum, ctail, sum, e);
            }
            *row_sum.add(r) = *row_sum.add(r) * alpha + _mm512_reduce_add_ps(sum);
            *row_max.add(r) = m_new;
            // alpha == 1 leaves O unchanged bit for bit, so skip the pass.
            if alpha != 1.0 && d > 0 {
                let orow = o.add(r * ldo);
                let av = _mm512_set1_ps(alpha);
                for j in (0..dfull).step_by(16) {
                    _mm512_storeu_ps(orow.add(j), _mm512_mul_ps(_mm512_loadu_ps(orow.add(j)), av));
                }
                if dtail != 0 {
                    let x = _mm512_maskz_loadu_ps(dtail, orow.add(dfull));
                    _mm512_mask_storeu_ps(orow.add(dfull), dtail, _mm512_mul_ps(x, av));
                }
            }
        }
    }
}

/// The probabilities recomputed from the log-sum-exp (see [`crate::softmax_recompute`]).
///
/// # Safety
///
/// AVX-512F is available and the pointers satisfy [`crate::softmax_recompute_unchecked`].
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn softmax_recompute(sh: &ScoreTileShape, s: *mut f32, lse: *const f32) {
    let ScoreTileShape { rows, cols, ld } = *sh;
    let full = cols - cols % 16;
    let tail = lanes(cols % 16);
    for r in 0..rows {
        // SAFETY: row `r < rows` of S spans `cols` floats at `r * ld`; full vectors end at
        // `full` and the tail is masked; `lse` holds `rows` floats.
        unsafe {
            let row = s.add(r * ld);
            let l = *lse.add(r);
            if l == f32::NEG_INFINITY {
                for j in (0..full).step_by(16) {
                    _mm512_storeu_ps(row.add(j), _mm512_setzero_ps());
                }
                _mm512_mask_storeu_ps(row.add(full), tail, _mm512_setzero_ps());
                continue;
            }
            let lv = _mm512_set1_ps(l);
            for j in (0..full).step_by(16) {
                _mm512_storeu_ps(row.add(j), exp2(_mm512_sub_ps(_mm512_loadu_ps(row.add(j)), lv)));
            }
            if tail != 0 {
                let x = _mm512_maskz_loadu_ps(tail, row.add(full));
                _mm512_mask_storeu_ps(row.add(full), tail, exp2(_mm512_sub_ps(x, lv)));
            }
        }
    }
}

/// `dP = P * (dP - delta)`, 0 where `P == 0` (see [`crate::softmax_grad`]).
///
/// # Safety
///
/// AVX-512F is available and the pointers satisfy [`crate::softmax_grad_unchecked`].
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn softmax_grad(sh: &ScoreTileShape, p: *const f32, dp: *mut f32, delta: *const f32) {
    let ScoreTileShape { rows, cols, ld } = *sh;
    let full = cols - cols % 16;
    let tail = lanes(cols % 16);
    let step = |pr: *const f32, dr: *mut f32, dl: __m512, m: __mmask16| {
        // SAFETY: the callers pass lanes `m` of one row of each tile, inside their extents.
        unsafe {
            let pv = _mm512_maskz_loadu_ps(m, pr);
            let g = _mm512_maskz_loadu_ps(m, dr);
            // NEQ_UQ: a NaN P is "not equal" to 0, so it stays live and propagates.
            let live = _mm512_mask_cmp_ps_mask::<_CMP_NEQ_UQ>(m, pv, _mm512_setzero_ps());
            _mm512_mask_storeu_ps(dr, m, _mm512_maskz_mul_ps(live, pv, _mm512_sub_ps(g, dl)));
        }
    };
    for r in 0..rows {
        // SAFETY: row `r < rows` of each tile spans `cols` floats at `r * ld`; `delta` holds
        // `rows` floats.
        unsafe {
            let (pr, dr) = (p.add(r * ld), dp.add(r * ld));
            let dl = _mm512_set1_ps(*delta.add(r));
            for j in (0..full).step_by(16) {
                step(pr.add(j), dr.add(j), dl, 0xFFFF);
            }
            if tail != 0 {
                step(pr.add(full), dr.add(full), dl, tail);
            }
        }
    }
}
