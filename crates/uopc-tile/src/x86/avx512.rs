//! AVX-512 kernels: a 12 x 32 register tile (24 zmm accumulators) and the softmax update.

use std::arch::x86_64::*;

use super::exp2::nonpositive_x16 as exp2_nonpositive;
use super::{RoundedTile, prefetch_row};
use crate::shapes::ScoreTileShape;
use crate::shapes::{SoftmaxShape, any_scaled_nan};
use crate::tile::{HalfFloat, Tile, TileKernel};

/// The AVX-512 GEMM kernel.
pub(crate) struct Kernel;

impl TileKernel for Kernel {
    // 12 rows: 24 FMAs per k step against 2 loads of B and 12 broadcasts of A, so two 512-bit
    // FMA ports stay busy beside the loads (8 rows leave the broadcasts' share of the ports
    // too large on Intel's two-port cores); 24 accumulators, 2 B vectors and a broadcast fit
    // the 32 registers.
    const MR: usize = 12;
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

    unsafe fn pack_a_rows(dst: *mut f32, src: *const f32, lda: usize, kc: usize, mr: usize) {
        // SAFETY: forwarded from the trait contract (AVX-512 implies AVX); the strip is
        // `pack_bt`'s panel of width MR.
        unsafe { super::pack_bt::<12>(dst, src, lda, kc, mr) }
    }

    unsafe fn pack_a_rows_half<H: HalfFloat>(dst: *mut f32, src: *const H, lda: usize, kc: usize, mr: usize) {
        // SAFETY: forwarded from the trait contract; the strip is `pack_bt`'s panel of width MR.
        unsafe { H::pack_bt::<12>(dst, src, lda, kc, mr) }
    }

    unsafe fn pack_b_half<H: HalfFloat>(dst: *mut f32, src: *const H, ldb: usize, kc: usize, nr: usize) {
        // SAFETY: forwarded from the trait contract.
        unsafe { H::pack_b::<32>(dst, src, ldb, kc, nr) }
    }

    unsafe fn pack_bt_half<H: HalfFloat>(dst: *mut f32, src: *const H, ldb: usize, kc: usize, nr: usize) {
        // SAFETY: forwarded from the trait contract.
        unsafe { H::pack_bt::<32>(dst, src, ldb, kc, nr) }
    }
}

/// Picks the monomorphized tile for `t`'s row count, width and A layout.
///
/// # Safety
///
/// AVX-512F and AVX-512DQ are available and `t` is valid as [`Tile`] describes, with `mr <= 12`,
/// `nr <= 32`.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
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
    by_rows!(1 2 3 4 5 6 7 8 9 10 11 12);
}

/// Lane mask selecting the first `cols` (clamped to 16) floats of a vector.
#[inline]
pub(crate) fn lanes(cols: usize) -> __mmask16 {
    if cols >= 16 { 0xFFFF } else { (1u16 << cols) - 1 }
}

/// `M x (16 V)` tile: the shared register tile at 16 lanes.
///
/// # Safety
///
/// As [`tile`], with `M == t.mr` and `V == 2` iff `t.nr > 16`.
// Out of line: each register tile keeps a symbol of its own, which `cargo xtask mca` and
// profilers name (one call per tile of `kc` steps costs nothing measurable).
#[inline(never)]
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
unsafe fn tile_n<const M: usize, const V: usize, const COLMAJOR: bool>(t: &Tile) {
    // SAFETY: forwarded from this function's contract; this function enables the ISA the
    // 512-bit lanes need, so the shared body's operations inline here.
    unsafe { super::register_tile::tile::<__m512, M, V, COLMAJOR>(t) }
}

/// Independent chains the softmax steps keep per row: a max or a sum carried through one
/// register would make every vector of the row wait out the previous one's latency.
const ROW_CHAINS: usize = 4;

