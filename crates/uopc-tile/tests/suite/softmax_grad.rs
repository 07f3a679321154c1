//! The backward tile steps (`softmax_recompute`, `softmax_grad`) on every available ISA
//! against scalar f64 references, with masked (`-inf`) entries, rows that saw no key, NaN and
//! infinite inputs, padded rows whose padding must survive, and the flat ABI's refusals.

use crate::common;

use rand::{RngExt, SeedableRng, rngs::StdRng};
use uopc_tile::{
    EXP2_MAX_REL_ERROR, Isa, ScoreTileShape, TileError, softmax_grad, softmax_recompute,
    uopc_tile_softmax_grad_f32, uopc_tile_softmax_recompute_f32,
};

const NEG_INF: f32 = f32::NEG_INFINITY;
const SENTINEL: f32 = -777.25;

/// The recompute in f64: 0 for a row with `lse = -inf`, else `2^(s - lse)`.
fn recompute_ref(s: f32, lse: f32) -> f64 {
    if lse == NEG_INF { 0.0 } else { (f64::from(s) - f64::from(lse)).exp2() }
}

/// The gradient in f64: 0 where `p == 0`, else `p (dp - delta)`.
fn grad_ref(p: f32, dp: f32, delta: f32) -> f64 {
    if p == 0.0 { 0.0 } else { f64::from(p) * (f64::from(dp) - f64::from(delta)) }
}

/// Random tile with padding, `-inf` entries, one all-masked row with `lse = -inf`.
fn scores(rng: &mut StdRng, rows: usize, cols: usize) -> (ScoreTileShape, Vec<f32>, Vec<f32>) {
    let sh = ScoreTileShape { rows, cols, ld: cols + rng.random_range(0..4) };
    let mut s = vec![SENTINEL; sh.extent().unwrap()];
    let dead = rng.random_range(0..rows);
    let mut lse = Vec::new();
    for r in 0..rows {
        for j in 0..cols {
            s[r * sh.ld + j] =
                if r == dead || rng.random_bool(0.15) { NEG_INF } else { rng.random_range(-30.0..4.0) };
        }
        lse.push(if r == dead { NEG_INF } else { rng.random_range(0.0f32..8.0) });
    }
    (sh, s, lse)
}

#[test]
fn recompute_matches_the_scalar_reference() {
    let mut rng = StdRng::seed_from_u64(7);
    for isa in common::isas() {
        for (rows, cols) in [(1, 1), (3, 15), (4, 16), (5, 17), (8, 33), (2, 64), (7, 100)] {
            let (sh, s0, lse) = scores(&mut rng, rows, cols);
            let mut s = s0.clone();
            softmax_recompute(isa, &sh, &mut s, &lse).unwrap();
            for r in 0..rows {
                for j in 0..sh.ld.min(sh.extent().unwrap() - r * sh.ld) {
                    let (got, x) = (s[r * sh.ld + j], s0[r * sh.ld + j]);
                    if j >= cols {
                        assert_eq!(got, SENTINEL, "{isa} padding ({r}, {j}) was written");
                        continue;
                    }
                    let want = recompute_ref(x, lse[r]);
                    if want == 0.0 || x == NEG_INF {
                        assert_eq!(got, 0.0, "{isa} ({r}, {j}): masked or dead entries are exactly 0");
                    } else {
                        let rel = (f64::from(got) - want).abs() / want;
                        // exp2's own bound, plus one rounding of `s - lse` (|s - lse| <= 38,
                        // its rounding error at most 2^-19, times ln 2 relative in 2^x).
                        assert!(rel <= EXP2_MAX_REL_ERROR + 2.0e-6, "{isa} ({r}, {j}): {got} vs {want}");
                    }
                }
            }
        }
    }
}

#[test]
fn recompute_propagates_nan_and_infinities() {
    for isa in common::isas() {
        let sh = ScoreTileShape::dense(3, 3);
        let mut s = [f32::NAN, 0.0, f32::INFINITY, 1.0, 2.0, 3.0, 5.0, NEG_INF, f32::NAN];
        let lse = [1.0, f32::NAN, NEG_INF];
        softmax_recompute(isa, &sh, &mut s, &lse).unwrap();
        assert!(s[0].is_nan(), "{isa}: a NaN score gives NaN");
        assert!((s[1] - 0.5).abs() < 1e-6);
        assert_eq!(s[2], f32::INFINITY, "{isa}: +inf score with a finite lse");
        assert!(s[3..6].iter().all(|x| x.is_nan()), "{isa}: a NaN lse gives NaN");
        assert_eq!(&s[6..], &[0.0; 3], "{isa}: lse = -inf rows are 0, NaN scores included");
    }
}

