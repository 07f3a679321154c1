//! The blocked GEMM driver shared by the vector ISAs and by the f32 and f16 operand types.
//!
//! [`drive`] wraps an ISA-specific register tile ([`TileKernel`]) in cache blocking derived
//! from the machine model ([`crate::machine::GemmBlocking`]): k is split into balanced slabs
//! of at most `kc`; per slab, blocks of A's rows (`mc`, kept in L3) are copied into k-major
//! `MR`-row strips, and blocks of B's columns (`nc`, kept in L2) into contiguous `NR`-wide
//! panels (transposing them if needed, zero-padding the ragged last one). Each strip of A
//! stays in L1 while every panel of the B block streams past it. A is copied only when its
//! strips meet enough B panels to pay for the copy; a product of few columns reads an f32 A
//! in place.
//!
//! The operands' element type is a parameter ([`Element`]): f16 operands are widened to f32
//! exactly by the same packing (B's panels, and A's block, which the kernel cannot read as
//! f16), so an f16 GEMM makes one pass over its inputs, as the f32 one does, and then runs
//! the f32 register tile.

use crate::GemmShape;
use crate::convert::BlockConversion;
use crate::machine::{L1Geometry, MAX_L1_SETS};
use crate::pack;
use crate::shapes::zero_c;
pub(crate) use crate::tile::{HalfFloat, Tile, TileKernel};

/// An element type [`drive`] takes A and B in; the register tile computes in f32.
pub(crate) trait Element: Copy {
    /// The register tile reads this type where it lies (f32 only): then A and small untransposed
    /// B slabs are not copied. Other types are always packed, which widens them.
    const READ_IN_PLACE: bool;

    /// Widens `n` consecutive values: `dst[i] = src[i]` as f32, for `i < n`.
    ///
    /// # Safety
    ///
    /// `src` readable and `dst` writable for `n` elements, not overlapping; the CPU features of
    /// the type's packing (F16C for f16, AVX2 for bf16) are available.
    unsafe fn widen(dst: *mut f32, src: *const Self, n: usize);

    /// [`TileKernel::pack_b`] of `K`, from this type.
    ///
    /// # Safety
    ///
    /// As [`TileKernel::pack_b`], with the features [`Element::widen`] needs.
    unsafe fn pack_b<K: TileKernel>(dst: *mut f32, src: *const Self, ldb: usize, kc: usize, nr: usize);

    /// [`TileKernel::pack_bt`] of `K`, from this type.
    ///
    /// # Safety
    ///
    /// As [`TileKernel::pack_bt`], with the features [`Element::widen`] needs.
    unsafe fn pack_bt<K: TileKernel>(dst: *mut f32, src: *const Self, ldb: usize, kc: usize, nr: usize);

    /// One k-major strip of `mr` rows of A, as [`TileKernel::pack_a_rows`] of `K` (lanes past
    /// `mr` may be left unwritten: the kernel never reads them).
    ///
    /// # Safety
    ///
    /// As [`TileKernel::pack_a_rows`], with the features [`Element::widen`] needs.
    unsafe fn pack_a_rows<K: TileKernel>(dst: *mut f32, src: *const Self, lda: usize, kc: usize, mr: usize);
}

impl Element for f32 {
    const READ_IN_PLACE: bool = true;

    // Inlined so that a constant `n` (a strip's width) compiles to vector moves.
    #[inline(always)]
    unsafe fn widen(dst: *mut f32, src: *const f32, n: usize) {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, n) }
    }

    unsafe fn pack_b<K: TileKernel>(dst: *mut f32, src: *const f32, ldb: usize, kc: usize, nr: usize) {
        // SAFETY: the caller's contract.
        unsafe { K::pack_b(dst, src, ldb, kc, nr) }
    }

    unsafe fn pack_bt<K: TileKernel>(dst: *mut f32, src: *const f32, ldb: usize, kc: usize, nr: usize) {
        // SAFETY: the caller's contract.
        unsafe { K::pack_bt(dst, src, ldb, kc, nr) }
    }

    unsafe fn pack_a_rows<K: TileKernel>(dst: *mut f32, src: *const f32, lda: usize, kc: usize, mr: usize) {
        // SAFETY: the caller's contract; the kernel's version also zeroes the lanes past `mr`,
        // which lie inside the strip.
        unsafe { K::pack_a_rows(dst, src, lda, kc, mr) }
    }
}

