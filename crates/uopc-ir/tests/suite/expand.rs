//! The reference lowering of tile ops: `expand_tile_ops` against the interpreter's own tile
//! semantics, bit for bit in both precisions (both evaluate in f64 and round each stored value
//! once), and against naive f64 loops written here.

use proptest::prelude::*;
use uopc_ir::interp::{self, Precision};
use uopc_ir::*;
use uopc_testgen::rng::uniform_values as values;
use uopc_testgen::tile_cases::*;

fn run(program: &UOp, inputs: &[HostBuffer], precision: Precision) -> Vec<HostBuffer> {
    let mut bufs = inputs.to_vec();
    interp::run(program, &mut bufs, precision).expect("interprets");
    bufs
}

/// The expansion has no tile op, verifies, and gives the tile program's bits in both
/// precisions. Returns the (native) result.
fn check_expansion(case: &Case) -> Vec<HostBuffer> {
    let expanded = expand_tile_ops(&case.program);
    assert!(has_tile_op(&case.program));
    assert!(!has_tile_op(&expanded), "{}", print_program(&expanded).unwrap_or_default());
    verify(&expanded).expect("the expansion verifies");
    let mut native = Vec::new();
    for precision in [Precision::Native, Precision::F64] {
        let want = run(&case.program, &case.inputs, precision);
        let got = run(&expanded, &case.inputs, precision);
        assert_eq!(bits(&got), bits(&want), "{precision:?}");
        if precision == Precision::Native {
            native = got;
        }
    }
    native
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn expanded_gemm_is_the_interpreters_bit_for_bit(
        m in 1usize..20, n in 1usize..20, k in 0usize..20,
        a_trans: bool, b_trans: bool, accumulate: bool,
        pad in 0usize..3, offset in 0usize..3, tasks in 1usize..4, seed in 0u64..1000,
    ) {
        let g = GemmCase { m, n, k, a_trans, b_trans, accumulate, pad, offset };
        check_expansion(&gemm_case(g, tasks, seed));
    }

    #[test]
    fn expanded_gemm_with_b_in_panels_is_the_interpreters_bit_for_bit(
        m in 1usize..20, n in 1usize..40, k in 0usize..20, width in 1usize..18,
        a_trans: bool, accumulate: bool,
        pad in 0usize..3, offset in 0usize..3, tasks in 1usize..4, seed in 0u64..1000,
    ) {
        let g = GemmCase { m, n, k, a_trans, b_trans: false, accumulate, pad, offset };
        check_expansion(&gemm_panels_case(g, width, tasks, seed));
    }

    #[test]
    fn expanded_bf16_gemm_is_the_interpreters_bit_for_bit(
        m in 1usize..20, n in 1usize..20, k in 0usize..20,
        a_trans: bool, b_trans: bool, accumulate: bool,
        pad in 0usize..3, offset in 0usize..3, tasks in 1usize..4, seed in 0u64..1000,
    ) {
        let g = GemmCase { m, n, k, a_trans, b_trans, accumulate, pad, offset };
        check_expansion(&gemm_bf16_case(g, tasks, seed));
    }

    #[test]
    fn expanded_rounded_bf16_gemm_is_the_interpreters_bit_for_bit(
        m in 1usize..20, n in 1usize..20, k in 0usize..20, a_trans: bool, b_trans: bool,
        pad in 0usize..3, offset in 0usize..3, tasks in 1usize..4, seed in 0u64..1000,
    ) {
        let g = GemmCase { m, n, k, a_trans, b_trans, accumulate: false, pad, offset };
        check_expansion(&gemm_bf16_rounded_case(g, tasks, seed));
    }

    #[test]
    fn expanded_rounded_f16_gemm_is_the_interpreters_bit_for_bit(
        m in 1usize..20, n in 1usize..20, k in 0usize..20, a_trans: bool, b_trans: bool,
        pad in 0usize..3, offset in 0usize..3, tasks in 1usize..4, seed in 0u64..1000,
    ) {
        let g = GemmCase { m, n, k, a_trans, b_trans, accumulate: false, pad, offset };
        check_expansion(&gemm_f16_rounded_case(g, tasks, seed));
    }

    #[test]
    fn expanded_f16_gemm_is_the_interpreters_bit_for_bit(
        m in 1usize..20, n in 1usize..20, k in 0usize..20,
        a_trans: bool, b_trans: bool, accumulate: bool,
        pad in 0usize..3, offset in 0usize..3, tasks in 1usize..4, seed in 0u64..1000,
    ) {
        let g = GemmCase { m, n, k, a_trans, b_trans, accumulate, pad, offset };
        check_expansion(&gemm_f16_case(g, tasks, seed));
    }

    #[test]
    fn expanded_softmax_update_is_the_interpreters_bit_for_bit(
        rows in 1usize..10, cols in 0usize..40, d in 0usize..20, pad in 0usize..3,
        offset in 0usize..3, tasks in 1usize..3, special: bool, seed in 0u64..1000,
    ) {
        let s = SoftmaxShape { rows, cols, d, pad, offset };
        check_expansion(&softmax_case(s, tasks, special, seed));
    }

    #[test]
    fn expanded_scaled_softmax_update_is_the_interpreters_bit_for_bit(
        rows in 1usize..10, cols in 0usize..40, d in 0usize..20, pad in 0usize..3,
        offset in 0usize..3, tasks in 1usize..3, special: bool,
        scale in prop::sample::select(vec![0.125f32, std::f32::consts::LOG2_E, 2.5]), seed in 0u64..1000,
    ) {
        let s = SoftmaxShape { rows, cols, d, pad, offset };
        check_expansion(&softmax_scaled_case(s, scale, tasks, special, seed));
    }

    #[test]
    fn expanded_rounded_softmax_update_is_the_interpreters_bit_for_bit(
        rows in 1usize..10, cols in 0usize..40, d in 0usize..20, pad in 0usize..3,
        offset in 0usize..3, tasks in 1usize..3, special: bool, f16_probs: bool,
        scale in prop::sample::select(vec![0.125f32, 1.0, std::f32::consts::LOG2_E]), seed in 0u64..1000,
    ) {
        let s = SoftmaxShape { rows, cols, d, pad, offset };
        let p_dtype = if f16_probs { DType::F16 } else { DType::BF16 };
        check_expansion(&softmax_rounded_case(s, p_dtype, scale, tasks, special, seed));
    }

    #[test]
    fn expanded_block_conversion_is_the_interpreters_bit_for_bit(
        rows in 1usize..6, cols in 0usize..40, pad in 0usize..3, offset in 0usize..3,
        tasks in 1usize..3, pair in 0usize..4, seed in 0u64..1000,
    ) {
        let (from, to) = [(DType::F16, DType::F32), (DType::BF16, DType::F32), (DType::F32, DType::F16), (DType::F32, DType::BF16)][pair];
        check_expansion(&convert_case((rows, cols, pad, offset), from, to, tasks, seed));
    }

    #[test]
    fn expanded_in_place_rounded_softmax_update_is_the_interpreters_bit_for_bit(
        rows in 1usize..10, cols in 0usize..40, d in 0usize..20, pad in 0usize..3,
        offset in 0usize..3, tasks in 1usize..3, special: bool, f16_probs: bool,
        scale in prop::sample::select(vec![0.125f32, 1.0, std::f32::consts::LOG2_E]), seed in 0u64..1000,
    ) {
        let s = SoftmaxShape { rows, cols, d, pad, offset };
        let round_to = if f16_probs { DType::F16 } else { DType::BF16 };
        let case = softmax_rounded_in_place_case(s, round_to, scale, tasks, special, seed);
        let got = check_expansion(&case);
        // Every probability written over a score is a value of the 16-bit type.
        let p = f32s(&got[0]);
        for task in 0..tasks {
            for r in 0..rows {
                for j in 0..cols {
                    let x = p[task * s.lens()[0] + offset + r * (cols + pad) + j];
                    let back =
                        if f16_probs { half::f16::from_f32(x).to_f32() } else { half::bf16::from_f32(x).to_f32() };
                    prop_assert!(back.to_bits() == x.to_bits(), "P[{}, {}] = {} is not rounded", r, j, x);
                }
            }
        }
    }
}

