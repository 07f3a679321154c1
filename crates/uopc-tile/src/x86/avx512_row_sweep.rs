//! `C (+)= A · B` for a few rows of A and a wide row-major B (a linear layer's `(in, out)`
//! weight during decode): B is read in storage order, a few rows at a time, each row's stretch
//! of columns front to back, and the products are added into C where it lies.
//!
//! [`super::avx512_few_rows::gemm_rows_streamed`] keeps a strip of C in registers and walks B
//! down its columns, one short piece per row: fine for attention's narrow `V` (a row is the
//! whole strip), but a weight matrix thousands of columns wide is then read in pieces a page
//! apart, which the hardware prefetcher does not follow. Here every read of B is a long
//! contiguous run instead, and C (at most a few KiB per row of A) stays in L1 between the rows
//! of B that update it.

use std::arch::x86_64::*;

use super::avx512::lanes;

/// Rows of B added into C per sweep over a stretch of columns: four loads of B per load and
/// store of C.
const ROWS_PER_STEP: usize = 4;

/// Floats of C one sweep updates, over all rows of A: 16 KiB, half of L1, so that they stay
/// there while B's rows stream past (a whole row of a weight matrix up to 4096 wide for one
/// row of A).
const STRETCH_FLOATS: usize = 4096;

/// Rows of A up to which this kernel beats keeping C in registers: each row adds a load and a
/// store of C per four loads of B, and from about eight rows that traffic, not B's, sets the
/// pace (measured on Zen 4: the register strips win at 8 rows, this wins at 1, 2 and 4).
const SWEEP_MAX_ROWS: usize = 4;

/// Bytes of each row of B from which this kernel is taken: the strips read a row in pieces
/// of 128 columns a row apart, which costs once the rows are long; below about 2 KiB per row
/// they measured as fast or faster (Zen 4: a bf16 B of 384 columns swept 20-30% slower, one
/// of 1152 to 1536 columns as fast or faster, an f32 B of 768 columns 15-25% faster).
const SWEEP_MIN_ROW_BYTES: usize = 2048;

/// Whether a product of `m` rows of A against a row-major B of `n` columns of `bytes`-byte
/// elements takes the sweep.
pub(crate) fn sweeps(m: usize, n: usize, bytes: usize) -> bool {
    (1..=SWEEP_MAX_ROWS).contains(&m) && n * bytes >= SWEEP_MIN_ROW_BYTES
}

/// An element type of B the sweep reads, widened to f32 as it is loaded.
pub(crate) trait SweptElement {
    /// Bytes per element.
    const BYTES: usize;
    /// The 16 elements at `p` as f32; only the first `n` (at most 16) are read, the other
    /// lanes are 0.
    ///
    /// # Safety
    ///
    /// AVX-512F is available and `p` is valid for reads of `min(n, 16)` elements.
    unsafe fn load(p: *const u8, n: usize) -> __m512;
}

/// f32 elements, read as they are.
pub(crate) struct F32;
/// bf16 elements (bit patterns), widened exactly.
pub(crate) struct Bf16;
/// f16 elements (bit patterns), widened exactly.
pub(crate) struct F16;

impl SweptElement for F32 {
    const BYTES: usize = 4;
    #[inline]
    unsafe fn load(p: *const u8, n: usize) -> __m512 {
        // SAFETY: the caller's; the load is masked to the `n` elements readable.
        unsafe { _mm512_maskz_loadu_ps(lanes(n), p.cast()) }
    }
}

impl SweptElement for Bf16 {
    const BYTES: usize = 2;
    #[inline]
    unsafe fn load(p: *const u8, n: usize) -> __m512 {
        // SAFETY: the caller's.
        unsafe { super::widen16::<false>(p.cast(), n) }
    }
}

impl SweptElement for F16 {
    const BYTES: usize = 2;
    #[inline]
    unsafe fn load(p: *const u8, n: usize) -> __m512 {
        // SAFETY: the caller's.
        unsafe { super::widen16::<true>(p.cast(), n) }
    }
}

/// Where a sweep reads and writes: A's rows (f32), B's rows (elements of the sweep's type)
/// and C's rows, each with its stride in elements, and the product's extent.
#[derive(Clone, Copy)]
pub(crate) struct Sweep {
    pub(crate) a: *const f32,
    pub(crate) lda: usize,
    pub(crate) b: *const u8,
    pub(crate) ldb: usize,
    pub(crate) c: *mut f32,
    pub(crate) ldc: usize,
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    /// Whether the products are added to C (else C is overwritten).
    pub(crate) accumulate: bool,
}

