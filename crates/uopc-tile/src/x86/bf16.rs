//! AVX-512 pieces of the bf16 GEMM and the 16-bit conversions: the `vdpbf16ps` block kernel,
//! VNNI packing of B, and conversions 16 elements at a time.

use std::arch::x86_64::*;

use half::{bf16, f16};

use super::bf16_tiles::{ATiles, Extent};
use super::{MAX_BASES, ROWS_PER_BASE};
use crate::convert::scalar as convert;

/// Narrows 16 f32 lanes (as integers) to bf16 bits in the low 16 bits of each lane, with the
/// same rounding and NaN rule as [`convert::bf16_from_f32`].
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn narrow_bf16(x: __m512i) -> __m512i {
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

/// Rounds `rows` rows of 32 f32 (rows `lds` apart) at `src` to bf16 bits at `dst` (rows `ldd`
/// apart) with `vcvtne2ps2bf16`: to nearest even, NaNs quieted with their sign and top payload
/// bits kept, as [`convert::bf16_from_f32`], except that subnormal inputs become zeros.
///
/// # Safety
///
/// AVX-512F and AVX-512 BF16 are available; `src` holds `rows` readable rows of 32 f32 and
/// `dst` `rows` writable rows of 32 u16.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(crate) unsafe fn round_rows_32(src: *const f32, lds: usize, rows: usize, dst: *mut u16, ldd: usize) {
    for r in 0..rows {
        // SAFETY: row `r` is 32 readable f32 and 32 writable u16 (this function's contract).
        unsafe {
            let lo = _mm512_loadu_ps(src.add(r * lds));
            let hi = _mm512_loadu_ps(src.add(r * lds + 16));
            // The second operand fills the low half.
            let both = _mm512_cvtne2ps_pbh(hi, lo);
            _mm512_storeu_si512(dst.add(r * ldd).cast(), std::mem::transmute::<__m512bh, __m512i>(both));
        }
    }
}

