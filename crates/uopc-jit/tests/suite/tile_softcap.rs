//! `TILE_SOFTCAP` through the whole stack: the interpreter's semantics against `outer
//! tanh(inner x)` in f64, the reference expansion bit for bit against the interpreter, and the
//! JIT's extern call against the interpreter (to the micro-kernel's accuracy), on padded rows
//! with tails, infinities, NaN and tiny values; and the verifier's refusal of a block that
//! would run past its buffer.

use crate::{expansion_matches, f32s, refused_past_its_buffer};
use uopc_ir::interp::{self, Precision};
use uopc_ir::*;
use uopc_jit::{Arg, Program};

const ROWS: usize = 3;
const COLS: usize = 29;
const LD: usize = 33;

fn x_len() -> usize {
    (ROWS - 1) * LD + COLS
}

/// One call over the rows of buffer 0, in place.
fn program(inner: f32, outer: f32, len: usize) -> UOp {
    let x = buffer(0, DType::F32, len);
    let op =
        TileOp::Softcap { rows: ROWS, cols: COLS, ld: LD, inner: inner.to_bits(), outer: outer.to_bits() };
    sink(&[tile(op, &[x.index(0)])])
}

fn values() -> Vec<f32> {
    let mut x: Vec<f32> =
        (0..x_len()).map(|k| if k % LD < COLS { 90.0 * ((k as f32) * 0.37).sin() } else { -7.0 }).collect();
    x[3] = f32::NEG_INFINITY;
    x[5] = f32::INFINITY;
    x[LD + 7] = f32::NAN;
    x[2 * LD + 2] = 1e-9;
    x[2 * LD + 3] = -0.0;
    x
}

#[test]
fn interpreter_expansion_and_jit_agree_with_f64() {
    for (inner, outer) in [(1.0f32 / 30.0, 30.0f32), (0.04, -12.5)] {
        let program = program(inner, outer, x_len());
        verify(&program).unwrap();
        let mut want = vec![HostBuffer::F32(values())];
        interp::run(&program, &mut want, Precision::Native).unwrap();
        let y = f32s(&want[0]);
        // The exponent's factor is the kernels' f32 `2 log2 e`, a relative 3e-8 from the exact
        // one: the tanh moves by at most that times `2 |y| sech^2 y <= 1`, then times `outer`.
        let bound = f64::from(outer.abs()) * 4e-8;
        for (k, (&got, &x)) in y.iter().zip(&values()).enumerate() {
            if k % LD >= COLS {
                assert_eq!(got, -7.0, "the gap at {k} is written");
                continue;
            }
            let e = f64::from(outer) * (f64::from(inner) * f64::from(x)).tanh();
            let got = f64::from(got);
            let close = (e.is_nan() && got.is_nan()) || (got - e).abs() <= bound + e.abs() * 2f64.powi(-24);
            assert!(close, "x {x}: interpreter {got} vs {e}");
        }
        expansion_matches(&program, vec![HostBuffer::F32(values())], 0, y, "softcap");
        let mut out = values();
        let prg = Program::compile(&program, "softcap").unwrap();
        prg.run(&mut [Arg::WriteF32(&mut out)]).unwrap();
        for (k, (&got, &want)) in out.iter().zip(y).enumerate() {
            let close = (got.is_nan() && want.is_nan())
                || f64::from((got - want).abs())
                    <= f64::from(outer.abs()) * uopc_tile::SOFTCAP_MAX_ABS_ERROR
                        + f64::from(want.abs()) * 2f64.powi(-23);
            assert!(close, "element {k}: jit {got} vs interpreter {want}");
        }
    }
}

#[test]
fn a_block_past_its_buffer_is_refused() {
    refused_past_its_buffer(&program(1.0, 1.0, x_len() - 1));
}
