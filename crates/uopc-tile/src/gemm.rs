//! GEMM tiles: `C (+)= A · B` in f32.
//!
//! The vector paths run the blocked driver in `blocked`; the portable path is plain loops.

use crate::error::check_len;
pub use crate::machine::register_tile;
pub use crate::shapes::GemmShape;
pub(crate) use crate::shapes::zero_c;
use crate::split::{SharedOperands, depth_split, for_each_block, parallel_block};
use crate::{Isa, TileError};

/// `C (+)= A · B` with every operand checked against `s` first.
///
/// Results agree across ISAs up to f32 rounding (summation order differs).
///
/// # Errors
///
/// Nothing is read or written when one is returned: [`TileError::IsaUnavailable`] if this CPU
/// lacks `isa`; the errors of [`GemmShape::extents`]; [`TileError::BufferTooSmall`] if a slice
/// is shorter than its extent.
///
/// # Examples
///
/// A 2 x 3 times 3 x 2 product, then the same into a C that is too short:
///
/// ```rust
/// use uopc_tile::{GemmShape, Isa, TileError, gemm};
///
/// let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // [[1, 2, 3], [4, 5, 6]]
/// let b = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]; // [[1, 0], [0, 1], [1, 1]]
/// let mut c = [f32::NAN; 4]; // not read: the shape overwrites C
/// let s = GemmShape::dense(2, 2, 3, false, false, false);
/// gemm(Isa::detect(), &s, &a, &b, &mut c)?;
/// assert_eq!(c, [4.0, 5.0, 10.0, 11.0]);
///
/// // Accumulating adds the product again, here with B stored transposed (2 x 3).
/// let bt = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0];
/// gemm(Isa::Portable, &GemmShape::dense(2, 2, 3, false, true, true), &a, &bt, &mut c)?;
/// assert_eq!(c, [8.0, 10.0, 20.0, 22.0]);
///
/// let err = gemm(Isa::Portable, &s, &a, &b, &mut [0.0; 3]).unwrap_err();
/// assert_eq!(err, TileError::BufferTooSmall { operand: "c", needed: 4, len: 3 });
/// # Ok::<(), TileError>(())
/// ```
pub fn gemm(isa: Isa, s: &GemmShape, a: &[f32], b: &[f32], c: &mut [f32]) -> Result<(), TileError> {
    check_operands(isa, s, [a.len(), b.len(), c.len()], BPanels::F32)?;
    // SAFETY: the ISA is available, each slice covers its operand's extent, and `c` is a unique
    // borrow, so it cannot overlap `a` or `b`.
    unsafe { gemm_unchecked(isa, s, a.as_ptr(), b.as_ptr(), c.as_mut_ptr()) };
    Ok(())
}

