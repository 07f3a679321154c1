//! Tests for the reference interpreter: results against plain Rust loops, the JIT-defining
//! edge cases (IDIV/MOD, CAST, EXP2, MAX, WHERE), argument checking and run-time checks.

use uopc_ir::interp::{InterpError, Precision, run};
use uopc_ir::*;

fn f32s(b: &HostBuffer) -> &[f32] {
    match b {
        HostBuffer::F32(v) => v,
        other => panic!("expected f32 buffer, got {:?}", other.dtype()),
    }
}

fn i64s(b: &HostBuffer) -> &[i64] {
    match b {
        HostBuffer::I64(v) => v,
        other => panic!("expected i64 buffer, got {:?}", other.dtype()),
    }
}

fn i32s(b: &HostBuffer) -> &[i32] {
    match b {
        HostBuffer::I32(v) => v,
        other => panic!("expected i32 buffer, got {:?}", other.dtype()),
    }
}

fn bools(b: &HostBuffer) -> &[bool] {
    match b {
        HostBuffer::Bool(v) => v,
        other => panic!("expected bool buffer, got {:?}", other.dtype()),
    }
}

/// out[k] = f(in[k]) for k in 0..n: a one-loop elementwise program.
fn elementwise(n: usize, din: DType, dout: DType, f: impl Fn(&UOp) -> UOp) -> UOp {
    let a = buffer(0, din, n);
    let out = buffer(1, dout, n);
    let k = range(n, 0, AxisType::Loop);
    sink(&[out.index(&k).store(f(&a.index(&k).load())).end(&[k])])
}

/// out[k] = f(a[k], b[k]) for k in 0..n.
fn elementwise2(n: usize, din: DType, dout: DType, f: impl Fn(&UOp, &UOp) -> UOp) -> UOp {
    let a = buffer(0, din, n);
    let b = buffer(1, din, n);
    let out = buffer(2, dout, n);
    let k = range(n, 0, AxisType::Loop);
    sink(&[out.index(&k).store(f(&a.index(&k).load(), &b.index(&k).load())).end(&[k])])
}

/// out[i] = sum_j m[i*n + j] * x[j]: THREAD over rows, a REDUCE accumulator declared per row.
fn matvec(rows: usize, n: usize) -> UOp {
    let m = buffer(0, DType::F32, rows * n);
    let x = buffer(1, DType::F32, n);
    let out = buffer(2, DType::F32, rows);
    let acc = alloc(0, DType::F32, 1);
    let i = range(rows, 0, AxisType::Thread);
    let j = range(n, 1, AxisType::Reduce);
    let acc_i = acc.after(std::slice::from_ref(&i));
    let init = acc_i.index(0).store(0.0f32);
    let acc_j = acc_i.after(&[init, j.clone()]);
    let prod = m.index(&i * n + &j).load() * x.index(&j).load();
    let upd = acc_j.index(0).store(acc_j.index(0).load() + prod).end(&[j]);
    let st = out.index(&i).store(acc_i.after(&[upd]).index(0).load());
    sink(&[st.end(&[i])])
}

#[test]
fn matvec_matches_naive_loop() {
    let (rows, n) = (5, 7);
    let m: Vec<f32> = (0..rows * n).map(|k| ((k * 37 % 11) as f32 - 5.0) * 0.37).collect();
    let x: Vec<f32> = (0..n).map(|k| (k as f32 * 0.71).sin()).collect();
    let mut bufs =
        [HostBuffer::F32(m.clone()), HostBuffer::F32(x.clone()), HostBuffer::zeros(DType::F32, rows)];
    run(&matvec(rows, n), &mut bufs, Precision::Native).expect("matvec runs");
    for i in 0..rows {
        // Same order and same f32 rounding as the program: results must be bit-identical.
        let mut acc = 0.0f32;
        for j in 0..n {
            acc += m[i * n + j] * x[j];
        }
        assert_eq!(f32s(&bufs[2])[i].to_bits(), acc.to_bits(), "row {i}");
    }
    assert!(f32s(&bufs[2]).iter().any(|&v| v != 0.0), "the output was written");
}

