//! `C (+)= A · B` for a few rows of A and a wide row-major B (a linear layer's `(in, out)`
//! weight during decode): B is read in storage order, a few rows at a time, each row's stretch
//! of columns front to back, and the products are added into C where it lies. Written once over
//! the vector width ([`F32Lanes`]): the AVX-512 and AVX2 forms are its instances at 16 and 8
//! lanes, each inside a function that enables its ISA.
//!
//! The few-rows register strips (`avx512_few_rows`, `avx2_few_rows`, `half_rows`) keep a strip
//! of C in registers and walk B down its columns, one short piece per row: fine for attention's
//! narrow `V` (a row is the whole strip), but a weight matrix thousands of columns wide is then
//! read in pieces a page apart, which the hardware prefetcher does not follow. Here every read
//! of B is a long contiguous run instead, and C (at most a few KiB per row of A) stays in L1
//! between the rows of B that update it.

use std::arch::x86_64::*;

use super::register_tile::F32Lanes;

/// Rows of B added into C per sweep over a stretch of columns: four loads of B per load and
/// store of C.
const ROWS_PER_STEP: usize = 4;

/// Rows of B ahead of the ones being added whose lines each vector step asks for (two steps
/// ahead): the hardware prefetcher follows one long run well, but the sweep reads four rows
/// at once, each from its own page, and B's rows in a column block of a task are runs of a
/// few hundred bytes a row apart. Two steps ahead covers the latency of L3 at these rates;
/// further ahead measured no better.
const PREFETCH_ROWS_AHEAD: usize = 2 * ROWS_PER_STEP;

/// Floats of C one sweep updates, over all rows of A: 16 KiB, half of L1, so that they stay
/// there while B's rows stream past (a whole row of a weight matrix up to 4096 wide for one
/// row of A).
const STRETCH_FLOATS: usize = 4096;

/// Rows of A that one pass over a block of B's rows updates: each row adds a load and a store
/// of C per four loads of B, and from about eight rows that traffic, not B's, sets the pace
/// (measured on Zen 4: a sweep of 8 rows at once lost to the register strips, while 1, 2 and
/// 4 rows won). More rows of A go in groups of this many, each group meeting the same block
/// of B while it is in L1, so B still comes from memory once.
const ROWS_PER_GROUP: usize = 4;

/// Rows of A up to which this kernel is taken: two groups. Up to there B, read from memory
/// once in long runs, sets the pace (2 flops per 4 bytes of f32 B per row of A: at 8 rows
/// that is 4 flops per byte, far below any of these cores' compute per byte of bandwidth).
const SWEEP_MAX_ROWS: usize = 2 * ROWS_PER_GROUP;

/// Bytes of each row of B from which this kernel is taken: the strips read a row in pieces
/// of 128 columns a row apart, which costs once the rows are long. Below 1 KiB per row the
/// strips measured as fast or faster (a 16-bit B of 384 columns on Zen 4); the sweep was as
/// fast or faster from 1 KiB on a Xeon with two 512-bit FMA ports, and on Zen 4 at the
/// smallest rows tried above that (2.3 KiB of bf16, 3 KiB of f32).
const SWEEP_MIN_ROW_BYTES: usize = 1024;

/// Whether a product of `m` rows of A against a row-major B of `n` columns of `bytes`-byte
/// elements takes the sweep.
pub(crate) fn sweeps(m: usize, n: usize, bytes: usize) -> bool {
    (1..=SWEEP_MAX_ROWS).contains(&m) && n * bytes >= SWEEP_MIN_ROW_BYTES
}

/// An element type of B that the few-rows kernels (this sweep, [`super::key_dots`]) read into
/// lanes `W`, widened to f32 as it is loaded.
pub(crate) trait BElement<W: F32Lanes> {
    /// Bytes per element.
    const BYTES: usize;
    /// The `W::LANES` elements at `p` as f32; only the first `n` (at most `W::LANES`) are
    /// read, the other lanes are 0.
    ///
    /// # Safety
    ///
    /// `W`'s ISA (and F16C for f16) is available and `p` is valid for reads of
    /// `min(n, W::LANES)` elements.
    unsafe fn load(p: *const u8, n: usize) -> W;
}

