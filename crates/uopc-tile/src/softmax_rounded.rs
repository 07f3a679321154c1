//! The online-softmax step of 16-bit attention: [`softmax_update`](crate::softmax_update) with
//! the scores scaled first and the probabilities written, rounded to bf16 or f16, into their
//! own tile for the `P · V` GEMM; see [`softmax_update_rounded`].

use half::{bf16, f16};

use crate::error::check_len;
use crate::softmax::{any_scaled_nan, exp2_scalar, flat_update_shape};
#[cfg(target_arch = "x86_64")]
use crate::x86::RoundedTile;
use crate::{Isa, SoftmaxShape, TileError, convert};

/// A 16-bit type the probabilities of [`softmax_update_rounded`] are rounded to: `bf16` or
/// `f16` (sealed; the kernels have a conversion for exactly these two).
pub trait RoundedProb: Copy + sealed::Sealed {
    /// Whether this is `f16` (else `bf16`), for the dispatch to the vector kernels.
    const IS_F16: bool;
    /// `x` rounded to nearest even.
    fn round(x: f32) -> Self;
    /// The value as f32, exactly.
    fn widen(self) -> f32;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

impl RoundedProb for bf16 {
    const IS_F16: bool = false;
    fn round(x: f32) -> Self {
        convert::bf16_from_f32(x)
    }
    fn widen(self) -> f32 {
        convert::bf16_to_f32(self)
    }
}

impl RoundedProb for f16 {
    const IS_F16: bool = true;
    fn round(x: f32) -> Self {
        convert::f16_from_f32(x)
    }
    fn widen(self) -> f32 {
        convert::f16_to_f32(self)
    }
}

/// One online-softmax step over a score tile whose probabilities feed a 16-bit GEMM, with
/// every buffer checked.
///
/// For each row `r` of the score tile `S[rows x cols]` (leading dimension `sh.lds`, read only):
///
/// ```text
/// x_j        = scale * S[r, j]
/// m_new      = max(row_max[r], max_j x_j)
/// alpha      = exp2(row_max[r] - m_new)
/// P[r, j]    = round(exp2(x_j - m_new))          (bf16 or f16, leading dimension ldp)
/// row_sum[r] = row_sum[r] * alpha + sum_j P[r, j]
/// O[r, 0..d] *= alpha
/// row_max[r] = m_new
/// ```
///
/// The running sum adds the rounded probabilities, the very weights the `P · V` GEMM applies,
/// so `O / row_sum` is an exact weighted mean of the value rows with those weights (a constant
/// value column comes out unchanged). Rounding is to nearest even; each weight is off by at
/// most 2^-9 (bf16) or 2^-11 (f16) of itself, f16 flushing weights below 2^-24 to 0 (they are
/// below 2^-24 of the row's largest, which is 1). `exp2` and the dead-row, NaN and infinity
/// rules are those of [`crate::softmax_update`]: a row whose scaled scores and max are all
/// `-inf` gets `P = 0` and keeps `row_sum` and O; a NaN score makes its row NaN.
///
/// The scale is applied here rather than folded into a 16-bit query tile because rounding
/// `scale * q` to 16 bits would add a rounding error per query element that f32 attention does
/// not have.
///
/// # Errors
///
/// Nothing is read or written when one is returned: [`TileError::IsaUnavailable`] if this CPU
/// lacks `isa`; the errors of [`SoftmaxShape::extents`] and [`TileError::LeadingDim`] for
/// `ldp < cols` (operand `"p"`); [`TileError::BufferTooSmall`] if a slice is too short.
///
/// # Examples
///
/// ```rust
/// use half::bf16;
/// use uopc_tile::{Isa, SoftmaxShape, TileError, softmax_update_rounded};
///
/// let sh = SoftmaxShape::dense(1, 2, 1);
/// let (mut row_max, mut row_sum, mut o) = ([f32::NEG_INFINITY], [0.0f32], [0.0f32]);
/// let mut p = [bf16::ZERO; 2];
/// // Scores 2 and 0 at scale 0.5: base-2 scores 1 and 0, so P = [1, 0.5].
/// softmax_update_rounded(Isa::detect(), &sh, 2, 0.5, &[2.0, 0.0], &mut row_max, &mut row_sum, &mut o, &mut p)?;
/// assert_eq!(p, [bf16::from_f32(1.0), bf16::from_f32(0.5)]);
/// assert_eq!((row_max, row_sum), ([1.0], [1.5]));
/// # Ok::<(), TileError>(())
/// ```
#[allow(clippy::too_many_arguments)] // the four tiles of the f32 step, its P tile and the scale
pub fn softmax_update_rounded<T: RoundedProb>(
    isa: Isa,
    sh: &SoftmaxShape,
    ldp: usize,
    scale: f32,
    s: &[f32],
    row_max: &mut [f32],
    row_sum: &mut [f32],
    o: &mut [f32],
    p: &mut [T],
) -> Result<(), TileError> {
    if !isa.available() {
        return Err(TileError::IsaUnavailable(isa));
    }
    let [ns, no] = sh.extents()?;
    let np = crate::error::span("p", sh.rows, sh.cols, ldp)?;
    check_len("s", ns, s.len())?;
    check_len("row_max", sh.rows, row_max.len())?;
    check_len("row_sum", sh.rows, row_sum.len())?;
    check_len("o", no, o.len())?;
    check_len("p", np, p.len())?;
    // SAFETY: the ISA is available, each slice covers its extent, and the writable ones are
    // distinct unique borrows (S, the only shared one, is only read).
    unsafe {
        softmax_update_rounded_unchecked(
            isa,
            sh,
            ldp,
            scale,
            s.as_ptr(),
            row_max.as_mut_ptr(),
            row_sum.as_mut_ptr(),
            o.as_mut_ptr(),
            p.as_mut_ptr(),
        )
    };
    Ok(())
}

/// [`softmax_update_rounded`] on raw pointers, without checks.
///
/// # Safety
///
/// * `isa.available()` is true.
/// * With `[ns, no] = sh.extents()` (which must be `Ok`) and `ldp >= cols` when `rows > 1`: `s`
///   is valid for reads of `ns` f32s, `o` for reads and writes of `no`, `row_max` and `row_sum`
///   of `sh.rows` each, `p` for writes of `(rows - 1) * ldp + cols` elements; all aligned.
/// * The regions are pairwise disjoint and nothing else writes them during the call.
#[allow(clippy::too_many_arguments)] // as the checked entry point
pub unsafe fn softmax_update_rounded_unchecked<T: RoundedProb>(
    isa: Isa,
    sh: &SoftmaxShape,
    ldp: usize,
    scale: f32,
    s: *const f32,
    row_max: *mut f32,
    row_sum: *mut f32,
    o: *mut f32,
    p: *mut T,
) {
    if sh.rows == 0 || sh.cols == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller guarantees the ISA and the extents; T is a transparent u16.
    if unsafe {
        vector_step(isa, sh, ldp, scale, T::IS_F16, s, row_max, row_sum, o, RoundedTile::Bits(p.cast()))
    } {
        return;
    }
    // SAFETY: forwarded; no CPU features are needed. Row `r` of P spans `cols` elements at
    // `r * ldp` (the caller's contract).
    unsafe { portable::<T>(sh, scale, s, row_max, row_sum, o, |r, j, q| *p.add(r * ldp + j) = q) }
}

/// [`softmax_update_rounded`] with P written over S: the same step, every probability rounded
/// to `T` (bf16 or f16) and stored back as the f32 it widens to (exactly), with every buffer
/// checked.
///
/// This is the form for a `P · V` GEMM that reads an f32 A in place (f16 attention, whose
/// GEMM widens only its B): P then needs no 16-bit tile of its own, nor a widening pass per
/// key block, and the weights it applies are still the rounded ones the row sum adds, so
/// the numerics are those of [`softmax_update_rounded`] to the bit (same rounding, same sum).
///
/// # Errors
///
/// Nothing is read or written when one is returned: [`TileError::IsaUnavailable`] if this CPU
/// lacks `isa`; the errors of [`SoftmaxShape::extents`]; [`TileError::BufferTooSmall`] if a
/// slice is too short.
///
/// # Examples
///
/// ```rust
/// use half::f16;
/// use uopc_tile::{Isa, SoftmaxShape, TileError, softmax_update_rounded_in_place};
///
/// let sh = SoftmaxShape::dense(1, 2, 1);
/// let (mut row_max, mut row_sum, mut o) = ([f32::NEG_INFINITY], [0.0f32], [0.0f32]);
/// // Base-2 scores 0 and -0.1 at scale 1: P = [1, 2^-0.1] with 2^-0.1 rounded to f16.
/// let mut s = [0.0f32, -0.1];
/// softmax_update_rounded_in_place::<f16>(Isa::detect(), &sh, 1.0, &mut s, &mut row_max, &mut row_sum, &mut o)?;
/// assert_eq!(s, [1.0, f16::from_f32(2f32.powf(-0.1)).to_f32()]);
/// assert_eq!(row_sum, [1.0 + s[1]]);
/// # Ok::<(), TileError>(())
/// ```
pub fn softmax_update_rounded_in_place<T: RoundedProb>(
    isa: Isa,
    sh: &SoftmaxShape,
    scale: f32,
    s: &mut [f32],
    row_max: &mut [f32],
    row_sum: &mut [f32],
    o: &mut [f32],
) -> Result<(), TileError> {
    if !isa.available() {
        return Err(TileError::IsaUnavailable(isa));
    }
    let [ns, no] = sh.extents()?;
    check_len("s", ns, s.len())?;
    check_len("row_max", sh.rows, row_max.len())?;
    check_len("row_sum", sh.rows, row_sum.len())?;
    check_len("o", no, o.len())?;
    // SAFETY: the ISA is available, each slice covers its extent, and they are distinct unique
    // borrows.
    unsafe {
        softmax_update_rounded_in_place_unchecked::<T>(
            isa,
            sh,
            scale,
            s.as_mut_ptr(),
            row_max.as_mut_ptr(),
            row_sum.as_mut_ptr(),
            o.as_mut_ptr(),
        )
    };
    Ok(())
}

/// [`softmax_update_rounded_in_place`] on raw pointers, without checks.
///
/// # Safety
///
/// * `isa.available()` is true.
/// * With `[ns, no] = sh.extents()` (which must be `Ok`): `s` is valid for reads and writes of
///   `ns` f32s, `o` of `no`, `row_max` and `row_sum` of `sh.rows` each; all aligned.
/// * The regions are pairwise disjoint and nothing else accesses them during the call.
pub unsafe fn softmax_update_rounded_in_place_unchecked<T: RoundedProb>(
    isa: Isa,
    sh: &SoftmaxShape,
    scale: f32,
    s: *mut f32,
    row_max: *mut f32,
    row_sum: *mut f32,
    o: *mut f32,
) {
    if sh.rows == 0 || sh.cols == 0 {
        return;
    }
    let lds = sh.lds;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller guarantees the ISA and the extents; P is S itself (same stride),
    // which the kernels allow.
    if unsafe { vector_step(isa, sh, lds, scale, T::IS_F16, s, row_max, row_sum, o, RoundedTile::Wide(s)) } {
        return;
    }
    // SAFETY: forwarded; no CPU features are needed. Score `(r, j)` is at `r * lds + j`, read
    // (in both of the row's passes) before `write` replaces it.
    unsafe { portable::<T>(sh, scale, s, row_max, row_sum, o, |r, j, q| *s.add(r * lds + j) = q.widen()) }
}

/// Runs the rounded step on `isa`'s vector kernel, writing `tile`, and returns `true`; or
/// returns `false` without touching memory when `isa` has none (portable, or AVX2 without
/// F16C for f16).
///
/// # Safety
///
/// `isa` is available; the pointers satisfy [`softmax_update_rounded_unchecked`] with P at
/// `tile` (stride `ldp`), or `tile` is `Wide(s)` with `ldp == sh.lds`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)] // as the entry points
unsafe fn vector_step(
    isa: Isa,
    sh: &SoftmaxShape,
    ldp: usize,
    scale: f32,
    is_f16: bool,
    s: *const f32,
    row_max: *mut f32,
    row_sum: *mut f32,
    o: *mut f32,
    tile: RoundedTile,
) -> bool {
    match isa {
        // SAFETY: forwarded; AVX-512 with AVX512_BF16 and AVX512DQ is available.
        Isa::Avx512 if !is_f16 && native_bf16_rounding() => unsafe {
            crate::x86::avx512::softmax_update_rounded_native_bf16(
                sh, ldp, scale, is_f16, s, row_max, row_sum, o, tile,
            )
        },
        // SAFETY: forwarded; AVX-512 is available.
        Isa::Avx512 => unsafe {
            crate::x86::avx512::softmax_update_rounded(sh, ldp, scale, is_f16, s, row_max, row_sum, o, tile)
        },
        // SAFETY: forwarded; AVX2 and FMA are available, and the guard checked F16C for f16.
        Isa::Avx2Fma if !is_f16 || std::arch::is_x86_feature_detected!("f16c") => unsafe {
            crate::x86::avx2::softmax_update_rounded(sh, ldp, scale, is_f16, s, row_max, row_sum, o, tile)
        },
        _ => return false,
    }
    true
}

/// Whether the AVX-512 step may round to bf16 with `vcvtneps2bf16`.
#[cfg(target_arch = "x86_64")]
fn native_bf16_rounding() -> bool {
    std::arch::is_x86_feature_detected!("avx512bf16") && std::arch::is_x86_feature_detected!("avx512dq")
}

/// The portable step: the same algorithm one float at a time (AVX2 machines take it too),
/// handing each rounded probability of row `r`, column `j` to `write(r, j, p)`.
///
/// Every score of a row is read (for its maximum) before the row's first `write`, and score
/// `(r, j)` again just before `write(r, j, _)`, so `write` may replace the scores themselves.
///
/// # Safety
///
/// The contract of [`softmax_update_rounded_unchecked`] for S, O and the row scalars, with
/// `rows > 0` and `cols > 0`; `write` is sound for every `r < rows`, `j < cols`.
unsafe fn portable<T: RoundedProb>(
    sh: &SoftmaxShape,
    scale: f32,
    s: *const f32,
    row_max: *mut f32,
    row_sum: *mut f32,
    o: *mut f32,
    mut write: impl FnMut(usize, usize, T),
) {
    let SoftmaxShape { rows, cols, lds, ldo, d } = *sh;
    // Scores through raw reads: `write` may alias them, so no slice of S is held across it.
    // SAFETY: `(r, j)` with `r < rows`, `j < cols` lies in S's extent (the caller's contract).
    let score = |r: usize, j: usize| unsafe { *s.add(r * lds + j) };
    for r in 0..rows {
        // SAFETY: `row_max` and `row_sum` hold `rows` floats, disjoint from the tiles.
        let (max_r, sum_r) = unsafe { (&mut *row_max.add(r), &mut *row_sum.add(r)) };
        let m_old = *max_r;
        let m_new = (0..cols).fold(m_old, |m, j| m.max(scale * score(r, j)));
        // SAFETY: row `r < rows` of S spans `cols` floats (the caller's contract).
        if m_new == f32::NEG_INFINITY && !unsafe { any_scaled_nan(s.add(r * lds), cols, scale) } {
            for j in 0..cols {
                write(r, j, T::round(0.0));
            }
            continue;
        }
        let alpha = exp2_scalar(m_old - m_new);
        let mut sum = 0.0f32;
        for j in 0..cols {
            let q = T::round(exp2_scalar(scale * score(r, j) - m_new));
            write(r, j, q);
            sum += q.widen();
        }
        *sum_r = *sum_r * alpha + sum;
        *max_r = m_new;
        if alpha != 1.0 && d > 0 {
            // SAFETY: row `r` of O spans `d` floats at `r * ldo`.
            let orow = unsafe { std::slice::from_raw_parts_mut(o.add(r * ldo), d) };
            for x in orow {
                *x *= alpha;
            }
        }
    }
}

/// Flat C-ABI rounded softmax step for JIT-compiled code, with the fastest ISA of this CPU.
///
/// Arguments, in order: `s`, `row_max`, `row_sum`, `o` (pointers to f32), `p` (pointer to
/// bf16 bits, or f16 bits when `is_f16` is 1), then the `i64`s `rows`, `cols`, `lds`, `ldo`,
/// `d`, `ldp`, `scale` (the f32's bit pattern in the low 32 bits) and `is_f16` (0 or 1).
///
/// Returns 0 on success, or -1 without touching memory if a size is negative, a leading
/// dimension is too small, an extent overflows, `is_f16` is neither 0 nor 1, or a pointer is
/// null while its buffer is non-empty.
///
/// # Safety
///
/// The pointers must satisfy [`softmax_update_rounded_unchecked`] for the decoded shape.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // a flat register-passed ABI is the point of this entry
pub unsafe extern "C" fn uopc_tile_softmax_update_rounded(
    s: *const f32,
    row_max: *mut f32,
    row_sum: *mut f32,
    o: *mut f32,
    p: *mut u16,
    rows: i64,
    cols: i64,
    lds: i64,
    ldo: i64,
    d: i64,
    ldp: i64,
    scale: i64,
    is_f16: i64,
) -> i32 {
    let operands = [s, row_max.cast_const(), row_sum.cast_const(), o.cast_const()];
    let Some(sh) = flat_update_shape([rows, cols, lds, ldo, d], operands) else { return -1 };
    let Ok(ldp) = usize::try_from(ldp) else { return -1 };
    let Ok(np) = crate::error::span("p", sh.rows, sh.cols, ldp) else { return -1 };
    if (np > 0 && p.is_null()) || !(0..=1).contains(&is_f16) {
        return -1;
    }
    let scale = f32::from_bits(scale as u32);
    // SAFETY: the detected ISA is available; extents and pointers are the caller's contract.
    unsafe {
        if is_f16 == 1 {
            softmax_update_rounded_unchecked::<f16>(
                Isa::detect(),
                &sh,
                ldp,
                scale,
                s,
                row_max,
                row_sum,
                o,
                p.cast(),
            )
        } else {
            softmax_update_rounded_unchecked::<bf16>(
                Isa::detect(),
                &sh,
                ldp,
                scale,
                s,
                row_max,
                row_sum,
                o,
                p.cast(),
            )
        }
    };
    0
}

/// Flat C-ABI in-place rounded softmax step for JIT-compiled code, with the fastest ISA of
/// this CPU: [`softmax_update_rounded_in_place`], P written over S.
///
/// Arguments, in order: `s`, `row_max`, `row_sum`, `o` (pointers to f32), then the `i64`s
/// `rows`, `cols`, `lds`, `ldo`, `d`, `scale` (the f32's bit pattern in the low 32 bits) and
/// `is_f16` (1: round to f16, 0: to bf16).
///
/// Returns 0 on success, or -1 without touching memory if a size is negative, a leading
/// dimension is too small, an extent overflows, `is_f16` is neither 0 nor 1, or a pointer is
/// null while its buffer is non-empty.
///
/// # Safety
///
/// The pointers must satisfy [`softmax_update_rounded_in_place_unchecked`] for the decoded
/// shape.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // a flat register-passed ABI is the point of this entry
pub unsafe extern "C" fn uopc_tile_softmax_update_rounded_in_place(
    s: *mut f32,
    row_max: *mut f32,
    row_sum: *mut f32,
    o: *mut f32,
    rows: i64,
    cols: i64,
    lds: i64,
    ldo: i64,
    d: i64,
    scale: i64,
    is_f16: i64,
) -> i32 {
    let operands = [s.cast_const(), row_max.cast_const(), row_sum.cast_const(), o.cast_const()];
    let Some(sh) = flat_update_shape([rows, cols, lds, ldo, d], operands) else { return -1 };
    if !(0..=1).contains(&is_f16) {
        return -1;
    }
    let scale = f32::from_bits(scale as u32);
    // SAFETY: the detected ISA is available; extents and pointers are the caller's contract.
    unsafe {
        if is_f16 == 1 {
            softmax_update_rounded_in_place_unchecked::<f16>(
                Isa::detect(),
                &sh,
                scale,
                s,
                row_max,
                row_sum,
                o,
            )
        } else {
            softmax_update_rounded_in_place_unchecked::<bf16>(
                Isa::detect(),
                &sh,
                scale,
                s,
                row_max,
                row_sum,
                o,
            )
        }
    };
    0
}