/// `C (+)= A · B` on raw pointers, without checks.
///
/// # Safety
///
/// * `isa.available()` is true.
/// * With `[na, nb, nc] = s.extents()` (which must be `Ok`): `a` is valid for reads of `na`
///   f32s, `b` for reads of `nb`, and `c` for reads and writes of `nc` (only writes when
///   `!s.accumulate`); all are aligned for `f32` (null is fine for an extent of 0).
/// * The C region does not overlap A or B, and nothing else accesses it during the call.
pub unsafe fn gemm_unchecked(isa: Isa, s: &GemmShape, a: *const f32, b: *const f32, c: *mut f32) {
    if s.parallel && s.b_panel_width == 0 {
        // SAFETY: forwarded from this function's contract.
        unsafe { gemm_split(isa, s, a, b, c) };
        return;
    }
    if s.b_panel_width != 0 {
        // SAFETY: forwarded from this function's contract.
        unsafe { gemm_panels(isa, s, a, b, c) };
        return;
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512
            if s.b_trans && !s.a_trans && s.k > 0 && s.m <= crate::x86::avx512_few_rows::DOT_MAX_ROWS =>
        {
            // SAFETY: the caller guarantees AVX-512 and the operand extents; the guard gives the
            // layouts the dot-product kernel requires.
            unsafe { crate::x86::avx512_few_rows::gemm_bt_dots(s, a, b, c) }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx512 if !s.b_trans && !s.a_trans && crate::x86::row_sweep::sweeps(s.m, s.n, 4) => {
            use crate::x86::row_sweep::{F32, Sweep, rows_swept_avx512};
            // SAFETY: as above; the guard gives the layouts and row count the sweep requires.
            unsafe { rows_swept_avx512::<F32>(&Sweep::f32(s, a, b, c)) }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx512 if !s.b_trans && !s.a_trans && s.m <= crate::x86::avx512_few_rows::DOT_MAX_ROWS => unsafe {
            crate::x86::avx512_few_rows::gemm_rows_streamed(s, a, b, c)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller guarantees AVX-512 is available and the operand extents.
        Isa::Avx512 => unsafe { crate::blocked::drive::<crate::x86::avx512::Kernel, f32, f32>(s, a, b, c) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma
            if s.b_trans && !s.a_trans && s.k > 0 && s.m <= crate::x86::avx2_few_rows::DOT_MAX_ROWS =>
        {
            // SAFETY: as the AVX-512 dot products, for AVX2+FMA.
            unsafe { crate::x86::avx2_few_rows::gemm_bt_dots(s, a, b, c) }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as the AVX-512 sweep, for AVX2+FMA.
        Isa::Avx2Fma if !s.b_trans && !s.a_trans && crate::x86::row_sweep::sweeps(s.m, s.n, 4) => unsafe {
            crate::x86::row_sweep::rows_swept_avx2(&crate::x86::row_sweep::Sweep::f32(s, a, b, c))
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as the AVX-512 streamed rows, for AVX2+FMA.
        Isa::Avx2Fma if !s.b_trans && !s.a_trans && s.m <= crate::x86::avx2_few_rows::DOT_MAX_ROWS => unsafe {
            crate::x86::avx2_few_rows::gemm_rows_streamed(s, a, b, c)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller guarantees AVX2+FMA are available and the operand extents.
        Isa::Avx2Fma => unsafe { crate::blocked::drive::<crate::x86::avx2::Kernel, f32, f32>(s, a, b, c) },
        // SAFETY: the caller guarantees the operand extents; no CPU features are needed.
        _ => unsafe { portable(s, a, b, c) },
    }
}

/// [`gemm_unchecked`] for a B stored in panels: the blocked driver reads them where they lie
/// when their width is a whole number of the ISA's register-tile columns, else plain loops.
///
/// # Safety
///
/// The contract of [`gemm_unchecked`], with `s.b_panel_width > 0`.
unsafe fn gemm_panels(isa: Isa, s: &GemmShape, a: *const f32, b: *const f32, c: *mut f32) {
    let w = s.b_panel_width;
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller guarantees AVX-512 and the operand extents; the driver reads whole
        // register-tile columns of a panel, and `w` is a multiple of them.
        Isa::Avx512 if w.is_multiple_of(crate::panels::panel_width(Isa::Avx512)) => unsafe {
            crate::blocked::drive::<crate::x86::avx512::Kernel, f32, f32>(s, a, b, c)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX2+FMA.
        Isa::Avx2Fma if w.is_multiple_of(crate::panels::panel_width(Isa::Avx2Fma)) => unsafe {
            crate::blocked::drive::<crate::x86::avx2::Kernel, f32, f32>(s, a, b, c)
        },
        // SAFETY: the caller guarantees the operand extents; no CPU features are needed.
        _ => unsafe { portable(s, a, b, c) },
    }
}

/// Flag bit of [`GemmDesc::flags`] / the `flags` argument: A is stored transposed.
pub const GEMM_A_TRANS: i64 = 1;
/// Flag bit: B is stored transposed.
pub const GEMM_B_TRANS: i64 = 2;
/// Flag bit: accumulate into C instead of overwriting it.
pub const GEMM_ACCUMULATE: i64 = 4;
/// Flag bit: the call may split itself over the caller's rayon pool ([`GemmShape::parallel`]).
pub const GEMM_PARALLEL: i64 = 8;
/// Flag bit: B's panels are pair panels ([`GemmShape::b_pair_panels`]).
pub const GEMM_B_PAIR_PANELS: i64 = 16;
/// The lowest bit of [`GemmDesc::flags`]' panel-width field: `flags >> GEMM_PANEL_SHIFT` is
/// [`GemmShape::b_panel_width`] (0 for a B stored by rows or columns).
pub const GEMM_PANEL_SHIFT: u32 = 8;
/// The largest panel width a descriptor encodes.
pub const GEMM_MAX_PANEL_WIDTH: usize = 0xFFFF;

/// C-layout GEMM descriptor for [`uopc_tile_gemm_f32_desc`]: seven `i64`s, in this order.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GemmDesc {
    /// Rows of A and C.
    pub m: i64,
    /// Columns of B and C.
    pub n: i64,
    /// Contracted dimension.
    pub k: i64,
    /// Leading dimension of A's storage.
    pub lda: i64,
    /// Leading dimension of B's storage.
    pub ldb: i64,
    /// Leading dimension of C.
    pub ldc: i64,
    /// Bitwise OR of [`GEMM_A_TRANS`], [`GEMM_B_TRANS`], [`GEMM_ACCUMULATE`],
    /// [`GEMM_PARALLEL`], [`GEMM_B_PAIR_PANELS`] and the panel width shifted left by
    /// [`GEMM_PANEL_SHIFT`].
    pub flags: i64,
}

impl GemmDesc {
    /// The shape this descriptor encodes, or `None` if a field is negative or `flags` has
    /// unknown bits.
    pub fn shape(&self) -> Option<GemmShape> {
        let panel_bits = (GEMM_MAX_PANEL_WIDTH as i64) << GEMM_PANEL_SHIFT;
        let known =
            GEMM_A_TRANS | GEMM_B_TRANS | GEMM_ACCUMULATE | GEMM_PARALLEL | GEMM_B_PAIR_PANELS | panel_bits;
        if self.flags & !known != 0 {
            return None;
        }
        let u = |x: i64| usize::try_from(x).ok();
        Some(GemmShape {
            m: u(self.m)?,
            n: u(self.n)?,
            k: u(self.k)?,
            a_trans: self.flags & GEMM_A_TRANS != 0,
            b_trans: self.flags & GEMM_B_TRANS != 0,
            lda: u(self.lda)?,
            ldb: u(self.ldb)?,
            ldc: u(self.ldc)?,
            accumulate: self.flags & GEMM_ACCUMULATE != 0,
            b_panel_width: ((self.flags & panel_bits) >> GEMM_PANEL_SHIFT) as usize,
            b_pair_panels: self.flags & GEMM_B_PAIR_PANELS != 0,
            parallel: self.flags & GEMM_PARALLEL != 0,
        })
    }
}

impl From<&GemmShape> for GemmDesc {
    /// Sizes beyond `i64::MAX` (which no buffer can have) saturate, making the descriptor
    /// rejected later rather than silently wrapped; so does a panel width beyond
    /// [`GEMM_MAX_PANEL_WIDTH`] (through an unknown flag bit).
    fn from(s: &GemmShape) -> GemmDesc {
        let i = |x: usize| i64::try_from(x).unwrap_or(i64::MAX);
        GemmDesc {
            m: i(s.m),
            n: i(s.n),
            k: i(s.k),
            lda: i(s.lda),
            ldb: i(s.ldb),
            ldc: i(s.ldc),
            flags: (if s.a_trans { GEMM_A_TRANS } else { 0 })
                | (if s.b_trans { GEMM_B_TRANS } else { 0 })
                | (if s.accumulate { GEMM_ACCUMULATE } else { 0 })
                | (if s.parallel { GEMM_PARALLEL } else { 0 })
                | (if s.b_pair_panels { GEMM_B_PAIR_PANELS } else { 0 })
                | if s.b_panel_width <= GEMM_MAX_PANEL_WIDTH {
                    (s.b_panel_width as i64) << GEMM_PANEL_SHIFT
                } else {
                    i64::MIN
                },
        }
    }
}

/// Flat C-ABI GEMM for JIT-compiled code: `C (+)= A · B` with the fastest ISA of this CPU.
///
/// Arguments, in order: `a`, `b`, `c` (pointers to f32), then the `i64`s `m`, `n`, `k`, `lda`,
/// `ldb`, `ldc`, `flags`, with the meaning of the [`GemmShape`] fields; `flags` is an OR of
/// [`GEMM_A_TRANS`] (1), [`GEMM_B_TRANS`] (2), [`GEMM_ACCUMULATE`] (4) and B's panel width
/// shifted by [`GEMM_PANEL_SHIFT`].
///
/// Returns 0 on success, or -1 without touching memory if a size is negative, `flags` has
/// unknown bits, a leading dimension is too small, an extent overflows, or a pointer is null
/// while its operand is non-empty.
///
/// # Safety
///
/// The pointers must satisfy the contract of [`gemm_unchecked`] for the decoded shape.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // a flat register-passed ABI is the point of this entry
pub unsafe extern "C" fn uopc_tile_gemm_f32(
    a: *const f32,
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
    unsafe { uopc_tile_gemm_f32_desc(&desc, a, b, c) }
}

/// Descriptor-based C-ABI GEMM: `(desc, a, b, c) -> i32`, otherwise like [`uopc_tile_gemm_f32`].
///
/// Returns -1 also when `desc` is null.
///
/// # Safety
///
/// `desc` is null or points to a readable [`GemmDesc`]; the pointers must satisfy the contract
/// of [`gemm_unchecked`] for the decoded shape.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn uopc_tile_gemm_f32_desc(
    desc: *const GemmDesc,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
) -> i32 {
    // SAFETY: forwarded from our caller.
    unsafe { run_entry(desc, a, b, c, BPanels::F32, gemm_unchecked) }
}

/// The checks of every checked GEMM entry point on an [`Isa`]: it runs here, then
/// [`check_extents`].
pub(crate) fn check_operands(
    isa: Isa,
    s: &GemmShape,
    lens: [usize; 3],
    panels: BPanels,
) -> Result<(), TileError> {
    if !isa.available() {
        return Err(TileError::IsaUnavailable(isa));
    }
    check_extents(s, lens, panels)
}

/// The shape checks of every checked GEMM entry point, in this order: B is not in panels
/// unless `panels`, and slices of `lens` (A, B, C) hold their operands' extents under `s`.
pub(crate) fn check_extents(s: &GemmShape, lens: [usize; 3], panels: BPanels) -> Result<(), TileError> {
    panels.check(s)?;
    let extents = s.extents()?;
    for ((operand, needed), len) in ["a", "b", "c"].into_iter().zip(extents).zip(lens) {
        check_len(operand, needed, len)?;
    }
    Ok(())
}

/// The body of the C-ABI GEMM entries: `desc` decoded (B in panels only where `panels`), then
/// `gemm` on the detected ISA; 0, or -1 without touching memory.
///
/// # Safety
///
/// `desc` is null or points to a readable [`GemmDesc`]; the pointers satisfy the contract of
/// `gemm` for the decoded shape.
pub(crate) unsafe fn run_entry<A, B>(
    desc: *const GemmDesc,
    a: *const A,
    b: *const B,
    c: *mut f32,
    panels: BPanels,
    gemm: unsafe fn(Isa, &GemmShape, *const A, *const B, *mut f32),
) -> i32 {
    // SAFETY: forwarded from our caller.
    let Some(s) =
        (unsafe { decode_desc(desc, [a.is_null(), b.is_null(), c.is_null()]) }).filter(|s| panels.takes(s))
    else {
        return -1;
    };
    // SAFETY: the detected ISA is available; extents and pointers are the caller's contract.
    unsafe { gemm(Isa::detect(), &s, a, b, c) };
    0
}

/// The shape a C-ABI entry's descriptor encodes, or `None` (the entry returns -1) when `desc`
/// is null, a field is invalid, the extents overflow, or an operand with elements is null
/// (`null` says which of A, B, C are).
///
/// # Safety
///
/// `desc` is null or points to a readable [`GemmDesc`].
pub(crate) unsafe fn decode_desc(desc: *const GemmDesc, null: [bool; 3]) -> Option<GemmShape> {
    if desc.is_null() {
        return None;
    }
    // SAFETY: non-null, and the caller guarantees it points to a readable descriptor.
    let s = unsafe { desc.read_unaligned() }.shape()?;
    let extents = s.extents().ok()?;
    extents.iter().zip(null).all(|(&e, null)| e == 0 || !null).then_some(s)
}

/// [`decode_desc`] for the entries that write C rounded to 16 bits: `None` also for a B in
/// panels or a call that would accumulate (a 16-bit C carries no f32 sums between calls).
///
/// # Safety
///
/// As [`decode_desc`].
pub(crate) unsafe fn decode_rounded(desc: *const GemmDesc, null: [bool; 3]) -> Option<GemmShape> {
    // SAFETY: forwarded from this function's contract.
    let decoded = unsafe { decode_desc(desc, null) };
    decoded.filter(|s| BPanels::None.takes(s) && !s.accumulate)
}

/// Which B in panels a GEMM entry takes besides a B stored by rows or columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BPanels {
    /// None.
    None,
    /// f32 panels ([`GemmShape::b_panel_width`]), not pair panels.
    F32,
    /// Pair panels ([`GemmShape::b_pair_panels`]), not f32 ones.
    Pairs,
}

impl BPanels {
    /// Whether an entry taking these panels takes `s`'s B.
    pub(crate) fn takes(self, s: &GemmShape) -> bool {
        match self {
            _ if s.b_panel_width == 0 => !s.b_pair_panels,
            BPanels::None => false,
            BPanels::F32 => !s.b_pair_panels,
            BPanels::Pairs => s.b_pair_panels,
        }
    }

    /// [`BPanels::takes`] as a result naming the layout refused.
    pub(crate) fn check(self, s: &GemmShape) -> Result<(), TileError> {
        if self.takes(s) {
            Ok(())
        } else if s.b_pair_panels {
            Err(TileError::InvalidLayout {
                operand: "b",
                reason: "only the bf16 GEMM reads B in pair panels",
            })
        } else {
            Err(TileError::InvalidLayout {
                operand: "b",
                reason: "only a GEMM with an f32 B reads B in panels",
            })
        }
    }
}

/// The portable kernel: plain loops ordered so the innermost one walks memory contiguously.
///
/// # Safety
///
/// The contract of [`gemm_unchecked`].
unsafe fn portable(s: &GemmShape, a: *const f32, b: *const f32, c: *mut f32) {
    let GemmShape { m, n, k, lda, ldb, ldc, a_trans, b_trans, accumulate, b_panel_width, .. } = *s;
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            // SAFETY: C's extent is valid for writes.
            unsafe { zero_c(s, c) };
        }
        return;
    }
    let Ok([na, nb, _]) = s.extents() else { return };
    // SAFETY: m, n, k > 0, so both extents are non-empty and the caller guarantees them readable.
    let (a, b) = unsafe { (std::slice::from_raw_parts(a, na), std::slice::from_raw_parts(b, nb)) };
    // Row i of A, gathered once so both loop orders below walk contiguous memory.
    let mut arow = vec![0.0f32; k];
    for i in 0..m {
        if a_trans {
            for (p, x) in arow.iter_mut().enumerate() {
                *x = a[p * lda + i];
            }
        } else {
            arow.copy_from_slice(&a[i * lda..i * lda + k]);
        }
        // SAFETY: row `i` of C spans `n` floats at `i * ldc`, disjoint from A and B.
        let crow = unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc), n) };
        if !accumulate {
            crow.fill(0.0);
        }
        if b_panel_width != 0 {
            let w = b_panel_width;
            for (p, &aip) in arow.iter().enumerate() {
                for (j0, cs) in (0..n).step_by(w).zip(crow.chunks_mut(w)) {
                    let (row, cols) = ((j0 / w) * ldb + p * w, cs.len());
                    for (cj, &bv) in cs.iter_mut().zip(&b[row..row + cols]) {
                        *cj += aip * bv;
                    }
                }
            }
        } else if b_trans {
            for (j, cj) in crow.iter_mut().enumerate() {
                *cj += dot(&arow, &b[j * ldb..j * ldb + k]);
            }
        } else {
            for (p, &aip) in arow.iter().enumerate() {
                for (cj, &bv) in crow.iter_mut().zip(&b[p * ldb..p * ldb + n]) {
                    *cj += aip * bv;
                }
            }
        }
    }
}

