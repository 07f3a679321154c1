//! f16 x f16 -> f32 GEMM: `C (+)= A · B` with f16 operands and an f32 result, on the f32
//! micro-kernels.
//!
//! On AVX-512 and AVX2 the operands go through the f32 GEMM's own blocked driver, whose
//! packing widens them (`vcvtph2ps`): each k slab of B into the register tile's panels, and
//! each block of A into a dense f32 block (the tile broadcasts single values of A, which it
//! cannot do from f16 without a conversion per use). So an f16 GEMM makes one pass over its
//! inputs, as an f32 one packing its B does; only small untransposed B slabs, which the f32
//! driver reads in place, cost f16 a packing pass that f32 skips. Widening is exact and every
//! f16 product is exact in f32, so the result is the f32 GEMM of the exact inputs. Products
//! of at most eight rows stream B in storage order instead, widening it in registers
//! (`x86::half_rows`). The portable path, and a CPU without F16C, widen the operands whole
//! and run the f32 GEMM.
//!
//! The alternative, narrowing f16 to bf16 for `vdpbf16ps`, would drop 3 of f16's 11
//! significant bits from every input (and overflow nothing, but round everything), so results
//! would no longer match an f32 computation on the same f16 data.
//!
//! The same driver takes an f32 A with a bf16 B ([`gemm_f32_bf16`]): the product of an f32
//! tile of bf16-valued probabilities and bf16 values, on machines whose bf16 GEMMs widen.

use half::{bf16, f16};

use crate::half_operand::HalfOperand as OperandB;
use crate::{GemmDesc, GemmShape, Isa, TileError};

/// `C (+)= A · B` with f16 A and B and f32 C, every operand checked against `s` first.
///
/// `s` means what it means for the f32 [`crate::gemm`] (element counts, either operand
/// transposed, `accumulate`). Inputs are widened to f32 exactly and multiplied with the f32
/// kernels of `isa`, so the result equals [`crate::gemm`] on the widened inputs up to the
/// order of the f32 sums (subnormal f16 inputs included).
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
/// use uopc_tile::{GemmShape, Isa, TileError, gemm_f16};
///
/// let h = |x: f32| f16::from_f32(x);
/// let a = [h(1.0), h(2.0), h(3.0), h(4.0)]; // [[1, 2], [3, 4]]
/// let b = [h(1.0), h(0.5), h(0.0), h(1.0)]; // [[1, 0.5], [0, 1]]
/// let mut c = [f32::NAN; 4]; // not read: the shape overwrites C
/// gemm_f16(Isa::detect(), &GemmShape::dense(2, 2, 2, false, false, false), &a, &b, &mut c)?;
/// assert_eq!(c, [1.0, 2.5, 3.0, 5.5]);
///
/// let short = gemm_f16(Isa::Portable, &GemmShape::dense(2, 2, 2, false, false, false), &a, &b[..3], &mut c);
/// assert_eq!(short, Err(TileError::BufferTooSmall { operand: "b", needed: 4, len: 3 }));
/// # Ok::<(), TileError>(())
/// ```
pub fn gemm_f16(isa: Isa, s: &GemmShape, a: &[f16], b: &[f16], c: &mut [f32]) -> Result<(), TileError> {
    checked(isa, s, a, b, c)
}

/// `C (+)= A · B` on raw pointers, without checks.
///
/// # Safety
///
/// * `isa.available()` is true.
/// * With `[na, nb, nc] = s.extents()` (which must be `Ok`): `a` is valid for reads of `na`
///   f16, `b` for reads of `nb`, and `c` for reads and writes of `nc` f32 (only writes when
///   `!s.accumulate`); all aligned for their types (null is fine for an extent of 0).
/// * The C region does not overlap A or B, and nothing else accesses it during the call.
pub unsafe fn gemm_f16_unchecked(isa: Isa, s: &GemmShape, a: *const f16, b: *const f16, c: *mut f32) {
    // SAFETY: forwarded from this function's contract.
    unsafe { half_b_gemm(isa, s, a, b, c) }
}