#[test]
fn thread_range_with_accumulator_and_alloc_array() {
    // Per row i (THREAD): tmp[j] = a[i,j]^2 and acc = sum_j a[i,j] in one REDUCE loop, then
    // out[i,k] = tmp[n-1-k] + acc in a second loop.
    let n = 6usize;
    let a = buffer(0, DType::F32, n * n);
    let out = buffer(1, DType::F32, n * n);
    let acc = alloc(0, DType::F32, 1);
    let tmp = alloc(1, DType::F32, n);
    let i = range(n, 0, AxisType::Thread);
    let j = range(n, 1, AxisType::Reduce);
    let k = range(n, 2, AxisType::Loop);
    let acc_i = acc.after(std::slice::from_ref(&i));
    let tmp_i = tmp.after(std::slice::from_ref(&i));
    let init = acc_i.index(0).store(0.0f32);
    let acc_j = acc_i.after(&[init, j.clone()]);
    let x = a.index(&i * n + &j).load();
    let body = sink(&[acc_j.index(0).store(acc_j.index(0).load() + &x), tmp_i.index(&j).store(&x * &x)])
        .end(std::slice::from_ref(&j));
    let total = acc_i.after(std::slice::from_ref(&body)).index(0).load();
    let tmp_k = tmp_i.after(&[body, k.clone()]);
    let st = out.index(&i * n + &k).store(tmp_k.index(idx(n as i64 - 1) - &k).load() + total).end(&[k]);
    let program = sink(&[st.end(&[i])]);

    let data: Vec<f32> = (0..n * n).map(|v| v as f32 * 0.5 - 4.0).collect();
    let mut bufs = [HostBuffer::F32(data.clone()), HostBuffer::zeros(DType::F32, n * n)];
    run(&program, &mut bufs, Precision::Native).expect("program runs");
    for i in 0..n {
        let row = &data[i * n..(i + 1) * n];
        let mut sum = 0.0f32;
        for &v in row {
            sum += v;
        }
        for k in 0..n {
            let want = row[n - 1 - k] * row[n - 1 - k] + sum;
            assert_eq!(f32s(&bufs[1])[i * n + k], want, "out[{i},{k}]");
        }
    }
}

#[test]
fn idiv_and_mod_truncate_and_zero_divisors_give_zero() {
    let pairs: [(i64, i64); 9] =
        [(7, 2), (-7, 2), (7, -2), (-7, -2), (5, 0), (-5, 0), (0, 0), (i64::MIN, -1), (3, 7)];
    let n = pairs.len();
    let a = buffer(0, DType::I64, n);
    let b = buffer(1, DType::I64, n);
    let q = buffer(2, DType::I64, n);
    let r = buffer(3, DType::I64, n);
    let k = range(n, 0, AxisType::Loop);
    let (x, y) = (a.index(&k).load(), b.index(&k).load());
    let p = sink(&[sink(&[q.index(&k).store(x.idiv(&y)), r.index(&k).store(x.modulo(&y))]).end(&[k])]);
    let mut bufs = [
        HostBuffer::I64(pairs.iter().map(|p| p.0).collect()),
        HostBuffer::I64(pairs.iter().map(|p| p.1).collect()),
        HostBuffer::zeros(DType::I64, n),
        HostBuffer::zeros(DType::I64, n),
    ];
    run(&p, &mut bufs, Precision::Native).expect("runs");
    assert_eq!(i64s(&bufs[2]), &[3, -3, -3, 3, 0, 0, 0, i64::MIN, 0]);
    assert_eq!(i64s(&bufs[3]), &[1, -1, 1, -1, 0, 0, 0, 0, 3]);
}

