//! The online-softmax tile update of FlashAttention-2, in the log2 domain; see [`softmax_update`].

use crate::error::check_len;
pub use crate::shapes::SoftmaxShape;
pub(crate) use crate::shapes::{EXP2_C, EXP2_HI, EXP2_ZERO_BELOW, any_scaled_nan};
use crate::{Isa, TileError};

/// Bound on the relative error of the kernels' `exp2` against exact `2^x` over `[-126, 0]`
/// (one f32 ulp), asserted by this crate's tests. Measured maxima over 636,000 points: 7.4e-8 on
/// the FMA paths, 9.5e-8 on the portable one.
pub const EXP2_MAX_REL_ERROR: f64 = 1.2e-7;

/// One online-softmax step of FlashAttention-2 over a score tile, with every buffer checked.
///
/// For each row `r` of a score tile `S[rows x cols]`:
///
/// ```text
/// m_new      = max(row_max[r], max_j S[r, j])
/// alpha      = exp2(row_max[r] - m_new)
/// S[r, j]    = exp2(S[r, j] - m_new)            (P overwrites S)
/// row_sum[r] = row_sum[r] * alpha + sum_j S[r, j]
/// O[r, 0..d] *= alpha
/// row_max[r] = m_new
/// ```
///
/// The caller has already scaled the scores by `log2(e) / sqrt(D)`, so only `exp2` is needed. A
/// row that has seen nothing but `-inf` (`m_new == -inf`) would compute `exp2(-inf - -inf)`; it
/// is defined instead as `alpha = 1` and `P = 0`, which keeps masked-out rows finite. A NaN
/// score makes its row's `P` (and so its sum and, through `P · V`, its output) NaN, as a NaN
/// key does in an exact softmax; a `+inf` score gives `exp2(inf - inf)`, NaN, likewise.
///
/// `exp2` is computed as `2^n * p(f)`, `p` a degree-6 polynomial fitted for minimax
/// *relative* error and evaluated by Horner's rule (with FMA on the vector ISAs). On AVX2 and
/// the portable path `n = round(x)` (ties to even) and `f = x - n` in `[-0.5, 0.5]`, after
/// clamping `x` from below at `-127` and, on the portable path, from above at `128` (the
/// update's arguments are never positive, so AVX2 spends no instruction on it); `2^n` is
/// assembled from exponent bits, so where `x` is clamped from above `x >= 127.5` gives `+inf`.
/// On AVX-512 `n = floor(x)` and `f = x - n` in `[0, 1)` (one VREDUCEPS), `p` is fitted on
/// that interval with `p(0) = 1`, and VSCALEFPS applies `2^n`, overflowing to `+inf` from
/// `x = 128`. Everywhere `x < -126.5` gives exactly 0, NaN gives NaN, and `(-126.5, -126)`
/// gives subnormals. `x = -126.5` itself gives 0, or on AVX2 (whose `exp2` spends no
/// instruction on that one point) `2^-126.5` as a subnormal. Over `[-126, 0]` the measured
/// relative error is below [`EXP2_MAX_REL_ERROR`] on every ISA.
///
/// O must hold finite values wherever it gets rescaled (`0 * inf` is NaN), so start it at zero
/// together with `row_max = -inf`, `row_sum = 0`.
///
/// # Errors
///
/// Nothing is read or written when one is returned: [`TileError::IsaUnavailable`] if this CPU
/// lacks `isa`; the errors of [`SoftmaxShape::extents`]; [`TileError::BufferTooSmall`] if a
/// slice is too short (`row_max` and `row_sum` need `rows` elements).
///
/// # Examples
///
/// Two steps over one row: the second block raises the running maximum from 1 to 3, so the
/// running sum and output are rescaled by `alpha = 2^(1 - 3)`.
///
/// ```rust
/// use uopc_tile::{Isa, SoftmaxShape, TileError, softmax_update};
///
/// let sh = SoftmaxShape::dense(1, 2, 1);
/// let (mut row_max, mut row_sum, mut o) = ([f32::NEG_INFINITY], [0.0f32], [0.0f32]);
///
/// let mut s = [1.0, f32::NEG_INFINITY]; // a masked-out second key
/// softmax_update(Isa::detect(), &sh, &mut s, &mut row_max, &mut row_sum, &mut o)?;
/// let close = |x: f32, y: f32| (x - y).abs() <= 1e-6 * y.abs();
/// assert!(close(s[0], 1.0) && s[1] == 0.0 && close(row_sum[0], 1.0));
/// assert_eq!(row_max, [1.0]);
///
/// o[0] = 8.0; // the caller adds P · V into O between steps
/// let mut s = [3.0, 2.0];
/// softmax_update(Isa::detect(), &sh, &mut s, &mut row_max, &mut row_sum, &mut o)?;
/// assert!(close(s[0], 1.0) && close(s[1], 0.5));
/// assert!(close(row_sum[0], 0.25 + 1.5) && close(o[0], 2.0));
/// assert_eq!(row_max, [3.0]);
///
/// let too_short = softmax_update(Isa::Portable, &sh, &mut s, &mut [], &mut row_sum, &mut o);
/// assert_eq!(too_short, Err(TileError::BufferTooSmall { operand: "row_max", needed: 1, len: 0 }));
/// # Ok::<(), TileError>(())
/// ```
pub fn softmax_update(
    isa: Isa,
    sh: &SoftmaxShape,
    s: &mut [f32],
    row_max: &mut [f32],
    row_sum: &mut [f32],
    o: &mut [f32],
) -> Result<(), TileError> {
    softmax_update_scaled(isa, sh, 1.0, s, row_max, row_sum, o)
}