/// f32 elements, read as they are.
pub(crate) struct F32;
/// bf16 elements (bit patterns), widened exactly.
pub(crate) struct Bf16;
/// f16 elements (bit patterns), widened exactly.
pub(crate) struct F16;

impl<W: F32Lanes> BElement<W> for F32 {
    const BYTES: usize = 4;
    #[inline(always)]
    unsafe fn load(p: *const u8, n: usize) -> W {
        // SAFETY: the caller's.
        unsafe { load::<W>(p.cast(), n) }
    }
}

/// The two 16-bit types at both widths, each through its ISA's widening load.
macro_rules! widened {
    ($($ty:ident, $lanes:ty, $widen:ident, $f16:literal;)*) => {$(
        impl BElement<$lanes> for $ty {
            const BYTES: usize = 2;
            #[inline(always)]
            unsafe fn load(p: *const u8, n: usize) -> $lanes {
                // SAFETY: the caller's.
                unsafe { super::$widen::<$f16>(p.cast(), n) }
            }
        }
    )*};
}

widened! {
    Bf16, __m512, widen16, false;
    F16, __m512, widen16, true;
    Bf16, __m256, widen8, false;
    F16, __m256, widen8, true;
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

impl Sweep {
    /// The operands of one k slab of a 16-bit product `s` of `m` rows: A's slab in f32 rows
    /// `lda` apart from `a`, B's rows `p0 .. p0 + kc` (from `b`, `s.ldb` apart), and C, added
    /// to when `accumulate`.
    #[allow(clippy::too_many_arguments)] // the slab kernels' own parameters, passed on
    pub(crate) fn slab(
        s: &crate::GemmShape,
        m: usize,
        a: *const f32,
        lda: usize,
        b: *const u16,
        p0: usize,
        kc: usize,
        c: *mut f32,
        accumulate: bool,
    ) -> Sweep {
        let b = b.wrapping_add(p0 * s.ldb).cast();
        Sweep { a, lda, b, ldb: s.ldb, c, ldc: s.ldc, m, n: s.n, k: kc, accumulate }
    }

    /// The operands of an f32 product `s` (A and B neither transposed).
    pub(crate) fn f32(s: &crate::GemmShape, a: *const f32, b: *const f32, c: *mut f32) -> Sweep {
        Sweep {
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
        }
    }
}

/// `C (+)= A · B` at 16 lanes for the operands `sw` names, B's elements of type `E`.
///
/// # Safety
///
/// AVX-512F and AVX-512DQ are available, and the operands satisfy [`rows_swept`]'s contract.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
pub(crate) unsafe fn rows_swept_avx512<E: BElement<__m512>>(sw: &Sweep) {
    // SAFETY: forwarded; this function enables the ISA the lanes need.
    unsafe { rows_swept::<__m512, E>(sw) }
}

/// `C (+)= A · B` at 8 lanes for an f32 B.
///
/// # Safety
///
/// AVX2 and FMA are available, and the operands satisfy [`rows_swept`]'s contract.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn rows_swept_avx2(sw: &Sweep) {
    // SAFETY: forwarded; this function enables the ISA the lanes need.
    unsafe { rows_swept::<__m256, F32>(sw) }
}

/// `C (+)= A · B` at 8 lanes for a 16-bit B (f16 widens with F16C's `vcvtph2ps`).
///
/// # Safety
///
/// AVX2, FMA and F16C are available, and the operands satisfy [`rows_swept`]'s contract.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn rows_swept_avx2_half<E: BElement<__m256>>(sw: &Sweep) {
    // SAFETY: forwarded; this function enables the ISA the lanes need.
    unsafe { rows_swept::<__m256, E>(sw) }
}

