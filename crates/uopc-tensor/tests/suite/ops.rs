//! Every Tensor op against an f64 ndarray reference, with broadcasting and non-contiguous
//! views. Tolerance: results are f32 (about 6e-8 relative per rounding) and each check goes
//! through at most a few dozen roundings (a 32-term reduce, exp2's polynomial), so 1e-5
//! relative to 1 + |value| leaves a wide margin while still catching any wrong element.

use crate::common::*;
use ndarray::{ArrayD, Axis, IxDyn, s};
use uopc_tensor::*;

const TOL: f64 = 1e-5;

fn t(a: &ArrayD<f32>) -> Tensor {
    Tensor::from_array(a)
}

fn get(t: &Tensor) -> ArrayD<f32> {
    t.to_ndarray::<f32>().expect("realizes")
}

#[test]
fn binary_ops_broadcast_like_numpy() {
    let a = uniform(&[3, 1, 4], -2.0, 2.0, 1);
    let b = uniform(&[5, 1], 0.5, 2.0, 2);
    let (ra, rb) = (f64s(&a), f64s(&b));
    let (ta, tb) = (t(&a), t(&b));
    assert_eq!((&ta + &tb).shape(), [3, 5, 4]);
    assert_close(&get(&(&ta + &tb)), &(&ra + &rb), TOL);
    assert_close(&get(&(&ta - &tb)), &(&ra - &rb), TOL);
    assert_close(&get(&(&ta * &tb)), &(&ra * &rb), TOL);
    assert_close(&get(&(&ta / &tb)), &(&ra / &rb), TOL);
    let mx = ndarray::Zip::from(&ra.broadcast(IxDyn(&[3, 5, 4])).unwrap())
        .and(&rb.broadcast(IxDyn(&[3, 5, 4])).unwrap())
        .map_collect(|&x, &y| x.max(y));
    assert_close(&get(&ta.maximum(&tb)), &mx, TOL);
}

#[test]
fn scalar_operands_on_both_sides() {
    let a = uniform(&[4, 3], 0.5, 2.0, 3);
    let (ra, ta) = (f64s(&a), t(&a));
    assert_close(&get(&(&ta + 2.0)), &(&ra + 2.0), TOL);
    assert_close(&get(&(2.0 - &ta)), &(2.0 - &ra), TOL);
    assert_close(&get(&(&ta * 3.0)), &(&ra * 3.0), TOL);
    assert_close(&get(&(&ta / 4.0)), &(&ra / 4.0), TOL);
    assert_close(&get(&(1.0 / &ta)), &ra.mapv(|x| 1.0 / x), TOL);
    assert_close(&get(&(-&ta)), &(-&ra), TOL);
}

#[test]
fn unary_ops() {
    let a = uniform(&[2, 5], 0.1, 3.0, 4);
    let (ra, ta) = (f64s(&a), t(&a));
    assert_close(&get(&ta.exp()), &ra.mapv(f64::exp), TOL);
    assert_close(&get(&ta.exp2()), &ra.mapv(f64::exp2), TOL);
    assert_close(&get(&ta.log()), &ra.mapv(f64::ln), TOL);
    assert_close(&get(&ta.log2()), &ra.mapv(f64::log2), TOL);
    assert_close(&get(&ta.sqrt()), &ra.mapv(f64::sqrt), TOL);
    assert_close(&get(&ta.recip()), &ra.mapv(|x| 1.0 / x), TOL);
    let b = uniform(&[2, 5], -1.0, 1.0, 5);
    assert_close(&get(&t(&b).relu()), &f64s(&b).mapv(|x| x.max(0.0)), TOL);
    assert_close(&get(&t(&b).neg()), &f64s(&b).mapv(|x| -x), TOL);
    assert_close(&get(&t(&b).detach()), &f64s(&b), 0.0);
}

