//! Differential tests: random loop programs run with the JIT and with the reference interpreter.
//!
//! Exact programs (all ops, special values) must match a strict build (no FMA contraction, no
//! reassociation) bit for bit, NaN equal to NaN. Smooth programs (continuous float paths, f32
//! EXP2) must match within `64 * f32::EPSILON * (1 + sum_len) * magnitude`, both for the strict
//! and the default build, where `magnitude` comes from the program's Magnitude twin run in f64 and
//! `sum_len` is the longest chain of nested reduction trips. Mutated programs must be rejected
//! or run correctly, never panic.
//!
//! `UOPC_FUZZ_CASES` sets the number of programs (default 1,000) and `UOPC_FUZZ_SEED` the first
//! seed; a failure prints the seed and the program.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;
use uopc_ir::interp::Precision;
use uopc_ir::*;
use uopc_jit::{JitOptions, Program};
use uopc_testgen::{Options, Rng};
use uopc_testgen_jit as harness;
use uopc_testgen_jit::{MutantStats, check_case, check_mutant, profile_of};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Runs `check` for `cases` seeds on all cores, and fails listing every failing seed.
fn for_seeds(what: &str, cases: u64, salt: u64, check: impl Fn(u64) -> Result<(), String> + Sync) {
    let first = env_u64("UOPC_FUZZ_SEED", 0);
    let t0 = Instant::now();
    let failures = std::sync::Mutex::new(Vec::new());
    let next = std::sync::atomic::AtomicU64::new(0);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).min(8);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if k >= cases {
                        break;
                    }
                    let seed = first + k;
                    let outcome = catch_unwind(AssertUnwindSafe(|| check(seed ^ salt)))
                        .unwrap_or_else(|p| Err(format!("panicked: {}", panic_message(&*p))));
                    if let Err(e) = outcome {
                        failures.lock().unwrap().push(format!("{what} seed {seed}: {e}"));
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    let dt = t0.elapsed().as_secs_f64();
    eprintln!(
        "{what}: {cases} programs in {dt:.1} s ({:.0}/s), {} failures",
        cases as f64 / dt,
        failures.len()
    );
    if std::env::var_os("UOPC_FUZZ_VERBOSE").is_some() {
        for f in &failures {
            eprintln!("{}", f.lines().next().unwrap_or(""));
        }
    }
    if !failures.is_empty() {
        let shown: Vec<&String> = failures.iter().take(5).collect();
        panic!(
            "{} of {cases} {what} cases failed; first ones:\n{}",
            failures.len(),
            shown.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n\n")
        );
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(non-string panic)".to_string())
}

/// Every pattern the generator knows, including those that once hit the bugs pinned below.
fn options() -> Options {
    Options::default()
}

#[test]
fn random_programs_match_the_interpreter() {
    let cases = env_u64("UOPC_FUZZ_CASES", 1000);
    for_seeds("differential", cases, 0, |seed| {
        check_case(Rng::new(seed), profile_of(seed), options()).map(|_| ())
    });
}

#[test]
fn mutated_programs_are_rejected_or_run_correctly() {
    let cases = env_u64("UOPC_FUZZ_CASES", 1000);
    let stats = std::sync::Mutex::new(MutantStats::default());
    for_seeds("mutant", cases, 0x5eed_0000_0000, |seed| {
        let mut s = MutantStats::default();
        let r = check_mutant(Rng::new(seed), &mut s, false);
        let mut t = stats.lock().unwrap();
        t.rejected += s.rejected;
        t.agreed += s.agreed;
        t.skipped += s.skipped;
        r
    });
    eprintln!("mutants: {:?}", stats.lock().unwrap());
}
// Minimal reproducers found by the differential tests and fuzzing.

/// Runs `program` with the strict JIT and with the interpreter; returns both results.
fn jit_and_interp(
    program: &UOp,
    inputs: Vec<HostBuffer>,
) -> (Result<Vec<HostBuffer>, String>, Vec<HostBuffer>) {
    let want = harness::run_interp(program, &inputs, Precision::Native).expect("the interpreter runs it");
    let got = Program::compile_with(program, "bug", &harness::strict_options())
        .map_err(|e| e.to_string())
        .and_then(|p| harness::run_jit(&p, &inputs));
    (got, want)
}

/// A load of memory the loop writes, inside the loop only through a range of one trip:
/// simplification folds that range out of its index, and the JIT must still read it in every
/// iteration of the enclosing loop (iteration 1 reads what iteration 0 stored), as the
/// interpreter does. A store that does not depend on it must still come after it.
#[test]
fn load_of_written_memory_stays_in_the_loop_of_a_folded_range() {
    let (b, out) = (buffer(0, DType::F32, 4), buffer(1, DType::F32, 3));
    let r0 = range(3, 0, AxisType::Loop);
    let r1 = range(1, 1, AxisType::Loop);
    let x = b.index(&r1 * 2).load();
    let body = sink(&[b.index(&r0 + &r1).store(&x + 1.0f32), out.index(&r0 + &r1).store(x)]);
    let p = sink(&[body.end(&[r1]).end(&[r0])]);
    let inputs = vec![HostBuffer::F32(vec![10.0, 20.0, 30.0, 40.0]), HostBuffer::zeros(DType::F32, 3)];
    let (got, want) = jit_and_interp(&p, inputs);
    assert_eq!(
        want,
        vec![HostBuffer::F32(vec![11.0, 12.0, 12.0, 40.0]), HostBuffer::F32(vec![10.0, 11.0, 11.0])]
    );
    assert_eq!(got, Ok(want));
}

#[test]
fn zero_trip_range_does_not_run_its_body() {
    let (a, out, out2) = (buffer(0, DType::F32, 1), buffer(1, DType::F32, 1), buffer(2, DType::F32, 1));
    let r = range(0, 0, AxisType::Loop);
    let st1 = out.index(&r * 2).store(1.0f32);
    let st2 = out2.index(&r).store(a.index(&r).load());
    let p = sink(&[sink(&[st1, st2]).end(&[r])]);
    let inputs =
        vec![HostBuffer::F32(vec![3.0]), HostBuffer::zeros(DType::F32, 1), HostBuffer::zeros(DType::F32, 1)];
    let (got, want) = jit_and_interp(&p, inputs);
    assert_eq!(want[1], HostBuffer::F32(vec![0.0]));
    assert_eq!(got, Ok(want));
}

#[test]
fn range_whose_use_folds_away_compiles() {
    let out = buffer(0, DType::F32, 1);
    let r = range(0, 0, AxisType::Loop);
    let p = sink(&[out.index(&r * 2).store(1.0f32).end(&[r])]);
    let (got, want) = jit_and_interp(&p, vec![HostBuffer::zeros(DType::F32, 1)]);
    assert_eq!(got, Ok(want));
}

#[test]
fn adding_zero_keeps_the_sign_of_zero() {
    let (a, out) = (buffer(0, DType::F32, 1), buffer(1, DType::F32, 1));
    let p = sink(&[out.index(0).store((a.index(0).load() + 0.0f32).recip())]);
    let (got, want) = jit_and_interp(&p, vec![HostBuffer::F32(vec![-0.0]), HostBuffer::zeros(DType::F32, 1)]);
    assert_eq!(want[1], HostBuffer::F32(vec![f32::INFINITY]));
    assert_eq!(got, Ok(want));
}

#[test]
fn compile_of_wrong_arity_is_an_error_not_a_panic() {
    let half_add = UOp::new(Op::Binary(BinaryOp::Add), DType::I64, vec![idx(0)]);
    let p = sink(&[buffer(0, DType::F32, 1).index(half_add).store(1.0f32)]);
    let r = catch_unwind(AssertUnwindSafe(|| Program::compile(&p, "arity").is_err()));
    assert_eq!(r.ok(), Some(true), "compile must return Err");
}

#[test]
fn after_with_another_dtype_is_rejected() {
    let out = buffer(0, DType::F64, 1);
    let acc = alloc(0, DType::F32, 1);
    let view = UOp::new(Op::After, DType::F64, vec![acc]);
    let st = view.index(0).store(2.0f64);
    let p = sink(&[out.index(0).store(view.after(&[st]).index(0).load())]);
    let r = catch_unwind(AssertUnwindSafe(|| Program::compile(&p, "after").is_err()));
    assert_eq!(r.ok(), Some(true), "compile must return Err");
}

#[test]
fn negative_thread_extent_runs_nothing() {
    // The failure is a crash, so the check runs in a child process.
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "negative_thread_extent_child"])
        .env("UOPC_CHILD", "1")
        .status()
        .unwrap();
    assert!(status.success(), "child: {status}");
}