#[test]
fn every_gemm_layout_matches_naive_f64_loops() {
    for flags in 0..8 {
        let (a_trans, b_trans, accumulate) = (flags & 1 != 0, flags & 2 != 0, flags & 4 != 0);
        let g = GemmCase { m: 5, n: 7, k: 9, a_trans, b_trans, accumulate, pad: 2, offset: 1 };
        let tasks = 2;
        let case = gemm_case(g, tasks, 17 + flags);
        let got = check_expansion(&case);
        let (a, b, c0) = (f32s(&case.inputs[0]), f32s(&case.inputs[1]), f32s(&case.inputs[2]));
        let mut want = c0.to_vec();
        for t in 0..tasks {
            for i in 0..g.m {
                for j in 0..g.n {
                    // summed in p order in f64 and rounded once, so equal, not close
                    let mut acc = if accumulate { c0[g.c_pos(t, i, j)] as f64 } else { 0.0 };
                    for p in 0..g.k {
                        acc += g.a_at(a, t, i, p) as f64 * g.b_at(b, p, j) as f64;
                    }
                    want[g.c_pos(t, i, j)] = acc as f32;
                }
            }
        }
        assert_eq!(f32s(&got[2]), &want[..], "flags {flags}");
        assert_ne!(c0, &want[..], "the test must change C");
    }
}

