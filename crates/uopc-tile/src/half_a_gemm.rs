//! 16-bit A x f32 B -> f32 GEMM: `C (+)= A · B` with an f16 or bf16 A, an f32 B stored by
//! rows, by columns or in panels ([`GemmShape::b_panel_width`]), and an f32 C.
//!
//! For attention whose keys and values are packed once per run into f32 panels while its
//! 16-bit queries stay where they lie: the blocked driver widens each block of A exactly as
//! it packs it (as [`crate::gemm_f16`] does) and reads B's panels in place, so the score GEMM
//! of every key block reads the queries from q itself, as f32 attention does, and needs no f32
//! copy of them. Where the driver does not run (at most eight rows, whose f32 kernels stream
//! B; a CPU without F16C for f16; the portable ISA; panels that are not a whole number of
//! register tiles wide) A is widened into a dense copy and the f32 GEMM runs on that. Widening
//! is exact, so the result is the f32 GEMM of the widened A up to the order of the f32 sums.

use half::{bf16, f16};

use crate::half_operand::HalfOperand;
use crate::{GemmDesc, GemmShape, Isa, TileError};

/// `C (+)= A · B` with f16 A, f32 B (by rows, columns or in panels) and f32 C, every operand
/// checked against `s` first.
///
/// `s` means what it means for the f32 [`crate::gemm`], panels included.
///
/// # Errors
///
/// Nothing is read or written when one is returned: [`TileError::IsaUnavailable`] if `isa`
/// cannot run here; the errors of [`GemmShape::extents`];
/// [`TileError::BufferTooSmall`] if a slice is shorter than its extent.
///
/// # Examples
///
/// ```rust
/// use half::f16;
/// use uopc_tile::{GemmShape, Isa, TileError, gemm_f16_f32};
///
/// let a = [1.0, 2.0, 3.0, 4.0].map(f16::from_f32); // [[1, 2], [3, 4]]
/// let b = [1.0f32, 0.5, 0.0, 1.0]; // [[1, 0.5], [0, 1]]
/// let mut c = [f32::NAN; 4]; // not read: the shape overwrites C
/// gemm_f16_f32(Isa::detect(), &GemmShape::dense(2, 2, 2, false, false, false), &a, &b, &mut c)?;
/// assert_eq!(c, [1.0, 2.5, 3.0, 5.5]);
///
/// let short = gemm_f16_f32(Isa::Portable, &GemmShape::dense(2, 2, 2, false, false, false), &a, &b[..3], &mut c);
/// assert_eq!(short, Err(TileError::BufferTooSmall { operand: "b", needed: 4, len: 3 }));
/// # Ok::<(), TileError>(())
/// ```
pub fn gemm_f16_f32(isa: Isa, s: &GemmShape, a: &[f16], b: &[f32], c: &mut [f32]) -> Result<(), TileError> {
    checked(isa, s, a, b, c)
}

/// [`gemm_f16_f32`] on raw pointers, without checks.
///
/// # Safety
///
/// * `isa.available()` is true.
/// * With `[na, nb, nc] = s.extents()` (which must be `Ok`): `a` is valid for reads of `na`
///   f16, `b` for reads of `nb` f32, and `c` for reads and writes of `nc` f32 (only writes
///   when `!s.accumulate`); all aligned for their types (null is fine for an extent of 0).
/// * The C region does not overlap A or B, and nothing else accesses it during the call.
pub unsafe fn gemm_f16_f32_unchecked(isa: Isa, s: &GemmShape, a: *const f16, b: *const f32, c: *mut f32) {
    // SAFETY: forwarded from this function's contract.
    unsafe { half_a_gemm(isa, s, a, b, c) }
}

/// `C (+)= A · B` with bf16 A, f32 B (by rows, columns or in panels) and f32 C, every operand
/// checked against `s` first: [`gemm_f16_f32`] for bf16 A.
///
/// # Errors
///
/// As [`gemm_f16_f32`].
///
/// # Examples
///
/// ```rust
/// use half::bf16;
/// use uopc_tile::{GemmShape, Isa, TileError, gemm_bf16_f32};
///
/// let a = [1.0, 2.0, 3.0, 4.0].map(bf16::from_f32); // [[1, 2], [3, 4]]
/// let b = [1.0f32, 0.5, 0.0, 1.0]; // [[1, 0.5], [0, 1]]
/// let mut c = [f32::NAN; 4];
/// gemm_bf16_f32(Isa::detect(), &GemmShape::dense(2, 2, 2, false, false, false), &a, &b, &mut c)?;
/// assert_eq!(c, [1.0, 2.5, 3.0, 5.5]);
/// # Ok::<(), TileError>(())
/// ```
pub fn gemm_bf16_f32(isa: Isa, s: &GemmShape, a: &[bf16], b: &[f32], c: &mut [f32]) -> Result<(), TileError> {
    checked(isa, s, a, b, c)
}

/// [`gemm_bf16_f32`] on raw pointers, without checks.
///
/// # Safety
///
/// The contract of [`gemm_f16_f32_unchecked`], with `a` valid for reads of `na` bf16 instead.
pub unsafe fn gemm_bf16_f32_unchecked(isa: Isa, s: &GemmShape, a: *const bf16, b: *const f32, c: *mut f32) {
    // SAFETY: forwarded from this function's contract.
    unsafe { half_a_gemm(isa, s, a, b, c) }
}

