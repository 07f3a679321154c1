//! The backward tile ops (`TILE_SOFTMAX_RECOMPUTE`, `TILE_SOFTMAX_GRAD`) through the whole
//! stack: the interpreter's semantics, the reference expansion (bit for bit against the
//! interpreter) and the JIT's extern calls (against the interpreter, to the micro-kernels'
//! exp2 accuracy), with masked entries and a row that saw no key.

use crate::f32s;
use uopc_ir::interp::{self, Precision};
use uopc_ir::*;
use uopc_jit::{Arg, BufRef, Program};

const ROWS: usize = 5;
const COLS: usize = 19;
const LD: usize = 21;

/// `S` becomes P from `lse`, then `dP` becomes dS from P and `delta`: buffers 0 = S, 1 = lse,
/// 2 = dP, 3 = delta.
fn program() -> UOp {
    let n = (ROWS - 1) * LD + COLS;
    let (s, lse, dp, delta) = (
        buffer(0, DType::F32, n),
        buffer(1, DType::F32, ROWS),
        buffer(2, DType::F32, n),
        buffer(3, DType::F32, ROWS),
    );
    let p = tile(TileOp::SoftmaxRecompute { rows: ROWS, cols: COLS, ld: LD }, &[s.index(0), lse.index(0)]);
    let after = std::slice::from_ref(&p);
    let g = tile(
        TileOp::SoftmaxGrad { rows: ROWS, cols: COLS, ld: LD },
        &[s.after(after).index(0), dp.index(0), delta.index(0)],
    );
    sink(&[g])
}

fn inputs() -> Vec<HostBuffer> {
    let n = (ROWS - 1) * LD + COLS;
    let wave = |k: usize, a: f32| ((k as f32) * a).sin();
    let s: Vec<f32> = (0..n)
        .map(|k| {
            if k % 7 == 3 || (LD..2 * LD).contains(&k) {
                f32::NEG_INFINITY
            } else {
                3.0 * wave(k, 0.37) - 2.0
            }
        })
        .collect();
    // Row 1 saw no key: every score -inf and lse -inf.
    let lse = vec![2.5, f32::NEG_INFINITY, 1.0, 3.0, 0.5];
    let dp: Vec<f32> = (0..n).map(|k| if k % 7 == 3 { f32::NAN } else { 2.0 * wave(k, 0.91) }).collect();
    let delta = vec![0.25, -1.0, 0.5, 0.0, -0.75];
    vec![HostBuffer::F32(s), HostBuffer::F32(lse), HostBuffer::F32(dp), HostBuffer::F32(delta)]
}

#[test]
fn expansion_interpreter_and_jit_agree() {
    let program = program();
    let mut want = inputs();
    interp::run(&program, &mut want, Precision::Native).unwrap();
    let mut expanded = inputs();
    interp::run(&expand_tile_ops(&program), &mut expanded, Precision::Native).unwrap();
    for k in [0, 2] {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(f32s(&expanded[k])), bits(f32s(&want[k])), "buffer {k}");
    }
    let inp = inputs();
    let (mut s, mut dp) = (f32s(&inp[0]).to_vec(), f32s(&inp[2]).to_vec());
    let prg = Program::compile(&program, "backward_tile_ops").unwrap();
    prg.run(&mut [
        Arg::WriteF32(&mut s),
        Arg::Read(BufRef::F32(f32s(&inp[1]))),
        Arg::WriteF32(&mut dp),
        Arg::Read(BufRef::F32(f32s(&inp[3]))),
    ])
    .unwrap();
    for (k, got) in [(0, &s), (2, &dp)] {
        for (i, (&g, &w)) in got.iter().zip(f32s(&want[k])).enumerate() {
            assert!(
                g == w || (g - w).abs() <= 4e-6 * w.abs().max(1.0),
                "buffer {k}[{i}]: jit {g}, interpreter {w}"
            );
        }
    }
    // Masked entries and the dead row are exactly 0 in P and in dS (no NaN from dP leaks).
    for r in 0..ROWS {
        for j in 0..COLS {
            let at = r * LD + j;
            if r == 1 || at % 7 == 3 {
                assert_eq!((s[at], dp[at]), (0.0, 0.0), "({r}, {j})");
            } else {
                assert!(s[at] > 0.0 && dp[at].is_finite(), "({r}, {j})");
            }
        }
    }
}
