//! JIT tests: runtime argument checking, compile-time refusals, EXP2 accuracy, agreement with
//! the reference interpreter, and resource release.

use uopc_ir::interp::{self, Precision};
use uopc_ir::*;
use uopc_jit::{Arg, JitError, Program};

/// out[i] = a[i] * 2 + b[i], over n elements, threaded.
fn axpy(n: usize) -> UOp {
    let (a, b, out) = (buffer(0, DType::F32, n), buffer(1, DType::F32, n), buffer(2, DType::F32, n));
    let i = range(n, 0, AxisType::Thread);
    sink(&[out.index(&i).store(a.index(&i).load() * 2.0f32 + b.index(&i).load()).end(&[i])])
}

#[test]
fn runs_a_threaded_program() {
    let prg = Program::compile(&axpy(1000), "axpy").unwrap();
    assert!(prg.is_parallel());
    let a: Vec<f32> = (0..1000).map(|x| x as f32).collect();
    let b = vec![1.0f32; 1000];
    let mut out = vec![0.0f32; 1000];
    prg.run_f32(&[&a, &b], &mut [&mut out]).unwrap();
    assert!(out.iter().enumerate().all(|(i, &v)| v == 2.0 * i as f32 + 1.0));
    assert!(prg.clif().contains("fma") || prg.clif().contains("fmul"), "CLIF text is available");
    assert!(prg.loop_ir().contains("for r0 in 0..1000 (thread)"));
}

#[test]
fn wrong_arguments_are_errors_naming_the_buffer() {
    let prg = Program::compile(&axpy(8), "axpy").unwrap();
    let a = vec![0.0f32; 8];
    let short = [0.0f32; 7];
    let mut out = vec![0.0f32; 8];
    let msg = |e: JitError| e.to_string();

    let e = prg.run(&mut [Arg::from(&a[..]), Arg::from(&mut out[..])]).unwrap_err();
    assert!(msg(e).contains("expects 3 buffers, got 2"));

    let e = prg.run(&mut [Arg::from(&a[..]), Arg::from(&short[..]), Arg::from(&mut out[..])]).unwrap_err();
    assert!(msg(e).contains("buffer 1 must have 8 elements, got 7"));

    let ints = HostBuffer::I32(vec![0; 8]);
    let e = prg.run(&mut [Arg::from(&a[..]), Arg::from(&ints), Arg::from(&mut out[..])]).unwrap_err();
    assert!(msg(e).contains("buffer 1 must be f32, got i32"));

    let e = prg.run(&mut [Arg::from(&a[..]), Arg::from(&a[..]), Arg::from(&a[..])]).unwrap_err();
    assert!(msg(e).contains("buffer 2 is written by the program but was passed read-only"));

    let e = prg.run_f32(&[&a], &mut [&mut out]).unwrap_err();
    assert!(msg(e).contains("expects 2 inputs and 1 outputs"));
}

#[test]
fn uninitialized_memory_only_for_slots_the_program_writes_whole() {
    use std::mem::MaybeUninit;
    let n = 1000;
    let prg = Program::compile(&axpy(n), "axpy").unwrap();
    assert!(prg.writes_whole(2) && !prg.writes_whole(0) && !prg.writes_whole(3));
    let a: Vec<f32> = (0..n).map(|x| x as f32).collect();
    let b = vec![1.0f32; n];
    let mut fresh: Vec<MaybeUninit<f32>> = vec![MaybeUninit::uninit(); n];
    prg.run(&mut [Arg::from(&a[..]), Arg::from(&b[..]), Arg::WriteF32Uninit(&mut fresh)]).unwrap();
    // SAFETY: the run succeeded and the program writes every element of slot 2.
    let out: Vec<f32> = fresh.iter().map(|v| unsafe { v.assume_init() }).collect();
    assert!(out.iter().enumerate().all(|(i, &v)| v == 2.0 * i as f32 + 1.0));
    // Half the output: uninitialized memory there is refused before anything runs.
    let (x, half) = (buffer(0, DType::F32, n), buffer(1, DType::F32, n));
    let i = range(n / 2, 0, AxisType::Thread);
    let halves =
        Program::compile(&sink(&[half.index(&i).store(x.index(&i).load()).end(&[i])]), "half").unwrap();
    assert!(!halves.writes_whole(1));
    let mut fresh: Vec<MaybeUninit<f32>> = vec![MaybeUninit::uninit(); n];
    let e = halves.run(&mut [Arg::from(&a[..]), Arg::WriteF32Uninit(&mut fresh)]).unwrap_err();
    assert!(e.to_string().contains("buffer 1 was passed uninitialized"), "{e}");
}