// Both 16-bit types widen with the kernels' vector packers (`HalfFloat`); their callers hold
// the widening features (F16C for f16, AVX2 for bf16, which every vector ISA includes).
impl<H: HalfFloat> Element for H {
    const READ_IN_PLACE: bool = false;

    unsafe fn widen(dst: *mut f32, src: *const H, n: usize) {
        // SAFETY: the caller's contract.
        unsafe { H::widen(dst, src, n) }
    }

    unsafe fn pack_b<K: TileKernel>(dst: *mut f32, src: *const H, ldb: usize, kc: usize, nr: usize) {
        // SAFETY: the caller's contract.
        unsafe { K::pack_b_half(dst, src, ldb, kc, nr) }
    }

    unsafe fn pack_bt<K: TileKernel>(dst: *mut f32, src: *const H, ldb: usize, kc: usize, nr: usize) {
        // SAFETY: the caller's contract.
        unsafe { K::pack_bt_half(dst, src, ldb, kc, nr) }
    }

    unsafe fn pack_a_rows<K: TileKernel>(dst: *mut f32, src: *const H, lda: usize, kc: usize, mr: usize) {
        // SAFETY: the caller's contract; the kernel's version also zeroes the lanes past `mr`,
        // which lie inside the strip.
        unsafe { K::pack_a_rows_half(dst, src, lda, kc, mr) }
    }
}

/// The cache blocking for kernel `K` from the machine model ([`crate::machine::GemmBlocking`]),
/// with the k slabs of a `k`-deep product balanced: `ceil(k / kc)` slabs of equal depth
/// (rounded up to 8), so a product slightly deeper than `kc` does not end in a sliver.
fn blocking<K: TileKernel>(k: usize) -> (usize, usize, usize) {
    let g = crate::machine::GemmBlocking::of_this_machine(K::MR, K::NR);
    let slabs = k.div_ceil(g.kc).max(1);
    let kc = k.div_ceil(slabs).next_multiple_of(8).min(k.max(1));
    (kc, g.mc, g.nc)
}

/// A not transposed is copied into `MR`-row strips, k-major (the layout of a transposed A),
/// once each of its strips meets at least this many B micro-panels, or when its rows, read
/// where they lie, would not stay in L1 ([`strip_stays_in_l1`]). Below that, the copy costs
/// more than it saves: the register tile reads A's rows in place at the packed loop's rate
/// (`cargo xtask mca`), so a copy only pays where it keeps the strip in L1 or is spread over
/// so many panels that it costs nothing (attention's `Q K^T` and `P V` blocks, 4 to 16
/// panels wide, are read in place).
const PACK_A_MIN_PANELS: usize = 32;

/// A stored transposed is copied into strips once each meets at least this many B panels:
/// read in place, the tile takes each k step's `MR` values at a stride of `lda` rather than
/// from one packed line.
const PACK_A_TRANS_MIN_PANELS: usize = 4;

/// Whether a full B panel of `kc` rows, `ldb` floats apart, is read where it lies rather than
/// packed: the slab must span at most L1's floats (its full panels then stay in L1 with no
/// copy: flash attention's `P · V_blk`; a larger slab no longer stays in L1, so it is packed,
/// `docs/bench/tile-gemm-in-place.json`), and its rows must not pile into a few L1 sets. Rows
/// a multiple of a line apart share sets with the rows `sets / gcd` lines further on; more
/// than half a set's ways per set would evict each other and the rows of A and C streaming
/// past (on 64 sets, a 128-float stride puts 64 rows into 8 sets), so such a panel is packed,
/// contiguous, instead.
fn panel_stays_in_l1(kc: usize, ldb: usize, l1: &L1Geometry) -> bool {
    if kc * ldb > l1.floats() {
        return false;
    }
    if !ldb.is_multiple_of(l1.line_floats) {
        // Rows start at shifting offsets within their lines and so spread over the sets.
        return true;
    }
    let distinct_sets = l1.sets / gcd(l1.sets, ldb / l1.line_floats);
    kc.div_ceil(distinct_sets) <= l1.ways / 2
}