/// `C (+)= A · B` for the operands `sw` names, B's elements of type `E`, in lanes `W`.
///
/// # Safety
///
/// `W`'s ISA is available (and what `E`'s loads need); `1 <= sw.m <= 8` (the rows [`sweeps`]
/// admits); A is readable at `i * lda + p`, B at `(p * ldb + j) * E::BYTES` bytes and C
/// readable and writable at `i * ldc + j`, for `i < m`, `p < k`, `j < n`; C overlaps neither
/// A nor B. The caller enables the ISA, so that these operations inline into it.
#[inline(always)]
unsafe fn rows_swept<W: F32Lanes, E: BElement<W>>(sw: &Sweep) {
    // SAFETY: forwarded, each instance for its own row count.
    unsafe {
        match sw.m {
            1 => swept::<W, 1, 0, E>(sw),
            2 => swept::<W, 2, 0, E>(sw),
            3 => swept::<W, 3, 0, E>(sw),
            4 => swept::<W, 4, 0, E>(sw),
            5 => swept::<W, 4, 1, E>(sw),
            6 => swept::<W, 4, 2, E>(sw),
            7 => swept::<W, 4, 3, E>(sw),
            8 => swept::<W, 4, 4, E>(sw),
            _ => {}
        }
    }
}

/// [`rows_swept`] for `sw.m == M + M2` rows: the first `M`, then (when `M2 > 0`) the other
/// `M2` against the same rows of B, which the first group has just brought into L1.
///
/// # Safety
///
/// As [`rows_swept`], with `sw.m == M + M2`, `M, M2 <= ROWS_PER_GROUP`.
#[inline(always)]
unsafe fn swept<W: F32Lanes, const M: usize, const M2: usize, E: BElement<W>>(sw: &Sweep) {
    let Sweep { a, lda, b, ldb, c, ldc, n, k, accumulate, .. } = *sw;
    let stretch = STRETCH_FLOATS / (M + M2);
    for j0 in (0..n).step_by(stretch) {
        let cols = stretch.min(n - j0);
        if !accumulate {
            for i in 0..M + M2 {
                for v in (0..cols).step_by(W::LANES) {
                    // SAFETY: columns `j0 + v ..` of row `i < m` of C, up to the stretch's end.
                    unsafe { store::<W>(c.add(i * ldc + j0 + v), cols - v, W::zero()) };
                }
            }
        }
        let mut p = 0;
        while p < k {
            let rows = ROWS_PER_STEP.min(k - p);
            let block = Block { rows, cols };
            let b_rows = b.wrapping_add((p * ldb + j0) * E::BYTES);
            // SAFETY: rows `p .. p + rows <= k` of B from column `j0`, and columns `p ..` of
            // A's rows `< M + M2`, the second group's from row `M`.
            unsafe {
                add_rows::<W, M, E>(a.add(p), lda, b_rows, ldb, c.add(j0), ldc, block);
                if M2 > 0 {
                    let (a2, c2) = (a.add(M * lda + p), c.add(M * ldc + j0));
                    add_rows::<W, M2, E>(a2, lda, b_rows, ldb, c2, ldc, block);
                }
            }
            p += rows;
        }
    }
}

/// The first `min(cols, LANES)` floats at `p`, zero past them; a whole vector is a plain load
/// (a masked one costs more on some cores).
///
/// # Safety
///
/// `W`'s ISA is available and `p` is readable for `min(cols, LANES)` floats.
#[inline(always)]
pub(crate) unsafe fn load<W: F32Lanes>(p: *const f32, cols: usize) -> W {
    // SAFETY: the caller's; a short load is masked to the `cols` floats readable.
    unsafe { if cols >= W::LANES { W::load(p) } else { W::load_lanes(p, W::first_lanes(cols)) } }
}