#[test]
fn a_dense_store_inside_a_loop_that_may_not_run_does_not_write_whole() {
    use std::mem::MaybeUninit;
    let n = 64;
    let (x, out) = (buffer(0, DType::F32, n), buffer(1, DType::F32, n));
    let i = range(n, 0, AxisType::Loop);
    let trips = var(0, 0, 4);
    let outer = range(&trips, 1, AxisType::Loop);
    let value = x.index(&i).load() + outer.cast(DType::F32);
    let program = sink(&[out.index(&i).store(value).end(&[i.clone(), outer.clone()])]);
    let prg = Program::compile(&program, "maybe_empty").unwrap();
    assert!(!prg.writes_whole(1), "the loop around the store runs zero times when var0 is 0");
    let a = vec![1.0f32; n];
    let mut fresh: Vec<MaybeUninit<f32>> = vec![MaybeUninit::uninit(); n];
    let e = prg.run(&mut [Arg::from(&a[..]), Arg::WriteF32Uninit(&mut fresh)]).unwrap_err();
    assert!(e.to_string().contains("buffer 1 was passed uninitialized"), "{e}");
    let empty = range(0, 1, AxisType::Thread);
    let value = x.index(&i).load() + empty.cast(DType::F32);
    let never = sink(&[out.index(&i).store(value).end(&[i, empty])]);
    assert!(!Program::compile(&never, "never").unwrap().writes_whole(1), "an empty THREAD loop");
}

#[test]
fn unprovable_index_refuses_to_compile() {
    let a = buffer(0, DType::F32, 10);
    let i = range(10, 0, AxisType::Loop);
    let p = sink(&[a.index(&i + 1).store(0.0f32).end(&[i.clone()])]);
    match Program::compile(&p, "oob") {
        Err(JitError::Ir(e)) => assert_eq!(e.kind, IrErrorKind::OutOfBounds, "{e}"),
        other => panic!("expected an out-of-bounds error, got {other:?}"),
    }
    // An index read from memory has no bounds: refused too.
    let ix = buffer(1, DType::I64, 10);
    let p = sink(&[a.index(ix.index(&i).load()).store(0.0f32).end(&[i])]);
    assert!(matches!(Program::compile(&p, "gather"), Err(JitError::Ir(_))));
}

#[test]
fn huge_locals_are_refused() {
    let a = buffer(0, DType::F32, 4);
    let big = alloc(0, DType::F32, 1 << 20);
    let i = range(4, 0, AxisType::Loop);
    let st = big.after(&[i.clone()]).index(&i).store(1.0f32);
    let rd = a.index(&i).store(big.after(&[st]).index(&i).load());
    assert!(matches!(Program::compile(&sink(&[rd.end(&[i])]), "big"), Err(JitError::Unsupported(_))));
}

