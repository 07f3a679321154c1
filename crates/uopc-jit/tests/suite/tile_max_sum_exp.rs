//! `TILE_MAX_SUM_EXP` through the whole stack: the interpreter's semantics against naive f64
//! loops, the reference expansion bit for bit against the interpreter, the JIT's extern call
//! against the interpreter (to the micro-kernel's exp2 and f32-sum accuracy), on rows fed in
//! two blocks with a late maximum, a `-inf` row, a NaN row and a `+inf` row, and the verifier's
//! refusal of an operand that would run past its buffer.

use crate::{f32s, refused_past_its_buffer};
use uopc_ir::interp::{self, Precision};
use uopc_ir::*;
use uopc_jit::{Arg, BufRef, Program};

const ROWS: usize = 6;
const COLS: usize = 150;
const LD: usize = 153;
const FIRST: usize = 100;
const C: f32 = std::f32::consts::LOG2_E;

/// Two steps over the rows of buffer 0 (columns `[0, FIRST)`, then `[FIRST, COLS)`), the state
/// in buffers 1 (max) and 2 (sum).
fn program(x_len: usize) -> UOp {
    let (x, m, l) = (buffer(0, DType::F32, x_len), buffer(1, DType::F32, ROWS), buffer(2, DType::F32, ROWS));
    let scale = C.to_bits();
    let a = tile(
        TileOp::MaxSumExp { rows: ROWS, cols: FIRST, ld: LD, scale },
        &[x.index(0), m.index(0), l.index(0)],
    );
    let after = std::slice::from_ref(&a);
    let b = tile(
        TileOp::MaxSumExp { rows: ROWS, cols: COLS - FIRST, ld: LD, scale },
        &[x.index(FIRST as i64), m.after(after).index(0), l.after(after).index(0)],
    );
    sink(&[b])
}

fn logits() -> Vec<f32> {
    let n = (ROWS - 1) * LD + COLS;
    let mut x: Vec<f32> =
        (0..n).map(|k| 6.0 * ((k as f32) * 0.37).sin() + if k % LD == 140 { 30.0 } else { 0.0 }).collect();
    for j in 0..COLS {
        x[LD + j] = f32::NEG_INFINITY; // row 1: every element -inf
        x[4 * LD + j] *= 100.0; // row 4: large magnitudes
    }
    x[2 * LD + 120] = f32::NAN; // row 2: a NaN in the second block
    x[3 * LD + 5] = f32::INFINITY; // row 3: +inf in the first block
    x
}

fn inputs() -> Vec<HostBuffer> {
    vec![
        HostBuffer::F32(logits()),
        HostBuffer::F32(vec![f32::NEG_INFINITY; ROWS]),
        HostBuffer::F32(vec![0.0; ROWS]),
    ]
}

#[test]
fn interpreter_expansion_and_jit_agree_with_f64() {
    let program = program((ROWS - 1) * LD + COLS);
    verify(&program).unwrap();
    let mut want = inputs();
    interp::run(&program, &mut want, Precision::Native).unwrap();
    // the interpreter against the row's maximum and shifted sum in f64
    let x = logits();
    for r in 0..ROWS {
        let row: Vec<f64> = x[r * LD..r * LD + COLS].iter().map(|&v| f64::from(v)).collect();
        let (m, l) = (f32s(&want[1])[r], f32s(&want[2])[r]);
        match r {
            1 => assert_eq!((m, l), (f32::NEG_INFINITY, 0.0), "a -inf row keeps the empty state"),
            2 => assert!(m.is_nan() && l.is_nan(), "a NaN makes the row NaN"),
            3 => assert!(m == f32::INFINITY && l.is_nan(), "+inf: the maximum, and exp2(inf - inf)"),
            _ => {
                let wm = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let wl: f64 = row.iter().map(|&v| (f64::from(C) * (v - wm)).exp2()).sum();
                assert_eq!(f64::from(m), wm, "row {r}");
                assert!((f64::from(l) - wl).abs() <= 1e-6 * wl, "row {r}: {l} vs {wl}");
            }
        }
    }
    let mut expanded = inputs();
    interp::run(&expand_tile_ops(&program), &mut expanded, Precision::Native).unwrap();
    for k in [1, 2] {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(f32s(&expanded[k])), bits(f32s(&want[k])), "buffer {k}");
    }
    let (mut m, mut l) = (vec![f32::NEG_INFINITY; ROWS], vec![0.0f32; ROWS]);
    let prg = Program::compile(&program, "max_sum_exp").unwrap();
    prg.run(&mut [Arg::Read(BufRef::F32(&x)), Arg::WriteF32(&mut m), Arg::WriteF32(&mut l)]).unwrap();
    for r in 0..ROWS {
        let (wm, wl) = (f32s(&want[1])[r], f32s(&want[2])[r]);
        assert!(m[r] == wm || (m[r].is_nan() && wm.is_nan()), "row {r}: jit max {} vs {wm}", m[r]);
        // f32 exponentials and an f32 sum of 150 terms against the interpreter's f64 sum
        let close = l[r] == wl || (l[r].is_nan() && wl.is_nan()) || (l[r] - wl).abs() <= 2e-6 * wl.abs();
        assert!(close, "row {r}: jit sum {} vs {wl}", l[r]);
    }
}

#[test]
fn an_operand_past_its_buffer_is_refused() {
    // one element short: the last row of the second block would read past the end
    refused_past_its_buffer(&program((ROWS - 1) * LD + COLS - 1));
}