/// Copies pieces `from .. to` of row block `i0 ..`, k blocks `kb0 .. kb0 + nkb` of a
/// row-major A (`m x k`, rows `lda` apart) into contiguous tiles at `dst`. Piece `t` is the 64
/// bytes of row `i0 + t / nkb` of A in k block `kb0 + t % nkb`, tile row `32 (t % nkb) + t /
/// nkb` at `dst`, zero past `m` and past `k`; pieces go along A's rows, which the hardware
/// prefetchers follow.
///
/// # Safety
///
/// AVX-512F and AVX-512BW are available; `dst` is writable for `nkb * 1024` u16 and
/// `to <= 32 nkb`; A's `m x k` extent is readable.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn pack_a_tile_rows(
    dst: *mut u16,
    (a, lda): (*const u16, usize),
    (m, k): (usize, usize),
    (i0, (kb0, nkb)): (usize, (usize, usize)),
    (from, to): (usize, usize),
) {
    for t in from..to {
        let (r, kb) = (t / nkb, t % nkb);
        let (i, p0) = (i0 + r, (kb0 + kb) * 32);
        let cols = if i < m { k.saturating_sub(p0).min(32) } else { 0 };
        let mask = if cols == 32 { u32::MAX } else { (1u32 << cols) - 1 };
        // SAFETY: the masked load reads only columns `p0 .. p0 + cols` of row `i < m`, inside
        // A's extent (masked-out elements are never accessed); tile row `32 kb + r < 32 nkb`
        // is writable.
        unsafe {
            let v = _mm512_maskz_loadu_epi16(mask, a.wrapping_add(i * lda + p0).cast());
            _mm512_storeu_si512(dst.add((kb * 32 + r) * 32).cast(), v);
        }
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
/// the crate's `bf16_gemm`'s layout, zero-filling rows past `k` and columns past `n`: two rows of
/// 32 columns are interleaved pairwise into one row of each of the panel's two tiles.
///
/// # Safety
///
/// AVX-512F and AVX-512BW are available; `b` is readable at `p * ldb + j` for `p < k`,
/// `j < n`; `dst` is writable for `panels * kblocks * 1024` u16 where `panels =
/// n.div_ceil(32)` and `kblocks = k.div_ceil(32)`.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn pack_b_rows(dst: *mut u16, b: *const u16, ldb: usize, k: usize, n: usize) {
    let (lo, hi) = pair_indices();
    let kblocks = k.div_ceil(32);
    let panels = n.div_ceil(32);
    // Rows outer, panels inner: each pair of B rows is read front to back, as the hardware
    // prefetchers follow, while the writes go to the packed buffer, which the caller keeps
    // close. (A panel at a time would read 64 bytes from each of k rows `ldb` apart.)
    for kb in 0..kblocks {
        for r in 0..16 {
            let p = kb * 32 + 2 * r;
            for jp in 0..panels {
                let j0 = jp * 32;
                let mask = mask16(n - j0);
                // SAFETY: panel `jp`, k block `kb` is 1024 u16 inside `dst`; rows `p < k` and
                // columns `j0 ..` below `n` are readable; the masked-off lanes are not touched.
                unsafe {
                    let tile = dst.add((jp * kblocks + kb) * 1024);
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

/// `C[32 x 32] (+)= A · B` with `vdpbf16ps`, on the operands of [`super::amx::block`]: each
/// instruction adds 16 columns' pairs of products, so a VNNI row of B is one vector and a pair
/// of A elements one broadcast. Only the `extent` of the block is multiplied: C's columns past
/// it (with `!extent.wide`, 16 to 31) are left as they were.
///
/// The 32 rows go in groups of 12, 10 and 10: a group's accumulators (2 vectors a row, 24 for
/// 12 rows), B's two vectors and a broadcast fit the 32 registers, and at least 10 rows give
/// each pair of B loads 20 or more multiply-adds, enough to keep two ports busy beside the
/// broadcasts (8 rows are not).
///
/// # Safety
///
/// AVX-512F and AVX512_BF16 are available; the memory contract of [`super::amx::block`];
/// `ksteps >= 1` and `1 <= extent.last_pairs <= 16`.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(crate) unsafe fn block(
    a: ATiles,
    b: *const u16,
    ksteps: usize,
    extent: Extent,
    c: *mut f32,
    ldc: usize,
    load_c: bool,
) {
    let pairs = extent.last_pairs.clamp(1, 16);
    // SAFETY: forwarded; the three groups cover rows 0..12, 12..22 and 22..32.
    unsafe {
        if extent.wide {
            rows_block::<0, 12, 2>(a, b, (ksteps, pairs), c, ldc, load_c);
            rows_block::<12, 10, 2>(a, b, (ksteps, pairs), c, ldc, load_c);
            rows_block::<22, 10, 2>(a, b, (ksteps, pairs), c, ldc, load_c);
        } else {
            rows_block::<0, 12, 1>(a, b, (ksteps, pairs), c, ldc, load_c);
            rows_block::<12, 10, 1>(a, b, (ksteps, pairs), c, ldc, load_c);
            rows_block::<22, 10, 1>(a, b, (ksteps, pairs), c, ldc, load_c);
        }
    }
}

/// Rows `FIRST .. FIRST + R` of [`block`], over the first `16 V` columns, for `steps = (k
/// steps, pairs of the last one)`.
///
/// A's rows are reached from a base pointer per group of up to [`ROWS_PER_BASE`] evenly
/// strided rows (a group never spans row 16, where the tile's second half starts), each
/// advanced one pair per pair row: a pair row then costs its loads and multiply-adds and a
/// few pointer increments. The bases are opaque to the optimizer (an empty `asm!` passes each
/// through a register), which would otherwise fold them into one pointer and recompute every
/// row's address.
///
/// # Safety
///
/// As [`block`], with `FIRST + R <= 32`, `V` 1 or 2, at least one k step and its pairs in
/// `1..=16`.
// Out of line, so each group size keeps a symbol that `cargo xtask mca` names.
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn rows_block<const FIRST: usize, const R: usize, const V: usize>(
    a: ATiles,
    b: *const u16,
    (ksteps, last_pairs): (usize, usize),
    c: *mut f32,
    ldc: usize,
    load_c: bool,
) {
    let row_at = |r: usize| {
        let off = if r < 16 { r * a.stride } else { a.hi + (r - 16) * a.stride };
        a.ptr.cast::<u8>().wrapping_add(off)
    };
    let place: [(usize, usize); R] = const { places::<FIRST, R>() };
    let mut bases: [*const u8; MAX_BASES] = [a.ptr.cast::<u8>(); MAX_BASES];
    for (i, &(g, at)) in place.iter().enumerate() {
        if at == 0 {
            bases[g] = row_at(FIRST + i);
        }
    }
    let groups = place[R - 1].0 + 1;
    let offsets: [usize; ROWS_PER_BASE] = std::array::from_fn(|k| k * a.stride);
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    if load_c {
        for (i, row) in acc.iter_mut().enumerate() {
            for (v, x) in row.iter_mut().enumerate() {
                // SAFETY: row `FIRST + i < 32` of C has 32 readable floats.
                *x = unsafe { _mm512_loadu_ps(c.add((FIRST + i) * ldc + 16 * v)) };
            }
        }
    }
    for s in 0..ksteps {
        let pairs = if s + 1 == ksteps { last_pairs } else { 16 };
        // SAFETY: k step `s` of the panel is 1024 u16 at `b + 1024 s`.
        let bs = unsafe { b.add(s * 1024) };
        for r in 0..pairs {
            for base in bases.iter_mut().take(groups) {
                *base = super::opaque(*base);
            }
            // SAFETY: pair row `r < 16` of the step: B's `V` vectors, and each A row's pair at
            // its group's base (advanced to this pair) plus the row's place in the group.
            unsafe {
                let bv: [__m512bh; V] = std::array::from_fn(|v| {
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                        bs.add(512 * v + r * 32).cast(),
                    ))
                });
                for (row, &(g, at)) in acc.iter_mut().zip(&place) {
                    let pair = bases[g].add(offsets[at]).cast::<i32>().read_unaligned();
                    let av = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(pair));
                    for (x, &bx) in row.iter_mut().zip(&bv) {
                        *x = _mm512_dpbf16_ps(*x, av, bx);
                    }
                }
            }
            for base in bases.iter_mut().take(groups) {
                *base = base.wrapping_add(4);
            }
        }
        // On to the next k step: `step` bytes from this one's start.
        for base in bases.iter_mut().take(groups) {
            *base = base.wrapping_add(a.step - 4 * pairs);
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (v, &x) in row.iter().enumerate() {
            // SAFETY: row `FIRST + i < 32` of C has 32 writable floats.
            unsafe { _mm512_storeu_ps(c.add((FIRST + i) * ldc + 16 * v), x) };
        }
    }
}

/// `(group, place in it)` of each of the rows `FIRST .. FIRST + R`: groups of
/// [`ROWS_PER_BASE`] consecutive rows, a new one starting at row 16 (the rows below and above
/// it are not evenly strided). Evaluated at compile time, so every row's base and offset are
/// constants of the unrolled loop.
const fn places<const FIRST: usize, const R: usize>() -> [(usize, usize); R] {
    let mut out = [(0, 0); R];
    let (mut group, mut start) = (0, FIRST);
    let mut i = 0;
    while i < R {
        let r = FIRST + i;
        if r - start == ROWS_PER_BASE || (r == 16 && start < 16) {
            group += 1;
            start = r;
        }
        out[i] = (group, r - start);
        i += 1;
    }
    out
}

/// Transposes a 16 x 16 matrix of 32-bit elements held as 16 row vectors.
///
/// Three stages: 32-bit and 64-bit interleaves within 128-bit lanes leave, in lane `L` of
/// `u[4g + c]`, rows `4g .. 4g + 4` of column `4L + c`; two rounds of 128-bit lane shuffles
/// then gather each column's four lanes.
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose16x16_u32(r: [__m512i; 16]) -> [__m512i; 16] {
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    let mut u = [_mm512_setzero_si512(); 16];
    for g in 0..4 {
        let (t0, t1, t2, t3) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
        u[4 * g] = _mm512_unpacklo_epi64(t0, t2);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t0, t2);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t1, t3);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t1, t3);
    }
    let mut out = [_mm512_setzero_si512(); 16];
    for c in 0..4 {
        // 0x88 takes lanes (a0, a2, b0, b2), 0xDD lanes (a1, a3, b1, b3).
        let x0 = _mm512_shuffle_i32x4::<0x88>(u[c], u[4 + c]);
        let x1 = _mm512_shuffle_i32x4::<0xDD>(u[c], u[4 + c]);
        let y0 = _mm512_shuffle_i32x4::<0x88>(u[8 + c], u[12 + c]);
        let y1 = _mm512_shuffle_i32x4::<0xDD>(u[8 + c], u[12 + c]);
        out[c] = _mm512_shuffle_i32x4::<0x88>(x0, y0);
        out[4 + c] = _mm512_shuffle_i32x4::<0x88>(x1, y1);
        out[8 + c] = _mm512_shuffle_i32x4::<0xDD>(x0, y0);
        out[12 + c] = _mm512_shuffle_i32x4::<0xDD>(x1, y1);
    }
    out
}

