//! Variables (scalar kernel arguments with declared bounds): one compiled program run at many
//! values, against the interpreter and an f64 reference; values checked before every call.
//!
//! Inputs are multiples of 1/4 below 16 in magnitude, so every sum here is exact in f32 in any
//! order: results must equal the f64 reference exactly, whatever the JIT reassociates.

use crate::f32s;
use uopc_ir::interp::{self, Precision};
use uopc_ir::*;
use uopc_jit::{Arg, JitOptions, OptLevel, Program};

/// Exact-in-f32 inputs: multiples of 1/4 in [-2, 2).
fn quarters(n: usize, salt: usize) -> Vec<f32> {
    (0..n).map(|k| ((k * 7 + salt * 3) % 16) as f32 * 0.25 - 2.0).collect()
}

/// Every option set a kernel may be compiled with: default, split sums without vectors,
/// strict scalar, unoptimized.
fn option_sets() -> Vec<(&'static str, JitOptions)> {
    vec![
        ("default", JitOptions::default()),
        ("split", JitOptions { vectorize: false, ..JitOptions::default() }),
        ("scalar", JitOptions::scalar()),
        ("none", JitOptions { opt_level: OptLevel::None, ..JitOptions::default() }),
    ]
}

/// Runs `prg` with `vars` on copies of `inputs`, written slots passed mutably.
fn run_jit(prg: &Program, inputs: &[HostBuffer], vars: &[i64]) -> Vec<HostBuffer> {
    let mut bufs = inputs.to_vec();
    let mut args: Vec<Arg<'_>> = Vec::new();
    for (b, spec) in bufs.iter_mut().zip(prg.buffers()) {
        args.push(if spec.written { Arg::from(b) } else { Arg::from(&*b) });
    }
    prg.run_with_vars(&mut args, vars).expect("runs");
    drop(args);
    bufs
}

fn run_interp(program: &UOp, inputs: &[HostBuffer], vars: &[i64]) -> Vec<HostBuffer> {
    let mut bufs = inputs.to_vec();
    interp::run_with_vars(program, &mut bufs, vars, Precision::Native).expect("interprets");
    bufs
}

/// `out[0] = sum of a[j] for j < L`, a of `cap` elements, L in `lo..=cap`.
fn prefix_sum(cap: usize, lo: i64) -> UOp {
    let (a, out, acc) = (buffer(0, DType::F32, cap), buffer(1, DType::F32, 1), alloc(0, DType::F32, 1));
    let j = range(var(0, lo, cap as i64), 0, AxisType::Reduce);
    let init = acc.index(0).store(0.0f32);
    let acc_j = acc.after(&[init.clone(), j.clone()]);
    let add = acc_j.index(0).store(acc_j.index(0).load() + a.index(&j).load()).end(&[j]);
    sink(&[out.index(0).store(acc.after(&[init, add]).index(0).load())])
}

#[test]
fn one_compiled_prefix_sum_serves_every_length() {
    // A negative length runs no iteration, like a negative constant end.
    let cap = 37;
    let program = prefix_sum(cap, -3);
    let a = quarters(cap, 1);
    let inputs = [HostBuffer::F32(a.clone()), HostBuffer::zeros(DType::F32, 1)];
    for (what, opts) in option_sets() {
        // Compiled once; every length below runs this one program.
        let prg = Program::compile_with(&program, "prefix_sum", &opts).unwrap();
        assert_eq!(prg.vars(), [VarSpec { slot: 0, lo: -3, hi: cap as i64 }]);
        // The loop is vectorized (F32X4 partial sums, a main loop to a multiple of the step
        // computed at run time, then a scalar tail) when the build vectorizes.
        assert_eq!(prg.clif().contains("f32x4"), opts.vectorize, "{what}");
        for len in -3..=cap as i64 {
            let got = run_jit(&prg, &inputs, &[len]);
            let want: f64 = a[..len.max(0) as usize].iter().map(|&x| x as f64).sum();
            assert_eq!(f32s(&got[1]), [want as f32], "{what}: L = {len}");
            assert_eq!(got, run_interp(&program, &inputs, &[len]), "{what}: L = {len}");
        }
    }
}

#[test]
fn the_variable_is_read_once_before_the_loops() {
    let prg = Program::compile(&prefix_sum(16, 1), "prefix_sum").unwrap();
    assert!(prg.loop_ir().contains("var0: i64 in 1..=16"), "{}", prg.loop_ir());
    assert!(prg.loop_ir().contains("0..var0 (reduce)"), "{}", prg.loop_ir());
    // The entry block's fourth parameter is the values array: one load of it, in block0.
    let clif = prg.clif();
    let entry = clif.split("block1").next().unwrap();
    let param = entry
        .lines()
        .find_map(|l| l.trim().strip_prefix("block0(").map(|p| p.split(", ").nth(3).unwrap().to_string()))
        .expect("entry block");
    let var_param = param.split(':').next().unwrap().to_string();
    let loads_of = |text: &str| {
        text.lines().filter(|l| l.contains("load") && l.ends_with(&format!(" {var_param}"))).count()
    };
    assert_eq!(loads_of(entry), 1, "{clif}");
    assert_eq!(loads_of(clif), 1, "{clif}");
}

