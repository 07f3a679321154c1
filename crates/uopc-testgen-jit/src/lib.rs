//! The differential harness: one generated program (from `uopc-testgen`) run with the JIT and
//! with the reference interpreter, and the outcome judged.
//!
//! Kept apart from the generator because it needs the JIT: the generator then depends on
//! `uopc-ir` alone, so the IR's and the JIT's own integration tests can use it.

#![warn(missing_docs)]

use uopc_ir::interp::{self, InterpError, Precision};
use uopc_ir::{DType, HostBuffer, Linear, Op, Stmt, UOp, print_program, simplify, verify};
use uopc_jit::{Arg, JitOptions, OptLevel, Program};
use uopc_testgen::compare;
use uopc_testgen::mutate::mutate;
use uopc_testgen::program::{Case, Mode, Options, Profile, generate, magnitude_twin};
use uopc_testgen::rng::Rng;

/// JIT options under which results must equal the interpreter's bit for bit (apart from f32
/// EXP2): no FMA contraction, sums in program order, no vector lanes.
pub fn strict_options() -> JitOptions {
    JitOptions::scalar()
}

/// Strict, but vectorized: still bit-exact for programs without float accumulators (lanes only
/// reassociate reductions).
pub fn vector_options() -> JitOptions {
    JitOptions { vectorize: true, ..strict_options() }
}

fn has_float_alloc(program: &UOp) -> bool {
    UOp::toposort(std::slice::from_ref(program))
        .iter()
        .any(|u| matches!(u.op(), Op::Alloc { .. }) && u.dtype().is_float())
}

/// Runs `prg` on copies of `inputs` (written slots passed mutably, per the program's specs).
pub fn run_jit(prg: &Program, inputs: &[HostBuffer]) -> Result<Vec<HostBuffer>, String> {
    run_jit_with_vars(prg, inputs, &[])
}

/// [`run_jit`] with a value per variable slot.
pub fn run_jit_with_vars(
    prg: &Program,
    inputs: &[HostBuffer],
    vars: &[i64],
) -> Result<Vec<HostBuffer>, String> {
    let mut bufs = inputs.to_vec();
    let specs = prg.buffers().to_vec();
    if specs.len() != bufs.len() {
        return Err(format!("the JIT expects {} buffers, the case has {}", specs.len(), bufs.len()));
    }
    let mut args: Vec<Arg<'_>> = Vec::with_capacity(bufs.len());
    for (b, s) in bufs.iter_mut().zip(&specs) {
        args.push(if s.written { Arg::from(b) } else { Arg::from(&*b) });
    }
    prg.run_with_vars(&mut args, vars).map_err(|e| format!("JIT run: {e}"))?;
    drop(args);
    Ok(bufs)
}

/// Runs the interpreter on copies of `inputs`.
pub fn run_interp(
    program: &UOp,
    inputs: &[HostBuffer],
    precision: Precision,
) -> Result<Vec<HostBuffer>, InterpError> {
    run_interp_with_vars(program, inputs, &[], precision)
}

/// [`run_interp`] with a value per variable slot.
pub fn run_interp_with_vars(
    program: &UOp,
    inputs: &[HostBuffer],
    vars: &[i64],
    precision: Precision,
) -> Result<Vec<HostBuffer>, InterpError> {
    let mut bufs = inputs.to_vec();
    interp::run_with_vars(program, &mut bufs, vars, precision)?;
    Ok(bufs)
}

/// The program, pretty-printed, for failure reports.
pub fn describe(program: &UOp) -> String {
    match print_program(program) {
        Ok(s) => s,
        Err(e) => format!("(not printable: {e})\n{}", uopc_ir::print_graph(program)),
    }
}

/// Which program a seed stands for: three in four are Exact.
pub fn profile_of(seed: u64) -> Profile {
    if seed % 4 == 3 { Profile::Smooth } else { Profile::Exact }
}

