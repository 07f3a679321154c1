//! Simplify, verifier and linearizer tests for the loop IR.

use proptest::prelude::*;
use uopc_ir::*;

fn ranges2(n: usize) -> (UOp, UOp) {
    (range(n, 0, AxisType::Loop), range(n, 1, AxisType::Loop))
}

#[test]
fn simplify_proves_reshape_index_identities() {
    for n in [2usize, 7, 512] {
        let (i, j) = ranges2(n);
        let flat = &i * n + &j;
        let row = simplify(&flat.idiv(n).modulo(n));
        assert_eq!(row, i, "((i*N + j)//N) % N == i for N={n}");
        let col = simplify(&flat.idiv(1).modulo(n));
        assert_eq!(col, j, "((i*N + j)//1) % N == j for N={n}");
        assert_eq!(col.ranges_mentioned(), vec![j.clone()]);
    }
}

#[test]
fn simplify_can_be_told_not_to_fold_divmod() {
    let (i, j) = ranges2(64);
    let raw = (&i * 64 + &j).idiv(64).modulo(64);
    let kept = simplify_with(&raw, SimplifyOptions { fold_divmod: false });
    assert_eq!(kept.ranges_mentioned().len(), 2, "without folding the index still mentions j");
}

#[test]
fn bounds_follow_ranges_including_expression_ends() {
    let i = range(10, 0, AxisType::Loop);
    let j = range(&i + 1, 1, AxisType::Loop);
    assert_eq!(j.bounds(), (0, 9));
    assert_eq!((&i * 3 + &j).bounds(), (0, 36));
    assert_eq!((&i * 3 + &j).modulo(4).bounds(), (0, 3));
}

#[derive(Clone, Debug)]
enum E {
    I,
    J,
    C(i64),
    Add(Box<E>, Box<E>),
    Mul(Box<E>, i64),
    Div(Box<E>, i64),
    Mod(Box<E>, i64),
}

fn expr() -> impl Strategy<Value = E> {
    let leaf = prop_oneof![Just(E::I), Just(E::J), (0i64..20).prop_map(E::C)];
    leaf.prop_recursive(5, 32, 2, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| E::Add(Box::new(a), Box::new(b))),
            (inner.clone(), 0i64..9).prop_map(|(a, c)| E::Mul(Box::new(a), c)),
            (inner.clone(), 1i64..9).prop_map(|(a, c)| E::Div(Box::new(a), c)),
            (inner, 1i64..9).prop_map(|(a, c)| E::Mod(Box::new(a), c)),
        ]
    })
}

fn build(e: &E, i: &UOp, j: &UOp) -> UOp {
    match e {
        E::I => i.clone(),
        E::J => j.clone(),
        E::C(c) => idx(*c),
        E::Add(a, b) => build(a, i, j) + build(b, i, j),
        E::Mul(a, c) => build(a, i, j) * *c,
        E::Div(a, c) => build(a, i, j).idiv(*c),
        E::Mod(a, c) => build(a, i, j).modulo(*c),
    }
}