/// Dot product with eight independent partial sums, which the compiler can keep in vector
/// lanes (a single running sum would force strictly sequential adds).
fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (xs, ys) = (x.chunks_exact(8), y.chunks_exact(8));
    let tail: f32 = xs.remainder().iter().zip(ys.remainder()).map(|(a, b)| a * b).sum();
    for (xa, ya) in xs.zip(ys) {
        for ((s, &a), &b) in acc.iter_mut().zip(xa).zip(ya) {
            *s += a * b;
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// [`gemm_unchecked`] of `s` in the blocks of [`parallel_block`] over the current rayon
/// pool, each block a serial GEMM of its own; or, for the few rows [`depth_split`] takes, in
/// stretches of k ([`gemm_depth_split`]).
///
/// # Safety
///
/// The contract of [`gemm_unchecked`], with `s.b_panel_width == 0`.
pub(crate) unsafe fn gemm_split(isa: Isa, s: &GemmShape, a: *const f32, b: *const f32, c: *mut f32) {
    let threads = rayon::current_num_threads();
    if let Some(depth) = depth_split(s.m, s.n, s.k, threads, s.a_trans, s.b_trans) {
        // SAFETY: forwarded; `depth_split` gave a depth for untransposed operands only.
        unsafe { gemm_depth_split(isa, s, a, b, c, depth) };
        return;
    }
    let block = parallel_block(s.m, s.n, s.k, threads, register_tile(isa));
    let ops = SharedOperands(a, b, c);
    for_each_block(s, block, |sub, (a_at, b_at, c_at)| {
        // SAFETY: the sub-shape is a block of rows or columns of `s` with the same leading
        // dimensions, and the offsets move A, B and C to that block's first element, so its
        // extents lie inside the ones the caller guarantees; blocks of C are disjoint.
        unsafe {
            let (a, b, c) = ops.get();
            gemm_unchecked(isa, &sub, a.add(a_at), b.add(b_at), c.add(c_at));
        }
    });
}

/// [`gemm_unchecked`] of `s` in stretches of `depth` rows of B, one task each over the current
/// rayon pool: the first adds its product into C as `s` says, every other one writes its own
/// into a partial C of the call's, and the partials are added into C when all are done (the
/// sums of C thus come in a different order than the serial call's).
///
/// # Safety
///
/// The contract of [`gemm_unchecked`], with A and B untransposed, `s.b_panel_width == 0` and
/// `0 < depth`.
unsafe fn gemm_depth_split(isa: Isa, s: &GemmShape, a: *const f32, b: *const f32, c: *mut f32, depth: usize) {
    let serial = GemmShape { parallel: false, ..*s };
    let (m, n, k) = (s.m, s.n, s.k);
    let tasks = k.div_ceil(depth);
    let mut partials = vec![0.0f32; (tasks - 1) * m * n];
    let ops = SharedOperands(a, b, c);
    // Only the partials' pointer is shared; no operand is read through this one.
    let parts = SharedOperands(std::ptr::null::<u8>(), std::ptr::null::<u8>(), partials.as_mut_ptr());
    rayon::scope(|scope| {
        for t in 0..tasks {
            let p0 = t * depth;
            let sub = GemmShape { k: depth.min(k - p0), ..serial };
            scope.spawn(move |_| {
                let (a, b, c) = ops.get();
                // SAFETY: columns `p0 ..` of A's rows and rows `p0 ..` of B lie in their
                // extents (neither is transposed), `sub` keeps their leading dimensions and
                // only shortens k; task 0 writes C, which the caller gives this call alone,
                // and task `t > 0` the `m x n` partial `t - 1`, disjoint from the others.
                unsafe {
                    let (a, b) = (a.add(p0), b.add(p0 * s.ldb));
                    if t == 0 {
                        gemm_unchecked(isa, &sub, a, b, c);
                    } else {
                        let part = parts.get().2.add((t - 1) * m * n);
                        gemm_unchecked(isa, &GemmShape { ldc: n, accumulate: false, ..sub }, a, b, part);
                    }
                }
            });
        }
    });
    for part in partials.chunks_exact(m * n) {
        for (i, part_row) in part.chunks_exact(n).enumerate() {
            // SAFETY: row `i < m` of C holds `n` floats at `i * ldc`, which no task touches
            // any more and the caller lets this call alone access.
            let row = unsafe { std::slice::from_raw_parts_mut(c.add(i * s.ldc), n) };
            for (x, p) in row.iter_mut().zip(part_row) {
                *x += p;
            }
        }
    }
}
