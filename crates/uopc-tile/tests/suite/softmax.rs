//! The online-softmax update against an f64 reference, and the accuracy of its `exp2`.

use crate::common;

use rand::{RngExt, SeedableRng, rngs::StdRng};
use uopc_tile::{
    EXP2_MAX_REL_ERROR, Isa, SoftmaxShape, softmax_update, softmax_update_scaled,
    uopc_tile_softmax_update_f32,
};

const NEG_INF: f32 = f32::NEG_INFINITY;

/// Inputs of one update; S and O padding holds a sentinel that must survive.
#[derive(Clone)]
struct State {
    sh: SoftmaxShape,
    /// The factor the update applies to every score.
    scale: f32,
    s: Vec<f32>,
    row_max: Vec<f32>,
    row_sum: Vec<f32>,
    o: Vec<f32>,
}

const SENTINEL: f32 = -777.25;

/// Random scores in `[-40, 8]` with some `-inf` (masked) entries, one all-`-inf` row, a mix of
/// fresh rows (`row_max = -inf`) and rows with history, and padded leading dimensions.
fn make_state(rng: &mut StdRng, rows: usize, cols: usize, d: usize) -> State {
    let sh =
        SoftmaxShape { rows, cols, lds: cols + rng.random_range(0..4), ldo: d + rng.random_range(0..4), d };
    let [ns, no] = sh.extents().expect("valid shape");
    let mut s = vec![SENTINEL; ns];
    let mut o = vec![SENTINEL; no];
    let dead_row = rng.random_range(0..rows.max(1));
    let mut row_max = Vec::new();
    let mut row_sum = Vec::new();
    for r in 0..rows {
        for j in 0..cols {
            s[r * sh.lds + j] =
                if r == dead_row || rng.random_bool(0.1) { NEG_INF } else { rng.random_range(-40.0f32..8.0) };
        }
        for j in 0..d {
            o[r * sh.ldo + j] = rng.random_range(-2.0f32..2.0);
        }
        // Fresh rows, rows whose old max is above / below the new scores, and the dead row
        // both with and without history.
        match rng.random_range(0..4) {
            0 => {
                row_max.push(NEG_INF);
                row_sum.push(0.0);
            }
            1 => {
                row_max.push(rng.random_range(-60.0f32..-30.0));
                row_sum.push(rng.random_range(0.5f32..20.0));
            }
            _ => {
                row_max.push(rng.random_range(-10.0f32..12.0));
                row_sum.push(rng.random_range(0.5f32..20.0));
            }
        }
        if r == dead_row && rng.random_bool(0.5) {
            row_max[r] = NEG_INF;
            row_sum[r] = 0.0;
        }
    }
    State { sh, scale: 1.0, s, row_max, row_sum, o }
}

/// Relative accuracy allowed for `exp2(s - m)` computed in f32: the kernel's `exp2` error,
/// plus the rounding of the f32 difference `s - m`, which perturbs the exponent by up to
/// `|s - m| * 2^-24` and so the result by `ln 2` times that.
fn exp_tol(x: f64) -> f64 {
    EXP2_MAX_REL_ERROR + std::f64::consts::LN_2 * x.abs() * 2f64.powi(-24) + 1e-9
}

