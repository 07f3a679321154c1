//! Where the bf16 GEMM's blocked driver writes C: in place in an f32 C, through a local strip
//! for ragged blocks, or rounded from the strip into a bf16 C.

use crate::GemmShape;
use crate::bf16_path::Bf16Path;
use crate::shapes::zero_c;

/// Where the blocked driver writes C.
#[derive(Clone, Copy)]
pub(crate) enum COut {
    /// f32, read first when accumulating or between k slabs.
    F32(*mut f32),
    /// bf16 bits, each 32 x 32 block rounded from its f32 sums once its one k slab is done.
    Bf16(*mut u16),
}

impl COut {
    /// Writes the sum of no terms: zeros, unless an f32 C is accumulated into.
    ///
    /// # Safety
    ///
    /// C's `m x n` extent at stride `ldc` is writable.
    pub(crate) unsafe fn empty_sum(self, s: &GemmShape) {
        match self {
            // SAFETY: this function's contract.
            COut::F32(c) if !s.accumulate => unsafe { zero_c(s, c) },
            COut::Bf16(c) => {
                for i in 0..s.m {
                    // SAFETY: row `i < m` of C holds `n` writable elements at stride `ldc`.
                    unsafe { std::ptr::write_bytes(c.add(i * s.ldc), 0, s.n) };
                }
            }
            COut::F32(_) => {}
        }
    }

    /// Whether a block of `rows x cols` is summed in C itself: an f32 C's whole 32 x 32 blocks
    /// are when their k loop runs once (`one_slab`) or every row starts a cache line (`ldc`
    /// floats apart); ragged ones, misaligned ones reloaded between slabs (tile rows that
    /// straddle two lines cost two loads and two stores each, at every slab), and every block
    /// of a bf16 C are summed in a strip.
    fn in_place(self, (rows, cols): (usize, usize), ldc: usize, one_slab: bool) -> bool {
        match self {
            COut::F32(c) => {
                rows == 32
                    && cols >= 32
                    && (one_slab || (c.addr().is_multiple_of(64) && ldc.is_multiple_of(16)))
            }
            COut::Bf16(_) => false,
        }
    }
}

/// The sums of one row block of a panel group: where each of its 32 x 32 blocks is summed
/// (in C itself, or in a local strip of f32 rows) and how the strip reaches C once every k slab
/// has run. The strip lets a product sweep k in slabs short enough for a row block's A to stay
/// in L1 without C ever holding partial bf16 sums, and keeps ragged blocks' sums off C's edges.
pub(crate) struct Strip {
    c: COut,
    /// Row 0 of the strip: 32 rows of `ld` f32.
    local: *mut f32,
    ld: usize,
    /// C's first row and column under the strip, and C's row stride.
    at: (usize, usize),
    ldc: usize,
    /// C's rows and columns under the strip.
    rows: usize,
    cols: usize,
    /// Whether blocks summed in the strip start from C's values, and whether they share its
    /// first 32 columns (see [`Strip::open`]).
    accumulate: bool,
    shared: bool,
}

impl Strip {
    /// The strip over C's `rows x cols` at `(i0, j0)` summed in `local` (32 rows of `ld` f32,
    /// `ld >= cols`, or `ld >= 32` when `shared`); blocks summed in the strip start from C's
    /// values when `accumulate`. A `shared` strip sums every block in its first 32 columns:
    /// each block is closed before the next one opens (one k slab per pass), and one 4 KiB
    /// block stays in L1 where a whole strip would not.
    ///
    /// # Safety
    ///
    /// `local` is writable for 32 rows of `ld` f32; the region lies inside C, readable when
    /// `accumulate`.
    pub(crate) unsafe fn open(
        c: COut,
        (local, ld): (*mut f32, usize),
        ((i0, j0), (rows, cols)): ((usize, usize), (usize, usize)),
        ldc: usize,
        (accumulate, shared): (bool, bool),
    ) -> Strip {
        Strip { c, local, ld, at: (i0, j0), ldc, rows, cols, accumulate, shared }
    }

    /// Where the block `j` columns into the strip (a multiple of 32) is summed, and its row
    /// stride; at the block's first slab (`first`), a block summed in the strip is given C's
    /// values first when accumulating.
    ///
    /// # Safety
    ///
    /// As for [`Strip::open`].
    pub(crate) unsafe fn block(&self, j: usize, first: bool) -> (*mut f32, usize) {
        if let COut::F32(c) = self.c {
            let in_c = c.wrapping_add(self.c_offset(j));
            if self.summed_in_c(j) {
                return (in_c, self.ldc);
            }
            if first && self.accumulate {
                // SAFETY: the block's rows and columns lie in C, readable when accumulating;
                // the strip's block holds `rows` rows of 32 floats (this function's contract).
                unsafe {
                    copy_rows((in_c, self.ldc), (self.local_block(j), self.ld), (self.rows, self.width(j)))
                };
            }
        }
        (self.local_block(j), self.ld)
    }

    /// Whether the block `j` columns into the strip is summed in C itself.
    pub(crate) fn summed_in_c(&self, j: usize) -> bool {
        self.c.in_place((self.rows, self.cols - j), self.ldc, self.shared)
    }

    /// Row 0 of the block `j` columns into the strip.
    fn local_block(&self, j: usize) -> *mut f32 {
        self.local.wrapping_add(if self.shared { 0 } else { j })
    }

    /// The element of C under row 0 of the block `j` columns into the strip.
    fn c_offset(&self, j: usize) -> usize {
        self.at.0 * self.ldc + self.at.1 + j
    }