/// `f(j)` over a row's full vectors (`j = 0, 16, .. < cfull`, each `f` called once, in
/// order) folded by `combine(acc, f(j))` into [`ROW_CHAINS`] accumulators started at `init`,
/// which are then combined. The array indices are constants in the unrolled body, so the
/// accumulators stay in registers.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
#[inline]
fn row_fold(
    cfull: usize,
    init: __m512,
    combine: impl Fn(__m512, __m512) -> __m512,
    mut f: impl FnMut(usize) -> __m512,
) -> __m512 {
    let mut acc = [init; ROW_CHAINS];
    let whole = cfull - cfull % (16 * ROW_CHAINS);
    for j in (0..whole).step_by(16 * ROW_CHAINS) {
        for (t, a) in acc.iter_mut().enumerate() {
            *a = combine(*a, f(j + 16 * t));
        }
    }
    for j in (whole..cfull).step_by(16) {
        acc[0] = combine(acc[0], f(j));
    }
    combine(combine(acc[0], acc[1]), combine(acc[2], acc[3]))
}

/// The maximum of `S[j]`, or of `sv * S[j]` with `sv`, over a row's `cols` floats (`-inf`
/// when there are none; NaNs skipped): the full vectors in [`ROW_CHAINS`] chains, then the
/// masked tail.
///
/// # Safety
///
/// `srow` is readable for `cols` floats.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
#[inline]
unsafe fn row_max_times(srow: *const f32, cols: usize, sv: Option<__m512>) -> f32 {
    let cfull = cols - cols % 16;
    let times = |x: __m512| match sv {
        Some(sv) => _mm512_mul_ps(x, sv),
        None => x,
    };
    // SAFETY: every load reads 16 floats below `cfull`.
    let scaled = |j: usize| times(unsafe { _mm512_loadu_ps(srow.add(j)) });
    let mut mx = row_fold(cfull, _mm512_set1_ps(f32::NEG_INFINITY), |m, x| _mm512_max_ps(m, x), scaled);
    let tail = lanes(cols % 16);
    if tail != 0 {
        // SAFETY: the load is masked to the `cols - cfull` floats left.
        let x = times(unsafe { _mm512_maskz_loadu_ps(tail, srow.add(cfull)) });
        mx = _mm512_mask_max_ps(mx, tail, mx, x);
    }
    _mm512_reduce_max_ps(mx)
}

/// Rows whose maxima the softmax steps take before any of their exponentials. A row's
/// exponentials wait for its maximum, a chain of dependent maxima and shuffles; taken one row
/// at a time, those chains leave the FMA ports idle between rows, while the maxima of several
/// rows are independent and overlap.
const ROWS_AHEAD: usize = 8;

/// The maxima of `scale * S[r, j]` over each row of a score tile, for a softmax step that
/// asks for rows `0, 1, ..` in order: taken [`ROWS_AHEAD`] rows at a time.
///
/// A positive finite scale is applied once, to each maximum: rounding is monotonic, so the
/// largest rounded product is the rounded product of the largest score, and the pass over a
/// row costs one operation per vector instead of two.
struct RowMaxima {
    s: *const f32,
    lds: usize,
    cols: usize,
    rows: usize,
    scale: f32,
    /// Whether `scale` is applied to the maxima rather than to every score.
    scale_after: bool,
    ahead: [f32; ROWS_AHEAD],
}

impl RowMaxima {
    /// The maxima of the `rows x cols` tile `s` (leading dimension `lds`) at `scale`.
    fn new(s: *const f32, (rows, cols, lds): (usize, usize, usize), scale: f32) -> RowMaxima {
        let scale_after = scale > 0.0 && scale.is_finite();
        RowMaxima { s, lds, cols, rows, scale, scale_after, ahead: [f32::NEG_INFINITY; ROWS_AHEAD] }
    }

