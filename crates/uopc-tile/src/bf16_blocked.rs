//! The blocked driver of the bf16 GEMM, shared by its three paths (AMX tiles, `vdpbf16ps`,
//! portable Rust), and the pair layout it packs into: see [`crate::bf16_gemm`] for the layout.

use crate::GemmShape;
use crate::bf16_c_out::COut;
use crate::bf16_path::Bf16Path;
use crate::x86::bf16_tiles::{ATiles, BLoads, Extent};

/// How [`drive`] sweeps the product: k in slabs of `k_blocks_per_slab` blocks of 32 (each slab
/// passes over all of C once, loading and storing every block) and B's panels in groups of
/// `panels_per_group` (the row blocks sweep one group at a time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sweep {
    k_blocks_per_slab: usize,
    panels_per_group: usize,
}

impl Sweep {
    /// The sweep for `path` on this machine, for a product `kblocks` deep.
    ///
    /// Slabs: a row block's A slab (`32 x 32 kb` bf16) meets every B panel, so it should stay
    /// close, while longer slabs cost less C traffic. `vdpbf16ps` takes long enough per block
    /// that A coming from L2 costs nothing, so its slab spans up to 1024 k: a 1024-deep GEMM
    /// then reads C once. AMX streams B past A with `tileloaddt1` (B does not displace A from
    /// L1), and reloading C's four accumulator tiles costs more than reading A from L2, so its
    /// slab is as long as a quarter of L2 holds.
    ///
    /// Groups: the group's packed slab (2 KiB per k block and panel) should stay in half of L2
    /// for every row block after the first, instead of streaming from L3.
    fn of_machine(path: Bf16Path, kblocks: usize) -> Sweep {
        let l2 = crate::machine::Machine::get().cache(2).map_or(1 << 20, |c| c.size_bytes);
        let k_blocks_per_slab = match path {
            Bf16Path::Amx => (l2 / 4 / (32 * 64)).max(16),
            _ => 32,
        };
        let slab = k_blocks_per_slab.min(kblocks).max(1);
        Sweep { k_blocks_per_slab, panels_per_group: (l2 / 2 / (slab * 2 * BLOCK)).max(1) }
    }
}

/// How the AMX block loads a group of `panels` B panels over `kblocks` k blocks: kept in L1
/// when they fit half of it beside A (every row block reads them again), else streamed past A.
fn b_loads(kblocks: usize, panels: usize) -> BLoads {
    let l1 = crate::machine::Machine::get().cache(1).map_or(32 << 10, |c| c.size_bytes);
    if kblocks * panels * 2 * BLOCK <= l1 / 2 { BLoads::Cached } else { BLoads::Streamed }
}

/// u16 in one packed tile pair (a B panel's k block, or a row block's A k block).
const BLOCK: usize = 1024;

impl ATiles {
    /// Row block `blk`, k block `kb` of a packed region holding `kblocks` k blocks per row
    /// block.
    fn packed(base: *const u16, blk: usize, kblocks: usize, kb: usize) -> ATiles {
        ATiles { ptr: base.wrapping_add((blk * kblocks + kb) * BLOCK), stride: 64, hi: 1024, step: 2048 }
    }
}

