//! The blocked driver of the bf16 GEMM, shared by its three paths (AMX tiles, `vdpbf16ps`,
//! portable Rust): how it sweeps k, B's panels and A's row blocks. Its operands' layout and
//! packing are in `bf16_pack`, where its sums go in `bf16_c_out`.

use crate::GemmShape;
use crate::bf16_c_out::{COut, Strip};
use crate::bf16_pack::{
    APacking, BLOCK, Layout, RowBlockPacker, a_pieces, pack_a_regions, pack_b_group, pack_row_block,
};
use crate::bf16_path::Bf16Path;
use crate::x86::bf16_tiles::{ATiles, BLoads, Extent};

/// How [`drive`] sweeps the product: k in passes of `k_blocks_per_pass` blocks of 32 (each
/// pass sweeps all of C, which holds the f32 sums between passes); within a pass, B's panels in
/// groups of `panels_per_group` (every row block of A meets one group before the next); and
/// within a row block and a group, k in slabs of `k_blocks_per_slab` (each slab passes over the
/// group's blocks, which a strip or C itself keeps between slabs). With `packs_a`, A is packed
/// into tiles once per pass, while the first group runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sweep {
    k_blocks_per_pass: usize,
    k_blocks_per_slab: usize,
    panels_per_group: usize,
    packs_a: bool,
}

/// The fewest panels a group must hold for AMX to pack A: each packed slab is read from L1 by
/// every panel of its group, and narrower groups do not repay the packing and the reloads of
/// C's tiles between slabs.
const AMX_PACKED_MIN_GROUP: usize = 8;

/// The fewest panels (of 32 columns) a product must have for AMX to pack A: the packing reads
/// and writes all of A once, which only a wide product's multiplies hide (a GEMM cut into
/// column tasks packs A once per task).
const AMX_PACKED_MIN_PANELS: usize = 32;

impl Sweep {
    /// The sweep for `path` on this machine, for the product `s`.
    ///
    /// Groups: the group's packed B for one pass (2 KiB per k block and panel) should stay in
    /// half of L2 for every row block after the first, instead of streaming from L3, and the
    /// row block's strip of f32 sums (4 KiB per panel) in an eighth of it.
    ///
    /// Slabs: a row block's A slab (`32 x 32 kb` bf16) meets every panel of the group, so it
    /// should stay in L1 while the panels stream past it. AMX reads operands fast enough that
    /// only one of them may come from L2 (its tile loads stream B with `tileloaddt1`), so its
    /// slab is what half of L1 holds, from A packed into tiles once per pass, when the product
    /// has [`AMX_PACKED_MIN_PANELS`] panels, the groups hold [`AMX_PACKED_MIN_GROUP`] and the
    /// packed copy fits four times L2 (beyond that, writing it and reading it back from memory
    /// for every group costs more than L1 residency saves). Otherwise each block runs over a
    /// pass of up to a quarter of L2 straight from A's rows. `vdpbf16ps` takes long enough per
    /// block that A coming from L2 costs nothing, so its slab and pass span up to 1024 k.
    fn of_machine(path: Bf16Path, s: &GemmShape) -> Sweep {
        let machine = crate::machine::Machine::get();
        let l1 = machine.cache(1).map_or(32 << 10, |c| c.size_bytes);
        let l2 = machine.cache(2).map_or(1 << 20, |c| c.size_bytes);
        let kblocks = s.k.div_ceil(32).max(1);
        let group = |pass: usize| {
            let group_b = l2 / 2 / (pass.min(kblocks) * 2 * BLOCK);
            let group_strip = l2 / 8 / (32 * 32 * 4);
            group_b.min(group_strip).max(1)
        };
        let packs_a = path == Bf16Path::Amx
            && s.n.div_ceil(32) >= AMX_PACKED_MIN_PANELS
            && group(kblocks) >= AMX_PACKED_MIN_GROUP
            && s.m * s.k * 2 <= 4 * l2;
        let (k_blocks_per_pass, k_blocks_per_slab) = match path {
            Bf16Path::Amx if packs_a => (kblocks, (l1 / 2 / (32 * 64)).max(1)),
            Bf16Path::Amx => {
                let pass = (l2 / 4 / (32 * 64)).max(1);
                (pass, pass)
            }
            _ => (32, 32),
        };
        Sweep { k_blocks_per_pass, k_blocks_per_slab, panels_per_group: group(k_blocks_per_pass), packs_a }
    }
}

