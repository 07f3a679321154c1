//! Zero-sized axes: creation, elementwise ops, reductions over empty and non-empty axes,
//! matmul with an empty dimension, joins, gradients; empty results come back without a
//! kernel, and what cannot be computed is an error naming the op, never a panic.

use uopc_tensor::ndarray::{Array2, ArrayD, IxDyn};
use uopc_tensor::{RealizeOptions, Tensor, realize};

fn arr(t: &Tensor) -> ArrayD<f32> {
    t.to_ndarray::<f32>().expect("realizes")
}

#[test]
fn empty_tensors_are_created_and_read_back() {
    let e = Tensor::full(&[0, 3], 1.0);
    assert_eq!((e.shape(), e.numel()), (&[0, 3][..], 0));
    assert_eq!(arr(&e), ArrayD::<f32>::zeros(IxDyn(&[0, 3])));
    let v = Tensor::try_from_vec(Vec::<f64>::new(), &[2, 0, 4]).unwrap();
    assert_eq!(v.to_ndarray::<f64>().unwrap().shape(), [2, 0, 4]);
    assert!(Tensor::try_from_vec(vec![1.0f32], &[0, 3]).is_err(), "one element does not fill [0, 3]");
    let a = Tensor::from_array(&Array2::<f32>::zeros((3, 0)));
    assert_eq!(a.reshape(&[0, 5]).shape(), [0, 5]);
    assert_eq!(a.t().shape(), [0, 3]);
    assert_eq!(Tensor::full(&[1, 3], 2.0).expand(&[0, 3]).shape(), [0, 3], "1 broadcasts to 0");
    assert!(e.to_string().starts_with("Tensor [0, 3] f32"));
}

#[test]
fn elementwise_ops_on_empty_tensors_give_empty_results_without_kernels() {
    let e = Tensor::full(&[0, 3], 1.0);
    let row = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]);
    let y = ((&e * 2.0 + &row).exp().tanh() - &e).relu();
    let (out, report) = y.realize_with(&RealizeOptions::default()).unwrap();
    assert_eq!(out.shape(), [0, 3]);
    assert!(report.kernels.is_empty(), "nothing to run for an empty result");
    let col = Tensor::full(&[0, 1], 1.0);
    assert_eq!(col.try_add(&row).unwrap().shape(), [0, 3]);
    assert!(col.try_add(&Tensor::full(&[2, 3], 1.0)).is_err(), "0 and 2 do not broadcast");
    // Realized together with a non-empty tensor: each gets its own result.
    let s = row.sum(0, false);
    let (outs, _) = realize(&[&y, &s, &e], &RealizeOptions::default()).unwrap();
    assert_eq!(outs.iter().map(|t| t.shape().to_vec()).collect::<Vec<_>>(), [vec![0, 3], vec![], vec![0, 3]]);
    assert_eq!(arr(&outs[1])[[]], 6.0);
}

#[test]
fn reductions_over_empty_axes_follow_torch() {
    let e = Tensor::full(&[0, 3], 1.0);
    // The sum of nothing is 0; over the non-empty axis the result is itself empty.
    assert_eq!(arr(&e.sum(0, false)).as_slice(), Some(&[0.0; 3][..]));
    assert_eq!(arr(&e.sum(0, true)).shape(), [1, 3]);
    assert_eq!(arr(&e.sum(1, false)).shape(), [0]);
    assert_eq!(arr(&e.max(1, true)).shape(), [0, 1], "a max over a non-empty axis of an empty tensor");
    // The mean of nothing is 0/0 = NaN, as torch's.
    assert!(arr(&e.mean(0, false)).iter().all(|v| v.is_nan()));
    // The maximum (and minimum, softmax, logsumexp) of nothing is an error naming the op.
    let msg = |r: uopc_tensor::Result<Tensor>| r.unwrap_err().to_string();
    assert!(msg(e.try_max(0, false)).starts_with("max: axis 0 of shape [0, 3] has size 0"));
    assert!(msg(e.try_min(-2, false)).starts_with("min: "));
    assert!(msg(e.try_logsumexp(0, false)).starts_with("logsumexp: "));
    assert!(msg(Tensor::full(&[3, 0], 0.0).try_softmax(-1)).starts_with("softmax: "));
}

#[test]
fn matmul_with_an_empty_dimension() {
    let a = Tensor::full(&[2, 0], 1.0);
    let b = Tensor::full(&[0, 3], 1.0);
    // K = 0: every output element is an empty sum.
    let c = a.matmul(&b);
    assert_eq!(arr(&c), ArrayD::<f32>::zeros(IxDyn(&[2, 3])));
    // M = 0 and N = 0: empty products; a batch of 0 too.
    assert_eq!(arr(&b.t().matmul(&Tensor::full(&[0, 4], 1.0))).shape(), [3, 4]);
    assert_eq!(arr(&Tensor::full(&[0, 4], 1.0).matmul(&Tensor::full(&[4, 3], 1.0))).shape(), [0, 3]);
    assert_eq!(arr(&Tensor::full(&[2, 4], 1.0).matmul(&Tensor::full(&[4, 0], 1.0))).shape(), [2, 0]);
    assert_eq!(arr(&Tensor::full(&[0, 2, 4], 1.0).matmul(&Tensor::full(&[4, 3], 1.0))).shape(), [0, 2, 3]);
    // The gradients of a K = 0 product are empty too.
    let g = (c.sum(0, false).sum(0, false) + Tensor::scalar(1.0)).gradient(&[&a, &b]).unwrap();
    assert_eq!((g[0].shape(), g[1].shape()), (&[2, 0][..], &[0, 3][..]));
    assert_eq!(arr(&g[0]).len() + arr(&g[1]).len(), 0);
}

#[test]
fn joins_and_slices_with_empty_parts() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let none = Tensor::full(&[0, 3], 9.0);
    assert_eq!(arr(&Tensor::cat(&[&none, &x, &none], 0)), arr(&x));
    assert_eq!(arr(&Tensor::cat(&[&x.slice(1, 1, 1), &x], 1)), arr(&x));
    assert_eq!(Tensor::cat(&[&none, &none], 0).shape(), [0, 3]);
    assert_eq!(arr(&x.slice(0, 2, 2)).shape(), [0, 3]);
    assert!(x.try_slice(0, 2, 1).is_err(), "a reversed range is still an error");
    assert_eq!(Tensor::stack(&[&none, &none], 0).shape(), [2, 0, 3]);
    // An empty slice feeding a sum is the empty sum.
    assert_eq!(arr(&x.slice(1, 2, 2).sum(1, false)).as_slice(), Some(&[0.0, 0.0][..]));
}

#[test]
fn ops_that_cannot_take_empty_inputs_are_errors_not_panics() {
    let q = Tensor::full(&[2, 8], 1.0);
    let kv = Tensor::full(&[0, 8], 1.0);
    // Attention over no keys has no softmax to take: an error naming attention, not a panic.
    let r = uopc_tensor::attention::try_attention(&q, &kv, &kv).and_then(|t| t.realize());
    let e = r.unwrap_err().to_string();
    assert!(e.starts_with("attention: ") && e.contains("size 0"), "{e}");
}
