//! AVX2+FMA kernels: a 6 x 16 register tile (12 ymm accumulators) and the softmax update.

use std::arch::x86_64::*;

use super::RoundedTile;
use super::exp2::nonpositive_x8 as exp2_nonpositive;
use crate::shapes::{SoftmaxShape, any_scaled_nan};
use crate::tile::{HalfFloat, Tile, TileKernel};

/// The AVX2+FMA GEMM kernel.
pub(crate) struct Kernel;

impl TileKernel for Kernel {
    const MR: usize = 6;
    const NR: usize = 16;

    unsafe fn tile(t: &Tile) {
        // SAFETY: forwarded from the trait contract.
        unsafe { tile(t) }
    }

    unsafe fn pack_b(dst: *mut f32, src: *const f32, ldb: usize, kc: usize, nr: usize) {
        // SAFETY: forwarded from the trait contract.
        unsafe { super::pack_b::<16>(dst, src, ldb, kc, nr) }
    }

    unsafe fn pack_bt(dst: *mut f32, src: *const f32, ldb: usize, kc: usize, nr: usize) {
        // SAFETY: forwarded from the trait contract (AVX2 implies AVX).
        unsafe { super::pack_bt::<16>(dst, src, ldb, kc, nr) }
    }

    unsafe fn pack_a_rows(dst: *mut f32, src: *const f32, lda: usize, kc: usize, mr: usize) {
        // SAFETY: forwarded from the trait contract (AVX2 implies AVX); the strip is
        // `pack_bt`'s panel of width MR.
        unsafe { super::pack_bt::<6>(dst, src, lda, kc, mr) }
    }

    unsafe fn pack_a_rows_half<H: HalfFloat>(dst: *mut f32, src: *const H, lda: usize, kc: usize, mr: usize) {
        // SAFETY: forwarded from the trait contract; the strip is `pack_bt`'s panel of width MR.
        unsafe { H::pack_bt::<6>(dst, src, lda, kc, mr) }
    }

    unsafe fn pack_b_half<H: HalfFloat>(dst: *mut f32, src: *const H, ldb: usize, kc: usize, nr: usize) {
        // SAFETY: forwarded from the trait contract.
        unsafe { H::pack_b::<16>(dst, src, ldb, kc, nr) }
    }

    unsafe fn pack_bt_half<H: HalfFloat>(dst: *mut f32, src: *const H, ldb: usize, kc: usize, nr: usize) {
        // SAFETY: forwarded from the trait contract.
        unsafe { H::pack_bt::<16>(dst, src, ldb, kc, nr) }
    }
}

/// Picks the monomorphized tile for `t`'s row count, width and A layout.
///
/// # Safety
///
/// AVX2 and FMA are available and `t` is valid as [`Tile`] describes, with `mr <= 6`, `nr <= 16`.
#[target_feature(enable = "avx2,fma")]
unsafe fn tile(t: &Tile) {
    macro_rules! by_rows {
        ($($mr:literal)*) => {
            match t.mr {
                $($mr => match (t.nr > 8, t.a_colmajor) {
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
    by_rows!(1 2 3 4 5 6);
}

/// `-1` for the first 8 entries, then `0`: an 8-lane window starting at `8 - cols` is the
/// `vmaskmov` mask selecting the first `cols` lanes.
static MASK_WINDOW: [i32; 16] = [-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0];

/// `vmaskmov` mask selecting the first `cols` (clamped to 8) lanes.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn lanes(cols: usize) -> __m256i {
    // SAFETY: `8 - min(cols, 8)` is in `0..=8`, so the 8 loaded entries are inside the table.
    unsafe { _mm256_loadu_si256(MASK_WINDOW.as_ptr().add(8 - cols.min(8)).cast()) }
}

/// `M x (8 V)` tile: the shared register tile at 8 lanes.
///
/// # Safety
///
/// As [`tile`], with `M == t.mr` and `V == 2` iff `t.nr > 8`.
// Out of line: each register tile keeps a symbol of its own, which `cargo xtask mca` and
// profilers name (one call per tile of `kc` steps costs nothing measurable).
#[inline(never)]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_n<const M: usize, const V: usize, const COLMAJOR: bool>(t: &Tile) {
    // SAFETY: forwarded from this function's contract; this function enables the ISA the
    // 256-bit lanes need, so the shared body's operations inline here.
    unsafe { super::register_tile::tile::<__m256, M, V, COLMAJOR>(t) }
}

/// Horizontal maximum of 8 lanes.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn hmax(v: __m256) -> f32 {
    let x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)))
}

