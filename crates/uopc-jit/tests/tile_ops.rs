//! Tile ops: the JIT's calls into the micro-kernels against the interpreter's reference
//! semantics, for random shapes (tails around the kernels' 8/16/32-wide tiles), every
//! transpose, padded strides, operands that start inside their buffers, and THREAD ranges.

// The workspace's shared test input generator (uopc-testgen depends on this crate, so it is
// included by path, like in differential.rs).
#[allow(dead_code)]
#[path = "../../uopc-testgen/src/rng.rs"]
mod rng;

use proptest::prelude::*;
use rng::uniform_values as values;
use uopc_ir::interp::{self, Precision};
use uopc_ir::*;
use uopc_jit::{Arg, Program};

fn run_both(program: &UOp, inputs: Vec<HostBuffer>) -> (Vec<HostBuffer>, Vec<HostBuffer>) {
    let prg = Program::compile(program, "tile").expect("compiles");
    let mut jit = inputs.clone();
    {
        let mut args: Vec<Arg<'_>> = Vec::new();
        for (b, spec) in jit.iter_mut().zip(prg.buffers()) {
            args.push(if spec.written { Arg::from(b) } else { Arg::from(&*b) });
        }
        prg.run(&mut args).expect("runs");
    }
    let mut reference = inputs;
    interp::run(program, &mut reference, Precision::F64).expect("interprets");
    (jit, reference)
}

fn f32s(b: &HostBuffer) -> &[f32] {
    match b {
        HostBuffer::F32(v) => v,
        _ => panic!("not f32"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// `tasks` THREAD iterations, each `C_t (+)= A_t · B` on its own block of rows.
    #[test]
    fn tile_gemm_matches_the_reference(
        m in 1usize..40, n in 1usize..70, k in 1usize..40,
        a_trans: bool, b_trans: bool, accumulate: bool,
        pad in 0usize..5, offset in 0usize..3, tasks in 1usize..4, seed in 0u64..1000,
    ) {
        let (ar, ac) = if a_trans { (k, m) } else { (m, k) };
        let (br, bc) = if b_trans { (n, k) } else { (k, n) };
        let (lda, ldb, ldc) = (ac + pad, bc + pad, n + pad);
        let a_len = offset + ar * lda;
        let c_len = m * ldc;
        let a = buffer(0, DType::F32, a_len * tasks);
        let b = buffer(1, DType::F32, offset + br * ldb);
        let c = buffer(2, DType::F32, c_len * tasks);
        let op = TileOp::Gemm { m, n, k, lda, ldb, ldc, a_trans, b_trans, accumulate };
        let t = range(tasks, 0, AxisType::Thread);
        let g = tile(op, &[a.index(&t * a_len + offset as i64), b.index(offset as i64), c.index(&t * c_len)]);
        let program = sink(&[sink(&[g]).end(&[t])]);
        let inputs = vec![
            HostBuffer::F32(values(a_len * tasks, seed)),
            HostBuffer::F32(values(offset + br * ldb, seed + 1)),
            HostBuffer::F32(values(c_len * tasks, seed + 2)),
        ];
        let (jit, reference) = run_both(&program, inputs);
        // f32 sums of k products of numbers below 1 (plus C): within 2 k eps of the f64 result
        let tol = 2.0 * (k as f32 + 2.0) * f32::EPSILON;
        for (x, y) in f32s(&jit[2]).iter().zip(f32s(&reference[2])) {
            prop_assert!((x - y).abs() <= tol, "{x} vs {y} (tol {tol})");
        }
        prop_assert_eq!(Program::compile(&program, "tile").unwrap().is_parallel(), true);
    }

    #[test]
    fn tile_softmax_matches_the_reference(
        rows in 1usize..20, cols in 1usize..50, d in 1usize..40, pad in 0usize..3,
        dead_row in any::<bool>(), seed in 0u64..1000,
    ) {
        let (lds, ldo) = (cols + pad, d + pad);
        let s = buffer(0, DType::F32, rows * lds);
        let mx = buffer(1, DType::F32, rows);
        let l = buffer(2, DType::F32, rows);
        let o = buffer(3, DType::F32, rows * ldo);
        let op = TileOp::SoftmaxUpdate { rows, cols, lds, d, ldo };
        let program = sink(&[tile(op, &[s.index(0), mx.index(0), l.index(0), o.index(0)])]);
        let mut scores: Vec<f32> = values(rows * lds, seed).iter().map(|x| x * 8.0).collect();
        let mut row_max: Vec<f32> = values(rows, seed + 1).iter().map(|x| x * 4.0).collect();
        if dead_row {
            // a row whose scores and running max are all -inf keeps l and O
            scores[..cols].iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
            row_max[0] = f32::NEG_INFINITY;
        }
        let sums: Vec<f32> = values(rows, seed + 2).iter().map(|x| x.abs() + 0.5).collect();
        let inputs = vec![
            HostBuffer::F32(scores),
            HostBuffer::F32(row_max),
            HostBuffer::F32(sums),
            HostBuffer::F32(values(rows * ldo, seed + 3)),
        ];
        let (jit, reference) = run_both(&program, inputs);
        for slot in 0..4 {
            for (x, y) in f32s(&jit[slot]).iter().zip(f32s(&reference[slot])) {
                // exp2 within ~1.2e-7 relative, values below ~100 (sums over <= 50 keys)
                let ok = x == y || (x - y).abs() <= 1e-5 * (1.0 + y.abs());
                prop_assert!(ok, "buffer {slot}: {x} vs {y}");
            }
        }
    }
}