/// An f32 copy of an f16 operand's `len` elements of storage: its `rows` stored rows of
/// `cols` values, `ld` apart, widened; the padding between them zero.
///
/// # Safety
///
/// `src` is valid for reads at `r * ld + j` for `r < rows`, `j < cols`, all inside `len`.
unsafe fn widened_copy<H: OperandB>(
    src: *const H,
    len: usize,
    (rows, cols): (usize, usize),
    ld: usize,
) -> Vec<f32> {
    let mut wide = vec![0.0f32; len];
    for r in 0..rows {
        // SAFETY: stored row `r` spans `cols` elements at `r * ld`, inside the operand's
        // extent `len` (the caller's contract).
        let row = unsafe { std::slice::from_raw_parts(src.add(r * ld), cols) };
        H::widen_slice(row, &mut wide[r * ld..r * ld + cols]);
    }
    wide
}

/// `C (+)= A · B` with f32 A, f16 B and f32 C, every operand checked against `s` first.
///
/// The f16 GEMM for a caller that holds A in f32 already (attention's query tile, widened
/// once per task instead of once per key block): B is widened exactly while it is packed, as
/// in [`gemm_f16`], and A is read as it is. `s` means what it means for [`crate::gemm`], and
/// the result equals [`crate::gemm`] on A and the widened B up to the order of the f32 sums.
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
/// use uopc_tile::{GemmShape, Isa, TileError, gemm_f32_f16};
///
/// let a = [1.0f32, 2.0, 3.0, 4.0]; // [[1, 2], [3, 4]]
/// let b = [1.0, 0.5, 0.0, 1.0].map(f16::from_f32); // [[1, 0.5], [0, 1]]
/// let mut c = [f32::NAN; 4]; // not read: the shape overwrites C
/// gemm_f32_f16(Isa::detect(), &GemmShape::dense(2, 2, 2, false, false, false), &a, &b, &mut c)?;
/// assert_eq!(c, [1.0, 2.5, 3.0, 5.5]);
///
/// let short = gemm_f32_f16(Isa::Portable, &GemmShape::dense(2, 2, 2, false, false, false), &a[..3], &b, &mut c);
/// assert_eq!(short, Err(TileError::BufferTooSmall { operand: "a", needed: 4, len: 3 }));
/// # Ok::<(), TileError>(())
/// ```
pub fn gemm_f32_f16(isa: Isa, s: &GemmShape, a: &[f32], b: &[f16], c: &mut [f32]) -> Result<(), TileError> {
    checked(isa, s, a, b, c)
}

/// [`gemm_f32_f16`] on raw pointers, without checks.
///
/// # Safety
///
/// The contract of [`gemm_f16_unchecked`], with `a` valid for reads of `na` f32 instead.
pub unsafe fn gemm_f32_f16_unchecked(isa: Isa, s: &GemmShape, a: *const f32, b: *const f16, c: *mut f32) {
    // SAFETY: forwarded from this function's contract.
    unsafe { half_b_gemm(isa, s, a, b, c) }
}

/// `C (+)= A · B` with f32 A, bf16 B and f32 C, every operand checked against `s` first.
///
/// For machines whose bf16 GEMM widens to f32 anyway ([`crate::Bf16Path::widens`]), and a
/// caller whose A is f32 already (attention's probabilities, rounded to bf16 values but kept
/// in f32): B is widened exactly while it is packed and A is read as it is, on the f32
/// kernels of `isa`. The result equals [`crate::gemm`] on A and the widened B up to the order
/// of the f32 sums.
///
/// # Errors
///
/// As [`gemm_f32_f16`].
///
/// # Examples
///
/// ```rust
/// use half::bf16;
/// use uopc_tile::{GemmShape, Isa, TileError, gemm_f32_bf16};
///
/// let a = [1.0f32, 2.0, 3.0, 4.0]; // [[1, 2], [3, 4]]
/// let b = [1.0, 0.5, 0.0, 1.0].map(bf16::from_f32); // [[1, 0.5], [0, 1]]
/// let mut c = [f32::NAN; 4]; // not read: the shape overwrites C
/// gemm_f32_bf16(Isa::detect(), &GemmShape::dense(2, 2, 2, false, false, false), &a, &b, &mut c)?;
/// assert_eq!(c, [1.0, 2.5, 3.0, 5.5]);
/// # Ok::<(), TileError>(())
/// ```
pub fn gemm_f32_bf16(isa: Isa, s: &GemmShape, a: &[f32], b: &[bf16], c: &mut [f32]) -> Result<(), TileError> {
    checked(isa, s, a, b, c)
}

