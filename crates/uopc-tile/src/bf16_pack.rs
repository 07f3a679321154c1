//! How the bf16 GEMM's blocked driver lays out and packs its operands: B into panels of tile
//! pairs (see [`crate::bf16_gemm`] for the layout), A read in place or packed into tiles, and
//! the buffer that holds them, and the row stride of the strip of f32 sums beside it.

use crate::GemmShape;
use crate::bf16_path::Bf16Path;
use crate::x86::bf16_tiles::ATiles;

/// u16 in one packed tile pair (a B panel's k block, or a row block's A k block).
pub(crate) const BLOCK: usize = 1024;

impl ATiles {
    /// Row block `blk`, k block `kb` of a packed region holding `kblocks` k blocks per row
    /// block.
    pub(crate) fn packed(base: *const u16, blk: usize, kblocks: usize, kb: usize) -> ATiles {
        ATiles { ptr: base.wrapping_add((blk * kblocks + kb) * BLOCK), stride: 64, hi: 1024, step: 2048 }
    }
}

/// Packs B (any layout) into the panel layout of this module with scalar code.
///
/// # Safety
///
/// `dst` is writable for `n.div_ceil(32) * k.div_ceil(32) * 1024` u16; B's extent under `s`
/// is readable.
unsafe fn pack_b_portable(dst: *mut u16, s: &GemmShape, b: *const u16) {
    let kblocks = s.k.div_ceil(32);
    let panels = s.n.div_ceil(32);
    // SAFETY: the whole packed region is writable.
    unsafe { std::ptr::write_bytes(dst, 0, panels * kblocks * BLOCK) };
    for p in 0..s.k {
        for j in 0..s.n {
            let src = if s.b_trans { j * s.ldb + p } else { p * s.ldb + j };
            let at = ((j / 32) * kblocks + p / 32) * BLOCK
                + ((j % 32) / 16) * 512
                + ((p % 32) / 2) * 32
                + 2 * (j % 16)
                + p % 2;
            // SAFETY: `(p, j)` is inside B's extent; `at` inside the packed region.
            unsafe { *dst.add(at) = *b.add(src) };
        }
    }
}

/// Copies rows `i0 .. i0 + 32` (those below `m`), k blocks `kb0 .. kb0 + nkb` of A into
/// packed tiles at `dst` (`nkb * 1024` u16), zero-padding rows past `m` and k past `k`.
///
/// # Safety
///
/// `dst` is writable for `nkb * 1024` u16; A's extent under `s` is readable.
pub(crate) unsafe fn pack_a_block(
    dst: *mut u16,
    s: &GemmShape,
    a: *const u16,
    i0: usize,
    kb0: usize,
    nkb: usize,
) {
    let rows = s.m.saturating_sub(i0).min(32);
    if rows < 32 || (kb0 + nkb) * 32 > s.k {
        // SAFETY: the region is writable.
        unsafe { std::ptr::write_bytes(dst, 0, nkb * BLOCK) };
    }
    for kb in 0..nkb {
        let p0 = (kb0 + kb) * 32;
        let cols = s.k.saturating_sub(p0).min(32);
        for r in 0..rows {
            let i = i0 + r;
            // SAFETY: row `i < m`, columns `p0 .. p0 + cols <= k` lie in A's extent; the
            // destination row is inside tile `kb`.
            unsafe {
                let d = dst.add(kb * BLOCK + r * 32);
                if s.a_trans {
                    for q in 0..cols {
                        *d.add(q) = *a.add((p0 + q) * s.lda + i);
                    }
                } else if cols == 32 {
                    // One 64-byte row: a fixed-size copy the compiler keeps in vector registers.
                    d.cast::<[u16; 32]>().write(a.add(i * s.lda + p0).cast::<[u16; 32]>().read_unaligned());
                } else {
                    std::ptr::copy_nonoverlapping(a.add(i * s.lda + p0), d, cols);
                }
            }
        }
    }
}

/// Packs one row block of a row-major A (its k blocks of one pass) into contiguous tiles a
/// few rows at a time, one part per block of the row block before it, so that its loads from
/// memory overlap the tile multiplies instead of stalling a packing pass of their own.
pub(crate) struct RowBlockPacker {
    /// Whether it packs with the vector routine ([`vector_pack`]).
    vector: bool,
    s: GemmShape,
    a: *const u16,
    dst: *mut u16,
    i0: usize,
    /// The pass's k blocks `kb0 .. kb0 + nkb`.
    kb0: usize,
    nkb: usize,
    /// 64-byte pieces (one row of A, one k block) packed, of `total`.
    next: usize,
    total: usize,
    per_step: usize,
}

