//! `TILE_ACTIVATION` through the whole stack, for each activation: the interpreter's semantics
//! against the function in f64, the reference expansion bit for bit against the interpreter,
//! the JIT's extern call against the interpreter (to the micro-kernel's accuracy), on padded
//! rows with tails, infinities, NaN and values whose exponential underflows; and the
//! verifier's refusal of a block that would run past its buffer.

use crate::{expansion_matches, f32s, refused_past_its_buffer};
use uopc_ir::interp::{self, Precision};
use uopc_ir::*;
use uopc_jit::{Arg, Program};
use uopc_tile::Activation;

const ROWS: usize = 4;
const COLS: usize = 37;
const LD: usize = 41;
const KINDS: [Activation; 3] = Activation::ALL;

fn x_len() -> usize {
    (ROWS - 1) * LD + COLS
}

/// One call over the rows of buffer 0, in place.
fn program(kind: Activation, len: usize) -> UOp {
    let x = buffer(0, DType::F32, len);
    sink(&[tile(TileOp::Activation { rows: ROWS, cols: COLS, ld: LD, kind }, &[x.index(0)])])
}

fn values() -> Vec<f32> {
    let mut x: Vec<f32> =
        (0..x_len()).map(|k| if k % LD < COLS { 7.0 * ((k as f32) * 0.37).sin() } else { -7.0 }).collect();
    x[3] = f32::NEG_INFINITY;
    x[5] = f32::INFINITY;
    x[LD + 7] = f32::NAN;
    x[2 * LD + 2] = -40.0;
    x[3 * LD + 1] = -1e13;
    x
}

/// The normal distribution function at `x`, 0 or 1 past the f32 `erf`'s saturation
/// (`|x| / sqrt 2 > 4`), as exact GELU's kernels take it.
fn normal_cdf(x: f64) -> f64 {
    let s = x * std::f64::consts::FRAC_1_SQRT_2;
    if s.abs() > 4.0 { f64::from(u8::from(s > 0.0)) } else { 0.5 * libm::erfc(-s) }
}

/// The function in f64 (its own formulas, not the expansion's).
fn reference(kind: Activation, x: f32) -> f64 {
    let x = f64::from(x);
    let z = match kind {
        Activation::GeluTanh => (2.0 / std::f64::consts::PI).sqrt() * 2.0 * (x + 0.044_715 * x * x * x),
        Activation::Gelu => return x * normal_cdf(x),
        Activation::Silu => x,
    };
    x * if z < 0.0 { z.exp() / (1.0 + z.exp()) } else { 1.0 / (1.0 + (-z).exp()) }
}

#[test]
fn interpreter_expansion_and_jit_agree_with_f64() {
    for kind in KINDS {
        let program = program(kind, x_len());
        verify(&program).unwrap();
        let mut want = vec![HostBuffer::F32(values())];
        interp::run(&program, &mut want, Precision::Native).unwrap();
        let y = f32s(&want[0]);
        for (k, (&got, &x)) in y.iter().zip(&values()).enumerate() {
            if k % LD >= COLS {
                assert_eq!(got, -7.0, "{kind:?}: the gap at {k} is written");
                continue;
            }
            let e = reference(kind, x);
            let got = f64::from(got);
            // The interpreter rounds its f64 value once; the constants are the kernels' f32s,
            // a relative 3e-8 from the exact ones, which the tails magnify by |z| < 1e3.
            let close = (e.is_nan() && got.is_nan()) || got == e || (got - e).abs() <= 3e-5 * e.abs();
            assert!(close, "{kind:?} x {x}: interpreter {got} vs {e}");
        }
        expansion_matches(&program, vec![HostBuffer::F32(values())], 0, y, &format!("{kind:?}"));
        let mut out = values();
        let prg = Program::compile(&program, "activation").unwrap();
        prg.run(&mut [Arg::WriteF32(&mut out)]).unwrap();
        for (k, (&got, &want)) in out.iter().zip(y).enumerate() {
            // The micro-kernel's f32 argument and exponential against the rounded f64; a value
            // whose exponential the kernel flushes (below 2^-126.5) is only good to |x| 2^-126.
            let close = got == want
                || (got.is_nan() && want.is_nan())
                || (got - want).abs() <= 2e-5 * want.abs()
                || (got - want).abs() <= values()[k].abs() * 2f32.powi(-126);
            assert!(close, "{kind:?} element {k}: jit {got} vs interpreter {want}");
        }
    }
}