/// [`gemm_f32_bf16`] on raw pointers, without checks.
///
/// # Safety
///
/// The contract of [`gemm_f16_unchecked`], with `a` valid for reads of `na` f32 and `b` of
/// `nb` bf16 instead.
pub unsafe fn gemm_f32_bf16_unchecked(isa: Isa, s: &GemmShape, a: *const f32, b: *const bf16, c: *mut f32) {
    // SAFETY: forwarded from this function's contract.
    unsafe { half_b_gemm(isa, s, a, b, c) }
}

/// The A operand of a GEMM with f16 B: f16 (widened like B) or f32 (read as it is).
trait OperandA: crate::blocked::Element {
    /// A's rows for the few-row kernel, which widens f16 in registers.
    #[cfg(target_arch = "x86_64")]
    fn rows(a: *const Self) -> crate::x86::half_rows::RowsA;

    /// A as f32 for the fallback path: a widened copy of its `len` elements of storage, or
    /// `None` when A is f32 already.
    ///
    /// # Safety
    ///
    /// `len` is A's extent under `s`, and `a` is valid for reads of it.
    unsafe fn widened(a: *const Self, s: &GemmShape, len: usize) -> Option<Vec<f32>>;
}

impl OperandA for f16 {
    #[cfg(target_arch = "x86_64")]
    fn rows(a: *const f16) -> crate::x86::half_rows::RowsA {
        // f16 is a transparent u16
        crate::x86::half_rows::RowsA::Half(a.cast())
    }

    unsafe fn widened(a: *const f16, s: &GemmShape, len: usize) -> Option<Vec<f32>> {
        // SAFETY: the caller's contract.
        Some(unsafe { widened_copy(a, len, s.a_dims(), s.lda) })
    }
}

impl OperandA for f32 {
    #[cfg(target_arch = "x86_64")]
    fn rows(a: *const f32) -> crate::x86::half_rows::RowsA {
        crate::x86::half_rows::RowsA::Single(a)
    }

    unsafe fn widened(_: *const f32, _: &GemmShape, _: usize) -> Option<Vec<f32>> {
        None
    }
}

/// [`gemm_f16`], [`gemm_f32_f16`] and [`gemm_f32_bf16`]: the ISA and every operand checked
/// against `s`, then [`half_b_gemm`].
fn checked<EA: OperandA, EB: OperandB>(
    isa: Isa,
    s: &GemmShape,
    a: &[EA],
    b: &[EB],
    c: &mut [f32],
) -> Result<(), TileError> {
    crate::gemm::check_operands(isa, s, [a.len(), b.len(), c.len()], crate::gemm::BPanels::None)?;
    // SAFETY: the ISA is available, each slice covers its operand's extent, and `c` is a unique
    // borrow, so it cannot overlap `a` or `b`.
    unsafe { half_b_gemm(isa, s, a.as_ptr(), b.as_ptr(), c.as_mut_ptr()) };
    Ok(())
}

