//! The rounded online-softmax step of 16-bit attention on every ISA this CPU has, against an
//! f64 reference that rounds P to the same 16-bit type, in both forms (P in a 16-bit tile,
//! and P written over the f32 scores), and their C-ABI entries.

use half::{bf16, f16};
use rand::{RngExt, SeedableRng, rngs::StdRng};
use uopc_tile::{
    Isa, RoundedProb, SoftmaxShape, softmax_update_rounded, softmax_update_rounded_in_place,
    uopc_tile_softmax_update_rounded, uopc_tile_softmax_update_rounded_in_place,
};

const NEG_INF: f32 = f32::NEG_INFINITY;
/// Padding of P that must survive (negative, so no rounded probability has it).
const P_SENTINEL: f32 = -0.75;

struct Inputs {
    sh: SoftmaxShape,
    ldp: usize,
    scale: f32,
    s: Vec<f32>,
    row_max: Vec<f32>,
    row_sum: Vec<f32>,
    o: Vec<f32>,
}

/// Unscaled scores in `[-30, 6] / scale` with some `-inf`, one all-`-inf` row, fresh rows and
/// rows with history, padded leading dimensions.
fn inputs(rng: &mut StdRng, rows: usize, cols: usize, d: usize) -> Inputs {
    let sh =
        SoftmaxShape { rows, cols, lds: cols + rng.random_range(0..3), ldo: d + rng.random_range(0..3), d };
    let ldp = cols + rng.random_range(0..3);
    let scale = [0.125f32, 0.18, 1.0, 2.5][rng.random_range(0..4)];
    let [ns, no] = sh.extents().unwrap();
    let (mut s, mut o) = (vec![0.0; ns], vec![0.0; no]);
    let dead = rng.random_range(0..rows);
    let (mut row_max, mut row_sum) = (Vec::new(), Vec::new());
    for r in 0..rows {
        for j in 0..cols {
            s[r * sh.lds + j] = if r == dead || rng.random_bool(0.1) {
                NEG_INF
            } else {
                rng.random_range(-30.0f32..6.0) / scale
            };
        }
        for e in 0..d {
            o[r * sh.ldo + e] = rng.random_range(-2.0f32..2.0);
        }
        if rng.random_bool(0.5) || r == dead {
            row_max.push(NEG_INF);
            row_sum.push(0.0);
        } else {
            row_max.push(rng.random_range(-10.0f32..10.0));
            row_sum.push(rng.random_range(0.5f32..20.0));
        }
    }
    Inputs { sh, ldp, scale, s, row_max, row_sum, o }
}

/// The step in f64 (from the f32 scaled scores) with P rounded to `T` (from the f64 exponential through f32, as the kernels
/// round their f32 exponential): `(P, row_max, row_sum, O)`.
fn reference<T: RoundedProb>(x: &Inputs) -> (Vec<Option<f32>>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let SoftmaxShape { rows, cols, lds, ldo, d } = x.sh;
    let mut p = vec![None; (rows - 1) * x.ldp + cols];
    let (mut m, mut l) = (Vec::new(), Vec::new());
    let mut o: Vec<f64> = x.o.iter().map(|&v| f64::from(v)).collect();
    for r in 0..rows {
        // The scaled score as the kernels form it, an f32 product.
        let scaled: Vec<f64> = (0..cols).map(|j| f64::from(x.scale * x.s[r * lds + j])).collect();
        let m_old = f64::from(x.row_max[r]);
        let m_new = scaled.iter().fold(m_old, |a, &b| a.max(b));
        if m_new == f64::NEG_INFINITY {
            for j in 0..cols {
                p[r * x.ldp + j] = Some(0.0);
            }
            m.push(m_old);
            l.push(f64::from(x.row_sum[r]));
            continue;
        }
        let alpha = (m_old - m_new).exp2();
        let mut sum = 0.0;
        for j in 0..cols {
            let rounded = T::round((scaled[j] - m_new).exp2() as f32).widen();
            p[r * x.ldp + j] = Some(rounded);
            sum += f64::from(rounded);
        }
        m.push(m_new);
        l.push(f64::from(x.row_sum[r]) * alpha + sum);
        for e in 0..d {
            o[r * ldo + e] *= alpha;
        }
    }
    (p, m, l, o)
}