impl RowBlockPacker {
    /// The packer of row block `i0 ..`, k blocks `kb0 .. kb0 + nkb` of A into `dst` over
    /// `steps` steps; it packs nothing when A is transposed (its row blocks are packed whole
    /// when reached) or `i0 >= m`.
    pub(crate) fn new(
        path: Bf16Path,
        s: &GemmShape,
        a: *const u16,
        dst: *mut u16,
        (i0, (kb0, nkb)): (usize, (usize, usize)),
        steps: usize,
    ) -> RowBlockPacker {
        let total = if s.a_trans || i0 >= s.m { 0 } else { 32 * nkb };
        let per_step = total.div_ceil(steps.max(1));
        RowBlockPacker { vector: vector_pack(path), s: *s, a, dst, i0, kb0, nkb, next: 0, total, per_step }
    }

    /// Packs the next part.
    ///
    /// # Safety
    ///
    /// `dst` is writable for `nkb * 1024` u16, A's extent is readable, and the path's CPU
    /// features are available.
    pub(crate) unsafe fn step(&mut self) {
        let end = (self.next + self.per_step).min(self.total);
        // SAFETY: forwarded from this function's contract.
        unsafe { self.pack(end) };
    }

    /// Packs what is left.
    ///
    /// # Safety
    ///
    /// As for [`RowBlockPacker::step`].
    pub(crate) unsafe fn finish(&mut self) {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.pack(self.total) };
    }

    /// Packs pieces `next .. end` (see `x86::bf16::pack_a_tile_rows`); the portable path packs
    /// the whole row block at its first part, with portable code.
    ///
    /// # Safety
    ///
    /// As for [`RowBlockPacker::step`], with the path's CPU features available.
    unsafe fn pack(&mut self, end: usize) {
        if end <= self.next {
            return;
        }
        // Never true off x86-64 ([`vector_pack`]).
        if self.vector {
            #[cfg(target_arch = "x86_64")]
            {
                let GemmShape { m, k, lda, .. } = self.s;
                // SAFETY: AVX-512BW is available ([`vector_pack`]); the rest is this function's
                // contract.
                unsafe {
                    crate::x86::bf16::pack_a_tile_rows(
                        self.dst,
                        (self.a, lda),
                        (m, k),
                        (self.i0, (self.kb0, self.nkb)),
                        (self.next, end),
                    )
                };
                self.next = end;
                return;
            }
        }
        // SAFETY: forwarded from this function's contract.
        unsafe { pack_a_block(self.dst, &self.s, self.a, self.i0, self.kb0, self.nkb) };
        self.next = self.total;
    }
}

/// How the driver reads A's tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum APacking {
    /// Whole rows of A where they lie (k contiguous), packed only where ragged: the row block
    /// below the last whole one, and the k block past the last whole one.
    InPlace,
    /// Every row block packed up front (A transposed, for the vector paths).
    Whole,
    /// Every row block packed into contiguous tiles once per pass (AMX: 32 rows whose rows lie
    /// a power of two apart would share a few L1 sets), while the first panel group runs: the
    /// next row block while the current one's blocks multiply.
    PerRowBlock,
}

/// The driver's packing buffer, in u16: one panel group's pass of packed B (none for B in
/// pair panels), A's row region and k-tail region (as [`APacking`] needs them); and the row
/// stride of its strip of f32 sums (32 rows, in a buffer of its own).
pub(crate) struct Layout {
    pub(crate) a: APacking,
    /// u16 of packed B (one group's pass) and of A's row region (the k-tail region follows it).
    pub(crate) b: usize,
    pub(crate) a_rows: usize,
    /// The strip's row stride in f32.
    pub(crate) strip_ld: usize,
    pub(crate) total: usize,
    /// Pairs of k that the last k step holds: the rest is padding `vdpbf16ps` skips.
    pub(crate) k_tail_pairs: usize,
}