/// Horizontal sum of 8 lanes.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn hsum(v: __m256) -> f32 {
    let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)))
}

/// `row[j] *= alpha` for `j < d`, 8 lanes at a time with the tail masked: the rescale of one
/// output row by a softmax step.
///
/// # Safety
///
/// AVX2 and FMA are available and `row` is valid for reads and writes of `d` floats.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn scale_row(row: *mut f32, d: usize, alpha: f32) {
    let av = _mm256_set1_ps(alpha);
    let full = d - d % 8;
    // SAFETY: full vectors end at `full <= d`; the tail is masked to `d`.
    unsafe {
        for j in (0..full).step_by(8) {
            _mm256_storeu_ps(row.add(j), _mm256_mul_ps(_mm256_loadu_ps(row.add(j)), av));
        }
        if !d.is_multiple_of(8) {
            let tail = lanes(d % 8);
            let x = _mm256_maskload_ps(row.add(full), tail);
            _mm256_maskstore_ps(row.add(full), tail, _mm256_mul_ps(x, av));
        }
    }
}

/// The softmax update over all rows (see the crate's `softmax_update`).
///
/// # Safety
///
/// AVX2 and FMA are available and the pointers satisfy the crate's `softmax_update_unchecked`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn softmax_update(
    sh: &SoftmaxShape,
    scale: f32,
    s: *mut f32,
    row_max: *mut f32,
    row_sum: *mut f32,
    o: *mut f32,
) {
    let SoftmaxShape { rows, cols, lds, ldo, d } = *sh;
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    let sv = _mm256_set1_ps(scale);
    let cfull = cols - cols % 8;
    let ctail = lanes(cols % 8);
    let has_ctail = cols % 8 != 0;
    // A positive finite scale preserves order, so a row's maximum is scaled once rather than
    // every score before comparing (the same float: rounding is monotonic).
    let scale_after_max = scale > 0.0 && scale.is_finite();
    // `max_j scale * S[r, j]`.
    let block_max = |r: usize| {
        // SAFETY: row `r < rows` of S spans `cols` floats; the tail is masked.
        unsafe {
            let srow = s.add(r * lds);
            let scaled = |x: __m256| if scale_after_max { x } else { _mm256_mul_ps(x, sv) };
            let mut mx = neg_inf;
            for j in (0..cfull).step_by(8) {
                mx = _mm256_max_ps(mx, scaled(_mm256_loadu_ps(srow.add(j))));
            }
            if has_ctail {
                let x = scaled(_mm256_maskload_ps(srow.add(cfull), ctail));
                mx = _mm256_max_ps(mx, _mm256_blendv_ps(neg_inf, x, _mm256_castsi256_ps(ctail)));
            }
            if scale_after_max { hmax(mx) * scale } else { hmax(mx) }
        }
    };
    // The next row's maximum is found before this row's exponentials are issued: they depend
    // on it, and its chain of comparisons then overlaps this row's work instead of stalling it.
    let mut next_max = if rows > 0 { block_max(0) } else { f32::NEG_INFINITY };
    for r in 0..rows {
        let this_max = next_max;
        if r + 1 < rows {
            next_max = block_max(r + 1);
        }
        // SAFETY: row `r < rows` of S spans `cols` floats and of O `d` floats (`d > 0` before
        // `scale_row` takes it); full vectors end at `cfull`, and the tail uses `vmaskmov`, so
        // nothing outside the rows is touched.
        unsafe {
            let srow = s.add(r * lds);
            let m_old = *row_max.add(r);
            let m_new = m_old.max(this_max);
            // A NaN among `-inf`s must not take this shortcut (see `any_scaled_nan`).
            if m_new == f32::NEG_INFINITY && !any_scaled_nan(srow, cols, scale) {
                // Nothing seen yet: P = 0, and the running sum and output stay as they are.
                for j in (0..cfull).step_by(8) {
                    _mm256_storeu_ps(srow.add(j), _mm256_setzero_ps());
                }
                if has_ctail {
                    _mm256_maskstore_ps(srow.add(cfull), ctail, _mm256_setzero_ps());
                }
                continue;
            }
            let alpha = _mm256_cvtss_f32(exp2_nonpositive(_mm256_set1_ps(m_old - m_new)));
            let mv = _mm256_set1_ps(m_new);
            let mut sum = _mm256_setzero_ps();
            for j in (0..cfull).step_by(8) {
                let e = exp2_nonpositive(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(srow.add(j)), sv), mv));
                _mm256_storeu_ps(srow.add(j), e);
                sum = _mm256_add_ps(sum, e);
            }
            if has_ctail {
                let e = exp2_nonpositive(_mm256_sub_ps(
                    _mm256_mul_ps(_mm256_maskload_ps(srow.add(cfull), ctail), sv),
                    mv,
                ));
                _mm256_maskstore_ps(srow.add(cfull), ctail, e);
                sum = _mm256_add_ps(sum, _mm256_and_ps(e, _mm256_castsi256_ps(ctail)));
            }
            *row_sum.add(r) = *row_sum.add(r) * alpha + hsum(sum);
            *row_max.add(r) = m_new;
            // alpha == 1 leaves O unchanged bit for bit, so skip the pass.
            if alpha != 1.0 && d > 0 {
                scale_row(o.add(r * ldo), d, alpha);
            }
        }
    }
}

