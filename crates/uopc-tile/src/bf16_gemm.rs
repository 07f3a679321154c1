//! bf16 x bf16 -> f32 GEMM: `C (+)= A · B` with bf16 operands and an f32 result, on AMX tiles,
//! `vdpbf16ps` or portable Rust.
//!
//! All three paths share one blocked driver and one data layout, the one AMX needs:
//!
//! * B is packed once per call into 32-column panels. Panel `jp`, k block `kb` (32 k values)
//!   is 1024 u16 at `(jp * kblocks + kb) * 1024`: two tiles of 16 rows x 32 u16, columns
//!   `0..16` then `16..32`; row `r` holds the VNNI pairs `(B[2r, j], B[2r + 1, j])` for the
//!   tile's 16 columns. k past the end and columns past `n` are zeros.
//! * A is read in place as tiles (16 rows of 64 bytes at A's row stride) when it is stored
//!   `m x k`; the ragged last row block and last k block, and a transposed A, are copied into
//!   the same tile layout (k block `kb` of row block `ib` is 1024 u16, 32 rows of 32), zero
//!   padded, because a tile load cannot stop at a row's end.
//! * C is updated in 32 x 32 blocks, in place when whole, else through a local block.
//!
//! The k dimension is swept in slabs and B's panels in groups (the driver's `Sweep`, from the
//! machine's caches): one row block's A slab stays close while the group's packed B slab
//! streams past it from L2, and each slab reads and writes C once.

pub use crate::bf16_path::Bf16Path;
use std::sync::OnceLock;

use half::bf16;

use crate::{GemmDesc, GemmShape, TileError};

impl Bf16Path {
    /// The path the machine model chooses ([`crate::machine::Choices::bf16`]), decided once.
    ///
    /// AMX, where chosen, must first pass a known-answer check in this process: a small GEMM
    /// on exactly representable inputs must equal the result of the next path the model
    /// allows, bit for bit. If it differs the process uses that path instead and says so once
    /// on stderr.
    pub fn detect() -> Bf16Path {
        static DETECTED: OnceLock<Bf16Path> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            let choice = crate::machine::Machine::get().choices().bf16;
            if choice == Bf16Path::Amx { crate::amx_guard::checked_amx_or_fallback() } else { choice }
        })
    }

    /// The path the model would choose if AMX were not there (the AMX guard's reference and
    /// fallback).
    pub fn without_amx() -> Bf16Path {
        let mut m = crate::machine::Machine::get().clone();
        m.features.amx_bf16 = false;
        m.choices().bf16
    }
}

/// `C (+)= A · B` with bf16 A and B and f32 C, every operand checked against `s` first.
///
/// `s` means what it means for the f32 [`crate::gemm`] (element counts, either operand
/// transposed, `accumulate`), except that B may come in pair panels
/// ([`GemmShape::b_pair_panels`], packed by [`crate::pack_pair_panels_bf16`]) and not in f32
/// ones. Products of bf16 values are exact in f32; the sums are rounded
/// to f32, in an order that differs between paths. The AMX and `vdpbf16ps` paths treat
/// subnormal inputs as zero and flush subnormal results to zero, as the instructions do,
/// except for products of at most 8 rows of A (not transposed): those widen B to f32 in
/// registers as they stream it (packing it would cost as much as the product) and are exact
/// f32 FMAs, subnormals included.
///
/// # Errors
///
/// Nothing is read or written when one is returned: [`TileError::PathUnavailable`] if `path`
/// cannot run here; the errors of [`GemmShape::extents`]; [`TileError::InvalidLayout`] for B
/// in f32 panels; [`TileError::BufferTooSmall`] if a slice is shorter than its extent.
///
/// # Examples
///
/// ```rust
/// use half::bf16;
/// use uopc_tile::{Bf16Path, GemmShape, TileError, gemm_bf16};
///
/// let h = |x: f32| bf16::from_f32(x);
/// let a = [h(1.0), h(2.0), h(3.0), h(4.0)]; // [[1, 2], [3, 4]]
/// let b = [h(1.0), h(0.5), h(0.0), h(1.0)]; // [[1, 0.5], [0, 1]]
/// let mut c = [f32::NAN; 4]; // not read: the shape overwrites C
/// gemm_bf16(Bf16Path::detect(), &GemmShape::dense(2, 2, 2, false, false, false), &a, &b, &mut c)?;
/// assert_eq!(c, [1.0, 2.5, 3.0, 5.5]);
///
/// let short = gemm_bf16(Bf16Path::Portable, &GemmShape::dense(2, 2, 2, false, false, false), &a, &b[..3], &mut c);
/// assert_eq!(short, Err(TileError::BufferTooSmall { operand: "b", needed: 4, len: 3 }));
/// # Ok::<(), TileError>(())
/// ```
pub fn gemm_bf16(
    path: Bf16Path,
    s: &GemmShape,
    a: &[bf16],
    b: &[bf16],
    c: &mut [f32],
) -> Result<(), TileError> {
    check(path, s, a.len(), b.len(), c.len())?;
    // SAFETY: the path is available, each slice covers its operand's extent, and `c` is a
    // unique borrow, so it cannot overlap `a` or `b`.
    unsafe { gemm_bf16_unchecked(path, s, a.as_ptr(), b.as_ptr(), c.as_mut_ptr()) };
    Ok(())
}