/// Large ALLOCs start on a cache line inside a slot a line longer: three of odd sizes, each
/// written whole and read back whole, keep their own values (the rounded-up starts do not run
/// into each other), as the interpreter says.
#[test]
fn large_allocs_start_on_a_line_without_overlapping() {
    let lens = [257usize, 300, 1031];
    let n = lens.iter().sum::<usize>();
    let (x, out) = (buffer(0, DType::F32, n), buffer(1, DType::F32, n));
    let mut effects = Vec::new();
    let mut first = 0;
    for (slot, &len) in lens.iter().enumerate() {
        let tile = alloc(slot, DType::F32, len);
        let i = range(len, 2 * slot, AxisType::Loop);
        let fill = tile.after(&[i.clone()]).index(&i).store(x.index(&i + first as i64).load() * 2.0f32);
        let filled = fill.end(&[i]);
        effects.push((tile, filled, len, first));
        first += len;
    }
    // Every tile is written before any is read back.
    let written: Vec<UOp> = effects.iter().map(|(_, f, _, _)| f.clone()).collect();
    let mut reads = Vec::new();
    for (slot, (tile, _, len, first)) in effects.iter().enumerate() {
        let j = range(*len, 2 * slot + 1, AxisType::Loop);
        let back = tile.after(&written).after(&[j.clone()]).index(&j).load();
        reads.push(out.index(&j + *first as i64).store(back).end(&[j]));
    }
    let p = sink(&reads);
    let prg = Program::compile(&p, "large_allocs").unwrap();
    let xs: Vec<f32> = (0..n).map(|v| v as f32 - 100.0).collect();
    let mut got = vec![0.0f32; n];
    prg.run_f32(&[&xs], &mut [&mut got]).unwrap();
    let want: Vec<f32> = xs.iter().map(|v| v * 2.0).collect();
    assert_eq!(got, want);
    let mut bufs = vec![HostBuffer::F32(xs), HostBuffer::F32(vec![0.0; n])];
    interp::run(&p, &mut bufs, Precision::Native).unwrap();
    let HostBuffer::F32(interpreted) = &bufs[1] else { unreachable!() };
    assert_eq!(interpreted, &want);
}

#[test]
fn racy_stores_run_serially_and_correctly() {
    // Every THREAD iteration adds into out[0]: not provably disjoint, so no parallelism.
    let n = 4096;
    let (a, out) = (buffer(0, DType::F32, n), buffer(1, DType::F32, 1));
    let i = range(n, 0, AxisType::Thread);
    // The view after i: read out[0] anew in every iteration, after the previous store.
    let o = out.after(&[i.clone()]).index(0);
    let p = sink(&[o.store(o.load() + a.index(&i).load()).end(&[i])]);
    let prg = Program::compile(&p, "race").unwrap();
    assert!(!prg.is_parallel());
    let ones = vec![1.0f32; n];
    let mut acc = vec![0.0f32; 1];
    prg.run_f32(&[&ones], &mut [&mut acc]).unwrap();
    assert_eq!(acc[0], n as f32);
}

fn unary_program(n: usize, f: impl Fn(UOp) -> UOp) -> UOp {
    let (x, out) = (buffer(0, DType::F32, n), buffer(1, DType::F32, n));
    let i = range(n, 0, AxisType::Thread);
    sink(&[out.index(&i).store(f(x.index(&i).load())).end(&[i])])
}

#[test]
fn exp2_is_accurate_and_handles_special_values() {
    // Dense sample of [-126, 126]: relative error against f64 exp2.
    let n = 1 << 18;
    let xs: Vec<f32> = (0..n).map(|k| -126.0 + 252.0 * k as f32 / n as f32).collect();
    let prg = Program::compile(&unary_program(n, |x| x.exp2()), "exp2").unwrap();
    let mut out = vec![0.0f32; n];
    prg.run_f32(&[&xs], &mut [&mut out]).unwrap();
    let worst = xs
        .iter()
        .zip(&out)
        .map(|(x, y)| {
            let exact = (*x as f64).exp2();
            ((*y as f64) - exact).abs() / exact
        })
        .fold(0.0, f64::max);
    // Measured 7.65e-8 (about 0.64 ulp); 2e-7 leaves room for FMA vs non-FMA hosts.
    println!("exp2: max relative error {worst:.2e} over [-126, 126]");
    assert!(worst < 2e-7, "max relative error {worst:e}");

    // Powers of two are exact down to the smallest subnormal, 2^-149; 2^-150 is the tie
    // halfway to 0, which rounds to even (0).
    let special = [f32::NEG_INFINITY, -1000.0, -150.0, -149.0, -127.0, 0.0, 1.0, f32::NAN];
    let prg = Program::compile(&unary_program(special.len(), |x| x.exp2()), "exp2s").unwrap();
    let mut out = vec![0.0f32; special.len()];
    prg.run_f32(&[&special], &mut [&mut out]).unwrap();
    assert_eq!(&out[..7], &[0.0, 0.0, 0.0, f32::from_bits(1), 2f32.powi(-127), 1.0, 2.0]);
    assert!(out[7].is_nan());
}