/// `C (+)= A · B` with 16-bit B and an A of type `EA`, on the path the module docs describe:
/// few rows streamed, the blocked driver widening while it packs, or (portable, no F16C for
/// f16) the operands widened whole for the f32 GEMM.
///
/// # Safety
///
/// The contract of [`gemm_f16_unchecked`], with `a` valid for reads of A's extent in `EA`s
/// and `b` of B's in `EB`s.
unsafe fn half_b_gemm<EA: OperandA, EB: OperandB>(
    isa: Isa,
    s: &GemmShape,
    a: *const EA,
    b: *const EB,
    c: *mut f32,
) {
    let GemmShape { m, n, k, .. } = *s;
    if m == 0 || n == 0 || k == 0 {
        // No input is read; the f32 GEMM zeroes C (or leaves it) exactly as this would.
        // SAFETY: the extents of A and B are not touched for these shapes; C's is the caller's.
        unsafe { crate::gemm_unchecked(isa, s, std::ptr::null(), std::ptr::null(), c) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // A few rows of A cannot amortize packing B: stream it, widening in registers (the
        // same exact f32 products).
        if isa == Isa::Avx512 && crate::x86::half_rows::streams_b(s) {
            // SAFETY: AVX-512F is available (the ISA); the shape is in the kernel's range and
            // the pointers are this function's contract.
            unsafe {
                if EB::F16 {
                    crate::x86::half_rows::gemm::<true>(s, EA::rows(a), b.cast(), c)
                } else {
                    crate::x86::half_rows::gemm::<false>(s, EA::rows(a), b.cast(), c)
                }
            };
            return;
        }
        if isa == Isa::Avx2Fma
            && crate::x86::half_rows::streams_b(s)
            && std::arch::is_x86_feature_detected!("f16c")
        {
            // SAFETY: AVX2, FMA (the ISA) and F16C are available; the shape is in the kernel's
            // range and the pointers are this function's contract.
            unsafe {
                if EB::F16 {
                    crate::x86::avx2_half_rows::gemm::<true>(s, EA::rows(a), b.cast(), c)
                } else {
                    crate::x86::avx2_half_rows::gemm::<false>(s, EA::rows(a), b.cast(), c)
                }
            };
            return;
        }
        if EB::vector_widening() {
            match isa {
                Isa::Avx512 => {
                    // SAFETY: the ISA and F16C are available; the operands are the caller's.
                    return unsafe {
                        crate::blocked::drive::<crate::x86::avx512::Kernel, EA, EB>(s, a, b, c)
                    };
                }
                Isa::Avx2Fma => {
                    // SAFETY: as above.
                    return unsafe { crate::blocked::drive::<crate::x86::avx2::Kernel, EA, EB>(s, a, b, c) };
                }
                Isa::Portable => {}
            }
        }
    }
    // The fallback: the 16-bit operands' stored rows widened into f32 copies of their storage
    // (same leading dimensions, padding zero), then the f32 GEMM on `isa`.
    let Ok([na, nb, _]) = s.extents() else { return };
    // SAFETY: forwarded from this function's contract.
    let (wa, wb) = unsafe { (EA::widened(a, s, na), widened_copy(b, nb, s.b_dims(), s.ldb)) };
    let a32 = wa.as_ref().map_or(a.cast::<f32>(), |w| w.as_ptr());
    // SAFETY: the copies have the operands' extents and layout (an f32 A is read where it is,
    // `EA::widened` giving `None` only then); C is the caller's.
    unsafe { crate::gemm_unchecked(isa, s, a32, wb.as_ptr(), c) };
}

/// [`crate::blocked::drive_rounded`] for two `H` operands on `isa`, rounding into the `H` C at
/// `c` (rows `s.ldc` apart), where [`half_b_gemm`] would take the blocked driver; `false`, with
/// nothing read or written, where it would not (a few rows, the portable ISA, no widening
/// features for `H`).
///
/// # Safety
///
/// The contract of [`crate::blocked::drive_rounded`] for `s` with its C at `c`, with `isa`
/// available.
pub(crate) unsafe fn drive_rounded<H: OperandB>(
    isa: Isa,
    s: &GemmShape,
    a: *const H,
    b: *const H,
    c: *mut H,
) -> bool
where
    f32: crate::convert::BlockConversion<H>,
{
    #[cfg(target_arch = "x86_64")]
    {
        if crate::x86::half_rows::streams_b(s) || !H::vector_widening() {
            return false;
        }
        let rounded = crate::blocked::RoundedC::new(c, s.ldc);
        // SAFETY: the ISA and `H`'s widening features are available; the rest is the caller's
        // contract.
        unsafe {
            match isa {
                Isa::Avx512 => {
                    crate::blocked::drive_rounded::<crate::x86::avx512::Kernel, H, H>(s, a, b, rounded)
                }
                Isa::Avx2Fma => {
                    crate::blocked::drive_rounded::<crate::x86::avx2::Kernel, H, H>(s, a, b, rounded)
                }
                Isa::Portable => return false,
            }
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, s, a, b, c);
        false
    }
}

/// Flat C-ABI f16 GEMM for JIT-compiled code: `C (+)= A · B` on the fastest ISA here.
///
/// Arguments, in order: `a`, `b` (pointers to f16 bit patterns), `c` (pointer to f32), then
/// the `i64`s `m`, `n`, `k`, `lda`, `ldb`, `ldc`, `flags`, as for [`crate::uopc_tile_gemm_f32`].
///
/// Returns 0 on success, or -1 without touching memory if a size is negative, `flags` has
/// unknown bits or a B panel width (only the f32 GEMM reads panels), a leading dimension is
/// too small, an extent overflows, or a pointer is null
/// while its operand is non-empty.
///
/// # Safety
///
/// The pointers must satisfy the contract of [`gemm_f16_unchecked`] for the decoded shape.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // a flat register-passed ABI is the point of this entry
pub unsafe extern "C" fn uopc_tile_gemm_f16(
    a: *const f16,
    b: *const f16,
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
    unsafe { uopc_tile_gemm_f16_desc(&desc, a, b, c) }
}

/// Descriptor-based C-ABI f16 GEMM: `(desc, a, b, c) -> i32`, otherwise like
/// [`uopc_tile_gemm_f16`]. Returns -1 also when `desc` is null.
///
/// # Safety
///
/// `desc` is null or points to a readable [`GemmDesc`]; the pointers must satisfy the contract
/// of [`gemm_f16_unchecked`] for the decoded shape.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn uopc_tile_gemm_f16_desc(
    desc: *const GemmDesc,
    a: *const f16,
    b: *const f16,
    c: *mut f32,
) -> i32 {
    // SAFETY: forwarded from our caller.
    unsafe { crate::gemm::run_entry(desc, a, b, c, crate::gemm::BPanels::None, gemm_f16_unchecked) }
}

