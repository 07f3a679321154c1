//! bf16 B operands packed once into pair panels ([`GemmShape::b_pair_panels`]): the layout the
//! bf16 GEMM's tile kernels (AMX, `vdpbf16ps`, portable) read, so a B that feeds many GEMMs
//! (attention's keys and values) is packed once rather than by every GEMM.

use half::bf16;

use crate::error::{check_len, span};
use crate::shapes::PAIR_PANEL_WIDTH;
use crate::{GemmShape, PanelPacking, TileError};

/// Elements of one 32 x 32 step of a pair panel.
const STEP: usize = 1024;

impl PanelPacking {
    /// Elements `[src, dst]` a pair-panel packing spans: the source as for
    /// [`PanelPacking::extents`], and `n.div_ceil(32)` panels of `k.div_ceil(32) * 1024`
    /// elements, `panel_stride` apart.
    ///
    /// # Errors
    ///
    /// [`TileError::InvalidLayout`] when the width is not 32; [`TileError::LeadingDim`] when `ld`
    /// or the panel stride is too small; [`TileError::Overflow`] when an extent does not fit.
    pub fn pair_extents(&self) -> Result<[usize; 2], TileError> {
        if self.width != PAIR_PANEL_WIDTH {
            return Err(TileError::InvalidLayout {
                operand: "dst",
                reason: "pair panels are 32 columns wide",
            });
        }
        let (rows, cols) = if self.trans { (self.n, self.k) } else { (self.k, self.n) };
        let panel = self.k.div_ceil(32).checked_mul(STEP).ok_or(TileError::Overflow { operand: "dst" })?;
        let panels = if self.k == 0 { 0 } else { self.n.div_ceil(self.width) };
        Ok([span("src", rows, cols, self.ld)?, span("dst", panels, panel, self.panel_stride)?])
    }

    /// The GEMM shape that reads these pair panels as its B: `C[m x n] (+)= A[m x k] · B`
    /// with bf16 A stored `m x k` (`lda` apart) and C dense.
    pub fn pair_gemm(&self, m: usize, lda: usize, accumulate: bool) -> GemmShape {
        GemmShape { b_pair_panels: true, ..self.gemm(m, lda, accumulate) }
    }
}

/// Copies a bf16 B into pair panels of 32 columns, `p.panel_stride` apart (see
/// [`GemmShape::b_pair_panels`] for the layout), zero-filling the rows of each panel's last
/// step past `k` and its columns past `n`. Nothing else in `dst` is written.
///
/// # Errors
///
/// Nothing is written when one is returned: the errors of [`PanelPacking::pair_extents`],
/// [`TileError::BufferTooSmall`].
///
/// # Examples
///
/// A 3 x 2 B in one pair panel, then a bf16 GEMM that reads it:
///
/// ```rust
/// use half::bf16;
/// use uopc_tile::{Bf16Path, PanelPacking, TileError, gemm_bf16, pack_pair_panels_bf16};
///
/// let h = |x: f32| bf16::from_f32(x);
/// let b = [h(1.0), h(2.0), h(3.0), h(4.0), h(5.0), h(6.0)]; // [[1, 2], [3, 4], [5, 6]]
/// let p = PanelPacking { k: 3, n: 2, trans: false, ld: 2, width: 32, panel_stride: 1024 };
/// let mut panels = vec![bf16::NAN; 1024];
/// pack_pair_panels_bf16(&p, &b, &mut panels)?;
/// // Row pair (0, 1) of columns 0 and 1, then row 2 beside a zero.
/// assert_eq!(&panels[..4], &[h(1.0), h(3.0), h(2.0), h(4.0)]);
/// assert_eq!(&panels[32..36], &[h(5.0), h(0.0), h(6.0), h(0.0)]);
///
/// let a = [h(1.0), h(1.0), h(1.0)]; // one row
/// let mut c = [0.0; 2];
/// gemm_bf16(Bf16Path::detect(), &p.pair_gemm(1, 3, false), &a, &panels, &mut c)?;
/// assert_eq!(c, [9.0, 12.0]);
/// # Ok::<(), TileError>(())
/// ```
pub fn pack_pair_panels_bf16(p: &PanelPacking, src: &[bf16], dst: &mut [bf16]) -> Result<(), TileError> {
    let [ns, nd] = p.pair_extents()?;
    check_len("src", ns, src.len())?;
    check_len("dst", nd, dst.len())?;
    // SAFETY: both slices cover their extents, and `dst` is a unique borrow, so it cannot
    // overlap `src`; bf16 is a transparent u16.
    unsafe { pack_pair_panels_unchecked(p, src.as_ptr().cast(), dst.as_mut_ptr().cast()) };
    Ok(())
}

