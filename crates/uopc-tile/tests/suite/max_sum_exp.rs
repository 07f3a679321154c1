//! The online logsumexp step (`max_sum_exp`) on every available ISA against an f64 reference:
//! random shapes with chunk and vector tails, padded rows, rows fed in several steps, `-inf`
//! rows, NaN and `+inf` entries, large magnitudes, and the checked and flat entries' refusals.

use crate::common;

use rand::{RngExt, SeedableRng, rngs::StdRng};
use uopc_tile::{Isa, ScoreTileShape, TileError, max_sum_exp, uopc_tile_max_sum_exp_f32};

const NEG_INF: f32 = f32::NEG_INFINITY;
const LOG2_E: f32 = std::f32::consts::LOG2_E;

/// The row's maximum and `sum_j 2^(c (x_j - max))` in f64 (the sum 0 for a row of `-inf`).
fn reference(row: &[f32], c: f32) -> (f64, f64) {
    let m = row.iter().map(|&v| f64::from(v)).fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY {
        return (m, 0.0);
    }
    let c = f64::from(c);
    (m, row.iter().map(|&v| (c * (f64::from(v) - m)).exp2()).sum())
}

/// Feeds the rows of `x` (`rows x cols`, stride `ld`) to the kernel in column blocks of at most
/// `step`, from the empty state.
fn run(
    isa: Isa,
    x: &[f32],
    rows: usize,
    cols: usize,
    ld: usize,
    step: usize,
    c: f32,
) -> (Vec<f32>, Vec<f32>) {
    let (mut m, mut l) = (vec![NEG_INF; rows], vec![0.0f32; rows]);
    let mut j = 0;
    while j < cols {
        let w = step.min(cols - j);
        let sh = ScoreTileShape { rows, cols: w, ld };
        max_sum_exp(isa, &sh, c, &x[j..], &mut m, &mut l).unwrap();
        j += w;
    }
    (m, l)
}

#[test]
fn random_blocks_match_the_f64_reference() {
    let mut rng = StdRng::seed_from_u64(22);
    for isa in common::isas() {
        for &(rows, cols) in
            &[(1, 1), (3, 15), (2, 16), (4, 17), (5, 63), (3, 64), (2, 65), (3, 2047), (2, 2049), (2, 5000)]
        {
            for &c in &[LOG2_E, 1.0, 0.37] {
                let ld = cols + rng.random_range(0..5);
                let scale = if rng.random_bool(0.3) { 300.0 } else { 8.0 };
                let mut x: Vec<f32> =
                    (0..(rows - 1) * ld + cols).map(|_| rng.random_range(-scale..scale)).collect();
                // a -inf or two inside the rows: terms that must be exactly 0
                for _ in 0..2 {
                    let at = rng.random_range(0..x.len());
                    x[at] = NEG_INF;
                }
                let step = [cols, 7, 100, 3000][rng.random_range(0..4)];
                let (m, l) = run(isa, &x, rows, cols, ld, step, c);
                for r in 0..rows {
                    let row = &x[r * ld..r * ld + cols];
                    let (wm, wl) = reference(row, c);
                    assert_eq!(f64::from(m[r]), wm, "{isa} {rows}x{cols} step {step} row {r}: max");
                    // f32 exponentials (1.2e-7 each) and an f32 sum of at most 5000 terms in
                    // lanes and chunks: 2e-5 relative is far above both and below any wrong term
                    // (one missing term of a row of 5000 is 2e-4 of it at the least when all are
                    // alike, and the maximum's own term is at least 1/cols of the sum).
                    let tol = 2e-5 * wl.max(1.0);
                    assert!(
                        (f64::from(l[r]) - wl).abs() <= tol,
                        "{isa} {rows}x{cols} c {c} step {step} row {r}: sum {} vs {wl}",
                        l[r]
                    );
                }
            }
        }
    }
}

#[test]
fn a_late_maximum_rescales_the_sum_seen_before_it() {
    for isa in common::isas() {
        // the row's maximum arrives in the last block: the first blocks' sum must shrink by 2^-40
        let mut x = vec![0.0f32; 4100];
        x[4099] = 40.0;
        let (m, l) = run(isa, &x, 1, 4100, 4100, 2048, 1.0);
        assert_eq!(m[0], 40.0);
        let want = 1.0 + 4099.0 * (-40.0f64).exp2();
        assert!((f64::from(l[0]) - want).abs() < 1e-6, "{isa}: {} vs {want}", l[0]);
    }
}

