//! Tile ops without micro-kernel calls (`JitOptions::tile_calls == false`): the JIT runs their
//! reference loops (`uopc_ir::expand_tile_ops`). Under strict options that is the interpreter's
//! result bit for bit; with the default options it is within FMA / reassociation rounding of
//! f64 sums; and the micro-kernels' f32 results are within f32 accumulation error of it.

use proptest::prelude::*;
use uopc_ir::interp::{self, Precision};
use uopc_ir::*;
use uopc_jit::{Arg, JitOptions, Program};
use uopc_testgen::tile_cases::*;

fn fallback() -> JitOptions {
    JitOptions { tile_calls: false, ..JitOptions::default() }
}

fn jit(program: &UOp, inputs: &[HostBuffer], opts: &JitOptions) -> Vec<HostBuffer> {
    let prg = Program::compile_with(program, "tile", opts).expect("compiles");
    // Tile ops show in the loop IR exactly when they are called.
    assert_eq!(prg.loop_ir().contains("tile_"), opts.tile_calls, "{}", prg.loop_ir());
    let mut bufs = inputs.to_vec();
    let mut args: Vec<Arg<'_>> = Vec::new();
    for (b, spec) in bufs.iter_mut().zip(prg.buffers()) {
        args.push(if spec.written { Arg::from(b) } else { Arg::from(&*b) });
    }
    prg.run(&mut args).expect("runs");
    bufs
}

fn interpret(program: &UOp, inputs: &[HostBuffer]) -> Vec<HostBuffer> {
    let mut bufs = inputs.to_vec();
    interp::run(program, &mut bufs, Precision::Native).expect("interprets");
    bufs
}

/// Each element within `tol(slot, position, reference value)` of the reference.
fn assert_close(got: &[HostBuffer], want: &[HostBuffer], what: &str, tol: impl Fn(usize, usize, f32) -> f32) {
    for (slot, (g, w)) in got.iter().zip(want).enumerate() {
        for (k, (&x, &y)) in f32s(g).iter().zip(f32s(w)).enumerate() {
            let ok = x.to_bits() == y.to_bits() || (x - y).abs() <= tol(slot, k, y);
            assert!(ok, "{what}: buffer {slot}[{k}]: {x} vs {y} (tol {})", tol(slot, k, y));
        }
    }
}

