//! Loops whose f32 body selects by a compare of the loop variable with a loop-invariant
//! integer (a one-hot's `column == target`, a prefix `column < end`) vectorize, each lane
//! comparing its own iteration, and agree with the interpreter bit for bit: targets inside the
//! row, at its ends, before it, past it, and at every lane position of a vector step.

use uopc_ir::interp::{self, Precision};
use uopc_ir::*;
use uopc_jit::{Arg, BufRef, JitOptions, OptLevel, Program};

const ROWS: usize = 13;
const COLS: usize = 37;

/// Per row `i` with target `t = targets[i]`: `out = (j == t ? -x : 0) + (j < t ? x : 0) + (t < j
/// ? 2x : 0)`, all three compares against the loop variable `j`.
fn program() -> UOp {
    let (x, t, out) =
        (buffer(0, DType::F32, ROWS * COLS), buffer(1, DType::I64, ROWS), buffer(2, DType::F32, ROWS * COLS));
    let i = range(ROWS, 0, AxisType::Loop);
    let j = range(COLS, 1, AxisType::Loop);
    let target = t.index(&i).load();
    let v = x.index(&i * COLS as i64 + &j).load();
    let b = |v: bool| UOp::new(Op::Const(ConstValue::Bool(v)), DType::Bool, vec![]);
    let hot = j.ne(&target).where_(b(false), b(true));
    let before = j.lt(&target);
    let after = target.lt(&j);
    let value = hot.where_(-&v, 0.0f32) + before.where_(&v, 0.0f32) + after.where_(&v * 2.0f32, 0.0f32);
    sink(&[out.index(&i * COLS as i64 + &j).store(value).end(&[j, i])])
}

/// `program` (buffers: `x`, f32 `ROWS x COLS` of `sin(0.37 k)`; `targets`, i64 per row; the f32
/// output) compiled at both opt levels: its CLIF contains every one of `marks` (the loop is
/// vectorized), and its output equals the interpreter's bit for bit.
fn vectorizes_and_matches_the_interpreter(program: &UOp, name: &str, targets: &[i64], marks: &[&str]) {
    let x: Vec<f32> = (0..ROWS * COLS).map(|k| (k as f32 * 0.37).sin()).collect();
    let mut want = vec![
        HostBuffer::F32(x.clone()),
        HostBuffer::I64(targets.to_vec()),
        HostBuffer::F32(vec![0.0; ROWS * COLS]),
    ];
    interp::run(program, &mut want, Precision::Native).unwrap();
    let HostBuffer::F32(want) = &want[2] else { unreachable!("f32 output") };
    for opt_level in [OptLevel::None, OptLevel::Speed] {
        let opts = JitOptions { opt_level, ..JitOptions::default() };
        let prg = Program::compile_with(program, name, &opts).unwrap();
        let clif = prg.clif();
        assert!(
            marks.iter().all(|m| clif.contains(m)),
            "{opt_level:?}: the loop is not vectorized\n{}\n{clif}",
            prg.loop_ir()
        );
        let mut got = vec![0.0f32; ROWS * COLS];
        prg.run(&mut [Arg::Read(BufRef::F32(&x)), Arg::Read(BufRef::I64(targets)), Arg::WriteF32(&mut got)])
            .unwrap();
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{opt_level:?} element ({}, {}): {g} vs {w}",
                k / COLS,
                k % COLS
            );
        }
    }
}

#[test]
fn compares_of_the_loop_variable_vectorize_and_match_the_interpreter() {
    // before the row, its first lanes, a lane of a middle step, the last element, past the row,
    // and values whose difference from an index overflows i32 (or whose i32 part is in range)
    let targets: Vec<i64> =
        vec![-5, 0, 1, 2, 3, 17, 35, 36, 1000, i64::MIN, i64::MAX, (1 << 32) + 3, -(1 << 32) + 3];
    vectorizes_and_matches_the_interpreter(&program(), "lane_compares", &targets, &["i32x4"]);
}