/// The checks of [`gemm_bf16`] on slice lengths.
pub(crate) fn check(path: Bf16Path, s: &GemmShape, a: usize, b: usize, c: usize) -> Result<(), TileError> {
    if !path.available() {
        return Err(TileError::PathUnavailable(path));
    }
    crate::gemm::check_extents(s, [a, b, c], crate::gemm::BPanels::Pairs)
}

/// [`gemm_bf16`] split into `tasks` column ranges (whole 32-column panels) run as rayon tasks
/// on the calling pool, each packing its own part of B and loading its own tile configuration.
/// `tasks` is clamped to the number of panels; 0 or 1 runs on the calling thread.
///
/// # Errors
///
/// Those of [`gemm_bf16`]; nothing is read or written when one is returned.
pub fn gemm_bf16_parallel(
    path: Bf16Path,
    s: &GemmShape,
    a: &[bf16],
    b: &[bf16],
    c: &mut [f32],
    tasks: usize,
) -> Result<(), TileError> {
    check(path, s, a.len(), b.len(), c.len())?;
    let panels = s.n.div_ceil(32);
    let tasks = tasks.clamp(1, panels.max(1));
    if tasks == 1 {
        // SAFETY: checked above; `c` is a unique borrow.
        unsafe { gemm_bf16_unchecked(path, s, a.as_ptr(), b.as_ptr(), c.as_mut_ptr()) };
        return Ok(());
    }
    // Each task writes a disjoint column range of C, whose unique borrow this function holds
    // until they all finish.
    let ops = crate::split::SharedOperands(a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
    let per_task = panels.div_ceil(tasks) * 32;
    rayon::scope(|scope| {
        for j0 in (0..s.n).step_by(per_task) {
            let sub = GemmShape { n: per_task.min(s.n - j0), ..*s };
            scope.spawn(move |_| {
                let (a, b, c) = ops.get();
                let b_off = s.b_index(0, j0);
                // SAFETY: the sub-shape's extents lie inside the checked ones (columns
                // `j0 .. j0 + sub.n` of B and C, same leading dimensions); the C columns of
                // different tasks are disjoint.
                unsafe { gemm_bf16_unchecked(path, &sub, a, b.add(b_off), c.add(j0)) };
            });
        }
    });
    Ok(())
}

/// `C (+)= A · B` on raw pointers, without checks.
///
/// # Safety
///
/// * `path.available()` is true.
/// * With `[na, nb, nc] = s.extents()` (which must be `Ok`): `a` is valid for reads of `na`
///   bf16, `b` for reads of `nb`, and `c` for reads and writes of `nc` f32 (only writes when
///   `!s.accumulate`); all aligned for their types (null is fine for an extent of 0).
/// * The C region does not overlap A or B, and nothing else accesses it during the call.
pub unsafe fn gemm_bf16_unchecked(
    path: Bf16Path,
    s: &GemmShape,
    a: *const bf16,
    b: *const bf16,
    c: *mut f32,
) {
    if s.b_pair_panels && !path.reads_pair_panels() {
        // Pair panels are the tile kernels' layout; the widening kernels read B by rows or
        // columns. No path the model chooses takes this branch for a B packed to run fast.
        // SAFETY: forwarded; the portable path runs everywhere.
        unsafe { crate::bf16_blocked::drive(Bf16Path::Portable, s, a.cast(), b.cast(), c) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if path == Bf16Path::Avx512Widen {
        let few_rows = (1..=crate::x86::half_rows::HALF_ROWS_MAX).contains(&s.m) && s.n > 0 && s.k > 0;
        if few_rows && !s.a_trans {
            // A few rows of A cannot amortize packing B: stream it, widening in registers.
            // SAFETY: AVX-512F (the path) is available; the shape is in the kernel's range and
            // the pointers are this function's contract.
            unsafe {
                crate::x86::half_rows::gemm::<false>(
                    s,
                    crate::x86::half_rows::RowsA::Half(a.cast()),
                    b.cast(),
                    c,
                )
            };
        } else {
            // SAFETY: the path is available, so AVX-512F is; extents and pointers are this
            // function's contract. bf16 widens with plain shifts, which need no extension.
            unsafe { crate::blocked::drive::<crate::x86::avx512::Kernel, bf16, bf16>(s, a, b, c) };
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if path == Bf16Path::Avx2Fma {
        let few_rows = (1..=crate::x86::half_rows::HALF_ROWS_MAX).contains(&s.m) && s.n > 0 && s.k > 0;
        if few_rows && !s.a_trans && std::arch::is_x86_feature_detected!("f16c") {
            // A few rows of A cannot amortize packing B: stream it, widening in registers.
            // SAFETY: AVX2 and FMA (the path) and F16C are available; the shape is in the
            // kernel's range and the pointers are this function's contract.
            unsafe {
                crate::x86::avx2_half_rows::gemm::<false>(
                    s,
                    crate::x86::half_rows::RowsA::Half(a.cast()),
                    b.cast(),
                    c,
                )
            };
        } else {
            // SAFETY: the path is available, so AVX2 and FMA are; extents and pointers are
            // this function's contract.
            unsafe { crate::blocked::drive::<crate::x86::avx2::Kernel, bf16, bf16>(s, a, b, c) };
        }
        return;
    }
    // SAFETY: forwarded; bf16 is a transparent u16.
    unsafe { crate::bf16_blocked::drive(path, s, a.cast(), b.cast(), c) }
}

/// Flat C-ABI bf16 GEMM for JIT-compiled code: `C (+)= A · B` on the fastest path here.
///
/// Arguments, in order: `a`, `b` (pointers to bf16 bit patterns), `c` (pointer to f32), then
/// the `i64`s `m`, `n`, `k`, `lda`, `ldb`, `ldc`, `flags`, as for [`crate::uopc_tile_gemm_f32`].
///
/// Returns 0 on success, or -1 without touching memory if a size is negative, `flags` has
/// unknown bits or a B panel width without [`crate::GEMM_B_PAIR_PANELS`] (only the f32 GEMM
/// reads f32 panels), a leading dimension is too small, an extent overflows, or a pointer is
/// null while its operand is non-empty.
///
/// # Safety
///
/// The pointers must satisfy the contract of [`gemm_bf16_unchecked`] for the decoded shape.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // a flat register-passed ABI is the point of this entry
pub unsafe extern "C" fn uopc_tile_gemm_bf16(
    a: *const bf16,
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
    unsafe { uopc_tile_gemm_bf16_desc(&desc, a, b, c) }
}

/// Descriptor-based C-ABI bf16 GEMM: `(desc, a, b, c) -> i32`, otherwise like
/// [`uopc_tile_gemm_bf16`]. Returns -1 also when `desc` is null.
///
/// # Safety
///
/// `desc` is null or points to a readable [`GemmDesc`]; the pointers must satisfy the contract
/// of [`gemm_bf16_unchecked`] for the decoded shape.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn uopc_tile_gemm_bf16_desc(
    desc: *const GemmDesc,
    a: *const bf16,
    b: *const bf16,
    c: *mut f32,
) -> i32 {
    // SAFETY: forwarded from our caller.
    let Some(s) = (unsafe { crate::gemm::decode_desc(desc, [a.is_null(), b.is_null(), c.is_null()]) })
        .filter(|s| crate::gemm::BPanels::Pairs.takes(s))
    else {
        return -1;
    };
    // SAFETY: the detected path is available; extents and pointers are the caller's contract.
    unsafe { gemm_bf16_unchecked(Bf16Path::detect(), &s, a, b, c) };
    0
}