/// Whether an `mr`-row strip of a row-major A, `kc` floats of each row `lda` floats apart,
/// stays in L1 when read where it lies: no L1 set holds more than half its ways of the strip's
/// lines (the rest is left to the B panels streaming past and to C). Rows a multiple of
/// `sets` lines apart land on the same sets, so a strip of such rows is copied instead.
fn strip_stays_in_l1(mr: usize, kc: usize, lda: usize, l1: &L1Geometry) -> bool {
    // A row starting mid-line touches one line more than its length.
    let row_lines = kc.div_ceil(l1.line_floats) + 1;
    if mr * row_lines > l1.sets * l1.ways / 2 {
        return false;
    }
    let mut lines_per_set = [0usize; MAX_L1_SETS];
    for row in 0..mr {
        let first = row * lda / l1.line_floats;
        for line in first..first + row_lines {
            lines_per_set[line % l1.sets] += 1;
        }
    }
    lines_per_set.iter().all(|&lines| lines <= l1.ways / 2)
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The blocked driver shared by the vector ISAs, on an A of type `EA` and a B of type `EB`.
///
/// # Safety
///
/// The contract of [`crate::gemm_unchecked`] (A counted in `EA`s, B in `EB`s), with `K`'s ISA
/// and the features both types' widening needs available.
pub(crate) unsafe fn drive<K: TileKernel, EA: Element, EB: Element>(
    s: &GemmShape,
    a: *const EA,
    b: *const EB,
    c: *mut f32,
) {
    // SAFETY: forwarded from this function's contract.
    unsafe { drive_into::<K, EA, EB>(s, a, b, c, None) }
}

/// Where a rounded product's finished rows go: 16-bit storage that each strip of C's f32 sums
/// is rounded into (to nearest even) as soon as the last k slab has swept it, while it is in
/// cache.
#[derive(Clone, Copy)]
pub(crate) struct RoundedC {
    /// The 16-bit C, element `(i, j)` at `dst[i * ldd + j]` (of the type `round` writes).
    dst: *mut u16,
    ldd: usize,
    /// [`round_into`] for the type C holds.
    round: unsafe fn(*const f32, usize, *mut u16, usize, (usize, usize)),
}

impl RoundedC {
    /// The 16-bit C at `dst`, rows `ldd` apart.
    pub(crate) fn new<D>(dst: *mut D, ldd: usize) -> RoundedC
    where
        f32: BlockConversion<D>,
    {
        RoundedC { dst: dst.cast(), ldd, round: round_into::<D> }
    }
}

/// Rounds the `rows x cols` f32 block at `sums` (rows `lds` apart) into the `D` block at
/// `dst` (rows `ldd` apart), with [`crate::convert::convert_block`].
///
/// # Safety
///
/// `sums` is readable for the block; `dst` points to `D`s and is writable for the block; the
/// two do not overlap.
pub(crate) unsafe fn round_into<D>(
    sums: *const f32,
    lds: usize,
    dst: *mut u16,
    ldd: usize,
    (rows, cols): (usize, usize),
) where
    f32: BlockConversion<D>,
{
    if rows == 0 || cols == 0 {
        return;
    }
    // SAFETY: the caller's contract: `rows` rows of `cols` elements at each block's stride.
    let (sums, dst) = unsafe {
        (
            std::slice::from_raw_parts(sums, (rows - 1) * lds + cols),
            std::slice::from_raw_parts_mut(dst.cast::<D>(), (rows - 1) * ldd + cols),
        )
    };
    // The extents are exact, so this cannot fail.
    let _ = crate::convert::convert_block(rows, cols, sums, lds, dst, ldd);
}

/// [`drive`] writing C's sums rounded into `rounded.dst` instead of an f32 C.
///
/// A product of one k slab sums each strip of rows in a scratch strip of the packing buffer
/// (`MR` rows of the B block's width, in L1 and L2) and rounds it from there, so the call
/// writes nothing but the 16-bit C; a deeper one keeps its sums between slabs in an f32 C of
/// its own (a kept buffer, [`crate::memory::overwritten_f32`]) and rounds each strip after the
/// last slab sweeps it.
///
/// # Safety
///
/// The contract of [`drive`] with `!s.accumulate` and without its C: `rounded.dst` is valid for
/// writes of an `m x n` block at stride `rounded.ldd >= n` (of `rounded.to`'s type) and
/// overlaps no operand.
pub(crate) unsafe fn drive_rounded<K: TileKernel, EA: Element, EB: Element>(
    s: &GemmShape,
    a: *const EA,
    b: *const EB,
    rounded: RoundedC,
) {
    debug_assert!(!s.accumulate, "a rounded C carries no sums in");
    let (m, n, k) = (s.m, s.n, s.k);
    if m == 0 || n == 0 {
        return;
    }
    let dense = GemmShape { ldc: n, accumulate: false, parallel: false, ..*s };
    if k <= blocking::<K>(k).0 {
        // SAFETY: forwarded; with one slab the driver never touches its f32 C.
        unsafe { drive_into::<K, EA, EB>(&dense, a, b, std::ptr::null_mut(), Some(rounded)) };
        return;
    }
    let mut sums = crate::memory::overwritten_f32(m * n);
    // SAFETY: forwarded, with the f32 C the call's own `m x n` buffer at stride `n`.
    unsafe { drive_into::<K, EA, EB>(&dense, a, b, sums.as_mut_ptr(), Some(rounded)) };
    crate::memory::keep_f32(sums);
}

/// [`drive`], rounding into `rounded` when given ([`drive_rounded`]).
///
/// # Safety
///
/// As [`drive`]; with `rounded`, as [`drive_rounded`], `c` an f32 C of the shape's `m x n`
/// unless `k` fits one slab (then `c` is not used).
unsafe fn drive_into<K: TileKernel, EA: Element, EB: Element>(
    s: &GemmShape,
    a: *const EA,
    b: *const EB,
    c: *mut f32,
    rounded: Option<RoundedC>,
) {
    let GemmShape { m, n, k, lda, ldb, a_trans, b_trans, b_panel_width, .. } = *s;
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        match rounded {
            // SAFETY: the 16-bit block spans `m x n` at its stride; 16-bit zero is all zero bits.
            Some(r) => (0..m).for_each(|i| unsafe { std::ptr::write_bytes(r.dst.add(i * r.ldd), 0, n) }),
            // SAFETY: C's extent is valid for writes.
            None if !s.accumulate => unsafe { zero_c(s, c) },
            None => {}
        }
        return;
    }
    let (kc_step, mc_block, nc_block) = blocking::<K>(k);
    let kc_max = k.min(kc_step);
    let nc_max = nc_block.max(K::NR);
    let mc_max = mc_block.max(K::MR);
    // B is packed a whole `kc x nc` block at a time (transposed or not), followed in the buffer
    // by the packed `mc x kc` block of A when A is copied; each A block is packed once per
    // slab, each B block once per slab and A block.
    // B already in panels (a whole number of register-tile columns wide, as the dispatcher
    // checked) is read where it lies.
    let prepacked = b_panel_width != 0;
    let b_floats = if prepacked { 0 } else { kc_max * nc_max.min(n.next_multiple_of(K::NR)) };
    // A is copied into k-major strips when it is not f32 (it must be widened), when its strips
    // meet enough B panels to pay for the copy, or when its rows would crowd L1's sets: a row-
    // major strip whose rows share sets, or a transposed one with `lda` a multiple of 128
    // floats (its k rows then map to at most 8 of L1's 64 sets, and a long strip no longer
    // fits them).
    let l1 = L1Geometry::of_this_machine();
    let pack_a = !EA::READ_IN_PLACE
        || if a_trans {
            n >= PACK_A_TRANS_MIN_PANELS * K::NR || lda.is_multiple_of(128)
        } else {
            n >= PACK_A_MIN_PANELS * K::NR || !strip_stays_in_l1(K::MR, kc_max, lda, &l1)
        };
    let a_floats = if pack_a { kc_max * mc_max.min(m.next_multiple_of(K::MR)) } else { 0 };
    // A rounded product of one slab sums each strip in a scratch strip (a buffer of its own,
    // `pack::with_strip`), its rows a line longer than whole panels so that they do not all
    // fall into one L1 set (the panels' widths are powers of two).
    let strip_ld = nc_max.min(n).next_multiple_of(K::NR) + l1.line_floats;
    let strip_floats = if rounded.is_some() && k <= kc_step { K::MR * strip_ld } else { 0 };
    let packed = |buf: *mut f32, strip: *mut f32| {
        // SAFETY: the buffer holds `b_floats + a_floats` floats.
        let abuf = unsafe { buf.add(b_floats) };
        let strip = (strip_floats > 0).then_some((strip, strip_ld));
        for pc in (0..k).step_by(kc_step) {
            let kc = kc_step.min(k - pc);
            let accumulate = s.accumulate || pc > 0;
            let in_place = EB::READ_IN_PLACE && !b_trans && panel_stays_in_l1(kc, ldb, &l1);
            for ic in (0..m).step_by(mc_max) {
                let mc = mc_max.min(m - ic);
                if pack_a && a_trans {
                    // SAFETY: the A part of the buffer holds `kc * mc.next_multiple_of(MR)`
                    // floats; the source rows `pc .. pc + kc`, columns `ic .. ic + mc` lie in
                    // A's `k x m` storage.
                    unsafe { pack_a_trans::<K, EA>(abuf, a.add(pc * lda + ic), lda, kc, mc) };
                } else if pack_a {
                    // SAFETY: as above; rows `ic .. ic + mc`, columns `pc .. pc + kc` lie in
                    // A's `m x k` storage.
                    unsafe { pack_a_rows::<K, EA>(abuf, a.add(ic * lda + pc), lda, kc, mc) };
                }
                for jc in (0..n).step_by(nc_max) {
                    let nc = nc_max.min(n - jc);
                    if !prepacked {
                        // SAFETY: the B part of the buffer holds `kc * nc.next_multiple_of(NR)`
                        // floats; the source block (rows `pc .. pc + kc`, columns `jc .. jc +
                        // nc` of the product's B) lies in B's storage.
                        unsafe {
                            let at = if b_trans { jc * ldb + pc } else { pc * ldb + jc };
                            pack_b_block::<K, EB>(buf, b.add(at), ldb, b_trans, kc, nc, in_place);
                        }
                    }
                    let last_slab = pc + kc == k;
                    let rounded = rounded.filter(|_| last_slab);
                    let block = Block {
                        pc,
                        kc,
                        ic,
                        mc,
                        jc,
                        nc,
                        accumulate,
                        in_place,
                        pack_a,
                        prepacked,
                        rounded,
                        strip,
                    };
                    // SAFETY: the blocks lie in the operands (as packed above), which the
                    // caller's contract makes valid; `buf` holds the packed B block and
                    // `abuf` the packed A block.
                    unsafe { sweep_block::<K, EA, EB>(s, &block, a, b, buf, abuf, c) };
                }
            }
        }
    };
    pack::with_buffer(b_floats + a_floats, |buf| pack::with_strip(strip_floats, |strip| packed(buf, strip)));
}

