//! Tile ops: the JIT's calls into the micro-kernels against the interpreter's reference
//! semantics, for random shapes (tails around the kernels' 8/16/32-wide tiles), every
//! transpose, padded strides, operands that start inside their buffers, and THREAD ranges.

use proptest::prelude::*;
// The tile-op programs and inputs the expansion tests use too.
use crate::f32s;
use uopc_ir::interp::{self, Precision};
use uopc_ir::*;
use uopc_jit::{Arg, Program};
use uopc_testgen::tile_cases::*;

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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// `tasks` THREAD iterations, each `C_t (+)= A_t · B` on its own block of rows.
    #[test]
    fn tile_gemm_matches_the_reference(
        m in 1usize..40, n in 1usize..70, k in 1usize..40,
        a_trans: bool, b_trans: bool, accumulate: bool,
        pad in 0usize..5, offset in 0usize..3, tasks in 1usize..4, seed in 0u64..1000,
    ) {
        let g = GemmCase { m, n, k, a_trans, b_trans, accumulate, pad, offset };
        let case = gemm_case(g, tasks, seed);
        let (jit, reference) = run_both(&case.program, case.inputs);
        // f32 sums of k products of numbers below 1 (plus C): within 2 k eps of the f64 result
        let tol = 2.0 * (k as f32 + 2.0) * f32::EPSILON;
        for (x, y) in f32s(&jit[2]).iter().zip(f32s(&reference[2])) {
            prop_assert!((x - y).abs() <= tol, "{x} vs {y} (tol {tol})");
        }
        prop_assert_eq!(Program::compile(&case.program, "tile").unwrap().is_parallel(), true);
    }

    /// The same GEMMs with B in panels, of the driver's own width, twice it, or one it leaves
    /// to plain loops: what the micro-kernel reads in place against the interpreter.
    #[test]
    fn tile_gemm_with_b_in_panels_matches_the_reference(
        m in 1usize..40, n in 1usize..70, k in 1usize..40,
        width in prop::sample::select(vec![16usize, 32, 5]),
        a_trans: bool, accumulate: bool,
        pad in 0usize..5, offset in 0usize..3, tasks in 1usize..4, seed in 0u64..1000,
    ) {
        let g = GemmCase { m, n, k, a_trans, b_trans: false, accumulate, pad, offset };
        let case = gemm_panels_case(g, width, tasks, seed);
        let (jit, reference) = run_both(&case.program, case.inputs);
        let tol = 2.0 * (k as f32 + 2.0) * f32::EPSILON;
        for (x, y) in f32s(&jit[2]).iter().zip(f32s(&reference[2])) {
            prop_assert!((x - y).abs() <= tol, "{x} vs {y} (tol {tol})");
        }
        prop_assert_eq!(f32s(&jit[2]).last(), f32s(&reference[2]).last());
    }

    /// The same GEMMs with bf16 A and B: the bf16 micro-kernels against the interpreter.
    #[test]
    fn tile_gemm_bf16_matches_the_reference(
        m in 1usize..40, n in 1usize..70, k in 1usize..40,
        a_trans: bool, b_trans: bool, accumulate: bool,
        pad in 0usize..5, offset in 0usize..3, tasks in 1usize..4, seed in 0u64..1000,
    ) {
        let g = GemmCase { m, n, k, a_trans, b_trans, accumulate, pad, offset };
        let case = gemm_bf16_case(g, tasks, seed);
        let (jit, reference) = run_both(&case.program, case.inputs);
        // bf16 products are exact in f32, so only the f32 sums round: the f32 bound above
        let tol = 2.0 * (k as f32 + 2.0) * f32::EPSILON;
        for (x, y) in f32s(&jit[2]).iter().zip(f32s(&reference[2])) {
            prop_assert!((x - y).abs() <= tol, "{x} vs {y} (tol {tol})");
        }
        // Nothing past the blocks was written (the buffers' last elements).
        prop_assert_eq!(f32s(&jit[2]).last(), f32s(&reference[2]).last());
    }

    /// The bf16 GEMMs writing a bf16 C: the f32 sums of the micro-kernels rounded once. Two
    /// f32 sums within the bound above may round to neighbouring bf16 values, so a value may
    /// differ from the interpreter's by that bound and one bf16 ulp (at most 2^-7 relative).
    #[test]
    fn tile_gemm_bf16_rounded_matches_the_reference(
        m in 1usize..70, n in 1usize..70, k in 1usize..70, a_trans: bool, b_trans: bool,
        pad in 0usize..5, offset in 0usize..3, tasks in 1usize..4, seed in 0u64..1000,
    ) {
        let g = GemmCase { m, n, k, a_trans, b_trans, accumulate: false, pad, offset };
        let case = gemm_bf16_rounded_case(g, tasks, seed);
        let (jit, reference) = run_both(&case.program, case.inputs);
        let (HostBuffer::BF16(got), HostBuffer::BF16(want)) = (&jit[2], &reference[2]) else {
            panic!("C is bf16");
        };
        let tol = 2.0 * (k as f32 + 2.0) * f32::EPSILON;
        for (x, y) in got.iter().zip(want) {
            let (x, y) = (x.to_f32(), y.to_f32());
            prop_assert!((x - y).abs() <= tol + y.abs().max(x.abs()) * 2f32.powi(-7), "{x} vs {y}");
        }
        // Nothing past the blocks was written (the buffers' last elements).
        prop_assert_eq!(got.last(), want.last());
    }

    /// The f16 GEMMs writing an f16 C, with the bound of the bf16 ones and f16's ulp (at most
    /// 2^-10 relative).
    #[test]
    fn tile_gemm_f16_rounded_matches_the_reference(
        m in 1usize..70, n in 1usize..70, k in 1usize..70, a_trans: bool, b_trans: bool,
        pad in 0usize..5, offset in 0usize..3, tasks in 1usize..4, seed in 0u64..1000,
    ) {
        let g = GemmCase { m, n, k, a_trans, b_trans, accumulate: false, pad, offset };
        let case = gemm_f16_rounded_case(g, tasks, seed);
        let (jit, reference) = run_both(&case.program, case.inputs);
        let (HostBuffer::F16(got), HostBuffer::F16(want)) = (&jit[2], &reference[2]) else {
            panic!("C is f16");
        };
        let tol = 2.0 * (k as f32 + 2.0) * f32::EPSILON;
        for (x, y) in got.iter().zip(want) {
            let (x, y) = (x.to_f32(), y.to_f32());
            prop_assert!((x - y).abs() <= tol + y.abs().max(x.abs()) * 2f32.powi(-10), "{x} vs {y}");
        }
        // Nothing past the blocks was written (the buffers' last elements).
        prop_assert_eq!(got.last(), want.last());
    }

    /// The same GEMMs with f16 A and B: the f16 GEMM (widened to f32) against the interpreter.
    #[test]
    fn tile_gemm_f16_matches_the_reference(
        m in 1usize..40, n in 1usize..70, k in 1usize..40,
        a_trans: bool, b_trans: bool, accumulate: bool,
        pad in 0usize..5, offset in 0usize..3, tasks in 1usize..4, seed in 0u64..1000,
    ) {
        let g = GemmCase { m, n, k, a_trans, b_trans, accumulate, pad, offset };
        let case = gemm_f16_case(g, tasks, seed);
        let (jit, reference) = run_both(&case.program, case.inputs);
        // f16 products are exact in f32, so only the f32 sums round: the f32 bound above
        let tol = 2.0 * (k as f32 + 2.0) * f32::EPSILON;
        for (x, y) in f32s(&jit[2]).iter().zip(f32s(&reference[2])) {
            prop_assert!((x - y).abs() <= tol, "{x} vs {y} (tol {tol})");
        }
        // Nothing past the blocks was written (the buffers' last elements).
        prop_assert_eq!(f32s(&jit[2]).last(), f32s(&reference[2]).last());
    }

    /// With `special_rows`, the first rows are all `-inf`, a first block, masked, and a late
    /// maximum (see `softmax_case`); the scores scaled inside the op by `scale`.
    #[test]
    fn tile_softmax_matches_the_reference(
        rows in 1usize..20, cols in 1usize..50, d in 1usize..40, pad in 0usize..3,
        scale in prop::sample::select(vec![1.0f32, 0.125, std::f32::consts::LOG2_E]),
        special_rows in any::<bool>(), seed in 0u64..1000,
    ) {
        let case = softmax_scaled_case(SoftmaxShape { rows, cols, d, pad, offset: 0 }, scale, 1, special_rows, seed);
        let (jit, reference) = run_both(&case.program, case.inputs);
        for slot in 0..4 {
            for (x, y) in f32s(&jit[slot]).iter().zip(f32s(&reference[slot])) {
                // exp2 within ~1.2e-7 relative, values below ~100 (sums over <= 50 keys)
                let ok = x == y || (x - y).abs() <= 1e-5 * (1.0 + y.abs());
                prop_assert!(ok, "buffer {slot}: {x} vs {y}");
            }
        }
    }

    /// The rounded step of 16-bit attention: P in bf16 or f16, scores scaled inside the op,
    /// the same special rows. The JIT's exp2 is within ~1.2e-7 of the interpreter's f64 one,
    /// so a probability can round to the neighbouring 16-bit value, one unit in the last place
    /// (at most `2^(1-p)` of it, p the type's significant bits) away, and a row sum then
    /// differs by up to `cols` such units.
    #[test]
    fn tile_softmax_rounded_matches_the_reference(
        rows in 1usize..20, cols in 1usize..50, d in 1usize..40, pad in 0usize..3,
        f16_probs: bool, scale in prop::sample::select(vec![0.125f32, 1.0, std::f32::consts::LOG2_E]),
        special_rows in any::<bool>(), seed in 0u64..1000,
    ) {
        let (p_dtype, ulp) = if f16_probs { (DType::F16, 2f64.powi(-10)) } else { (DType::BF16, 2f64.powi(-7)) };
        let s = SoftmaxShape { rows, cols, d, pad, offset: 0 };
        let case = softmax_rounded_case(s, p_dtype, scale, 1, special_rows, seed);
        let (jit, reference) = run_both(&case.program, case.inputs);
        for slot in 0..5 {
            for i in 0..jit[slot].len() {
                let (x, y) = (jit[slot].get_f64(i), reference[slot].get_f64(i));
                let tol = match slot {
                    // P: one unit of the 16-bit type (plus f16's subnormal step).
                    4 => ulp * y.abs() + 2f64.powi(-24),
                    2 => 1e-5 * (1.0 + y.abs()) + cols as f64 * ulp,
                    _ => 1e-5 * (1.0 + y.abs()),
                };
                let ok = x == y || (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol;
                prop_assert!(ok, "buffer {slot}[{i}]: {x} vs {y}");
            }
        }
    }

    /// A block conversion: the JIT's call converts every element as the interpreter's
    /// stores do, bit for bit (both round to nearest even, like the `half` crate), and leaves
    /// the padding between rows alone.
    #[test]
    fn tile_convert_matches_the_reference_bit_for_bit(
        rows in 1usize..6, cols in 0usize..70, pad in 0usize..3, offset in 0usize..3,
        tasks in 1usize..3, pair in 0usize..4, seed in 0u64..1000,
    ) {
        let (from, to) = [(DType::F16, DType::F32), (DType::BF16, DType::F32), (DType::F32, DType::F16), (DType::F32, DType::BF16)][pair];
        let case = convert_case((rows, cols, pad, offset), from, to, tasks, seed);
        let (jit, reference) = run_both(&case.program, case.inputs);
        prop_assert_eq!(bits(&jit), bits(&reference));
    }

    /// The in-place form: P written over the f32 scores, rounded to bf16 or f16; the same
    /// tolerances, and every probability the JIT writes is a value of the 16-bit type.
    #[test]
    fn tile_softmax_rounded_in_place_matches_the_reference(
        rows in 1usize..20, cols in 1usize..50, d in 1usize..40, pad in 0usize..3,
        f16_probs: bool, scale in prop::sample::select(vec![0.125f32, 1.0, std::f32::consts::LOG2_E]),
        special_rows in any::<bool>(), seed in 0u64..1000,
    ) {
        let (round_to, ulp) = if f16_probs { (DType::F16, 2f64.powi(-10)) } else { (DType::BF16, 2f64.powi(-7)) };
        let s = SoftmaxShape { rows, cols, d, pad, offset: 0 };
        let case = softmax_rounded_in_place_case(s, round_to, scale, 1, special_rows, seed);
        let (jit, reference) = run_both(&case.program, case.inputs);
        for slot in 0..4 {
            for i in 0..jit[slot].len() {
                let (x, y) = (jit[slot].get_f64(i), reference[slot].get_f64(i));
                let tol = match slot {
                    0 => ulp * y.abs() + 2f64.powi(-24),
                    2 => 1e-5 * (1.0 + y.abs()) + cols as f64 * ulp,
                    _ => 1e-5 * (1.0 + y.abs()),
                };
                let ok = x == y || (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol;
                prop_assert!(ok, "buffer {slot}[{i}]: {x} vs {y}");
            }
        }
        let p = f32s(&jit[0]);
        for r in 0..rows {
            for j in 0..cols {
                let x = p[r * (cols + pad) + j];
                let back = if f16_probs { half::f16::from_f32(x).to_f32() } else { half::bf16::from_f32(x).to_f32() };
                prop_assert!(back.to_bits() == x.to_bits() || x.is_nan(), "P[{r}, {j}] = {x} is not rounded");
            }
        }
    }
}