/// The ISA and every operand checked against `s`, then [`half_a_gemm`].
fn checked<H: HalfOperand>(
    isa: Isa,
    s: &GemmShape,
    a: &[H],
    b: &[f32],
    c: &mut [f32],
) -> Result<(), TileError> {
    crate::gemm::check_operands(isa, s, [a.len(), b.len(), c.len()], crate::gemm::BPanels::F32)?;
    // SAFETY: the ISA is available, each slice covers its operand's extent, and `c` is a unique
    // borrow, so it cannot overlap `a` or `b`.
    unsafe { half_a_gemm(isa, s, a.as_ptr(), b.as_ptr(), c.as_mut_ptr()) };
    Ok(())
}

/// `C (+)= A · B` with 16-bit A on the path the module docs describe. Serial: a
/// [`GemmShape::parallel`] request is not honoured (attention's callers own the threads).
///
/// # Safety
///
/// The contract of [`gemm_f16_f32_unchecked`], with `a` valid for reads of A's extent in `H`s.
unsafe fn half_a_gemm<H: HalfOperand>(isa: Isa, s: &GemmShape, a: *const H, b: *const f32, c: *mut f32) {
    let s = &GemmShape { parallel: false, ..*s };
    let GemmShape { m, n, k, .. } = *s;
    if m == 0 || n == 0 || k == 0 {
        // No input is read; the f32 GEMM zeroes C (or leaves it) exactly as this would.
        // SAFETY: the extents of A and B are not touched for these shapes; C's is the caller's.
        unsafe { crate::gemm_unchecked(isa, s, std::ptr::null(), std::ptr::null(), c) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let whole_tiles = |isa| s.b_panel_width.is_multiple_of(crate::panels::panel_width(isa));
        if m > crate::x86::half_rows::HALF_ROWS_MAX && H::vector_widening() {
            match isa {
                Isa::Avx512 if whole_tiles(Isa::Avx512) => {
                    // SAFETY: the ISA and the type's widening features are available; panels
                    // (if any) are whole register tiles wide, as the driver reads them; the
                    // operands are the caller's.
                    return unsafe {
                        crate::blocked::drive::<crate::x86::avx512::Kernel, H, f32>(s, a, b, c)
                    };
                }
                Isa::Avx2Fma if whole_tiles(Isa::Avx2Fma) => {
                    // SAFETY: as above, for AVX2+FMA.
                    return unsafe { crate::blocked::drive::<crate::x86::avx2::Kernel, H, f32>(s, a, b, c) };
                }
                _ => {}
            }
        }
    }
    // A widened into a dense copy (`rows x cols` of its storage, leading dimension `cols`),
    // then the f32 GEMM with B as it is.
    let (rows, cols) = s.a_dims();
    let mut wide = vec![0.0f32; rows * cols];
    for (r, dst) in wide.chunks_exact_mut(cols).enumerate() {
        // SAFETY: stored row `r < rows` spans `cols` elements at `r * lda`, inside A's extent
        // (the caller's contract).
        let row = unsafe { std::slice::from_raw_parts(a.add(r * s.lda), cols) };
        H::widen_slice(row, dst);
    }
    let dense = GemmShape { lda: cols, ..*s };
    // SAFETY: the copy is A's `rows x cols` with leading dimension `cols`, which is `dense`'s
    // extent of A; B and C are the caller's.
    unsafe { crate::gemm_unchecked(isa, &dense, wide.as_ptr(), b, c) };
}

/// Flat C-ABI GEMM with f16 A and f32 B (by rows, columns or in panels) for JIT-compiled
/// code: `C (+)= A · B` on the fastest ISA here, arguments as for
/// [`crate::uopc_tile_gemm_f32`] (`a` points to f16 bit patterns).
///
/// Returns 0 on success, or -1 without touching memory if a size is negative, `flags` has
/// unknown bits, a leading dimension is too small, an extent overflows, or a pointer is null
/// while its operand is non-empty.
///
/// # Safety
///
/// The pointers must satisfy the contract of [`gemm_f16_f32_unchecked`] for the decoded shape.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // a flat register-passed ABI is the point of this entry
pub unsafe extern "C" fn uopc_tile_gemm_f16_f32(
    a: *const f16,
    b: *const f32,
    c: *mut f32,
    m: i64,
    n: i64,
    k: i64,
    lda: i64,
    ldb: i64,
    ldc: i64,
    flags: i64,
) -> i32 {
    let desc = GemmDesc { m, n, k, lda, ldb, ldc, flags };
    // SAFETY: `desc` is a valid descriptor; the pointer contract is forwarded from our caller.
    unsafe { crate::gemm::run_entry(&desc, a, b, c, crate::gemm::BPanels::F32, half_a_gemm) }
}

/// Flat C-ABI GEMM with bf16 A and f32 B: [`uopc_tile_gemm_f16_f32`] for bf16 A.
///
/// # Safety
///
/// The pointers must satisfy the contract of [`gemm_bf16_f32_unchecked`] for the decoded shape.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // a flat register-passed ABI is the point of this entry
pub unsafe extern "C" fn uopc_tile_gemm_bf16_f32(
    a: *const bf16,
    b: *const f32,
    c: *mut f32,
    m: i64,
    n: i64,
    k: i64,
    lda: i64,
    ldb: i64,
    ldc: i64,
    flags: i64,
) -> i32 {
    let desc = GemmDesc { m, n, k, lda, ldb, ldc, flags };
    // SAFETY: `desc` is a valid descriptor; the pointer contract is forwarded from our caller.
    unsafe { crate::gemm::run_entry(&desc, a, b, c, crate::gemm::BPanels::F32, half_a_gemm) }
}