#[test]
fn values_outside_the_bounds_are_errors_and_never_run() {
    let program = prefix_sum(16, 1);
    let prg = Program::compile(&program, "prefix_sum").unwrap();
    let a = vec![1.0f32; 16];
    let mut out = [-3.0f32];
    for bad in [0, 17, -1, i64::MIN, i64::MAX] {
        let e = prg.run_with_vars(&mut [Arg::from(&a[..]), Arg::from(&mut out[..])], &[bad]).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("variable 0 must be in 1..=16") && msg.contains(&bad.to_string()), "{msg}");
    }
    let e = prg.run(&mut [Arg::from(&a[..]), Arg::from(&mut out[..])]).unwrap_err();
    assert!(e.to_string().contains("expects 1 variable value(s), got 0"), "{e}");
    let e = prg.run_with_vars(&mut [Arg::from(&a[..]), Arg::from(&mut out[..])], &[1, 2]).unwrap_err();
    assert!(e.to_string().contains("got 2"), "{e}");
    assert_eq!(out, [-3.0], "nothing ran");
    // A program without variables takes none.
    let plain = Program::compile(&prefix_sum(16, 1).with_src(vec![]), "empty").unwrap();
    assert!(plain.vars().is_empty());
    assert!(plain.run_with_vars(&mut [], &[3]).is_err());
    // The typed f32 entry point checks them too.
    assert!(prg.run_f32_with_vars(&[&a], &mut [&mut out], &[17]).is_err());
    prg.run_f32_with_vars(&[&a], &mut [&mut out], &[5]).unwrap();
    assert_eq!(out, [5.0]);
}

/// `s[i] = sum of a[i * cap + j] for j < L` for 4 rows, then one tile GEMM
/// `out (2 x 2) = S (2 x 2) · B (2 x 2)` of the row sums.
fn row_sums_then_gemm(cap: usize) -> UOp {
    let rows = 4;
    let (a, b, out) = (buffer(0, DType::F32, rows * cap), buffer(1, DType::F32, 4), buffer(2, DType::F32, 4));
    let s = alloc(0, DType::F32, rows);
    let i = range(rows, 0, AxisType::Loop);
    let j = range(var(0, 1, cap as i64), 1, AxisType::Reduce);
    let init = s.index(&i).store(0.0f32);
    let s_ij = s.after(&[init, j.clone()]);
    let add = s_ij.index(&i).store(s_ij.index(&i).load() + a.index(&i * cap as i64 + &j).load());
    let sums = add.end(&[j, i]);
    let gemm = TileOp::Gemm(GemmShape::dense(2, 2, 2, false, false, false));
    sink(&[tile(gemm, &[s.after(&[sums]).index(0), b.index(0), out.index(0)])])
}

#[test]
fn a_loop_nest_with_a_variable_inner_end_feeds_a_tile_op() {
    let cap = 24;
    let program = row_sums_then_gemm(cap);
    let a = quarters(4 * cap, 2);
    let bm = [1.0f32, -2.0, 0.5, 3.0];
    let inputs = [HostBuffer::F32(a.clone()), HostBuffer::F32(bm.to_vec()), HostBuffer::zeros(DType::F32, 4)];
    for (what, opts) in option_sets() {
        let prg = Program::compile_with(&program, "row_sums_gemm", &opts).unwrap();
        for len in [1, 2, cap / 2 + 1, cap - 1, cap] {
            let s: Vec<f64> =
                (0..4).map(|r| a[r * cap..r * cap + len].iter().map(|&x| x as f64).sum()).collect();
            let want: Vec<f32> = (0..4)
                .map(|e| {
                    let (r, c) = (e / 2, e % 2);
                    (s[2 * r] * bm[c] as f64 + s[2 * r + 1] * bm[2 + c] as f64) as f32
                })
                .collect();
            let got = run_jit(&prg, &inputs, &[len as i64]);
            assert_eq!(f32s(&got[2]), want, "{what}: L = {len}");
            assert_eq!(got, run_interp(&program, &inputs, &[len as i64]), "{what}: L = {len}");
        }
    }
}

