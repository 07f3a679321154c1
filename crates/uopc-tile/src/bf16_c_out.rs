//! Where the bf16 GEMM's blocked driver writes C: in place in an f32 C, through a local
//! 32 x 32 block for a ragged one, or rounded from the local block into a bf16 C.

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

    /// Where the `rows x cols` block at `(i0, j0)` is summed, and its row stride: a whole f32
    /// block in C itself, else in `local` (C's values copied in first when `load`).
    ///
    /// # Safety
    ///
    /// The block lies inside C, readable when `load`.
    pub(crate) unsafe fn open(
        self,
        local: &mut [f32; 1024],
        (i0, j0): (usize, usize),
        (rows, cols): (usize, usize),
        ldc: usize,
        load: bool,
    ) -> (*mut f32, usize) {
        match self {
            // SAFETY: the block lies inside C.
            COut::F32(c) if rows == 32 && cols == 32 => (unsafe { c.add(i0 * ldc + j0) }, ldc),
            COut::F32(c) if load => {
                for r in 0..rows {
                    // SAFETY: row `i0 + r < m`, columns `j0 .. j0 + cols <= n`.
                    let row = unsafe { std::slice::from_raw_parts(c.add((i0 + r) * ldc + j0), cols) };
                    local[r * 32..r * 32 + cols].copy_from_slice(row);
                }
                (local.as_mut_ptr(), 32)
            }
            _ => (local.as_mut_ptr(), 32),
        }
    }

    /// Writes a block summed in `local` (see [`COut::open`]) to C: copied to a ragged f32
    /// block, rounded into a bf16 one ([`round_block`]).
    ///
    /// # Safety
    ///
    /// The block lies inside C.
    pub(crate) unsafe fn close(
        self,
        path: Bf16Path,
        local: &[f32; 1024],
        (i0, j0): (usize, usize),
        (rows, cols): (usize, usize),
        ldc: usize,
    ) {
        match self {
            COut::F32(_) if rows == 32 && cols == 32 => {}
            COut::F32(c) => {
                for r in 0..rows {
                    // SAFETY: as for the copy in.
                    let row = unsafe { std::slice::from_raw_parts_mut(c.add((i0 + r) * ldc + j0), cols) };
                    row.copy_from_slice(&local[r * 32..r * 32 + cols]);
                }
            }
            // SAFETY: rows `i0 .. i0 + rows`, columns `j0 .. j0 + cols` lie inside C.
            COut::Bf16(c) => unsafe { round_block(path, local, (rows, cols), c.add(i0 * ldc + j0), ldc) },
        }
    }

    /// The address of element `at` and the bytes between rows `ldc` elements apart.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn at(self, at: usize, ldc: usize) -> (*const i8, usize) {
        match self {
            COut::F32(c) => (c.wrapping_add(at).cast(), ldc * 4),
            COut::Bf16(c) => (c.wrapping_add(at).cast(), ldc * 2),
        }
    }
}

/// Rounds the `rows x cols` corner of a 32 x 32 f32 block to bf16 bits at `dst` (rows `ldd`
/// apart), as [`crate::convert::bf16_from_f32`] does for every value a tile or `vdpbf16ps`
/// sum can be (those flush subnormal results to zero).
///
/// # Safety
///
/// `dst` is writable for `rows` rows of `cols` u16, `ldd` apart.
unsafe fn round_block(
    path: Bf16Path,
    block: &[f32; 1024],
    (rows, cols): (usize, usize),
    dst: *mut u16,
    ldd: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if path == Bf16Path::Amx && cols == 32 && crate::machine::Machine::get().features.avx512bf16 {
        // SAFETY: AMX machines run it only with AVX-512 BF16 (checked); the block's rows are
        // 32 f32 and `dst`'s are writable (this function's contract).
        unsafe { crate::x86::bf16::round_rows_32(block.as_ptr(), rows, dst, ldd) };
        return;
    }
    if rows > 0 && cols > 0 {
        // SAFETY: `rows` rows of `cols` u16, `ldd` apart, are writable (this function's
        // contract; bf16 is a transparent u16).
        let out =
            unsafe { std::slice::from_raw_parts_mut(dst.cast::<half::bf16>(), (rows - 1) * ldd + cols) };
        // The extents are exact, so this cannot fail.
        let _ = crate::convert::convert_block(rows, cols, block, 32, out, ldd);
    }
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
            unsafe { round_block(Bf16Path::Amx, &block, (rows, cols), out.as_mut_ptr(), 40) };
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
