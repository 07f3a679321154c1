//! The online step of a row logsumexp: the running maximum and the sum of exponentials shifted
//! by it, over a block of rows read in place; see [`max_sum_exp`].
//!
//! Both kernels take each row in chunks that stay in L1: a pass for the chunk's maximum, then
//! one for its sum of `exp2`, so each element costs one exponential (against the rescaling per
//! element of a one-pass running update) and the running state changes once per chunk.

use crate::error::check_len;
use crate::softmax::exp2_scalar;
use crate::softmax_grad::ScoreTileShape;
use crate::{Isa, TileError};

/// Elements of a row taken per chunk: the chunk is read twice (maximum, then sum), so 8 KiB
/// keeps the second read in L1.
pub(crate) const CHUNK: usize = 2048;

/// One online logsumexp step over a block of rows, updating each row's running state.
///
/// `x` is `rows x cols` with row stride `ld` and is only read. For each row `r`, with
/// `m = row_max[r]`, `l = row_sum[r]` and `c = scale`:
///
/// * `m' = max(m, max_j x[r, j])`, a NaN anywhere (in `m` or the row) giving `m' = NaN`;
/// * `l' = l * a + sum_j exp2(c * (x[r, j] - m'))` with `a = exp2(c * (m - m'))`, except that
///   `a = 1` when `m == m'` (so a row whose maximum stays `+inf` is not rescaled by
///   `exp2(inf - inf)`), and a row with `m' = -inf` (its old maximum and every element `-inf`)
///   keeps `l` (rather than `exp2(-inf - -inf)`, NaN);
/// * `row_max[r] = m'`, `row_sum[r] = l'`.
///
/// The maximum stays in the units of `x` (unscaled), so it is exactly the row's maximum; only
/// the exponent is scaled, which with `c = log2(e)` makes `l` the natural `sum exp(x - m)` and
/// with `c = 1` the base-2 one. Starting from `m = -inf`, `l = 0` and feeding a row in blocks,
/// the state ends at the row's maximum and `sum_j exp2(c (x_j - max))` for any `c > 0`. A NaN
/// in a row makes both values NaN; a `+inf` with no NaN gives `m = +inf` and `l = NaN` (the
/// terms `exp2(inf - inf)`), which a caller wanting `logsumexp = +inf` tests for through `m`.
/// `exp2` is the one of [`crate::softmax_update`], with the same accuracy
/// ([`crate::EXP2_MAX_REL_ERROR`]); the sum is accumulated in f32.
///
/// # Errors
///
/// Nothing is read or written when one is returned: [`TileError::IsaUnavailable`] if this
/// CPU lacks `isa`; the errors of [`ScoreTileShape::extent`] (operand `"x"`);
/// [`TileError::BufferTooSmall`] if `x`, `row_max` or `row_sum` (which need `rows` elements
/// each) is too short.
///
/// # Examples
///
/// ```rust
/// use uopc_tile::{Isa, ScoreTileShape, TileError, max_sum_exp};
///
/// // logsumexp of the row [1, 2, 3] in two steps: [1, 2], then [3].
/// let (mut m, mut l) = ([f32::NEG_INFINITY], [0.0f32]);
/// let c = std::f32::consts::LOG2_E;
/// max_sum_exp(Isa::detect(), &ScoreTileShape::dense(1, 2), c, &[1.0, 2.0], &mut m, &mut l)?;
/// max_sum_exp(Isa::detect(), &ScoreTileShape::dense(1, 1), c, &[3.0], &mut m, &mut l)?;
/// let lse = m[0] as f64 + (l[0] as f64).ln();
/// let expect = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln();
/// assert_eq!(m[0], 3.0);
/// assert!((lse - expect).abs() < 1e-6);
/// # Ok::<(), TileError>(())
/// ```
pub fn max_sum_exp(
    isa: Isa,
    sh: &ScoreTileShape,
    scale: f32,
    x: &[f32],
    row_max: &mut [f32],
    row_sum: &mut [f32],
) -> Result<(), TileError> {
    if !isa.available() {
        return Err(TileError::IsaUnavailable(isa));
    }
    let n = crate::error::span("x", sh.rows, sh.cols, sh.ld)?;
    check_len("x", n, x.len())?;
    check_len("row_max", sh.rows, row_max.len())?;
    check_len("row_sum", sh.rows, row_sum.len())?;
    // SAFETY: the ISA is available, the slices cover their extents, and the two written ones
    // are unique borrows (so they overlap nothing else).
    unsafe { max_sum_exp_unchecked(isa, sh, scale, x.as_ptr(), row_max.as_mut_ptr(), row_sum.as_mut_ptr()) };
    Ok(())
}