/// Runs `program` with the JIT and with the interpreter on the same inputs.
fn both_ways(program: &UOp, inputs: Vec<HostBuffer>) -> (Vec<HostBuffer>, Vec<HostBuffer>) {
    let prg = Program::compile(program, "diff").unwrap();
    let mut jit_bufs = inputs.clone();
    {
        let mut args: Vec<Arg<'_>> = Vec::new();
        for (b, spec) in jit_bufs.iter_mut().zip(prg.buffers()) {
            args.push(if spec.written { Arg::from(b) } else { Arg::from(&*b) });
        }
        prg.run(&mut args).unwrap();
    }
    let mut ref_bufs = inputs;
    interp::run(program, &mut ref_bufs, Precision::Native).unwrap();
    (jit_bufs, ref_bufs)
}

#[test]
fn integer_semantics_match_the_interpreter() {
    let n = 9;
    let (a, b) = (buffer(0, DType::I64, n), buffer(1, DType::I64, n));
    let (q, r, f) = (buffer(2, DType::I64, n), buffer(3, DType::I64, n), buffer(4, DType::F32, n));
    let i = range(n, 0, AxisType::Loop);
    let (x, y) = (a.index(&i).load(), b.index(&i).load());
    let p = sink(&[
        q.index(&i).store(x.idiv(&y)).end(&[i.clone()]),
        r.index(&i).store(x.modulo(&y)).end(&[i.clone()]),
        f.index(&i).store(x.lt(&y).where_(x.cast(DType::F32), y.cast(DType::F32))).end(&[i.clone()]),
    ]);
    let xs = vec![7, -7, 7, -7, 5, 0, i64::MIN, 100, -1];
    let ys = vec![2, 2, -2, -2, 0, 3, -1, 7, 0];
    let inputs = vec![
        HostBuffer::I64(xs),
        HostBuffer::I64(ys),
        HostBuffer::zeros(DType::I64, n),
        HostBuffer::zeros(DType::I64, n),
        HostBuffer::zeros(DType::F32, n),
    ];
    let (jit, reference) = both_ways(&p, inputs);
    assert_eq!(jit, reference);
}

#[test]
fn casts_match_the_interpreter() {
    let vals = [f32::NAN, 1e20, -1e20, 2.7, -2.7, 0.0, f32::INFINITY];
    let n = vals.len();
    let x = buffer(0, DType::F32, n);
    let (o32, o64, ob) = (buffer(1, DType::I32, n), buffer(2, DType::I64, n), buffer(3, DType::F32, n));
    let i = range(n, 0, AxisType::Loop);
    let v = x.index(&i).load();
    let p = sink(&[
        o32.index(&i).store(v.cast(DType::I32)).end(&[i.clone()]),
        o64.index(&i).store(v.cast(DType::I64)).end(&[i.clone()]),
        ob.index(&i).store(v.cast(DType::Bool).cast(DType::F32)).end(&[i.clone()]),
    ]);
    let inputs = vec![
        HostBuffer::F32(vals.to_vec()),
        HostBuffer::zeros(DType::I32, n),
        HostBuffer::zeros(DType::I64, n),
        HostBuffer::zeros(DType::F32, n),
    ];
    let (jit, reference) = both_ways(&p, inputs);
    // Debug formatting compares NaN payload-insensitively but NaN == NaN.
    assert_eq!(format!("{jit:?}"), format!("{reference:?}"));
}

#[test]
fn program_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Program>();
}