#[test]
fn grad_matches_the_scalar_reference_and_keeps_masked_entries_zero() {
    let mut rng = StdRng::seed_from_u64(11);
    for isa in common::isas() {
        for (rows, cols) in [(1, 1), (3, 15), (4, 16), (5, 17), (8, 33), (7, 100)] {
            let sh = ScoreTileShape { rows, cols, ld: cols + rng.random_range(0..4) };
            let n = sh.extent().unwrap();
            let mut p = vec![SENTINEL; n];
            let mut dp0 = vec![SENTINEL; n];
            for r in 0..rows {
                for j in 0..cols {
                    let masked = rng.random_bool(0.2);
                    p[r * sh.ld + j] = if masked { 0.0 } else { rng.random_range(0.0f32..1.0) };
                    // Masked entries may see a NaN or infinite dP (an inf value row): no leak.
                    dp0[r * sh.ld + j] = match (masked, rng.random_range(0..3)) {
                        (true, 0) => f32::NAN,
                        (true, 1) => f32::INFINITY,
                        _ => rng.random_range(-4.0f32..4.0),
                    };
                }
            }
            let delta: Vec<f32> = (0..rows).map(|_| rng.random_range(-2.0f32..2.0)).collect();
            let mut dp = dp0.clone();
            softmax_grad(isa, &sh, &p, &mut dp, &delta).unwrap();
            for (r, &dl) in delta.iter().enumerate() {
                for j in 0..sh.ld.min(n - r * sh.ld) {
                    let at = r * sh.ld + j;
                    if j >= cols {
                        assert_eq!(dp[at], SENTINEL, "{isa}: padding ({r}, {j}) was written");
                        continue;
                    }
                    if p[at] == 0.0 {
                        assert_eq!(dp[at].to_bits(), 0.0f32.to_bits(), "{isa}: masked entries are +0");
                        continue;
                    }
                    let want = grad_ref(p[at], dp0[at], dl);
                    // One rounding of the difference and one of the product: 2 ulp of the
                    // magnitudes involved.
                    let tol = 2.0
                        * f64::from(f32::EPSILON)
                        * f64::from(p[at])
                        * (f64::from(dp0[at]).abs() + f64::from(dl).abs());
                    assert!(
                        (f64::from(dp[at]) - want).abs() <= tol,
                        "{isa} ({r}, {j}): {} vs {want}",
                        dp[at]
                    );
                }
            }
        }
    }
}

#[test]
fn grad_propagates_nan_where_the_probability_is_live() {
    for isa in common::isas() {
        let sh = ScoreTileShape::dense(2, 2);
        let p = [f32::NAN, 0.5, 0.5, 0.25];
        let mut dp = [1.0, f32::NAN, 1.0, 2.0];
        softmax_grad(isa, &sh, &p, &mut dp, &[0.0, f32::NAN]).unwrap();
        assert!(dp.iter().all(|x| x.is_nan()), "{isa}: {dp:?}");
    }
}

#[test]
fn checked_entries_refuse_short_buffers_and_the_flat_abi_bad_sizes() {
    let sh = ScoreTileShape::dense(2, 3);
    let mut s = [0.0f32; 6];
    assert_eq!(
        softmax_recompute(Isa::Portable, &sh, &mut s, &[0.0]),
        Err(TileError::BufferTooSmall { operand: "lse", needed: 2, len: 1 })
    );
    assert_eq!(
        softmax_grad(Isa::Portable, &sh, &[0.0; 5], &mut s, &[0.0; 2]),
        Err(TileError::BufferTooSmall { operand: "p", needed: 6, len: 5 })
    );
    let bad = ScoreTileShape { rows: 2, cols: 3, ld: 2 };
    assert!(matches!(
        softmax_recompute(Isa::Portable, &bad, &mut s, &[0.0; 2]),
        Err(TileError::LeadingDim { .. })
    ));
    let (lse, delta) = ([0.0f32; 2], [0.0f32; 2]);
    let p = [1.0f32; 6];
    // SAFETY: the refused calls touch no memory; the accepted ones get valid 2 x 3 buffers.
    unsafe {
        assert_eq!(uopc_tile_softmax_recompute_f32(s.as_mut_ptr(), lse.as_ptr(), -1, 3, 3), -1);
        assert_eq!(uopc_tile_softmax_recompute_f32(s.as_mut_ptr(), lse.as_ptr(), 2, 3, 2), -1);
        assert_eq!(uopc_tile_softmax_recompute_f32(std::ptr::null_mut(), lse.as_ptr(), 2, 3, 3), -1);
        assert_eq!(uopc_tile_softmax_grad_f32(p.as_ptr(), s.as_mut_ptr(), std::ptr::null(), 2, 3, 3), -1);
        assert_eq!(uopc_tile_softmax_recompute_f32(s.as_mut_ptr(), lse.as_ptr(), 2, 3, 3), 0);
        assert_eq!(s, [1.0; 6]);
        assert_eq!(uopc_tile_softmax_grad_f32(p.as_ptr(), s.as_mut_ptr(), delta.as_ptr(), 2, 3, 3), 0);
        assert_eq!(s, [1.0; 6]);
    }
}