#[test]
fn i32_arithmetic_wraps_to_i32() {
    let a = [i32::MIN, i32::MAX, -9, 100_000];
    let b = [-1, 1, 0, 100_000];
    let n = a.len();
    // (a / b, a + b, a * b) each wrapped to i32
    let p = elementwise2(n, DType::I32, DType::I32, |x, y| x.idiv(y));
    let mut bufs =
        [HostBuffer::I32(a.to_vec()), HostBuffer::I32(b.to_vec()), HostBuffer::zeros(DType::I32, n)];
    run(&p, &mut bufs, Precision::Native).unwrap();
    assert_eq!(i32s(&bufs[2]), &[i32::MIN, i32::MAX, 0, 1]);
    let p = elementwise2(n, DType::I32, DType::I32, |x, y| x + y);
    run(&p, &mut bufs, Precision::Native).unwrap();
    assert_eq!(i32s(&bufs[2]), &[i32::MAX, i32::MIN, -9, 200_000]);
    let p = elementwise2(n, DType::I32, DType::I32, |x, y| x * y);
    run(&p, &mut bufs, Precision::Native).unwrap();
    assert_eq!(i32s(&bufs[2]), &[i32::MIN, i32::MAX, 0, 100_000i32.wrapping_mul(100_000)]);
}

#[test]
fn cast_edge_cases_follow_rust_as() {
    let input = [f32::NAN, 1e20, -1e20, 3.7, -3.7, 0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY];
    let n = input.len();
    let mut bufs = [HostBuffer::F32(input.to_vec()), HostBuffer::zeros(DType::I32, n)];
    run(&elementwise(n, DType::F32, DType::I32, |x| x.cast(DType::I32)), &mut bufs, Precision::Native)
        .unwrap();
    assert_eq!(i32s(&bufs[1]), &[0, i32::MAX, i32::MIN, 3, -3, 0, 0, i32::MAX, i32::MIN]);

    let mut bufs = [HostBuffer::F32(input.to_vec()), HostBuffer::zeros(DType::I64, n)];
    run(&elementwise(n, DType::F32, DType::I64, |x| x.cast(DType::I64)), &mut bufs, Precision::Native)
        .unwrap();
    assert_eq!(i64s(&bufs[1]), &[0, i64::MAX, i64::MIN, 3, -3, 0, 0, i64::MAX, i64::MIN]);

    // Anything to Bool is `x != 0`; NaN != 0.
    let mut bufs = [HostBuffer::F32(input.to_vec()), HostBuffer::zeros(DType::Bool, n)];
    run(&elementwise(n, DType::F32, DType::Bool, |x| x.cast(DType::Bool)), &mut bufs, Precision::Native)
        .unwrap();
    assert_eq!(bools(&bufs[1]), &[true, true, true, true, true, false, false, true, true]);

    // I64 -> I32 wraps; I64 -> Bool; I64 -> F32 rounds once.
    let ints = [(1i64 << 32) + 5, -1, i64::MAX, 0, (1 << 24) + 1];
    let n = ints.len();
    let mut bufs = [HostBuffer::I64(ints.to_vec()), HostBuffer::zeros(DType::I32, n)];
    run(&elementwise(n, DType::I64, DType::I32, |x| x.cast(DType::I32)), &mut bufs, Precision::Native)
        .unwrap();
    assert_eq!(i32s(&bufs[1]), &[5, -1, -1, 0, (1 << 24) + 1]);
    let mut bufs = [HostBuffer::I64(ints.to_vec()), HostBuffer::zeros(DType::Bool, n)];
    run(&elementwise(n, DType::I64, DType::Bool, |x| x.cast(DType::Bool)), &mut bufs, Precision::Native)
        .unwrap();
    assert_eq!(bools(&bufs[1]), &[true, true, true, false, true]);
    let mut bufs = [HostBuffer::I64(ints.to_vec()), HostBuffer::zeros(DType::F32, n)];
    run(&elementwise(n, DType::I64, DType::F32, |x| x.cast(DType::F32)), &mut bufs, Precision::Native)
        .unwrap();
    assert_eq!(f32s(&bufs[1]), &[4294967301.0f32, -1.0, 9.223372e18, 0.0, 16777216.0]);

    // Bool -> F32 and Bool -> I32 are 0/1.
    let mut bufs = [HostBuffer::Bool(vec![true, false]), HostBuffer::zeros(DType::F32, 2)];
    run(&elementwise(2, DType::Bool, DType::F32, |x| x.cast(DType::F32)), &mut bufs, Precision::Native)
        .unwrap();
    assert_eq!(f32s(&bufs[1]), &[1.0, 0.0]);
    let mut bufs = [HostBuffer::Bool(vec![true, false]), HostBuffer::zeros(DType::I32, 2)];
    run(&elementwise(2, DType::Bool, DType::I32, |x| x.cast(DType::I32)), &mut bufs, Precision::Native)
        .unwrap();
    assert_eq!(i32s(&bufs[1]), &[1, 0]);
}

