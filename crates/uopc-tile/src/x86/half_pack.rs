//! Packing the f32 kernels' panels and strips from f32, f16 or bf16 storage, each value widened
//! exactly as it is loaded. One body per routine serves the three types; only the load of a
//! vector differs (a plain load for f32; F16C's `vcvtph2ps` for f16; for bf16, which is the top
//! half of the f32 it widens to, a zero-extension and a shift, which AVX2 has), and f32 keeps
//! its own 8 x 8 transpose, which folds the lane exchange into its loads.

use std::arch::x86_64::*;

use half::{bf16, f16};

use super::{transpose4x4_rows, transpose8x8_f32};
use crate::tile::HalfFloat;

/// How one storage type loads 8, 4 or 1 of its values as f32.
pub(super) trait Lanes: Copy {
    /// The eight values at `src`, widened.
    ///
    /// # Safety
    ///
    /// `src` is readable for 8 values; the type's widening features are available.
    unsafe fn widen8(src: *const Self) -> __m256;

    /// The four values at `src`, widened.
    ///
    /// # Safety
    ///
    /// As [`Lanes::widen8`], for 4 values.
    unsafe fn widen4(src: *const Self) -> __m128;

    /// One value, widened.
    fn widen1(self) -> f32;

    /// Transposes the 8 x 8 block at `src` (row stride `lds`) into f32 at `dst` (row stride
    /// `ldd`), widening it ([`transpose8x8`] unless the type has a faster way).
    ///
    /// # Safety
    ///
    /// As [`transpose8x8`].
    #[inline(always)]
    unsafe fn transpose8x8(src: *const Self, lds: usize, dst: *mut f32, ldd: usize) {
        // SAFETY: forwarded.
        unsafe { transpose8x8(src, lds, dst, ldd) }
    }
}

impl Lanes for f32 {
    #[inline(always)]
    unsafe fn widen8(src: *const f32) -> __m256 {
        // SAFETY: the caller's contract (AVX).
        unsafe { _mm256_loadu_ps(src) }
    }

    #[inline(always)]
    unsafe fn widen4(src: *const f32) -> __m128 {
        // SAFETY: the caller's contract.
        unsafe { _mm_loadu_ps(src) }
    }

    #[inline(always)]
    fn widen1(self) -> f32 {
        self
    }

    #[inline(always)]
    unsafe fn transpose8x8(src: *const f32, lds: usize, dst: *mut f32, ldd: usize) {
        // SAFETY: forwarded (AVX).
        unsafe { transpose8x8_f32(src, lds, dst, ldd) }
    }
}

impl Lanes for f16 {
    #[inline(always)]
    unsafe fn widen8(src: *const f16) -> __m256 {
        // SAFETY: the caller's contract (F16C).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(src.cast())) }
    }

    #[inline(always)]
    unsafe fn widen4(src: *const f16) -> __m128 {
        // SAFETY: the caller's contract (F16C).
        unsafe { _mm_cvtph_ps(_mm_loadl_epi64(src.cast())) }
    }

    #[inline(always)]
    fn widen1(self) -> f32 {
        crate::convert::scalar::f16_to_f32(self)
    }
}

impl Lanes for bf16 {
    #[inline(always)]
    unsafe fn widen8(src: *const bf16) -> __m256 {
        // SAFETY: the caller's contract (AVX2).
        unsafe {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(src.cast()))))
        }
    }

    #[inline(always)]
    unsafe fn widen4(src: *const bf16) -> __m128 {
        // SAFETY: the caller's contract (SSE4.1, part of AVX2).
        unsafe { _mm_castsi128_ps(_mm_slli_epi32::<16>(_mm_cvtepu16_epi32(_mm_loadl_epi64(src.cast())))) }
    }

    #[inline(always)]
    fn widen1(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
}

/// `dst[i] = src[i]` widened, for `i < n`, 8 at a time.
///
/// # Safety
///
/// `src` readable and `dst` writable for `n` values; `H`'s widening features available.
#[inline(always)]
unsafe fn widen<H: Lanes>(dst: *mut f32, src: *const H, n: usize) {
    let full = n - n % 8;
    // SAFETY: every offset is below `n`, inside both regions.
    unsafe {
        for i in (0..full).step_by(8) {
            _mm256_storeu_ps(dst.add(i), H::widen8(src.add(i)));
        }
        for i in full..n {
            *dst.add(i) = (*src.add(i)).widen1();
        }
    }
}