/// Checks `got` (the state after one update of `init`) against f64 arithmetic.
fn check(init: &State, got: &State, what: &str) {
    let State { sh, .. } = *init;
    if sh.cols == 0 {
        // No keys: the update is the identity.
        assert!(init.s == got.s && init.o == got.o, "{what}: S/O changed");
        assert!(init.row_max == got.row_max && init.row_sum == got.row_sum, "{what}: statistics changed");
        return;
    }
    let scale = f64::from(init.scale);
    for r in 0..sh.rows {
        let srow = &init.s[r * sh.lds..r * sh.lds + sh.cols];
        let m_old = f64::from(init.row_max[r]);
        // The maximum is of the scaled scores as f32 products (each exactly rounded).
        let m_new = srow.iter().map(|&x| f64::from(x * init.scale)).fold(m_old, f64::max);
        let gs = &got.s[r * sh.lds..r * sh.lds + sh.cols];
        if m_new == f64::NEG_INFINITY {
            assert!(gs.iter().all(|&p| p == 0.0), "{what}: dead row {r} must give P = 0");
            assert_eq!(got.row_max[r], NEG_INF, "{what}: dead row {r} max");
            assert_eq!(got.row_sum[r], init.row_sum[r], "{what}: dead row {r} sum");
            for j in 0..sh.d {
                assert_eq!(got.o[r * sh.ldo + j], init.o[r * sh.ldo + j], "{what}: dead row {r} O");
            }
            continue;
        }
        assert_eq!(f64::from(got.row_max[r]), m_new, "{what}: row {r} max");
        // `err` bounds the accumulated error of row_sum's terms.
        let (mut sum, mut err) = (0.0f64, 0.0f64);
        for (j, (&x, &p)) in srow.iter().zip(gs).enumerate() {
            let arg = f64::from(x) * scale - m_new;
            if arg == f64::NEG_INFINITY {
                assert_eq!(p, 0.0, "{what}: masked P[{r},{j}]");
                continue;
            }
            let exact = arg.exp2();
            // A kernel may round the product before subtracting the maximum (the portable
            // one does): one more rounding of a value of size |x * scale| in the exponent.
            let tol = exp_tol(arg)
                + if init.scale == 1.0 {
                    0.0
                } else {
                    std::f64::consts::LN_2 * (f64::from(x) * scale).abs() * 2f64.powi(-24)
                };
            sum += exact;
            err += tol * exact;
            // Below 2^-126 the kernel may flush to zero or give a subnormal.
            let ok = (f64::from(p) - exact).abs() <= tol * exact + 2f64.powi(-126);
            assert!(ok, "{what}: P[{r},{j}] = {p}, expected {exact}");
        }
        let alpha = (m_old - m_new).exp2();
        // alpha is exact (1) when the max did not move, 0 for a fresh row.
        let alpha_tol = if alpha == 0.0 { 0.0 } else { exp_tol(m_old - m_new) };
        let old_part = f64::from(init.row_sum[r]) * alpha;
        let exp_sum = old_part + sum;
        // Plus one rounding per addition of the `cols + 1` terms.
        err += alpha_tol * old_part + (sh.cols as f64 + 2.0) * 2f64.powi(-24) * exp_sum;
        let gsum = f64::from(got.row_sum[r]);
        assert!((gsum - exp_sum).abs() <= err + 1e-30, "{what}: row_sum[{r}] = {gsum}, expected {exp_sum}");
        for j in 0..sh.d {
            let o0 = f64::from(init.o[r * sh.ldo + j]);
            let (exact, v) = (o0 * alpha, f64::from(got.o[r * sh.ldo + j]));
            let tol = (alpha_tol + 2f64.powi(-24)) * exact.abs() + 2f64.powi(-126);
            assert!((v - exact).abs() <= tol, "{what}: O[{r},{j}] = {v}, expected {exact}");
        }
    }
    // Padding between and after rows is untouched.
    for (i, (&a, &b)) in init.s.iter().zip(&got.s).enumerate() {
        if i % sh.lds.max(1) >= sh.cols {
            assert_eq!(a, b, "{what}: S padding [{i}]");
        }
    }
    for (i, (&a, &b)) in init.o.iter().zip(&got.o).enumerate() {
        if i % sh.ldo.max(1) >= sh.d {
            assert_eq!(a, b, "{what}: O padding [{i}]");
        }
    }
}

fn run(isa: Isa, init: &State) -> State {
    let mut st = init.clone();
    let sh = st.sh;
    if st.scale == 1.0 {
        softmax_update(isa, &sh, &mut st.s, &mut st.row_max, &mut st.row_sum, &mut st.o)
            .expect("valid state");
    } else {
        softmax_update_scaled(isa, &sh, st.scale, &mut st.s, &mut st.row_max, &mut st.row_sum, &mut st.o)
            .expect("valid state");
    }
    st
}

#[test]
fn scaled_update_matches_reference() {
    // Positive factors (attention's log2(e) / sqrt(D) among them) keep masked scores at -inf;
    // the identity factor must give the unscaled update bit for bit.
    let mut rng = StdRng::seed_from_u64(21);
    let scales = [0.125f32, std::f32::consts::LOG2_E / 80f32.sqrt(), 0.7, 2.5, 1.0];
    for isa in common::isas() {
        for &scale in &scales {
            for _ in 0..12 {
                let (rows, cols, d) =
                    (rng.random_range(1..=10), rng.random_range(1..=70), rng.random_range(0..=40));
                let mut init = make_state(&mut rng, rows, cols, d);
                let plain = run(isa, &init);
                init.scale = scale;
                let got = run(isa, &init);
                check(&init, &got, &format!("{isa} scale={scale} rows={rows} cols={cols} d={d}"));
                if scale == 1.0 {
                    assert!(got.s == plain.s && got.row_sum == plain.row_sum, "{isa}: scale 1 differs");
                }
            }
        }
    }
}