#[test]
fn a_block_past_its_buffer_is_refused() {
    refused_past_its_buffer(&program(Activation::Silu, x_len() - 1));
}

/// `TILE_ACTIVATION_GRAD` over X (buffer 0, stride `LD`) into G (buffer 1, stride `LD + 2`).
fn grad_program(kind: Activation) -> UOp {
    let ldg = LD + 2;
    let (x, g) = (buffer(0, DType::F32, x_len()), buffer(1, DType::F32, (ROWS - 1) * ldg + COLS));
    let op = TileOp::ActivationGrad { rows: ROWS, cols: COLS, ldx: LD, ldg, kind };
    sink(&[tile(op, &[x.index(0), g.index(0)])])
}

/// The derivative in f64 (its own formula: `s + x s (1 - s) z'`, exact GELU's `Phi + x phi`).
fn derivative(kind: Activation, x: f32) -> f64 {
    let x = f64::from(x);
    let c = 2.0 * (2.0 / std::f64::consts::PI).sqrt();
    let (z, dz) = match kind {
        Activation::GeluTanh => (c * (x + 0.044_715 * x * x * x), c * (1.0 + 3.0 * 0.044_715 * x * x)),
        Activation::Gelu => {
            return normal_cdf(x) + x * (-x * x / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt();
        }
        Activation::Silu => (x, 1.0),
    };
    let s = 1.0 / (1.0 + (-z).exp());
    s + x * s * (1.0 - s) * dz
}

#[test]
fn the_gradient_agrees_across_interpreter_expansion_jit_and_f64() {
    let ldg = LD + 2;
    let g_len = (ROWS - 1) * ldg + COLS;
    let seeds: Vec<f32> =
        (0..g_len).map(|k| if k % ldg < COLS { 1.0 + (k % 7) as f32 * 0.5 } else { -7.0 }).collect();
    // Finite inputs only: an infinite x makes the formula's `x s'` NaN, which the tile tests check.
    let xs: Vec<f32> =
        values().iter().map(|&v| if v.is_finite() && v.abs() < 1e6 { v } else { 0.5 }).collect();
    for kind in KINDS {
        let program = grad_program(kind);
        verify(&program).unwrap();
        let inputs = || vec![HostBuffer::F32(xs.clone()), HostBuffer::F32(seeds.clone())];
        let mut want = inputs();
        interp::run(&program, &mut want, Precision::Native).unwrap();
        let g = f32s(&want[1]).to_vec();
        for k in 0..g_len {
            if k % ldg >= COLS {
                assert_eq!(g[k], -7.0, "{kind:?}: the gap at {k} is written");
                continue;
            }
            let (r, j) = (k / ldg, k % ldg);
            let e = f64::from(seeds[k]) * derivative(kind, xs[r * LD + j]);
            // The f32 constants, and GELU' crossing 0 near x = -0.75: relative to the terms.
            let scale = f64::from(seeds[k]) * (1.0 + f64::from(xs[r * LD + j]).abs());
            assert!((f64::from(g[k]) - e).abs() <= 1e-5 * scale, "{kind:?} ({r}, {j}): {} vs {e}", g[k]);
        }
        expansion_matches(&program, inputs(), 1, &g, &format!("{kind:?} gradient"));
        let mut out = seeds.clone();
        let prg = Program::compile(&program, "activation_grad").unwrap();
        prg.run(&mut [Arg::Read(uopc_jit::BufRef::F32(&xs)), Arg::WriteF32(&mut out)]).unwrap();
        for (k, (&got, &want)) in out.iter().zip(&g).enumerate() {
            let scale =
                1.0 + want.abs() + seeds[k].abs() * xs[(k / ldg) * LD + (k % ldg).min(COLS - 1)].abs();
            assert!(
                (got - want).abs() <= 2e-5 * scale,
                "{kind:?} element {k}: jit {got} vs interpreter {want}"
            );
        }
    }
}
