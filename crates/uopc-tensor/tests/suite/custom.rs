//! Hand-written loop programs as graph nodes: planned and run like any kernel, fed by
//! computed sources, differentiated through their equivalent graph, and checked on input.

use uopc_ir::{AxisType, DType, buffer, range, sink};
use uopc_tensor::{RealizeOptions, Tensor, TensorError, gradient, make_plan};

/// `out[i] = 2 a[i] + b[i]` over `n` elements, as a loop program.
fn axpy(n: usize) -> uopc_ir::UOp {
    let (a, b, out) = (buffer(0, DType::F32, n), buffer(1, DType::F32, n), buffer(2, DType::F32, n));
    let i = range(n, 0, AxisType::Loop);
    sink(&[out.index(&i).store(a.index(&i).load() * 2.0f32 + b.index(&i).load()).end(&[i])])
}

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 + seed * 13) % 11) as f32 / 4.0 - 1.0).collect()
}

#[test]
fn a_custom_kernel_runs_between_compiler_kernels() {
    let (a, b) = (Tensor::from_vec(values(12, 1), &[3, 4]), Tensor::from_vec(values(12, 2), &[3, 4]));
    // One source is computed (a transposed view, materialized first), one is an input.
    let at = a.transpose(0, 1).reshape(&[3, 4]).exp();
    let y = Tensor::try_custom("axpy", axpy(12), &[&at, &b], &[3, 4], DType::F32, None).unwrap();
    let z = (&y + 1.0).sum(1, false);
    let got = z.to_ndarray::<f32>().unwrap();
    let (av, bv) = (values(12, 1), values(12, 2));
    for r in 0..3 {
        let want: f64 = (0..4)
            .map(|c| {
                let flat = r * 4 + c;
                let (i, j) = (flat / 3, flat % 3); // element (i, j) of the 4 x 3 transpose
                2.0 * f64::from(av[j * 4 + i]).exp() + f64::from(bv[flat]) + 1.0
            })
            .sum();
        assert!((f64::from(got[r]) - want).abs() < 1e-4, "row {r}: {} vs {want}", got[r]);
    }
    let plan = make_plan(&[z.uop().clone()], &RealizeOptions::default()).unwrap();
    let names = plan.kernel_names();
    assert_eq!(names.len(), 3, "{names:?}");
    assert_eq!(names[1], "axpy", "the source kernel, then the custom one, then the consumer: {names:?}");
}

#[test]
fn gradients_flow_through_the_equivalent_graph() {
    let (a, b) = (Tensor::from_vec(values(6, 3), &[6]), Tensor::from_vec(values(6, 4), &[6]));
    let equivalent = &a * 2.0 + &b;
    let y = Tensor::try_custom("axpy", axpy(6), &[&a, &b], &[6], DType::F32, Some(equivalent)).unwrap();
    let loss = (&y * &y).sum(0, false);
    let g = gradient(&loss, &[&a, &b]).unwrap();
    let (ga, gb) = (g[0].to_ndarray::<f32>().unwrap(), g[1].to_ndarray::<f32>().unwrap());
    for i in 0..6 {
        let yv = 2.0 * values(6, 3)[i] + values(6, 4)[i];
        assert!((ga[i] - 4.0 * yv).abs() < 1e-5 && (gb[i] - 2.0 * yv).abs() < 1e-5);
    }
    // Without an equivalent there is no gradient, and asking is an error naming the kernel.
    let bare = Tensor::try_custom("axpy", axpy(6), &[&a, &b], &[6], DType::F32, None).unwrap();
    let err = gradient(&bare.sum(0, false), &[&a]).unwrap_err();
    assert!(err.to_string().contains("axpy"), "{err}");
}

#[test]
fn slots_that_do_not_fit_the_sources_are_errors() {
    let (a, b) = (Tensor::from_vec(values(6, 1), &[6]), Tensor::from_vec(values(5, 2), &[5]));
    let err = |e: TensorError| e.to_string();
    let short = Tensor::try_custom("axpy", axpy(6), &[&a, &b], &[6], DType::F32, None).unwrap_err();
    assert!(err(short).contains("slot 1"));
    let missing = Tensor::try_custom("axpy", axpy(6), &[&a], &[6], DType::F32, None).unwrap_err();
    assert!(err(missing).contains("slot 2"));
    let out = Tensor::try_custom("axpy", axpy(6), &[&a, &a], &[7], DType::F32, None).unwrap_err();
    assert!(err(out).contains("output"));
    let eq = Tensor::try_custom("axpy", axpy(6), &[&a, &a], &[6], DType::F32, Some(b)).unwrap_err();
    assert!(err(eq).contains("equivalent"));
}