#[test]
fn comparisons_and_where() {
    let a = uniform(&[3, 4], -1.0, 1.0, 6);
    let mut b = uniform(&[4], -1.0, 1.0, 7);
    b[[1]] = a[[0, 1]]; // an exact tie, to tell < from <=
    let (ta, tb) = (t(&a), t(&b));
    let cmp = |f: fn(f32, f32) -> bool| {
        ArrayD::from_shape_fn(IxDyn(&[3, 4]), |ix| f(a[[ix[0], ix[1]]], b[[ix[1]]]) as u8 as f64)
    };
    assert_close(&get(&ta.lt(&tb)), &cmp(|x, y| x < y), 0.0);
    assert_close(&get(&ta.gt(&tb)), &cmp(|x, y| x > y), 0.0);
    assert_close(&get(&ta.le(&tb)), &cmp(|x, y| x <= y), 0.0);
    assert_close(&get(&ta.ge(&tb)), &cmp(|x, y| x >= y), 0.0);
    assert_close(&get(&ta.eq(&tb)), &cmp(|x, y| x == y), 0.0);
    assert_close(&get(&ta.ne(&tb)), &cmp(|x, y| x != y), 0.0);
    let w = ta.lt(&tb).where_(&ta, &(&tb * 10.0));
    let want = ArrayD::from_shape_fn(IxDyn(&[3, 4]), |ix| {
        let (x, y) = (a[[ix[0], ix[1]]] as f64, b[[ix[1]]] as f64);
        if x < y { x } else { y * 10.0 }
    });
    assert_close(&get(&w), &want, TOL);
}

#[test]
fn reductions_over_every_axis_with_keepdim() {
    let a = uniform(&[3, 4, 5], -2.0, 2.0, 8);
    let (ra, ta) = (f64s(&a), t(&a));
    for axis in 0..3 {
        let sum = ra.sum_axis(Axis(axis));
        let max = ra.map_axis(Axis(axis), |l| l.iter().cloned().fold(f64::NEG_INFINITY, f64::max));
        assert_close(&get(&ta.sum(axis as isize, false)), &sum, TOL);
        assert_close(&get(&ta.max(axis as isize, false)), &max, 0.0);
        let kept = ta.sum(axis as isize, true);
        let mut shape = vec![3, 4, 5];
        shape[axis] = 1;
        assert_eq!(kept.shape(), shape.as_slice());
        assert_close(&get(&kept), &sum.insert_axis(Axis(axis)), TOL);
    }
    assert_close(&get(&ta.sum(-1, false)), &ra.sum_axis(Axis(2)), TOL);
}

#[test]
fn reductions_of_non_contiguous_views() {
    let a = uniform(&[6, 5, 4], -2.0, 2.0, 9);
    let ra = f64s(&a);
    // permute then shrink: a strided, offset view
    let view = t(&a).permute(&[2, 0, 1]).shrink(&[(1, 3), (2, 6), (0, 5)]);
    let rv = ra.view().permuted_axes(vec![2, 0, 1]).slice(s![1..3, 2..6, 0..5]).to_owned().into_dyn();
    assert_close(&get(&view), &rv, 0.0);
    assert_close(&get(&view.sum(1, true)), &rv.sum_axis(Axis(1)).insert_axis(Axis(1)), TOL);
    assert_close(
        &get(&view.max(2, false)),
        &rv.map_axis(Axis(2), |l| l.iter().cloned().fold(f64::NEG_INFINITY, f64::max)).into_dyn(),
        0.0,
    );
}

