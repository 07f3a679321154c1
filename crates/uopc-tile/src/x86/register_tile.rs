//! The f32 register tile, written once over the vector width: the AVX-512 and AVX2 GEMM
//! micro-kernels are [`tile`] at 16 and at 8 lanes ([`F32Lanes`] for `__m512` and `__m256`),
//! each instantiated inside a function that enables its ISA.

use std::arch::x86_64::*;

use super::{MAX_BASES, ROWS_PER_BASE, prefetch_row};
use crate::tile::Tile;

/// One f32 vector register of a vector ISA, with the operations a register tile and the
/// activation rows (`super::activation`) take.
///
/// Every method is an intrinsic of the ISA: calling one requires that ISA's features (the
/// safety contract of each), and it is inlined only into a function that enables them.
pub(crate) trait F32Lanes: Copy {
    /// Floats per register.
    const LANES: usize;
    /// The ISA's selection of the first lanes of a register, for C's ragged last columns.
    type Mask: Copy;

    /// All lanes zero.
    ///
    /// # Safety
    ///
    /// The ISA's features are available.
    unsafe fn zero() -> Self;

    /// `LANES` floats from `p`.
    ///
    /// # Safety
    ///
    /// The ISA's features are available and `p` is readable for `LANES` floats.
    unsafe fn load(p: *const f32) -> Self;

    /// `x` in every lane.
    ///
    /// # Safety
    ///
    /// The ISA's features are available.
    unsafe fn splat(x: f32) -> Self;

    /// `a * b + c`, one rounding per lane.
    ///
    /// # Safety
    ///
    /// The ISA's features (FMA included) are available.
    unsafe fn mul_add(a: Self, b: Self, c: Self) -> Self;

    /// `a + b` per lane.
    ///
    /// # Safety
    ///
    /// The ISA's features are available.
    unsafe fn add(a: Self, b: Self) -> Self;

    /// Stores the lanes at `p`.
    ///
    /// # Safety
    ///
    /// The ISA's features are available and `p` is writable for `LANES` floats.
    unsafe fn store(p: *mut f32, v: Self);

    /// `a * b` per lane.
    ///
    /// # Safety
    ///
    /// The ISA's features are available.
    unsafe fn mul(a: Self, b: Self) -> Self;

    /// `a / b` per lane, correctly rounded.
    ///
    /// # Safety
    ///
    /// The ISA's features are available.
    unsafe fn div(a: Self, b: Self) -> Self;

    /// `-|x|` per lane: the sign bit set (a NaN stays NaN).
    ///
    /// # Safety
    ///
    /// The ISA's features are available.
    unsafe fn minus_abs(x: Self) -> Self;

    /// Per lane, `if_negative` where `z < 0` (false for NaN), else `otherwise`.
    ///
    /// # Safety
    ///
    /// The ISA's features are available.
    unsafe fn select_negative(z: Self, if_negative: Self, otherwise: Self) -> Self;

    /// `2^x` per lane for `x <= 0`, `-inf` or NaN: the softmax kernels' exponential of the ISA.
    ///
    /// # Safety
    ///
    /// The ISA's features are available.
    unsafe fn exp2_nonpositive(x: Self) -> Self;

    /// The first `cols` lanes (`1..LANES`).
    ///
    /// # Safety
    ///
    /// The ISA's features are available.
    unsafe fn first_lanes(cols: usize) -> Self::Mask;

    /// The lanes of `m` from `p`, zero elsewhere; memory past them is not touched.
    ///
    /// # Safety
    ///
    /// The ISA's features are available and `p` is readable for the lanes of `m`.
    unsafe fn load_lanes(p: *const f32, m: Self::Mask) -> Self;

    /// Stores the lanes of `m` at `p`; memory past them is not touched.
    ///
    /// # Safety
    ///
    /// The ISA's features are available and `p` is writable for the lanes of `m`.
    unsafe fn store_lanes(p: *mut f32, m: Self::Mask, v: Self);
}

impl F32Lanes for __m512 {
    const LANES: usize = 16;
    type Mask = __mmask16;

