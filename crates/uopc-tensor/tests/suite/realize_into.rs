//! `realize_into` a caller's slice or ndarray: the same values as `realize`, written straight
//! by the last kernel for f32 results (the report says so), copied otherwise; wrong lengths,
//! shapes and dtypes are errors naming `realize_into`.

use crate::common::uniform;
use uopc_ir::DType;
use uopc_tensor::ndarray::{Array2, Array3, s};
use uopc_tensor::{RealizeOptions, Tensor, TensorError};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn f32_results_are_written_by_the_kernel_into_the_callers_slice() {
    let a = Tensor::from_array(&uniform(&[64, 48], -1.0, 1.0, 1));
    let b = Tensor::from_array(&uniform(&[48, 40], -1.0, 1.0, 2));
    let cases: Vec<(&str, Tensor, RealizeOptions)> = vec![
        ("elementwise", (&a * 2.0 + 1.0).tanh(), RealizeOptions::default()),
        ("row sums", a.sum(1, false), RealizeOptions::default()),
        ("matmul", a.matmul(&b), RealizeOptions::default()),
        ("softmax fused", a.softmax(-1), RealizeOptions::fused()),
        ("gelu mlp", a.matmul(&b).gelu_tanh().sum(0, false), RealizeOptions::default()),
    ];
    for (name, t, opts) in cases {
        let want = t.to_ndarray_with::<f32>(&opts).unwrap();
        // Garbage in the caller's memory must not leak into the result.
        let mut out = vec![f32::NAN; t.numel()];
        let report = t.realize_into_with(&mut out, &opts).unwrap();
        assert!(report.wrote_caller_buffer, "{name}: written by the kernel");
        assert_eq!(bits(&out), bits(want.as_slice().unwrap()), "{name}: the same bits as realize");
        // Again, from the plan cache.
        out.fill(f32::NAN);
        let again = t.realize_into_with(&mut out, &opts).unwrap();
        assert!(again.cache_hit && again.wrote_caller_buffer, "{name}");
        assert_eq!(bits(&out), bits(want.as_slice().unwrap()), "{name}: again");
    }
}

#[test]
fn other_results_are_copied_once() {
    // f64 and bf16 results, and a tensor that is data already.
    let x = Tensor::from_vec(vec![1.0f64, 4.0, 9.0], &[3]);
    let mut out = [0.0f64; 3];
    let report = x.sqrt().realize_into_with(&mut out, &RealizeOptions::default()).unwrap();
    assert!(!report.wrote_caller_buffer);
    assert_eq!(out, [1.0, 2.0, 3.0]);
    let h = Tensor::from_vec(vec![half::bf16::from_f32(1.5), half::bf16::from_f32(-2.0)], &[2]);
    let mut out = [half::bf16::ZERO; 2];
    (&h * 2.0).realize_into(&mut out).unwrap();
    assert_eq!(out.map(half::bf16::to_f32), [3.0, -4.0]);
    let data = Tensor::from_vec(vec![5.0f32, 6.0], &[2]);
    let mut out = [0.0f32; 2];
    data.realize_into(&mut out).unwrap();
    assert_eq!(out, [5.0, 6.0]);
    // Empty tensors fill empty slices.
    Tensor::full(&[0, 4], 1.0).realize_into(&mut [0.0f32; 0]).unwrap();
}

#[test]
fn wrong_lengths_shapes_and_dtypes_are_errors_naming_realize_into() {
    let t = Tensor::full(&[2, 3], 1.0).exp();
    let e = t.realize_into(&mut [0.0f32; 5]).unwrap_err();
    assert!(matches!(&e, TensorError::Shape { op: "realize_into", .. }), "{e}");
    assert_eq!(e.to_string(), "realize_into: out has 5 elements for a tensor of shape [2, 3] (6 elements)");
    let e = t.realize_into(&mut [0.0f64; 6]).unwrap_err();
    assert_eq!(e.to_string(), "realize_into: out holds f64 but the tensor is f32");
    let e = t.realize_into_array(&mut Array2::<f32>::zeros((3, 2))).unwrap_err();
    assert_eq!(e.to_string(), "realize_into: out has shape [3, 2] for a tensor of shape [2, 3]");
    let e = t.realize_into_array(&mut Array2::<f64>::zeros((4, 6)).slice_mut(s![..2, ..;2])).unwrap_err();
    assert!(matches!(e, TensorError::DType { op: "realize_into", .. }));
    // Casting first is the way to another dtype.
    let mut out = [0.0f64; 6];
    t.cast(DType::F64).realize_into(&mut out).unwrap();
    assert!(out.iter().all(|&v| (v - std::f64::consts::E).abs() < 1e-6));
}

#[test]
fn ndarray_views_of_any_layout() {
    let src = uniform(&[4, 6], -2.0, 2.0, 3);
    let t = Tensor::from_array(&src).relu();
    let want = t.to_ndarray::<f32>().unwrap();
    // Standard layout: the slice path.
    let mut out = Array2::<f32>::from_elem((4, 6), f32::NAN);
    t.realize_into_array(&mut out).unwrap();
    assert_eq!(out.into_dyn(), want);
    // Every other column of a wider array, and a transposed view: copied in logical order.
    let mut wide = Array2::<f32>::from_elem((4, 12), -7.0);
    t.realize_into_array(&mut wide.slice_mut(s![.., ..;2])).unwrap();
    assert_eq!(wide.slice(s![.., ..;2]).to_owned().into_dyn(), want);
    assert!(wide.slice(s![.., 1..;2]).iter().all(|&v| v == -7.0), "the other columns are untouched");
    let mut tr = Array2::<f32>::zeros((6, 4));
    t.realize_into_array(&mut tr.view_mut().reversed_axes()).unwrap();
    assert_eq!(tr.t().to_owned().into_dyn(), want);
    // A 3-D array.
    let cube = Tensor::full(&[2, 3, 4], 0.5).exp2();
    let mut out = Array3::<f32>::zeros((2, 3, 4));
    cube.realize_into_array(&mut out.view_mut()).unwrap();
    assert!(out.iter().all(|&v| (v - 0.5f32.exp2()).abs() < 1e-6));
}