/// Lane mask of the first `n.min(32)` 16-bit elements.
#[inline]
fn mask16(n: usize) -> __mmask32 {
    if n >= 32 { !0 } else { (1u32 << n) - 1 }
}

/// Packs B stored transposed (`n x k`, `B[p, j]` at `b + j * ldb + p`) into the VNNI panels
/// of the crate's `bf16_gemm`'s layout, zero-filling k past `k` and columns past `n`.
///
/// In that layout a tile row holds one k pair for 16 columns, and a k pair of a column is one
/// 32-bit element of B's stored row, so each tile is a 16 x 16 transpose of 32-bit elements.
///
/// # Safety
///
/// AVX-512F and AVX-512BW are available; `b` is readable at `j * ldb + p` for `j < n`,
/// `p < k`; `dst` is writable for `n.div_ceil(32) * k.div_ceil(32) * 1024` u16.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn pack_b_cols(dst: *mut u16, b: *const u16, ldb: usize, k: usize, n: usize) {
    let kblocks = k.div_ceil(32);
    for jp in 0..n.div_ceil(32) {
        for kb in 0..kblocks {
            let p0 = kb * 32;
            let mask = mask16(k - p0);
            for t in 0..2 {
                let j0 = jp * 32 + t * 16;
                let rows: [__m512i; 16] = std::array::from_fn(|jj| {
                    if j0 + jj < n {
                        // SAFETY: stored row `j0 + jj < n`, elements `p0 ..` below `k` (the
                        // mask covers no more), all inside B's extent.
                        unsafe { _mm512_maskz_loadu_epi16(mask, b.add((j0 + jj) * ldb + p0).cast()) }
                    } else {
                        _mm512_setzero_si512()
                    }
                });
                let tile = transpose16x16_u32(rows);
                // SAFETY: tile `t` of panel `jp`, k block `kb` is 512 u16 inside `dst`.
                unsafe {
                    let d = dst.add((jp * kblocks + kb) * 1024 + t * 512);
                    for (r, v) in tile.iter().enumerate() {
                        _mm512_storeu_si512(d.add(r * 32).cast(), *v);
                    }
                }
            }
        }
    }
}