/// `dst[p * NR + j] = src[p * ldb + j]` widened, for `p < kc`, `j < nr`; zero for
/// `nr <= j < NR`, in one pass over B.
///
/// # Safety
///
/// As `super::pack_b`, with `H`'s widening features available.
#[inline(always)]
pub(super) unsafe fn pack_b<H: Lanes, const NR: usize>(
    dst: *mut f32,
    src: *const H,
    ldb: usize,
    kc: usize,
    nr: usize,
) {
    let full = nr - nr % 8;
    for p in 0..kc {
        // SAFETY: reads stay in row `p` at columns `< nr`, writes in `dst` row `p` below `NR`.
        unsafe {
            let (s, d) = (src.add(p * ldb), dst.add(p * NR));
            for j in (0..full).step_by(8) {
                _mm256_storeu_ps(d.add(j), H::widen8(s.add(j)));
            }
            if full < NR {
                for j in full..nr {
                    *d.add(j) = (*s.add(j)).widen1();
                }
                std::ptr::write_bytes(d.add(nr), 0, NR - nr);
            }
        }
    }
}

/// `dst[p * NR + j] = src[j * ldb + p]` widened, for `p < kc`, `j < nr`; zero for
/// `nr <= j < NR`. Whole 8 x 8 blocks are widened as they are loaded and transposed in
/// registers ([`Lanes::transpose8x8`]), a last group of four rows in 4 x 4 blocks and a pair
/// after it four steps at a time; ragged edges go one value at a time.
///
/// # Safety
///
/// As `super::pack_bt`, with `H`'s widening features available.
#[inline(always)]
pub(super) unsafe fn pack_bt<H: Lanes, const NR: usize>(
    dst: *mut f32,
    src: *const H,
    ldb: usize,
    kc: usize,
    nr: usize,
) {
    let j8 = nr - nr % 8;
    let p8 = kc - kc % 8;
    // SAFETY: every offset below is `j * ldb + p` with `j < nr`, `p < kc` for `src` and
    // `p * NR + j` with `j < NR`, `p < kc` for `dst`, inside the regions of the contract.
    unsafe {
        for j0 in (0..j8).step_by(8) {
            for p0 in (0..p8).step_by(8) {
                H::transpose8x8(src.add(j0 * ldb + p0), ldb, dst.add(p0 * NR + j0), NR);
            }
            for p in p8..kc {
                for j in j0..j0 + 8 {
                    *dst.add(p * NR + j) = (*src.add(j * ldb + p)).widen1();
                }
            }
        }
        // A group of four rows (the last third of a 12-row A strip) in 4 x 4 blocks.
        let j4 = if nr - j8 >= 4 { j8 + 4 } else { j8 };
        if j4 > j8 {
            let p4 = kc - kc % 4;
            for p0 in (0..p4).step_by(4) {
                let rows: [__m128; 4] = std::array::from_fn(|i| H::widen4(src.add((j8 + i) * ldb + p0)));
                transpose4x4_rows(rows, dst.add(p0 * NR + j8), NR);
            }
            for p in p4..kc {
                for j in j8..j4 {
                    *dst.add(p * NR + j) = (*src.add(j * ldb + p)).widen1();
                }
            }
        }
        // A pair of rows left (the last third of a 6-row A strip) interleaved four k steps at
        // a time: `(r0[p], r1[p])` pairs, each stored as one 64-bit half.
        let j2 = if nr - j4 >= 2 { j4 + 2 } else { j4 };
        if j2 > j4 {
            let p4 = kc - kc % 4;
            for p0 in (0..p4).step_by(4) {
                let (r0, r1) = (H::widen4(src.add(j4 * ldb + p0)), H::widen4(src.add((j4 + 1) * ldb + p0)));
                let (lo, hi) = (_mm_unpacklo_ps(r0, r1), _mm_unpackhi_ps(r0, r1));
                let (lo, hi) = (_mm_castps_pd(lo), _mm_castps_pd(hi));
                let halves = [lo, _mm_unpackhi_pd(lo, lo), hi, _mm_unpackhi_pd(hi, hi)];
                for (p, half) in halves.into_iter().enumerate() {
                    // The pair's two floats, as one (possibly unaligned) 64-bit store.
                    dst.add((p0 + p) * NR + j4).cast::<f64>().write_unaligned(_mm_cvtsd_f64(half));
                }
            }
            for p in p4..kc {
                for j in j4..j2 {
                    *dst.add(p * NR + j) = (*src.add(j * ldb + p)).widen1();
                }
            }
        }
        for j in j2..nr {
            for p in 0..kc {
                *dst.add(p * NR + j) = (*src.add(j * ldb + p)).widen1();
            }
        }
        if nr < NR {
            for p in 0..kc {
                std::ptr::write_bytes(dst.add(p * NR + nr), 0, NR - nr);
            }
        }
    }
}