#[test]
fn an_attached_gradient_rule_replaces_the_equivalent() {
    let (a, b) = (Tensor::from_vec(values(6, 5), &[6]), Tensor::from_vec(values(6, 6), &[6]));
    // The rule is called with the sources, the node and the cotangent; here it is the exact
    // gradient of 2a + b, built as another custom kernel for a and plainly for b.
    let rule: std::sync::Arc<uopc_tensor::CustomVjp> =
        std::sync::Arc::new(|src: &[Tensor], out: &Tensor, g: &Tensor| {
            assert_eq!((src.len(), out.shape()), (2, g.shape()));
            let twice = Tensor::try_custom("axpy", axpy(6), &[g, &(g * 0.0)], &[6], DType::F32, None)?;
            Ok(vec![Some(twice), Some(g.clone())])
        });
    let y = Tensor::try_custom("axpy", axpy(6), &[&a, &b], &[6], DType::F32, None)
        .unwrap()
        .with_custom_vjp(rule)
        .unwrap();
    let g = gradient(&(&y * &y).sum(0, false), &[&a, &b]).unwrap();
    let (ga, gb) = (g[0].to_ndarray::<f32>().unwrap(), g[1].to_ndarray::<f32>().unwrap());
    for i in 0..6 {
        let yv = 2.0 * values(6, 5)[i] + values(6, 6)[i];
        assert!((ga[i] - 4.0 * yv).abs() < 1e-5 && (gb[i] - 2.0 * yv).abs() < 1e-5);
    }
    assert!(
        a.with_custom_vjp(std::sync::Arc::new(|_: &[Tensor], _: &Tensor, _: &Tensor| Ok(vec![]))).is_err()
    );
}

#[test]
fn a_program_with_two_outputs_is_one_node_of_both() {
    let n = 5;
    let (a, o0, o1) = (buffer(0, DType::F32, n), buffer(1, DType::F32, n), buffer(2, DType::F32, 2 * n));
    let i = range(n, 0, AxisType::Loop);
    let prog = sink(&[
        o0.index(&i).store(a.index(&i).load() * 2.0f32),
        o1.index(&i * 2).store(a.index(&i).load() + 1.0f32),
        o1.index(&i * 2 + 1).store(a.index(&i).load() - 1.0f32),
    ]);
    let prog = sink(&[prog.end(&[i])]);
    let x = Tensor::from_vec(values(n, 7), &[n]);
    let both = Tensor::try_custom_parts("two", prog, &[&x], &[n, 2 * n], None).unwrap();
    assert_eq!(both.shape(), &[3 * n]);
    let (first, second) = (both.slice(0, 0, n), both.slice(0, n, 3 * n).reshape(&[n, 2]));
    let (f, s) = (first.to_ndarray::<f32>().unwrap(), (&second * 1.0).to_ndarray::<f32>().unwrap());
    let xv = values(n, 7);
    for k in 0..n {
        assert_eq!(f[k], xv[k] * 2.0);
        assert_eq!((s[[k, 0]], s[[k, 1]]), (xv[k] + 1.0, xv[k] - 1.0));
    }
    assert!(Tensor::try_custom_parts("two", axpy(5), &[&x], &[], None).is_err());
}