/// out[i] = sum_j a[i*m + j] * b[j] and mx[i] = max_j a[i*m + j], rows threaded.
fn matvec_and_rowmax(n: usize, m: usize) -> UOp {
    let (a, b) = (buffer(0, DType::F32, n * m), buffer(1, DType::F32, m));
    let (out, mx) = (buffer(2, DType::F32, n), buffer(3, DType::F32, n));
    let (s, t) = (alloc(0, DType::F32, 1), alloc(1, DType::F32, 1));
    let i = range(n, 0, AxisType::Thread);
    let j = range(m, 1, AxisType::Reduce);
    let (si, ti) = (s.after(&[i.clone()]), t.after(&[i.clone()]));
    let (init_s, init_t) = (si.index(0).store(0.0f32), ti.index(0).store(f32c(f32::NEG_INFINITY)));
    let (sj, tj) = (si.after(&[init_s, j.clone()]), ti.after(&[init_t, j.clone()]));
    let x = a.index(&i * m + &j).load();
    let up_s = sj.index(0).store(sj.index(0).load() + &x * b.index(&j).load());
    let up_t = tj.index(0).store(tj.index(0).load().maximum(&x));
    let done = sink(&[up_s, up_t]).end(&[j]);
    let st = out.index(&i).store(si.after(&[done.clone()]).index(0).load());
    let st2 = mx.index(&i).store(ti.after(&[done]).index(0).load());
    sink(&[sink(&[st, st2]).end(&[i])])
}

#[test]
fn innermost_f32_loops_vectorize_with_tails() {
    for m in [3usize, 4, 8, 37, 64] {
        let n = 5;
        let prg = Program::compile(&matvec_and_rowmax(n, m), "mv").unwrap();
        // Vectorization is decided while lowering to Cranelift (the loop IR stays scalar), so
        // the CLIF is the only place it shows.
        assert_eq!(prg.clif().contains("f32x4"), m >= 4, "m={m}: F32X4 code iff a vector step fits");
        assert!(!prg.clif().contains("call"), "no per-element calls");
        let a: Vec<f32> = (0..n * m).map(|x| ((x * 37) % 11) as f32 - 5.0).collect();
        let b: Vec<f32> = (0..m).map(|x| (x % 3) as f32 * 0.5).collect();
        let (mut out, mut mx) = (vec![0.0f32; n], vec![0.0f32; n]);
        prg.run_f32(&[&a, &b], &mut [&mut out, &mut mx]).unwrap();
        for r in 0..n {
            let row = &a[r * m..(r + 1) * m];
            let dot: f32 = row.iter().zip(&b).map(|(x, y)| x * y).sum();
            let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            // small integers and halves: every order of summation is exact
            assert_eq!(out[r], dot, "m={m} row {r}");
            assert_eq!(mx[r], max, "m={m} row {r}");
        }
    }
}

#[test]
fn fma_peak_measures_something_positive() {
    // Only that it compiles, runs and reports a plausible number: speed is for benchmarks.
    let g = uopc_jit::peak::fma_peak_gflops(10_000, 1).unwrap();
    assert!(g.is_finite() && g > 0.1, "{g}");
}

#[test]
fn integer_constants_must_fit_their_dtype() {
    // An i32 constant holding 2^32 would be materialized as 0: a division by it must be refused
    // (found by fuzzing: it reached the hardware divide and trapped).
    let (a, out) = (buffer(0, DType::I32, 4), buffer(1, DType::I32, 4));
    let i = range(4, 0, AxisType::Loop);
    let big = UOp::new(Op::Const(ConstValue::Int(1 << 32)), DType::I32, vec![]);
    let p = sink(&[out.index(&i).store(a.index(&i).load().idiv(&big)).end(&[i])]);
    match Program::compile(&p, "wide_const") {
        Err(JitError::Ir(e)) => assert_eq!(e.kind, IrErrorKind::DType, "{e}"),
        other => panic!("expected a dtype error, got {other:?}"),
    }
}