impl Layout {
    /// The layout for `s`, A packed per pass when `packs_a`, with passes of `pass_blocks` k
    /// blocks and groups of `group` panels.
    pub(crate) fn of(s: &GemmShape, packs_a: bool, (pass_blocks, group): (usize, usize)) -> Layout {
        let (kblocks, k_full) = (s.k.div_ceil(32), s.k / 32);
        let (rblocks, m_full) = (s.m.div_ceil(32), s.m / 32);
        let a = if packs_a {
            APacking::PerRowBlock
        } else if s.a_trans {
            APacking::Whole
        } else {
            APacking::InPlace
        };
        let (a_rows, a_k) = match a {
            APacking::InPlace => (
                if m_full < rblocks { kblocks * BLOCK } else { 0 },
                if k_full < kblocks { m_full * BLOCK } else { 0 },
            ),
            APacking::Whole => (rblocks * kblocks * BLOCK, 0),
            APacking::PerRowBlock => (rblocks * pass_blocks.min(kblocks) * BLOCK, 0),
        };
        // One panel group's pass of B at a time (`pack_b_group`).
        let b =
            if s.b_pair_panels { 0 } else { group.min(s.n.div_ceil(32)) * pass_blocks.min(kblocks) * BLOCK };
        // Sixteen floats past the group's columns, so that rows a power of two apart do not
        // share L1 sets.
        let strip_ld = group.min(s.n.div_ceil(32)) * 32 + 16;
        let k_tail_pairs = if s.k.is_multiple_of(32) { 16 } else { (s.k % 32).div_ceil(2) };
        Layout { a, b, a_rows, strip_ld, total: b + a_rows + a_k, k_tail_pairs }
    }
}

/// Whether `path` packs with the AVX-512BW routines of `x86::bf16`: every path of this driver
/// but the portable one, which packs with portable code too, so that forcing it tests code
/// that needs no CPU features at all.
fn vector_pack(path: Bf16Path) -> bool {
    path != Bf16Path::Portable && vector_packing_available()
}

/// Whether the AVX-512BW packing routines of `x86::bf16` can run here.
pub(crate) fn vector_packing_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512bw");
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// Packs row block `i0 ..`, k blocks `kb0 .. kb0 + nkb` of A into contiguous tiles at `dst`
/// (as [`ATiles::packed`] reads them, one row block of `nkb` k blocks).
///
/// # Safety
///
/// `dst` is writable for `nkb * 1024` u16; A's extent under `s` is readable; the path's CPU
/// features are available.
pub(crate) unsafe fn pack_row_block(
    path: Bf16Path,
    s: &GemmShape,
    a: *const u16,
    dst: *mut u16,
    (i0, (kb0, nkb)): (usize, (usize, usize)),
) {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        #[cfg(target_arch = "x86_64")]
        if vector_pack(path) {
            if !s.a_trans {
                let (m, k, lda) = (s.m, s.k, s.lda);
                crate::x86::bf16::pack_a_tile_rows(dst, (a, lda), (m, k), (i0, (kb0, nkb)), (0, 32 * nkb));
                return;
            }
            if kb0 == 0 && nkb == s.k.div_ceil(32) {
                crate::x86::bf16::pack_a_cols(dst, a, s.lda, s.k, s.m, i0);
                return;
            }
        }
        pack_a_block(dst, s, a, i0, kb0, nkb);
    }
}

/// Packs the A regions
///
/// # Safety
///
/// The regions hold what [`Layout`] sizes them for, and the operands' extents are valid (the
/// contract of `gemm_bf16_unchecked`).
pub(crate) unsafe fn pack_a_regions(
    path: Bf16Path,
    s: &GemmShape,
    a: *const u16,
    (ap_rows, ap_k): (*mut u16, *mut u16),
    packing: APacking,
) {
    let GemmShape { m, k, lda, .. } = *s;
    let kblocks = k.div_ceil(32);
    let (k_full, m_full, rblocks) = (k / 32, m / 32, m.div_ceil(32));
    // SAFETY: the packing routines write inside their regions and read inside the operands'
    // extents (this function's contract).
    unsafe {
        let vector = vector_pack(path);
        match packing {
            APacking::InPlace => {
                if m_full < rblocks {
                    pack_a_block(ap_rows, s, a, m_full * 32, 0, kblocks);
                }
                if k_full < kblocks {
                    for ib in 0..m_full {
                        pack_a_block(ap_k.add(ib * BLOCK), s, a, ib * 32, k_full, 1);
                    }
                }
            }
            APacking::Whole => {
                for ib in 0..rblocks {
                    let dst = ap_rows.add(ib * kblocks * BLOCK);
                    match vector {
                        #[cfg(target_arch = "x86_64")]
                        true => crate::x86::bf16::pack_a_cols(dst, a, lda, k, m, ib * 32),
                        _ => pack_a_block(dst, s, a, ib * 32, 0, kblocks),
                    }
                }
            }
            APacking::PerRowBlock => {}
        }
    }
}

