//! Conversions between f32 and the 16-bit storage types `bf16` and `f16`.
//!
//! Narrowing rounds to nearest, ties to even, and keeps NaNs NaN (quiet, sign and top payload
//! bits kept); widening is exact. Results are bit-identical to the `half` crate's, on the scalar
//! and the vector paths alike, so data converted here and there agrees.

use half::{bf16, f16};

use crate::TileError;
use crate::error::check_len;

pub(crate) mod scalar;

/// Runs the widest vector form of one slice conversion the machine model allows (so
/// `UOPC_ISA` caps the conversions as it caps the kernels, and tests reach each form):
/// `avx512` with AVX-512F, else `avx2` with AVX2 and FMA (and F16C when `avx2_needs_f16c`).
/// Returns false, converting nothing, when the model allows neither.
///
/// # Panics
///
/// When `src` and `dst` differ in length (the callers slice `dst` to `src`'s length first).
#[cfg(target_arch = "x86_64")]
fn vectorized<S, D>(
    src: &[S],
    dst: &mut [D],
    avx512: unsafe fn(&[S], &mut [D]),
    avx2: unsafe fn(&[S], &mut [D]),
    avx2_needs_f16c: bool,
) -> bool {
    assert_eq!(src.len(), dst.len(), "a conversion's slices have equal lengths");
    let f = &crate::machine::Machine::get().features;
    let form = if f.avx512f {
        avx512
    } else if f.avx2 && f.fma && (f.f16c || !avx2_needs_f16c) {
        avx2
    } else {
        return false;
    };
    // SAFETY: the model allows the form's ISA only where this CPU has it; the slices have
    // equal lengths (checked above), as every form requires.
    unsafe { form(src, dst) };
    true
}

pub use scalar::{bf16_from_f32, bf16_to_f32, f16_from_f32, f16_to_f32};

/// Narrows `src` into the first `src.len()` elements of `dst` with [`bf16_from_f32`].
///
/// # Errors
///
/// [`TileError::BufferTooSmall`] (operand `"dst"`) if `dst` is shorter than `src`; nothing is
/// written then.
pub fn f32_to_bf16_slice(src: &[f32], dst: &mut [bf16]) -> Result<(), TileError> {
    check_len("dst", src.len(), dst.len())?;
    let dst = &mut dst[..src.len()];
    #[cfg(target_arch = "x86_64")]
    if vectorized(src, dst, crate::x86::bf16::f32_to_bf16, crate::x86::convert_avx2::f32_to_bf16, false) {
        return Ok(());
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = bf16_from_f32(s);
    }
    Ok(())
}

/// Widens `src` into the first `src.len()` elements of `dst` with [`bf16_to_f32`].
///
/// # Errors
///
/// [`TileError::BufferTooSmall`] (operand `"dst"`) if `dst` is shorter than `src`.
pub fn bf16_to_f32_slice(src: &[bf16], dst: &mut [f32]) -> Result<(), TileError> {
    check_len("dst", src.len(), dst.len())?;
    let dst = &mut dst[..src.len()];
    #[cfg(target_arch = "x86_64")]
    if vectorized(src, dst, crate::x86::bf16::bf16_to_f32, crate::x86::convert_avx2::bf16_to_f32, false) {
        return Ok(());
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = bf16_to_f32(s);
    }
    Ok(())
}

/// Narrows `src` into the first `src.len()` elements of `dst` with [`f16_from_f32`]
/// (`vcvtps2ph`, 16 or 8 at a time on AVX-512 or AVX2 machines).
///
/// # Errors
///
/// [`TileError::BufferTooSmall`] (operand `"dst"`) if `dst` is shorter than `src`.
pub fn f32_to_f16_slice(src: &[f32], dst: &mut [f16]) -> Result<(), TileError> {
    check_len("dst", src.len(), dst.len())?;
    let dst = &mut dst[..src.len()];
    #[cfg(target_arch = "x86_64")]
    if vectorized(src, dst, crate::x86::bf16::f32_to_f16, crate::x86::convert_avx2::f32_to_f16, true) {
        return Ok(());
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f16_from_f32(s);
    }
    Ok(())
}