    #[inline(always)]
    unsafe fn zero() -> __m512 {
        // SAFETY: the caller's contract (AVX-512F).
        unsafe { _mm512_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_loadu_ps(p) }
    }

    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_set1_ps(x) }
    }

    #[inline(always)]
    unsafe fn mul_add(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }

    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_add_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        // SAFETY: the caller's contract.
        unsafe { _mm512_storeu_ps(p, v) }
    }

    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_mul_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn div(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_div_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn minus_abs(x: __m512) -> __m512 {
        // SAFETY: the caller's contract (AVX-512F has the integer OR; AVX512DQ's float one is
        // not assumed).
        unsafe { _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(x), _mm512_set1_epi32(i32::MIN))) }
    }

    #[inline(always)]
    unsafe fn select_negative(z: __m512, if_negative: __m512, otherwise: __m512) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe {
            let below = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(z, _mm512_setzero_ps());
            _mm512_mask_blend_ps(below, otherwise, if_negative)
        }
    }

    #[inline(always)]
    unsafe fn exp2_nonpositive(x: __m512) -> __m512 {
        // SAFETY: the caller's contract (the exponential's features are the ISA's).
        unsafe { super::exp2::nonpositive_x16(x) }
    }

    #[inline(always)]
    unsafe fn first_lanes(cols: usize) -> __mmask16 {
        if cols >= 16 { 0xFFFF } else { (1u16 << cols) - 1 }
    }

    #[inline(always)]
    unsafe fn load_lanes(p: *const f32, m: __mmask16) -> __m512 {
        // SAFETY: the caller's contract; masked-off lanes are not read.
        unsafe { _mm512_maskz_loadu_ps(m, p) }
    }

    #[inline(always)]
    unsafe fn store_lanes(p: *mut f32, m: __mmask16, v: __m512) {
        // SAFETY: the caller's contract; masked-off lanes are not written.
        unsafe { _mm512_mask_storeu_ps(p, m, v) }
    }
}

impl F32Lanes for __m256 {
    const LANES: usize = 8;
    type Mask = __m256i;

    #[inline(always)]
    unsafe fn zero() -> __m256 {
        // SAFETY: the caller's contract (AVX).
        unsafe { _mm256_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_loadu_ps(p) }
    }

    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_set1_ps(x) }
    }

    #[inline(always)]
    unsafe fn mul_add(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: the caller's contract (FMA).
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }

    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_add_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        // SAFETY: the caller's contract.
        unsafe { _mm256_storeu_ps(p, v) }
    }

    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_mul_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn div(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_div_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn minus_abs(x: __m256) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_or_ps(x, _mm256_set1_ps(-0.0)) }
    }

    #[inline(always)]
    unsafe fn select_negative(z: __m256, if_negative: __m256, otherwise: __m256) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe {
            _mm256_blendv_ps(otherwise, if_negative, _mm256_cmp_ps::<_CMP_LT_OQ>(z, _mm256_setzero_ps()))
        }
    }

    #[inline(always)]
    unsafe fn exp2_nonpositive(x: __m256) -> __m256 {
        // SAFETY: the caller's contract (AVX2 and FMA).
        unsafe { super::exp2::nonpositive_x8(x) }
    }

    #[inline(always)]
    unsafe fn first_lanes(cols: usize) -> __m256i {
        // Lane `i` is selected (all ones) when `i < cols`.
        // SAFETY: the caller's contract (AVX2).
        unsafe {
            let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            _mm256_cmpgt_epi32(_mm256_set1_epi32(cols.min(8) as i32), lane)
        }
    }

    #[inline(always)]
    unsafe fn load_lanes(p: *const f32, m: __m256i) -> __m256 {
        // SAFETY: the caller's contract; masked-off lanes are not read.
        unsafe { _mm256_maskload_ps(p, m) }
    }

    #[inline(always)]
    unsafe fn store_lanes(p: *mut f32, m: __m256i, v: __m256) {
        // SAFETY: the caller's contract; masked-off lanes are not written.
        unsafe { _mm256_maskstore_ps(p, m, v) }
    }
}