/// Per element of C: `|C0| + sum_p |A[i,p] B[p,j]|`, the scale of its rounding errors.
fn gemm_magnitudes(g: &GemmCase, tasks: usize, inputs: &[HostBuffer]) -> Vec<f32> {
    let (a, b, c) = (f32s(&inputs[0]), f32s(&inputs[1]), f32s(&inputs[2]));
    let mut mag = vec![0.0f32; c.len()];
    for t in 0..tasks {
        for i in 0..g.m {
            for j in 0..g.n {
                let at = g.c_pos(t, i, j);
                let c0 = if g.accumulate { c[at].abs() as f64 } else { 0.0 };
                let sum: f64 =
                    (0..g.k).map(|p| (g.a_at(a, t, i, p) as f64 * g.b_at(b, p, j) as f64).abs()).sum();
                mag[at] = (c0 + sum) as f32;
            }
        }
    }
    mag
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn gemm_runs_without_micro_kernels(
        m in 1usize..24, n in 1usize..40, k in 0usize..24,
        a_trans: bool, b_trans: bool, accumulate: bool,
        pad in 0usize..3, offset in 0usize..3, tasks in 1usize..4, seed in 0u64..1000,
    ) {
        let g = GemmCase { m, n, k, a_trans, b_trans, accumulate, pad, offset };
        let case = gemm_case(g, tasks, seed);
        let reference = interpret(&case.program, &case.inputs);
        // Strict: f64 products summed in order and rounded once, like the interpreter.
        prop_assert_eq!(bits(&jit(&case.program, &case.inputs, &JitOptions::scalar())), bits(&reference));
        // The disjointness proof still sees each task's own block of C.
        prop_assert!(Program::compile_with(&case.program, "tile", &fallback()).unwrap().is_parallel());

        let mag = gemm_magnitudes(&g, tasks, &case.inputs);
        let loops = jit(&case.program, &case.inputs, &fallback());
        // FMA contraction and split partial sums change an f64 sum by at most 2 (k + 1) f64
        // eps of its magnitude; rounding both to f32 adds one f32 eps of the value.
        let f64_eps = f64::EPSILON as f32;
        assert_close(&loops, &reference, "loops vs interpreter", |_, at, y| {
            f32::EPSILON * y.abs() + 2.0 * (k as f32 + 1.0) * f64_eps * mag.get(at).copied().unwrap_or(0.0)
        });
        // The micro-kernels sum k f32 products (with or without FMA, in any order): within
        // (k + 1) u of the magnitude, u = eps / 2; doubled for the rounding of the f64 result.
        let calls = jit(&case.program, &case.inputs, &JitOptions::default());
        assert_close(&calls, &loops, "micro-kernels vs loops", |slot, at, _| {
            if slot == 2 { (k as f32 + 2.0) * f32::EPSILON * mag[at] } else { 0.0 }
        });
    }

    #[test]
    fn softmax_update_runs_without_micro_kernels(
        rows in 1usize..12, cols in 0usize..50, d in 0usize..40, pad in 0usize..3,
        offset in 0usize..3, tasks in 1usize..3, special: bool, seed in 0u64..1000,
    ) {
        let s = SoftmaxShape { rows, cols, d, pad, offset };
        let case = softmax_case(s, tasks, special, seed);
        let reference = interpret(&case.program, &case.inputs);
        // Strict: the same f64 ops and the same f64::exp2 as the interpreter.
        prop_assert_eq!(bits(&jit(&case.program, &case.inputs, &JitOptions::scalar())), bits(&reference));

        // Only `l a + sum` can change (an FMA, a split sum of at most 50 terms below 1), by
        // far less than one f32 rounding of l >= 1 (a live row's max term is exp2(0)).
        let loops = jit(&case.program, &case.inputs, &fallback());
        assert_close(&loops, &reference, "loops vs interpreter", |_, _, y| f32::EPSILON * y.abs());
        // The micro-kernels compute in f32 with a polynomial exp2: its argument `s - m`
        // (|s - m| < 40 here) is rounded first, which costs |s - m| ln 2 u relative, plus a
        // few ulps of the polynomial, plus cols u for the sum of P. So (cols + 40) eps
        // relative bounds every value.
        let calls = jit(&case.program, &case.inputs, &JitOptions::default());
        assert_close(&calls, &loops, "micro-kernels vs loops", |_, _, y| {
            (cols as f32 + 40.0) * f32::EPSILON * y.abs()
        });
    }
}

#[test]
fn flash_attention_on_tile_ops_runs_without_micro_kernels() {
    let (n, d, br, bc) = (48, 16, 8, 12);
    let program = flash_on_tile_ops(n, d, br, bc);
    let inputs = flash_inputs(n, d, 7);
    let reference = interpret(&program, &inputs);
    assert_eq!(bits(&jit(&program, &inputs, &JitOptions::scalar())), bits(&reference));
    let prg = Program::compile_with(&program, "flash", &fallback()).unwrap();
    assert!(prg.is_parallel(), "per-thread accumulators keep the THREAD range parallel");
    let loops = jit(&program, &inputs, &fallback());
    let calls = jit(&program, &inputs, &JitOptions::default());
    // Outputs are convex combinations of V (|V| < 3); S, P and O round to f32 between tile
    // ops either way, and the f32 sums of the micro-kernels run over d = 16 and bc = 12 terms.
    assert_close(&loops, &reference, "loops vs interpreter", |_, _, y| 4.0 * f32::EPSILON * (1.0 + y.abs()));
    assert_close(&calls, &loops, "micro-kernels vs loops", |_, _, _| 1e-5);
}