/// Runs one 32 x 32 block on `path`.
///
/// # Safety
///
/// The contract of `x86::amx::block` (with [`ATiles`] read as there), plus the CPU features of
/// `path` and, for AMX, the tile configuration loaded on this thread.
#[inline]
unsafe fn block(
    path: Bf16Path,
    a: ATiles,
    (b, b_loads): (*const u16, BLoads),
    (ksteps, extent): (usize, Extent),
    c: *mut f32,
    ldc: usize,
    load_c: bool,
) {
    match path {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: forwarded from this function's contract.
        Bf16Path::Amx => unsafe { crate::x86::amx::block(a, (b, b_loads), ksteps, c, ldc, load_c) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: forwarded from this function's contract.
        Bf16Path::Avx512Bf16 => unsafe { crate::x86::bf16::block(a, b, ksteps, extent, c, ldc, load_c) },
        // SAFETY: forwarded from this function's contract.
        _ => unsafe { portable_block(a, b, ksteps, c, ldc, load_c) },
    }
}

/// The portable block kernel: the arithmetic of `tdpbf16ps` in scalar Rust (each f32
/// accumulator gains one pair of products per k pair).
///
/// # Safety
///
/// The memory contract of `x86::amx::block`.
unsafe fn portable_block(a: ATiles, b: *const u16, ksteps: usize, c: *mut f32, ldc: usize, load_c: bool) {
    let widen = |x: u16| f32::from_bits(u32::from(x) << 16);
    for r in 0..32 {
        let row =
            a.ptr.cast::<u8>().wrapping_add(if r < 16 { r * a.stride } else { a.hi + (r - 16) * a.stride });
        let mut acc = [0.0f32; 32];
        // SAFETY: row `r` of C has 32 floats, readable when `load_c`.
        let crow = unsafe { std::slice::from_raw_parts_mut(c.add(r * ldc), 32) };
        if load_c {
            acc.copy_from_slice(crow);
        }
        for s in 0..ksteps {
            // SAFETY: k step `s` of A row `r` is 32 readable u16; of the B panel, 1024.
            let (ar, bs) = unsafe {
                (
                    std::slice::from_raw_parts(row.add(s * a.step).cast::<u16>(), 32),
                    std::slice::from_raw_parts(b.add(s * BLOCK), BLOCK),
                )
            };
            for pair in 0..16 {
                let (a0, a1) = (widen(ar[2 * pair]), widen(ar[2 * pair + 1]));
                for (j, x) in acc.iter_mut().enumerate() {
                    let at = (j / 16) * 512 + pair * 32 + 2 * (j % 16);
                    *x += a0 * widen(bs[at]) + a1 * widen(bs[at + 1]);
                }
            }
        }
        crow.copy_from_slice(&acc);
    }
}

/// Packs B (any layout) into the panel layout of this module with scalar code.
///
/// # Safety
///
/// `dst` is writable for `n.div_ceil(32) * k.div_ceil(32) * 1024` u16; B's extent under `s`
/// is readable.
unsafe fn pack_b_scalar(dst: *mut u16, s: &GemmShape, b: *const u16) {
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
unsafe fn pack_a_block(dst: *mut u16, s: &GemmShape, a: *const u16, i0: usize, kb0: usize, nkb: usize) {
    // SAFETY: the region is writable.
    unsafe { std::ptr::write_bytes(dst, 0, nkb * BLOCK) };
    let rows = s.m.saturating_sub(i0).min(32);
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
                } else {
                    std::ptr::copy_nonoverlapping(a.add(i * s.lda + p0), d, cols);
                }
            }
        }
    }
}

/// Whether A is loaded as tiles straight from its storage (it is `m x k` with k contiguous);
/// otherwise it is copied into tiles first.
fn a_in_place(s: &GemmShape) -> bool {
    !s.a_trans
}

/// The blocked driver shared by all paths.
///
/// # Safety
///
/// The contract of [`gemm_bf16_unchecked`].
pub(crate) unsafe fn drive(path: Bf16Path, s: &GemmShape, a: *const u16, b: *const u16, c: *mut f32) {
    // SAFETY: this function's contract.
    unsafe { drive_swept(path, s, (a, b, COut::F32(c)), Sweep::of_machine(path, s.k.div_ceil(32))) }
}

/// The driver writing C as bf16, each block rounded to nearest even from its f32 sums, when
/// the machine's sweep takes all of k in one slab, C is overwritten and the rows are more than
/// the few that stream B: then every 32 x 32 block's sums are final in a local block right
/// after its k loop, and C never holds f32. Returns false, touching nothing, otherwise.
///
/// # Safety
///
/// The contract of [`gemm_bf16_unchecked`], with C's extent valid for writes of bf16 bits.
pub(crate) unsafe fn drive_rounded(
    path: Bf16Path,
    s: &GemmShape,
    a: *const u16,
    b: *const u16,
    c: *mut u16,
) -> bool {
    let sweep = Sweep::of_machine(path, s.k.div_ceil(32));
    if s.accumulate || sweep.k_blocks_per_slab < s.k.div_ceil(32) || streams_b(path, s) {
        return false;
    }
    // SAFETY: this function's contract; the sweep is the machine's.
    unsafe { drive_swept(path, s, (a, b, COut::Bf16(c)), sweep) };
    true
}