/// `C = A · B + bias[row]` (M x K times K x N) as a register tile: `rows` x `cols` unrolled
/// copies, each with its own accumulator, sharing one reduce loop; `order` permutes the copies
/// in the body (packing must not depend on it).
fn gemm_tile(
    m: usize,
    n: usize,
    k: usize,
    rows: usize,
    cols: usize,
    order: &[usize],
    with_bias: bool,
) -> UOp {
    let (a, b, bias) = (buffer(0, DType::F32, m * k), buffer(1, DType::F32, k * n), buffer(3, DType::F32, m));
    let c = buffer(2, DType::F32, m * n);
    let i = range(m / rows, 0, AxisType::Thread);
    let j = range(n / cols, 1, AxisType::Loop);
    let kk = range(k, 2, AxisType::Reduce);
    let mut updates = Vec::new();
    let mut views = Vec::new();
    for (slot, &copy) in order.iter().enumerate() {
        let (r, col) = (copy / cols, copy % cols);
        let acc = alloc(slot, DType::F32, 1).after(&[i.clone(), j.clone()]);
        let init = acc.index(0).store(0.0f32);
        let inner = acc.after(&[init, kk.clone()]);
        let row = &i * rows + r;
        let mut x = a.index(&row * k + &kk).load() * b.index(&kk * n + &j * cols + col).load();
        if with_bias {
            x = x + bias.index(&row).load();
        }
        updates.push(inner.index(0).store(inner.index(0).load() + x));
        views.push((acc, row, col));
    }
    let done = sink(&updates).end(&[kk]);
    let stores: Vec<UOp> = views
        .into_iter()
        .map(|(acc, row, col)| {
            c.index(&row * n + &j * cols + col).store(acc.after(&[done.clone()]).index(0).load())
        })
        .collect();
    sink(&[sink(&stores).end(&[j]).end(&[i])])
}

#[test]
fn register_tiles_pack_four_columns_into_one_vector() {
    // (rows, cols, F32X4 packs): each pack replaces four scalar FMAs by one vector FMA
    for (rows, cols, packs) in [(2, 8, 4), (4, 8, 8), (1, 6, 1), (3, 4, 3), (2, 3, 0)] {
        let copies: Vec<usize> = (0..rows * cols).collect();
        let mut shuffled = copies.clone();
        shuffled.reverse();
        shuffled.rotate_left(3);
        for (order, with_bias) in [(copies.clone(), false), (shuffled, false), (copies, true)] {
            let (m, n, k) = (rows * 3, cols * 5, 7);
            let program = gemm_tile(m, n, k, rows, cols, &order, with_bias);
            let prg = Program::compile(&program, "tile").unwrap();
            // Superword packing of the copies is decided while lowering to Cranelift: only
            // the CLIF shows it.
            let clif = prg.clif();
            if packs > 0 {
                // (three columns pack nothing; the reduce loop is vectorized instead)
                // The k = 7 loop body is emitted three times (two per unrolled trip, one tail),
                // each with one FMA per pack and per accumulator left scalar.
                let fmas = clif.lines().filter(|l| l.contains("= fma")).count();
                assert_eq!(fmas, 3 * (rows * cols - 3 * packs), "{rows}x{cols}:\n{clif}");
                // results leave through one vector store per pack
                let vector_stores = clif.lines().filter(|l| is_vector_store(l)).count();
                assert_eq!(vector_stores, packs, "{rows}x{cols}:\n{clif}");
            }
            let a: Vec<f32> = (0..m * k).map(|x| ((x * 37) % 11) as f32 - 5.0).collect();
            let b: Vec<f32> = (0..k * n).map(|x| ((x * 13) % 7) as f32 * 0.5 - 1.5).collect();
            let bias: Vec<f32> = (0..m).map(|x| x as f32 * 0.25).collect();
            let mut inputs = vec![HostBuffer::F32(a), HostBuffer::F32(b), HostBuffer::F32(vec![0.0; m * n])];
            if with_bias {
                inputs.push(HostBuffer::F32(bias));
            }
            let (jit, reference) = both_ways(&program, inputs);
            // small integers, halves and quarters: every summation order is exact
            assert_eq!(jit[2], reference[2], "{rows}x{cols}");
        }
    }
}