    /// The maximum of row `r`; at a multiple of [`ROWS_AHEAD`], those of the rows up to the
    /// next one are taken first.
    ///
    /// # Safety
    ///
    /// Every row `r < rows` of the tile is readable for `cols` floats at `r * lds`; `r` follows
    /// the row asked for before.
    #[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
    #[inline]
    unsafe fn of(&mut self, r: usize) -> f32 {
        if r.is_multiple_of(ROWS_AHEAD) {
            let sv = (!self.scale_after).then(|| _mm512_set1_ps(self.scale));
            let rows = self.rows.saturating_sub(r).min(ROWS_AHEAD);
            for (i, m) in self.ahead.iter_mut().enumerate().take(rows) {
                // SAFETY: row `r + i < rows`, readable by the contract.
                let max = unsafe { row_max_times(self.s.add((r + i) * self.lds), self.cols, sv) };
                *m = if self.scale_after { max * self.scale } else { max };
            }
        }
        self.ahead[r % ROWS_AHEAD]
    }
}

/// `f(j)` summed over a row's full vectors (`j = 0, 16, .. < cfull`) in [`ROW_CHAINS`]
/// partial sums, each vector's `f` called once, in order.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
#[inline]
fn row_sum_of(cfull: usize, f: impl FnMut(usize) -> __m512) -> __m512 {
    row_fold(cfull, _mm512_setzero_ps(), |s, x| _mm512_add_ps(s, x), f)
}

/// `2^x` per lane for any `x`: the softmax steps' exponential serves positive arguments too,
/// since VSCALEFPS overflows to `inf` where `2^x` does (`x >= 128`, and `+inf`); see the
/// crate's `softmax_update` for its accuracy.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
#[inline]
fn exp2(x: __m512) -> __m512 {
    exp2_nonpositive(x)
}