#[test]
fn the_softmax_update_matches_naive_f64_loops() {
    let s = SoftmaxShape { rows: 6, cols: 11, d: 5, pad: 1, offset: 2 };
    let case = softmax_case(s, 1, true, 5);
    let got = check_expansion(&case);
    let mut bufs: Vec<Vec<f32>> = case.inputs.iter().map(|b| f32s(b).to_vec()).collect();
    let (lds, ldo, at) = (s.cols + s.pad, s.d + s.pad, s.offset);
    for r in 0..s.rows {
        let m_old = bufs[1][at + r] as f64;
        let row = at + r * lds..at + r * lds + s.cols;
        let m_new = bufs[0][row.clone()].iter().fold(m_old, |m, &x| m.max(x as f64));
        let (alpha, mut sum) =
            if m_new == f64::NEG_INFINITY { (1.0, 0.0) } else { ((m_old - m_new).exp2(), 0.0) };
        for x in &mut bufs[0][row] {
            let p = if m_new == f64::NEG_INFINITY { 0.0 } else { (*x as f64 - m_new).exp2() };
            *x = p as f32;
            sum += p;
        }
        bufs[2][at + r] = (bufs[2][at + r] as f64 * alpha + sum) as f32;
        for o in &mut bufs[3][at + r * ldo..at + r * ldo + s.d] {
            *o = (*o as f64 * alpha) as f32;
        }
        bufs[1][at + r] = m_new as f32;
    }
    for (k, want) in bufs.iter().enumerate() {
        assert_eq!(f32s(&got[k]), &want[..], "buffer {k}");
    }
    // the all -inf row kept its sum and O, with P = 0 and no NaN anywhere
    assert!(bufs.iter().flatten().all(|x| !x.is_nan()));
    assert_eq!(f32s(&got[2])[at], f32s(&case.inputs[2])[at]);
    assert!(f32s(&got[0])[at..at + s.cols].iter().all(|&p| p == 0.0));
}

#[test]
fn empty_dimensions_touch_what_the_interpreter_touches() {
    for (m, n, k) in [(0, 4, 3), (3, 0, 2), (3, 4, 0), (1, 1, 0)] {
        for accumulate in [false, true] {
            let g = GemmCase { m, n, k, a_trans: false, b_trans: true, accumulate, pad: 1, offset: 1 };
            let case = gemm_case(g, 2, 3);
            let expanded = expand_tile_ops(&case.program);
            assert!(!has_tile_op(&expanded));
            verify(&expanded).unwrap();
            let want = run(&case.program, &case.inputs, Precision::Native);
            assert_eq!(bits(&run(&expanded, &case.inputs, Precision::Native)), bits(&want));
            if k == 0 && m * n > 0 && !accumulate {
                assert_eq!(f32s(&want[2])[0], 0.0, "an empty sum overwrites C with zeros");
            }
        }
    }
    for (rows, cols, d) in [(0, 3, 2), (3, 0, 2), (3, 4, 0), (2, 0, 0)] {
        let case = softmax_case(SoftmaxShape { rows, cols, d, pad: 1, offset: 1 }, 2, false, 9);
        let expanded = expand_tile_ops(&case.program);
        assert!(!has_tile_op(&expanded));
        verify(&expanded).unwrap();
        let want = run(&case.program, &case.inputs, Precision::Native);
        assert_eq!(bits(&run(&expanded, &case.inputs, Precision::Native)), bits(&want));
    }
}