#[test]
fn movement_ops() {
    let a = uniform(&[2, 3, 4], -1.0, 1.0, 10);
    let (ra, ta) = (f64s(&a), t(&a));
    let r = ta.reshape(&[6, 4]);
    assert_close(&get(&r), &ra.clone().into_shape_with_order(IxDyn(&[6, 4])).unwrap(), 0.0);
    let tr = ta.transpose(0, 2);
    assert_close(&get(&tr), &ra.view().permuted_axes(vec![2, 1, 0]).to_owned(), 0.0);
    let m = ta.reshape(&[6, 4]).t();
    let rm = ra.clone().into_shape_with_order(IxDyn(&[6, 4])).unwrap().reversed_axes();
    assert_close(&get(&m), &rm, 0.0);
    // reshape of a transposed view needs the index arithmetic, not a stride trick
    let rt = tr.reshape(&[4, 6]);
    let want = ra
        .view()
        .permuted_axes(vec![2, 1, 0])
        .as_standard_layout()
        .into_owned()
        .into_shape_with_order(IxDyn(&[4, 6]))
        .unwrap();
    assert_close(&get(&rt), &want, 0.0);
    let e = t(&uniform(&[3, 1], -1.0, 1.0, 11)).expand(&[3, 5]);
    assert_eq!(get(&e).shape(), [3, 5]);
    assert_close(&get(&ta.slice(1, 1, 3)), &ra.slice(s![.., 1..3, ..]).to_owned().into_dyn(), 0.0);
    assert_close(&get(&Tensor::full(&[2, 2], 7.0)), &ArrayD::from_elem(IxDyn(&[2, 2]), 7.0), 0.0);
}

#[test]
fn stack_and_cat() {
    let a = uniform(&[2, 3], -1.0, 1.0, 12);
    let b = uniform(&[2, 3], -1.0, 1.0, 13);
    let c = uniform(&[2, 5], -1.0, 1.0, 14);
    let (ta, tb, tc) = (t(&a), t(&b), t(&c));
    let views = [f64s(&a), f64s(&b)];
    for axis in 0..3 {
        let want = ndarray::stack(Axis(axis), &[views[0].view(), views[1].view()]).unwrap();
        assert_close(&get(&Tensor::stack(&[&ta, &tb], axis as isize)), &want, 0.0);
    }
    let want = ndarray::concatenate(Axis(1), &[views[0].view(), f64s(&c).view(), views[1].view()]).unwrap();
    assert_close(&get(&Tensor::cat(&[&ta, &tc, &tb], 1)), &want, 0.0);
    let want = ndarray::concatenate(Axis(0), &[views[0].view(), views[1].view()]).unwrap();
    assert_close(&get(&Tensor::cat(&[&ta, &tb], 0)), &want, 0.0);
}

/// Sizes along the axis whose gcd cuts them into many chunks (37, 1 and 20: gcd 1, 58 chunks;
/// a long sum's gradient pads a 69632-element body with a 368-element tail: 4352 chunks) are
/// concatenated exactly, and their kernel selects among the inputs: one WHERE per input, not
/// one per chunk (per chunk, the gradient of such a sum took seconds).
#[test]
fn cat_of_sizes_with_a_small_gcd_selects_among_its_inputs() {
    let parts = [
        uniform(&[2, 37, 3], -1.0, 1.0, 21),
        uniform(&[2, 1, 3], -1.0, 1.0, 22),
        uniform(&[2, 20, 3], -1.0, 1.0, 23),
    ];
    let tensors: Vec<Tensor> = parts.iter().map(t).collect();
    let refs: Vec<&Tensor> = tensors.iter().collect();
    let views: Vec<ArrayD<f64>> = parts.iter().map(f64s).collect();
    let want = ndarray::concatenate(Axis(1), &views.iter().map(|v| v.view()).collect::<Vec<_>>()).unwrap();
    let joined = Tensor::cat(&refs, 1);
    assert_close(&get(&joined), &want, 0.0);
    // Reversed, along another axis, and with integer parts promoted to the widest dtype.
    let want = ndarray::concatenate(Axis(1), &[views[2].view(), views[0].view()]).unwrap();
    assert_close(&get(&Tensor::cat(&[&tensors[2], &tensors[0]], 1)), &want, 0.0);
    let ints = Tensor::from_vec((0..17i64).collect::<Vec<_>>(), &[17]);
    let one = Tensor::from_vec(vec![0.5f32], &[1]);
    let mixed = Tensor::cat(&[&ints, &one], 0).to_ndarray::<f32>().unwrap();
    let expected: Vec<f32> = (0..17).map(|i| i as f32).chain([0.5]).collect();
    assert_eq!(mixed.as_slice(), Some(&expected[..]));
    let plan = make_plan(&[joined.uop().clone()], &RealizeOptions::default()).unwrap();
    let selects: usize = plan
        .kernels
        .iter()
        .map(|k| {
            uopc_ir::UOp::toposort(&[k.program.clone()])
                .iter()
                .filter(|u| matches!(u.op(), uopc_ir::Op::Where))
                .count()
        })
        .sum();
    assert!(selects <= 2 * refs.len(), "{selects} selects for {} inputs: {plan}", refs.len());
    // The gradient of a long sum whose length fills no whole block (a slice of the body,
    // padded back by a cat of very different sizes) is 1 everywhere.
    let n = 70_000;
    let x = Tensor::from_vec(vec![0.25f32; n], &[n]);
    let grad = gradient(&x.sum(0, false), &[&x]).unwrap().remove(0).to_ndarray::<f32>().unwrap();
    assert!(grad.iter().all(|&g| g == 1.0), "{:?}", grad.iter().find(|&&g| g != 1.0));
}