#[test]
fn special_values_follow_the_documented_semantics() {
    for isa in common::isas() {
        let n = 37;
        let mut x = vec![NEG_INF; 4 * n];
        // row 1: a NaN among finite values; row 2: a +inf among finite values; row 3: finite
        for j in 0..n {
            x[n + j] = j as f32;
            x[2 * n + j] = -(j as f32);
            x[3 * n + j] = 1.0e30 * (j % 3) as f32 - 5.0e29;
        }
        x[n + 20] = f32::NAN;
        x[2 * n + 30] = f32::INFINITY;
        let (m, l) = run(isa, &x, 4, n, n, 16, LOG2_E);
        // row 0, every element -inf: the empty state stays
        assert_eq!((m[0], l[0]), (NEG_INF, 0.0), "{isa}: -inf row");
        assert!(m[1].is_nan() && l[1].is_nan(), "{isa}: a NaN makes the row NaN: {} {}", m[1], l[1]);
        assert_eq!(m[2], f32::INFINITY, "{isa}: +inf is the maximum");
        assert!(l[2].is_nan(), "{isa}: exp2(inf - inf) is NaN");
        // row 3: magnitudes near f32's top; the maximum's terms give exactly 1 each
        let want = reference(&x[3 * n..4 * n], LOG2_E);
        assert_eq!(f64::from(m[3]), want.0);
        assert!((f64::from(l[3]) - want.1).abs() < 1e-5 * want.1, "{isa}: {} vs {}", l[3], want.1);
        // a NaN already in the state stays, whatever follows
        let (mut mm, mut ll) = (vec![f32::NAN], vec![f32::NAN]);
        max_sum_exp(isa, &ScoreTileShape::dense(1, 3), 1.0, &[1.0, 2.0, 3.0], &mut mm, &mut ll).unwrap();
        assert!(mm[0].is_nan() && ll[0].is_nan(), "{isa}: NaN state");
    }
}

#[test]
fn padding_and_other_rows_state_are_left_alone() {
    for isa in common::isas() {
        let sh = ScoreTileShape { rows: 2, cols: 3, ld: 5 };
        // the padding holds a value above every element: reading it would change the maximum
        let x = [1.0, 2.0, 3.0, 99.0, 99.0, 4.0, 5.0, 6.0];
        let (mut m, mut l) = ([NEG_INF, NEG_INF, 7.0], [0.0, 0.0, 7.0]);
        max_sum_exp(isa, &sh, 1.0, &x, &mut m, &mut l).unwrap();
        assert_eq!((m[0], m[1], m[2], l[2]), (3.0, 6.0, 7.0, 7.0), "{isa}");
        // no columns: nothing is touched, not even the state
        let (mut m, mut l) = ([1.0f32], [2.0f32]);
        max_sum_exp(isa, &ScoreTileShape::dense(1, 0), 1.0, &[], &mut m, &mut l).unwrap();
        assert_eq!((m[0], l[0]), (1.0, 2.0));
    }
}

#[test]
fn bad_extents_are_refused_before_touching_memory() {
    let isa = Isa::detect();
    let sh = ScoreTileShape { rows: 2, cols: 4, ld: 4 };
    let (mut m, mut l) = ([0.0f32; 2], [0.0f32; 2]);
    let short = max_sum_exp(isa, &sh, 1.0, &[0.0; 7], &mut m, &mut l);
    assert_eq!(short, Err(TileError::BufferTooSmall { operand: "x", needed: 8, len: 7 }));
    let rows = max_sum_exp(isa, &sh, 1.0, &[0.0; 8], &mut m[..1], &mut l);
    assert_eq!(rows, Err(TileError::BufferTooSmall { operand: "row_max", needed: 2, len: 1 }));
    let sums = max_sum_exp(isa, &sh, 1.0, &[0.0; 8], &mut m, &mut l[..1]);
    assert_eq!(sums, Err(TileError::BufferTooSmall { operand: "row_sum", needed: 2, len: 1 }));
    let ld = max_sum_exp(isa, &ScoreTileShape { rows: 2, cols: 4, ld: 3 }, 1.0, &[0.0; 8], &mut m, &mut l);
    assert_eq!(ld, Err(TileError::LeadingDim { operand: "x", ld: 3, cols: 4 }));
    assert_eq!((m, l), ([0.0; 2], [0.0; 2]), "a refused call writes nothing");
    let x = [0.0f32; 8];
    // SAFETY: each call below is refused by the flat entry's checks before any access.
    unsafe {
        assert_eq!(uopc_tile_max_sum_exp_f32(x.as_ptr(), m.as_mut_ptr(), l.as_mut_ptr(), -1, 4, 4, 0), -1);
        assert_eq!(uopc_tile_max_sum_exp_f32(x.as_ptr(), m.as_mut_ptr(), l.as_mut_ptr(), 2, 4, 3, 0), -1);
        assert_eq!(
            uopc_tile_max_sum_exp_f32(std::ptr::null(), m.as_mut_ptr(), l.as_mut_ptr(), 2, 4, 4, 0),
            -1
        );
        let one = i64::from(1.0f32.to_bits());
        assert_eq!(uopc_tile_max_sum_exp_f32(x.as_ptr(), m.as_mut_ptr(), l.as_mut_ptr(), 2, 4, 4, one), 0);
    }
    assert_eq!((m, l), ([0.0; 2], [4.0; 2]), "the flat entry decodes the scale's bits");
}