#[test]
fn exp2_of_negative_infinity_is_zero_in_both_precisions() {
    let input = vec![f32::NEG_INFINITY, 0.0, 1.0, 10.0, -1.0];
    for precision in [Precision::Native, Precision::F64] {
        let mut bufs = [HostBuffer::F32(input.clone()), HostBuffer::F32(vec![f32::NAN; 5])];
        run(&elementwise(5, DType::F32, DType::F32, UOp::exp2), &mut bufs, precision).unwrap();
        assert_eq!(f32s(&bufs[1]), &[0.0, 1.0, 2.0, 1024.0, 0.5], "{precision:?}");
    }
}

#[test]
fn unary_ops() {
    let input = vec![4.0f32, 0.25, -2.0, 0.0];
    let check = |f: fn(&UOp) -> UOp, want: [f32; 4]| {
        let mut bufs = [HostBuffer::F32(input.clone()), HostBuffer::zeros(DType::F32, 4)];
        run(&elementwise(4, DType::F32, DType::F32, f), &mut bufs, Precision::Native).unwrap();
        let got = f32s(&bufs[1]);
        for (g, w) in got.iter().zip(want) {
            assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "got {got:?} want {want:?}");
        }
    };
    check(UOp::log2, [2.0, -2.0, f32::NAN, f32::NEG_INFINITY]);
    check(UOp::sqrt, [2.0, 0.5, f32::NAN, 0.0]);
    check(UOp::recip, [0.25, 4.0, -0.5, f32::INFINITY]);
    check(|x| -x, [-4.0, -0.25, 2.0, -0.0]);
}

#[test]
fn where_and_max_pick_like_the_jit() {
    let a = vec![1.0f32, 5.0, f32::NAN, 2.0, -0.0];
    let b = vec![3.0f32, 4.0, 1.0, f32::NAN, 0.0];
    // WHERE(a < b, a, b): the minimum, with NaN comparisons false.
    let mut bufs = [HostBuffer::F32(a.clone()), HostBuffer::F32(b.clone()), HostBuffer::zeros(DType::F32, 5)];
    run(&elementwise2(5, DType::F32, DType::F32, |x, y| x.lt(y).where_(x, y)), &mut bufs, Precision::Native)
        .unwrap();
    let got = f32s(&bufs[2]);
    assert_eq!(&got[..2], &[1.0, 4.0]);
    assert_eq!(got[2], 1.0, "NaN < 1 is false: picks b");
    assert!(got[3].is_nan(), "2 < NaN is false: picks b (NaN)");
    assert_eq!(got[4].to_bits(), 0.0f32.to_bits(), "-0 < 0 is false: picks +0");

    // MAX propagates NaN from either side (torch's maximum), not f32::max, which drops it.
    let mut bufs = [HostBuffer::F32(a), HostBuffer::F32(b), HostBuffer::zeros(DType::F32, 5)];
    run(&elementwise2(5, DType::F32, DType::F32, |x, y| x.maximum(y)), &mut bufs, Precision::Native).unwrap();
    let got = f32s(&bufs[2]);
    assert_eq!(&got[..2], &[3.0, 5.0]);
    assert!(got[2].is_nan() && got[3].is_nan(), "NaN on either side gives NaN: {got:?}");
    assert_eq!(got[4].to_bits(), 0.0f32.to_bits(), "-0 > 0 is false: picks +0");

    // Integer WHERE and CMPNE producing a bool buffer.
    let mut bufs =
        [HostBuffer::I64(vec![1, 2, 3]), HostBuffer::I64(vec![1, 0, 4]), HostBuffer::zeros(DType::Bool, 3)];
    run(&elementwise2(3, DType::I64, DType::Bool, |x, y| x.ne(y)), &mut bufs, Precision::Native).unwrap();
    assert_eq!(bools(&bufs[2]), &[false, true, true]);
    let mut bufs =
        [HostBuffer::I64(vec![1, 2, 3]), HostBuffer::I64(vec![1, 0, 4]), HostBuffer::zeros(DType::I64, 3)];
    run(
        &elementwise2(3, DType::I64, DType::I64, |x, y| x.ne(y).where_(x * 10, y)),
        &mut bufs,
        Precision::Native,
    )
    .unwrap();
    assert_eq!(i64s(&bufs[2]), &[1, 20, 30]);
}