/// One `mc x nc` block of C over one k slab, as [`drive`] cut it: where its operands lie.
struct Block {
    pc: usize,
    kc: usize,
    ic: usize,
    mc: usize,
    jc: usize,
    nc: usize,
    /// C is added to (a later slab, or the caller asked to accumulate).
    accumulate: bool,
    /// B's full panels are read where they lie ([`panel_stays_in_l1`]).
    in_place: bool,
    /// A's block was packed into `abuf`.
    pack_a: bool,
    /// B is stored in panels of `b_panel_width` columns, read where they lie.
    prepacked: bool,
    /// The last slab of a rounded product: each strip is rounded into it once swept.
    rounded: Option<RoundedC>,
    /// Where a rounded product of one slab sums each strip instead of C, and its row stride.
    strip: Option<(*mut f32, usize)>,
}

/// Runs the register tiles of one block: each `MR`-row strip of A, which stays in L1,
/// against every `NR`-column panel of B, which streams from the B block in L2.
///
/// # Safety
///
/// As [`drive`], with `buf` holding the block's packed B panels (unless B is read in place
/// or in caller panels) and `abuf` its packed A strips when `blk.pack_a`.
unsafe fn sweep_block<K: TileKernel, EA: Element, EB: Element>(
    s: &GemmShape,
    blk: &Block,
    a: *const EA,
    b: *const EB,
    buf: *const f32,
    abuf: *const f32,
    c: *mut f32,
) {
    let Block { pc, kc, ic, mc, jc, nc, accumulate, in_place, pack_a, prepacked, rounded, strip } = *blk;
    let (lda, ldb, ldc, a_trans, w) = (s.lda, s.ldb, s.ldc, s.a_trans, s.b_panel_width);
    for ir in (0..mc).step_by(K::MR) {
        let i = ic + ir;
        // SAFETY: row `i < m` and slab `pc < k` of A exist (or A's packed strip `ir / MR`).
        let (ap, alda) = unsafe {
            match (pack_a, a_trans) {
                (true, _) => (abuf.add(ir * kc), K::MR),
                // Not packed, so `EA` is f32 (`READ_IN_PLACE`).
                (false, true) => (a.add(pc * lda + i).cast::<f32>(), lda),
                (false, false) => (a.add(i * lda + pc).cast::<f32>(), lda),
            }
        };
        // Where the strip's sums go: its rows of C from column `jc`, or the scratch strip (then
        // C is not used, and may be null).
        let (c_strip, c_ld) = match strip {
            // SAFETY: row `i < m`, column `jc < n` of C.
            None => (unsafe { c.add(i * ldc + jc) }, ldc),
            Some(scratch) => scratch,
        };
        for jr in (0..nc).step_by(K::NR) {
            let nr = K::NR.min(nc - jr);
            let (bp, bld) = if prepacked {
                let j = jc + jr;
                // SAFETY: column `j` starts a register tile inside its panel (`w` is a
                // multiple of NR), whose rows `pc .. pc + kc` lie in B's extent with NR
                // readable floats each (the panel is `w` wide); `EB` is f32, the only type
                // panels are taken in.
                (unsafe { b.add((j / w) * ldb + pc * w + j % w) }.cast::<f32>(), w)
            } else if in_place && nr == K::NR {
                // SAFETY: a full panel read in place lies in B's storage (rows `pc .. pc +
                // kc`, columns `jc + jr .. jc + jr + NR <= n`), whose elements are f32
                // (`READ_IN_PLACE`).
                (unsafe { b.add(pc * ldb + jc + jr) }.cast::<f32>(), ldb)
            } else {
                // SAFETY: panel `jr / NR` of the packed block.
                (unsafe { buf.add(jr * kc) }, K::NR)
            };
            let tile = Tile {
                mr: K::MR.min(mc - ir),
                nr,
                kc,
                a: ap,
                lda: alda,
                a_colmajor: pack_a || a_trans,
                b: bp,
                ldb: bld,
                // SAFETY: column `jc + jr < n` of C's row `i`, or column `jr` of the scratch
                // strip (`MR` rows of at least `nc` floats).
                c: unsafe { c_strip.add(jr) },
                ldc: c_ld,
                accumulate,
            };
            // SAFETY: the tile stays within the extents of A, B and C (or the packed
            // strips and panels), as the caller's contract and the cut give.
            unsafe { K::tile(&tile) };
        }
        if let Some(r) = rounded {
            // SAFETY: the strip's final sums (in the scratch strip, or rows `i ..` and columns
            // `jc ..` of C) and its block of the 16-bit C (rows `i .. i + mr`, columns `jc ..
            // jc + nc`, the contract of `drive_rounded`) lie in their buffers.
            unsafe { round_rows(r, c_strip, c_ld, (i, jc), (K::MR.min(mc - ir), nc)) };
        }
    }
}

