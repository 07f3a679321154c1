//! The 16-bit A x f32 B GEMMs (`gemm_f16_f32`, `gemm_bf16_f32`) on every ISA this machine
//! has, forced one by one, against an f64 product of the widened inputs: B by rows, by
//! columns and in panels (widths the blocked driver reads, and one it leaves to plain loops),
//! few rows and many, padded leading dimensions whose padding is neither read nor written.

use crate::common;

use half::{bf16, f16};
use rand::{RngExt, SeedableRng, rngs::StdRng};
use uopc_tile::{
    GemmShape, Isa, PanelPacking, TileError, gemm_bf16_f32, gemm_f16_f32, pack_panels, pack_panels_bf16,
    pack_panels_f16, panel_width, uopc_tile_gemm_bf16_f32, uopc_tile_gemm_f16_f32,
};

/// Marks C's padding, which no GEMM may write.
const SENTINEL: f32 = 12345.5;

/// One 16-bit element type of A, with its checked GEMM.
trait HalfA: Copy {
    const NAN: Self;
    fn narrow(x: f32) -> Self;
    fn wide(self) -> f64;
    fn gemm(isa: Isa, s: &GemmShape, a: &[Self], b: &[f32], c: &mut [f32]) -> Result<(), TileError>;
}

impl HalfA for f16 {
    const NAN: f16 = f16::NAN;
    fn narrow(x: f32) -> f16 {
        f16::from_f32(x)
    }
    fn wide(self) -> f64 {
        self.to_f64()
    }
    fn gemm(isa: Isa, s: &GemmShape, a: &[f16], b: &[f32], c: &mut [f32]) -> Result<(), TileError> {
        gemm_f16_f32(isa, s, a, b, c)
    }
}

impl HalfA for bf16 {
    const NAN: bf16 = bf16::NAN;
    fn narrow(x: f32) -> bf16 {
        bf16::from_f32(x)
    }
    fn wide(self) -> f64 {
        self.to_f64()
    }
    fn gemm(isa: Isa, s: &GemmShape, a: &[bf16], b: &[f32], c: &mut [f32]) -> Result<(), TileError> {
        gemm_bf16_f32(isa, s, a, b, c)
    }
}

/// `s`'s product on random operands: A of type `H` (NaN padding), B given as `b` with the
/// value of its logical element `(p, j)` from `b_at`, C with a sentinel in its padding.
fn check<H: HalfA>(rng: &mut StdRng, isa: Isa, s: &GemmShape, b: &[f32], b_at: &dyn Fn(usize, usize) -> f64) {
    let GemmShape { m, n, k, .. } = *s;
    let [na, _, nc] = s.extents().expect("valid shape");
    let mut a = vec![H::NAN; na];
    let (ar, ac) = s.a_dims();
    for r in 0..ar {
        for x in &mut a[r * s.lda..r * s.lda + ac] {
            *x = H::narrow(rng.random_range(-1.0f32..1.0));
        }
    }
    let a_at = |i: usize, p: usize| if s.a_trans { a[p * s.lda + i] } else { a[i * s.lda + p] }.wide();
    let mut c = vec![SENTINEL; nc];
    for i in 0..m {
        for x in &mut c[i * s.ldc..i * s.ldc + n] {
            *x = if s.accumulate { rng.random_range(-1.0f32..1.0) } else { f32::NAN };
        }
    }
    let c0 = c.clone();
    H::gemm(isa, s, &a, b, &mut c).expect("valid operands");
    for (at, &got) in c.iter().enumerate() {
        let (i, j) = (at / s.ldc, at % s.ldc);
        if i >= m || j >= n {
            assert_eq!(got.to_bits(), SENTINEL.to_bits(), "{isa} {s:?}: padding at {at} written");
            continue;
        }
        let (mut want, mut magnitude) =
            if s.accumulate { (f64::from(c0[at]), f64::from(c0[at]).abs()) } else { (0.0, 0.0) };
        for p in 0..k {
            want += a_at(i, p) * b_at(p, j);
            magnitude += (a_at(i, p) * b_at(p, j)).abs();
        }
        // A 16-bit value times an f32 rounds once in f32 (2^-24 of the product), and the k + 1
        // sums round within 2^-24 of the running magnitude each.
        let tol = (k as f64 + 2.0) * f64::from(f32::EPSILON) * magnitude + 1e-30;
        assert!((f64::from(got) - want).abs() <= tol, "{isa} {s:?}: C[{i},{j}] = {got}, want {want}");
    }
}

/// Every layout of A and B stored by rows or columns, padded, with and without accumulation.
fn plain_b<H: HalfA>(rng: &mut StdRng, isa: Isa, (m, n, k): (usize, usize, usize)) {
    for layout in 0..8 {
        let (a_trans, b_trans, accumulate) = (layout & 1 != 0, layout & 2 != 0, layout & 4 != 0);
        let mut s = GemmShape::dense(m, n, k, a_trans, b_trans, accumulate);
        s.lda += 3;
        s.ldb += 1 + layout % 2;
        s.ldc += 2;
        let [_, nb, _] = s.extents().expect("valid shape");
        let b: Vec<f32> = (0..nb).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let b_at = |p: usize, j: usize| f64::from(if b_trans { b[j * s.ldb + p] } else { b[p * s.ldb + j] });
        check::<H>(rng, isa, &s, &b, &b_at);
    }
}