/// Whether the driver streams B past a few rows of A (widening it in registers) instead of
/// packing it: a few rows cannot amortize packing B (both vector paths have AVX-512F).
fn streams_b(path: Bf16Path, s: &GemmShape) -> bool {
    #[cfg(target_arch = "x86_64")]
    return path != Bf16Path::Portable && s.m <= crate::x86::half_rows::HALF_ROWS_MAX && !s.a_trans;
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// [`drive`] with the sweep given.
///
/// # Safety
///
/// The contract of [`gemm_bf16_unchecked`]; `sweep`'s fields are at least 1.
unsafe fn drive_swept(
    path: Bf16Path,
    s: &GemmShape,
    (a, b, c): (*const u16, *const u16, COut),
    sweep: Sweep,
) {
    let GemmShape { m, n, k, ldc, accumulate, .. } = *s;
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // SAFETY: C's extent is valid for writes (this function's contract).
        unsafe { c.empty_sum(s) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if let COut::F32(c) = c
        && streams_b(path, s)
    {
        // SAFETY: AVX-512F comes with either vector path; the shape is in the kernel's range
        // and the pointers are this function's contract.
        unsafe { crate::x86::half_rows::gemm::<false>(s, crate::x86::half_rows::RowsA::Half(a), b, c) };
        return;
    }
    let kblocks = k.div_ceil(32);
    let k_full = k / 32;
    // Pairs of k that the last k step holds: the rest is padding `vdpbf16ps` skips.
    let k_tail_pairs = if k.is_multiple_of(32) { 16 } else { (k % 32).div_ceil(2) };
    let panels = n.div_ceil(32);
    let rblocks = m.div_ceil(32);
    let m_full = m / 32;
    let in_place = a_in_place(s);
    // Packed A: every row block when copied; else the ragged row block (all k blocks) and the
    // ragged k block of every whole row block.
    let (a_tail_rows, a_tail_k) = if in_place {
        (
            if m_full < rblocks { kblocks * BLOCK } else { 0 },
            if k_full < kblocks { m_full * BLOCK } else { 0 },
        )
    } else {
        (rblocks * kblocks * BLOCK, 0)
    };
    let b_len = panels * kblocks * BLOCK;
    let total = b_len + a_tail_rows + a_tail_k;
    crate::pack::with_buffer(total.div_ceil(2), |buf| {
        let bp = buf.cast::<u16>();
        // SAFETY: the buffer holds `total` u16, split into the packed B, the row-tail (or
        // whole) A region and the k-tail region, in that order.
        let (ap_rows, ap_k) = unsafe { (bp.add(b_len), bp.add(b_len + a_tail_rows)) };
        // SAFETY: the regions are as `pack_operands` needs them (see the split above), and the
        // operands' extents are this function's contract.
        unsafe {
            pack_operands(path, s, a, b, bp, (ap_rows, ap_k), (in_place, a_tail_rows > 0, a_tail_k > 0))
        };
        #[cfg(target_arch = "x86_64")]
        if path == Bf16Path::Amx {
            // SAFETY: the path is available, so tile state is permitted.
            unsafe { crate::x86::amx::configure() };
        }
        /// The 32 x 32 C block used when the real one is ragged.
        #[repr(C, align(64))]
        struct CBlock([f32; 1024]);
        let mut cblock = CBlock([0.0; 1024]);
        let Sweep { k_blocks_per_slab: kbs, panels_per_group: group } = sweep;
        for kb0 in (0..kblocks).step_by(kbs) {
            let kb1 = (kb0 + kbs).min(kblocks);
            let load = accumulate || kb0 > 0;
            for jg in (0..panels).step_by(group) {
                let loads = b_loads(kb1 - kb0, group.min(panels - jg));
                for ib in 0..rblocks {
                    let i0 = ib * 32;
                    let (pieces, npieces) = a_pieces(s, a, (ap_rows, ap_k), in_place, ib, (kb0, kb1));
                    for jp in jg..(jg + group).min(panels) {
                        let j0 = jp * 32;
                        let (rows, cols) = ((m - i0).min(32), (n - j0).min(32));
                        // SAFETY: the block lies inside C.
                        let (cp, cld) = unsafe { c.open(&mut cblock.0, (i0, j0), (rows, cols), ldc, load) };
                        #[cfg(target_arch = "x86_64")]
                        if jp + 1 < panels {
                            let (next, row_bytes) = c.at(i0 * ldc + j0 + 32, ldc);
                            prefetch_rows(next, row_bytes, rows);
                        }
                        let mut load_c = load;
                        for &(at, kb, nkb) in &pieces[..npieces] {
                            let last_pairs = if kb + nkb == kblocks { k_tail_pairs } else { 16 };
                            let extent = Extent { last_pairs, wide: cols > 16 };
                            // SAFETY: the A piece covers 32 readable rows of `nkb` k blocks (whole
                            // rows of A in place, or zero-padded packed tiles); the B panel's k
                            // blocks `kb ..` are packed; the C block is 32 x 32 at stride `cld`.
                            unsafe {
                                block(
                                    path,
                                    at,
                                    (bp.add((jp * kblocks + kb) * BLOCK), loads),
                                    (nkb, extent),
                                    cp,
                                    cld,
                                    load_c,
                                )
                            };
                            load_c = true;
                        }
                        // SAFETY: as for `open`, which gave `cp`.
                        unsafe { c.close(path, &cblock.0, (i0, j0), (rows, cols), ldc) };
                    }
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if path == Bf16Path::Amx {
            // SAFETY: as for `configure`.
            unsafe { crate::x86::amx::release() };
        }
    });
}

/// Prefetches the first 128 bytes of `rows` rows of the C block at `first` (rows
/// `row_bytes` apart, a stride no hardware prefetcher follows: when C is larger than the
/// caches every row would otherwise miss at the start of the block).
#[cfg(target_arch = "x86_64")]
fn prefetch_rows(first: *const i8, row_bytes: usize, rows: usize) {
    for r in 0..rows {
        let p = first.wrapping_add(r * row_bytes);
        // SAFETY: prefetching never faults.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p);
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.wrapping_add(64));
        }
    }
}

/// Packs B (all panels) into `bp` and, as [`drive`] lays them out, A's packed regions
/// `(rows, k_tail)`; `(in_place, row_tail, k_tail)` say which A pieces are packed.
///
/// # Safety
///
/// The regions hold what [`drive`] sizes them for, and the operands' extents are valid (the
/// contract of `gemm_bf16_unchecked`).
unsafe fn pack_operands(
    path: Bf16Path,
    s: &GemmShape,
    a: *const u16,
    b: *const u16,
    bp: *mut u16,
    (ap_rows, ap_k): (*mut u16, *mut u16),
    (in_place, row_tail, k_tail): (bool, bool, bool),
) {
    let GemmShape { m, n, k, lda, .. } = *s;
    let kblocks = k.div_ceil(32);
    let (k_full, m_full, rblocks) = (k / 32, m / 32, m.div_ceil(32));
    // SAFETY: the packing routines write inside their regions and read inside the operands'
    // extents (this function's contract).
    unsafe {
        // The portable path packs with portable code too, so forcing it tests code that needs
        // no CPU features at all.
        #[cfg(target_arch = "x86_64")]
        let vector_pack = path != Bf16Path::Portable && std::arch::is_x86_feature_detected!("avx512bw");
        #[cfg(not(target_arch = "x86_64"))]
        let vector_pack = false;
        match (vector_pack, s.b_trans) {
            #[cfg(target_arch = "x86_64")]
            (true, false) => crate::x86::bf16::pack_b_rows(bp, b, s.ldb, k, n),
            #[cfg(target_arch = "x86_64")]
            (true, true) => crate::x86::bf16::pack_b_cols(bp, b, s.ldb, k, n),
            _ => pack_b_scalar(bp, s, b),
        }
        if in_place {
            if row_tail {
                pack_a_block(ap_rows, s, a, m_full * 32, 0, kblocks);
            }
            if k_tail {
                for ib in 0..m_full {
                    pack_a_block(ap_k.add(ib * BLOCK), s, a, ib * 32, k_full, 1);
                }
            }
        } else {
            for ib in 0..rblocks {
                let dst = ap_rows.add(ib * kblocks * BLOCK);
                match vector_pack {
                    #[cfg(target_arch = "x86_64")]
                    true => crate::x86::bf16::pack_a_cols(dst, a, lda, k, m, ib * 32),
                    _ => pack_a_block(dst, s, a, ib * 32, 0, kblocks),
                }
            }
        }
    }
}

/// The A pieces covering k blocks `kb0..kb1` of row block `ib`, as [`drive`] laid A out
/// (packed regions `(rows, k_tail)`): `(tiles, first k block, k blocks)`, and how many there
/// are (one, or two when whole rows read in place end in a packed ragged k block).
fn a_pieces(
    s: &GemmShape,
    a: *const u16,
    (ap_rows, ap_k): (*mut u16, *mut u16),
    in_place: bool,
    ib: usize,
    (kb0, kb1): (usize, usize),
) -> ([(ATiles, usize, usize); 2], usize) {
    let kblocks = s.k.div_ceil(32);
    let (k_full, m_full) = (s.k / 32, s.m / 32);
    let mut pieces = [(ATiles::packed(ap_rows, 0, 0, 0), 0, 0); 2];
    let mut npieces = 0;
    if !in_place {
        pieces[0] = (ATiles::packed(ap_rows, ib, kblocks, kb0), kb0, kb1 - kb0);
        npieces = 1;
    } else if ib == m_full {
        pieces[0] = (ATiles::packed(ap_rows, 0, kblocks, kb0), kb0, kb1 - kb0);
        npieces = 1;
    } else {
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
    (pieces, npieces)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bf16 bits of small multiples of 1/8 in [-1, 1] (exact in bf16), from a seed.
    fn values(len: usize, seed: u64) -> Vec<u16> {
        let mut x = seed;
        (0..len)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let v = ((x >> 33) % 17) as f32 / 8.0 - 1.0;
                (v.to_bits() >> 16) as u16
            })
            .collect()
    }

    /// C by `path` with `sweep` (or the machine's), from C's initial values `c0`.
    fn product(
        path: Bf16Path,
        s: &GemmShape,
        (a, b, c0): (&[u16], &[u16], &[f32]),
        sweep: Option<Sweep>,
    ) -> Vec<f32> {
        let mut c = c0.to_vec();
        let sweep = sweep.unwrap_or_else(|| Sweep::of_machine(path, s.k.div_ceil(32)));
        let [na, nb, nc] = s.extents().expect("valid shape");
        assert!(a.len() >= na && b.len() >= nb && c.len() >= nc);
        // SAFETY: the slices hold the shape's extents (asserted above), the caller runs only
        // paths available here, and the sweep's fields are at least 1.
        unsafe { drive_swept(path, s, (a.as_ptr(), b.as_ptr(), COut::F32(c.as_mut_ptr())), sweep) };
        c
    }

    /// Short slabs and narrow groups reach what the machine's sweep reaches only for products
    /// deeper and wider than a test affords: C reloaded between slabs, several panel groups,
    /// and B's tiles both kept in L1 and streamed. Every sweep must give the machine's result
    /// bit for bit (the f32 accumulators are stored and reloaded exactly between slabs), and
    /// that result must match f64 sums (exact products of multiples of 1/8, at most 300 terms
    /// of magnitude at most 1, so f32 sums are within 300 * 2^-24 * 300 of them).
    #[test]
    fn every_sweep_gives_the_machines_result_and_the_exact_sums() {
        let shapes = [
            GemmShape::dense(70, 150, 300, false, false, false),
            GemmShape::dense(64, 96, 260, false, true, true),
            GemmShape::dense(45, 200, 70, true, false, true),
        ];
        let sweeps = [
            Sweep { k_blocks_per_slab: 1, panels_per_group: 1 },
            Sweep { k_blocks_per_slab: 2, panels_per_group: 2 },
            Sweep { k_blocks_per_slab: 3, panels_per_group: 5 },
        ];
        let paths = [Bf16Path::Amx, Bf16Path::Avx512Bf16, Bf16Path::Portable];
        for path in paths.into_iter().filter(|p| crate::machine::require_or_skip(p.name(), p.available())) {
            for (t, s) in shapes.iter().enumerate() {
                let [na, nb, nc] = s.extents().expect("valid shape");
                let (a, b) = (values(na, 2 * t as u64), values(nb, 2 * t as u64 + 1));
                let c0: Vec<f32> =
                    values(nc, 99).iter().map(|&x| f32::from_bits(u32::from(x) << 16)).collect();
                let machine = product(path, s, (&a, &b, &c0), None);
                for sweep in sweeps {
                    let got = product(path, s, (&a, &b, &c0), Some(sweep));
                    assert!(
                        got.iter().zip(&machine).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{path} {s:?} {sweep:?}"
                    );
                }
                let widen = |x: u16| f64::from(f32::from_bits(u32::from(x) << 16));
                for i in 0..s.m {
                    for j in 0..s.n {
                        let mut sum = if s.accumulate { f64::from(c0[i * s.ldc + j]) } else { 0.0 };
                        for p in 0..s.k {
                            let ai = if s.a_trans { p * s.lda + i } else { i * s.lda + p };
                            let bi = if s.b_trans { j * s.ldb + p } else { p * s.ldb + j };
                            sum += widen(a[ai]) * widen(b[bi]);
                        }
                        let err = (f64::from(machine[i * s.ldc + j]) - sum).abs();
                        assert!(
                            err <= 300.0 * 300.0 * f64::from(f32::EPSILON),
                            "{path} {s:?} ({i}, {j}): {err}"
                        );
                    }
                }
            }
            println!("ran: {path}");
        }
    }
}