/// A kernel over few batch items (3 x 5 rows of 16) runs its items and rows as one THREAD range
/// of 15 iterations, not 3 (on two cores three tasks split 2:1), and still computes the
/// right values; with many items axis 0 alone is threaded.
#[test]
fn few_leading_items_are_threaded_with_the_rows_after_them() {
    for (shape, trips) in [([3, 5, 16], 15), ([100, 5, 16], 100), ([1, 5, 16], 5)] {
        let x = uniform(&shape, -1.0, 1.0, 31);
        let y = t(&x).softmax(-1) * 2.0f32 + t(&x);
        let want = {
            let e = f64s(&x).mapv(f64::exp);
            let sums = e.sum_axis(Axis(2)).insert_axis(Axis(2));
            &e / &sums * 2.0 + f64s(&x)
        };
        assert_close(&get(&y), &want, 1e-6);
        let plan = make_plan(&[y.uop().clone()], &RealizeOptions::default()).unwrap();
        let thread_trips: Vec<i64> = plan
            .kernels
            .iter()
            .flat_map(|k| uopc_ir::UOp::toposort(&[k.program.clone()]))
            .filter_map(|u| {
                let r = u.as_range()?;
                (r.axis == uopc_ir::AxisType::Thread).then(|| r.end.const_int()).flatten()
            })
            .collect();
        assert!(
            !thread_trips.is_empty() && thread_trips.iter().all(|&n| n == trips),
            "{shape:?}: {thread_trips:?}\n{plan}"
        );
        #[cfg(feature = "jit")]
        for k in &plan.kernels {
            let program = uopc_jit::Program::compile(&k.program, &k.name).unwrap();
            assert!(program.is_parallel(), "{shape:?}: {} runs serially", k.name);
        }
    }
}