/// How the AMX block loads a group of `panels` B panels over `kblocks` k blocks: kept in L1
/// when they fit half of it beside A (every row block reads them again), else streamed past A.
fn b_loads(kblocks: usize, panels: usize) -> BLoads {
    let l1 = crate::machine::Machine::get().cache(1).map_or(32 << 10, |c| c.size_bytes);
    if kblocks * panels * 2 * BLOCK <= l1 / 2 { BLoads::Cached } else { BLoads::Streamed }
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

/// The blocked driver shared by all paths.
///
/// # Safety
///
/// The contract of [`gemm_bf16_unchecked`].
pub(crate) unsafe fn drive(path: Bf16Path, s: &GemmShape, a: *const u16, b: *const u16, c: *mut f32) {
    // SAFETY: this function's contract.
    unsafe { drive_swept(path, s, (a, b, COut::F32(c)), Sweep::of_machine(path, s)) }
}

/// The driver writing C as bf16, each block rounded to nearest even from its f32 sums, when C
/// is overwritten, the machine's sweep takes all of k in one pass and the rows are more than
/// the few that stream B: then a row block's sums over a panel group are final in its local
/// strip after the last k slab, and C never holds f32. Returns false, touching nothing,
/// otherwise.
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
    let sweep = Sweep::of_machine(path, s);
    if s.accumulate
        || s.b_panel_width != 0
        || sweep.k_blocks_per_pass < s.k.div_ceil(32)
        || streams_b(path, s)
    {
        return false;
    }
    // SAFETY: this function's contract; the sweep is the machine's.
    unsafe { drive_swept(path, s, (a, b, COut::Bf16(c)), sweep) };
    true
}

