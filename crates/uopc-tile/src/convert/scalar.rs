//! The scalar conversions between f32 and bf16 or f16, whose rounding and NaN rules every
//! vector path reproduces (and falls back to for its tails). A leaf: the x86 kernels use it
//! without importing the slice conversions that dispatch to them.

use half::{bf16, f16};

/// `x` rounded to the nearest bf16, ties to even; a NaN stays a quiet NaN with `x`'s sign and
/// top 6 payload bits, so no rounding carry can turn it into an infinity (`half`'s rounding,
/// which every vector path reproduces bit for bit).
#[inline]
pub fn bf16_from_f32(x: f32) -> bf16 {
    bf16::from_f32(x)
}

/// `x` as f32, exactly (a bf16 is the top half of an f32); a signaling NaN comes back quiet, as
/// every arithmetic use would make it (`half`'s widening).
#[inline]
pub fn bf16_to_f32(x: bf16) -> f32 {
    x.to_f32()
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