#[test]
fn outputs_are_zeroed_unless_their_kernel_writes_every_element() {
    // A custom program that writes only the first half of its output: the rest reads as 0,
    // since only an output its kernel provably writes whole is left unzeroed.
    let n = 4096;
    let (a, out) = (buffer(0, DType::F32, n), buffer(1, DType::F32, n));
    let i = range(n / 2, 0, AxisType::Loop);
    let half = sink(&[out.index(&i).store(a.index(&i).load() + 1.0f32).end(&[i])]);
    let x = Tensor::from_vec(vec![1.0f32; n], &[n]);
    for _ in 0..3 {
        // again and again, so freed memory of earlier outputs comes back
        let y = Tensor::try_custom("half", half.clone(), &[&x], &[n], DType::F32, None).unwrap();
        let plan = make_plan(&[y.uop().clone()], &RealizeOptions::default()).unwrap();
        assert_eq!(plan.unzeroed_outputs(), 0, "{plan}");
        let got = y.to_ndarray::<f32>().unwrap();
        assert!(got.iter().take(n / 2).all(|&v| v == 2.0) && got.iter().skip(n / 2).all(|&v| v == 0.0));
        drop(Tensor::from_vec(vec![7.0f32; n], &[n]).exp().to_ndarray::<f32>().unwrap());
        // into a caller's buffer: what the kernel does not write is zeroed there too
        let mut out = vec![7.0f32; n];
        y.realize_into(&mut out).unwrap();
        assert!(out[..n / 2].iter().all(|&v| v == 2.0) && out[n / 2..].iter().all(|&v| v == 0.0));
    }
    // The compiler's elementwise kernel stores every element: its output is not zeroed first.
    let y = (&x * 3.0).exp();
    let plan = make_plan(&[y.uop().clone()], &RealizeOptions::default()).unwrap();
    assert_eq!(plan.unzeroed_outputs(), 1, "{plan}");
    let mut out = vec![f32::NAN; n];
    y.realize_into(&mut out).unwrap();
    assert!(out.iter().all(|&v| (v / 3.0f32.exp() - 1.0).abs() < 1e-6), "every element written");
    // the vector exponential is within a few ulp of the library's
    assert!(y.to_ndarray::<f32>().unwrap().iter().all(|&v| (v / 3.0f32.exp() - 1.0).abs() < 1e-6));
}

#[test]
fn a_custom_kernel_whose_store_never_runs_leaves_zeros_not_old_memory() {
    let n = 1 << 16;
    // Fill the allocator with non-zero buffers first, so fresh memory would show their bytes.
    for _ in 0..4 {
        let junk = Tensor::from_vec(vec![7.5f32; n], &[n]).exp();
        assert_eq!(junk.to_ndarray::<f32>().unwrap().len(), n);
    }
    let (x, out) = (buffer(0, DType::F32, n), buffer(1, DType::F32, n));
    let i = range(n, 0, AxisType::Loop);
    let empty = range(0, 1, AxisType::Loop);
    let value = x.index(&i).load() + empty.cast(DType::F32);
    let program = sink(&[out.index(&i).store(value).end(&[i, empty])]);
    let a = Tensor::from_vec(vec![1.0f32; n], &[n]);
    let y = Tensor::try_custom("never_stores", program, &[&a], &[n], DType::F32, None).unwrap();
    let got = y.to_ndarray::<f32>().unwrap();
    let written = got.iter().filter(|v| **v != 0.0).count();
    assert_eq!(written, 0, "{written} of {n} elements hold values no store wrote");
}

#[test]
fn a_graph_rebuilt_with_a_new_gradient_rule_reuses_its_plan() {
    // A training loop builds its graph again every step, each custom node with a fresh
    // gradient rule (compared by identity): the plan must not be built again for it.
    let node = |seed: usize| {
        let (a, b) = (Tensor::from_vec(values(7, seed), &[7]), Tensor::from_vec(values(7, seed + 1), &[7]));
        let rule: std::sync::Arc<uopc_tensor::CustomVjp> =
            std::sync::Arc::new(|_: &[Tensor], _: &Tensor, g: &Tensor| {
                Ok(vec![Some(g * 2.0), Some(g.clone())])
            });
        let y = Tensor::try_custom("axpy", axpy(7), &[&a, &b], &[7], DType::F32, None).unwrap();
        (y.with_custom_vjp(rule).unwrap() * 3.0).sum(0, false)
    };
    let opts = RealizeOptions::default();
    let (first, _) = node(1).realize_with(&opts).unwrap();
    let (second, report) = node(2).realize_with(&opts).unwrap();
    assert!(report.cache_hit, "the second step's graph hits the plan cache");
    let want = |seed: usize| -> f32 {
        (0..7).map(|i| 3.0 * (2.0 * values(7, seed)[i] + values(7, seed + 1)[i])).sum()
    };
    assert!((first.item().unwrap() - want(1)).abs() < 1e-4);
    assert!((second.item().unwrap() - want(2)).abs() < 1e-4);
}
