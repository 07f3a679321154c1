//! The blocked GEMM driver shared by the vector ISAs.
//!
//! [`drive`] wraps an ISA-specific register tile ([`TileKernel`]) in cache blocking: k is
//! split into `KC` slabs, and each slab of B is packed into contiguous `NR`-wide panels
//! (transposing it if needed, zero-padding the ragged last one) that stay in L1 while rows of A
//! stream past them. A is read in place (one scalar per row and k step is all the kernel
//! needs), except that a transposed A is copied into `MR`-wide strips when that pays.

use crate::GemmShape;
use crate::gemm::zero_c;
use crate::pack;

/// One register tile's work: `C[0..mr, 0..nr] (+)= A_panel · B_panel` over `kc` steps.
pub(crate) struct Tile {
    /// Rows, `1..=MR`.
    pub mr: usize,
    /// Columns, `1..=NR`.
    pub nr: usize,
    /// k steps (at least 1).
    pub kc: usize,
    /// `A[i, p]` is at `a + p * lda + i` when `a_colmajor`, else at `a + i * lda + p`.
    pub a: *const f32,
    pub lda: usize,
    pub a_colmajor: bool,
    /// Row `p` of the B panel starts at `b + p * ldb` and has `NR` readable floats (those past
    /// `nr` are padding: read, but their results dropped).
    pub b: *const f32,
    pub ldb: usize,
    /// `C[i, j]` is at `c + i * ldc + j`; only the `mr x nr` corner is accessed.
    pub c: *mut f32,
    pub ldc: usize,
    /// Add to C instead of overwriting it.
    pub accumulate: bool,
}

/// An ISA's register-tile kernel and B packing.
pub(crate) trait TileKernel {
    /// Rows of the register tile.
    const MR: usize;
    /// Columns of the register tile (a whole number of vectors).
    const NR: usize;

    /// Runs one tile.
    ///
    /// # Safety
    ///
    /// The CPU supports the kernel's ISA and every pointer in `t` is valid as `Tile` describes.
    unsafe fn tile(t: &Tile);

    /// Packs untransposed B into one panel: `dst[p * NR + j] = src[p * ldb + j]` for `p < kc`,
    /// `j < nr`, and zero for `nr <= j < NR`.
    ///
    /// # Safety
    ///
    /// The CPU supports the kernel's ISA, `dst` is writable for `kc * NR` floats and `src`
    /// readable at every `p * ldb + j` above.
    unsafe fn pack_b(dst: *mut f32, src: *const f32, ldb: usize, kc: usize, nr: usize);

    /// Packs `B^T` into one panel: `dst[p * NR + j] = src[j * ldb + p]` for `p < kc`, `j < nr`,
    /// and zero for `nr <= j < NR`.
    ///
    /// # Safety
    ///
    /// The CPU supports the kernel's ISA, `dst` is writable for `kc * NR` floats and `src`
    /// readable at every `j * ldb + p` above.
    unsafe fn pack_bt(dst: *mut f32, src: *const f32, ldb: usize, kc: usize, nr: usize);
}

/// k slab: a 32-wide B panel of `KC` rows is 32 KiB, about what L1 can keep beside A's rows.
const KC: usize = 256;
/// Rows of A swept per B panel, so the A block (`MC x KC`) stays in L2 across panels.
const MC: usize = 256;
/// Cap on the packed B block (512 KiB): a quarter of a 2 MiB L2, leaving room for A and C.
const PACK_FLOATS: usize = 1 << 17;
/// An untransposed B slab spanning at most this many floats (32 KiB, within L1) is read in
/// place: its full panels need no copy to stay in L1 (flash attention's `P · V_blk`); a
/// larger slab no longer stays in L1, so it is packed (`docs/bench/tile-gemm-in-place.json`).
const IN_PLACE_FLOATS: usize = 1 << 13;