#[test]
fn range_end_can_depend_on_an_enclosing_range() {
    // Lower triangle: out[i*n + j] = j for j in 0..=i; the rest keeps its initial -1.
    let n = 5usize;
    let out = buffer(0, DType::I64, n * n);
    let i = range(n, 0, AxisType::Loop);
    let j = range(&i + 1, 1, AxisType::Loop);
    let p = sink(&[out.index(&i * n + &j).store(&j * 1).end(&[j, i])]);
    let mut bufs = [HostBuffer::I64(vec![-1; n * n])];
    run(&p, &mut bufs, Precision::Native).unwrap();
    for i in 0..n {
        for j in 0..n {
            let want = if j <= i { j as i64 } else { -1 };
            assert_eq!(i64s(&bufs[0])[i * n + j], want, "({i}, {j})");
        }
    }
}

#[test]
fn argument_errors_name_the_slot() {
    let p = matvec(2, 3);
    let good = || {
        vec![
            HostBuffer::zeros(DType::F32, 6),
            HostBuffer::zeros(DType::F32, 3),
            HostBuffer::zeros(DType::F32, 2),
        ]
    };
    run(&p, &mut good(), Precision::Native).expect("the right arguments run");

    let mut few = good();
    few.pop();
    let e = run(&p, &mut few, Precision::Native).unwrap_err();
    assert!(matches!(e, InterpError::ArgCount { expected: 3, given: 2 }), "{e:?}");
    assert!(e.to_string().contains("slot 2"), "{e}");

    let mut many = good();
    many.push(HostBuffer::zeros(DType::F32, 1));
    let e = run(&p, &mut many, Precision::Native).unwrap_err();
    assert!(matches!(e, InterpError::ArgCount { expected: 3, given: 4 }), "{e:?}");
    assert!(e.to_string().contains("slot 3"), "{e}");

    let mut wrong_dtype = good();
    wrong_dtype[1] = HostBuffer::zeros(DType::F64, 3);
    let e = run(&p, &mut wrong_dtype, Precision::Native).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("slot 1") && msg.contains("expected dtype f32") && msg.contains("given f64"),
        "{msg}"
    );

    let mut wrong_len = good();
    wrong_len[0] = HostBuffer::zeros(DType::F32, 5);
    let e = run(&p, &mut wrong_len, Precision::Native).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("slot 0") && msg.contains("expected 6 elements") && msg.contains("given 5"),
        "{msg}"
    );

    // Slots must be 0..n: a program using slots 0 and 2 cannot be matched to arguments.
    let a = buffer(0, DType::F32, 1);
    let c = buffer(2, DType::F32, 1);
    let gap = sink(&[c.index(0).store(a.index(0).load())]);
    let e = run(
        &gap,
        &mut [HostBuffer::zeros(DType::F32, 1), HostBuffer::zeros(DType::F32, 1)],
        Precision::Native,
    )
    .unwrap_err();
    assert!(matches!(e, InterpError::SlotGap { slot: 1, highest: 2 }), "{e:?}");
    assert!(e.to_string().contains("slot 1"), "{e}");
}

#[test]
fn ir_errors_are_wrapped() {
    let a = buffer(0, DType::F32, 4);
    let i = range(4, 0, AxisType::Loop);
    let never_ended = sink(&[a.index(&i).store(1.0f32)]);
    let e = run(&never_ended, &mut [HostBuffer::zeros(DType::F32, 4)], Precision::Native).unwrap_err();
    match e {
        InterpError::Ir(ir) => assert_eq!(ir.kind, IrErrorKind::RangeNotEnded),
        other => panic!("expected an IR error, got {other:?}"),
    }
}

