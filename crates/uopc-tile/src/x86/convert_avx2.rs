//! The slice conversions of `crate::convert` on AVX2 machines, 8 elements at a time: the same
//! results as the scalar functions (and the AVX-512 forms in `bf16.rs`), bit for bit.

use std::arch::x86_64::*;

use half::{bf16, f16};

use crate::convert::scalar as convert;

/// [`convert::bf16_from_f32`] over a slice.
///
/// # Safety
///
/// AVX2 and FMA are available and `src.len() == dst.len()`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn f32_to_bf16(src: &[f32], dst: &mut [bf16]) {
    let full = src.len() / 8 * 8;
    for i in (0..full).step_by(8) {
        // SAFETY: `i + 8 <= full <= len` for both slices (bf16 is a transparent u16).
        unsafe {
            let b = super::avx2::round_bf16(_mm256_loadu_ps(src.as_ptr().add(i)));
            // The patterns sit in the low halves of the 32-bit lanes: pack them into 16 bytes.
            let packed = _mm256_permute4x64_epi64::<0b1000>(_mm256_packus_epi32(b, b));
            _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), _mm256_castsi256_si128(packed));
        }
    }
    for (d, &s) in dst[full..].iter_mut().zip(&src[full..]) {
        *d = convert::bf16_from_f32(s);
    }
}

/// [`convert::bf16_to_f32`] over a slice (a NaN is made quiet, as there).
///
/// # Safety
///
/// AVX2 is available and `src.len() == dst.len()`.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn bf16_to_f32(src: &[bf16], dst: &mut [f32]) {
    let full = src.len() / 8 * 8;
    for i in (0..full).step_by(8) {
        // SAFETY: `i + 8 <= full <= len` for both slices.
        unsafe {
            let x = _mm256_cvtepu16_epi32(_mm_loadu_si128(src.as_ptr().add(i).cast()));
            let abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFF));
            let nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F80));
            let x = _mm256_or_si256(x, _mm256_and_si256(nan, _mm256_set1_epi32(0x40)));
            _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), _mm256_slli_epi32::<16>(x));
        }
    }
    for (d, &s) in dst[full..].iter_mut().zip(&src[full..]) {
        *d = convert::bf16_to_f32(s);
    }
}

/// [`convert::f16_from_f32`] over a slice with `vcvtps2ph`.
///
/// # Safety
///
/// AVX and F16C are available and `src.len() == dst.len()`.
#[target_feature(enable = "avx,f16c")]
pub(crate) unsafe fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    let full = src.len() / 8 * 8;
    for i in (0..full).step_by(8) {
        // SAFETY: `i + 8 <= full <= len` for both slices (f16 is a transparent u16).
        unsafe {
            let x = _mm256_loadu_ps(src.as_ptr().add(i));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
            _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), h);
        }
    }
    for (d, &s) in dst[full..].iter_mut().zip(&src[full..]) {
        *d = convert::f16_from_f32(s);
    }
}

/// [`convert::f16_to_f32`] over a slice with `vcvtph2ps`.
///
/// # Safety
///
/// AVX and F16C are available and `src.len() == dst.len()`.
#[target_feature(enable = "avx,f16c")]
pub(crate) unsafe fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    // SAFETY: both slices hold `src.len()` elements.
    unsafe { super::half_pack::widen_f16(dst.as_mut_ptr(), src.as_ptr(), src.len()) }
}