/// Rounds the `rows x cols` f32 block at `sums` (rows `lds` apart) into the block of `r.dst`
/// at `(i0, j0)`.
///
/// # Safety
///
/// Both blocks lie in their buffers (`sums` readable, `r.dst` writable at stride `r.ldd`) and
/// do not overlap.
unsafe fn round_rows(
    r: RoundedC,
    sums: *const f32,
    lds: usize,
    (i0, j0): (usize, usize),
    (rows, cols): (usize, usize),
) {
    // SAFETY: the caller's contract; row `i0`, column `j0` lie in `r.dst` when the block is
    // not empty (`wrapping_add`, since an empty one may start past C's end).
    unsafe { (r.round)(sums, lds, r.dst.wrapping_add(i0 * r.ldd + j0), r.ldd, (rows, cols)) }
}

/// Rows of an untransposed B that [`pack_b_block`] copies into every panel before it moves on.
///
/// Each row of a B block is contiguous across the panels, so copying a few rows across all
/// panels reads memory in sequential runs that the hardware prefetchers follow. Packing one
/// panel down all `kc` rows instead jumps `ldb` floats every 32 of them: a jump of a page or
/// more that no prefetcher crosses, so each row's lines were demand misses.
const PACK_B_ROWS: usize = 16;

/// Packs a `kc x nc` block of B (stored transposed when `b_trans`) into `NR`-wide panels,
/// panel `j` at `dst[j * kc ..]` (see [`TileKernel::pack_b`]); with `full_in_place`, the full
/// panels are skipped (the kernel reads them where they lie) and only a ragged last one is
/// packed.
///
/// # Safety
///
/// `dst` writable for `kc * nc.next_multiple_of(NR)` floats; `src` readable as the block (at
/// `p * ldb + j`, or at `j * ldb + p` when transposed, for `p < kc`, `j < nc`); the features
/// of `K` and [`Element::widen`] available.
unsafe fn pack_b_block<K: TileKernel, E: Element>(
    dst: *mut f32,
    src: *const E,
    ldb: usize,
    b_trans: bool,
    kc: usize,
    nc: usize,
    full_in_place: bool,
) {
    let panels = (0..nc).step_by(K::NR).map(|j| (j, K::NR.min(nc - j)));
    let packed = panels.filter(|&(_, nr)| !(full_in_place && nr == K::NR));
    // SAFETY: every panel's rows `p0 .. p0 + rows <= kc` and columns `j .. j + nr <= nc` lie in
    // the block, and its packed rows in panel `j / NR` of `dst`.
    unsafe {
        if b_trans {
            for (j, nr) in packed {
                E::pack_bt::<K>(dst.add(j * kc), src.add(j * ldb), ldb, kc, nr);
            }
            return;
        }
        for p0 in (0..kc).step_by(PACK_B_ROWS) {
            let rows = PACK_B_ROWS.min(kc - p0);
            for (j, nr) in packed.clone() {
                E::pack_b::<K>(dst.add(j * kc + p0 * K::NR), src.add(p0 * ldb + j), ldb, rows, nr);
            }
        }
    }
}