#[test]
#[ignore = "run by negative_thread_extent_runs_nothing"]
fn negative_thread_extent_child() {
    if std::env::var_os("UOPC_CHILD").is_none() {
        return;
    }
    let (a, out) = (buffer(0, DType::F32, 2), buffer(1, DType::F32, 2));
    let t = range(-1, 0, AxisType::Thread);
    let p = sink(&[out.index(&t).store(a.index(&t).load() + 1.0f32).end(&[t])]);
    let inputs = vec![HostBuffer::F32(vec![1.0, 2.0]), HostBuffer::zeros(DType::F32, 2)];
    let r = catch_unwind(AssertUnwindSafe(|| jit_and_interp(&p, inputs)));
    let (got, want) = r.expect("no panic");
    assert_eq!(got, Ok(want));
}

#[test]
fn exp2_f32_is_finite_below_128() {
    // The scale 2^round(x) is added into the exponent bits of 2^f: the top of the range must
    // stay finite (127.5 rounds to n = 128), 128 itself overflows, and below 2^-126 the
    // results are the subnormals they round to.
    let xs = [127.5f32, 127.6, 127.99, 128.0, 1000.0, -126.75, -127.0];
    let (a, out) = (buffer(0, DType::F32, xs.len()), buffer(1, DType::F32, xs.len()));
    let i = range(xs.len(), 0, AxisType::Loop);
    let p = sink(&[out.index(&i).store(a.index(&i).load().exp2()).end(&[i])]);
    for opts in [JitOptions::default(), JitOptions::scalar()] {
        let prg = Program::compile_with(&p, "exp2", &opts).unwrap();
        let got =
            harness::run_jit(&prg, &[HostBuffer::F32(xs.to_vec()), HostBuffer::zeros(DType::F32, xs.len())])
                .unwrap();
        let HostBuffer::F32(v) = &got[1] else { unreachable!() };
        for (x, y) in xs[..3].iter().zip(v) {
            assert!(y.is_finite() && ((*y as f64) / (*x as f64).exp2() - 1.0).abs() < 1e-6, "2^{x} = {y}");
        }
        assert_eq!(v[3..5], [f32::INFINITY, f32::INFINITY]);
        let want = (-126.75f64).exp2();
        assert!(((v[5] as f64) - want).abs() < 2e-7 * want, "2^-126.75 = {}", v[5]);
        assert_eq!(v[6], 2f32.powi(-127));
    }
}