/// Widens `src` into the first `src.len()` elements of `dst` with [`f16_to_f32`]
/// (`vcvtph2ps`, 16 or 8 at a time on AVX-512 or AVX2 machines).
///
/// # Errors
///
/// [`TileError::BufferTooSmall`] (operand `"dst"`) if `dst` is shorter than `src`.
pub fn f16_to_f32_slice(src: &[f16], dst: &mut [f32]) -> Result<(), TileError> {
    check_len("dst", src.len(), dst.len())?;
    let dst = &mut dst[..src.len()];
    #[cfg(target_arch = "x86_64")]
    if vectorized(src, dst, crate::x86::bf16::f16_to_f32, crate::x86::convert_avx2::f16_to_f32, true) {
        return Ok(());
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f16_to_f32(s);
    }
    Ok(())
}

/// A pair of element types [`convert_block`] converts between: a 16-bit type widened to f32
/// (exactly), or f32 narrowed to a 16-bit type (to nearest even), with the slice conversions
/// above (sealed: exactly those four pairs).
pub trait BlockConversion<D>: Copy + sealed::Sealed {
    /// Converts one row: `dst[i] = src[i]` in `D`, for `i < src.len() <= dst.len()`.
    fn row(src: &[Self], dst: &mut [D]);
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

// The callers pass rows of equal lengths, so the slice conversions cannot fail.
impl BlockConversion<f32> for f16 {
    fn row(src: &[f16], dst: &mut [f32]) {
        f16_to_f32_slice(src, dst).expect("a row as long as its source");
    }
}

impl BlockConversion<f32> for bf16 {
    fn row(src: &[bf16], dst: &mut [f32]) {
        bf16_to_f32_slice(src, dst).expect("a row as long as its source");
    }
}

impl BlockConversion<f16> for f32 {
    fn row(src: &[f32], dst: &mut [f16]) {
        f32_to_f16_slice(src, dst).expect("a row as long as its source");
    }
}

impl BlockConversion<bf16> for f32 {
    fn row(src: &[f32], dst: &mut [bf16]) {
        f32_to_bf16_slice(src, dst).expect("a row as long as its source");
    }
}

/// Converts a `rows x cols` block: `dst[r * ldd + j] = src[r * lds + j]` in `D`, for `r <
/// rows`, `j < cols`; elements between the rows are not touched.
///
/// This is the tile form of the slice conversions, for a loop program that widens a 16-bit
/// block into an f32 tile once (attention's query rows) or rounds an f32 tile into 16-bit
/// storage (its output rows): 16 values per `vcvtph2ps` / `vcvtps2ph` on AVX-512, where
/// generated code converts four at a time with integer operations.
///
/// # Errors
///
/// Nothing is written when one is returned: [`TileError::LeadingDim`] if `lds` (operand
/// `"src"`) or `ldd` (`"dst"`) is below `cols` with more than one row,
/// [`TileError::Overflow`] if an extent overflows, [`TileError::BufferTooSmall`] if a slice
/// is shorter than its extent.
///
/// # Examples
///
/// ```rust
/// use half::f16;
/// use uopc_tile::{TileError, convert::convert_block};
///
/// // Two rows of two, the source rows three apart.
/// let src = [1.0f32, 0.1, f32::NAN, 2.0, -0.5, f32::NAN];
/// let mut dst = [f16::ZERO; 4];
/// convert_block(2, 2, &src, 3, &mut dst, 2)?;
/// assert_eq!(dst, [1.0, 0.1, 2.0, -0.5].map(f16::from_f32));
/// # Ok::<(), TileError>(())
/// ```
pub fn convert_block<S: BlockConversion<D>, D>(
    rows: usize,
    cols: usize,
    src: &[S],
    lds: usize,
    dst: &mut [D],
    ldd: usize,
) -> Result<(), TileError> {
    let ns = crate::error::span("src", rows, cols, lds)?;
    let nd = crate::error::span("dst", rows, cols, ldd)?;
    check_len("src", ns, src.len())?;
    check_len("dst", nd, dst.len())?;
    if cols == 0 {
        return Ok(());
    }
    for r in 0..rows {
        S::row(&src[r * lds..r * lds + cols], &mut dst[r * ldd..r * ldd + cols]);
    }
    Ok(())
}

/// The conversion codes of [`uopc_tile_convert_block`].
pub mod conversion_code {
    /// f16 source, f32 destination.
    pub const F16_TO_F32: i64 = 0;
    /// bf16 source, f32 destination.
    pub const BF16_TO_F32: i64 = 1;
    /// f32 source, f16 destination.
    pub const F32_TO_F16: i64 = 2;
    /// f32 source, bf16 destination.
    pub const F32_TO_BF16: i64 = 3;
}

/// Flat C-ABI [`convert_block`] for JIT-compiled code.
///
/// Arguments, in order: `src`, `dst` (pointers to elements of the types `code` names, one of
/// [`conversion_code`]), then the `i64`s `rows`, `cols`, `lds`, `ldd` and `code`.
///
/// Returns 0 on success, or -1 without touching memory if a size is negative, a leading
/// dimension is too small, an extent overflows, `code` is unknown, or a pointer is null while
/// its block is non-empty.
///
/// # Safety
///
/// `src` is valid for reads and `dst` for writes of their blocks' extents (`(rows - 1) * ld +
/// cols` elements of their types), aligned, and the two do not overlap.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn uopc_tile_convert_block(
    src: *const u8,
    dst: *mut u8,
    rows: i64,
    cols: i64,
    lds: i64,
    ldd: i64,
    code: i64,
) -> i32 {
    let u = |x: i64| usize::try_from(x).ok();
    let (Some(rows), Some(cols), Some(lds), Some(ldd)) = (u(rows), u(cols), u(lds), u(ldd)) else {
        return -1;
    };
    let (Ok(ns), Ok(nd)) =
        (crate::error::span("src", rows, cols, lds), crate::error::span("dst", rows, cols, ldd))
    else {
        return -1;
    };
    if (ns > 0 && src.is_null()) || (nd > 0 && dst.is_null()) || !(0..=3).contains(&code) {
        return -1;
    }
    if ns == 0 {
        return 0;
    }
    /// `convert_block` on the two blocks as slices of `S` and `D`.
    ///
    /// # Safety
    ///
    /// The entry's contract, for element types `S` and `D`.
    unsafe fn run<S: BlockConversion<D>, D>(
        src: *const u8,
        dst: *mut u8,
        (rows, cols, lds, ldd): (usize, usize, usize, usize),
        (ns, nd): (usize, usize),
    ) {
        // SAFETY: the caller's contract: readable and writable extents, aligned, disjoint.
        let (s, d) = unsafe {
            (
                std::slice::from_raw_parts(src.cast::<S>(), ns),
                std::slice::from_raw_parts_mut(dst.cast::<D>(), nd),
            )
        };
        convert_block(rows, cols, s, lds, d, ldd).expect("checked extents");
    }
    let dims = (rows, cols, lds, ldd);
    // SAFETY: forwarded, with the types `code` names.
    unsafe {
        match code {
            conversion_code::F16_TO_F32 => run::<f16, f32>(src, dst, dims, (ns, nd)),
            conversion_code::BF16_TO_F32 => run::<bf16, f32>(src, dst, dims, (ns, nd)),
            conversion_code::F32_TO_F16 => run::<f32, f16>(src, dst, dims, (ns, nd)),
            _ => run::<f32, bf16>(src, dst, dims, (ns, nd)),
        }
    }
    0
}