#[test]
fn programs_without_tile_ops_come_back_as_the_same_node() {
    let (a, out) = (buffer(0, DType::F32, 8), buffer(1, DType::F32, 2));
    let i = range(2, 0, AxisType::Loop);
    let kk = range(4, 1, AxisType::Reduce);
    let acc = alloc(0, DType::F32, 1).after(std::slice::from_ref(&i));
    let start = acc.index(0).store(0.0f32);
    let inner = acc.after(&[start, kk.clone()]);
    let step = inner.index(0).store(inner.index(0).load() + a.index(&i * 4 + &kk).load());
    let total = acc.after(&[step.end(&[kk])]).index(0).load();
    let program = sink(&[out.index(&i).store(total).end(&[i])]);
    assert!(expand_tile_ops(&program) == program);
}

#[test]
fn new_ranges_and_allocs_do_not_reuse_ids_or_slots() {
    // Ranges 0 and 9 and ALLOC slot 4 exist: C is computed into the ALLOC, then copied out.
    let (m, n, k) = (3, 4, 5);
    let (a, b, out) =
        (buffer(0, DType::F32, m * k), buffer(1, DType::F32, k * n), buffer(2, DType::F32, m * n));
    let scratch = alloc(4, DType::F32, m * n);
    let g = tile(
        TileOp::Gemm(uopc_ir::GemmShape {
            m,
            n,
            k,
            lda: k,
            ldb: n,
            ldc: n,
            a_trans: false,
            b_trans: false,
            accumulate: false,
            b_panel_width: 0,
            b_pair_panels: false,
            parallel: false,
        }),
        &[a.index(0), b.index(0), scratch.index(0)],
    );
    let i = range(m, 0, AxisType::Loop);
    let j = range(n, 9, AxisType::Loop);
    let at = &i * n + &j;
    let copy = out.index(&at).store(scratch.after(&[g]).index(&at).load());
    let program = sink(&[copy.end(&[j, i])]);
    let expanded = expand_tile_ops(&program);
    verify(&expanded).unwrap();

    let nodes = UOp::toposort(std::slice::from_ref(&expanded));
    let mut range_ids: Vec<usize> = nodes
        .iter()
        .filter_map(|u| if let Op::Range { id, .. } = u.op() { Some(id.index()) } else { None })
        .collect();
    range_ids.sort();
    let count = range_ids.len();
    range_ids.dedup();
    assert_eq!(range_ids.len(), count, "two RANGE nodes share an id: {range_ids:?}");
    assert!(count > 2 && range_ids[2..].iter().all(|&id| id > 9), "{range_ids:?}");
    let slots: Vec<usize> = nodes
        .iter()
        .filter_map(|u| if let Op::Alloc { slot, .. } = u.op() { Some(slot.index()) } else { None })
        .collect();
    assert!(slots.contains(&4) && slots.iter().filter(|&&s| s != 4).all(|&s| s > 4), "{slots:?}");

    let inputs = vec![
        HostBuffer::F32(values(m * k, 1)),
        HostBuffer::F32(values(k * n, 2)),
        HostBuffer::F32(vec![0.0; m * n]),
    ];
    let want = run(&program, &inputs, Precision::Native);
    assert_eq!(bits(&run(&expanded, &inputs, Precision::Native)), bits(&want));
}