/// An elementwise kernel of one axis (or of one axis and others of size 1) runs its THREAD
/// range over runs of consecutive elements, each an inner loop the backend vectorizes (a
/// THREAD range of single elements ran scalar code, 3 to 6 times slower), with the same
/// values; a length with no suitable run (a prime) keeps one element per iteration.
#[test]
fn one_axis_elementwise_kernels_thread_over_runs_of_elements() {
    for (shape, trips) in
        [(vec![64_000], 64), (vec![64_000, 1], 64), (vec![1, 64_000], 64), (vec![1_009], 1_009)]
    {
        let x = uniform(&shape, -2.0, 2.0, 41);
        let y = t(&x).gelu_tanh() * 3.0f32 + 1.0f32;
        let want = f64s(&x).mapv(|v| {
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v);
            0.5 * v * (1.0 + inner.tanh()) * 3.0 + 1.0
        });
        assert_close(&get(&y), &want, 1e-5);
        let plan = make_plan(&[y.uop().clone()], &RealizeOptions::default()).unwrap();
        let [kernel] = &plan.kernels[..] else { panic!("one kernel: {plan}") };
        let thread = uopc_ir::UOp::toposort(&[kernel.program.clone()]).into_iter().find_map(|u| {
            u.as_range().filter(|r| r.axis == uopc_ir::AxisType::Thread).and_then(|r| r.end.const_int())
        });
        assert_eq!(thread, Some(trips), "{shape:?}\n{plan}");
        #[cfg(feature = "jit")]
        assert!(
            uopc_jit::Program::compile(&kernel.program, &kernel.name).unwrap().is_parallel(),
            "{shape:?}"
        );
    }
}

/// Kernels whose leading axes are all of size 1 (nothing to thread before the last axis)
/// still compile and compute: the THREAD range is left out rather than made over one
/// iteration that no index uses.
#[test]
fn kernels_over_axes_of_size_one_compute() {
    for shape in [vec![1, 1, 3], vec![1, 1, 1], vec![1, 3, 1, 1]] {
        let x = uniform(&shape, -1.0, 1.0, 51);
        assert_close(&get(&(t(&x) * 2.0f32 + 1.0f32)), &f64s(&x).mapv(|v| v * 2.0 + 1.0), 1e-6);
        let last = shape.len() - 1;
        assert_close(&get(&t(&x).sum(last as isize, false)), &f64s(&x).sum_axis(Axis(last)), 1e-6);
    }
}

fn matmul_ref(a: &ArrayD<f64>, b: &ArrayD<f64>) -> ArrayD<f64> {
    let (n, k, m) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    ArrayD::from_shape_fn(IxDyn(&[n, m]), |ix| (0..k).map(|p| a[[ix[0], p]] * b[[p, ix[1]]]).sum())
}

#[test]
fn matmul_including_transposed_and_odd_shapes() {
    for (n, k, m) in [(8, 16, 12), (5, 7, 3), (1, 4, 1), (16, 3, 20)] {
        let a = uniform(&[n, k], -1.0, 1.0, 15);
        let b = uniform(&[k, m], -1.0, 1.0, 16);
        assert_close(&get(&t(&a).matmul(&t(&b))), &matmul_ref(&f64s(&a), &f64s(&b)), TOL);
        // b given as the transpose of an (m, k) array: a non-contiguous operand
        let bt = uniform(&[m, k], -1.0, 1.0, 17);
        let rb = f64s(&bt).reversed_axes();
        assert_close(&get(&t(&a).matmul(&t(&bt).t())), &matmul_ref(&f64s(&a), &rb), TOL);
    }
}

#[test]
fn softmax_along_each_axis() {
    let a = uniform(&[3, 4, 5], -3.0, 3.0, 18);
    let ra = f64s(&a);
    for axis in 0..3 {
        let m = ra
            .map_axis(Axis(axis), |l| l.iter().cloned().fold(f64::NEG_INFINITY, f64::max))
            .insert_axis(Axis(axis));
        let e = (&ra - &m).mapv(f64::exp);
        let want = &e / &e.sum_axis(Axis(axis)).insert_axis(Axis(axis));
        assert_close(&get(&t(&a).softmax(axis as isize)), &want, TOL);
    }
}

#[test]
fn f64_tensors_round_trip_and_compute() {
    let a = ndarray::arr2(&[[1.0f64, 2.0], [3.0, 4.0]]);
    let ta = Tensor::try_from(a.clone()).unwrap();
    assert_eq!(ta.dtype(), uopc_ir::DType::F64);
    let got = (&ta * &ta).sum(1, false).to_ndarray::<f64>().unwrap();
    assert_eq!(got, ndarray::arr1(&[5.0, 25.0]).into_dyn());
}