/// `S = exp2(S - lse)` per row, zeros for a row whose lse is `-inf` (see
/// the crate's `softmax_recompute`).
///
/// # Safety
///
/// AVX2 and FMA are available and the pointers satisfy the crate's `softmax_recompute_unchecked`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn softmax_recompute(sh: &crate::ScoreTileShape, s: *mut f32, lse: *const f32) {
    let crate::ScoreTileShape { rows, cols, ld } = *sh;
    let full = cols - cols % 8;
    let tail = lanes(cols % 8);
    for r in 0..rows {
        // SAFETY: row `r < rows` of S spans `cols` floats at `r * ld`; full vectors end at
        // `full` and the tail is masked; `lse` holds `rows` floats.
        unsafe {
            let row = s.add(r * ld);
            let l = *lse.add(r);
            if l == f32::NEG_INFINITY {
                for j in (0..full).step_by(8) {
                    _mm256_storeu_ps(row.add(j), _mm256_setzero_ps());
                }
                _mm256_maskstore_ps(row.add(full), tail, _mm256_setzero_ps());
                continue;
            }
            let lv = _mm256_set1_ps(l);
            // Any exponent: an lse from another forward than these scores may leave some
            // positive, and those from 128 on give +inf as on the other ISAs.
            let step = |x: __m256| exp2_any(_mm256_sub_ps(x, lv));
            for j in (0..full).step_by(8) {
                _mm256_storeu_ps(row.add(j), step(_mm256_loadu_ps(row.add(j))));
            }
            if !cols.is_multiple_of(8) {
                let x = _mm256_maskload_ps(row.add(full), tail);
                _mm256_maskstore_ps(row.add(full), tail, step(x));
            }
        }
    }
}

