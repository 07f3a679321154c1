//! `index_select` and `gather` by tensors of indices: values against host loops for every axis
//! and several dtypes, computed indices, empty indices, bad indices as errors naming the op,
//! gradients against finite differences and the scatter-add, and one plan per shape.

use crate::common::{check, rand64};
use ndarray::{ArrayD, IxDyn};
use std::sync::Arc;
use uopc_ir::DType;
use uopc_tensor::{RealizeOptions, Tensor, TensorError, gradient, make_plan};

const SHAPE: [usize; 3] = [3, 4, 5];

fn source() -> Vec<f64> {
    (0..SHAPE.iter().product::<usize>()).map(|i| (i as f64 * 0.37).sin() * 100.0).collect()
}

/// `out[.., i, ..] = src[.., idx[i], ..]` on the host.
fn select_ref(src: &ArrayD<f64>, axis: usize, idx: &[i64]) -> ArrayD<f64> {
    let mut shape = src.shape().to_vec();
    shape[axis] = idx.len();
    ArrayD::from_shape_fn(IxDyn(&shape), |p| {
        let mut q = p.clone();
        q[axis] = idx[p[axis]] as usize;
        src[q]
    })
}

/// `out[p] = src[p with p[axis] = idx[p]]` on the host.
fn gather_ref(src: &ArrayD<f64>, axis: usize, idx: &ArrayD<i64>) -> ArrayD<f64> {
    ArrayD::from_shape_fn(idx.raw_dim(), |p| {
        let mut q = p.clone();
        q[axis] = idx[&p] as usize;
        src[q]
    })
}

fn as_f64(t: &Tensor) -> ArrayD<f64> {
    t.cast(DType::F64).to_ndarray::<f64>().expect("realizes")
}

#[test]
fn index_select_matches_the_host_on_every_axis_and_dtype() {
    let src = ArrayD::from_shape_vec(IxDyn(&SHAPE), source()).unwrap();
    let x64 = Tensor::from_array(&src);
    for (axis, &len) in SHAPE.iter().enumerate() {
        let n = len as i64;
        let idx: Vec<i64> = vec![n - 1, 0, n - 1, 1, 0];
        let want = select_ref(&src, axis, &idx);
        for dtype in [DType::F64, DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::Bool] {
            let x = x64.cast(dtype);
            let rounded = as_f64(&x).into_shape_with_order(IxDyn(&SHAPE)).unwrap();
            let want = select_ref(&rounded, axis, &idx);
            for index_dtype in [DType::I64, DType::I32] {
                let indices =
                    Tensor::from_vec(idx.clone(), &[idx.len()]).cast(index_dtype).realize().unwrap();
                let got = x.try_index_select(axis as isize, &indices).unwrap();
                assert_eq!(got.dtype(), dtype);
                // A copy of elements: exact.
                assert_eq!(as_f64(&got), want, "axis {axis} {dtype} by {index_dtype}");
            }
        }
        // Negative axes count from the end.
        let neg = x64.try_index_select(axis as isize - 3, &Tensor::from_vec(idx.clone(), &[5])).unwrap();
        assert_eq!(as_f64(&neg), want);
    }
}

#[test]
fn computed_indices_are_realized_and_used() {
    let src = ArrayD::from_shape_vec(IxDyn(&SHAPE), source()).unwrap();
    let x = Tensor::from_array(&src);
    // 3 - [0, 1, 2, 3] = [3, 2, 1, 0], a lazy integer graph; and a 0-d index.
    let reversed = 3 - &Tensor::arange(4);
    assert!(!reversed.is_realized());
    let got = x.try_index_select(1, &reversed).unwrap();
    assert_eq!(as_f64(&got), select_ref(&src, 1, &[3, 2, 1, 0]));
    let one = x.try_index_select(2, &Tensor::from_vec(vec![4i32], &[])).unwrap();
    assert_eq!(one.shape(), &[3, 4, 1]);
    assert_eq!(as_f64(&one), select_ref(&src, 2, &[4]));
    // Consumers fuse after the selection as after any kernel.
    let scaled =
        (&x.try_index_select(0, &Tensor::from_vec(vec![2i64, 0], &[2])).unwrap() * 2.0).sum(2, false);
    let want = select_ref(&src, 0, &[2, 0]).mapv(|v| 2.0 * v).sum_axis(ndarray::Axis(2));
    let got = as_f64(&scaled);
    for (g, w) in got.iter().zip(want.iter()) {
        assert!((g - w).abs() <= 1e-12 * w.abs().max(1.0), "{g} vs {w}");
    }
}