#[test]
fn a_negative_scale_takes_the_maximum_of_the_scaled_scores() {
    for isa in common::isas() {
        // 17 columns: a full 16-lane vector and a tail.
        let sh = SoftmaxShape::dense(1, 17, 1);
        let mut s: Vec<f32> = (0..17).map(|j| j as f32).collect();
        let (mut row_max, mut row_sum, mut o) = ([NEG_INF], [0.0f32], [0.0f32]);
        softmax_update_scaled(isa, &sh, -1.0, &mut s, &mut row_max, &mut row_sum, &mut o).unwrap();
        assert_eq!(row_max, [0.0], "{isa}: the maximum of -x over x in 0..17 is 0");
        assert_eq!(s[0], 1.0, "{isa}");
        assert!((s[16] - 2f32.powi(-16)).abs() <= 1e-7 * 2f32.powi(-16), "{isa}: {}", s[16]);
    }
}

#[test]
fn update_matches_reference() {
    let mut rng = StdRng::seed_from_u64(11);
    let mut shapes: Vec<(usize, usize, usize)> = vec![
        (0, 5, 4),
        (3, 0, 4),
        (3, 5, 0),
        (1, 1, 1),
        (4, 16, 16),
        (5, 17, 15),
        (8, 64, 64),
        (7, 33, 9),
        (64, 256, 64),
    ];
    for _ in 0..40 {
        shapes.push((rng.random_range(1..=12), rng.random_range(0..=70), rng.random_range(0..=70)));
    }
    for isa in common::isas() {
        for &(rows, cols, d) in &shapes {
            let init = make_state(&mut rng, rows, cols, d);
            let got = run(isa, &init);
            check(&init, &got, &format!("{isa} rows={rows} cols={cols} d={d}"));
        }
    }
}

#[test]
fn fully_masked_rows_stay_finite() {
    for isa in common::isas() {
        let sh = SoftmaxShape::dense(2, 19, 5);
        let mut s = vec![NEG_INF; 2 * 19];
        let (mut row_max, mut row_sum, mut o) = (vec![NEG_INF; 2], vec![0.0; 2], vec![0.0; 10]);
        softmax_update(isa, &sh, &mut s, &mut row_max, &mut row_sum, &mut o).unwrap();
        assert!(s.iter().all(|&p| p == 0.0), "{isa}");
        assert_eq!(row_max, [NEG_INF; 2]);
        assert_eq!(row_sum, [0.0; 2]);
        assert!(o.iter().all(|&x| x == 0.0), "{isa}");
        // A later block that does see keys then takes over cleanly (alpha = exp2(-inf) = 0).
        let mut s = vec![0.0f32; 2 * 19];
        o.fill(0.0);
        softmax_update(isa, &sh, &mut s, &mut row_max, &mut row_sum, &mut o).unwrap();
        assert!(s.iter().all(|&p| p == 1.0), "{isa}");
        assert_eq!(row_sum, [19.0; 2], "{isa}");
        assert_eq!(row_max, [0.0; 2], "{isa}");
    }
}

#[test]
fn the_largest_of_huge_scaled_scores_gets_probability_one() {
    // Scores near 1e12 and 1e18 under a scale that rounds their products: the row's largest
    // score must give exactly exp2(0) = 1 (a fused multiply-subtract left the max's rounding
    // error, thousands, in the exponent), and the others, far below it, 0.
    for isa in common::isas() {
        for magnitude in [1e12f32, 1e18] {
            let cols = 37;
            let sh = SoftmaxShape::dense(1, cols, 0);
            let mut s: Vec<f32> = (0..cols).map(|j| magnitude * (1.0 + (j as f32 * 0.37).sin())).collect();
            let top = (0..cols).max_by(|&a, &b| s[a].total_cmp(&s[b])).unwrap();
            let (mut row_max, mut row_sum, mut o) = (vec![NEG_INF], vec![0.0], vec![]);
            let scale = std::f32::consts::LOG2_E / 8.0;
            softmax_update_scaled(isa, &sh, scale, &mut s, &mut row_max, &mut row_sum, &mut o).unwrap();
            assert_eq!(s[top], 1.0, "{isa} at {magnitude}");
            assert_eq!(row_sum, [1.0], "{isa} at {magnitude}");
            assert!(s.iter().enumerate().all(|(j, &p)| j == top || p == 0.0), "{isa} at {magnitude}");
        }
    }
}