/// `dP = P * (dP - delta)`, 0 where `P == 0` (see the crate's `softmax_grad`).
///
/// # Safety
///
/// AVX2 and FMA are available and the pointers satisfy the crate's `softmax_grad_unchecked`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn softmax_grad(
    sh: &crate::ScoreTileShape,
    p: *const f32,
    dp: *mut f32,
    delta: *const f32,
) {
    let crate::ScoreTileShape { rows, cols, ld } = *sh;
    let full = cols - cols % 8;
    let tail = lanes(cols % 8);
    // The product where P is live, 0 where it is exactly 0 (so a NaN dP behind a masked key
    // does not leak); a NaN P compares unequal to 0 and stays NaN through the product.
    let step = |pv: __m256, dv: __m256, dl: __m256| {
        let live = _mm256_cmp_ps::<_CMP_NEQ_UQ>(pv, _mm256_setzero_ps());
        _mm256_and_ps(live, _mm256_mul_ps(pv, _mm256_sub_ps(dv, dl)))
    };
    for r in 0..rows {
        // SAFETY: row `r < rows` of each tile spans `cols` floats at `r * ld`; full vectors
        // end at `full` and the tail is masked; `delta` holds `rows` floats.
        unsafe {
            let (pr, dr) = (p.add(r * ld), dp.add(r * ld));
            let dl = _mm256_set1_ps(*delta.add(r));
            for j in (0..full).step_by(8) {
                let v = step(_mm256_loadu_ps(pr.add(j)), _mm256_loadu_ps(dr.add(j)), dl);
                _mm256_storeu_ps(dr.add(j), v);
            }
            if !cols.is_multiple_of(8) {
                let v =
                    step(_mm256_maskload_ps(pr.add(full), tail), _mm256_maskload_ps(dr.add(full), tail), dl);
                _mm256_maskstore_ps(dr.add(full), tail, v);
            }
        }
    }
}

/// `2^x` per lane for any `x`: [`exp2_nonpositive`] after clamping from above at 128, which
/// gives `+inf` there as the other ISAs' clamp does (NaN stays NaN through MINPS).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn exp2_any(x: __m256) -> __m256 {
    exp2_nonpositive(_mm256_min_ps(_mm256_set1_ps(crate::shapes::EXP2_HI), x))
}

/// The maximum of one chunk together with `m` and the sum of `exp2(c (x - that))` over the
/// chunk (see the crate's `max_sum_exp`); `(NaN, NaN)` when the chunk or `m` holds a NaN.
///
/// # Safety
///
/// AVX2 and FMA are available and `x` is readable for `len` floats.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn chunk_max_sum_exp(x: *const f32, len: usize, m: f32, scale: f32) -> (f32, f32) {
    let full = len - len % 32;
    let tail8 = len - len % 8;
    let tail = lanes(len % 8);
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    // The tail's masked-off lanes read as -inf, which no maximum takes.
    let tail_value = if len.is_multiple_of(8) {
        neg_inf
    } else {
        // SAFETY: the masked load reads lanes `0..len % 8` from `tail8`, inside the chunk.
        let v = unsafe { _mm256_maskload_ps(x.add(tail8), tail) };
        _mm256_blendv_ps(neg_inf, v, _mm256_castsi256_ps(tail))
    };
    // Four accumulators hide the latency of the maximum; the unordered compare remembers a
    // NaN, which MAXPS alone would drop.
    let mut mx = [neg_inf; 4];
    let mut nan = _mm256_setzero_ps();
    // SAFETY: every load is inside `len` floats from `x` (full vectors end at `tail8`; the
    // tail was loaded masked above).
    unsafe {
        for j in (0..full).step_by(32) {
            for (k, acc) in mx.iter_mut().enumerate() {
                let v = _mm256_loadu_ps(x.add(j + 8 * k));
                nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
                *acc = _mm256_max_ps(*acc, v);
            }
        }
        for j in (full..tail8).step_by(8) {
            let v = _mm256_loadu_ps(x.add(j));
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            mx[0] = _mm256_max_ps(mx[0], v);
        }
        let v = tail_value;
        nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        mx[0] = _mm256_max_ps(mx[0], v);
    }
    if _mm256_movemask_ps(nan) != 0 || m.is_nan() {
        return (f32::NAN, f32::NAN);
    }
    let top = hmax(_mm256_max_ps(_mm256_max_ps(mx[0], mx[1]), _mm256_max_ps(mx[2], mx[3])));
    let new_max = if m >= top { m } else { top };
    if new_max == f32::NEG_INFINITY {
        return (new_max, 0.0);
    }
    let (mv, cv) = (_mm256_set1_ps(new_max), _mm256_set1_ps(scale));
    // The exponent is `c * (x - m')`, as in the AVX-512 kernel (the difference is exact for
    // the terms near the maximum that carry the sum).
    let term = |v: __m256| exp2_any(_mm256_mul_ps(cv, _mm256_sub_ps(v, mv)));
    let mut sum = [_mm256_setzero_ps(); 4];
    // SAFETY: as for the maxima.
    unsafe {
        for j in (0..full).step_by(32) {
            for (k, acc) in sum.iter_mut().enumerate() {
                *acc = _mm256_add_ps(*acc, term(_mm256_loadu_ps(x.add(j + 8 * k))));
            }
        }
        for j in (full..tail8).step_by(8) {
            sum[0] = _mm256_add_ps(sum[0], term(_mm256_loadu_ps(x.add(j))));
        }
        if !len.is_multiple_of(8) {
            // Only the tail's own lanes are added (a masked lane's term is not 0 for c < 0).
            let t = _mm256_and_ps(term(tail_value), _mm256_castsi256_ps(tail));
            sum[0] = _mm256_add_ps(sum[0], t);
        }
    }
    let total = _mm256_add_ps(_mm256_add_ps(sum[0], sum[1]), _mm256_add_ps(sum[2], sum[3]));
    (new_max, hsum(total))
}