    /// The columns of C under the block `j` columns into the strip.
    fn width(&self, j: usize) -> usize {
        (self.cols - j).min(32)
    }

    /// Where the block `j` columns into the strip lies in C, and the bytes between its rows.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn in_c(&self, j: usize) -> (*const i8, usize) {
        match self.c {
            COut::F32(c) => (c.wrapping_add(self.c_offset(j)).cast(), self.ldc * 4),
            COut::Bf16(c) => (c.wrapping_add(self.c_offset(j)).cast(), self.ldc * 2),
        }
    }

    /// Writes the block `j` columns into the strip to C if it was summed in the strip:
    /// copied into an f32 C, rounded into a bf16 one ([`round_block`]).
    ///
    /// # Safety
    ///
    /// As for [`Strip::open`], C writable.
    pub(crate) unsafe fn close(&self, path: Bf16Path, j: usize) {
        if self.summed_in_c(j) {
            return;
        }
        let (src, extent) = (self.local_block(j), (self.rows, self.width(j)));
        match self.c {
            // SAFETY: the strip's block is readable; its rows and columns lie inside C.
            COut::F32(c) => unsafe { copy_rows((src, self.ld), (c.add(self.c_offset(j)), self.ldc), extent) },
            // SAFETY: as above.
            COut::Bf16(c) => unsafe {
                round_block(path, (src, self.ld), extent, c.add(self.c_offset(j)), self.ldc)
            },
        }
    }
}

/// Copies `rows x cols` f32 (`cols <= 32`) from `from` to `to`, each with its row stride. A
/// whole row of 32 is one fixed-size copy the compiler keeps in vector registers, where a
/// call per 128 bytes would cost more.
///
/// # Safety
///
/// `from` is readable and `to` writable for `rows` rows of `cols` floats at their strides, and
/// the two do not overlap.
unsafe fn copy_rows(
    (from, lds): (*const f32, usize),
    (to, ldt): (*mut f32, usize),
    (rows, cols): (usize, usize),
) {
    for r in 0..rows {
        let (src, dst) = (from.wrapping_add(r * lds), to.wrapping_add(r * ldt));
        // SAFETY: row `r` of each is `cols` floats inside its region (this function's contract).
        unsafe {
            if cols == 32 {
                dst.cast::<[f32; 32]>().write_unaligned(src.cast::<[f32; 32]>().read_unaligned());
            } else {
                std::ptr::copy_nonoverlapping(src, dst, cols);
            }
        }
    }
}

/// Rounds `rows x cols` f32 at `src` (rows `lds` apart, `cols <= 32`) to bf16 bits at `dst`
/// (rows `ldd` apart), as [`crate::convert::bf16_from_f32`] does for every value a tile or
/// `vdpbf16ps` sum can be (those flush subnormal results to zero).
///
/// # Safety
///
/// `src` is readable and `dst` writable for `rows` rows of `cols` elements at their strides.
unsafe fn round_block(
    path: Bf16Path,
    (src, lds): (*const f32, usize),
    (rows, cols): (usize, usize),
    dst: *mut u16,
    ldd: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if path == Bf16Path::Amx && cols == 32 && crate::machine::Machine::get().features.avx512bf16 {
        // SAFETY: AMX machines run it only with AVX-512 BF16 (checked); the rows are 32
        // elements, readable and writable (this function's contract).
        unsafe { crate::x86::bf16::round_rows_32(src, lds, rows, dst, ldd) };
        return;
    }
    // SAFETY: this function's contract (bf16 is a transparent u16).
    unsafe { crate::blocked::round_into::<half::bf16>(src, lds, dst, ldd, (rows, cols)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rounding of a finished block matches the scalar conversion on every value a tile
    /// sum can be: ties both ways, the largest finite f32 (to infinity), infinities, zeros
    /// and NaNs with payloads (quieted, sign and top payload bits kept). Subnormals are left
    /// out: the AMX and `vdpbf16ps` sums flush them.
    #[test]
    fn rounding_a_block_matches_the_scalar_conversion() {
        let specials: [u32; 12] = [
            0x3F80_8000,
            0x3F81_8000,
            0x3F80_8001,
            0x7F7F_FFFF,
            0xFF7F_FFFF,
            0x7F80_0000,
            0xFF80_0000,
            0x8000_0000,
            0x7FC0_0001,
            0xFF81_2345,
            0x7F80_0001,
            0xC020_0000,
        ];
        let mut block = [0.0f32; 1024];
        for (i, x) in block.iter_mut().enumerate() {
            *x = f32::from_bits(if i % 3 == 0 {
                specials[i / 3 % 12]
            } else {
                0x3F00_0000 + (i as u32) * 4099
            });
        }
        for (rows, cols) in [(32, 32), (17, 32), (32, 5)] {
            let mut out = vec![0u16; 32 * 40];
            // SAFETY: `out` holds `rows` rows of `cols` at stride 40.
            unsafe { round_block(Bf16Path::Amx, (block.as_ptr(), 32), (rows, cols), out.as_mut_ptr(), 40) };
            for r in 0..32 {
                for j in 0..40 {
                    let want = if r < rows && j < cols {
                        crate::convert::bf16_from_f32(block[r * 32 + j]).to_bits()
                    } else {
                        0
                    };
                    assert_eq!(out[r * 40 + j], want, "{rows} x {cols} at ({r}, {j})");
                }
            }
        }
        let vector = cfg!(target_arch = "x86_64") && crate::machine::Machine::get().features.avx512bf16;
        println!("ran: whole rows with {}", if vector { "vcvtne2ps2bf16" } else { "the slice conversion" });
    }
}