/// The softmax update over all rows (see the crate's `softmax_update`).
///
/// # Safety
///
/// AVX-512F and AVX-512DQ are available and the pointers satisfy the crate's
/// `softmax_update_unchecked`.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
pub(crate) unsafe fn softmax_update(
    sh: &SoftmaxShape,
    scale: f32,
    s: *mut f32,
    row_max: *mut f32,
    row_sum: *mut f32,
    o: *mut f32,
) {
    let SoftmaxShape { rows, cols, lds, ldo, d } = *sh;
    let sv = _mm512_set1_ps(scale);
    let (cfull, dfull) = (cols - cols % 16, d - d % 16);
    let (ctail, dtail) = (lanes(cols % 16), lanes(d % 16));
    let mut maxima = RowMaxima::new(s, (rows, cols, lds), scale);
    for r in 0..rows {
        // SAFETY: row `r < rows` of S spans `cols` floats and of O `d` floats; full vectors end
        // at `cfull`/`dfull`, and the tails are masked, so nothing outside the rows is touched.
        unsafe {
            let srow = s.add(r * lds);
            let m_old = *row_max.add(r);
            let m_new = m_old.max(maxima.of(r));
            // A NaN among `-inf`s must not take this shortcut (see `any_scaled_nan`).
            if m_new == f32::NEG_INFINITY && !any_scaled_nan(srow, cols, scale) {
                // Nothing seen yet: P = 0, and the running sum and output stay as they are.
                for j in (0..cfull).step_by(16) {
                    _mm512_storeu_ps(srow.add(j), _mm512_setzero_ps());
                }
                _mm512_mask_storeu_ps(srow.add(cfull), ctail, _mm512_setzero_ps());
                continue;
            }
            let alpha = _mm512_cvtss_f32(exp2_nonpositive(_mm512_set1_ps(m_old - m_new)));
            let mv = _mm512_set1_ps(m_new);
            // Rounded product minus the max, not a fused multiply-subtract: the max is a rounded
            // product, so the fused form leaves the max's own rounding error (up to half an ulp
            // of the score, 3e4 at 1e12) in its exponent and turns its 1 into 0 or inf.
            let mut sum = row_sum_of(cfull, |j| {
                let e = exp2_nonpositive(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(srow.add(j)), sv), mv));
                _mm512_storeu_ps(srow.add(j), e);
                e
            });
            if ctail != 0 {
                let e = exp2_nonpositive(_mm512_sub_ps(
                    _mm512_mul_ps(_mm512_maskz_loadu_ps(ctail, srow.add(cfull)), sv),
                    mv,
                ));
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

/// The `vfpclassps` category of positive and negative subnormals.
const SUBNORMAL: i32 = 0x20;

/// Defines a rounded softmax step with the given documentation, name and CPU features;
/// `$native_bf16` rounds to bf16 with `vcvtneps2bf16` (the features must then include
/// AVX512_BF16 and AVX512DQ), otherwise with integer operations. One body, two instances, as
/// each needs its own `target_feature`.
macro_rules! rounded_step {
    ($(#[$doc:meta])* $name:ident, $features:literal, $native_bf16:literal) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        // The blocks for the AVX512_BF16 and AVX512DQ operations are needed in one instance.
        #[allow(clippy::too_many_arguments, unused_unsafe)]
        pub(crate) unsafe fn $name(
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
            let SoftmaxShape { rows, cols, lds, ldo, d } = *sh;
            let sv = _mm512_set1_ps(scale);
            let (cfull, dfull) = (cols - cols % 16, d - d % 16);
            let (ctail, dtail) = (lanes(cols % 16), lanes(d % 16));
            // 16 probabilities rounded: the 16-bit patterns, and the rounded values widened back.
            let round = |e: __m512| -> (__m256i, __m512) {
                if is_f16 {
                    let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(e);
                    (h, _mm512_cvtph_ps(h))
                } else if $native_bf16
                    // SAFETY: reached only in the instance that enables AVX512_BF16 and
                    // AVX512DQ.
                    && unsafe { _mm512_fpclass_ps_mask::<SUBNORMAL>(e) } == 0
                {
                    // SAFETY: as above; a bf16 vector is 16 u16 bit patterns.
                    let h: __m256i = unsafe { std::mem::transmute(_mm512_cvtneps_pbh(e)) };
                    (h, _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h))))
                } else {
                    let bits = crate::x86::bf16::narrow_bf16(_mm512_castps_si512(e));
                    (_mm512_cvtepi32_epi16(bits), _mm512_castsi512_ps(_mm512_slli_epi32::<16>(bits)))
                }
            };
            // `n <= 16` probabilities of row `r` from column `j` on, as bits `h` or values `back`. A
            // 16-bit tail goes through a local vector (a masked 16-bit store needs AVX-512BW, which
            // this ISA level does not require).
            let store = |r: usize, j: usize, h: __m256i, back: __m512, n: usize| match p {
                RoundedTile::Bits(p) => {
                    // SAFETY: row `r` of P holds `cols` u16s from `r * ldp`, and `j + n <= cols`.
                    let dst = unsafe { p.add(r * ldp + j) };
                    if n == 16 {
                        // SAFETY: as above, 16 of them.
                        unsafe { _mm256_storeu_si256(dst.cast(), h) };
                    } else {
                        let mut buf = [0u16; 16];
                        // SAFETY: `buf` holds 16 u16s (32 bytes); `dst` holds `n` writable u16s,
                        // disjoint from `buf`.
                        unsafe {
                            _mm256_storeu_si256(buf.as_mut_ptr().cast(), h);
                            std::ptr::copy_nonoverlapping(buf.as_ptr(), dst, n);
                        }
                    }
                }
                // SAFETY: row `r` of P holds `cols` floats from `r * ldp`, and `j + n <= cols`; the
                // store is masked to the `n` of them.
                RoundedTile::Wide(p) => unsafe { _mm512_mask_storeu_ps(p.add(r * ldp + j), lanes(n), back) },
            };
            let ntail = cols % 16;
            let mut maxima = RowMaxima::new(s, (rows, cols, lds), scale);
            for r in 0..rows {
                // SAFETY: row `r < rows` of S spans `cols` floats and of O `d` floats; full vectors
                // end at `cfull`/`dfull`, and the tails are masked, so nothing outside the rows is
                // touched (`store` keeps to P's rows). A chunk of S is loaded before P's is stored,
                // so P may be S itself; each row's maximum is taken before its P is stored.
                unsafe {
                    let srow = s.add(r * lds);
                    let m_old = *row_max.add(r);
                    let m_new = m_old.max(maxima.of(r));
                    // A NaN among `-inf`s must not take this shortcut (see `any_scaled_nan`).
                    if m_new == f32::NEG_INFINITY && !any_scaled_nan(srow, cols, scale) {
                        // Nothing seen yet: P = 0, and the running sum and output stay as they are.
                        for j in (0..cfull).step_by(16) {
                            store(r, j, _mm256_setzero_si256(), _mm512_setzero_ps(), 16);
                        }
                        if ntail != 0 {
                            store(r, cfull, _mm256_setzero_si256(), _mm512_setzero_ps(), ntail);
                        }
                        continue;
                    }
                    let alpha = _mm512_cvtss_f32(exp2_nonpositive(_mm512_set1_ps(m_old - m_new)));
                    let mv = _mm512_set1_ps(m_new);
                    let mut sum = row_sum_of(cfull, |j| {
                        let e = exp2_nonpositive(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(srow.add(j)), sv), mv));
                        let (h, back) = round(e);
                        store(r, j, h, back, 16);
                        back
                    });
                    if ntail != 0 {
                        let e = exp2_nonpositive(_mm512_sub_ps(
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(ctail, srow.add(cfull)), sv),
                            mv,
                        ));
                        let (h, back) = round(e);
                        store(r, cfull, h, back, ntail);
                        sum = _mm512_mask_add_ps(sum, ctail, sum, back);
                    }
                    *row_sum.add(r) = *row_sum.add(r) * alpha + _mm512_reduce_add_ps(sum);
                    *row_max.add(r) = m_new;
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
    };
}

