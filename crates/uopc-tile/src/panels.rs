//! B operands packed once into column panels, for GEMMs that read the same B many times.
//!
//! The blocked GEMM copies each slab of B into contiguous panels of its register tile's width
//! before the micro-kernel runs. When one B feeds many GEMMs (attention's keys and values,
//! read by every query block of a head), [`pack_panels`] does that copy once, and a
//! [`GemmShape`] with [`GemmShape::b_panel_width`] set reads the panels where they lie.

use half::{bf16, f16};

use crate::error::{check_len, span};
use crate::{GemmShape, Isa, TileError};

/// The panel width the GEMM of `isa` reads in place: its register tile's columns (16 floats
/// for AVX2+FMA, 32 for AVX-512). The portable GEMM takes any width; it is given 16.
pub fn panel_width(isa: Isa) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::tile::TileKernel;
        match isa {
            Isa::Avx512 => return crate::x86::avx512::Kernel::NR,
            Isa::Avx2Fma => return crate::x86::avx2::Kernel::NR,
            Isa::Portable => {}
        }
    }
    let _ = isa;
    16
}

/// Where [`pack_panels`] reads a `k x n` B and how it lays out the panels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PanelPacking {
    /// Rows of B (the contracted dimension of the GEMMs that read it).
    pub k: usize,
    /// Columns of B.
    pub n: usize,
    /// The source is stored transposed (`n x k`, `B[p, j]` at `j * ld + p`), else `k x n`
    /// (`p * ld + j`).
    pub trans: bool,
    /// Leading dimension of the source.
    pub ld: usize,
    /// Columns per panel (at least 1).
    pub width: usize,
    /// Elements from one panel's start to the next (at least `k * width` when there are two or
    /// more panels).
    pub panel_stride: usize,
}

impl PanelPacking {
    /// Elements `[src, dst]` the packing spans.
    ///
    /// # Errors
    ///
    /// [`TileError::InvalidLayout`] for a zero width; [`TileError::LeadingDim`] when `ld` or
    /// the panel stride is too small; [`TileError::Overflow`] when an extent does not fit.
    pub fn extents(&self) -> Result<[usize; 2], TileError> {
        if self.width == 0 {
            return Err(TileError::InvalidLayout { operand: "dst", reason: "panels need a width" });
        }
        let (rows, cols) = if self.trans { (self.n, self.k) } else { (self.k, self.n) };
        let panel = self.k.checked_mul(self.width).ok_or(TileError::Overflow { operand: "dst" })?;
        let panels = if self.k == 0 { 0 } else { self.n.div_ceil(self.width) };
        Ok([span("src", rows, cols, self.ld)?, span("dst", panels, panel, self.panel_stride)?])
    }

    /// The GEMM shape that reads these panels as its B: `C[m x n] (+)= A[m x k] · B` with A
    /// stored `m x k` (`lda` apart) and C dense.
    pub fn gemm(&self, m: usize, lda: usize, accumulate: bool) -> GemmShape {
        GemmShape {
            ldb: self.panel_stride,
            lda,
            b_panel_width: self.width,
            ..GemmShape::dense(m, self.n, self.k, false, false, accumulate)
        }
    }
}

/// Copies B into panels: `dst[(j / w) * panel_stride + p * w + j % w] = B[p, j]`, and zero
/// for the columns `n .. n.next_multiple_of(w)` of the last panel (so a micro-kernel may read
/// the whole panel). Nothing else in `dst` is written.
///
/// # Errors
///
/// Nothing is written when one is returned: [`TileError::IsaUnavailable`], the errors of
/// [`PanelPacking::extents`], [`TileError::BufferTooSmall`].
///
/// # Examples
///
/// A 2 x 3 B in panels of 2 columns, then a GEMM that reads them:
///
/// ```rust
/// use uopc_tile::{Isa, PanelPacking, TileError, gemm, pack_panels};
///
/// let b = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // [[1, 2, 3], [4, 5, 6]]
/// let p = PanelPacking { k: 2, n: 3, trans: false, ld: 3, width: 2, panel_stride: 4 };
/// let mut panels = [f32::NAN; 8];
/// pack_panels(Isa::detect(), &p, &b, &mut panels)?;
/// assert_eq!(panels, [1.0, 2.0, 4.0, 5.0, 3.0, 0.0, 6.0, 0.0]);
///
/// let a = [1.0, 1.0]; // one row
/// let mut c = [0.0; 3];
/// gemm(Isa::detect(), &p.gemm(1, 2, false), &a, &panels, &mut c)?;
/// assert_eq!(c, [5.0, 7.0, 9.0]);
/// # Ok::<(), TileError>(())
/// ```
pub fn pack_panels(isa: Isa, p: &PanelPacking, src: &[f32], dst: &mut [f32]) -> Result<(), TileError> {
    checked(isa, p, src, dst)
}

/// [`pack_panels`] on raw pointers, without checks.
///
/// # Safety
///
/// `isa.available()`; with `[ns, nd] = p.extents()` (which must be `Ok`), `src` readable for
/// `ns` floats and `dst` writable for `nd`, not overlapping.
pub unsafe fn pack_panels_unchecked(isa: Isa, p: &PanelPacking, src: *const f32, dst: *mut f32) {
    // SAFETY: forwarded from this function's contract.
    unsafe { pack_all(isa, p, src, dst) }
}