/// Packs a transposed A block (`kc` stored rows of `mc` columns) into strips of `MR` columns:
/// strip `s` holds `dst[s * MR * kc + p * MR + i] = src[p * lda + s * MR + i]`.
///
/// A transposed A already gives the kernel `MR` adjacent floats per k step, but with a large
/// power-of-two `lda` the `kc` rows of a strip all fall into one L1 set and evict each other;
/// the packed strips are contiguous instead. Lanes past `mc` in the last strip are not written
/// (the kernel never reads them). Other element types than f32 are widened on the way.
///
/// # Safety
///
/// `dst` writable for `kc * mc.next_multiple_of(MR)` floats; `src` readable at `p * lda + j`
/// for `p < kc`, `j < mc`; the features of [`Element::widen`] available.
unsafe fn pack_a_trans<K: TileKernel, E: Element>(
    dst: *mut f32,
    src: *const E,
    lda: usize,
    kc: usize,
    mc: usize,
) {
    for s0 in (0..mc).step_by(K::MR) {
        let w = K::MR.min(mc - s0);
        for p in 0..kc {
            // SAFETY: within the bounds of the contract. The full-width copy has a constant
            // length, so it compiles to vector moves rather than a `memcpy` call.
            unsafe {
                let (from, to) = (src.add(p * lda + s0), dst.add(s0 * kc + p * K::MR));
                if w == K::MR {
                    E::widen(to, from, K::MR);
                } else {
                    E::widen(to, from, w);
                }
            }
        }
    }
}

