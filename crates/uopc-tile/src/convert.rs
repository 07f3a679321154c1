//! Conversions between f32 and the 16-bit storage types `bf16` and `f16`.
//!
//! Narrowing rounds to nearest, ties to even, and keeps NaNs NaN (quiet, sign and top payload
//! bits kept); widening is exact. Results are bit-identical to the `half` crate's, on the scalar
//! and the vector paths alike, so data converted here and there agrees.

use half::{bf16, f16};

use crate::TileError;
use crate::error::check_len;

/// The quiet bit of a bf16 NaN (the top mantissa bit).
const BF16_QUIET: u16 = 0x0040;

/// `x` rounded to the nearest bf16, ties to even; a NaN stays a quiet NaN with `x`'s sign and
/// top 6 payload bits, so no rounding carry can turn it into an infinity.
#[inline]
pub fn bf16_from_f32(x: f32) -> bf16 {
    let bits = x.to_bits();
    if bits & 0x7FFF_FFFF > 0x7F80_0000 {
        return bf16::from_bits((bits >> 16) as u16 | BF16_QUIET);
    }
    // Adding 0x7FFF rounds up exactly when the dropped half is above the halfway point; the
    // kept lowest bit adds one more at the halfway point itself, so ties go to the even side.
    // Finite values near the top round to infinity, as the standard requires.
    let rounded = bits + 0x7FFF + ((bits >> 16) & 1);
    bf16::from_bits((rounded >> 16) as u16)
}

/// `x` as f32, exactly (a bf16 is the top half of an f32); a signaling NaN comes back quiet, as
/// every arithmetic use would make it.
#[inline]
pub fn bf16_to_f32(x: bf16) -> f32 {
    let bits = x.to_bits();
    let bits = if bits & 0x7FFF > 0x7F80 { bits | BF16_QUIET } else { bits };
    f32::from_bits(u32::from(bits) << 16)
}

/// `x` rounded to the nearest f16, ties to even (subnormals and overflow to infinity included);
/// NaNs stay quiet NaNs.
#[inline]
pub fn f16_from_f32(x: f32) -> f16 {
    f16::from_f32(x)
}

/// `x` as f32, exactly; a signaling NaN comes back quiet.
#[inline]
pub fn f16_to_f32(x: f16) -> f32 {
    x.to_f32()
}

/// Narrows `src` into the first `src.len()` elements of `dst` with [`bf16_from_f32`].
///
/// # Errors
///
/// [`TileError::BufferTooSmall`] (operand `"dst"`) if `dst` is shorter than `src`; nothing is
/// written then.
pub fn f32_to_bf16_slice(src: &[f32], dst: &mut [bf16]) -> Result<(), TileError> {
    check_len("dst", src.len(), dst.len())?;
    let dst = &mut dst[..src.len()];
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F was detected; the slices have equal lengths.
        unsafe { crate::x86::bf16::f32_to_bf16(src, dst) };
        return Ok(());
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = bf16_from_f32(s);
    }
    Ok(())
}

/// Widens `src` into the first `src.len()` elements of `dst` with [`bf16_to_f32`].
///
/// # Errors
///
/// [`TileError::BufferTooSmall`] (operand `"dst"`) if `dst` is shorter than `src`.
pub fn bf16_to_f32_slice(src: &[bf16], dst: &mut [f32]) -> Result<(), TileError> {
    check_len("dst", src.len(), dst.len())?;
    let dst = &mut dst[..src.len()];
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F was detected; the slices have equal lengths.
        unsafe { crate::x86::bf16::bf16_to_f32(src, dst) };
        return Ok(());
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = bf16_to_f32(s);
    }
    Ok(())
}

/// Narrows `src` into the first `src.len()` elements of `dst` with [`f16_from_f32`]
/// (`vcvtps2ph`, 16 at a time, on AVX-512 machines).
///
/// # Errors
///
/// [`TileError::BufferTooSmall`] (operand `"dst"`) if `dst` is shorter than `src`.
pub fn f32_to_f16_slice(src: &[f32], dst: &mut [f16]) -> Result<(), TileError> {
    check_len("dst", src.len(), dst.len())?;
    let dst = &mut dst[..src.len()];
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F was detected; the slices have equal lengths.
        unsafe { crate::x86::bf16::f32_to_f16(src, dst) };
        return Ok(());
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f16_from_f32(s);
    }
    Ok(())
}

/// Widens `src` into the first `src.len()` elements of `dst` with [`f16_to_f32`]
/// (`vcvtph2ps`, 16 at a time, on AVX-512 machines).
///
/// # Errors
///
/// [`TileError::BufferTooSmall`] (operand `"dst"`) if `dst` is shorter than `src`.
pub fn f16_to_f32_slice(src: &[f16], dst: &mut [f32]) -> Result<(), TileError> {
    check_len("dst", src.len(), dst.len())?;
    let dst = &mut dst[..src.len()];
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F was detected; the slices have equal lengths.
        unsafe { crate::x86::bf16::f16_to_f32(src, dst) };
        return Ok(());
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f16_to_f32(s);
    }
    Ok(())
}