/// The checks of [`pack_panels`] (for any source type), then the packing.
fn checked<E: PanelSource>(isa: Isa, p: &PanelPacking, src: &[E], dst: &mut [f32]) -> Result<(), TileError> {
    if !isa.available() {
        return Err(TileError::IsaUnavailable(isa));
    }
    let [ns, nd] = p.extents()?;
    check_len("src", ns, src.len())?;
    check_len("dst", nd, dst.len())?;
    // SAFETY: the ISA is available, both slices cover their extents, and `dst` is a unique
    // borrow, so it cannot overlap `src`.
    unsafe { pack_all(isa, p, src.as_ptr(), dst.as_mut_ptr()) };
    Ok(())
}

/// Every panel of `p`, from a source of `E`s.
///
/// # Safety
///
/// As [`pack_panels_unchecked`], with `src` readable for `ns` values of `E`.
unsafe fn pack_all<E: PanelSource>(isa: Isa, p: &PanelPacking, src: *const E, dst: *mut f32) {
    let PanelPacking { k, n, trans, ld, width: w, panel_stride } = *p;
    if k == 0 {
        return;
    }
    for j0 in (0..n).step_by(w) {
        let cols = w.min(n - j0);
        // SAFETY: panel `j0 / w` lies in dst's extent; the source columns `j0 .. j0 + cols`
        // of every row lie in src's.
        unsafe {
            let to = dst.add((j0 / w) * panel_stride);
            let from = if trans { src.add(j0 * ld) } else { src.add(j0) };
            pack_one(isa, to, from, trans, ld, k, cols, w);
        }
    }
}

/// One panel of `cols <= w` columns, zero-padded to `w`: the vector packers (which widen
/// 16-bit values as they copy) when the panel is one register tile wide and the type's
/// widening features are here, else plain loops.
///
/// # Safety
///
/// `isa.available()`; `dst` writable for `k * w` floats; `src` readable at `p * ld + j`
/// (`j * ld + p` when `trans`) for `p < k`, `j < cols`.
#[allow(clippy::too_many_arguments)] // the panel's geometry, each a plain size
unsafe fn pack_one<E: PanelSource>(
    isa: Isa,
    dst: *mut f32,
    src: *const E,
    trans: bool,
    ld: usize,
    k: usize,
    cols: usize,
    w: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if w == panel_width(isa) && isa != Isa::Portable && E::vector_packing() {
        use crate::x86::{avx2, avx512};
        // SAFETY: the ISA and the type's widening features are available, and the panel is
        // one register tile wide, the packing routine's own panel.
        unsafe {
            match (isa, trans) {
                (Isa::Avx512, true) => E::pack_bt::<avx512::Kernel>(dst, src, ld, k, cols),
                (Isa::Avx512, false) => E::pack_b::<avx512::Kernel>(dst, src, ld, k, cols),
                (_, true) => E::pack_bt::<avx2::Kernel>(dst, src, ld, k, cols),
                (_, false) => E::pack_b::<avx2::Kernel>(dst, src, ld, k, cols),
            }
        }
        return;
    }
    let _ = isa;
    for q in 0..k {
        for j in 0..w {
            let x = if j >= cols {
                0.0
            } else {
                // SAFETY: `j < cols`, `q < k`: inside the source.
                unsafe { *src.add(if trans { j * ld + q } else { q * ld + j }) }.into()
            };
            // SAFETY: `q * w + j < k * w`.
            unsafe { *dst.add(q * w + j) = x };
        }
    }
}

/// [`pack_panels`] from f16 storage: every value widened exactly to f32 as it is packed (one
/// pass over the source, no f32 copy of it), for GEMMs that read f16 data from f32 panels.
///
/// # Errors
///
/// As [`pack_panels`].
///
/// # Examples
///
/// ```rust
/// use half::f16;
/// use uopc_tile::{Isa, PanelPacking, TileError, pack_panels_f16};
///
/// let b = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0].map(f16::from_f32); // [[1, 2, 3], [4, 5, 6]]
/// let p = PanelPacking { k: 2, n: 3, trans: false, ld: 3, width: 2, panel_stride: 4 };
/// let mut panels = [f32::NAN; 8];
/// pack_panels_f16(Isa::detect(), &p, &b, &mut panels)?;
/// assert_eq!(panels, [1.0, 2.0, 4.0, 5.0, 3.0, 0.0, 6.0, 0.0]);
/// # Ok::<(), TileError>(())
/// ```
pub fn pack_panels_f16(isa: Isa, p: &PanelPacking, src: &[f16], dst: &mut [f32]) -> Result<(), TileError> {
    checked(isa, p, src, dst)
}

/// [`pack_panels_f16`] from bf16 storage.
///
/// # Errors
///
/// As [`pack_panels`].
pub fn pack_panels_bf16(isa: Isa, p: &PanelPacking, src: &[bf16], dst: &mut [f32]) -> Result<(), TileError> {
    checked(isa, p, src, dst)
}

/// A source type the panels are packed from: f32 copied, f16 and bf16 widened exactly.
#[cfg(target_arch = "x86_64")]
trait PanelSource: crate::blocked::Element + Into<f32> {
    /// Whether the vector packers can take it here (f16 needs F16C).
    fn vector_packing() -> bool;
}
#[cfg(not(target_arch = "x86_64"))]
trait PanelSource: Copy + Into<f32> {}

#[cfg(target_arch = "x86_64")]
impl PanelSource for f32 {
    fn vector_packing() -> bool {
        true
    }
}

#[cfg(target_arch = "x86_64")]
impl<H: crate::half_operand::HalfOperand + crate::tile::HalfFloat + Into<f32>> PanelSource for H {
    fn vector_packing() -> bool {
        H::vector_widening()
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl<E: Copy + Into<f32>> PanelSource for E {}