/// The address of a data-backed f32 tensor's elements.
fn f32_data_ptr(t: &Tensor) -> *const f32 {
    let uopc_ir::Op::Data { data, .. } = t.uop().op() else { panic!("{t:?} is not data") };
    match data.0.downcast_ref::<uopc_ir::HostBuffer>() {
        Some(uopc_ir::HostBuffer::F32(v)) => v.as_ptr(),
        _ => panic!("not f32 data"),
    }
}

#[test]
fn owned_arrays_convert_without_a_copy_and_never_panic() {
    use ndarray::{Array2, s};
    // standard layout: the buffer moves into the tensor
    let a = Array2::from_shape_fn((3, 4), |(i, j)| (i * 4 + j) as f32);
    let moved = a.clone();
    let ptr = moved.as_ptr();
    let t = Tensor::try_from(moved).unwrap();
    assert_eq!(f32_data_ptr(&t), ptr);
    assert_eq!(t.to_ndarray::<f32>().unwrap(), a.clone().into_dyn());
    // a transposed array is copied in logical order
    let t = Tensor::try_from(a.clone().reversed_axes()).unwrap();
    assert_eq!(t.shape(), [4, 3]);
    assert_eq!(t.to_ndarray::<f32>().unwrap(), a.t().to_owned().into_dyn());
    // an owned array sliced in place starts at an offset into its buffer
    let mut rows = a.clone();
    rows.slice_collapse(s![1.., ..]);
    let t = Tensor::try_from(rows.clone()).unwrap();
    assert_eq!(t.to_ndarray::<f32>().unwrap(), rows.into_dyn());
    // a zero-length axis gives an empty tensor that reads back as the same empty array
    let empty = Array2::<f32>::zeros((0, 3));
    assert_eq!(
        Tensor::try_from(empty.clone()).unwrap().to_ndarray::<f32>().unwrap(),
        empty.clone().into_dyn()
    );
    assert_eq!(Tensor::try_from_array(&empty.t()).unwrap().shape(), [3, 0]);
    // the re-exported ndarray is the one the conversions use
    let _: uopc_tensor::ndarray::ArrayD<f32> = Tensor::from_array(&a).to_ndarray().unwrap();
}

#[test]
fn fused_and_unfused_agree_on_a_reduce_chain() {
    let a = uniform(&[8, 16], -2.0, 2.0, 19);
    let x = t(&a);
    let y = (&x - &x.max(1, true)).exp().sum(0, true) * &x;
    let unfused = get(&y);
    let fused = y.to_ndarray_with::<f32>(&RealizeOptions::fused()).unwrap();
    assert_close(&fused, &f64s(&unfused), TOL);
}

