//! A bf16 B packed once into the bf16 GEMM's own panels, for GEMMs that read the same B many
//! times (attention's keys and values, read by every query block of a head, on AMX or
//! `vdpbf16ps`): a [`GemmShape`] with [`GemmShape::b_pairs`] reads the panels where they lie,
//! rather than every call packing its B again.

use half::bf16;

use crate::error::{check_len, span};
use crate::{GemmShape, TileError};

/// Columns per pair panel.
pub const BF16_PAIR_PANEL: usize = 32;

/// Elements of one pair panel of a `k`-deep B: `k.div_ceil(32)` blocks of 1024.
pub fn bf16_pair_panel_len(k: usize) -> usize {
    k.div_ceil(32).saturating_mul(1024)
}

/// Where `B[p, j]` lies in pair panels `ldb` apart (see [`GemmShape::b_pairs`]).
pub fn pair_panel_offset(p: usize, j: usize, ldb: usize) -> usize {
    (j / 32) * ldb + (p / 32) * 1024 + (j % 32 / 16) * 512 + (p % 32 / 2) * 32 + (j % 16) * 2 + p % 2
}

/// Packs the `k x n` bf16 B (`B[p, j]` at `j * ld + p` when `trans`, else at `p * ld + j`)
/// into `n.div_ceil(32)` pair panels, one after another, each [`bf16_pair_panel_len`]`(k)`
/// long and zero-padded past `k` and `n` (the layout of [`GemmShape::b_pairs`], whose panels
/// are then `bf16_pair_panel_len(k)` apart). A stretch of B's rows that starts at a multiple
/// of 32 is itself pair panels, from `(p0 / 32) * 1024` on, at the same distance.
///
/// # Errors
///
/// Nothing is written when one is returned: [`TileError::LeadingDim`] or
/// [`TileError::Overflow`] for the source's layout; [`TileError::BufferTooSmall`] when `src`
/// or `dst` is shorter than its extent.
///
/// # Examples
///
/// ```rust
/// use half::bf16;
/// use uopc_tile::{Bf16Path, GemmShape, TileError, bf16_pair_panel_len, gemm_bf16, pack_bf16_pairs};
///
/// let h = |x: f32| bf16::from_f32(x);
/// // B = [[1, 2], [3, 4], [5, 6]] (k = 3, n = 2), packed once into one panel.
/// let b = [h(1.0), h(2.0), h(3.0), h(4.0), h(5.0), h(6.0)];
/// let mut panels = vec![h(f32::NAN); bf16_pair_panel_len(3)];
/// pack_bf16_pairs(3, 2, false, 2, &b, &mut panels)?;
/// let s = GemmShape { b_pairs: true, ldb: bf16_pair_panel_len(3), ..GemmShape::dense(1, 2, 3, false, false, false) };
/// let mut c = [0.0f32; 2];
/// gemm_bf16(Bf16Path::detect(), &s, &[h(1.0), h(1.0), h(1.0)], &panels, &mut c)?;
/// assert_eq!(c, [9.0, 12.0]);
/// # Ok::<(), TileError>(())
/// ```
pub fn pack_bf16_pairs(
    k: usize,
    n: usize,
    trans: bool,
    ld: usize,
    src: &[bf16],
    dst: &mut [bf16],
) -> Result<(), TileError> {
    let (rows, cols) = if trans { (n, k) } else { (k, n) };
    check_len("src", span("src", rows, cols, ld)?, src.len())?;
    let needed = n
        .div_ceil(BF16_PAIR_PANEL)
        .checked_mul(bf16_pair_panel_len(k))
        .ok_or(TileError::Overflow { operand: "dst" })?;
    check_len("dst", needed, dst.len())?;
    if needed == 0 {
        return Ok(());
    }
    let (b, out) = (src.as_ptr().cast::<u16>(), dst.as_mut_ptr().cast::<u16>());
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bw") {
        // SAFETY: the features are present; the source's extent and the panels' length were
        // checked above (bf16 is a transparent u16).
        unsafe {
            if trans {
                crate::x86::bf16::pack_b_cols(out, b, ld, k, n);
            } else {
                crate::x86::bf16::pack_b_rows(out, b, ld, k, n);
            }
        }
        return Ok(());
    }
    let s = GemmShape { ldb: ld, ..GemmShape::dense(0, n, k, false, trans, false) };
    // SAFETY: as above.
    unsafe { crate::bf16_blocked::pack_b_scalar(out, &s, b) };
    Ok(())
}