#[test]
fn gather_matches_the_host_on_every_axis() {
    let src = ArrayD::from_shape_vec(IxDyn(&SHAPE), source()).unwrap();
    let x = Tensor::from_array(&src);
    for axis in 0..3 {
        // Index shapes no longer than the source off the axis, and longer on it.
        let mut ishape = vec![2, 3, 4];
        ishape[axis] = 6;
        let len = SHAPE[axis] as i64;
        let idx = ArrayD::from_shape_fn(IxDyn(&ishape), |p| (p[0] * 7 + p[1] * 3 + p[2] * 5) as i64 % len);
        let indices = Tensor::from_array(&idx);
        for dtype in [DType::F64, DType::F32, DType::I32] {
            let xd = x.cast(dtype);
            let rounded = as_f64(&xd).into_shape_with_order(IxDyn(&SHAPE)).unwrap();
            let got = xd.try_gather(axis as isize, &indices).unwrap();
            assert_eq!(got.shape(), &ishape[..]);
            assert_eq!(as_f64(&got), gather_ref(&rounded, axis, &idx), "axis {axis} {dtype}");
        }
    }
}

#[test]
fn empty_indices_give_empty_results() {
    let x = Tensor::from_vec(source(), &SHAPE);
    let none = Tensor::from_vec(Vec::<i64>::new(), &[0]);
    let e = x.try_index_select(1, &none).unwrap();
    assert_eq!(e.to_ndarray::<f64>().unwrap().shape(), &[3, 0, 5]);
    let g = x.try_gather(2, &Tensor::from_vec(Vec::<i32>::new(), &[3, 4, 0])).unwrap();
    assert_eq!(g.to_ndarray::<f64>().unwrap().shape(), &[3, 4, 0]);
    // Nothing selected, so nothing flows back: a zero gradient.
    let loss = (&x * 1.0).sum(0, false).sum(0, false).sum(0, false) * 0.0
        + e.sum(1, false).sum(0, false).sum(0, false);
    let grad = gradient(&loss, &[&x]).unwrap().remove(0).to_ndarray::<f64>().unwrap();
    assert!(grad.iter().all(|&v| v == 0.0));
}

fn message(e: TensorError) -> String {
    e.to_string()
}

#[test]
fn bad_indices_are_errors_naming_the_op_and_the_position() {
    let x = Tensor::from_vec(source(), &SHAPE);
    let e = message(x.try_index_select(1, &Tensor::from_vec(vec![0i64, 4, 1], &[3])).unwrap_err());
    assert!(e.starts_with("index_select: ") && e.contains("indices[1] = 4") && e.contains("0..4"), "{e}");
    let e = message(x.try_index_select(0, &Tensor::from_vec(vec![-1i32], &[1])).unwrap_err());
    assert!(e.starts_with("index_select: ") && e.contains("indices[0] = -1"), "{e}");
    // A computed index that lands outside is caught the same way.
    let e = message(x.try_index_select(2, &(Tensor::arange(3) * 3)).unwrap_err());
    assert!(e.contains("indices[2] = 6") && e.contains("0..5"), "{e}");
    let e = message(x.try_index_select(0, &Tensor::from_vec(vec![0.0f32], &[1])).unwrap_err());
    assert!(e.starts_with("index_select: ") && e.contains("i32 or i64"), "{e}");
    let e = message(x.try_index_select(0, &Tensor::from_vec(vec![0i64; 4], &[2, 2])).unwrap_err());
    assert!(e.starts_with("index_select: ") && e.contains("1-d"), "{e}");
    let e = message(x.try_index_select(3, &Tensor::from_vec(vec![0i64], &[1])).unwrap_err());
    assert!(e.starts_with("index_select: ") && e.contains("axis 3"), "{e}");
    let e =
        message(Tensor::scalar(1.0).try_index_select(0, &Tensor::from_vec(vec![0i64], &[1])).unwrap_err());
    assert!(e.starts_with("index_select: "), "{e}");

    let idx =
        ArrayD::from_shape_fn(IxDyn(&[2, 2, 2]), |p| if (p[0], p[1], p[2]) == (1, 0, 1) { 5i64 } else { 0 });
    let e = message(x.try_gather(1, &Tensor::from_array(&idx)).unwrap_err());
    assert!(e.starts_with("gather: ") && e.contains("indices[[1, 0, 1]] = 5"), "{e}");
    let e = message(x.try_gather(1, &Tensor::from_vec(vec![0i64; 4], &[2, 2])).unwrap_err());
    assert!(e.starts_with("gather: ") && e.contains("3 axes"), "{e}");
    let e = message(x.try_gather(1, &Tensor::from_vec(vec![0i64; 4 * 4 * 5], &[4, 4, 5])).unwrap_err());
    assert!(e.starts_with("gather: ") && e.contains("[4, 4, 5]"), "{e}");
}