/// `y[j] = exp2(c * (x[j] - b))` for `j < len` (see the crate's `exp_rows`), 8 lanes at a time
/// with the tail masked.
///
/// # Safety
///
/// AVX2 and FMA are available, `x` is readable and `y` writable for `len` floats, and they do
/// not overlap.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp_row(x: *const f32, y: *mut f32, len: usize, b: f32, scale: f32) {
    let (bv, cv) = (_mm256_set1_ps(b), _mm256_set1_ps(scale));
    let full = len - len % 8;
    // SAFETY: full vectors end at `full <= len`, the tail is masked to `len`.
    unsafe {
        for j in (0..full).step_by(8) {
            let v = _mm256_loadu_ps(x.add(j));
            _mm256_storeu_ps(y.add(j), exp2_any(_mm256_mul_ps(cv, _mm256_sub_ps(v, bv))));
        }
        if !len.is_multiple_of(8) {
            let tail = lanes(len % 8);
            let v = _mm256_maskload_ps(x.add(full), tail);
            _mm256_maskstore_ps(y.add(full), tail, exp2_any(_mm256_mul_ps(cv, _mm256_sub_ps(v, bv))));
        }
    }
}

/// Eight f32 lanes rounded to nearest even to bf16 (as `convert::bf16_from_f32`: a NaN keeps
/// its top bits and is made quiet), returned as the bf16 patterns in the low half of each
/// 32-bit lane.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn round_bf16(x: __m256) -> __m256i {
    let bits = _mm256_castps_si256(x);
    let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
    let rounded =
        _mm256_srli_epi32::<16>(_mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)));
    let quiet = _mm256_or_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(0x40));
    let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
    _mm256_blendv_epi8(rounded, quiet, nan)
}

/// Eight f32 lanes rounded to the 16-bit type: `(patterns, their exact f32 values)`, the
/// patterns packed into 8 u16s in lane order; with `!BITS` only the f32 values (the patterns
/// are then not formed: a bf16's f32 value is the rounded word with its low half cleared).
///
/// # Safety
///
/// F16C is available when `F16`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn round_lanes<const F16: bool, const BITS: bool>(x: __m256) -> (__m128i, __m256) {
    if F16 {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
        (h, _mm256_cvtph_ps(h))
    } else if !BITS {
        (_mm_setzero_si128(), round_bf16_wide(x))
    } else {
        let b = round_bf16(x);
        let wide = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(b));
        // Pack the low halves of the eight 32-bit lanes into eight u16s, in order.
        let packed = _mm256_packus_epi32(b, b);
        let ordered = _mm256_permute4x64_epi64::<0b1000>(packed);
        (_mm256_castsi256_si128(ordered), wide)
    }
}