/// Packs panels `jg .. jg + gp` of B over k blocks `kb0 .. kb1` into `dst`, each panel
/// `(kb1 - kb0) * 1024` u16 after the one before: the part of B one panel group's pass reads,
/// packed just before its row blocks run, so it is in L2 when they read it and the buffer
/// stays one group's size.
///
/// # Safety
///
/// `dst` is writable for `gp * (kb1 - kb0) * 1024` u16; B's extent under `s` is readable; the
/// path's CPU features are available.
pub(crate) unsafe fn pack_b_group(
    path: Bf16Path,
    s: &GemmShape,
    b: *const u16,
    dst: *mut u16,
    ((kb0, kb1), (jg, gp)): ((usize, usize), (usize, usize)),
) {
    let (p0, j0) = (kb0 * 32, jg * 32);
    let (k, n) = ((kb1 * 32).min(s.k) - p0, (gp * 32).min(s.n - j0));
    let from = b.wrapping_add(if s.b_trans { j0 * s.ldb + p0 } else { p0 * s.ldb + j0 });
    // SAFETY: the sub-block's rows and columns lie in B's extent and its packed panels in
    // `dst` (this function's contract); the vector routines only where the path has them.
    unsafe { pack_b_panels(vector_pack(path), (from, s.ldb, s.b_trans), (k, n), dst) }
}

/// Packs the `k x n` B at `b` (rows `ldb` apart, stored `n x k` when `trans`) into pair
/// panels at `dst`, each `k.div_ceil(32) * 1024` u16 after the one before, zero-filling k past
/// `k` and columns past `n`: with the AVX-512BW routines when `vector`, else portable code.
///
/// # Safety
///
/// `vector` only where [`vector_packing_available`]; B's `k x n` elements are readable and
/// `dst` is writable for `n.div_ceil(32) * k.div_ceil(32) * 1024` u16.
pub(crate) unsafe fn pack_b_panels(
    vector: bool,
    (b, ldb, trans): (*const u16, usize, bool),
    (k, n): (usize, usize),
    dst: *mut u16,
) {
    // SAFETY: this function's contract.
    unsafe {
        match (vector, trans) {
            #[cfg(target_arch = "x86_64")]
            (true, false) => crate::x86::bf16::pack_b_rows(dst, b, ldb, k, n),
            #[cfg(target_arch = "x86_64")]
            (true, true) => crate::x86::bf16::pack_b_cols(dst, b, ldb, k, n),
            _ => {
                pack_b_portable(dst, &GemmShape { ldb, ..GemmShape::dense(0, n, k, false, trans, false) }, b)
            }
        }
    }
}

/// The A pieces covering k blocks `kb0..kb1` of row block `ib`, as [`Layout`] laid A out
/// (packed regions `(rows, k_tail)`; a row block packed per pass holds the pass's k blocks
/// from `pass_start`): `(tiles, first k block, k blocks)`, and how many there are (one, or two
/// when whole rows read in place end in a packed ragged k block).
pub(crate) fn a_pieces(
    s: &GemmShape,
    a: *const u16,
    (ap_rows, ap_k): (*mut u16, *mut u16),
    packing: APacking,
    ib: usize,
    (pass_start, kb0, kb1): (usize, usize, usize),
) -> ([(ATiles, usize, usize); 2], usize) {
    let kblocks = s.k.div_ceil(32);
    let (k_full, m_full) = (s.k / 32, s.m / 32);
    let mut pieces = [(ATiles::packed(ap_rows, 0, 0, 0), 0, 0); 2];
    let mut npieces = 0;
    match packing {
        APacking::Whole => {
            pieces[0] = (ATiles::packed(ap_rows, ib, kblocks, kb0), kb0, kb1 - kb0);
            npieces = 1;
        }
        APacking::PerRowBlock => {
            pieces[0] = (ATiles::packed(ap_rows, 0, 0, kb0 - pass_start), kb0, kb1 - kb0);
            npieces = 1;
        }
        APacking::InPlace if ib == m_full => {
            pieces[0] = (ATiles::packed(ap_rows, 0, kblocks, kb0), kb0, kb1 - kb0);
            npieces = 1;
        }
        APacking::InPlace => {
            let full_end = kb1.min(k_full);
            if full_end > kb0 {
                let row = a.wrapping_add(ib * 32 * s.lda + kb0 * 32);
                let at = ATiles { ptr: row, stride: s.lda * 2, hi: 16 * s.lda * 2, step: 64 };
                pieces[0] = (at, kb0, full_end - kb0);
                npieces = 1;
            }
            if kb1 > k_full {
                pieces[npieces] = (ATiles::packed(ap_k, ib, 1, 0), k_full, 1);
                npieces += 1;
            }
        }
    }
    (pieces, npieces)
}