#[test]
fn cast_of_an_integer_constant_rounds_once() {
    let out = buffer(0, DType::F32, 1);
    let big = UOp::new(Op::Const(ConstValue::Int((1 << 60) + (1 << 36) + 1)), DType::I64, vec![]);
    let p = sink(&[out.index(0).store(big.cast(DType::F32))]);
    let (got, want) = jit_and_interp(&p, vec![HostBuffer::zeros(DType::F32, 1)]);
    assert_eq!(want[0], HostBuffer::F32(vec![((1i64 << 60) + (1 << 36) + 1) as f32]));
    assert_eq!(got, Ok(want));
}

#[test]
fn buffer_used_only_in_cancelling_terms_compiles() {
    let (a, out) = (buffer(0, DType::I64, 1), buffer(1, DType::I64, 1));
    let x = a.index(0).load();
    let p = sink(&[out.index(0).store(&x - &x)]);
    let (got, want) = jit_and_interp(&p, vec![HostBuffer::I64(vec![5]), HostBuffer::zeros(DType::I64, 1)]);
    assert_eq!(got, Ok(want));
}

#[test]
fn self_referencing_sum_is_not_split() {
    let (a, out) = (buffer(0, DType::F32, 8), buffer(1, DType::F32, 1));
    let acc = alloc(0, DType::F32, 1);
    let r = range(8, 0, AxisType::Reduce);
    let init = acc.index(0).store(1.0f32);
    let acc_r = acc.after(&[init, r.clone()]);
    let cur = acc_r.index(0).load();
    let upd = acc_r.index(0).store(&cur + (&cur * 0.5f32 + a.index(&r).load())).end(&[r]);
    let p = sink(&[out.index(0).store(acc.after(&[upd]).index(0).load())]);
    let inputs = vec![HostBuffer::F32(vec![0.0; 8]), HostBuffer::zeros(DType::F32, 1)];
    let want = harness::run_interp(&p, &inputs, Precision::Native).unwrap();
    for opts in [JitOptions::default(), JitOptions { vectorize: false, ..JitOptions::default() }] {
        let got = harness::run_jit(&Program::compile_with(&p, "self", &opts).unwrap(), &inputs).unwrap();
        let (HostBuffer::F32(g), HostBuffer::F32(w)) = (&got[1], &want[1]) else { unreachable!() };
        assert!((g[0] / w[0] - 1.0).abs() < 1e-5, "{opts:?}: {} vs {}", g[0], w[0]);
    }
}