#[test]
fn f64_precision_differs_from_native_rounding() {
    // 1 + 1000 * 1e-8: in f32 every 1e-8 is lost against 1.0; in f64 they add up to 1e-5.
    let n = 1001usize;
    let mut data = vec![1e-8f32; n];
    data[0] = 1.0;
    let p = {
        let a = buffer(0, DType::F32, n);
        let out = buffer(1, DType::F32, 1);
        let acc = alloc(0, DType::F32, 1);
        let j = range(n, 0, AxisType::Reduce);
        let init = acc.index(0).store(0.0f32);
        let acc_j = acc.after(&[init, j.clone()]);
        let upd = acc_j.index(0).store(acc_j.index(0).load() + a.index(&j).load()).end(&[j]);
        sink(&[out.index(0).store(acc.after(&[upd]).index(0).load())])
    };
    let mut native = [HostBuffer::F32(data.clone()), HostBuffer::zeros(DType::F32, 1)];
    run(&p, &mut native, Precision::Native).unwrap();
    let mut wide = [HostBuffer::F32(data.clone()), HostBuffer::zeros(DType::F32, 1)];
    run(&p, &mut wide, Precision::F64).unwrap();

    let f32_sum = data.iter().fold(0.0f32, |s, &v| s + v);
    let f64_sum = data.iter().fold(0.0f64, |s, &v| s + v as f64) as f32;
    assert_eq!(f32_sum, 1.0);
    assert_ne!(f32_sum, f64_sum);
    assert_eq!(f32s(&native[1])[0], f32_sum, "native rounds to f32 after every add");
    assert_eq!(f32s(&wide[1])[0], f64_sum, "f64 mode accumulates in f64 and narrows at the store");
}

#[test]
fn runtime_bounds_check_catches_what_the_verifier_misses() {
    // The verifier's bounds saturate where the arithmetic wraps: (i64::MAX + 1) / 2^60 is
    // bounded to [7, 7] but evaluates to -8. Either layer may reject it; neither may run it.
    let a = buffer(0, DType::F32, 8);
    let index = (idx(i64::MAX) + idx(1)).idiv(idx(1 << 60));
    let p = sink(&[a.index(index).store(1.0f32)]);
    let mut bufs = [HostBuffer::zeros(DType::F32, 8)];
    match run(&p, &mut bufs, Precision::Native) {
        Err(InterpError::OutOfBounds { index, len, .. }) => assert_eq!((index, len), (-8, 8)),
        Err(InterpError::Ir(e)) => assert_eq!(e.kind, IrErrorKind::OutOfBounds),
        other => panic!("expected an out-of-bounds error, got {other:?}"),
    }
    assert_eq!(f32s(&bufs[0]), &[0.0; 8], "nothing was written");
}

#[test]
fn reading_an_unwritten_alloc_element_is_an_error() {
    // Only tmp[0] is stored, but tmp[3] is loaded: the verifier only asks that some store comes
    // before, so this must be caught at run time.
    let out = buffer(0, DType::F32, 1);
    let tmp = alloc(0, DType::F32, 4);
    let init = tmp.index(0).store(2.0f32);
    let p = sink(&[out.index(0).store(tmp.after(&[init]).index(3).load())]);
    let e = run(&p, &mut [HostBuffer::zeros(DType::F32, 1)], Precision::Native).unwrap_err();
    assert!(matches!(e, InterpError::Uninitialized { index: 3, .. }), "{e:?}");
    // Reading the written element is fine.
    let init = tmp.index(0).store(2.0f32);
    let p = sink(&[out.index(0).store(tmp.after(&[init]).index(0).load())]);
    let mut bufs = [HostBuffer::zeros(DType::F32, 1)];
    run(&p, &mut bufs, Precision::Native).unwrap();
    assert_eq!(f32s(&bufs[0]), &[2.0]);
}

