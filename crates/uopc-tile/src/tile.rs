//! The register-tile ABI between the blocked GEMM driver and each ISA's micro-kernel: one
//! tile's work ([`Tile`]) and what a kernel provides ([`TileKernel`]). A leaf: the kernels
//! under `x86` implement it without importing the driver.

use half::f16;

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

    /// [`TileKernel::pack_a_rows`] from f16 storage, each value widened exactly to f32.
    ///
    /// # Safety
    ///
    /// As [`TileKernel::pack_a_rows`], and F16C is available.
    unsafe fn pack_a_rows_f16(dst: *mut f32, src: *const f16, lda: usize, kc: usize, mr: usize);

    /// [`TileKernel::pack_b`] from f16 storage, each value widened exactly to f32.
    ///
    /// # Safety
    ///
    /// As [`TileKernel::pack_b`], and F16C is available.
    unsafe fn pack_b_f16(dst: *mut f32, src: *const f16, ldb: usize, kc: usize, nr: usize);

    /// [`TileKernel::pack_bt`] from f16 storage, each value widened exactly to f32.
    ///
    /// # Safety
    ///
    /// As [`TileKernel::pack_bt`], and F16C is available.
    unsafe fn pack_bt_f16(dst: *mut f32, src: *const f16, ldb: usize, kc: usize, nr: usize);
}