/// [`softmax_update`] on the scores scaled by `scale`: every `S[r, j]` reads as
/// `scale * S[r, j]` (one multiply per score, fused with the subtraction of the maximum on the
/// vector ISAs), so a caller can
/// leave its queries unscaled and read them in place. `-inf` scores stay `-inf` only for a
/// positive `scale` (a zero or negative one turns them into NaN or `+inf`), so masks applied
/// before this step must then be applied to scaled scores. A `scale` of 1 gives
/// [`softmax_update`]'s results bit for bit.
///
/// # Errors
///
/// Those of [`softmax_update`].
///
/// # Examples
///
/// ```rust
/// use uopc_tile::{Isa, SoftmaxShape, TileError, softmax_update_scaled};
///
/// let sh = SoftmaxShape::dense(1, 2, 1);
/// let (mut row_max, mut row_sum, mut o) = ([f32::NEG_INFINITY], [0.0f32], [0.0f32]);
/// let mut s = [2.0, 4.0]; // scaled by 0.5: 1 and 2
/// softmax_update_scaled(Isa::detect(), &sh, 0.5, &mut s, &mut row_max, &mut row_sum, &mut o)?;
/// assert_eq!(row_max, [2.0]);
/// assert!((s[0] - 0.5).abs() <= 1e-6 && (s[1] - 1.0).abs() <= 1e-6);
/// # Ok::<(), TileError>(())
/// ```
pub fn softmax_update_scaled(
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
    // SAFETY: the ISA is available, each slice covers its extent, and the four are distinct
    // unique borrows.
    unsafe {
        softmax_update_unchecked(
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

/// One online-softmax step on raw pointers, without checks: [`softmax_update_scaled`]'s.
///
/// # Safety
///
/// * `isa.available()` is true.
/// * With `[ns, no] = sh.extents()` (which must be `Ok`): `s` is valid for reads and writes of
///   `ns` f32s, `o` of `no`, `row_max` and `row_sum` of `sh.rows` each; all aligned for `f32`
///   (null is fine for an extent of 0).
/// * The four regions are pairwise disjoint and nothing else accesses them during the call.
pub unsafe fn softmax_update_unchecked(
    isa: Isa,
    sh: &SoftmaxShape,
    scale: f32,
    s: *mut f32,
    row_max: *mut f32,
    row_sum: *mut f32,
    o: *mut f32,
) {
    // With no columns the update is the identity: m_new = row_max, alpha = 1, nothing to add.
    if sh.rows == 0 || sh.cols == 0 {
        return;
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller guarantees AVX-512 is available and the buffer extents.
        Isa::Avx512 => unsafe { crate::x86::avx512::softmax_update(sh, scale, s, row_max, row_sum, o) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX2+FMA.
        Isa::Avx2Fma => unsafe { crate::x86::avx2::softmax_update(sh, scale, s, row_max, row_sum, o) },
        // SAFETY: the caller guarantees the buffer extents; no CPU features are needed.
        _ => unsafe { portable(sh, scale, s, row_max, row_sum, o) },
    }
}

/// The shape the flat softmax entries receive as the `i64`s `[rows, cols, lds, ldo, d]`, and
/// whether its four f32 operands `[s, row_max, row_sum, o]` may be used: `None` when a size is
/// negative, a leading dimension too small, an extent overflows, or an operand is null while
/// its buffer is non-empty (the checks every flat entry makes before touching memory).
pub(crate) fn flat_update_shape(dims: [i64; 5], operands: [*const f32; 4]) -> Option<SoftmaxShape> {
    let [rows, cols, lds, ldo, d] = dims.map(|x| usize::try_from(x).ok());
    let sh = SoftmaxShape { rows: rows?, cols: cols?, lds: lds?, ldo: ldo?, d: d? };
    let [ns, no] = sh.extents().ok()?;
    let [s, row_max, row_sum, o] = operands;
    let null = (ns > 0 && s.is_null())
        || (no > 0 && o.is_null())
        || (sh.rows > 0 && (row_max.is_null() || row_sum.is_null()));
    (!null).then_some(sh)
}

/// Flat C-ABI softmax update for JIT-compiled code, with the fastest ISA of this CPU.
///
/// Arguments, in order: `s`, `row_max`, `row_sum`, `o` (pointers to f32), then the `i64`s
/// `rows`, `cols`, `lds`, `ldo`, `d`, meaning the [`SoftmaxShape`] fields, and `scale`, the
/// bits of [`softmax_update_scaled`]'s f32 factor in the low 32 bits.
///
/// Returns 0 on success, or -1 without touching memory if a size is negative, a leading
/// dimension is too small, an extent overflows, or a pointer is null while its buffer is
/// non-empty.
///
/// # Safety
///
/// The pointers must satisfy the contract of [`softmax_update_unchecked`] for the decoded shape.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // a flat register-passed ABI is the point of this entry
pub unsafe extern "C" fn uopc_tile_softmax_update_f32(
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
) -> i32 {
    let operands = [s.cast_const(), row_max.cast_const(), row_sum.cast_const(), o.cast_const()];
    let Some(sh) = flat_update_shape([rows, cols, lds, ldo, d], operands) else { return -1 };
    let scale = f32::from_bits(scale as u32);
    // SAFETY: the detected ISA is available; extents and pointers are the caller's contract.
    unsafe { softmax_update_unchecked(Isa::detect(), &sh, scale, s, row_max, row_sum, o) };
    0
}

/// Scalar `2^x` by the same method as the vector kernels (separate multiply and add, since a
/// fused multiply-add is a slow library call on targets without one).
#[inline]
pub(crate) fn exp2_scalar(x: f32) -> f32 {
    // NaN stays NaN, as in the vector kernels (the comparison below is false for it).
    if x.is_nan() {
        return x;
    }
    if x <= EXP2_ZERO_BELOW {
        return 0.0;
    }
    let x = x.min(EXP2_HI);
    let n = x.round_ties_even();
    let f = x - n;
    let mut p = EXP2_C[6];
    for &c in EXP2_C[..6].iter().rev() {
        p = p * f + c;
    }
    // `n` is an integer in [-127, 128], so the biased exponent is in [0, 255].
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    p * scale
}

/// The portable update: the same algorithm one float at a time.
///
/// # Safety
///
/// The contract of [`softmax_update_unchecked`], with `rows > 0` and `cols > 0`.
unsafe fn portable(
    sh: &SoftmaxShape,
    scale: f32,
    s: *mut f32,
    row_max: *mut f32,
    row_sum: *mut f32,
    o: *mut f32,
) {
    let SoftmaxShape { rows, cols, lds, ldo, d } = *sh;
    // SAFETY: `row_max` and `row_sum` hold `rows` floats, disjoint from S and O.
    let (row_max, row_sum) = unsafe {
        (std::slice::from_raw_parts_mut(row_max, rows), std::slice::from_raw_parts_mut(row_sum, rows))
    };
    for r in 0..rows {
        // SAFETY: row `r` of S spans `cols` floats at `r * lds`.
        let srow = unsafe { std::slice::from_raw_parts_mut(s.add(r * lds), cols) };
        let m_old = row_max[r];
        let m_new = srow.iter().fold(m_old, |m, &x| m.max(x * scale));
        // SAFETY: `srow` spans `cols` floats.
        if m_new == f32::NEG_INFINITY && !unsafe { any_scaled_nan(srow.as_ptr(), cols, scale) } {
            srow.fill(0.0);
            continue;
        }
        let alpha = exp2_scalar(m_old - m_new);
        let mut sum = 0.0f32;
        for x in srow.iter_mut() {
            *x = exp2_scalar(*x * scale - m_new);
            sum += *x;
        }
        row_sum[r] = row_sum[r] * alpha + sum;
        row_max[r] = m_new;
        if alpha != 1.0 && d > 0 {
            // SAFETY: row `r` of O spans `d` floats at `r * ldo` (d > 0, so O is non-empty).
            let orow = unsafe { std::slice::from_raw_parts_mut(o.add(r * ldo), d) };
            for x in orow {
                *x *= alpha;
            }
        }
    }
}
