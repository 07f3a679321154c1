//! AVX-512 pieces of the bf16 GEMM and the 16-bit conversions: the `vdpbf16ps` block kernel,
//! VNNI packing of B, and conversions 16 elements at a time.

use std::arch::x86_64::*;

use half::{bf16, f16};

use crate::bf16_gemm::ATiles;
use crate::convert;

/// Narrows 16 f32 lanes (as integers) to bf16 bits in the low 16 bits of each lane, with the
/// same rounding and NaN rule as [`convert::bf16_from_f32`].
#[target_feature(enable = "avx512f")]
#[inline]
fn narrow_bf16(x: __m512i) -> __m512i {
    let abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFF_FFFF));
    let nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7F80_0000));
    let high = _mm512_srli_epi32::<16>(x);
    let lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
    let rounded =
        _mm512_srli_epi32::<16>(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF)), lsb));
    let quiet = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
    _mm512_mask_blend_epi32(nan, rounded, quiet)
}

/// [`convert::bf16_from_f32`] over a slice, 16 elements at a time.
///
/// # Safety
///
/// AVX-512F is available and `src.len() == dst.len()`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn f32_to_bf16(src: &[f32], dst: &mut [bf16]) {
    let full = src.len() / 16 * 16;
    for i in (0..full).step_by(16) {
        // SAFETY: `i + 16 <= full <= len` for both slices (bf16 is a transparent u16).
        unsafe {
            let x = _mm512_loadu_si512(src.as_ptr().add(i).cast());
            _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), _mm512_cvtepi32_epi16(narrow_bf16(x)));
        }
    }
    for (d, &s) in dst[full..].iter_mut().zip(&src[full..]) {
        *d = convert::bf16_from_f32(s);
    }
}

/// [`convert::bf16_to_f32`] over a slice, 16 elements at a time.
///
/// # Safety
///
/// AVX-512F is available and `src.len() == dst.len()`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn bf16_to_f32(src: &[bf16], dst: &mut [f32]) {
    let full = src.len() / 16 * 16;
    for i in (0..full).step_by(16) {
        // SAFETY: `i + 16 <= full <= len` for both slices.
        unsafe {
            let x = _mm512_cvtepu16_epi32(_mm256_loadu_si256(src.as_ptr().add(i).cast()));
            let abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFF));
            let nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7F80));
            let x = _mm512_mask_or_epi32(x, nan, x, _mm512_set1_epi32(0x40));
            _mm512_storeu_si512(dst.as_mut_ptr().add(i).cast(), _mm512_slli_epi32::<16>(x));
        }
    }
    for (d, &s) in dst[full..].iter_mut().zip(&src[full..]) {
        *d = convert::bf16_to_f32(s);
    }
}

/// [`convert::f16_from_f32`] over a slice with `vcvtps2ph`, 16 elements at a time.
///
/// # Safety
///
/// AVX-512F is available and `src.len() == dst.len()`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn f32_to_f16(src: &[f32], dst: &mut [f16]) {
    let full = src.len() / 16 * 16;
    for i in (0..full).step_by(16) {
        // SAFETY: `i + 16 <= full <= len` for both slices (f16 is a transparent u16).
        unsafe {
            let x = _mm512_loadu_ps(src.as_ptr().add(i));
            let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
            _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), h);
        }
    }
    for (d, &s) in dst[full..].iter_mut().zip(&src[full..]) {
        *d = convert::f16_from_f32(s);
    }
}

/// [`convert::f16_to_f32`] over a slice with `vcvtph2ps`, 16 elements at a time.
///
/// # Safety
///
/// AVX-512F is available and `src.len() == dst.len()`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
    let full = src.len() / 16 * 16;
    for i in (0..full).step_by(16) {
        // SAFETY: `i + 16 <= full <= len` for both slices.
        unsafe {
            let h = _mm256_loadu_si256(src.as_ptr().add(i).cast());
            _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
        }
    }
    for (d, &s) in dst[full..].iter_mut().zip(&src[full..]) {
        *d = convert::f16_to_f32(s);
    }
}