fn eval(u: &UOp, env: &[(UOp, i64)]) -> i64 {
    if let Some((_, v)) = env.iter().find(|(r, _)| r == u) {
        return *v;
    }
    if let Op::Const(c) = u.op() {
        return c.as_i64();
    }
    if let Some((op, a, b)) = u.as_binary() {
        let (a, b) = (eval(a, env), eval(b, env));
        return match op {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::IDiv => int_div(a, b),
            BinaryOp::Mod => int_mod(a, b),
            BinaryOp::Max => a.max(b),
            other => panic!("unexpected {other:?}"),
        };
    }
    match u.as_unary() {
        Some((UnaryOp::Neg, a)) => -eval(a, env),
        _ => panic!("unexpected {:?}", u.op()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn simplify_preserves_values(e in expr(), ni in 1usize..12, nj in 1usize..12, seed in 0u64..1000) {
        let i = range(ni, 0, AxisType::Loop);
        let j = range(nj, 1, AxisType::Loop);
        let raw = build(&e, &i, &j);
        let s = simplify(&raw);
        let (lo, hi) = s.bounds();
        for k in 0..8u64 {
            let x = ((seed * 31 + k * 7) % ni as u64) as i64;
            let y = ((seed * 17 + k * 5) % nj as u64) as i64;
            let env = [(i.clone(), x), (j.clone(), y)];
            let (a, b) = (eval(&raw, &env), eval(&s, &env));
            prop_assert_eq!(a, b, "raw {:?} simplified {:?} at i={} j={}", raw, s, x, y);
            prop_assert!(lo <= b && b <= hi, "value {} outside bounds [{}, {}]", b, lo, hi);
        }
    }
}

/// out[i] = sum_j a[i*n + j], with the accumulator declared inside i.
fn row_sum(n: usize) -> UOp {
    let a = buffer(0, DType::F32, n * n);
    let out = buffer(1, DType::F32, n);
    let acc = alloc(0, DType::F32, 1);
    let i = range(n, 0, AxisType::Thread);
    let j = range(n, 1, AxisType::Reduce);
    let acc_i = acc.after(&[i.clone()]);
    let init = acc_i.index(0).store(0.0f32);
    let acc_j = acc_i.after(&[init, j.clone()]);
    let upd = acc_j.index(0).store(acc_j.index(0).load() + a.index(&i * n + &j).load()).end(&[j.clone()]);
    let st = out.index(&i).store(acc_i.after(&[upd]).index(0).load());
    sink(&[st.end(&[i])])
}

#[test]
fn linearizer_nests_and_orders() {
    let p = row_sum(8);
    let lin = verify(&p).expect("row sum is well formed");
    let text = print_linear(&lin);
    assert!(text.contains("for r0 in 0..8 (thread)"), "{text}");
    assert!(text.contains("  for r1 in 0..8 (reduce)"), "{text}");
    // the accumulator init is inside r0 but before r1's loop
    let init = text.find("acc0[0] = 0.0").expect("init printed");
    assert!(init > text.find("for r0").unwrap() && init < text.find("for r1").unwrap(), "{text}");
}

#[test]
fn verifier_rejects_dtype_mismatch() {
    let a = buffer(0, DType::F32, 4);
    let i = range(4, 0, AxisType::Loop);
    let bad = a.index(&i).load() + idx(1);
    let p = sink(&[a.index(&i).store(bad).end(&[i])]);
    let e = verify(&p).unwrap_err();
    assert_eq!(e.kind, IrErrorKind::DType);
    assert!(e.node.contains("ADD"), "{e}");
}

#[test]
fn verifier_rejects_end_of_closed_range() {
    let a = buffer(0, DType::F32, 4);
    let i = range(4, 0, AxisType::Loop);
    let j = range(4, 1, AxisType::Loop);
    let p = sink(&[a.index(&i).store(1.0f32).end(&[i.clone(), j])]);
    let e = verify(&p).unwrap_err();
    assert_eq!(e.kind, IrErrorKind::RangeNotOpen, "{e}");
    assert!(e.node.contains("END"), "{e}");
}

#[test]
fn verifier_rejects_store_outside_its_range() {
    let a = buffer(0, DType::F32, 16);
    let i = range(4, 0, AxisType::Loop);
    let j = range(4, 1, AxisType::Loop);
    // j is ended around another store, but the second store uses j without being inside it
    let inner = a.index(&j).store(0.0f32).end(&[j.clone()]);
    let outer = a.index(&i * 4 + &j).store(1.0f32);
    let p = sink(&[sink(&[inner, outer]).end(&[i])]);
    let e = verify(&p).unwrap_err();
    assert_eq!(e.kind, IrErrorKind::StoreOutsideRange, "{e}");
    assert!(e.node.contains("STORE"), "{e}");
}

#[test]
fn verifier_rejects_never_ended_range() {
    let a = buffer(0, DType::F32, 4);
    let i = range(4, 0, AxisType::Loop);
    let p = sink(&[a.index(&i).store(1.0f32)]);
    let e = verify(&p).unwrap_err();
    assert_eq!(e.kind, IrErrorKind::RangeNotEnded, "{e}");
}

#[test]
fn verifier_rejects_unordered_stores_to_one_element() {
    // Found by fuzzing: `acc[0] = -16; acc[0] = 0.609375` with nothing ordering the two left
    // the choice to the linearizer's tie-break, which differed between the original program
    // (interpreter) and the simplified one (JIT).
    let out = buffer(0, DType::F32, 4);
    let acc = alloc(0, DType::F32, 1);
    let i = range(4, 0, AxisType::Loop);
    let first = acc.after(&[i.clone()]).index(0).store(-16.0f32);
    let second = acc.after(&[i.clone()]).index(0).store(0.609375f32);
    let read = acc.after(&[first.clone(), second.clone()]).index(0).load();
    let p = sink(&[out.index(&i).store(read).end(&[i.clone()])]);
    let e = verify(&p).unwrap_err();
    assert_eq!(e.kind, IrErrorKind::UnorderedStores, "{e}");

    // Ordered by AFTER, the same two stores are fine: the second one wins.
    let second = acc.after(&[first.clone()]).index(0).store(0.609375f32);
    let read = acc.after(&[second]).index(0).load();
    let p = sink(&[out.index(&i).store(read).end(&[i.clone()])]);
    verify(&p).unwrap();

    // Unordered stores to provably different elements are fine too (unrolled outputs).
    let j = range(2, 1, AxisType::Loop);
    let wide = buffer(1, DType::F32, 8);
    let p = sink(&[
        wide.index(&j * 4 + 1).store(1.0f32).end(&[j.clone()]),
        wide.index(&j * 4).store(2.0f32).end(&[j.clone()]),
    ]);
    verify(&p).unwrap();
    // ... but not stores that overlap across two loops nothing orders.
    let k = range(8, 2, AxisType::Loop);
    let p = sink(&[wide.index(&j * 4).store(2.0f32).end(&[j]), wide.index(&k).store(3.0f32).end(&[k])]);
    assert_eq!(verify(&p).unwrap_err().kind, IrErrorKind::UnorderedStores);
}

#[test]
fn verifier_rejects_uninitialized_alloc_load() {
    let a = buffer(0, DType::F32, 4);
    let acc = alloc(0, DType::F32, 1);
    let i = range(4, 0, AxisType::Loop);
    let p = sink(&[a.index(&i).store(acc.after(&[i.clone()]).index(0).load()).end(&[i])]);
    let e = verify(&p).unwrap_err();
    assert_eq!(e.kind, IrErrorKind::UninitializedLoad, "{e}");
    assert!(e.node.contains("LOAD"), "{e}");
}

#[test]
fn verifier_rejects_alloc_shared_across_threads() {
    let a = buffer(0, DType::F32, 16);
    let out = buffer(1, DType::F32, 4);
    let acc = alloc(0, DType::F32, 1);
    let i = range(4, 0, AxisType::Thread);
    let j = range(4, 1, AxisType::Reduce);
    // declared outside i: acc.after(j) only
    let init = acc.index(0).store(0.0f32);
    let acc_j = acc.after(&[init, i.clone(), j.clone()]);
    let upd = acc_j.index(0).store(acc_j.index(0).load() + a.index(&i * 4 + &j).load()).end(&[j]);
    let st = out.index(&i).store(acc.after(&[upd]).index(0).load());
    let e = verify(&sink(&[st.end(&[i])])).unwrap_err();
    assert_eq!(e.kind, IrErrorKind::ThreadRace, "{e}");
}

#[test]
fn verifier_rejects_out_of_bounds_index() {
    let a = buffer(0, DType::F32, 4);
    let i = range(5, 0, AxisType::Loop);
    let e = verify(&sink(&[a.index(&i).store(1.0f32).end(&[i])])).unwrap_err();
    assert_eq!(e.kind, IrErrorKind::OutOfBounds, "{e}");
    assert!(e.reason.contains("[0, 4]"), "{e}");
}

#[test]
fn verifier_rejects_tensor_ops() {
    let a = buffer(0, DType::F32, 4);
    let r = UOp::new(Op::Reshape(vec![2, 2]), DType::F32, vec![a.index(0).load()]);
    let e = verify(&sink(&[a.index(0).store(r)])).unwrap_err();
    assert_eq!(e.kind, IrErrorKind::Structure, "{e}");
}

#[test]
fn ranges_with_expression_ends_verify() {
    // causal-style: j runs to i inclusive
    let a = buffer(0, DType::F32, 16);
    let i = range(4, 0, AxisType::Loop);
    let j = range(&i + 1, 1, AxisType::Loop);
    let p = sink(&[a.index(&i * 4 + &j).store(1.0f32).end(&[j, i])]);
    let text = print_linear(&verify(&p).expect("ragged ranges are fine"));
    assert!(text.contains("for r1 in 0..(r0 + 1)"), "{text}");
}

#[test]
fn deep_integer_chains_simplify_verify_and_print_without_recursion() {
    let a = buffer(0, DType::F32, 5);
    let i = range(5, 0, AxisType::Loop);
    let mut x = i.clone();
    let depth: usize = std::env::var("DEPTH").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    for _ in 0..depth {
        x = (&x + &i).modulo(5);
    }
    let p = sink(&[a.index(&x).store(1.0f32).end(&[i])]);
    let s = simplify(&p);
    let text = print_program(&s).expect("verifies");
    assert!(text.contains("for r0 in 0..5"));
}

fn gemm_op(m: usize, n: usize, k: usize, accumulate: bool) -> TileOp {
    TileOp::Gemm(GemmShape {
        m,
        n,
        k,
        lda: k,
        ldb: n,
        ldc: n,
        a_trans: false,
        b_trans: false,
        accumulate,
        b_panel_width: 0,
        b_pair_panels: false,
        parallel: false,
    })
}

#[test]
fn tile_ops_are_checked_like_stores() {
    let (a, b, c) = (buffer(0, DType::F32, 6), buffer(1, DType::F32, 12), buffer(2, DType::F32, 8));
    // C (2x4) = A (2x3) · B (3x4): every operand exactly in bounds
    let ok = tile(gemm_op(2, 4, 3, false), &[a.index(0), b.index(0), c.index(0)]);
    verify(&sink(&[ok])).unwrap();
    // C starting one element later would run past its 8 elements
    let past = tile(gemm_op(2, 4, 3, false), &[a.index(0), b.index(0), c.index(1)]);
    assert_eq!(verify(&sink(&[past])).unwrap_err().kind, IrErrorKind::OutOfBounds);
    // a row stride shorter than the row
    let bad = TileOp::Gemm(GemmShape {
        m: 2,
        n: 4,
        k: 3,
        lda: 2,
        ldb: 4,
        ldc: 4,
        a_trans: false,
        b_trans: false,
        accumulate: false,
        b_panel_width: 0,
        b_pair_panels: false,
        parallel: false,
    });
    let short = tile(bad, &[a.index(0), b.index(0), c.index(0)]);
    assert_eq!(verify(&sink(&[short])).unwrap_err().kind, IrErrorKind::Structure);
    // operands must be INDEX nodes of f32 views
    let not_index = tile(gemm_op(2, 4, 3, false), &[a.index(0), b.index(0), c.index(0).load()]);
    assert!(verify(&sink(&[not_index])).is_err());
    // two tile ops writing C with nothing ordering them
    let first = tile(gemm_op(2, 4, 3, false), &[a.index(0), b.index(0), c.index(0)]);
    let second = tile(gemm_op(2, 4, 3, true), &[a.index(0), b.index(0), c.index(0)]);
    assert_eq!(verify(&sink(&[first.clone(), second])).unwrap_err().kind, IrErrorKind::UnorderedStores);
    let ordered = tile(gemm_op(2, 4, 3, true), &[a.index(0), b.index(0), c.after(&[first.clone()]).index(0)]);
    verify(&sink(&[ordered])).unwrap();
    // reading an ALLOC nothing wrote
    let scratch = alloc(0, DType::F32, 6);
    let uninit = tile(gemm_op(2, 4, 3, false), &[scratch.index(0), b.index(0), c.index(0)]);
    assert_eq!(verify(&sink(&[uninit])).unwrap_err().kind, IrErrorKind::UninitializedLoad);
}

#[test]
fn gemms_with_b_in_panels_are_bounded_by_their_panels_and_take_only_f32() {
    let (a, c) = (buffer(0, DType::F32, 6), buffer(2, DType::F32, 40));
    // C (2x20) = A (2x3) · B in two panels of 16 columns, 50 apart: 50 + 3 * 16 elements
    let op = TileOp::Gemm(GemmShape {
        ldb: 50,
        b_panel_width: 16,
        ..GemmShape::dense(2, 20, 3, false, false, false)
    });
    let b = buffer(1, DType::F32, 98);
    verify(&sink(&[tile(op, &[a.index(0), b.index(0), c.index(0)])])).unwrap();
    let short = buffer(1, DType::F32, 97);
    let past = tile(op, &[a.index(0), short.index(0), c.index(0)]);
    assert_eq!(verify(&sink(&[past])).unwrap_err().kind, IrErrorKind::OutOfBounds);
    // panels closer than a panel's length overlap
    let overlapping = TileOp::Gemm(GemmShape {
        ldb: 47,
        b_panel_width: 16,
        ..GemmShape::dense(2, 20, 3, false, false, false)
    });
    let err = verify(&sink(&[tile(overlapping, &[a.index(0), b.index(0), c.index(0)])])).unwrap_err();
    assert_eq!(err.kind, IrErrorKind::Structure);
    // the 16-bit GEMMs do not read panels
    let (ah, bh) = (buffer(0, DType::BF16, 6), buffer(1, DType::BF16, 98));
    let err = verify(&sink(&[tile(op, &[ah.index(0), bh.index(0), c.index(0)])])).unwrap_err();
    assert_eq!(err.kind, IrErrorKind::DType);
}

/// A bf16 GEMM reads B in pair panels as `GemmShape::b_index` places it: the verifier bounds
/// it by whole steps of 32 k rows, takes it only from bf16 operands, and the interpreter gives
/// the product of the B that was packed.
#[test]
fn bf16_gemms_read_b_in_pair_panels() {
    use uopc_ir::interp::{self, Precision};
    // C (2x40) = A (2x3) · B (3x40) in two pair panels 1100 apart: 1100 + 1024 elements.
    let op = GemmShape {
        ldb: 1100,
        b_panel_width: 32,
        b_pair_panels: true,
        ..GemmShape::dense(2, 40, 3, false, false, false)
    };
    let (a, c) = (buffer(0, DType::BF16, 6), buffer(2, DType::F32, 80));
    let b = buffer(1, DType::BF16, 2124);
    let p = sink(&[tile(TileOp::Gemm(op), &[a.index(0), b.index(0), c.index(0)])]);
    verify(&p).unwrap();
    let short = buffer(1, DType::BF16, 2123);
    let past = tile(TileOp::Gemm(op), &[a.index(0), short.index(0), c.index(0)]);
    assert_eq!(verify(&sink(&[past])).unwrap_err().kind, IrErrorKind::OutOfBounds);
    let f32_b = tile(TileOp::Gemm(op), &[a.index(0), buffer(1, DType::F32, 2124).index(0), c.index(0)]);
    assert_eq!(verify(&sink(&[f32_b])).unwrap_err().kind, IrErrorKind::DType);
    let narrow = TileOp::Gemm(GemmShape { b_panel_width: 16, ..op });
    let err = verify(&sink(&[tile(narrow, &[a.index(0), b.index(0), c.index(0)])])).unwrap_err();
    assert_eq!(err.kind, IrErrorKind::DType);
    let plain = |p: usize, j: usize| ((p * 40 + j) % 7) as f32 - 3.0;
    let mut panels = vec![half::bf16::ZERO; 2124];
    for pp in 0..3 {
        for j in 0..40 {
            panels[op.b_index(pp, j)] = half::bf16::from_f32(plain(pp, j));
        }
    }
    let av = [1.0f32, 2.0, -1.0, 0.5, 0.0, 3.0];
    let mut bufs = vec![
        HostBuffer::BF16(av.iter().map(|&x| half::bf16::from_f32(x)).collect()),
        HostBuffer::BF16(panels),
        HostBuffer::F32(vec![0.0; 80]),
    ];
    interp::run(&p, &mut bufs, Precision::Native).unwrap();
    let HostBuffer::F32(got) = &bufs[2] else { unreachable!() };
    for i in 0..2 {
        for j in 0..40 {
            let want: f32 = (0..3).map(|pp| av[i * 3 + pp] * plain(pp, j)).sum();
            assert_eq!(got[i * 40 + j], want, "C[{i}][{j}]");
        }
    }
}

#[test]
fn only_a_bf16_gemm_may_write_a_bf16_c_and_only_overwriting_it() {
    let (a, b, c) = (buffer(0, DType::BF16, 6), buffer(1, DType::BF16, 12), buffer(2, DType::BF16, 8));
    let gemm = |accumulate: bool, a: &UOp, c: &UOp| {
        tile(gemm_op(2, 4, 3, accumulate), &[a.index(0), b.index(0), c.index(0)])
    };
    verify(&sink(&[gemm(false, &a, &c)])).unwrap();
    // a bf16 C cannot carry the f32 sums of an accumulating GEMM
    assert_eq!(verify(&sink(&[gemm(true, &a, &c)])).unwrap_err().kind, IrErrorKind::DType);
    // f32 operands, or an f16 C, have no rounded GEMM
    let a32 = buffer(0, DType::F32, 6);
    let mixed =
        tile(gemm_op(2, 4, 3, false), &[a32.index(0), buffer(1, DType::F32, 12).index(0), c.index(0)]);
    assert_eq!(verify(&sink(&[mixed])).unwrap_err().kind, IrErrorKind::DType);
    let c16 = buffer(2, DType::F16, 8);
    assert_eq!(verify(&sink(&[gemm(false, &a, &c16)])).unwrap_err().kind, IrErrorKind::DType);
}

#[test]
fn tile_ops_run_in_the_interpreter() {
    use uopc_ir::interp::{self, Precision};
    let (a, b, c) = (buffer(0, DType::F32, 6), buffer(1, DType::F32, 12), buffer(2, DType::F32, 8));
    // C = A · B^T with B stored 4x3
    let op = TileOp::Gemm(GemmShape {
        m: 2,
        n: 4,
        k: 3,
        lda: 3,
        ldb: 3,
        ldc: 4,
        a_trans: false,
        b_trans: true,
        accumulate: false,
        b_panel_width: 0,
        b_pair_panels: false,
        parallel: false,
    });
    let p = sink(&[tile(op, &[a.index(0), b.index(0), c.index(0)])]);
    let av: Vec<f32> = (0..6).map(|x| x as f32).collect();
    let bv: Vec<f32> = (0..12).map(|x| (x % 5) as f32 - 2.0).collect();
    let mut bufs =
        vec![HostBuffer::F32(av.clone()), HostBuffer::F32(bv.clone()), HostBuffer::F32(vec![0.0; 8])];
    interp::run(&p, &mut bufs, Precision::Native).unwrap();
    let HostBuffer::F32(got) = &bufs[2] else { unreachable!() };
    for i in 0..2 {
        for j in 0..4 {
            let want: f32 = (0..3).map(|p| av[i * 3 + p] * bv[j * 3 + p]).sum();
            assert_eq!(got[i * 4 + j], want, "C[{i}][{j}]");
        }
    }
}

#[test]
fn simplify_creates_new_nodes_in_source_order() {
    // `i * 1 + k` simplifies to `i + k`, so every load below is rebuilt. The linearizer breaks
    // ties by creation order, so the rebuilt loads must be created first operand first.
    let a = buffer(0, DType::F32, 64);
    let i = range(8, 0, AxisType::Loop);
    let sum = (0..8i64).map(|k| a.index(&i * 1 + k).load()).reduce(|x, y| x + y).expect("eight terms");
    let out = buffer(1, DType::F32, 8);
    let program = sink(&[out.index(&i).store(sum).end(&[i.clone()])]);
    let simplified = simplify(&program);
    let ids: Vec<u64> = UOp::toposort(std::slice::from_ref(&simplified))
        .iter()
        .filter(|u| matches!(u.op(), Op::Load))
        .map(|u| u.id())
        .collect();
    assert_eq!(ids.len(), 8);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "loads rebuilt out of source order: {ids:?}");
}

#[test]
fn linearizer_stores_each_value_as_soon_as_it_is_ready() {
    // All values are created before any store. Placed by creation order alone, the four
    // products would be computed first and all live at once; a store goes as soon as its value
    // is ready instead, so at most one computed value waits for its store.
    let a = buffer(0, DType::F32, 32);
    let out = buffer(1, DType::F32, 32);
    let i = range(8, 0, AxisType::Loop);
    let values: Vec<UOp> = (0..4i64).map(|k| a.index(&i * 4 + k).load() * 2.0f32).collect();
    let stores: Vec<UOp> =
        values.iter().enumerate().map(|(k, v)| out.index(&i * 4 + k as i64).store(v)).collect();
    let lin = linearize(&sink(&[sink(&stores).end(&[i.clone()])])).expect("well formed");
    let mut waiting = 0usize;
    let mut most = 0usize;
    for (_, s) in lin.walk() {
        let Stmt::Op(u) = s else { continue };
        match u.op() {
            Op::Binary(BinaryOp::Mul) if u.dtype() == DType::F32 => waiting += 1,
            Op::Store => waiting -= 1,
            _ => {}
        }
        most = most.max(waiting);
    }
    assert_eq!(most, 1, "{}", print_linear(&lin));
}

#[test]
fn loops_each_inside_the_other_are_an_error_not_a_panic() {
    // A simplified mutant: r2's loop runs inside r1's (its END's store reads r1), yet the store
    // closing r1 reads a view ordered after r2's END; once r0 (one trip) is forced around the
    // stores, neither path is the shorter one. The linearizer once indexed a missing entry.
    let (flags, out, a) = (alloc(0, DType::Bool, 6), buffer(1, DType::Bool, 3), buffer(0, DType::F64, 3));
    let (r0, r1, r2) =
        (range(1, 0, AxisType::Loop), range(5, 1, AxisType::Loop), range(6, 2, AxisType::Loop));
    let fill = flags.index(&r2).store(a.index((&r1 + &r2 * 2 + 1) % 3).load().cast(DType::Bool)).end(&[r2]);
    let read = flags.after(&[fill]).index(((&r1 * 3) % 6).maximum(&r1)).load();
    let program = sink(&[out.index(1).store(read).end(&[r1, r0])]);
    let e = verify_simplified(&program).unwrap_err();
    assert_eq!(e.kind, IrErrorKind::Structure, "{e}");
}

#[test]
fn stores_every_element_holds_only_for_one_to_one_walks_of_plain_stores() {
    let n = 24;
    let (x, out) = (buffer(0, DType::F32, n), buffer(1, DType::F32, n));
    let (i, j, k) = (range(2, 0, AxisType::Thread), range(3, 1, AxisType::Loop), range(4, 2, AxisType::Loop));
    let store = |at: UOp, ends: &[UOp]| sink(&[out.index(&at).store(x.index(&at).load()).end(ends)]);
    let all = [k.clone(), j.clone(), i.clone()];
    let row_major = &i * 12i64 + &j * 4i64 + &k;
    assert!(stores_every_element(&store(row_major.clone(), &all), 1), "row-major over all three");
    // the order of the ranges in the index does not matter, their strides do
    assert!(stores_every_element(&store(&k + &i * 12i64 + &j * 4i64, &all), 1), "terms in another order");
    assert!(stores_every_element(&store(&i + &k * 6i64 + &j * 2i64, &all), 1), "a permuted walk");
    // the same input read at the written index is not a read of the output
    assert!(!stores_every_element(&store(row_major.clone(), &all), 0), "slot 0 is only read");
    assert!(!stores_every_element(&store(row_major.clone(), &all), 5), "there is no slot 5");
    let wide = buffer(1, DType::F32, 26);
    let gap = sink(&[wide.index(&(&i * 13i64 + &j * 4i64 + &k)).store(1.0f32).end(&all)]);
    assert!(!stores_every_element(&gap, 1), "a gap between rows: elements 12 and 25 are never written");
    let overlap = sink(&[out.index(&(&i * 12i64 + &j * 3i64 + &k)).store(1.0f32).end(&all)]);
    assert!(!stores_every_element(&overlap, 1), "overlapping strides: elements 10, 11, 22 and 23 are missed");
    let (a, b) = (range(2, 3, AxisType::Loop), range(3, 4, AxisType::Loop));
    let shifted = buffer(1, DType::F32, 7);
    let offset = sink(&[shifted.index(&(&a * 3i64 + &b + 1i64)).store(1.0f32).end(&[b.clone(), a.clone()])]);
    assert!(!stores_every_element(&offset, 1), "an offset: element 0 is never written");
    // a loop ending at a variable may run short of the buffer
    let v = range(var(0, 1, 24), 5, AxisType::Loop);
    let prefix = sink(&[out.index(&v).store(1.0f32).end(std::slice::from_ref(&v))]);
    assert!(!stores_every_element(&prefix, 1), "a runtime-length loop");
    // the output also read (an accumulation into it) is not written before it is read
    let acc = out.index(&row_major);
    let accumulate = sink(&[acc.store(acc.load() + x.index(&row_major).load()).end(&all)]);
    assert!(!stores_every_element(&accumulate, 1), "read as well as written");
    // a tile op writing into the output: its extent is not analysed
    let tiled = sink(&[tile(
        TileOp::ExpRows { rows: 1, cols: n, ldx: n, ldy: n, scale: 1.0f32.to_bits() },
        &[x.index(0i64), x.index(0i64), out.index(0i64)],
    )]);
    assert!(!stores_every_element(&tiled, 1), "written by a tile op");
}

#[test]
fn a_dense_store_covers_its_buffer_only_inside_loops_that_run() {
    let n = 16;
    let (x, out) = (buffer(0, DType::F32, n), buffer(1, DType::F32, n));
    let i = range(n, 0, AxisType::Loop);
    // The store's index walks the whole buffer, but its value uses a loop around it.
    let inside = |outer: &UOp| {
        let value = x.index(&i).load() + outer.cast(DType::F32);
        sink(&[out.index(&i).store(value).end(&[i.clone(), outer.clone()])])
    };
    assert!(!stores_every_element(&inside(&range(0, 1, AxisType::Loop)), 1), "an empty constant loop");
    assert!(
        !stores_every_element(&inside(&range(var(0, 0, 8), 1, AxisType::Loop)), 1),
        "a variable that may be 0"
    );
    assert!(!stores_every_element(&inside(&range(0, 1, AxisType::Thread)), 1), "an empty THREAD loop");
    assert!(stores_every_element(&inside(&range(3, 1, AxisType::Loop)), 1), "a loop of three trips");
    assert!(
        stores_every_element(&inside(&range(var(0, 1, 8), 1, AxisType::Loop)), 1),
        "a variable of at least 1"
    );
    // A loop around the store that its value does not use still encloses it.
    let (r, k) = (range(0, 2, AxisType::Loop), range(4, 3, AxisType::Loop));
    let acc = x.index(&k);
    let around = sink(&[
        acc.store(acc.load() + r.cast(DType::F32)).end(&[k.clone()]).end(&[r.clone()]),
        out.index(&i).store(1.0f32).end(std::slice::from_ref(&i)),
    ]);
    assert!(stores_every_element(&around, 1), "the empty loop holds another store, not this one");
    // As the backend compiles it: the prepared kernel's linear form gives the same answer.
    let kernel = uopc_ir::prepare(&inside(&range(0, 1, AxisType::Loop)), &Default::default()).unwrap();
    assert!(!uopc_ir::stores_every_element_linear(&kernel.linear, 1));
}

#[test]
fn shapes_of_deep_and_shared_graphs_are_computed_without_recursion() {
    use uopc_ir::{BinaryOp, DType, Op, UOp};
    let param = |slot| UOp::new(Op::Param { slot, shape: vec![3, 4] }, DType::F32, vec![]);
    let add = |a: &UOp, b: &UOp| UOp::new(Op::Binary(BinaryOp::Add), DType::F32, vec![a.clone(), b.clone()]);
    // A chain far deeper than a recursive walk's stack, each node reading the one before twice
    // (a diamond per level), asked for its shape only at the top.
    let mut x = param(0);
    for _ in 0..200_000 {
        x = add(&x, &x);
    }
    assert_eq!(x.shape(), &[3, 4]);
    // A node over shaped sources, and a permute over the chain, take their shapes from them.
    let y = UOp::new(Op::Permute(vec![1, 0]), DType::F32, vec![add(&x, &param(1))]);
    assert_eq!(y.shape(), &[4, 3]);
}