/// Generates the case for `rng` and checks it: it verifies; the strict JIT build equals the
/// interpreter (bit-exactly for Exact programs, within tolerance for Smooth ones); for Smooth
/// programs the default build is within the magnitude-derived tolerance too. Every run uses the
/// case's variable values.
pub fn check_case(rng: Rng, profile: Profile, opts: Options) -> Result<Case, String> {
    let start = rng.clone();
    let mut rng = rng;
    let case = generate(&mut rng, profile, Mode::Value, opts);
    let fail = |what: String| format!("{what}\n{profile:?} program:\n{}", describe(&case.program));
    verify(&case.program).map_err(|e| fail(format!("generated program does not verify: {e}")))?;
    let vars = &case.vars;
    let want = run_interp_with_vars(&case.program, &case.inputs, vars, Precision::Native)
        .map_err(|e| fail(format!("interpreter: {e}")))?;
    let strict = Program::compile_with(&case.program, "strict", &strict_options())
        .map_err(|e| fail(format!("compile: {e}")))?;
    let got = run_jit_with_vars(&strict, &case.inputs, vars).map_err(fail)?;
    check_whole_writes(&strict, &case.inputs, vars).map_err(fail)?;
    match profile {
        Profile::Exact => {
            compare::exact_with(&got, &want, opts.signed_zeros)
                .map_err(|e| fail(format!("strict JIT vs interpreter: {e}")))?;
            // opt_level=none (what GEMM-like kernels get): Cranelift keeps the emitted order
            let unoptimized = JitOptions { opt_level: OptLevel::None, ..strict_options() };
            let none = Program::compile_with(&case.program, "none", &unoptimized)
                .map_err(|e| fail(format!("compile: {e}")))?;
            let got = run_jit_with_vars(&none, &case.inputs, vars).map_err(fail)?;
            compare::exact_with(&got, &want, opts.signed_zeros)
                .map_err(|e| fail(format!("opt_level=none JIT vs interpreter: {e}")))?;
            if !has_float_alloc(&case.program) {
                let vec = Program::compile_with(&case.program, "vector", &vector_options())
                    .map_err(|e| fail(format!("compile: {e}")))?;
                let got = run_jit_with_vars(&vec, &case.inputs, vars).map_err(fail)?;
                compare::exact_with(&got, &want, opts.signed_zeros)
                    .map_err(|e| fail(format!("vectorized JIT vs interpreter: {e}")))?;
            }
        }
        Profile::Smooth => {
            let twin = magnitude_twin(&start, opts);
            let mag = run_interp_with_vars(&twin, &case.inputs, vars, Precision::F64)
                .map_err(|e| fail(format!("magnitude twin: {e}\n{}", describe(&twin))))?;
            compare::within(&got, &want, &mag, case.sum_len, compare::SMOOTH_UNITS)
                .map_err(|e| fail(format!("strict JIT vs interpreter: {e}")))?;
            let fast = Program::compile(&case.program, "fast").map_err(|e| fail(format!("compile: {e}")))?;
            let got = run_jit_with_vars(&fast, &case.inputs, vars).map_err(fail)?;
            compare::within(&got, &want, &mag, case.sum_len, compare::SMOOTH_UNITS)
                .map_err(|e| fail(format!("default JIT vs interpreter: {e}")))?;
        }
    }
    Ok(case)
}

/// Bits no computation produces (a NaN with a payload arithmetic never makes): an element
/// still holding them after a run was not written.
const NOT_WRITTEN: u32 = 0x7fa1_d0e5;

/// Checks the promise behind uninitialized outputs: for every f32 slot the compiled program
/// says it writes whole ([`Program::writes_whole`]), a run with that slot filled with a NaN
/// payload no arithmetic makes overwrites every element, whatever the variables (empty loops,
/// variables at their bounds).
pub fn check_whole_writes(prg: &Program, inputs: &[HostBuffer], vars: &[i64]) -> Result<(), String> {
    let whole: Vec<usize> = (0..inputs.len())
        .filter(|&slot| prg.writes_whole(slot) && matches!(inputs[slot], HostBuffer::F32(_)))
        .collect();
    if whole.is_empty() {
        return Ok(());
    }
    let mut poisoned = inputs.to_vec();
    for &slot in &whole {
        if let HostBuffer::F32(v) = &mut poisoned[slot] {
            v.fill(f32::from_bits(NOT_WRITTEN));
        }
    }
    let after = run_jit_with_vars(prg, &poisoned, vars)?;
    for &slot in &whole {
        if let HostBuffer::F32(v) = &after[slot]
            && let Some(i) = v.iter().position(|x| x.to_bits() == NOT_WRITTEN)
        {
            return Err(format!(
                "slot {slot} is judged written whole, but element {i} of {} was not written (vars {vars:?})",
                v.len()
            ));
        }
    }
    Ok(())
}

/// Loop iterations a linearized program runs, saturating (ends bounded by their `vmax`).
fn iterations(lin: &Linear) -> u64 {
    fn go(body: &[Stmt], mult: u64) -> u64 {
        let mut total = mult;
        for s in body {
            if let Stmt::Loop { range, body } = s {
                let trips = range.src().first().map_or(0, |e| e.vmax().max(0) as u64);
                total = total.saturating_add(go(body, mult.saturating_mul(trips)));
            }
        }
        total
    }
    go(&lin.root, 1)
}

/// Buffers matching the BUFFER nodes of `program`, filled from `like` where slot, dtype and
/// length agree, zeros otherwise; None when some buffer is too large to allocate for a test.
fn buffers_for(program: &UOp, like: &[HostBuffer]) -> Option<Vec<HostBuffer>> {
    let mut specs: Vec<(usize, DType, usize)> = UOp::toposort(std::slice::from_ref(program))
        .iter()
        .filter_map(|u| match u.op() {
            Op::Buffer { slot, len } => Some((slot.index(), u.dtype(), *len)),
            _ => None,
        })
        .collect();
    specs.sort();
    specs.dedup();
    let mut out = Vec::new();
    for (slot, d, len) in specs {
        if len > 1 << 16 {
            return None;
        }
        out.push(match like.get(slot) {
            Some(b) if b.dtype() == d && b.len() == len => b.clone(),
            _ => HostBuffer::zeros(d, len),
        });
    }
    Some(out)
}