/// [`max_sum_exp`] on raw pointers, without checks.
///
/// # Safety
///
/// * `isa.available()` is true.
/// * `sh.extent()` is `Ok(n)`, `x` is valid for reads of `n` f32s, `row_max` and `row_sum`
///   for reads and writes of `sh.rows` each; all aligned for `f32` (null is fine for an
///   extent of 0).
/// * `row_max` and `row_sum` overlap neither each other nor `x`, and nothing else writes any of
///   the three during the call.
pub unsafe fn max_sum_exp_unchecked(
    isa: Isa,
    sh: &ScoreTileShape,
    scale: f32,
    x: *const f32,
    row_max: *mut f32,
    row_sum: *mut f32,
) {
    if sh.rows == 0 || sh.cols == 0 {
        return;
    }
    for r in 0..sh.rows {
        // SAFETY: row `r < rows` spans `cols` floats at `r * ld` inside `x`'s extent; the two
        // state arrays hold `rows` floats and are disjoint from `x` and each other.
        unsafe {
            let row = x.add(r * sh.ld);
            let (m, l) = (&mut *row_max.add(r), &mut *row_sum.add(r));
            let mut j = 0;
            while j < sh.cols {
                let len = CHUNK.min(sh.cols - j);
                let (cm, cs) = match isa {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: the caller guarantees AVX-512; the chunk is inside the row.
                    Isa::Avx512 => crate::x86::avx512::chunk_max_sum_exp(row.add(j), len, *m, scale),
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: the caller guarantees AVX2 and FMA; the chunk is inside the row.
                    Isa::Avx2Fma => crate::x86::avx2::chunk_max_sum_exp(row.add(j), len, *m, scale),
                    _ => chunk_portable(std::slice::from_raw_parts(row.add(j), len), *m, scale),
                };
                (*m, *l) = merge(*m, *l, cm, cs, scale);
                j += len;
            }
        }
    }
}

/// The state after a chunk whose maximum together with the old one is `new_max` and whose
/// terms, shifted by it, sum to `chunk_sum`: the old sum rescaled to the new maximum plus the
/// chunk's (see [`max_sum_exp`] for the cases).
#[inline]
fn merge(m: f32, l: f32, new_max: f32, chunk_sum: f32, scale: f32) -> (f32, f32) {
    if new_max == f32::NEG_INFINITY {
        return (m, l);
    }
    let a = if m == new_max { 1.0 } else { exp2_scalar(scale * (m - new_max)) };
    (new_max, l * a + chunk_sum)
}

/// `max(m, max_j x_j)` (NaN-propagating) and `sum_j exp2(c (x_j - that))` of one chunk, one
/// float at a time. With the maximum `-inf` the sum is 0 and unused.
pub(crate) fn chunk_portable(x: &[f32], m: f32, scale: f32) -> (f32, f32) {
    let mut mx = m;
    for &v in x {
        if mx.is_nan() || v.is_nan() {
            mx = f32::NAN;
            break;
        }
        mx = mx.max(v);
    }
    if mx == f32::NEG_INFINITY || mx.is_nan() {
        return (mx, if mx.is_nan() { f32::NAN } else { 0.0 });
    }
    (mx, x.iter().map(|&v| exp2_scalar(scale * (v - mx))).sum())
}

/// Flat C-ABI [`max_sum_exp`] for JIT-compiled code, with the fastest ISA of this CPU.
///
/// Arguments, in order: `x`, `row_max`, `row_sum` (pointers to f32), then the `i64`s `rows`,
/// `cols`, `ld` and `scale` (the f32's bit pattern in the low 32 bits). Returns 0 on success,
/// or -1 without touching memory if a size is negative, `ld` is too small, the extent
/// overflows, or a pointer is null while its buffer is non-empty.
///
/// # Safety
///
/// The pointers must satisfy the contract of [`max_sum_exp_unchecked`] for the decoded shape.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn uopc_tile_max_sum_exp_f32(
    x: *const f32,
    row_max: *mut f32,
    row_sum: *mut f32,
    rows: i64,
    cols: i64,
    ld: i64,
    scale: i64,
) -> i32 {
    let Some((sh, n)) = ScoreTileShape::from_flat(rows, cols, ld) else { return -1 };
    if n > 0 && (x.is_null() || row_max.is_null() || row_sum.is_null()) {
        return -1;
    }
    // The low 32 bits are the f32's pattern; the truncation is the documented encoding.
    let scale = f32::from_bits(scale as u32);
    // SAFETY: the detected ISA is available; extents and pointers are the caller's contract.
    unsafe { max_sum_exp_unchecked(Isa::detect(), &sh, scale, x, row_max, row_sum) };
    0
}