/// Flat C-ABI GEMM with f32 A and f16 B for JIT-compiled code: `C (+)= A · B` on the fastest
/// ISA here, arguments and return value as for [`uopc_tile_gemm_f16`] (`a` points to f32).
///
/// # Safety
///
/// The pointers must satisfy the contract of [`gemm_f32_f16_unchecked`] for the decoded shape.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // a flat register-passed ABI is the point of this entry
pub unsafe extern "C" fn uopc_tile_gemm_f32_f16(
    a: *const f32,
    b: *const f16,
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
    unsafe { crate::gemm::run_entry(&desc, a, b, c, crate::gemm::BPanels::None, gemm_f32_f16_unchecked) }
}

/// Flat C-ABI GEMM with f32 A and bf16 B for JIT-compiled code: `C (+)= A · B` on the fastest
/// ISA here, arguments and return value as for [`uopc_tile_gemm_f16`] (`a` points to f32, `b`
/// to bf16 bit patterns).
///
/// # Safety
///
/// The pointers must satisfy the contract of [`gemm_f32_bf16_unchecked`] for the decoded shape.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // a flat register-passed ABI is the point of this entry
pub unsafe extern "C" fn uopc_tile_gemm_f32_bf16(
    a: *const f32,
    b: *const bf16,
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
    unsafe { crate::gemm::run_entry(&desc, a, b, c, crate::gemm::BPanels::None, gemm_f32_bf16_unchecked) }
}