/// [`pack_pair_panels_bf16`] on raw pointers (bf16 bit patterns), without checks.
///
/// # Safety
///
/// With `[ns, nd] = p.pair_extents()` (which must be `Ok`), `src` is readable for `ns`
/// elements and `dst` writable for `nd`, not overlapping.
pub(crate) unsafe fn pack_pair_panels_unchecked(p: &PanelPacking, src: *const u16, dst: *mut u16) {
    let PanelPacking { k, n, trans, ld, panel_stride, .. } = *p;
    if k == 0 {
        return;
    }
    let vector = crate::bf16_pack::vector_packing_available();
    for (q, j0) in (0..n).step_by(PAIR_PANEL_WIDTH).enumerate() {
        let cols = (n - j0).min(PAIR_PANEL_WIDTH);
        let from = src.wrapping_add(if trans { j0 * ld } else { j0 });
        let to = dst.wrapping_add(q * panel_stride);
        // SAFETY: the panel's source columns `j0 .. j0 + cols` lie in the source extent and its
        // `k.div_ceil(32)` steps in the destination's (this function's contract); the vector
        // routines only where they run.
        unsafe { crate::bf16_pack::pack_b_panels(vector, (from, ld, trans), (k, cols), to) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element lands where [`GemmShape::b_index`] says, from both source layouts, with
    /// ragged k and n, and the padding is zero; panels lie `panel_stride` apart.
    #[test]
    fn elements_land_where_the_shape_indexes_them() {
        for (k, n, trans) in [(70usize, 45usize, false), (70, 45, true), (32, 64, false), (5, 3, true)] {
            let ld = if trans { k + 3 } else { n + 5 };
            let rows = if trans { n } else { k };
            let src: Vec<bf16> = (0..rows * ld).map(|i| bf16::from_f32((i % 251) as f32 + 1.0)).collect();
            let stride = k.div_ceil(32) * STEP + 64;
            let p = PanelPacking { k, n, trans, ld, width: 32, panel_stride: stride };
            let [_, nd] = p.pair_extents().expect("valid packing");
            let mut dst = vec![bf16::NAN; nd];
            pack_pair_panels_bf16(&p, &src, &mut dst).expect("packs");
            let g = p.pair_gemm(1, k, false);
            let mut seen = vec![false; nd];
            for pp in 0..k {
                for j in 0..n {
                    let want = src[if trans { j * ld + pp } else { pp * ld + j }];
                    let at = g.b_index(pp, j);
                    assert_eq!(dst[at], want, "k {k} n {n} trans {trans}: B[{pp}, {j}]");
                    seen[at] = true;
                }
            }
            for q in 0..n.div_ceil(32) {
                for at in q * stride..q * stride + k.div_ceil(32) * STEP {
                    assert!(seen[at] || dst[at] == bf16::ZERO, "padding at {at} is {}", dst[at]);
                }
            }
        }
    }

    #[test]
    fn a_width_other_than_32_is_refused() {
        let p = PanelPacking { k: 4, n: 4, trans: false, ld: 4, width: 16, panel_stride: 1024 };
        let err = pack_pair_panels_bf16(&p, &[bf16::ZERO; 16], &mut [bf16::ZERO; 1024]);
        assert!(matches!(err, Err(TileError::InvalidLayout { operand: "dst", .. })), "{err:?}");
    }
}
