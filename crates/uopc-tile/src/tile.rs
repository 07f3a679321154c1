//! The register-tile ABI between the blocked GEMM driver and each ISA's micro-kernel: one
//! tile's work ([`Tile`]) and what a kernel provides ([`TileKernel`]). A leaf: the kernels
//! under `x86` implement it without importing the driver.

/// One register tile's work: `C[0..mr, 0..nr] (+)= A_panel · B_panel` over `kc` steps.
pub(crate) struct Tile {
    /// Rows, `1..=MR`.
    pub mr: usize,
    /// Columns, `1..=NR`.
    pub nr: usize,
    /// k steps (at least 1).
    pub kc: usize,
    /// `A[i, p]` is at `a + p * lda + i` when `a_colmajor`, else at `a + i * lda + p`.
    pub a: *const f32,
    pub lda: usize,
    pub a_colmajor: bool,
    /// Row `p` of the B panel starts at `b + p * ldb` and has `NR` readable floats (those past
    /// `nr` are padding: read, but their results dropped).
    pub b: *const f32,
    pub ldb: usize,
    /// `C[i, j]` is at `c + i * ldc + j`; only the `mr x nr` corner is accessed.
    pub c: *mut f32,
    pub ldc: usize,
    /// Add to C instead of overwriting it.
    pub accumulate: bool,
}

/// An ISA's register-tile kernel and B packing.
pub(crate) trait TileKernel {
    /// Rows of the register tile.
    const MR: usize;
    /// Columns of the register tile (a whole number of vectors).
    const NR: usize;

    /// Runs one tile.
    ///
    /// # Safety
    ///
    /// The CPU supports the kernel's ISA and every pointer in `t` is valid as `Tile` describes.
    unsafe fn tile(t: &Tile);

    /// Packs untransposed B into one panel: `dst[p * NR + j] = src[p * ldb + j]` for `p < kc`,
    /// `j < nr`, and zero for `nr <= j < NR`.
    ///
    /// # Safety
    ///
    /// The CPU supports the kernel's ISA, `dst` is writable for `kc * NR` floats and `src`
    /// readable at every `p * ldb + j` above.
    unsafe fn pack_b(dst: *mut f32, src: *const f32, ldb: usize, kc: usize, nr: usize);

    /// Packs `B^T` into one panel: `dst[p * NR + j] = src[j * ldb + p]` for `p < kc`, `j < nr`,
    /// and zero for `nr <= j < NR`.
    ///
    /// # Safety
    ///
    /// The CPU supports the kernel's ISA, `dst` is writable for `kc * NR` floats and `src`
    /// readable at every `j * ldb + p` above.
    unsafe fn pack_bt(dst: *mut f32, src: *const f32, ldb: usize, kc: usize, nr: usize);

    /// Packs `mr` rows of A into one k-major strip: `dst[p * MR + i] = src[i * lda + p]` for
    /// `p < kc`, `i < mr`, and zero for `mr <= i < MR`.
    ///
    /// # Safety
    ///
    /// The CPU supports the kernel's ISA, `dst` is writable for `kc * MR` floats and `src`
    /// readable at every `i * lda + p` above.
    unsafe fn pack_a_rows(dst: *mut f32, src: *const f32, lda: usize, kc: usize, mr: usize);

    /// [`TileKernel::pack_a_rows`] from 16-bit storage, each value widened exactly to f32.
    ///
    /// # Safety
    ///
    /// As [`TileKernel::pack_a_rows`], with `H`'s widening features available.
    unsafe fn pack_a_rows_half<H: HalfFloat>(dst: *mut f32, src: *const H, lda: usize, kc: usize, mr: usize);

    /// [`TileKernel::pack_b`] from 16-bit storage, each value widened exactly to f32.
    ///
    /// # Safety
    ///
    /// As [`TileKernel::pack_b`], with `H`'s widening features available.
    unsafe fn pack_b_half<H: HalfFloat>(dst: *mut f32, src: *const H, ldb: usize, kc: usize, nr: usize);

    /// [`TileKernel::pack_bt`] from 16-bit storage, each value widened exactly to f32.
    ///
    /// # Safety
    ///
    /// As [`TileKernel::pack_bt`], with `H`'s widening features available.
    unsafe fn pack_bt_half<H: HalfFloat>(dst: *mut f32, src: *const H, ldb: usize, kc: usize, nr: usize);
}

/// A 16-bit float type (f16, bf16) the kernels' packing widens exactly to f32 as it copies:
/// the widening routines behind [`TileKernel`]'s `_half` packers, for a panel of `NR` floats
/// a row (implemented with the vector kernels, under `x86`).
///
/// Its widening features: F16C (and AVX) for f16, AVX2 for bf16, both of which every vector
/// kernel's ISA includes but for F16C, which f16's callers check.
pub(crate) trait HalfFloat: Copy {
    /// `dst[i] = src[i]` widened, for `i < n`.
    ///
    /// # Safety
    ///
    /// `src` readable and `dst` writable for `n` values, not overlapping; the type's widening
    /// features available.
    unsafe fn widen(dst: *mut f32, src: *const Self, n: usize);

    /// [`TileKernel::pack_b`]'s panel of width `NR`, widened.
    ///
    /// # Safety
    ///
    /// As [`TileKernel::pack_b`] with `nr <= NR` and `NR` a multiple of 8, with the type's
    /// widening features available.
    unsafe fn pack_b<const NR: usize>(dst: *mut f32, src: *const Self, ldb: usize, kc: usize, nr: usize);

    /// [`TileKernel::pack_bt`]'s panel of width `NR`, widened.
    ///
    /// # Safety
    ///
    /// As [`TileKernel::pack_bt`] with `nr <= NR`, with the type's widening features available.
    unsafe fn pack_bt<const NR: usize>(dst: *mut f32, src: *const Self, ldb: usize, kc: usize, nr: usize);
}