/// Stores the first `min(cols, LANES)` lanes of `v` at `p`, nothing past them.
///
/// # Safety
///
/// `W`'s ISA is available and `p` is writable for `min(cols, LANES)` floats.
#[inline(always)]
pub(crate) unsafe fn store<W: F32Lanes>(p: *mut f32, cols: usize, v: W) {
    // SAFETY: the caller's; a short store is masked to the `cols` floats writable.
    unsafe { if cols >= W::LANES { W::store(p, v) } else { W::store_lanes(p, W::first_lanes(cols), v) } }
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
/// `W`'s ISA is available (and what `E`'s loads need); `a` is readable at `i * lda + r`, `b`
/// at `(r * ldb + j) * E::BYTES` bytes and `c` readable and writable at `i * ldc + j`, for
/// `i < M`, `r < rows`, `j < cols`.
#[inline(always)]
unsafe fn add_rows<W: F32Lanes, const M: usize, E: BElement<W>>(
    a: *const f32,
    lda: usize,
    b: *const u8,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    Block { rows, cols }: Block,
) {
    // SAFETY: the ISA is available (this function's contract), as for every operation below.
    let zero = unsafe { W::zero() };
    // A's values for these rows of B, 0 past `rows` (their rows of B are not read).
    let mut av = [[zero; ROWS_PER_STEP]; M];
    for (i, av) in av.iter_mut().enumerate() {
        for (r, av) in av.iter_mut().enumerate().take(rows) {
            // SAFETY: `A[i, r]` with `i < M`, `r < rows`.
            *av = unsafe { W::splat(*a.add(i * lda + r)) };
        }
    }
    // Whole vectors, then one short one: `n` is a constant in the first loop, so its loads and
    // stores compile to plain ones with no test per vector.
    let full = cols - cols % W::LANES;
    let line = 64 / E::BYTES;
    for v in (0..full).step_by(W::LANES) {
        if v % line == 0 {
            for r in 0..rows {
                let ahead = b.wrapping_add(((PREFETCH_ROWS_AHEAD + r) * ldb + v) * E::BYTES);
                // SAFETY: SSE is part of x86-64, and PREFETCHT0 reads nothing architecturally
                // (an address past B's rows is only a wasted hint).
                unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.cast::<i8>()) };
            }
        }
        // SAFETY: columns `v .. v + LANES <= cols` (this function's contract).
        unsafe { add_vector::<W, M, E>(&av, rows, b.add(v * E::BYTES), ldb, c.add(v), ldc, W::LANES) };
    }
    if full < cols {
        // SAFETY: columns `full .. cols` (this function's contract).
        unsafe {
            add_vector::<W, M, E>(&av, rows, b.add(full * E::BYTES), ldb, c.add(full), ldc, cols - full)
        };
    }
}

/// One vector of [`add_rows`]: `C[i, 0..n] += sum_{r < rows} av[i][r] B[r, 0..n]` for `i < M`,
/// `n <= LANES`.
///
/// # Safety
///
/// As [`add_rows`], for `n` columns.
#[inline(always)]
unsafe fn add_vector<W: F32Lanes, const M: usize, E: BElement<W>>(
    av: &[[W; ROWS_PER_STEP]; M],
    rows: usize,
    b: *const u8,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    n: usize,
) {
    // SAFETY: the ISA is available (this function's contract), as for every operation below.
    let mut bv = [unsafe { W::zero() }; ROWS_PER_STEP];
    for (r, bv) in bv.iter_mut().enumerate().take(rows) {
        // SAFETY: row `r < rows` of B, `n` columns.
        *bv = unsafe { E::load(b.add(r * ldb * E::BYTES), n) };
    }
    for (i, av) in av.iter().enumerate() {
        // SAFETY: row `i < M` of C, `n` columns.
        unsafe {
            let dst = c.add(i * ldc);
            let mut acc = load::<W>(dst, n);
            for (av, bv) in av.iter().zip(&bv) {
                acc = W::mul_add(*av, *bv, acc);
            }
            store::<W>(dst, n, acc);
        }
    }
}