/// Per row `i` of a `ROWS x COLS` buffer, its last `min(max(5 i - 8, 0), COLS)` elements (a
/// trip count that changes with the enclosing loop) set to `-inf` counting down from the row's
/// end, as a mask loop writes a row's masked suffix: the constant stores vectorize (one vector
/// per four elements, placed at the lowest), the tail runs scalar, and nothing outside the
/// suffix changes, for suffixes of every length modulo four, empty and whole.
#[test]
fn a_constant_stored_counting_down_vectorizes_and_stays_in_its_suffix() {
    let out = buffer(0, DType::F32, ROWS * COLS);
    let i = range(ROWS, 0, AxisType::Loop);
    let wanted = (&i * 5i64 - 8i64).maximum(0i64);
    // min(wanted, COLS), as -max(-wanted, -COLS)
    let len = -(-&wanted).maximum(-(COLS as i64));
    let j = range(&len, 1, AxisType::Loop);
    let at = &i * COLS as i64 + (COLS as i64 - 1) - &j;
    let program = sink(&[out.index(at).store(f32::NEG_INFINITY).end(&[j, i])]);
    let init: Vec<f32> = (0..ROWS * COLS).map(|k| k as f32).collect();
    let mut want = vec![HostBuffer::F32(init.clone())];
    interp::run(&program, &mut want, Precision::Native).unwrap();
    let HostBuffer::F32(want) = &want[0] else { unreachable!("f32 output") };
    assert!(want.iter().any(|x| x.is_infinite()) && want.iter().any(|x| x.is_finite()));
    for opt_level in [OptLevel::None, OptLevel::Speed] {
        let opts = JitOptions { opt_level, ..JitOptions::default() };
        let prg = Program::compile_with(&program, "suffix_fill", &opts).unwrap();
        assert!(
            prg.clif().contains("splat.f32x4"),
            "{opt_level:?}: the loop is not vectorized\n{}",
            prg.clif()
        );
        let mut got = init.clone();
        prg.run(&mut [Arg::WriteF32(&mut got)]).unwrap();
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{opt_level:?} element ({}, {})", k / COLS, k % COLS);
        }
    }
}

/// Row sums over a prefix whose length follows the enclosing loop and stays under 16: the
/// vectorized loop takes three vector copies (12 floats a step, not a power of two), and its
/// main loop must stop at the last whole step of each row's count, leaving the rest to the
/// scalar tail, never summing past the prefix.
#[test]
fn a_runtime_trip_count_rounds_down_to_three_vector_copies() {
    const W: usize = 16;
    let (a, out) = (buffer(0, DType::F32, ROWS * W), buffer(1, DType::F32, ROWS));
    let i = range(ROWS, 0, AxisType::Loop);
    // min(i + 2, 15): 2 ..= 14 elements, every remainder modulo 12 and 4.
    let len = -(-(&i + 2i64)).maximum(-15i64);
    let acc = alloc(0, DType::F32, 1).after(std::slice::from_ref(&i));
    let init = acc.index(0).store(0.0f32);
    let j = range(&len, 1, AxisType::Reduce);
    let inner = acc.after(&[init, j.clone()]);
    let sum = inner.index(0).store(inner.index(0).load() + a.index(&i * W as i64 + &j).load()).end(&[j]);
    let program = sink(&[out.index(&i).store(acc.after(&[sum]).index(0).load()).end(&[i])]);
    // Small integers: every order of summation is exact.
    let x: Vec<f32> = (0..ROWS * W).map(|k| (k % 7) as f32).collect();
    let mut want = vec![HostBuffer::F32(x.clone()), HostBuffer::F32(vec![0.0; ROWS])];
    interp::run(&program, &mut want, Precision::Native).unwrap();
    let HostBuffer::F32(want) = &want[1] else { unreachable!("f32 output") };
    for opt_level in [OptLevel::None, OptLevel::Speed] {
        let opts = JitOptions { opt_level, ..JitOptions::default() };
        let prg = Program::compile_with(&program, "prefix_sums", &opts).unwrap();
        assert!(prg.clif().contains("f32x4"), "{opt_level:?}: the loop is not vectorized\n{}", prg.clif());
        let mut got = vec![0.0f32; ROWS];
        prg.run(&mut [Arg::Read(BufRef::F32(&x)), Arg::WriteF32(&mut got)]).unwrap();
        assert_eq!(&got, want, "{opt_level:?}");
    }
}

/// Per row `i` with target `t = targets[i]`: `out = (j + 3i - 7 < t ? x : -inf) + slope * (j -
/// i)` as f32, an attention score loop's ALiBi bias under a shifted causal limit: the compare
/// of an offset loop variable (`j + c < t` is `j < t - c`) and the cast of an integer affine in
/// `j` vectorize (i32 lanes, one conversion per step) and agree with the interpreter bit for
/// bit, at both opt levels.
#[test]
fn offset_compares_and_casts_of_the_loop_variable_vectorize() {
    let (x, t, out) =
        (buffer(0, DType::F32, ROWS * COLS), buffer(1, DType::I64, ROWS), buffer(2, DType::F32, ROWS * COLS));
    let i = range(ROWS, 0, AxisType::Loop);
    let j = range(COLS, 1, AxisType::Loop);
    let v = x.index(&i * COLS as i64 + &j).load();
    let seen = (&j + &i * 3 - 7).lt(t.index(&i).load());
    let bias = (&j - &i).cast(DType::F32) * 0.375f32;
    let value = seen.where_(&v, f32c(f32::NEG_INFINITY)) + bias;
    let program = sink(&[out.index(&i * COLS as i64 + &j).store(value).end(&[j, i])]);
    let targets: Vec<i64> = (0..ROWS as i64).map(|r| 5 * r - 9).collect();
    vectorizes_and_matches_the_interpreter(
        &program,
        "offset_lanes",
        &targets,
        &["fcvt_from_sint.f32x4", "icmp"],
    );
}