/// Runs one step on `isa` and compares it with the reference: each P within one 16-bit ulp
/// (the kernels' f32 exponential is within 1.2e-7 of exact, which can move a value across a
/// rounding boundary, never further), the sums and O within f32 error, padding untouched.
fn check<T: RoundedProb + std::fmt::Debug>(isa: Isa, x: &Inputs, ulp: f32, to_bits: fn(T) -> u16) {
    let (want_p, want_m, want_l, want_o) = reference::<T>(x);
    let (mut m, mut l, mut o) = (x.row_max.clone(), x.row_sum.clone(), x.o.clone());
    let mut p = vec![T::round(0.0); want_p.len()];
    // A negative value, which no probability is.
    let sentinel = T::round(P_SENTINEL);
    p.iter_mut().for_each(|v| *v = sentinel);
    softmax_update_rounded(isa, &x.sh, x.ldp, x.scale, &x.s, &mut m, &mut l, &mut o, &mut p).unwrap();
    for (i, (got, want)) in p.iter().zip(&want_p).enumerate() {
        match want {
            None => assert_eq!(to_bits(*got), to_bits(sentinel), "{isa}: padding of P at {i} written"),
            Some(w) => {
                let g = got.widen();
                assert!(
                    (g - w).abs() <= ulp * w.abs().max(f32::MIN_POSITIVE),
                    "{isa}: P[{i}] = {g}, want {w}"
                );
            }
        }
    }
    for r in 0..x.sh.rows {
        assert_eq!(f64::from(m[r]), want_m[r], "{isa}: row_max[{r}]");
        let tol = 1e-5 * want_l[r].abs() + 1e-30;
        assert!(
            (f64::from(l[r]) - want_l[r]).abs() <= tol + f64::from(ulp) * want_l[r],
            "{isa}: row_sum[{r}]"
        );
    }
    for (i, (&g, &w)) in o.iter().zip(&want_o).enumerate() {
        assert!((f64::from(g) - w).abs() <= 1e-6 * w.abs() + 1e-30, "{isa}: O[{i}] = {g}, want {w}");
    }
}

/// [`check`] for the in-place form: P at S's positions (stride `lds`), each value within one
/// 16-bit ulp of the reference and exactly a value of `T` (the f32 holds the rounded
/// probability, not the f32 exponential), S's padding between rows untouched; and the same
/// row state as the 16-bit-tile form on the same inputs, bit for bit.
fn check_in_place<T: RoundedProb + std::fmt::Debug>(isa: Isa, x: &Inputs, ulp: f32) {
    let lds = x.sh.lds;
    let strided = Inputs {
        sh: x.sh,
        ldp: lds,
        scale: x.scale,
        s: x.s.clone(),
        row_max: x.row_max.clone(),
        row_sum: x.row_sum.clone(),
        o: x.o.clone(),
    };
    let (want_p, want_m, want_l, want_o) = reference::<T>(&strided);
    let (mut m, mut l, mut o, mut s) = (x.row_max.clone(), x.row_sum.clone(), x.o.clone(), x.s.clone());
    softmax_update_rounded_in_place::<T>(isa, &x.sh, x.scale, &mut s, &mut m, &mut l, &mut o).unwrap();
    for (i, want) in want_p.iter().enumerate() {
        match want {
            None => assert_eq!(s[i].to_bits(), x.s[i].to_bits(), "{isa}: padding of S at {i} written"),
            Some(w) => {
                let g = s[i];
                assert_eq!(T::round(g).widen().to_bits(), g.to_bits(), "{isa}: P[{i}] = {g} is not rounded");
                assert!(
                    (g - w).abs() <= ulp * w.abs().max(f32::MIN_POSITIVE),
                    "{isa}: P[{i}] = {g}, want {w}"
                );
            }
        }
    }
    for r in 0..x.sh.rows {
        assert_eq!(f64::from(m[r]), want_m[r], "{isa}: row_max[{r}]");
        let tol = 1e-5 * want_l[r].abs() + 1e-30;
        assert!(
            (f64::from(l[r]) - want_l[r]).abs() <= tol + f64::from(ulp) * want_l[r],
            "{isa}: row_sum[{r}]"
        );
    }
    for (i, (&g, &w)) in o.iter().zip(&want_o).enumerate() {
        assert!((f64::from(g) - w).abs() <= 1e-6 * w.abs() + 1e-30, "{isa}: O[{i}] = {g}, want {w}");
    }
    // The 16-bit-tile form rounds and sums the same values in the same order.
    let (mut m2, mut l2, mut o2) = (x.row_max.clone(), x.row_sum.clone(), x.o.clone());
    let mut p = vec![T::round(0.0); want_p.len()];
    softmax_update_rounded(isa, &x.sh, lds, x.scale, &x.s, &mut m2, &mut l2, &mut o2, &mut p).unwrap();
    assert_eq!((m2, l2, o2), (m, l, o), "{isa}: state differs from the 16-bit-tile form");
    for (i, want) in want_p.iter().enumerate() {
        if want.is_some() {
            assert_eq!(
                p[i].widen().to_bits(),
                s[i].to_bits(),
                "{isa}: P[{i}] differs from the 16-bit-tile form"
            );
        }
    }
}