rounded_step!(
    /// The rounded softmax step over all rows (see the crate's `softmax_update_rounded` and
    /// the crate's `softmax_update_rounded_in_place`): each probability is rounded to f16 when
    /// `is_f16`, else to bf16, and stored into `p`; the running sum adds the rounded values.
    ///
    /// # Safety
    ///
    /// AVX-512F and AVX-512DQ are available and the pointers satisfy
    /// the crate's `softmax_update_rounded_unchecked` (with `p` the 16-bit tile's bits), or
    /// the crate's `softmax_update_rounded_in_place_unchecked` (with `p` the score tile).
    softmax_update_rounded,
    "avx512f,avx512dq,avx2,fma",
    false
);

rounded_step!(
    /// [`softmax_update_rounded`] rounding to bf16 with `vcvtneps2bf16`: one instruction where
    /// the other takes ten integer operations, with the same bits. The instruction reads a
    /// subnormal as zero, so a vector holding one (an exponent just above the cut to zero) is
    /// rounded the other way.
    ///
    /// # Safety
    ///
    /// As [`softmax_update_rounded`], and AVX512_BF16 and AVX512DQ are available.
    softmax_update_rounded_native_bf16,
    "avx512f,avx512dq,avx2,fma,avx512bf16",
    true
);

/// The probabilities recomputed from the log-sum-exp (see the crate's `softmax_recompute`).
///
/// # Safety
///
/// AVX-512F and AVX-512DQ are available and the pointers satisfy the crate's
/// `softmax_recompute_unchecked`.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
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

/// `dP = P * (dP - delta)`, 0 where `P == 0` (see the crate's `softmax_grad`).
///
/// # Safety
///
/// AVX-512F and AVX-512DQ are available and the pointers satisfy the crate's
/// `softmax_grad_unchecked`.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
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