/// Packs B stored `k x n` (row `p` at `b + p * ldb`) into the VNNI panels of
/// [`crate::bf16_gemm`]'s layout, zero-filling rows past `k` and columns past `n`: two rows of
/// 32 columns are interleaved pairwise into one row of each of the panel's two tiles.
///
/// # Safety
///
/// AVX-512F and AVX-512BW are available; `b` is readable at `p * ldb + j` for `p < k`,
/// `j < n`; `dst` is writable for `panels * kblocks * 1024` u16 where `panels =
/// n.div_ceil(32)` and `kblocks = k.div_ceil(32)`.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn pack_b_rows(dst: *mut u16, b: *const u16, ldb: usize, k: usize, n: usize) {
    // Output u16 `2j + q` of the low half takes column `j` of row `q`; the high half columns
    // `16 + j`. In `permutex2var` indices 0-31 pick from the first row, 32-63 from the second.
    let mut lo = [0i16; 32];
    let mut hi = [0i16; 32];
    for j in 0..16 {
        lo[2 * j] = j as i16;
        lo[2 * j + 1] = 32 + j as i16;
        hi[2 * j] = 16 + j as i16;
        hi[2 * j + 1] = 48 + j as i16;
    }
    // SAFETY: the index arrays are 64 bytes each.
    let (lo, hi) =
        unsafe { (_mm512_loadu_si512(lo.as_ptr().cast()), _mm512_loadu_si512(hi.as_ptr().cast())) };
    let kblocks = k.div_ceil(32);
    for jp in 0..n.div_ceil(32) {
        let j0 = jp * 32;
        let w = (n - j0).min(32);
        let mask: __mmask32 = if w == 32 { !0 } else { (1u32 << w) - 1 };
        for kb in 0..kblocks {
            // SAFETY: panel `jp`, k block `kb` is 1024 u16 inside `dst`; rows `p < k` and
            // columns `j0 .. j0 + w <= n` are readable, the masked-off lanes are not touched.
            unsafe {
                let tile = dst.add((jp * kblocks + kb) * 1024);
                for r in 0..16 {
                    let p = kb * 32 + 2 * r;
                    let row = |p: usize| {
                        if p < k {
                            _mm512_maskz_loadu_epi16(mask, b.add(p * ldb + j0).cast())
                        } else {
                            _mm512_setzero_si512()
                        }
                    };
                    let (r0, r1) = (row(p), row(p + 1));
                    _mm512_storeu_si512(tile.add(r * 32).cast(), _mm512_permutex2var_epi16(r0, lo, r1));
                    _mm512_storeu_si512(tile.add(512 + r * 32).cast(), _mm512_permutex2var_epi16(r0, hi, r1));
                }
            }
        }
    }
}

/// Rows of C one pass of [`block`] keeps in registers (2 x 8 accumulators of 16 lanes).
const ROWS: usize = 8;

/// `C[32 x 32] (+)= A · B` with `vdpbf16ps`, on the operands of [`super::amx::block`]: each
/// instruction adds 16 columns' pairs of products, so a VNNI row of B is one vector and a pair
/// of A elements one broadcast.
///
/// # Safety
///
/// AVX-512F and AVX512_BF16 are available; the memory contract of [`super::amx::block`].
#[target_feature(enable = "avx512f,avx512bf16")]
pub(crate) unsafe fn block(a: ATiles, b: *const u16, ksteps: usize, c: *mut f32, ldc: usize, load_c: bool) {
    for g in 0..32 / ROWS {
        let rows: [*const u8; ROWS] = std::array::from_fn(|i| {
            let r = g * ROWS + i;
            let off = if r < 16 { r * a.stride } else { a.hi + (r - 16) * a.stride };
            a.ptr.cast::<u8>().wrapping_add(off)
        });
        let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
        if load_c {
            for (i, row) in acc.iter_mut().enumerate() {
                // SAFETY: row `g * ROWS + i < 32` of C has 32 readable floats.
                unsafe {
                    let cr = c.add((g * ROWS + i) * ldc);
                    *row = [_mm512_loadu_ps(cr), _mm512_loadu_ps(cr.add(16))];
                }
            }
        }
        for s in 0..ksteps {
            // SAFETY: k step `s` of the panel is 1024 u16 at `b + 1024 s`; A row `r`'s step
            // `s` is 64 readable bytes at `rows[r] + s * step` (the contract of `ATiles`).
            unsafe {
                let bs = b.add(s * 1024);
                for r in 0..16 {
                    let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(bs.add(r * 32).cast()));
                    let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(bs.add(512 + r * 32).cast()));
                    for (row, &ap) in acc.iter_mut().zip(&rows) {
                        let pair = ap.add(s * a.step + r * 4).cast::<i32>().read_unaligned();
                        let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                        row[0] = _mm512_dpbf16_ps(row[0], av, b0);
                        row[1] = _mm512_dpbf16_ps(row[1], av, b1);
                    }
                }
            }
        }
        for (i, row) in acc.iter().enumerate() {
            // SAFETY: row `g * ROWS + i < 32` of C has 32 writable floats.
            unsafe {
                let cr = c.add((g * ROWS + i) * ldc);
                _mm512_storeu_ps(cr, row[0]);
                _mm512_storeu_ps(cr.add(16), row[1]);
            }
        }
    }
}