/// Packs rows `i0 .. i0 + 32` of a transposed A (`k x m`, `A[i, p]` at `a + p * lda + i`) into
/// `nkb` packed A tiles from k block 0 (each 32 rows of 32 k values), zero-filling rows past
/// `m` and k past `k`.
///
/// Two stored rows (k values `p`, `p + 1`) are interleaved into the k pairs of 32 rows, then
/// each 16 x 16 block of pairs is transposed so that a tile row holds one row's pairs.
///
/// # Safety
///
/// AVX-512F and AVX-512BW are available; `a` is readable at `p * lda + i` for `p < k`,
/// `i0 <= i < m`; `dst` is writable for `nkb * 1024` u16, `nkb = k.div_ceil(32)`.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn pack_a_cols(dst: *mut u16, a: *const u16, lda: usize, k: usize, m: usize, i0: usize) {
    let (lo, hi) = pair_indices();
    let mask = mask16(m - i0);
    for kb in 0..k.div_ceil(32) {
        let mut pairs_lo = [_mm512_setzero_si512(); 16];
        let mut pairs_hi = [_mm512_setzero_si512(); 16];
        for r in 0..16 {
            let p = kb * 32 + 2 * r;
            let row = |p: usize| {
                if p < k {
                    // SAFETY: stored row `p < k`, columns `i0 ..` below `m` (masked).
                    unsafe { _mm512_maskz_loadu_epi16(mask, a.add(p * lda + i0).cast()) }
                } else {
                    _mm512_setzero_si512()
                }
            };
            let (r0, r1) = (row(p), row(p + 1));
            pairs_lo[r] = _mm512_permutex2var_epi16(r0, lo, r1);
            pairs_hi[r] = _mm512_permutex2var_epi16(r0, hi, r1);
        }
        for (half, pairs) in [pairs_lo, pairs_hi].into_iter().enumerate() {
            let rows = transpose16x16_u32(pairs);
            // SAFETY: rows `16 half ..` of k block `kb` are 512 u16 inside `dst`.
            unsafe {
                let d = dst.add(kb * 1024 + half * 512);
                for (i, v) in rows.iter().enumerate() {
                    _mm512_storeu_si512(d.add(i * 32).cast(), *v);
                }
            }
        }
    }
}

/// `permutex2var_epi16` indices interleaving two rows of 32 u16 pairwise: the low result takes
/// columns 0-15 (`2j` from the first row, `2j + 1` from the second), the high one 16-31.
#[target_feature(enable = "avx512f")]
#[inline]
fn pair_indices() -> (__m512i, __m512i) {
    let mut lo = [0i16; 32];
    let mut hi = [0i16; 32];
    for j in 0..16 {
        lo[2 * j] = j as i16;
        lo[2 * j + 1] = 32 + j as i16;
        hi[2 * j] = 16 + j as i16;
        hi[2 * j + 1] = 48 + j as i16;
    }
    // SAFETY: the index arrays are 64 bytes each.
    unsafe { (_mm512_loadu_si512(lo.as_ptr().cast()), _mm512_loadu_si512(hi.as_ptr().cast())) }
}
