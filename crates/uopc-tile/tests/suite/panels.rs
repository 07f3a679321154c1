//! B packed once into panels (`pack_panels`) and read in place by the GEMM, against an f64
//! product of the unpacked operands, on every ISA, for panel widths the fast driver takes and
//! widths it leaves to plain loops.

use crate::common;

use rand::{RngExt, SeedableRng, rngs::StdRng};
use uopc_tile::{
    GEMM_MAX_PANEL_WIDTH, GemmDesc, GemmShape, Isa, PanelPacking, TileError, gemm, gemm_f16, pack_panels,
    panel_width, uopc_tile_gemm_f32,
};

/// Marks what `pack_panels` must not write: the gap between panels.
const SENTINEL: f32 = 12345.5;

/// One packed-B product checked element by element; the tolerance is the GEMM suite's
/// (`(k + 2) * 2u * sum |a b|`, see `gemm.rs`).
#[allow(clippy::too_many_arguments)] // one case's geometry, each a plain size
fn case(rng: &mut StdRng, isa: Isa, m: usize, n: usize, k: usize, width: usize, trans: bool, a_trans: bool) {
    let uni = |rng: &mut StdRng| rng.random_range(-1.0f32..1.0);
    let ld = if trans { k } else { n } + rng.random_range(0..3);
    let src_len = if trans { n * ld } else { k * ld };
    let src: Vec<f32> = (0..src_len).map(|_| uni(rng)).collect();
    let b = |p: usize, j: usize| f64::from(if trans { src[j * ld + p] } else { src[p * ld + j] });
    let gap = rng.random_range(0..5);
    let p = PanelPacking { k, n, trans, ld, width, panel_stride: k * width + gap };
    let [_, nd] = p.extents().expect("valid packing");
    let mut panels = vec![SENTINEL; nd];
    pack_panels(isa, &p, &src, &mut panels).expect("valid packing");
    for (at, &x) in panels.iter().enumerate() {
        let (panel, within) = (at / p.panel_stride, at % p.panel_stride);
        let (row, col) = (within / width, panel * width + within % width);
        let want = if within >= k * width {
            f64::from(SENTINEL)
        } else if col >= n {
            0.0
        } else {
            b(row, col)
        };
        assert_eq!(f64::from(x), want, "{isa} {p:?}: panels[{at}]");
    }
    let lda = if a_trans { m } else { k } + 1;
    let a: Vec<f32> = (0..if a_trans { k * lda } else { m * lda }).map(|_| uni(rng)).collect();
    let a_at = |i: usize, q: usize| f64::from(if a_trans { a[q * lda + i] } else { a[i * lda + q] });
    for accumulate in [false, true] {
        let s = GemmShape { a_trans, lda: if a_trans { m } else { k } + 1, ..p.gemm(m, lda, accumulate) };
        let c0: Vec<f32> = (0..m * n).map(|_| if accumulate { uni(rng) } else { f32::NAN }).collect();
        let mut c = c0.clone();
        gemm(isa, &s, &a, &panels, &mut c).expect("valid shape");
        for i in 0..m {
            for j in 0..n {
                let (mut exact, mut mag) = if accumulate {
                    (f64::from(c0[i * n + j]), f64::from(c0[i * n + j]).abs())
                } else {
                    (0.0, 0.0)
                };
                for q in 0..k {
                    exact += a_at(i, q) * b(q, j);
                    mag += (a_at(i, q) * b(q, j)).abs();
                }
                let tol = (k as f64 + 2.0) * f64::from(f32::EPSILON) * mag + 1e-30;
                let got = f64::from(c[i * n + j]);
                assert!((got - exact).abs() <= tol, "{isa} {s:?}: C[{i},{j}] = {got}, expected {exact}");
            }
        }
    }
}

#[test]
fn packed_b_matches_the_product_for_every_isa_width_and_layout() {
    let mut rng = StdRng::seed_from_u64(18);
    // Ragged panels, a k past the driver's 256-deep slab, single rows and columns.
    let dims = [(1, 1, 1), (7, 33, 5), (13, 64, 64), (6, 16, 300), (20, 47, 129), (1, 100, 17)];
    for isa in common::isas() {
        let native = panel_width(isa);
        // The driver's own width, a multiple of it, and one it leaves to plain loops.
        for width in [native, 2 * native, 5] {
            for &(m, n, k) in &dims {
                for trans in [false, true] {
                    case(&mut rng, isa, m, n, k, width, trans, trans);
                }
            }
        }
    }
}

#[test]
fn bad_panel_layouts_are_refused() {
    let p = PanelPacking { k: 4, n: 20, trans: false, ld: 20, width: 16, panel_stride: 60 };
    let src = vec![0.0; 80];
    assert_eq!(
        pack_panels(Isa::Portable, &p, &src, &mut vec![0.0; 200]),
        Err(TileError::LeadingDim { operand: "dst", ld: 60, cols: 64 })
    );
    let zero = PanelPacking { width: 0, ..p };
    assert!(matches!(pack_panels(Isa::Portable, &zero, &src, &mut []), Err(TileError::InvalidLayout { .. })));
    let ok = PanelPacking { panel_stride: 64, ..p };
    assert_eq!(
        pack_panels(Isa::Portable, &ok, &src, &mut vec![0.0; 127]),
        Err(TileError::BufferTooSmall { operand: "dst", needed: 128, len: 127 })
    );
    // Panels are never transposed, and the 16-bit GEMMs do not read them.
    let transposed = GemmShape { b_trans: true, ..ok.gemm(2, 4, false) };
    assert!(matches!(transposed.extents(), Err(TileError::InvalidLayout { operand: "b", .. })));
    let (a, b, mut c) = (vec![half::f16::ZERO; 8], vec![half::f16::ZERO; 128], vec![0.0; 40]);
    assert!(matches!(
        gemm_f16(Isa::Portable, &ok.gemm(2, 4, false), &a, &b, &mut c),
        Err(TileError::InvalidLayout { .. })
    ));
}

#[test]
fn the_descriptor_carries_the_panel_width() {
    let p = PanelPacking { k: 3, n: 20, trans: true, ld: 3, width: 16, panel_stride: 48 };
    let s = p.gemm(2, 3, true);
    assert_eq!(GemmDesc::from(&s).shape(), Some(s));
    let wide = GemmShape { b_panel_width: GEMM_MAX_PANEL_WIDTH + 1, ..s };
    assert_eq!(GemmDesc::from(&wide).shape(), None);
    // Through the flat entry: the same product as the checked one.
    let mut rng = StdRng::seed_from_u64(3);
    let src: Vec<f32> = (0..60).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let mut panels = vec![0.0; 96];
    pack_panels(Isa::detect(), &p, &src, &mut panels).unwrap();
    let a: Vec<f32> = (0..6).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let (mut c1, mut c2) = (vec![1.0f32; 40], vec![1.0f32; 40]);
    gemm(Isa::detect(), &s, &a, &panels, &mut c1).unwrap();
    let d = GemmDesc::from(&s);
    // SAFETY: the operands cover the extents of the shape the descriptor encodes.
    let status = unsafe {
        uopc_tile_gemm_f32(
            a.as_ptr(),
            panels.as_ptr(),
            c2.as_mut_ptr(),
            d.m,
            d.n,
            d.k,
            d.lda,
            d.ldb,
            d.ldc,
            d.flags,
        )
    };
    assert_eq!((status, c1), (0, c2));
}
