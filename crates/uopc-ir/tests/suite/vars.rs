//! Variables (scalar kernel arguments with declared bounds): the verifier's bounds proofs treat
//! them as their interval, their slots are checked, simplify folds with their bounds, the
//! printer shows them, and the interpreter takes and checks their values.

use uopc_ir::interp::{InterpError, Precision, run, run_with_vars};
use uopc_ir::*;

/// `min(a, b)` for index expressions, as `-max(-a, -b)`: its bounds are at most either operand's.
fn min_idx(a: &UOp, b: impl IntoIndex) -> UOp {
    -((-a).maximum(-b.into_index()))
}

/// `out[0] = sum of a[j] for j < L`, with `a` of `cap` elements and L a variable in `lo..=hi`.
fn prefix_sum(cap: usize, lo: i64, hi: i64) -> UOp {
    let (a, out, acc) = (buffer(0, DType::F32, cap), buffer(1, DType::F32, 1), alloc(0, DType::F32, 1));
    let j = range(var(0, lo, hi), 0, AxisType::Reduce);
    let init = acc.index(0).store(0.0f32);
    let acc_j = acc.after(&[init.clone(), j.clone()]);
    let add = acc_j.index(0).store(acc_j.index(0).load() + a.index(&j).load()).end(&[j]);
    sink(&[out.index(0).store(acc.after(&[init, add]).index(0).load())])
}

fn f32s(b: &HostBuffer) -> &[f32] {
    match b {
        HostBuffer::F32(v) => v,
        other => panic!("expected f32 buffer, got {:?}", other.dtype()),
    }
}

#[test]
fn a_variable_has_its_declared_bounds_and_a_range_over_it_stays_below_hi() {
    let v = var(0, 2, 5);
    assert_eq!(v.bounds(), (2, 5));
    assert_eq!(v.dtype(), DType::INDEX);
    let r = range(&v, 0, AxisType::Loop);
    assert_eq!(r.bounds(), (0, 4));
    assert_eq!((&v * 3 + &r).bounds(), (6, 19));
    // Hash-consed like any leaf: equal arguments are one node, other bounds another.
    assert_eq!(var(0, 2, 5), v);
    assert_ne!(var(0, 2, 6), v);
    assert_ne!(var(1, 2, 5), v);
}

#[test]
fn simplify_folds_with_a_variables_bounds() {
    let v = var(0, 1, 16);
    // A clamp to the capacity is redundant: min(v, 16) is v, and v < 17 always holds.
    assert_eq!(simplify(&min_idx(&v, 16)), v);
    assert_eq!(simplify(&min_idx(&v, 20)), v);
    assert_eq!(simplify(&v.lt(17)).const_value(), Some(ConstValue::Bool(true)));
    // A clamp below the capacity stays.
    assert_ne!(simplify(&min_idx(&v, 8)), v);
    // max(v, 0) is v, and v / 32 is 0.
    assert_eq!(simplify(&v.maximum(0)), v);
    assert_eq!(simplify(&v.idiv(32)).const_int(), Some(0));
    // Nothing is known that the bounds do not say: v < 8 stays a comparison.
    assert!(simplify(&v.lt(8)).const_value().is_none());
}

#[test]
fn the_bounds_proof_holds_against_the_declared_hi() {
    verify(&prefix_sum(8, 1, 8)).expect("L <= 8 keeps a[j] inside 8 elements");
    verify(&prefix_sum(8, 0, 8)).expect("an empty sum is fine too");
    let e = verify(&prefix_sum(8, 1, 9)).unwrap_err();
    assert_eq!(e.kind, IrErrorKind::OutOfBounds, "{e}");
    assert!(e.reason.contains("[0, 8]"), "{e}");
}

#[test]
fn an_index_of_a_variable_is_proven_only_with_its_clamp() {
    // out[0] = a[L - 1] for L in 1..=16 on 8 elements: out of bounds unless clamped to 7.
    let (a, out) = (buffer(0, DType::F32, 8), buffer(1, DType::F32, 1));
    let last = var(0, 1, 16) - 1;
    let bare = sink(&[out.index(0).store(a.index(&last).load())]);
    assert_eq!(verify(&bare).unwrap_err().kind, IrErrorKind::OutOfBounds);
    let clamped = min_idx(&last, 7);
    let program = sink(&[out.index(0).store(a.index(&clamped).load())]);
    verify(&program).expect("the clamp keeps the index below 8");
    let mut bufs = [HostBuffer::F32((0..8).map(|x| x as f32).collect()), HostBuffer::zeros(DType::F32, 1)];
    for (len, want) in [(1, 0.0), (5, 4.0), (8, 7.0), (16, 7.0)] {
        run_with_vars(&program, &mut bufs, &[len], Precision::Native).unwrap();
        assert_eq!(f32s(&bufs[1]), [want], "L = {len}");
    }
}

