//! `TILE_SCORE_RAMP` through the whole stack: the interpreter's semantics against `scale x +
//! c (origin + j - r)` in f64, the reference expansion bit for bit against the interpreter,
//! and the JIT's extern call against the interpreter (two f32 roundings), on padded rows with
//! tails; and the verifier's refusal of a block that would run past its buffer.

use crate::{expansion_matches, f32s, refused_past_its_buffer};
use uopc_ir::interp::{self, Precision};
use uopc_ir::*;
use uopc_jit::{Arg, BufRef, Program};

const ROWS: usize = 4;
const COLS: usize = 37;
const LD: usize = 40;

fn x_len() -> usize {
    (ROWS - 1) * LD + COLS
}

/// One call over buffer 0 in place, the slope in buffer 1 and the origin in buffer 2.
fn program(scale: f32, slope_scale: f32, len: usize) -> UOp {
    let x = buffer(0, DType::F32, len);
    let (slope, origin) = (buffer(1, DType::F32, 1), buffer(2, DType::F32, 1));
    let op = TileOp::ScoreRamp {
        rows: ROWS,
        cols: COLS,
        ld: LD,
        scale: scale.to_bits(),
        slope_scale: slope_scale.to_bits(),
    };
    sink(&[tile(op, &[x.index(0), slope.index(0), origin.index(0)])])
}

fn values() -> Vec<f32> {
    (0..x_len()).map(|k| if k % LD < COLS { 9.0 * ((k as f32) * 0.37).sin() } else { -7.0 }).collect()
}

#[test]
fn interpreter_expansion_and_jit_agree_with_f64() {
    for (scale, slope_scale, slope, origin) in
        [(1.0f32, 1.0f32, -0.5f32, -3.0f32), (0.18, 1.44, 0.0039, 700.0)]
    {
        let program = program(scale, slope_scale, x_len());
        verify(&program).unwrap();
        let buffers =
            || vec![HostBuffer::F32(values()), HostBuffer::F32(vec![slope]), HostBuffer::F32(vec![origin])];
        let mut want = buffers();
        interp::run(&program, &mut want, Precision::Native).unwrap();
        let y = f32s(&want[0]).to_vec();
        let c = f64::from(slope_scale) * f64::from(slope);
        for (k, (&got, &x)) in y.iter().zip(&values()).enumerate() {
            let (r, j) = (k / LD, k % LD);
            if j >= COLS {
                assert_eq!(got, -7.0, "the gap at {k} is written");
                continue;
            }
            let e = f64::from(scale) * f64::from(x) + c * (f64::from(origin) + j as f64 - r as f64);
            assert!(
                (f64::from(got) - e).abs() <= e.abs() * 2f64.powi(-24),
                "x {x}: interpreter {got} vs {e}"
            );
        }
        expansion_matches(&program, buffers(), 0, &y, "score ramp");
        let mut out = values();
        let prg = Program::compile(&program, "score_ramp").unwrap();
        prg.run(&mut [
            Arg::WriteF32(&mut out),
            Arg::Read(BufRef::F32(&[slope])),
            Arg::Read(BufRef::F32(&[origin])),
        ])
        .unwrap();
        for (k, (&got, &want)) in out.iter().zip(&y).enumerate() {
            let (r, j) = ((k / LD) as f64, (k % LD) as f64);
            // The kernel rounds `c (origin - r)`, `c j +` that, and the scaled sum: each within
            // half an ulp of a term no larger than the one it ends in.
            let terms =
                f64::from(scale * values()[k]).abs() + (c * (f64::from(origin) - r)).abs() + (c * j).abs();
            let close = f64::from((got - want).abs()) <= 2.0 * terms * 2f64.powi(-23);
            assert!(close, "element {k}: jit {got} vs interpreter {want}");
        }
    }
}

#[test]
fn a_block_past_its_buffer_is_refused() {
    refused_past_its_buffer(&program(1.0, 1.0, x_len() - 1));
}
