//! `TILE_EXP_ROWS` through the whole stack: the interpreter's semantics against naive f64,
//! the reference expansion bit for bit against the interpreter, the JIT's extern call against
//! the interpreter (to the micro-kernel's exp2 accuracy), on padded rows of both operands with
//! finite, `-inf`, `+inf` and NaN shifts and elements, and the verifier's refusal of an
//! operand that would run past its buffer.

use crate::{expansion_matches, f32s, refused_past_its_buffer};
use uopc_ir::interp::{self, Precision};
use uopc_ir::*;
use uopc_jit::{Arg, BufRef, Program};

const ROWS: usize = 5;
const COLS: usize = 37;
const LDX: usize = 41;
const LDY: usize = 40;
const C: f32 = std::f32::consts::LOG2_E;

fn x_len() -> usize {
    (ROWS - 1) * LDX + COLS
}

fn y_len() -> usize {
    (ROWS - 1) * LDY + COLS
}

/// One call over the rows of buffer 0 with the shifts of buffer 1 into buffer 2.
fn program(y_len: usize) -> UOp {
    let (x, b, y) =
        (buffer(0, DType::F32, x_len()), buffer(1, DType::F32, ROWS), buffer(2, DType::F32, y_len));
    let op = TileOp::ExpRows { rows: ROWS, cols: COLS, ldx: LDX, ldy: LDY, scale: C.to_bits() };
    sink(&[tile(op, &[x.index(0), b.index(0), y.index(0)])])
}

fn logits() -> Vec<f32> {
    let mut x: Vec<f32> = (0..x_len()).map(|k| 9.0 * ((k as f32) * 0.37).sin()).collect();
    x[3] = f32::NEG_INFINITY;
    x[5] = f32::INFINITY;
    x[LDX + 7] = f32::NAN;
    x[4 * LDX + 2] = 300.0;
    x
}

fn shifts() -> Vec<f32> {
    vec![1.5, -2.0, f32::NEG_INFINITY, f32::INFINITY, f32::NAN]
}

fn inputs() -> Vec<HostBuffer> {
    vec![HostBuffer::F32(logits()), HostBuffer::F32(shifts()), HostBuffer::F32(vec![-7.0; y_len()])]
}

#[test]
fn interpreter_expansion_and_jit_agree_with_f64() {
    let program = program(y_len());
    verify(&program).unwrap();
    let mut want = inputs();
    interp::run(&program, &mut want, Precision::Native).unwrap();
    let (x, b) = (logits(), shifts());
    let y = f32s(&want[2]);
    for r in 0..ROWS {
        for j in 0..COLS {
            let e = (f64::from(C) * (f64::from(x[r * LDX + j]) - f64::from(b[r]))).exp2();
            let got = f64::from(y[r * LDY + j]);
            // the interpreter rounds the f64 value once to f32
            let close = (e.is_nan() && got.is_nan()) || got == e || (got - e).abs() <= 6e-8 * e;
            assert!(close, "({r}, {j}): interpreter {got} vs {e}");
        }
        for j in COLS..LDY.min(y_len() - r * LDY) {
            assert_eq!(y[r * LDY + j], -7.0, "the gap of row {r} is not written");
        }
    }
    expansion_matches(&program, inputs(), 2, y, "exp rows");
    let mut out = vec![-7.0f32; y_len()];
    let prg = Program::compile(&program, "exp_rows").unwrap();
    prg.run(&mut [Arg::Read(BufRef::F32(&x)), Arg::Read(BufRef::F32(&b)), Arg::WriteF32(&mut out)]).unwrap();
    for (k, (&got, &want)) in out.iter().zip(y).enumerate() {
        // the micro-kernel's exp2 bound plus the f32 rounding of exponents up to about 25
        let close = got == want || (got.is_nan() && want.is_nan()) || (got - want).abs() <= 4e-6 * want.abs();
        assert!(close, "element {k}: jit {got} vs interpreter {want}");
    }
}

#[test]
fn an_operand_past_its_buffer_is_refused() {
    // one element short: the last row of Y would be written past the end
    refused_past_its_buffer(&program(y_len() - 1));
}