#[test]
fn gradients_match_finite_differences() {
    let src = rand64(&SHAPE, -1.0, 1.0, 5);
    let rows = Tensor::from_vec(vec![2i64, 0, 2, 3, 3, 3], &[6]);
    check("index_select axis 1", std::slice::from_ref(&src), |t| t[0].try_index_select(1, &rows).unwrap());
    let idx = ArrayD::from_shape_fn(IxDyn(&[4, 4, 5]), |p| ((p[0] + 2 * p[1] + p[2]) % 3) as i64);
    let idx = Tensor::from_array(&idx);
    check("gather axis 0", std::slice::from_ref(&src), |t| t[0].try_gather(0, &idx).unwrap());
    // Through a nonlinear consumer, so the cotangent differs per element.
    check("gather then tanh", std::slice::from_ref(&src), |t| t[0].try_gather(0, &idx).unwrap().tanh());
    // Second derivatives: the scatter-add's own gradient is the selection again.
    let w = Tensor::from_array(&rand64(&[3, 6, 5], -1.0, 1.0, 8));
    check("gradient of index_select", std::slice::from_ref(&src), |t| {
        let picked = t[0].try_index_select(1, &rows).unwrap();
        let loss = (&(&(&picked * &picked) * &picked) * &w).reshape(&[90]).sum(0, false);
        gradient(&loss, &[&t[0]]).unwrap().remove(0)
    });
}

// The gradient is the scatter-add of the cotangent: with the cotangent w, the source element
// selected k times gets the sum of its k cotangents, and unselected ones get 0.
#[test]
fn the_gradient_is_the_scatter_add_of_the_cotangent() {
    let (rows, width) = (5, 3);
    let idx = [4i64, 1, 4, 4, 0];
    for dtype in [DType::F64, DType::F32, DType::BF16] {
        let table = Tensor::from_vec(vec![0.5f64; rows * width], &[rows, width]).cast(dtype);
        let w: Vec<f64> = (0..idx.len() * width).map(|i| (i as f64 * 0.7).cos()).collect();
        let wt = Tensor::from_vec(w.clone(), &[idx.len(), width]).cast(dtype);
        let picked = table.try_index_select(0, &Tensor::from_vec(idx.to_vec(), &[idx.len()])).unwrap();
        let loss = (&picked * &wt).reshape(&[idx.len() * width]).sum(0, false);
        let g = as_f64(&gradient(&loss, &[&table]).unwrap().remove(0));
        let w_rounded = as_f64(&wt);
        let mut want = vec![0.0f64; rows * width];
        for (r, &i) in idx.iter().enumerate() {
            for c in 0..width {
                want[i as usize * width + c] += w_rounded[[r, c]];
            }
        }
        // f64 adds up to three terms exactly enough for 1e-15; f32 rounds each add (1e-7); bf16
        // accumulates in f32 and rounds the sum once to 8 bits (4e-3 relative).
        let tol = match dtype {
            DType::F64 => 1e-15,
            DType::F32 => 1e-6,
            _ => 1e-2,
        };
        for (k, (got, want)) in g.iter().zip(&want).enumerate() {
            assert!((got - want).abs() <= tol * want.abs().max(1.0), "{dtype} element {k}: {got} vs {want}");
        }
        assert!(g.iter().skip(2 * width).take(width).all(|&v| v == 0.0), "row 2 is never selected");
    }
}

// The indices are a kernel input, not part of the kernel: other values of the same shape reuse
// the compiled plan, forward and backward.
#[test]
fn one_plan_serves_every_index_value_of_a_shape() {
    let x = Tensor::from_vec(source(), &SHAPE);
    let plan_of = |idx: Vec<i64>| {
        let y = x.try_index_select(2, &Tensor::from_vec(idx, &[3])).unwrap();
        let g = gradient(&(&y * &y).sum(2, false).sum(1, false).sum(0, false), &[&x]).unwrap().remove(0);
        let opts = RealizeOptions::default();
        (make_plan(&[y.uop().clone()], &opts).unwrap(), make_plan(&[g.uop().clone()], &opts).unwrap())
    };
    let (fa, ba) = plan_of(vec![0, 1, 2]);
    let (fb, bb) = plan_of(vec![4, 4, 0]);
    assert!(
        Arc::ptr_eq(&fa, &fb),
        "forward plans differ: {:?} vs {:?}",
        fa.kernel_names(),
        fb.kernel_names()
    );
    assert!(Arc::ptr_eq(&ba, &bb), "backward plans differ");
    assert!(fa.kernel_names().contains(&"index_select"), "{:?}", fa.kernel_names());
    assert!(ba.kernel_names().contains(&"index_select_backward"), "{:?}", ba.kernel_names());
}