/// Packs an A block stored `mc x kc` (rows `lda` apart) into strips of `MR` rows, k-major:
/// strip `s` holds `dst[s * MR * kc + p * MR + i] = src[(s * MR + i) * lda + p]`, the layout
/// [`pack_a_trans`] writes. Lanes past `mc` in the last strip are zeroed or left unwritten (the
/// kernel never reads them). Other element types than f32 are widened on the way.
///
/// # Safety
///
/// `dst` writable for `kc * mc.next_multiple_of(MR)` floats; `src` readable at `i * lda + p`
/// for `i < mc`, `p < kc`; the features of [`Element::widen`] available.
unsafe fn pack_a_rows<K: TileKernel, E: Element>(
    dst: *mut f32,
    src: *const E,
    lda: usize,
    kc: usize,
    mc: usize,
) {
    for s0 in (0..mc).step_by(K::MR) {
        let w = K::MR.min(mc - s0);
        // SAFETY: strip `s0 / MR` is `dst[s0 * kc .. (s0 + MR) * kc]`, inside `dst` (`mc` rounded
        // up to MR), and its source rows `s0 .. s0 + w < mc` have `kc` readable elements.
        unsafe { E::pack_a_rows::<K>(dst.add(s0 * kc), src.add(s0 * lda), lda, kc, w) };
    }
}