#[test]
fn variable_slots_are_dense_declared_once_and_bounded() {
    let out = buffer(0, DType::I64, 1);
    let store = |value: UOp| sink(&[out.index(0).store(value)]);
    verify(&store(var(0, 0, 3) + var(1, -2, 2))).unwrap();

    let e = verify(&store(var(1, 0, 3))).unwrap_err();
    assert_eq!(e.kind, IrErrorKind::Structure);
    assert!(e.reason.contains("no VAR has slot 0"), "{e}");

    let e = verify(&store(var(0, 0, 3) + var(0, 0, 4))).unwrap_err();
    assert!(e.reason.contains("declared twice"), "{e}");

    let e = verify(&store(var(0, 5, 4))).unwrap_err();
    assert!(e.reason.contains("empty"), "{e}");

    let narrow = UOp::new(Op::Var { slot: VarSlot::new(0), lo: 0, hi: 3 }, DType::I32, vec![]);
    let out32 = buffer(0, DType::I32, 1);
    let e = verify(&sink(&[out32.index(0).store(narrow)])).unwrap_err();
    assert_eq!(e.kind, IrErrorKind::DType, "{e}");
}

#[test]
fn variables_are_listed_and_printed() {
    let program = prefix_sum(8, 1, 8);
    let lin = verify(&program).unwrap();
    assert_eq!(lin.vars, vec![var(0, 1, 8)]);
    let text = print_program(&program).unwrap();
    assert!(text.contains("var0: i64 in 1..=8"), "{text}");
    assert!(text.contains("for r0 in 0..var0 (reduce)"), "{text}");
    assert!(var(3, 1, 8).short().ends_with("VAR i64 var3 [1..=8]"), "{}", var(3, 1, 8).short());
}

#[test]
fn the_interpreter_sums_the_first_l_elements_at_every_length() {
    let cap = 16;
    let program = prefix_sum(cap, 1, cap as i64);
    let a: Vec<f32> = (0..cap).map(|k| 0.25 * k as f32 - 1.0).collect();
    for len in [1, 2, 7, cap / 2 + 1, cap] {
        let mut bufs = [HostBuffer::F32(a.clone()), HostBuffer::zeros(DType::F32, 1)];
        run_with_vars(&program, &mut bufs, &[len as i64], Precision::Native).unwrap();
        // Multiples of 1/4 below 16 in magnitude: every partial sum is exact in f32.
        let want: f64 = a[..len].iter().map(|&x| x as f64).sum();
        assert_eq!(f32s(&bufs[1]), [want as f32], "L = {len}");
    }
}

#[test]
fn the_interpreter_checks_the_values_before_running() {
    let program = prefix_sum(8, 1, 8);
    let mut bufs = [HostBuffer::F32(vec![1.0; 8]), HostBuffer::F32(vec![-5.0])];
    for bad in [0, 9, i64::MIN, i64::MAX] {
        let e = run_with_vars(&program, &mut bufs, &[bad], Precision::Native).unwrap_err();
        assert_eq!(e, InterpError::VarOutOfBounds { slot: 0, lo: 1, hi: 8, given: bad });
        assert!(e.to_string().contains("variable 0"), "{e}");
    }
    let e = run(&program, &mut bufs, Precision::Native).unwrap_err();
    assert_eq!(e, InterpError::VarCount { expected: 1, given: 0 });
    let e = run_with_vars(&program, &mut bufs, &[2, 2], Precision::Native).unwrap_err();
    assert_eq!(e, InterpError::VarCount { expected: 1, given: 2 });
    // Nothing ran: the output keeps its value.
    assert_eq!(f32s(&bufs[1]), [-5.0]);
}

#[test]
fn a_thread_range_may_end_at_a_variable() {
    // out[t] = t for t < L: the tail past L keeps its old values.
    let out = buffer(0, DType::I64, 6);
    let t = range(var(0, 0, 6), 0, AxisType::Thread);
    let program = sink(&[out.index(&t).store(&t).end(&[t.clone()])]);
    let k = prepare(&program, &PrepareOptions::default()).unwrap();
    let thread = k.thread.expect("a THREAD range");
    assert_eq!(thread.extent, None);
    assert!(thread.writes_disjoint);
    let end = thread.end.expect("a formula of the variable");
    assert_eq!(end.eval(&[4]), Some(4));
    assert_eq!(k.vars, vec![VarSpec { slot: 0, lo: 0, hi: 6 }]);

    let mut bufs = [HostBuffer::I64(vec![-1; 6])];
    run_with_vars(&program, &mut bufs, &[4], Precision::Native).unwrap();
    assert_eq!(bufs[0], HostBuffer::I64(vec![0, 1, 2, 3, -1, -1]));
}

#[test]
fn a_variable_simplified_away_is_still_an_argument() {
    // v / 8 folds to 0 for v <= 3, but the program as written takes variable 0; variable 1 stays.
    let out = buffer(0, DType::I64, 1);
    let program = sink(&[out.index(0).store(var(0, 0, 3).idiv(8) + var(1, 0, 9))]);
    let k = prepare(&program, &PrepareOptions::default()).unwrap();
    assert_eq!(k.vars.iter().map(|v| v.slot).collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!(k.linear.vars, vec![var(1, 0, 9)]);
    let mut bufs = [HostBuffer::I64(vec![0])];
    run_with_vars(&program, &mut bufs, &[2, 7], Precision::Native).unwrap();
    assert_eq!(bufs[0], HostBuffer::I64(vec![7]));
}
