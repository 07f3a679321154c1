//! The scalar conversions between f32 and bf16 or f16, whose rounding and NaN rules every
//! vector path reproduces (and falls back to for its tails). A leaf: the x86 kernels use it
//! without importing the slice conversions that dispatch to them.

use half::{bf16, f16};

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