#[test]
fn constant_index_terms_become_load_offsets() {
    // out[i] = a[4i] + a[4i+1] + a[4i+2] + a[4i+3]: one address computation for the four
    // loads, whose constant terms ride in the loads' immediate offsets.
    let n = 16;
    let (a, out) = (buffer(0, DType::F32, 4 * n), buffer(1, DType::F32, n));
    let i = range(n, 0, AxisType::Loop);
    let x = |c: i64| a.index(&i * 4 + c).load();
    let p = sink(&[out.index(&i).store(x(0) + x(1) + x(2) + x(3)).end(&[i])]);
    let opts = uopc_jit::JitOptions { vectorize: false, ..uopc_jit::JitOptions::default() };
    let prg = Program::compile_with(&p, "offsets", &opts).unwrap();
    // Folding constant terms into immediate offsets happens in address lowering: CLIF only.
    let clif = prg.clif();
    for offset in ["+4", "+8", "+12"] {
        assert!(clif.lines().any(|l| l.contains("load.f32") && l.ends_with(offset)), "{offset}: {clif}");
    }
    let input: Vec<f32> = (0..4 * n).map(|k| k as f32).collect();
    let mut got = vec![0.0f32; n];
    prg.run_f32(&[&input], &mut [&mut got]).unwrap();
    let want: Vec<f32> = (0..n).map(|k| (16 * k + 6) as f32).collect();
    assert_eq!(got, want);
}

/// A CLIF line storing an F32X4 (printed `store notrap v..` or, when Cranelift spells out the
/// type, `store.f32x4 notrap v..`).
fn is_vector_store(line: &str) -> bool {
    let l = line.trim_start();
    l.starts_with("store notrap v") || l.starts_with("store.f32x4 ")
}

#[test]
fn max_propagates_nan_in_scalar_vector_and_reduction_code() {
    // Row maxima (vectorized for m >= 4, with scalar tails) with a NaN at the start, in the
    // vector body, in the tail, or nowhere; and an elementwise MAX with NaN on either side.
    for m in [3usize, 8, 37, 64] {
        let n = 4;
        let mut a: Vec<f32> = (0..n * m).map(|x| ((x * 37) % 11) as f32 - 5.0).collect();
        let nan_at = [Some(0), Some(m / 2), Some(m - 1), None];
        for (r, at) in nan_at.iter().enumerate() {
            if let Some(c) = at {
                a[r * m + c] = f32::NAN;
            }
        }
        let inputs = vec![
            HostBuffer::F32(a.clone()),
            HostBuffer::F32(vec![1.0; m]),
            HostBuffer::zeros(DType::F32, n),
            HostBuffer::zeros(DType::F32, n),
        ];
        let (jit, reference) = both_ways(&matvec_and_rowmax(n, m), inputs);
        assert_eq!(format!("{jit:?}"), format!("{reference:?}"), "m={m}: JIT and interpreter agree");
        let HostBuffer::F32(mx) = &jit[3] else { unreachable!() };
        for (r, at) in nan_at.iter().enumerate() {
            assert_eq!(mx[r].is_nan(), at.is_some(), "m={m} row {r}: {}", mx[r]);
        }
    }
    let x = [f32::NAN, -1.0, 2.0, f32::NAN, 0.0, -0.0, f32::NEG_INFINITY, 3.0, f32::NAN];
    let y = [1.0, f32::NAN, f32::NAN, f32::NAN, -0.0, 0.0, -5.0, f32::INFINITY, -1.0];
    let n = x.len();
    let (a, b, out) = (buffer(0, DType::F32, n), buffer(1, DType::F32, n), buffer(2, DType::F32, n));
    let i = range(n, 0, AxisType::Loop);
    let p = sink(&[out.index(&i).store(a.index(&i).load().maximum(b.index(&i).load())).end(&[i])]);
    let inputs =
        vec![HostBuffer::F32(x.to_vec()), HostBuffer::F32(y.to_vec()), HostBuffer::zeros(DType::F32, n)];
    let (jit, reference) = both_ways(&p, inputs);
    let HostBuffer::F32(got) = &jit[2] else { unreachable!() };
    let want = [f32::NAN, f32::NAN, f32::NAN, f32::NAN, -0.0, 0.0, -5.0, f32::INFINITY, f32::NAN];
    for k in 0..n {
        let same = (got[k].is_nan() && want[k].is_nan()) || got[k].to_bits() == want[k].to_bits();
        assert!(same, "max({}, {}) = {} (want {})", x[k], y[k], got[k], want[k]);
    }
    assert_eq!(format!("{jit:?}"), format!("{reference:?}"));
}