#[test]
fn a_nan_score_makes_only_its_row_nan() {
    // Rows of 37 columns (two full 16-lane vectors, a tail); the NaN sits in row 1, in the
    // vector part for one case and in the tail for the other. Row 0 must stay exact.
    for isa in common::isas() {
        for nan_col in [3, 35] {
            let sh = SoftmaxShape::dense(2, 37, 4);
            let mut s: Vec<f32> = (0..2 * 37).map(|i| (i % 7) as f32 * 0.25).collect();
            s[37 + nan_col] = f32::NAN;
            let (mut row_max, mut row_sum, mut o) = (vec![NEG_INF; 2], vec![0.0; 2], vec![1.0; 8]);
            softmax_update(isa, &sh, &mut s, &mut row_max, &mut row_sum, &mut o).unwrap();
            assert!(row_sum[1].is_nan(), "{isa} col {nan_col}: row sum {}", row_sum[1]);
            assert!(s[37 + nan_col].is_nan(), "{isa} col {nan_col}");
            assert!(row_sum[0].is_finite() && s[..37].iter().all(|p| p.is_finite()), "{isa}");
            // exp2 of a NaN argument is NaN in the rescale too: a later block sees m = NaN or
            // P = NaN, never a silently dropped key.
            let mut s2 = vec![0.5f32; 2 * 37];
            softmax_update(isa, &sh, &mut s2, &mut row_max, &mut row_sum, &mut o).unwrap();
            assert!(row_sum[1].is_nan() && row_sum[0].is_finite(), "{isa} col {nan_col}");
        }
    }
}

#[test]
fn a_nan_score_among_masked_ones_still_makes_its_row_nan() {
    // Every other score of the row is -inf (masked keys), so its maximum over the non-NaN
    // scores is -inf: the row must not take the "nothing seen yet" shortcut, which would drop
    // the NaN. Columns: in the first vector, in a later one, in the tail.
    for isa in common::isas() {
        for nan_col in [0, 3, 20, 35] {
            let sh = SoftmaxShape::dense(1, 37, 4);
            let mut s = vec![NEG_INF; 37];
            s[nan_col] = f32::NAN;
            let (mut row_max, mut row_sum, mut o) = ([NEG_INF], [0.0f32], [0.0f32; 4]);
            softmax_update(isa, &sh, &mut s, &mut row_max, &mut row_sum, &mut o).unwrap();
            assert!(row_sum[0].is_nan(), "{isa} col {nan_col}: row sum {}", row_sum[0]);
            assert!(o.iter().all(|x| x.is_nan()), "{isa} col {nan_col}: {o:?}");
            // A later, ordinary block keeps the row NaN.
            let mut s2 = vec![0.5f32; 37];
            softmax_update(isa, &sh, &mut s2, &mut row_max, &mut row_sum, &mut o).unwrap();
            assert!(row_sum[0].is_nan(), "{isa} col {nan_col}: later row sum {}", row_sum[0]);
        }
    }
}

#[test]
fn consecutive_updates_equal_one_softmax() {
    // Two blocks of one row with V = 1: O tracks the running sum of P through the rescaling, so
    // at the end O must equal row_sum, and row_sum the softmax denominator of the whole row.
    let mut rng = StdRng::seed_from_u64(12);
    for isa in common::isas() {
        let scores: Vec<f32> = (0..90).map(|_| rng.random_range(-12.0f32..12.0)).collect();
        let (mut row_max, mut row_sum, mut o) = ([NEG_INF], [0.0f32], [0.0f32]);
        for block in scores.chunks(45) {
            let mut s = block.to_vec();
            let sh = SoftmaxShape::dense(1, s.len(), 1);
            softmax_update(isa, &sh, &mut s, &mut row_max, &mut row_sum, &mut o).unwrap();
            o[0] += s.iter().sum::<f32>();
        }
        let m = scores.iter().copied().fold(NEG_INF, f32::max);
        let z: f64 = scores.iter().map(|&x| f64::from(x - m).exp2()).sum();
        assert_eq!(row_max[0], m, "{isa}");
        assert!((f64::from(row_sum[0]) - z).abs() <= 1e-5 * z, "{isa}: {} vs {z}", row_sum[0]);
        assert!((o[0] - row_sum[0]).abs() <= 1e-5 * row_sum[0], "{isa}: {} vs {}", o[0], row_sum[0]);
    }
}