/// B packed into panels of `width` columns (from a row-major source), A either way round.
fn panel_b<H: HalfA>(rng: &mut StdRng, isa: Isa, (m, n, k): (usize, usize, usize), width: usize) {
    let src: Vec<f32> = (0..k * n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let p = PanelPacking { k, n, trans: false, ld: n, width, panel_stride: k * width + 3 };
    let [_, len] = p.extents().expect("valid packing");
    let mut panels = vec![f32::NAN; len];
    pack_panels(isa, &p, &src, &mut panels).expect("valid packing");
    let b_at = |q: usize, j: usize| f64::from(src[q * n + j]);
    for (a_trans, accumulate) in [(false, false), (true, true)] {
        let lda = if a_trans { m } else { k } + 1;
        let s = GemmShape { a_trans, ldc: n + 1, ..p.gemm(m, lda, accumulate) };
        check::<H>(rng, isa, &s, &panels, &b_at);
    }
}

#[test]
fn half_a_f32_b_against_f64_on_every_available_isa() {
    let mut rng = StdRng::seed_from_u64(43);
    // Few rows (a widened copy), many (the blocked driver; several k slabs, ragged tiles).
    let sizes = [(1, 37, 19), (8, 64, 130), (9, 3, 1), (13, 33, 70), (40, 100, 600), (130, 257, 64)];
    for isa in common::isas() {
        let native = panel_width(isa);
        for &size in &sizes {
            plain_b::<f16>(&mut rng, isa, size);
            plain_b::<bf16>(&mut rng, isa, size);
            for width in [native, 2 * native, 5] {
                panel_b::<f16>(&mut rng, isa, size, width);
                panel_b::<bf16>(&mut rng, isa, size, width);
            }
        }
        println!(
            "ran: f16 x f32 and bf16 x f32 GEMMs on {isa}, {} shapes, B plain and in panels",
            sizes.len()
        );
    }
}

#[test]
fn the_flat_entries_refuse_bad_descriptors_and_run_good_ones() {
    let a = [f16::from_f32(2.0); 6]; // 2 x 3
    let ab = [bf16::from_f32(2.0); 6];
    let b = [0.5f32; 12]; // 3 x 4
    let mut c = [f32::NAN; 8];
    // SAFETY: the operands hold the extents of a 2 x 4 x 3 product; the bad calls are refused
    // before any memory is touched.
    unsafe {
        let (pa, pb, pc) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        assert_eq!(uopc_tile_gemm_f16_f32(pa, pb, pc, -1, 4, 3, 3, 4, 4, 0), -1, "negative m");
        assert_eq!(uopc_tile_gemm_f16_f32(pa, pb, pc, 2, 4, 3, 2, 4, 4, 0), -1, "lda < k");
        assert_eq!(uopc_tile_gemm_f16_f32(std::ptr::null(), pb, pc, 2, 4, 3, 3, 4, 4, 0), -1, "null a");
        assert_eq!(uopc_tile_gemm_f16_f32(pa, pb, pc, 2, 4, 3, 3, 4, 4, 16), -1, "unknown flag bits");
        assert!(c.iter().all(|x| x.is_nan()), "a refused call wrote C");
        assert_eq!(uopc_tile_gemm_f16_f32(pa, pb, pc, 2, 4, 3, 3, 4, 4, 0), 0);
        assert_eq!(c, [3.0; 8]);
        assert_eq!(uopc_tile_gemm_bf16_f32(ab.as_ptr(), pb, pc, 2, 4, 3, 3, 4, 4, 4), 0, "accumulate");
        assert_eq!(c, [6.0; 8]);
    }
}

#[test]
fn sixteen_bit_panels_are_the_f32_panels_of_the_widened_values() {
    // Every ISA, the vector packers' width and one left to plain loops, either orientation:
    // the 16-bit packings equal the f32 packing of the widened source bit for bit, the gaps
    // between panels untouched.
    let mut rng = StdRng::seed_from_u64(47);
    for isa in common::isas() {
        for width in [panel_width(isa), 5] {
            for (k, n, trans) in [(13, 70, false), (40, 33, true), (1, 1, true), (9, 64, false)] {
                let ld = if trans { k } else { n } + 2;
                let len = if trans { n * ld } else { k * ld };
                let src: Vec<f32> = (0..len).map(|_| rng.random_range(-2.0f32..2.0)).collect();
                let h: Vec<f16> = src.iter().map(|&x| f16::from_f32(x)).collect();
                let b: Vec<bf16> = src.iter().map(|&x| bf16::from_f32(x)).collect();
                let p = PanelPacking { k, n, trans, ld, width, panel_stride: k * width + 3 };
                let [_, nd] = p.extents().unwrap();
                let packed = |f: &dyn Fn(&mut [f32])| {
                    let mut dst = vec![SENTINEL; nd];
                    f(&mut dst);
                    dst.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                };
                let wide_h: Vec<f32> = h.iter().map(|x| x.to_f32()).collect();
                let wide_b: Vec<f32> = b.iter().map(|x| x.to_f32()).collect();
                assert_eq!(
                    packed(&|d| pack_panels_f16(isa, &p, &h, d).unwrap()),
                    packed(&|d| pack_panels(isa, &p, &wide_h, d).unwrap()),
                    "{isa} f16 {p:?}"
                );
                assert_eq!(
                    packed(&|d| pack_panels_bf16(isa, &p, &b, d).unwrap()),
                    packed(&|d| pack_panels(isa, &p, &wide_b, d).unwrap()),
                    "{isa} bf16 {p:?}"
                );
            }
        }
        println!("ran: 16-bit panel packing on {isa}");
    }
}