#[test]
fn errors_name_the_public_op_the_user_called() {
    let err = |r: uopc_tensor::Result<Tensor>| r.unwrap_err().to_string();
    let e = err(Tensor::full(&[0, 3], 1.0).try_max(0, false));
    assert_eq!(e, "max: axis 0 of shape [0, 3] has size 0 (a maximum of nothing is undefined)");
    let e = err(Tensor::full(&[2, 0], 1.0).try_softmax(-1));
    assert!(e.starts_with("softmax: axis -1 of shape [2, 0] has size 0"), "{e}");
    let x = Tensor::full(&[2, 3], 1.0);
    assert_eq!(err(x.try_softmax(-3)), "softmax: axis -3 is out of range for shape [2, 3]");
    let e = err(x.try_le(&Tensor::full(&[4], 1.0)));
    assert_eq!(e, "le: shapes [2, 3] and [4] do not broadcast");
    let e = err(x.try_gt(&Tensor::full(&[4], 1.0)));
    assert_eq!(e, "gt: shapes [2, 3] and [4] do not broadcast");
    // a result too large for one tensor fails in matmul
    let (tall, wide) = (Tensor::full(&[1 << 21, 2], 1.0), Tensor::full(&[2, 1 << 20], 1.0));
    let e = err(tall.try_matmul(&wide));
    assert!(e.starts_with("matmul: ") && e.contains("2^40"), "{e}");
    // the virtual (n, m, k) product is bounded by index arithmetic only: a 16384^2 x 16384^2
    // product (2^42 multiply-adds, a 1 GiB result) plans as one tile GEMM
    let big = Tensor::full(&[1 << 14, 1 << 14], 1.0);
    let plan = make_plan(&[big.matmul(&big).uop().clone()], &RealizeOptions::default()).unwrap();
    assert!(plan.kernels.iter().any(|k| k.uses_tile_ops()), "{:?}", plan.kernel_names());
    assert_eq!(plan.outputs, [(uopc_ir::DType::F32, 1 << 28)]);
    let e = err(uopc_tensor::attention::try_attention(&x, &x, &Tensor::full(&[3, 3], 1.0)));
    assert!(e.starts_with("attention: ") && e.contains("[2, 3]") && e.contains("[3, 3]"), "{e}");
    let q = Tensor::full(&[2, 4, 8], 1.0);
    let mask = Tensor::full(&[3, 4], 1.0);
    let e = err(uopc_tensor::masked::try_attention_masked(&q, &q, &q, Some(&mask), false));
    assert_eq!(e, "attention_masked: mask [3, 4] does not broadcast to the scores' shape [2, 4, 4]");
}

#[test]
fn shape_errors_name_both_shapes_and_the_caller() {
    let a = Tensor::full(&[2, 3], 1.0);
    let b = Tensor::full(&[4], 1.0);
    let e = a.try_add(&b).unwrap_err().to_string();
    assert!(e.contains("[2, 3]") && e.contains("[4]") && e.starts_with("add"), "{e}");
    let e = a.try_matmul(&a).unwrap_err().to_string();
    assert!(e.contains("[2, 3]") && e.starts_with("matmul"), "{e}");
    assert!(a.try_reshape(&[5]).is_err() && a.try_sum(2, false).is_err() && a.try_permute(&[0, 0]).is_err());
    assert!(Tensor::try_from_vec(vec![1.0f32; 5], &[2, 3]).is_err());
    // the panicking operator reports the line that wrote it
    let me = std::thread::current().name().map(str::to_string);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
    let seen2 = seen.clone();
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name().map(str::to_string) == me {
            let loc = info.location().map(|l| (l.file().to_string(), l.line()));
            *seen2.lock().unwrap() = Some((loc, info.payload().downcast_ref::<String>().cloned()));
        }
    }));
    let line = line!() + 1;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| &a + &b));
    std::panic::set_hook(prev);
    assert!(r.is_err());
    let (loc, msg) = seen.lock().unwrap().clone().expect("the hook saw the panic");
    let msg = msg.unwrap_or_default();
    assert!(msg.contains("[2, 3]") && msg.contains("[4]"), "{msg}");
    let (file, l) = loc.expect("a location");
    assert!(file.ends_with("ops.rs") && l == line, "panicked at {file}:{l}, expected ops.rs:{line}");
}

#[test]
fn scalar_division_of_an_f64_tensor_uses_the_f64_reciprocal() {
    let xs = vec![1.0f64, 2.0, 300.0, -7.5, 1e-3];
    let got = (Tensor::from_vec(xs.clone(), &[5]) / 3.0).to_ndarray::<f64>().unwrap();
    for (g, x) in got.iter().zip(&xs) {
        // x * (1/3) in f64 is within one rounding of x / 3; an f32 1/3 would be off by 1e-8.
        assert!((g - x / 3.0).abs() <= 2.0 * f64::EPSILON * (x / 3.0).abs(), "{x} / 3 = {g}");
    }
}
