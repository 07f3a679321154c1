//! The exponentials `2^x` for `x <= 0` of the AVX-512 and AVX2 softmax kernels, apart from
//! those kernels so that the vector-width trait ([`super::register_tile::F32Lanes`]) reaches
//! them without importing the kernels that use it.

use std::arch::x86_64::*;

use crate::shapes::{EXP2_C, EXP2_LO, EXP2_UNIT_C, EXP2_ZERO_BELOW};

/// `exp2(x)` for any `x` (the name is the softmax's, whose exponents are `<= 0`, `-inf` or NaN,
/// as the AVX2 variant requires): `x <= EXP2_ZERO_BELOW` (and `-inf`) gives exactly 0, NaN
/// gives NaN, `x >= 128` and `+inf` give `inf`, and the relative error elsewhere is that of
/// `EXP2_UNIT_C`.
///
/// Three port-0/5 operations (VREDUCEPS, the compare, VSCALEFPS) besides the polynomial's
/// six FMAs, since the softmax kernels spend most of their time here: VREDUCEPS takes the
/// fraction `f = x - floor(x)` in one operation (rounding to an integer takes two on Intel
/// cores, and a subtraction after it),
/// and VSCALEFPS multiplies `2^f` by `2^floor(x)` straight from `x`, so the integer part is
/// never formed. The polynomial is fitted on `[0, 1)` for that reason, and gives exactly 1 at
/// 0, so a row's maximum gets probability 1. VREDUCEPS maps `-inf` to 0, whose `2^-inf`
/// scaling is 0; the compare flushes the subnormal results VSCALEFPS would give below
/// `EXP2_ZERO_BELOW`.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
#[inline]
pub(super) fn nonpositive_x16(x: __m512) -> __m512 {
    let f = _mm512_reduce_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(x);
    let mut p = _mm512_set1_ps(EXP2_UNIT_C[6]);
    for &c in EXP2_UNIT_C[..6].iter().rev() {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    }
    // NaN is unordered, so it stays live and `p` (NaN) makes the result NaN; -inf is not live.
    let live = _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(x, _mm512_set1_ps(EXP2_ZERO_BELOW));
    _mm512_maskz_scalef_ps(live, p, x)
}

/// `2^x` per lane for `x <= 0`, `-inf` or NaN (every softmax exponent is a score minus its
/// row's maximum); see the crate's `softmax_update` for the method and its accuracy.
///
/// The FMA ports bound the softmax, so this spends nothing on them, or on other ports, that
/// those inputs do not need: no upper clamp (a no-op for them), and no mask for flushing, since
/// the lower clamp alone makes every `x < -126.5` give exactly 0 (its `n = -127` builds the
/// float 0 as `2^n`). `x = -126.5` itself rounds to `n = -126` and gives `2^-126.5`, a
/// subnormal.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn nonpositive_x8(x: __m256) -> __m256 {
    // The clamp bound is the first operand: MAXPS returns the second one when either is NaN, so
    // a NaN input stays NaN through the clamp (and, through `f`, the result).
    let x = _mm256_max_ps(_mm256_set1_ps(EXP2_LO), x);
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
    let f = _mm256_sub_ps(x, n);
    let mut p = _mm256_set1_ps(EXP2_C[6]);
    for &c in EXP2_C[..6].iter().rev() {
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c));
    }
    // `n` is an integer in [-127, 0], so `n + 127` is a valid biased exponent, 0 giving the
    // float 0. (A NaN `n` converts to a finite pattern, which the NaN `p` overrides.)
    let two_n = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
    _mm256_mul_ps(p, _mm256_castsi256_ps(two_n))
}