/// `C (+)= A · B`, B row-major and read in storage order (see the module docs).
///
/// # Safety
///
/// AVX-512F is available, `s.a_trans` and `s.b_trans` are false, [`sweeps`] holds for
/// `s.m` (at most four rows), and the pointers satisfy the crate's `gemm_unchecked` for `s`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn gemm_rows_swept(s: &crate::GemmShape, a: *const f32, b: *const f32, c: *mut f32) {
    let sweep = Sweep {
        a,
        lda: s.lda,
        b: b.cast(),
        ldb: s.ldb,
        c,
        ldc: s.ldc,
        m: s.m,
        n: s.n,
        k: s.k,
        accumulate: s.accumulate,
    };
    // SAFETY: forwarded.
    unsafe { rows_swept::<F32>(&sweep) };
}

/// `C (+)= A · B` for the operands `sw` names, B's elements of type `E`.
///
/// # Safety
///
/// AVX-512F is available; `1 <= sw.m <= 4` (the rows [`sweeps`] admits); A is readable at `i * lda + p`, B at
/// `(p * ldb + j) * E::BYTES` bytes and C readable and writable at `i * ldc + j`, for
/// `i < m`, `p < k`, `j < n`; C overlaps neither A nor B.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn rows_swept<E: SweptElement>(sw: &Sweep) {
    // SAFETY: forwarded, each instance for its own row count.
    unsafe {
        match sw.m {
            1 => swept::<1, E>(sw),
            2 => swept::<2, E>(sw),
            3 => swept::<3, E>(sw),
            4 => swept::<4, E>(sw),
            _ => {}
        }
    }
}

/// [`rows_swept`] for `M == sw.m` rows.
///
/// # Safety
///
/// As [`rows_swept`], with `M == sw.m`.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn swept<const M: usize, E: SweptElement>(sw: &Sweep) {
    let Sweep { a, lda, b, ldb, c, ldc, n, k, accumulate, .. } = *sw;
    let stretch = STRETCH_FLOATS / M;
    for j0 in (0..n).step_by(stretch) {
        let cols = stretch.min(n - j0);
        if !accumulate {
            for i in 0..M {
                for v in (0..cols).step_by(16) {
                    // SAFETY: columns `j0 + v ..` of row `i < m` of C, masked to the stretch.
                    unsafe {
                        _mm512_mask_storeu_ps(c.add(i * ldc + j0 + v), lanes(cols - v), _mm512_setzero_ps())
                    };
                }
            }
        }
        let mut p = 0;
        while p < k {
            let rows = ROWS_PER_STEP.min(k - p);
            let block = Block { rows, cols };
            // SAFETY: rows `p .. p + rows <= k` of B from column `j0`, and columns `p ..` of
            // A's rows `< M`.
            unsafe {
                add_rows::<M, E>(a.add(p), lda, b.add((p * ldb + j0) * E::BYTES), ldb, c.add(j0), ldc, block)
            };
            p += rows;
        }
    }
}

/// The rows of B and the columns of C one [`add_rows`] covers.
#[derive(Clone, Copy)]
struct Block {
    rows: usize,
    cols: usize,
}

/// `C[i, 0..cols] += sum_{r < rows} A[i, r] B[r, 0..cols]` for `i < M`, `rows <= 4`.
///
/// # Safety
///
/// AVX-512F is available; `a` is readable at `i * lda + r`, `b` at `(r * ldb + j) *
/// E::BYTES` bytes and `c` readable and writable at `i * ldc + j`, for `i < M`, `r < rows`,
/// `j < cols`.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn add_rows<const M: usize, E: SweptElement>(
    a: *const f32,
    lda: usize,
    b: *const u8,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    Block { rows, cols }: Block,
) {
    // A's values for these rows of B, 0 past `rows` (their rows of B are not read).
    let mut av = [[_mm512_setzero_ps(); ROWS_PER_STEP]; M];
    for (i, av) in av.iter_mut().enumerate() {
        for (r, av) in av.iter_mut().enumerate().take(rows) {
            // SAFETY: `A[i, r]` with `i < M`, `r < rows`.
            *av = _mm512_set1_ps(unsafe { *a.add(i * lda + r) });
        }
    }
    for v in (0..cols).step_by(16) {
        let mask = lanes(cols - v);
        let mut bv = [_mm512_setzero_ps(); ROWS_PER_STEP];
        for (r, bv) in bv.iter_mut().enumerate().take(rows) {
            // SAFETY: row `r < rows` of B, columns `v ..` up to `cols`.
            *bv = unsafe { E::load(b.add((r * ldb + v) * E::BYTES), cols - v) };
        }
        for (i, av) in av.iter().enumerate() {
            // SAFETY: row `i < M` of C, columns `v ..` masked to `cols`.
            unsafe {
                let dst = c.add(i * ldc + v);
                let mut acc = _mm512_maskz_loadu_ps(mask, dst);
                for (av, bv) in av.iter().zip(&bv) {
                    acc = _mm512_fmadd_ps(*av, *bv, acc);
                }
                _mm512_mask_storeu_ps(dst, mask, acc);
            }
        }
    }
}