#[test]
fn values_that_are_not_values_are_errors_not_panics() {
    // An ADD whose operand is a BUFFER node: dtypes agree so the verifier may let it through.
    let a = buffer(0, DType::F32, 2);
    let bad = UOp::new(Op::Binary(BinaryOp::Add), DType::F32, vec![a.clone(), a.index(0).load()]);
    let p = sink(&[a.index(1).store(bad)]);
    let e = run(&p, &mut [HostBuffer::zeros(DType::F32, 2)], Precision::Native).unwrap_err();
    assert!(matches!(e, InterpError::Malformed { .. } | InterpError::Ir(_)), "{e:?}");

    // A value ordered AFTER a store has no value of its own.
    let st = a.index(0).store(1.0f32);
    let v = a.index(0).load().after(&[st]);
    let p = sink(&[a.index(1).store(v)]);
    let e = run(&p, &mut [HostBuffer::zeros(DType::F32, 2)], Precision::Native).unwrap_err();
    assert!(matches!(e, InterpError::Malformed { .. } | InterpError::Ir(_)), "{e:?}");
}

#[test]
fn oversized_alloc_is_an_error() {
    let out = buffer(0, DType::F32, 1);
    let big = alloc(0, DType::F32, usize::MAX / 2);
    let init = big.index(0).store(1.0f32);
    let p = sink(&[out.index(0).store(big.after(&[init]).index(0).load())]);
    let e = run(&p, &mut [HostBuffer::zeros(DType::F32, 1)], Precision::Native).unwrap_err();
    assert!(matches!(e, InterpError::Malformed { .. }), "{e:?}");
}

/// A xorshift generator, so the fuzz test below is deterministic without extra dependencies.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

#[test]
fn random_graphs_never_panic() {
    // Random, mostly malformed graphs: `run` must answer every one with Ok or Err.
    use std::panic::{AssertUnwindSafe, catch_unwind};
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let dtypes = [DType::Bool, DType::I32, DType::I64, DType::F32, DType::F64];
    let binops =
        [BinaryOp::Add, BinaryOp::Mul, BinaryOp::IDiv, BinaryOp::Mod, BinaryOp::CmpLt, BinaryOp::Max];
    let mut ran = 0;
    for case in 0..4000 {
        let mut pool =
            vec![buffer(0, DType::F32, 4), buffer(1, DType::I64, 3), alloc(0, DType::F32, 2), idx(0), idx(2)];
        for id in 0..3 + rng.below(12) {
            let mut pick = || pool[rng.below(pool.len())].clone();
            let (a, b, c) = (pick(), pick(), pick());
            let d = dtypes[rng.below(dtypes.len())];
            let u = match rng.below(13) {
                0 => range(a, id, if rng.below(3) == 0 { AxisType::Thread } else { AxisType::Loop }),
                1 => a.index(b),
                2 => a.load(),
                3 => UOp::new(Op::Store, DType::Bool, vec![a.index(idx(rng.below(3) as i64)), b]),
                4 => a.end(&[b]),
                5 => a.after(&[b]),
                6 => sink(&[a, b]),
                7 => {
                    let op = binops[rng.below(binops.len())];
                    UOp::new(Op::Binary(op), if rng.below(2) == 0 { a.dtype() } else { d }, vec![a, b])
                }
                8 => a.cast(d),
                9 => UOp::new(Op::Where, b.dtype(), vec![a, b, c]),
                10 => UOp::new(Op::Unary(UnaryOp::Neg), a.dtype(), vec![a]),
                11 => idx(rng.below(5) as i64 - 1),
                _ => UOp::new(Op::End, DType::Bool, vec![a]),
            };
            pool.push(u);
        }
        let n = pool.len();
        let program = sink(&[pool[n - 1].clone(), pool[n - 2].clone()]);
        // Arguments that fit the program when it verifies, so evaluation is exercised too.
        let mut bufs: Vec<HostBuffer> = match verify(&program) {
            Ok(lin) => lin
                .buffers
                .iter()
                .map(|b| match b.op() {
                    Op::Buffer { len, .. } => HostBuffer::zeros(b.dtype(), *len),
                    _ => HostBuffer::zeros(b.dtype(), 0),
                })
                .collect(),
            Err(_) => vec![HostBuffer::zeros(DType::F32, 4)],
        };
        let result = catch_unwind(AssertUnwindSafe(|| run(&program, &mut bufs, Precision::Native)));
        match result {
            Ok(Ok(())) => ran += 1,
            Ok(Err(_)) => {}
            Err(_) => panic!("case {case}: run panicked on {:?}", UOp::toposort(&[program])),
        }
    }
    assert!(ran > 0, "some random programs are well formed and run");
}