/// Transposes the 8 x 8 block at `src` (row stride `lds`) into f32 at `dst` (row stride
/// `ldd`): each row is widened as it is loaded, then two unpack stages, one in-lane shuffle
/// stage and one 128-bit lane exchange put column `c` into output row `c`.
///
/// # Safety
///
/// AVX and `H`'s widening features are available; `src` readable as 8 rows of 8 values, `dst`
/// writable as 8 rows of 8 floats.
#[inline(always)]
unsafe fn transpose8x8<H: Lanes>(src: *const H, lds: usize, dst: *mut f32, ldd: usize) {
    // SAFETY: the loads read rows `0..8`, columns `0..8` of `src`; the stores write the same
    // of `dst`.
    unsafe {
        let r: [__m256; 8] = std::array::from_fn(|i| H::widen8(src.add(i * lds)));
        // Per 128-bit lane (columns 0..4 low, 4..8 high): t[2 h] interleaves the first halves
        // of rows 2 h and 2 h + 1, t[2 h + 1] their second halves.
        let t: [__m256; 8] = std::array::from_fn(|i| {
            let (x, y) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
            if i % 2 == 0 { _mm256_unpacklo_ps(x, y) } else { _mm256_unpackhi_ps(x, y) }
        });
        // u[4 g + c] holds column c (low lane) and c + 4 (high lane) of rows 4 g .. 4 g + 4.
        let mut u = [_mm256_setzero_ps(); 8];
        for g in 0..2 {
            let (t0, t1, t2, t3) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
            u[4 * g] = _mm256_shuffle_ps::<0x44>(t0, t2);
            u[4 * g + 1] = _mm256_shuffle_ps::<0xEE>(t0, t2);
            u[4 * g + 2] = _mm256_shuffle_ps::<0x44>(t1, t3);
            u[4 * g + 3] = _mm256_shuffle_ps::<0xEE>(t1, t3);
        }
        for c in 0..4 {
            _mm256_storeu_ps(dst.add(c * ldd), _mm256_permute2f128_ps::<0x20>(u[c], u[4 + c]));
            _mm256_storeu_ps(dst.add((c + 4) * ldd), _mm256_permute2f128_ps::<0x31>(u[c], u[4 + c]));
        }
    }
}

/// [`widen`] of f16 values (F16C).
///
/// # Safety
///
/// F16C (and AVX) is available; `src` is readable and `dst` writable for `n` elements.
#[target_feature(enable = "avx,f16c")]
pub(crate) unsafe fn widen_f16(dst: *mut f32, src: *const f16, n: usize) {
    // SAFETY: forwarded, with the features the f16 lanes need.
    unsafe { widen(dst, src, n) }
}

#[target_feature(enable = "avx,f16c")]
unsafe fn pack_b_f16<const NR: usize>(dst: *mut f32, src: *const f16, ldb: usize, kc: usize, nr: usize) {
    // SAFETY: forwarded, with the features the f16 lanes need.
    unsafe { pack_b::<f16, NR>(dst, src, ldb, kc, nr) }
}

#[target_feature(enable = "avx,f16c")]
unsafe fn pack_bt_f16<const NR: usize>(dst: *mut f32, src: *const f16, ldb: usize, kc: usize, nr: usize) {
    // SAFETY: forwarded, with the features the f16 lanes need.
    unsafe { pack_bt::<f16, NR>(dst, src, ldb, kc, nr) }
}

#[target_feature(enable = "avx2")]
unsafe fn widen_bf16(dst: *mut f32, src: *const bf16, n: usize) {
    // SAFETY: forwarded, with the features the bf16 lanes need.
    unsafe { widen(dst, src, n) }
}