fn isas() -> Vec<Isa> {
    let isas: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.available()).collect();
    eprintln!(
        "rounded softmax: testing {isas:?}; skipped (not on this CPU): {:?}",
        Isa::ALL.into_iter().filter(|i| !i.available()).collect::<Vec<_>>()
    );
    isas
}

#[test]
fn bf16_and_f16_on_every_isa_with_tails_dead_rows_and_history() {
    let mut rng = StdRng::seed_from_u64(21);
    for isa in isas() {
        for (rows, cols, d) in [(1, 1, 1), (3, 15, 17), (5, 16, 16), (8, 64, 64), (7, 37, 80), (2, 512, 128)]
        {
            let x = inputs(&mut rng, rows, cols, d);
            check::<bf16>(isa, &x, 1.0 / 128.0, bf16::to_bits);
            check::<f16>(isa, &x, 1.0 / 1024.0, f16::to_bits);
        }
    }
}

#[test]
fn in_place_bf16_and_f16_on_every_isa_with_tails_dead_rows_and_history() {
    let mut rng = StdRng::seed_from_u64(22);
    for isa in isas() {
        for (rows, cols, d) in [(1, 1, 1), (3, 15, 17), (5, 16, 16), (8, 64, 64), (7, 37, 80), (2, 512, 128)]
        {
            let x = inputs(&mut rng, rows, cols, d);
            check_in_place::<bf16>(isa, &x, 1.0 / 128.0);
            check_in_place::<f16>(isa, &x, 1.0 / 1024.0);
        }
    }
}