#[cfg(test)]
mod tests {
    use super::{panel_stays_in_l1, strip_stays_in_l1};
    use crate::machine::L1Geometry;

    /// Zen 3 and Zen 4's L1 (and the fallback): 32 KiB in 64 sets of 8 ways.
    const EIGHT_WAYS: L1Geometry = L1Geometry { line_floats: 16, sets: 64, ways: 8 };
    /// Sapphire and Emerald Rapids' and Zen 5's: 48 KiB in 64 sets of 12 ways.
    const TWELVE_WAYS: L1Geometry = L1Geometry { line_floats: 16, sets: 64, ways: 12 };

    #[test]
    fn strips_whose_rows_share_l1_sets_are_copied() {
        // Attention's Q (d = 64, 128) and P (128 or 256 keys plus a line) rows spread.
        assert!(strip_stays_in_l1(6, 64, 64, &EIGHT_WAYS));
        assert!(strip_stays_in_l1(12, 128, 128, &EIGHT_WAYS));
        assert!(strip_stays_in_l1(12, 128, 144, &EIGHT_WAYS));
        // Rows 64 lines (4 KiB) apart all land on the same sets.
        assert!(!strip_stays_in_l1(6, 320, 1024, &EIGHT_WAYS));
        assert!(!strip_stays_in_l1(12, 256, 3072, &EIGHT_WAYS));
        // Rows 48 lines apart start on 4 sets: 3 rows of 12 share each, overlapping at the ends.
        assert!(!strip_stays_in_l1(12, 256, 768, &EIGHT_WAYS));
        assert!(strip_stays_in_l1(6, 320, 768, &EIGHT_WAYS));
        // A strip of more lines than half of L1 is always copied.
        assert!(!strip_stays_in_l1(12, 1024, 1000, &EIGHT_WAYS));
    }

    #[test]
    fn panels_whose_rows_share_l1_sets_are_packed() {
        // P · V at D = 64 and D = 96: rows spread over 16 and 32 sets.
        assert!(panel_stays_in_l1(64, 64, &EIGHT_WAYS));
        assert!(panel_stays_in_l1(64, 96, &EIGHT_WAYS));
        // D = 128: 64 rows into 8 sets, 8 per set.
        assert!(!panel_stays_in_l1(64, 128, &EIGHT_WAYS));
        // Fewer rows at that stride fit (4 per set).
        assert!(panel_stays_in_l1(32, 128, &EIGHT_WAYS));
        // D = 80: an odd number of lines apart, so every set.
        assert!(panel_stays_in_l1(64, 80, &EIGHT_WAYS));
        // A stride that is not a whole number of lines spreads.
        assert!(panel_stays_in_l1(64, 72, &EIGHT_WAYS));
        // Past the slab cap, always packed.
        assert!(!panel_stays_in_l1(64, 129, &EIGHT_WAYS));
        assert!(!panel_stays_in_l1(256, 80, &EIGHT_WAYS));
    }

    #[test]
    fn a_larger_l1_keeps_more_in_place() {
        // Twelve ways hold six rows per set where eight hold four, and 12 Ki floats.
        assert!(!panel_stays_in_l1(48, 128, &EIGHT_WAYS));
        assert!(panel_stays_in_l1(48, 128, &TWELVE_WAYS));
        assert!(!panel_stays_in_l1(64, 128, &TWELVE_WAYS));
        assert!(panel_stays_in_l1(64, 129, &TWELVE_WAYS));
        assert!(!panel_stays_in_l1(96, 129, &TWELVE_WAYS));
        assert!(!strip_stays_in_l1(12, 256, 768, &EIGHT_WAYS));
        assert!(strip_stays_in_l1(12, 256, 768, &TWELVE_WAYS));
        assert!(!strip_stays_in_l1(12, 256, 3072, &TWELVE_WAYS));
    }
}