/// One k step of the tile: `V` vector loads of row `p` of B, `M` broadcasts of column `p` of A,
/// `M V` FMAs into `acc`.
///
/// # Safety
///
/// `W`'s ISA is available; `p < kc` of a tile whose operands are valid as [`Tile`] describes,
/// with strides `lda` and `ldb`.
#[inline(always)]
unsafe fn k_step<W: F32Lanes, const M: usize, const V: usize, const COLMAJOR: bool>(
    acc: &mut [[W; V]; M],
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    p: usize,
) {
    // SAFETY: the ISA is available (this function's contract).
    let mut bv = [unsafe { W::zero() }; V];
    for (v, bx) in bv.iter_mut().enumerate() {
        // SAFETY: row `p < kc` of the B panel has `LANES V` readable floats (Tile contract).
        *bx = unsafe { W::load(b.add(p * ldb + W::LANES * v)) };
    }
    for (i, row) in acc.iter_mut().enumerate() {
        // SAFETY: `A[i, p]` with `i < mr`, `p < kc` is inside A (Tile contract).
        let x = unsafe { if COLMAJOR { *a.add(p * lda + i) } else { *a.add(i * lda + p) } };
        // SAFETY: the ISA is available.
        let av = unsafe { W::splat(x) };
        for (r, &bx) in row.iter_mut().zip(&bv) {
            // SAFETY: the ISA is available.
            *r = unsafe { W::mul_add(av, bx, *r) };
        }
    }
}

/// All `kc` k steps of [`tile`] over a row-major A read in place: A's `M` rows are reached
/// from a base pointer per [`ROWS_PER_BASE`] rows, each advanced one float per step, so a
/// step costs the loads and multiply-adds and a few pointer increments rather than the
/// address arithmetic of twelve strided rows. The bases are opaque to the optimizer
/// (an empty `asm!` passes each through a register), which would otherwise fold them back
/// into one pointer and recompute every row's address in every step.
///
/// # Safety
///
/// As [`k_step`] for steps `0 .. kc`, with `M <= ROWS_PER_BASE * MAX_BASES`.
#[inline(always)]
unsafe fn row_major_steps<W: F32Lanes, const M: usize, const V: usize>(
    acc: &mut [[W; V]; M],
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    kc: usize,
) {
    let groups = M.div_ceil(ROWS_PER_BASE);
    let mut bases: [*const f32; MAX_BASES] = std::array::from_fn(|g| a.wrapping_add(g * ROWS_PER_BASE * lda));
    let offsets: [usize; ROWS_PER_BASE] = std::array::from_fn(|r| r * lda);
    let mut bp = b;
    for _ in 0..kc {
        for base in bases.iter_mut().take(groups) {
            *base = super::opaque(*base);
        }
        // SAFETY: the ISA is available (this function's contract), as below.
        let mut bv = [unsafe { W::zero() }; V];
        for (v, bx) in bv.iter_mut().enumerate() {
            // SAFETY: the current row of the B panel has `LANES V` readable floats.
            *bx = unsafe { W::load(bp.add(W::LANES * v)) };
        }
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: `A[i, p]` for the current step `p < kc` and row `i < M`: the base of
            // row `i`'s group has advanced `p` floats, and the row is `i % 5` rows past it.
            let x = unsafe { *bases[i / ROWS_PER_BASE].add(offsets[i % ROWS_PER_BASE]) };
            // SAFETY: the ISA is available.
            let av = unsafe { W::splat(x) };
            for (r, &bx) in row.iter_mut().zip(&bv) {
                // SAFETY: the ISA is available.
                *r = unsafe { W::mul_add(av, bx, *r) };
            }
        }
        for base in bases.iter_mut().take(groups) {
            *base = base.wrapping_add(1);
        }
        bp = bp.wrapping_add(ldb);
    }
}

/// k steps per iteration of [`tile`]'s loop over packed operands.
const PACKED_STEPS: usize = 4;