/// Maximum relative error of `exp2` over `[-126, 0]`, read through the update: with
/// `row_max = 0` and scores `x <= 0`, P is exactly `exp2(x)`.
#[test]
fn exp2_accuracy() {
    let mut rng = StdRng::seed_from_u64(13);
    // An even grid (every 1/4096 over [-126, 0]) plus random points near 0 and 0.5 boundaries.
    let mut xs: Vec<f32> = (0..=126 * 4096).map(|i| -(i as f32) / 4096.0).collect();
    xs.extend((0..100_000).map(|_| rng.random_range(-126.0f32..0.0)));
    xs.extend((0..20_000).map(|_| rng.random_range(-1.0f32..0.0)));
    for isa in common::isas() {
        let mut worst = (0.0f64, 0.0f32);
        for chunk in xs.chunks(1000) {
            let mut s = chunk.to_vec();
            let sh = SoftmaxShape::dense(1, s.len(), 0);
            let (mut row_max, mut row_sum) = ([0.0f32], [0.0f32]);
            softmax_update(isa, &sh, &mut s, &mut row_max, &mut row_sum, &mut []).unwrap();
            for (&x, &p) in chunk.iter().zip(&s) {
                let exact = f64::from(x).exp2();
                let rel = (f64::from(p) - exact).abs() / exact;
                if rel > worst.0 {
                    worst = (rel, x);
                }
            }
        }
        println!("{isa}: exp2 max relative error over [-126, 0] = {:.3e} (at x = {})", worst.0, worst.1);
        assert!(worst.0 <= EXP2_MAX_REL_ERROR, "{isa}: exp2 error {:e} at {}", worst.0, worst.1);
        // Flush to zero below -126.5; at -126.5 itself either 0 or the subnormal 2^-126.5.
        let mut s = vec![-126.51f32, -127.0, -1000.0, NEG_INF, -126.49, -126.5];
        let sh = SoftmaxShape::dense(1, s.len(), 0);
        softmax_update(isa, &sh, &mut s, &mut [0.0], &mut [0.0], &mut []).unwrap();
        assert_eq!(&s[..4], &[0.0; 4], "{isa}");
        assert!(s[4] > 0.0, "{isa}");
        let at_boundary = f64::from(s[5]);
        let exact = (-126.5f64).exp2();
        assert!(at_boundary == 0.0 || (at_boundary - exact).abs() <= exact * 1e-6, "{isa}: {at_boundary:e}");
    }
}

#[test]
fn c_abi_entry() {
    let mut rng = StdRng::seed_from_u64(14);
    let init = make_state(&mut rng, 9, 37, 21);
    let mut st = init.clone();
    let sh = st.sh;
    let i = |x: usize| x as i64;
    // SAFETY: the buffers cover the shape's extents and are distinct.
    let rc = unsafe {
        uopc_tile_softmax_update_f32(
            st.s.as_mut_ptr(),
            st.row_max.as_mut_ptr(),
            st.row_sum.as_mut_ptr(),
            st.o.as_mut_ptr(),
            i(sh.rows),
            i(sh.cols),
            i(sh.lds),
            i(sh.ldo),
            i(sh.d),
            i64::from(1.0f32.to_bits()),
        )
    };
    assert_eq!(rc, 0);
    check(&init, &st, "c abi");
    // SAFETY: rejected before any memory is touched.
    let rc = unsafe {
        uopc_tile_softmax_update_f32(
            st.s.as_mut_ptr(),
            st.row_max.as_mut_ptr(),
            std::ptr::null_mut(),
            st.o.as_mut_ptr(),
            9,
            37,
            37,
            21,
            21,
            i64::from(1.0f32.to_bits()),
        )
    };
    assert_eq!(rc, -1, "null row_sum");
    // SAFETY: rejected before any memory is touched.
    let rc = unsafe {
        uopc_tile_softmax_update_f32(
            st.s.as_mut_ptr(),
            st.row_max.as_mut_ptr(),
            st.row_sum.as_mut_ptr(),
            st.o.as_mut_ptr(),
            9,
            -1,
            37,
            21,
            21,
            i64::from(1.0f32.to_bits()),
        )
    };
    assert_eq!(rc, -1, "negative cols");
}