#[test]
fn a_variable_in_an_index_expression_and_as_a_value() {
    // out[j] = a[j + off] for j < 4, and pos[0] = off * 10: off in 0..=4 on 8 elements.
    let (a, out, pos) = (buffer(0, DType::F32, 8), buffer(1, DType::F32, 4), buffer(2, DType::I64, 1));
    let off = var(0, 0, 4);
    let j = range(4, 0, AxisType::Loop);
    let program =
        sink(&[out.index(&j).store(a.index(&j + &off).load()).end(&[j]), pos.index(0).store(&off * 10)]);
    let data = quarters(8, 3);
    let inputs =
        [HostBuffer::F32(data.clone()), HostBuffer::zeros(DType::F32, 4), HostBuffer::zeros(DType::I64, 1)];
    for (what, opts) in option_sets() {
        let prg = Program::compile_with(&program, "window", &opts).unwrap();
        for o in 0..=4usize {
            let got = run_jit(&prg, &inputs, &[o as i64]);
            assert_eq!(f32s(&got[1]), &data[o..o + 4], "{what}: offset {o}");
            assert_eq!(got[2], HostBuffer::I64(vec![o as i64 * 10]), "{what}: offset {o}");
            assert_eq!(got, run_interp(&program, &inputs, &[o as i64]), "{what}: offset {o}");
        }
    }
    // One more element would reach a[8].
    let j = range(4, 0, AxisType::Loop);
    let past = sink(&[out.index(&j).store(a.index(&j + var(0, 0, 5)).load()).end(&[j])]);
    assert!(Program::compile(&past, "past").is_err());
}

#[test]
fn a_thread_range_ending_at_a_formula_of_a_variable_runs_in_parallel() {
    // Blocks of 4: THREAD t < ceil(L / 4) doubles a[4 t .. 4 t + 4]; L in 1..=64.
    let (a, out) = (buffer(0, DType::F32, 64), buffer(1, DType::F32, 64));
    let t = range((var(0, 1, 64) + 3).idiv(4), 0, AxisType::Thread);
    let k = range(4, 1, AxisType::Loop);
    let at = &t * 4 + &k;
    let program = sink(&[out.index(&at).store(a.index(&at).load() * 2.0f32).end(&[k, t])]);
    let data = quarters(64, 4);
    let inputs = [HostBuffer::F32(data.clone()), HostBuffer::F32(vec![9.0; 64])];
    for (what, opts) in option_sets() {
        let prg = Program::compile_with(&program, "blocks", &opts).unwrap();
        assert!(prg.is_parallel(), "{what}");
        for len in [1usize, 2, 4, 5, 33, 63, 64] {
            let done = len.div_ceil(4) * 4;
            let got = run_jit(&prg, &inputs, &[len as i64]);
            let want: Vec<f32> = (0..64).map(|e| if e < done { 2.0 * data[e] } else { 9.0 }).collect();
            assert_eq!(f32s(&got[1]), want, "{what}: L = {len}");
            assert_eq!(got, run_interp(&program, &inputs, &[len as i64]), "{what}: L = {len}");
        }
    }
}

#[test]
fn a_thread_range_ending_at_a_load_is_refused_clearly() {
    // The trip count must be known before the call to split the work.
    let (n, out) = (buffer(0, DType::I64, 1), buffer(1, DType::I64, 8));
    let len = n.index(0).load().maximum(0);
    let clamped = -((-len).maximum(-8));
    let t = range(clamped, 0, AxisType::Thread);
    let program = sink(&[out.index(&t).store(&t).end(&[t])]);
    let e = Program::compile(&program, "loaded").unwrap_err();
    assert!(e.to_string().contains("constants and variables"), "{e}");
}

#[test]
fn a_register_tile_over_a_variable_reduce_loop() {
    // out[c] = sum of a[4 k + c] for k < L, c < 4: four register accumulators updated in one
    // innermost loop of variable length (the register-tile lowering, with its loop test at
    // the top since the trip count is unknown).
    let cap = 19;
    let (a, out) = (buffer(0, DType::F32, 4 * cap), buffer(1, DType::F32, 4));
    let acc = alloc(0, DType::F32, 4);
    let k = range(var(0, 0, cap as i64), 0, AxisType::Reduce);
    let init = sink(&(0..4).map(|c| acc.index(c).store(0.0f32)).collect::<Vec<_>>());
    let inner = acc.after(&[init.clone(), k.clone()]);
    let steps: Vec<UOp> =
        (0..4).map(|c| inner.index(c).store(inner.index(c).load() + a.index(&k * 4 + c).load())).collect();
    let done = acc.after(&[init, sink(&steps).end(&[k])]);
    let program = sink(&(0..4).map(|c| out.index(c).store(done.index(c).load())).collect::<Vec<_>>());
    let data = quarters(4 * cap, 5);
    let inputs = [HostBuffer::F32(data.clone()), HostBuffer::F32(vec![7.0; 4])];
    for (what, opts) in option_sets() {
        let prg = Program::compile_with(&program, "register_tile", &opts).unwrap();
        // The accumulators are one F32X4 when vectorizing: the fast path takes variable ends.
        assert_eq!(prg.clif().contains("f32x4"), opts.vectorize, "{what}");
        for len in [0usize, 1, 2, 3, 10, cap] {
            let want: Vec<f32> =
                (0..4).map(|c| (0..len).map(|k| data[4 * k + c] as f64).sum::<f64>() as f32).collect();
            let got = run_jit(&prg, &inputs, &[len as i64]);
            assert_eq!(f32s(&got[1]), want, "{what}: L = {len}");
            assert_eq!(got, run_interp(&program, &inputs, &[len as i64]), "{what}: L = {len}");
        }
    }
}