/// `M x (LANES V)` tile: per k step, `V` vector loads of B, `M` broadcasts of A, `M V` FMAs;
/// then C (+)= the accumulators.
///
/// # Safety
///
/// `W`'s ISA is available, `t` is valid as [`Tile`] describes with `M == t.mr` and
/// `LANES (V - 1) < t.nr <= LANES V`; the caller enables the ISA, so that these operations
/// inline into it.
#[inline(always)]
pub(crate) unsafe fn tile<W: F32Lanes, const M: usize, const V: usize, const COLMAJOR: bool>(t: &Tile) {
    let (a, lda, b, ldb) = (t.a, t.lda, t.b, t.ldb);
    // C's rows are read (or written) only after the k loop: start fetching them now, so a
    // tile whose C comes from L3 or memory does not stall on it at the end.
    for i in 0..M {
        prefetch_row(t.c.wrapping_add(i * t.ldc), t.nr);
    }
    // SAFETY: `W`'s ISA is available (this function's contract), as for every operation below.
    let zero = unsafe { W::zero() };
    let mut acc = [[zero; V]; M];
    let mut p = 0;
    if COLMAJOR && lda == M && ldb == W::LANES * V {
        // Packed operands: constant strides, so four steps per iteration address A and B by
        // immediate offsets, and the loop's own pointer and counter updates are paid once per
        // four steps instead of competing with every step's multiply-adds for issue slots. Each
        // step is its own scheduling region: interleaved, the steps' operands would need more
        // registers than the accumulators leave, and spill.
        while p + PACKED_STEPS <= t.kc {
            // SAFETY: steps `p .. p + 4 <= kc` of packed operands (Tile contract).
            unsafe {
                k_step::<W, M, V, true>(&mut acc, a, M, b, W::LANES * V, p);
                super::step_boundary();
                k_step::<W, M, V, true>(&mut acc, a, M, b, W::LANES * V, p + 1);
                super::step_boundary();
                k_step::<W, M, V, true>(&mut acc, a, M, b, W::LANES * V, p + 2);
                super::step_boundary();
                k_step::<W, M, V, true>(&mut acc, a, M, b, W::LANES * V, p + 3);
            }
            p += PACKED_STEPS;
        }
    }
    if COLMAJOR {
        while p < t.kc {
            // SAFETY: step `p < kc` (Tile contract).
            unsafe { k_step::<W, M, V, COLMAJOR>(&mut acc, a, lda, b, ldb, p) };
            p += 1;
        }
    } else {
        // SAFETY: all `kc` steps of a row-major A read in place (Tile contract).
        unsafe { row_major_steps::<W, M, V>(&mut acc, a, lda, b, ldb, t.kc) };
    }
    // A full tile's C rows take plain loads and stores: masked ones cost more on some cores
    // (on AMD a masked load waits behind the masked store before it), and the epilogue of a
    // tile whose C comes from far away is where a GEMM's time goes after the FMAs.
    if t.nr == W::LANES * V {
        for (i, row) in acc.iter().enumerate() {
            for (v, &r) in row.iter().enumerate() {
                // SAFETY: row `i < mr` of C, columns `LANES v .. LANES (v + 1) <= nr`.
                unsafe {
                    let dst = t.c.add(i * t.ldc + W::LANES * v);
                    let r = if t.accumulate { W::add(r, W::load(dst)) } else { r };
                    W::store(dst, r);
                }
            }
        }
        return;
    }
    for (i, row) in acc.iter().enumerate() {
        for (v, &r) in row.iter().enumerate() {
            let cols = t.nr - W::LANES * v;
            // SAFETY: row `i < mr` of C, columns `LANES v ..` up to `nr` (the last vector
            // masked to them); masked-off lanes are neither read nor written.
            unsafe {
                let dst = t.c.add(i * t.ldc + W::LANES * v);
                if cols >= W::LANES {
                    let r = if t.accumulate { W::add(r, W::load(dst)) } else { r };
                    W::store(dst, r);
                } else {
                    let m = W::first_lanes(cols);
                    let r = if t.accumulate { W::add(r, W::load_lanes(dst, m)) } else { r };
                    W::store_lanes(dst, m, r);
                }
            }
        }
    }
}