/// `max(m, max_j x_j)` (NaN-propagating) and `sum_j exp2(c (x_j - that))` over one chunk of
/// `len` floats (see the crate's `max_sum_exp`): a pass of vector maxima, then one of vector
/// exponentials over the same floats, still in L1. With the maximum `-inf` the sum is 0 and
/// unused; with it NaN, both are NaN.
///
/// # Safety
///
/// AVX-512F and AVX-512DQ are available and `x` is readable for `len` floats.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
pub(crate) unsafe fn chunk_max_sum_exp(x: *const f32, len: usize, m: f32, scale: f32) -> (f32, f32) {
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    let full = len - len % 64;
    let tail16 = len - len % 16;
    let tail = lanes(len % 16);
    // Four accumulators hide the latency of the maximum; the unordered mask remembers a NaN,
    // which MAXPS alone would drop.
    let mut mx = [neg_inf; 4];
    let mut nan: __mmask16 = 0;
    // SAFETY: every load below is inside `len` floats from `x` (full vectors end at `tail16`,
    // the tail is masked).
    unsafe {
        for j in (0..full).step_by(64) {
            for (k, acc) in mx.iter_mut().enumerate() {
                let v = _mm512_loadu_ps(x.add(j + 16 * k));
                nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
                *acc = _mm512_max_ps(*acc, v);
            }
        }
        for j in (full..tail16).step_by(16) {
            let v = _mm512_loadu_ps(x.add(j));
            nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
            mx[0] = _mm512_max_ps(mx[0], v);
        }
        if tail != 0 {
            let v = _mm512_mask_loadu_ps(neg_inf, tail, x.add(tail16));
            nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
            mx[0] = _mm512_max_ps(mx[0], v);
        }
    }
    if nan != 0 || m.is_nan() {
        return (f32::NAN, f32::NAN);
    }
    let top = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(mx[0], mx[1]), _mm512_max_ps(mx[2], mx[3])));
    let new_max = if m >= top { m } else { top };
    if new_max == f32::NEG_INFINITY {
        return (new_max, 0.0);
    }
    let (mv, cv) = (_mm512_set1_ps(new_max), _mm512_set1_ps(scale));
    // The exponent is `c * (x - m')`, not `c x - c m'`: the difference is exact for the terms
    // near the maximum that carry the sum, where a fused `c x - c m'` would round `c x` at the
    // magnitude of `x`.
    let term = |v: __m512| exp2_nonpositive(_mm512_mul_ps(cv, _mm512_sub_ps(v, mv)));
    let mut sum = [_mm512_setzero_ps(); 4];
    // SAFETY: as for the maxima.
    unsafe {
        for j in (0..full).step_by(64) {
            // The floats after this chunk (the caller's next chunk) are requested from memory
            // while the exponentials run on this one in L1, so the reads keep going; a
            // prefetch never faults, so one past the row's end is harmless.
            prefetch_row(x.wrapping_add(len + j), 64);
            for (k, acc) in sum.iter_mut().enumerate() {
                *acc = _mm512_add_ps(*acc, term(_mm512_loadu_ps(x.add(j + 16 * k))));
            }
        }
        for j in (full..tail16).step_by(16) {
            sum[0] = _mm512_add_ps(sum[0], term(_mm512_loadu_ps(x.add(j))));
        }
        if tail != 0 {
            let v = _mm512_mask_loadu_ps(neg_inf, tail, x.add(tail16));
            sum[0] = _mm512_mask_add_ps(sum[0], tail, sum[0], term(v));
        }
    }
    let total = _mm512_add_ps(_mm512_add_ps(sum[0], sum[1]), _mm512_add_ps(sum[2], sum[3]));
    (new_max, _mm512_reduce_add_ps(total))
}