#[target_feature(enable = "avx2")]
unsafe fn pack_b_bf16<const NR: usize>(dst: *mut f32, src: *const bf16, ldb: usize, kc: usize, nr: usize) {
    // SAFETY: forwarded, with the features the bf16 lanes need.
    unsafe { pack_b::<bf16, NR>(dst, src, ldb, kc, nr) }
}

#[target_feature(enable = "avx2")]
unsafe fn pack_bt_bf16<const NR: usize>(dst: *mut f32, src: *const bf16, ldb: usize, kc: usize, nr: usize) {
    // SAFETY: forwarded, with the features the bf16 lanes need.
    unsafe { pack_bt::<bf16, NR>(dst, src, ldb, kc, nr) }
}

impl HalfFloat for f16 {
    unsafe fn widen(dst: *mut f32, src: *const f16, n: usize) {
        // SAFETY: the trait contract (F16C).
        unsafe { widen_f16(dst, src, n) }
    }

    unsafe fn pack_b<const NR: usize>(dst: *mut f32, src: *const f16, ldb: usize, kc: usize, nr: usize) {
        // SAFETY: the trait contract (F16C).
        unsafe { pack_b_f16::<NR>(dst, src, ldb, kc, nr) }
    }

    unsafe fn pack_bt<const NR: usize>(dst: *mut f32, src: *const f16, ldb: usize, kc: usize, nr: usize) {
        // SAFETY: the trait contract (F16C).
        unsafe { pack_bt_f16::<NR>(dst, src, ldb, kc, nr) }
    }
}

impl HalfFloat for bf16 {
    unsafe fn widen(dst: *mut f32, src: *const bf16, n: usize) {
        // SAFETY: the trait contract (AVX2).
        unsafe { widen_bf16(dst, src, n) }
    }

    unsafe fn pack_b<const NR: usize>(dst: *mut f32, src: *const bf16, ldb: usize, kc: usize, nr: usize) {
        // SAFETY: the trait contract (AVX2).
        unsafe { pack_b_bf16::<NR>(dst, src, ldb, kc, nr) }
    }

    unsafe fn pack_bt<const NR: usize>(dst: *mut f32, src: *const bf16, ldb: usize, kc: usize, nr: usize) {
        // SAFETY: the trait contract (AVX2).
        unsafe { pack_bt_bf16::<NR>(dst, src, ldb, kc, nr) }
    }
}

#[cfg(test)]
mod tests {
    use super::{Lanes, pack_bt};
    use half::{bf16, f16};

    /// Every row count of a 6-row A strip (the 4 x 4 group, the pair, the single rows) and
    /// depths on both sides of the four-step groups, against the packing's definition.
    fn strips_match_the_definition<H: Lanes>(from_f32: fn(f32) -> H) {
        if !std::arch::is_x86_feature_detected!("avx2") || !std::arch::is_x86_feature_detected!("f16c") {
            eprintln!("skipped: the 16-bit packing needs AVX2 and F16C");
            return;
        }
        let lda = 19;
        let src: Vec<H> = (0..6 * lda).map(|i| from_f32(i as f32 * 0.5 - 7.0)).collect();
        for rows in 1..=6 {
            for kc in [1, 2, 3, 4, 5, 7, 8, 9, 13, 16] {
                let mut dst = vec![f32::NAN; kc * 6];
                // SAFETY: AVX2 and F16C were checked; `dst` holds `kc x 6` floats and `src`
                // `rows` rows of `lda >= kc` values.
                unsafe { pack_bt::<H, 6>(dst.as_mut_ptr(), src.as_ptr(), lda, kc, rows) };
                for p in 0..kc {
                    for j in 0..6 {
                        let want = if j < rows { src[j * lda + p].widen1() } else { 0.0 };
                        assert_eq!(dst[p * 6 + j], want, "rows {rows}, kc {kc}, step {p}, row {j}");
                    }
                }
            }
        }
    }

    #[test]
    fn six_row_strips_of_every_type_match_the_definition() {
        strips_match_the_definition::<f32>(|x| x);
        strips_match_the_definition::<f16>(f16::from_f32);
        strips_match_the_definition::<bf16>(bf16::from_f32);
    }
}