/// Whether the driver streams B past a few rows of A (widening it in registers) instead of
/// packing it: a few rows cannot amortize packing B (both vector paths have AVX-512F). A B in
/// pair panels is packed already.
fn streams_b(path: Bf16Path, s: &GemmShape) -> bool {
    #[cfg(target_arch = "x86_64")]
    return path != Bf16Path::Portable && !s.b_pair_panels && crate::x86::half_rows::streams_b(s);
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
    let GemmShape { m, n, k, .. } = *s;
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
    let pass_blocks = sweep.k_blocks_per_pass.min(kblocks);
    let layout = Layout::of(s, sweep.packs_a, (pass_blocks, sweep.panels_per_group));
    let packed = |buf: *mut f32, strip: *mut f32| {
        let bp = buf.cast::<u16>();
        // SAFETY: the buffer holds `layout.total` u16, split as `Layout` says.
        let (ap_rows, ap_k) = unsafe { (bp.add(layout.b), bp.add(layout.b + layout.a_rows)) };
        // SAFETY: the regions are as `pack_a_regions` needs them (see `Layout`), and the
        // operands' extents are this function's contract.
        unsafe { pack_a_regions(path, s, a, (ap_rows, ap_k), layout.a) };
        #[cfg(target_arch = "x86_64")]
        if path == Bf16Path::Amx {
            // SAFETY: the path is available, so tile state is permitted.
            unsafe { crate::x86::amx::configure() };
        }
        let panels = n.div_ceil(32);
        for kp0 in (0..kblocks).step_by(pass_blocks) {
            let pass = (kp0, (kp0 + pass_blocks).min(kblocks));
            for jg in (0..panels).step_by(sweep.panels_per_group) {
                let group = (jg, sweep.panels_per_group.min(panels - jg));
                // B's own pair panels from panel 0 and k block 0, or the group's pass packed
                // here from panel `jg` and k block `kp0`.
                let b_group = if s.b_pair_panels {
                    PackedB { at: b, stride: s.ldb, first: (0, 0) }
                } else {
                    // SAFETY: the B region holds one group's pass (`Layout`); B's extent is
                    // this function's contract.
                    unsafe { pack_b_group(path, s, b, bp, (pass, group)) };
                    PackedB { at: bp, stride: (pass.1 - pass.0) * BLOCK, first: (jg, kp0) }
                };
                let sweep_ops = SweepOps {
                    path,
                    s,
                    a,
                    bp: b_group,
                    ap: (ap_rows, ap_k),
                    strip: (strip, layout.strip_ld),
                };
                for ib in 0..m.div_ceil(32) {
                    // SAFETY: the regions are as `Layout` sizes them; C is this function's.
                    unsafe { sweep_ops.row_block(c, &layout, (pass, group, ib), sweep.k_blocks_per_slab) };
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if path == Bf16Path::Amx {
            // SAFETY: as for `configure`.
            unsafe { crate::x86::amx::release() };
        }
    };
    crate::pack::with_buffer(layout.total.div_ceil(2), |buf| {
        crate::pack::with_strip(32 * layout.strip_ld, |strip| packed(buf, strip))
    });
}

/// Where a row block finds B's packed panels.
#[derive(Clone, Copy)]
struct PackedB {
    /// Panel `first.0`'s k block `first.1`.
    at: *const u16,
    /// u16 between panels.
    stride: usize,
    /// The panel and k block at `at`.
    first: (usize, usize),
}

impl PackedB {
    /// Panel `jp`'s k block `kb` (at or after `first`).
    fn block(&self, jp: usize, kb: usize) -> *const u16 {
        self.at.wrapping_add((jp - self.first.0) * self.stride + (kb - self.first.1) * BLOCK)
    }
}

/// What every row block of [`drive_swept`] reads: the path, the shape, A, the packed B, A's
/// packed regions `(rows, k_tail)` and the strip `(f32s, row stride)`.
struct SweepOps<'a> {
    path: Bf16Path,
    s: &'a GemmShape,
    a: *const u16,
    bp: PackedB,
    ap: (*mut u16, *mut u16),
    strip: (*mut f32, usize),
}

impl SweepOps<'_> {
    /// Runs row block `ib` over the panel group `(first panel, panels)` for the pass's k blocks
    /// `(start, end)`, in slabs of `slab` k blocks, and writes its sums to C. With A packed per
    /// pass, the first group packs each row block (the first one, and every one of a
    /// transposed A, here; the others while the row block before runs) and later groups read
    /// the packed tiles.
    ///
    /// # Safety
    ///
    /// The regions are as `layout` sizes them for the sweep, the operands' extents are those of
    /// [`drive_swept`]'s contract, and the previous row blocks of this pass and group ran.
    unsafe fn row_block(
        &self,
        c: COut,
        layout: &Layout,
        ((kp0, kp1), (jg, gp), ib): ((usize, usize), (usize, usize), usize),
        slab: usize,
    ) {
        let SweepOps { path, s, a, bp, ap: (ap_rows, ap_k), strip } = *self;
        let (kblocks, per_pass) = (s.k.div_ceil(32), layout.a == APacking::PerRowBlock);
        let (i0, j0) = (ib * 32, jg * 32);
        let tiles_of = |ib: usize| ap_rows.wrapping_add(ib * (kp1 - kp0) * BLOCK);
        let mut next = None;
        if per_pass && jg == 0 {
            if ib == 0 || s.a_trans {
                // SAFETY: the region holds every row block's k blocks of the pass (this
                // function's contract).
                unsafe { pack_row_block(path, s, a, tiles_of(ib), (i0, (kp0, kp1 - kp0))) };
            }
            let steps = (kp1 - kp0).div_ceil(slab) * gp;
            next =
                Some(RowBlockPacker::new(path, s, a, tiles_of(ib + 1), (i0 + 32, (kp0, kp1 - kp0)), steps));
        }
        let (rows, cols) = ((s.m - i0).min(32), (s.n - j0).min(gp * 32));
        let load = s.accumulate || kp0 > 0;
        let shared = slab >= kp1 - kp0;
        // SAFETY: the strip holds 32 rows of `strip_ld >= cols` f32; the block lies inside C.
        let out = unsafe { Strip::open(c, strip, ((i0, j0), (rows, cols)), s.ldc, (load, shared)) };
        let loads = b_loads(slab.min(kp1 - kp0), gp);
        let a_base = if per_pass { tiles_of(ib) } else { ap_rows };
        for kb0 in (kp0..kp1).step_by(slab) {
            let kb1 = (kb0 + slab).min(kp1);
            let (pieces, npieces) = a_pieces(s, a, (a_base, ap_k), layout.a, ib, (kp0, kb0, kb1));
            for jp in jg..jg + gp {
                // SAFETY: as for `open`.
                let (cp, cld) = unsafe { out.block(jp * 32 - j0, kb0 == kp0) };
                if let Some(next) = next.as_mut() {
                    // SAFETY: the next row block's tiles lie inside the region (this function's
                    // contract).
                    unsafe { next.step() };
                }
                // C's rows of the block this slab finishes (of the next one when summed in
                // place), which would otherwise miss when written.
                #[cfg(target_arch = "x86_64")]
                if kb1 == kp1 {
                    let in_place = out.summed_in_c(jp * 32 - j0);
                    if !in_place || jp + 1 < jg + gp {
                        let (first, row_bytes) = out.in_c(jp * 32 - j0 + if in_place { 32 } else { 0 });
                        prefetch_rows(first, row_bytes, rows);
                    }
                }
                let mut load_c = load || kb0 > kp0;
                for &(at, kb, nkb) in &pieces[..npieces] {
                    let last_pairs = if kb + nkb == kblocks { layout.k_tail_pairs } else { 16 };
                    let extent = Extent { last_pairs, wide: s.n - jp * 32 > 16 };
                    // SAFETY: the A piece covers 32 readable rows of `nkb` k blocks (whole rows
                    // of A in place, or zero-padded packed tiles); the B panel's k blocks
                    // `kb ..` are packed; the C block is 32 x 32 at stride `cld`.
                    unsafe { block(path, at, (bp.block(jp, kb), loads), (nkb, extent), cp, cld, load_c) };
                    load_c = true;
                }
                if kb1 == kp1 {
                    // SAFETY: as for `open`.
                    unsafe { out.close(path, jp * 32 - j0) };
                }
            }
        }
        if let Some(next) = next.as_mut() {
            // SAFETY: as for `step`.
            unsafe { next.finish() };
        }
    }
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
        let sweep = sweep.unwrap_or_else(|| Sweep::of_machine(path, s));
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
            Sweep { k_blocks_per_pass: 64, k_blocks_per_slab: 1, panels_per_group: 1, packs_a: false },
            Sweep { k_blocks_per_pass: 64, k_blocks_per_slab: 64, panels_per_group: 1, packs_a: false },
            Sweep { k_blocks_per_pass: 1, k_blocks_per_slab: 1, panels_per_group: 1, packs_a: false },
            Sweep { k_blocks_per_pass: 4, k_blocks_per_slab: 2, panels_per_group: 2, packs_a: true },
            Sweep { k_blocks_per_pass: 5, k_blocks_per_slab: 3, panels_per_group: 5, packs_a: true },
            Sweep { k_blocks_per_pass: 64, k_blocks_per_slab: 4, panels_per_group: 3, packs_a: true },
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