/// `y[j] = exp2(c * (x[j] - b))` for `j < len` (see the crate's `exp_rows`), 16 lanes at a time
/// with the tail masked.
///
/// # Safety
///
/// AVX-512F and AVX-512DQ are available, `x` is readable and `y` writable for `len` floats, and
/// they do not overlap.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
pub(crate) unsafe fn exp_row(x: *const f32, y: *mut f32, len: usize, b: f32, scale: f32) {
    let (bv, cv) = (_mm512_set1_ps(b), _mm512_set1_ps(scale));
    let full = len - len % 16;
    // SAFETY: full vectors end at `full <= len`, the tail is masked to `len`.
    unsafe {
        for j in (0..full).step_by(16) {
            _mm512_storeu_ps(y.add(j), exp2(_mm512_mul_ps(cv, _mm512_sub_ps(_mm512_loadu_ps(x.add(j)), bv))));
        }
        let tail = lanes(len % 16);
        if tail != 0 {
            let v = _mm512_maskz_loadu_ps(tail, x.add(full));
            _mm512_mask_storeu_ps(y.add(full), tail, exp2(_mm512_mul_ps(cv, _mm512_sub_ps(v, bv))));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs one rounded step (`native` picks the `vcvtneps2bf16` instance) over the scores
    /// `s` (`rows x cols`, dense) with `d = 20` columns of O; returns the bf16 bits, the
    /// running maxima and sums, and O, as bit patterns.
    fn step(native: bool, s: &[f32], rows: usize, cols: usize) -> (Vec<u16>, Vec<u32>, Vec<u32>, Vec<u32>) {
        let d = 20;
        let sh = SoftmaxShape { rows, cols, lds: cols, ldo: d, d };
        let (mut m, mut l) = (vec![-3.0f32; rows], vec![0.5f32; rows]);
        let mut o: Vec<f32> = (0..rows * d).map(|i| i as f32 * 0.25 - 7.0).collect();
        let mut p = vec![0u16; rows * cols];
        let tile = RoundedTile::Bits(p.as_mut_ptr());
        let args = (s.as_ptr(), m.as_mut_ptr(), l.as_mut_ptr(), o.as_mut_ptr());
        // SAFETY: the caller checked the features of the instance it asks for; every buffer
        // holds what the shape says.
        unsafe {
            if native {
                softmax_update_rounded_native_bf16(
                    &sh, cols, 1.0, false, args.0, args.1, args.2, args.3, tile,
                );
            } else {
                softmax_update_rounded(&sh, cols, 1.0, false, args.0, args.1, args.2, args.3, tile);
            }
        }
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect();
        (p, bits(m), bits(l), bits(o))
    }

    /// The `vcvtneps2bf16` instance gives the same bits as the integer rounding: ties,
    /// exponentials just above the cut to zero (subnormal before rounding, which the
    /// instruction would read as zero), at and below it, `-inf`, a NaN row, and a tail.
    #[test]
    fn native_bf16_rounding_matches_the_integer_rounding() {
        if !(is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bf16")
            && is_x86_feature_detected!("avx512dq"))
        {
            eprintln!("SKIPPED: the vcvtneps2bf16 step needs AVX-512F, AVX512_BF16 and AVX512DQ");
            return;
        }
        let cols = 37;
        let mut s = Vec::new();
        // Row 0: the maximum 0 and exponents down past the cut, each in a vector of its own
        // or sharing one with ordinary values.
        let edge = [0.0, -126.3, -126.45, -126.5, -126.0, -125.9, -127.0, -150.0, f32::NEG_INFINITY];
        s.extend((0..cols).map(|j| edge.get(j % 20).copied().unwrap_or(-(j as f32) * 0.37)));
        // Rows 1-3: ordinary scores, some whose exponentials sit on bf16 ties.
        for r in 1..4 {
            s.extend(
                (0..cols).map(|j| ((r * 31 + j * 17) % 23) as f32 * 0.29 - 3.0 - (j % 3) as f32 / 256.0),
            );
        }
        // Row 4: a NaN.
        s.extend((0..cols).map(|j| if j == 5 { f32::NAN } else { j as f32 }));
        let rows = s.len() / cols;
        assert_eq!(step(true, &s, rows, cols), step(false, &s, rows, cols));
        // The edge row did hold an exponential the instruction would have flushed.
        let e = 2f32.powf(-126.3);
        assert!(e > 0.0 && e < f32::MIN_POSITIVE);
    }
}