#[test]
fn loads_of_the_written_view_elsewhere_still_come_first() {
    // A copy of C through the very view the GEMM writes, with no dependency either way: the
    // linearizer puts loads of a view before stores through it, so the copy sees the old C,
    // with the tile op and with its expansion.
    let (m, n, k) = (2, 3, 4);
    let (a, b, c) =
        (buffer(0, DType::F32, m * k), buffer(1, DType::F32, k * n), buffer(2, DType::F32, m * n));
    let old = buffer(3, DType::F32, m * n);
    let g = tile(
        TileOp::Gemm(uopc_ir::GemmShape {
            m,
            n,
            k,
            lda: k,
            ldb: n,
            ldc: n,
            a_trans: false,
            b_trans: false,
            accumulate: true,
            b_panel_width: 0,
            b_pair_panels: false,
            parallel: false,
        }),
        &[a.index(0), b.index(0), c.index(0)],
    );
    let e = range(m * n, 0, AxisType::Loop);
    let copy = old.index(&e).store(c.index(&e).load()).end(&[e]);
    let program = sink(&[copy, g]);
    let c0 = values(m * n, 3);
    let inputs = vec![
        HostBuffer::F32(values(m * k, 1)),
        HostBuffer::F32(values(k * n, 2)),
        HostBuffer::F32(c0.clone()),
        HostBuffer::F32(vec![0.0; m * n]),
    ];
    let want = run(&program, &inputs, Precision::Native);
    assert_eq!(f32s(&want[3]), &c0[..]);
    let expanded = expand_tile_ops(&program);
    verify(&expanded).unwrap();
    assert_eq!(bits(&run(&expanded, &inputs, Precision::Native)), bits(&want));
}

#[test]
fn chained_tile_ops_keep_their_order() {
    let (n, d, br, bc) = (12, 5, 4, 3);
    let program = flash_on_tile_ops(n, d, br, bc);
    let inputs = flash_inputs(n, d, 40);
    let got = check_expansion(&Case { program, inputs: inputs.clone() });

    // softmax(Q K^T in base 2) V in f64
    let (q, k, v) = (f32s(&inputs[0]), f32s(&inputs[1]), f32s(&inputs[2]));
    for i in 0..n {
        let sc: Vec<f64> =
            (0..n).map(|j| (0..d).map(|e| q[i * d + e] as f64 * k[j * d + e] as f64).sum()).collect();
        let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = sc.iter().map(|x| (x - m).exp2()).collect();
        let l: f64 = p.iter().sum();
        for e in 0..d {
            let want = (0..n).map(|j| p[j] * v[j * d + e] as f64).sum::<f64>() / l;
            let x = f32s(&got[3])[i * d + e] as f64;
            // S, P and O are rounded to f32 between the tile ops: a few f32 ulps of error
            assert!((x - want).abs() <= 1e-5 * (1.0 + want.abs()), "out[{i}][{e}] = {x}, want {want}");
        }
    }
}

#[test]
fn operands_in_one_buffer() {
    // row_max and row_sum in one buffer through one view: distinct elements, so it expands and
    // agrees bit for bit.
    let (rows, cols, d) = (3, 5, 2);
    let (s, ml, o) = (
        buffer(0, DType::F32, rows * cols),
        buffer(1, DType::F32, 2 * rows),
        buffer(2, DType::F32, rows * d),
    );
    let op = TileOp::SoftmaxUpdate { rows, cols, lds: cols, d, ldo: d, scale: 1f32.to_bits() };
    let program = sink(&[tile(op, &[s.index(0), ml.index(0), ml.index(rows as i64), o.index(0)])]);
    let inputs = vec![
        HostBuffer::F32(values(rows * cols, 1)),
        HostBuffer::F32(values(2 * rows, 2).iter().map(|x| x.abs() + 0.5).collect()),
        HostBuffer::F32(values(rows * d, 3)),
    ];
    check_expansion(&Case { program, inputs });

    // S and O through one view: every load of the view must come before every store through
    // it in a row, which the loops over S and O cannot both do. The expansion is rejected by
    // the verifier (the documented limit) instead of running in a wrong order.
    let so = buffer(0, DType::F32, rows * cols + rows * d);
    let (mx, l) = (buffer(1, DType::F32, rows), buffer(2, DType::F32, rows));
    let shared = tile(op, &[so.index(0), mx.index(0), l.index(0), so.index((rows * cols) as i64)]);
    let program = sink(&[shared]);
    verify(&program).unwrap();
    let err = verify(&expand_tile_ops(&program)).unwrap_err();
    assert_eq!(err.kind, IrErrorKind::Structure, "{err}");
}