/// [`round_bf16`]'s values as f32 (each exactly a bf16): the bits rounded to nearest even at
/// bit 16 with the low half cleared, NaN kept (quieted).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn round_bf16_wide(x: __m256) -> __m256 {
    let bits = _mm256_castps_si256(x);
    let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
    let high = _mm256_set1_epi32(0xFFFF_0000_u32 as i32);
    let rounded =
        _mm256_and_si256(_mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)), high);
    let quiet = _mm256_and_si256(_mm256_or_si256(bits, _mm256_set1_epi32(0x0040_0000)), high);
    let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
    _mm256_castsi256_ps(_mm256_blendv_epi8(rounded, quiet, nan))
}

/// The rounded online-softmax step (see the crate's `softmax_update_rounded`): the f32 step of
/// [`softmax_update`] with every probability rounded to bf16 or f16 before it is written and
/// summed.
///
/// # Safety
///
/// AVX2 and FMA are available, F16C too when `is_f16`; the pointers satisfy
/// the crate's `softmax_update_rounded_unchecked` (with P at `p`, stride `ldp`), or P is S itself
/// (`RoundedTile::Wide(s)` with `ldp == lds`).
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)] // the step's tiles, each its own pointer
pub(crate) unsafe fn softmax_update_rounded(
    sh: &SoftmaxShape,
    ldp: usize,
    scale: f32,
    is_f16: bool,
    s: *const f32,
    row_max: *mut f32,
    row_sum: *mut f32,
    o: *mut f32,
    p: RoundedTile,
) {
    let state = (row_max, row_sum, o);
    // One loop per type and tile kind, so none tests them per vector.
    // SAFETY: forwarded from this function's contract.
    unsafe {
        match (is_f16, p) {
            (true, RoundedTile::Bits(pt)) => rounded_rows::<true, true>(sh, ldp, scale, s, state, pt.cast()),
            (true, RoundedTile::Wide(pt)) => rounded_rows::<true, false>(sh, ldp, scale, s, state, pt.cast()),
            (false, RoundedTile::Bits(pt)) => {
                rounded_rows::<false, true>(sh, ldp, scale, s, state, pt.cast())
            }
            (false, RoundedTile::Wide(pt)) => {
                rounded_rows::<false, false>(sh, ldp, scale, s, state, pt.cast())
            }
        }
    }
}