#[test]
fn the_in_place_c_entry_rounds_over_the_scores_and_checks_its_arguments() {
    let s0 = [1.0f32, f32::NAN, 0.0, 0.5, -0.1, 0.0];
    for is_f16 in [0, 1] {
        let (mut m, mut l, mut o, mut s) = ([NEG_INF; 2], [0.0f32; 2], [1.0f32; 4], s0);
        // SAFETY: every pointer covers its buffer for the shape (2 x 3 tiles, d = 2).
        let ok = unsafe {
            uopc_tile_softmax_update_rounded_in_place(
                s.as_mut_ptr(),
                m.as_mut_ptr(),
                l.as_mut_ptr(),
                o.as_mut_ptr(),
                2,
                3,
                3,
                2,
                2,
                i64::from(1.0f32.to_bits()),
                is_f16,
            )
        };
        assert_eq!(ok, 0);
        assert!(l[0].is_nan() && s[1].is_nan(), "{l:?} {s:?}");
        // Row 1: max 0.5, P = [1, round(2^-0.6), round(2^-0.5)].
        let round = |x: f32| if is_f16 == 1 { f16::from_f32(x).to_f32() } else { bf16::from_f32(x).to_f32() };
        assert_eq!(s[3..], [1.0, round(2f32.powf(-0.6)), round(2f32.powf(-0.5))], "is_f16 = {is_f16}");
        assert_eq!(l[1], s[3] + s[4] + s[5]);
    }
    let (mut m, mut l, mut o, mut s) = ([NEG_INF; 2], [0.0f32; 2], [0.0f32; 4], s0);
    for (lds, is_f16) in [(2, 0), (3, 2), (-1, 0)] {
        // SAFETY: rejected before any access (lds < cols, a bad rounding flag, a negative size).
        let bad = unsafe {
            uopc_tile_softmax_update_rounded_in_place(
                s.as_mut_ptr(),
                m.as_mut_ptr(),
                l.as_mut_ptr(),
                o.as_mut_ptr(),
                2,
                3,
                lds,
                2,
                2,
                0,
                is_f16,
            )
        };
        assert_eq!(bad, -1);
    }
    assert_eq!(s.map(f32::to_bits), s0.map(f32::to_bits), "a rejected call wrote S");
    let short = softmax_update_rounded_in_place::<f16>(
        Isa::Portable,
        &SoftmaxShape::dense(2, 3, 2),
        1.0,
        &mut s[..5],
        &mut m,
        &mut l,
        &mut o,
    );
    assert!(matches!(short, Err(uopc_tile::TileError::BufferTooSmall { operand: "s", .. })), "{short:?}");
}

#[test]
fn a_nan_score_makes_its_row_nan_and_the_c_entry_checks_its_arguments() {
    let sh = SoftmaxShape::dense(2, 3, 2);
    let s = [1.0, f32::NAN, 0.0, 0.5, 0.25, 0.0];
    for isa in isas() {
        let (mut m, mut l, mut o) = ([NEG_INF; 2], [0.0f32; 2], [0.0f32; 4]);
        let mut p = [bf16::ZERO; 6];
        softmax_update_rounded(isa, &sh, 3, 1.0, &s, &mut m, &mut l, &mut o, &mut p).unwrap();
        assert!(l[0].is_nan() && p[1].is_nan(), "{isa}: {l:?} {p:?}");
        assert!(l[1].is_finite() && p[3..].iter().all(|x| x.to_f32() > 0.0), "{isa}");
    }
    let short = softmax_update_rounded(
        Isa::Portable,
        &sh,
        3,
        1.0,
        &s,
        &mut [0.0; 2],
        &mut [0.0; 2],
        &mut [0.0; 4],
        &mut [f16::ZERO; 5],
    );
    assert!(matches!(short, Err(uopc_tile::TileError::BufferTooSmall { operand: "p", .. })), "{short:?}");
    let (mut m, mut l, mut o, mut p) = ([NEG_INF; 2], [0.0f32; 2], [0.0f32; 4], [0u16; 6]);
    // SAFETY: every pointer covers its buffer for the shape (2 x 3 tiles, d = 2).
    let ok = unsafe {
        uopc_tile_softmax_update_rounded(
            s.as_ptr(),
            m.as_mut_ptr(),
            l.as_mut_ptr(),
            o.as_mut_ptr(),
            p.as_mut_ptr(),
            2,
            3,
            3,
            2,
            2,
            3,
            i64::from(1.0f32.to_bits()),
            1,
        )
    };
    assert_eq!(ok, 0);
    assert_eq!(f16::from_bits(p[3]).to_f32(), f16::from_f32(2.0f32.powf(0.5 - 0.5)).to_f32());
    // SAFETY: rejected before any access (ldp < cols).
    let bad = unsafe {
        uopc_tile_softmax_update_rounded(
            s.as_ptr(),
            m.as_mut_ptr(),
            l.as_mut_ptr(),
            o.as_mut_ptr(),
            p.as_mut_ptr(),
            2,
            3,
            3,
            2,
            2,
            2,
            0,
            0,
        )
    };
    assert_eq!(bad, -1);
}