/// The blocked driver shared by the vector ISAs.
///
/// # Safety
///
/// The contract of [`crate::gemm_unchecked`], with `K`'s ISA available.
pub(crate) unsafe fn drive<K: TileKernel>(s: &GemmShape, a: *const f32, b: *const f32, c: *mut f32) {
    let GemmShape { m, n, k, lda, ldb, ldc, a_trans, b_trans, .. } = *s;
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !s.accumulate {
            // SAFETY: C's extent is valid for writes.
            unsafe { zero_c(s, c) };
        }
        return;
    }
    let kc_max = k.min(KC);
    let nc_max = (PACK_FLOATS / kc_max / K::NR).max(1) * K::NR;
    let mc_max = (MC / K::MR).max(1) * K::MR;
    // B is packed a whole `kc x nc` block at a time (transposed or not), followed in the buffer
    // by the packed `mc x kc` block of A when A is stored transposed.
    let b_floats = kc_max * nc_max.min(n.next_multiple_of(K::NR));
    // Copying a transposed A pays when its strips are reused across several B panels, or when
    // `lda` is a multiple of 128 floats: then the rows of a strip map to at most 8 of L1's 64
    // sets, and a long strip no longer fits them.
    let pack_a = a_trans && (n >= 4 * K::NR || lda.is_multiple_of(128));
    let a_floats = if pack_a { kc_max * mc_max.min(m.next_multiple_of(K::MR)) } else { 0 };
    pack::with_buffer(b_floats + a_floats, |buf| {
        // SAFETY: the buffer holds `b_floats + a_floats` floats.
        let abuf = unsafe { buf.add(b_floats) };
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            let accumulate = s.accumulate || pc > 0;
            let in_place = !b_trans && kc * ldb <= IN_PLACE_FLOATS;
            for jc in (0..n).step_by(nc_max) {
                let nc = nc_max.min(n - jc);
                for jr in (0..nc).step_by(K::NR) {
                    let nr = K::NR.min(nc - jr);
                    if in_place && nr == K::NR {
                        continue;
                    }
                    // SAFETY: panel `jr / NR` occupies `buf[jr * kc .. (jr + NR) * kc]`, inside
                    // the B part of the buffer; the source block (columns `jc + jr ..`, k rows
                    // `pc ..`) lies in B's storage.
                    unsafe {
                        if b_trans {
                            K::pack_bt(buf.add(jr * kc), b.add((jc + jr) * ldb + pc), ldb, kc, nr);
                        } else {
                            K::pack_b(buf.add(jr * kc), b.add(pc * ldb + jc + jr), ldb, kc, nr);
                        }
                    }
                }
                for ic in (0..m).step_by(mc_max) {
                    let mc = mc_max.min(m - ic);
                    if pack_a {
                        // SAFETY: the A part of the buffer holds `kc * mc.next_multiple_of(MR)`
                        // floats; the source rows `pc .. pc + kc`, columns `ic .. ic + mc` lie in
                        // A's `k x m` storage.
                        unsafe { pack_a_trans::<K>(abuf, a.add(pc * lda + ic), lda, kc, mc) };
                    }
                    for jr in (0..nc).step_by(K::NR) {
                        let nr = K::NR.min(nc - jr);
                        let (bp, bld) = if in_place && nr == K::NR {
                            // SAFETY: a full panel read in place lies in B's storage (rows
                            // `pc .. pc + kc`, columns `jc + jr .. jc + jr + NR <= n`).
                            (unsafe { b.add(pc * ldb + jc + jr) }, ldb)
                        } else {
                            // SAFETY: panel `jr / NR` of the packed block.
                            (unsafe { buf.add(jr * kc) }.cast_const(), K::NR)
                        };
                        for ir in (0..mc).step_by(K::MR) {
                            let i = ic + ir;
                            // SAFETY: row `i < m` and slab `pc < k` of A and C exist; the tile
                            // stays within their extents (or A's packed strip `ir / MR`), and
                            // B's panel was packed above.
                            unsafe {
                                let (ap, alda) = if pack_a {
                                    (abuf.add(ir * kc).cast_const(), K::MR)
                                } else if a_trans {
                                    (a.add(pc * lda + i), lda)
                                } else {
                                    (a.add(i * lda + pc), lda)
                                };
                                let tile = Tile {
                                    mr: K::MR.min(mc - ir),
                                    nr,
                                    kc,
                                    a: ap,
                                    lda: alda,
                                    a_colmajor: a_trans,
                                    b: bp,
                                    ldb: bld,
                                    c: c.add(i * ldc + jc + jr),
                                    ldc,
                                    accumulate,
                                };
                                K::tile(&tile);
                            }
                        }
                    }
                }
            }
        }
    });
}

/// Packs a transposed A block (`kc` stored rows of `mc` columns) into strips of `MR` columns:
/// strip `s` holds `dst[s * MR * kc + p * MR + i] = src[p * lda + s * MR + i]`.
///
/// A transposed A already gives the kernel `MR` adjacent floats per k step, but with a large
/// power-of-two `lda` the `kc` rows of a strip all fall into one L1 set and evict each other;
/// the packed strips are contiguous instead. Lanes past `mc` in the last strip are not written
/// (the kernel never reads them).
///
/// # Safety
///
/// `dst` writable for `kc * mc.next_multiple_of(MR)` floats; `src` readable at `p * lda + j`
/// for `p < kc`, `j < mc`.
unsafe fn pack_a_trans<K: TileKernel>(dst: *mut f32, src: *const f32, lda: usize, kc: usize, mc: usize) {
    for s0 in (0..mc).step_by(K::MR) {
        let w = K::MR.min(mc - s0);
        for p in 0..kc {
            // SAFETY: within the bounds of the contract. The full-width copy has a constant
            // length, so it compiles to vector moves rather than a `memcpy` call.
            unsafe {
                let (from, to) = (src.add(p * lda + s0), dst.add(s0 * kc + p * K::MR));
                if w == K::MR {
                    std::ptr::copy_nonoverlapping(from, to, K::MR);
                } else {
                    std::ptr::copy_nonoverlapping(from, to, w);
                }
            }
        }
    }
}