/// [`softmax_update_rounded`] for f16 (`F16`) or bf16, writing P as bit patterns (`BITS`,
/// `p` a `u16` tile) or as f32 values (`p` an f32 tile, perhaps S itself).
///
/// # Safety
///
/// As [`softmax_update_rounded`], with `p` pointing at the tile of the kind `BITS` names and
/// `(row_max, row_sum, o)` the step's state.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn rounded_rows<const F16: bool, const BITS: bool>(
    sh: &SoftmaxShape,
    ldp: usize,
    scale: f32,
    s: *const f32,
    (row_max, row_sum, o): (*mut f32, *mut f32, *mut f32),
    p: *mut u8,
) {
    let SoftmaxShape { rows, cols, lds, ldo, d } = *sh;
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    let sv = _mm256_set1_ps(scale);
    let cfull = cols - cols % 8;
    let ctail = lanes(cols % 8);
    let has_ctail = !cols.is_multiple_of(8);
    // Writes lanes `0..n` (all eight for `n == 8`) of row `r`'s probabilities from column `j`.
    let write = |r: usize, j: usize, n: usize, bits: __m128i, wide: __m256| {
        // SAFETY: the caller passes columns `j .. j + n` of row `r < rows`, inside P's extent.
        unsafe {
            if BITS {
                let at = p.cast::<u16>().add(r * ldp + j);
                if n == 8 {
                    _mm_storeu_si128(at.cast(), bits);
                } else {
                    let mut tmp = [0u16; 8];
                    _mm_storeu_si128(tmp.as_mut_ptr().cast(), bits);
                    std::ptr::copy_nonoverlapping(tmp.as_ptr(), at, n);
                }
            } else {
                let at = p.cast::<f32>().add(r * ldp + j);
                if n == 8 {
                    _mm256_storeu_ps(at, wide);
                } else {
                    _mm256_maskstore_ps(at, lanes(n), wide);
                }
            }
        }
    };
    for r in 0..rows {
        // SAFETY: row `r < rows` of S spans `cols` floats and of O `d` floats (`d > 0` before
        // `scale_row` takes it); full vectors end at `cfull`, and the tail is masked, so nothing
        // outside the rows is touched.
        unsafe {
            let srow = s.add(r * lds);
            let mut mx = neg_inf;
            for j in (0..cfull).step_by(8) {
                mx = _mm256_max_ps(mx, _mm256_mul_ps(_mm256_loadu_ps(srow.add(j)), sv));
            }
            if has_ctail {
                let x = _mm256_mul_ps(_mm256_maskload_ps(srow.add(cfull), ctail), sv);
                mx = _mm256_max_ps(mx, _mm256_blendv_ps(neg_inf, x, _mm256_castsi256_ps(ctail)));
            }
            let m_old = *row_max.add(r);
            let m_new = m_old.max(hmax(mx));
            if m_new == f32::NEG_INFINITY && !any_scaled_nan(srow, cols, scale) {
                // Nothing seen yet: P = 0 (the zero pattern in both types), the state kept.
                let zero = _mm256_setzero_ps();
                for j in (0..cfull).step_by(8) {
                    write(r, j, 8, _mm_setzero_si128(), zero);
                }
                if has_ctail {
                    write(r, cfull, cols % 8, _mm_setzero_si128(), zero);
                }
                continue;
            }
            let alpha = _mm256_cvtss_f32(exp2_nonpositive(_mm256_set1_ps(m_old - m_new)));
            let mv = _mm256_set1_ps(m_new);
            let mut sum = _mm256_setzero_ps();
            for j in (0..cfull).step_by(8) {
                let e = exp2_nonpositive(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(srow.add(j)), sv), mv));
                let (bits, wide) = round_lanes::<F16, BITS>(e);
                write(r, j, 8, bits, wide);
                sum = _mm256_add_ps(sum, wide);
            }
            if has_ctail {
                let x = _mm256_maskload_ps(srow.add(cfull), ctail);
                let e = exp2_nonpositive(_mm256_sub_ps(_mm256_mul_ps(x, sv), mv));
                let (bits, wide) = round_lanes::<F16, BITS>(e);
                write(r, cfull, cols % 8, bits, wide);
                sum = _mm256_add_ps(sum, _mm256_and_ps(wide, _mm256_castsi256_ps(ctail)));
            }
            *row_sum.add(r) = *row_sum.add(r) * alpha + hsum(sum);
            *row_max.add(r) = m_new;
            // alpha == 1 leaves O unchanged bit for bit, so skip the pass.
            if alpha != 1.0 && d > 0 {
                scale_row(o.add(r * ldo), d, alpha);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f32 values of the bf16 rounding match `half`'s round-to-nearest-even: every high
    /// half with low halves below, at and above the tie (even and odd), and NaN quieted.
    #[test]
    fn bf16_values_round_to_nearest_even() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("SKIPPED: bf16 wide rounding needs AVX2 and FMA");
            return;
        }
        let lows = [0x0000u32, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x4000, 0xC000];
        for high in 0..=0xFFFFu32 {
            let x: [f32; 8] = std::array::from_fn(|i| f32::from_bits(high << 16 | lows[i]));
            let mut got = [0f32; 8];
            // SAFETY: AVX2 and FMA are available (checked above).
            unsafe { _mm256_storeu_ps(got.as_mut_ptr(), round_bf16_wide(_mm256_loadu_ps(x.as_ptr()))) };
            for (g, &v) in got.iter().zip(&x) {
                let want = half::bf16::from_f32(v).to_f32();
                assert!(
                    g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                    "{:#010x}: {:#010x}, want {:#010x}",
                    v.to_bits(),
                    g.to_bits(),
                    want.to_bits()
                );
            }
        }
    }
}