/// True when the program computes an f32 EXP2 (the one op where the JIT and the interpreter
/// legitimately differ in the last bits).
fn has_f32_exp2(program: &UOp) -> bool {
    UOp::toposort(std::slice::from_ref(program))
        .iter()
        .any(|u| matches!(u.op(), Op::Unary(uopc_ir::UnaryOp::Exp2)) && u.dtype() == DType::F32)
}

/// What happened to one mutant.
#[derive(Clone, Copy, Debug, Default)]
pub struct MutantStats {
    /// The JIT refused it.
    pub rejected: usize,
    /// Both ran it and agreed.
    pub agreed: usize,
    /// Compiled but not run (too large, or no oracle).
    pub skipped: usize,
}

/// Mutants that reach bugs pinned by ignored tests in the JIT's differential tests: ones that
/// fail verification (the JIT simplifies before verifying, and simplify panics on bad arities),
/// AFTERs whose dtype differs from their view's, and ranges that may run zero times while all
/// their uses fold to constants.
pub fn hits_known_bug(m: &UOp) -> bool {
    verify(m).is_err()
        || UOp::toposort(std::slice::from_ref(m)).iter().any(|u| match u.op() {
            Op::After => u.src().first().is_some_and(|v| v.dtype() != u.dtype()),
            Op::Range { .. } => u.vmax() == 0 && u.src().first().is_some_and(|e| e.vmin() <= 0),
            _ => false,
        })
}

/// Damages the case of `rng` with 1 to 3 mutations, then requires: compiling and interpreting
/// return (never panic); a program the JIT accepts is memory-safe to run, which the
/// bounds-checking interpreter confirms before the JIT runs it; when both run, results agree.
/// With `avoid_known_bugs`, mutants for which [`hits_known_bug`] holds are only counted.
pub fn check_mutant(rng: Rng, stats: &mut MutantStats, avoid_known_bugs: bool) -> Result<(), String> {
    let mut rng = rng;
    let case = generate(&mut rng, Profile::Exact, Mode::Value, Options::default());
    let n = 1 + rng.below(3) as usize;
    let m = mutate(&case.program, &mut rng, n);
    if avoid_known_bugs && hits_known_bug(&m) {
        stats.skipped += 1;
        return Ok(());
    }
    let fail = |what: String| format!("{what}\nmutant:\n{}", uopc_ir::print_graph(&m));
    let compiled = Program::compile_with(&m, "mutant", &strict_options());
    let raw = verify(&m);
    let Ok(prg) = compiled else {
        // Exercise the interpreter's own checks too (it must not panic either).
        if let (Ok(lin), Some(bufs)) = (&raw, buffers_for(&m, &case.inputs))
            && iterations(lin) < 200_000
        {
            let _ = run_interp_with_vars(&m, &bufs, &case.vars, Precision::Native);
        }
        stats.rejected += 1;
        return Ok(());
    };
    // The JIT accepted it: the oracle is the raw program if it verifies, else the simplified one.
    let oracle = if raw.is_ok() { m.clone() } else { simplify(&m) };
    let lin = verify(&oracle)
        .map_err(|e| fail(format!("the JIT accepted a program whose simplified form fails verify: {e}")))?;
    let Some(bufs) = buffers_for(&oracle, &case.inputs) else {
        stats.skipped += 1;
        return Ok(());
    };
    if iterations(&lin) > 200_000
        || lin.allocs.iter().any(|a| matches!(a.op(), Op::Alloc { len, .. } if *len > 1 << 16))
    {
        stats.skipped += 1;
        return Ok(());
    }
    // A mutant may have lost or changed a variable: without a value for each, no oracle.
    if prg.vars().len() != case.vars.len() || prg.vars().iter().zip(&case.vars).any(|(s, &v)| !s.admits(v)) {
        stats.skipped += 1;
        return Ok(());
    }
    let want = match run_interp_with_vars(&oracle, &bufs, &case.vars, Precision::Native) {
        Ok(w) => w,
        Err(InterpError::Uninitialized { .. }) => {
            // Reading never-written locals is garbage but memory-safe in the JIT; nothing to compare.
            stats.skipped += 1;
            return Ok(());
        }
        Err(e @ InterpError::OutOfBounds { .. }) => {
            return Err(fail(format!("the JIT accepted a program that accesses memory out of bounds: {e}")));
        }
        Err(e) => {
            // Arguments the JIT derives differently (e.g. a buffer simplified away): no oracle.
            let _ = e;
            stats.skipped += 1;
            return Ok(());
        }
    };
    if prg.buffers().len() != bufs.len()
        || prg.buffers().iter().zip(&bufs).any(|(s, b)| s.dtype != b.dtype() || s.len != b.len())
    {
        stats.skipped += 1;
        return Ok(());
    }
    let got = run_jit_with_vars(&prg, &bufs, &case.vars).map_err(fail)?;
    if has_f32_exp2(&oracle) {
        stats.skipped += 1;
        return Ok(());
    }
    compare::exact(&got, &want)
        .map_err(|e| fail(format!("mutant: strict JIT vs interpreter: {e}\n{}", describe(&oracle))))?;
    stats.agreed += 1;
    Ok(())
}
