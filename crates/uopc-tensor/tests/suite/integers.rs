//! Integer (i32, i64) and bool tensors: creation, arithmetic that wraps like the IR's,
//! comparisons giving bools, reductions, casts, and their errors.

use uopc_ir::DType;
use uopc_tensor::Tensor;

fn i32s(t: &Tensor) -> Vec<i32> {
    t.to_ndarray::<i32>().expect("realizes").iter().copied().collect()
}
fn i64s(t: &Tensor) -> Vec<i64> {
    t.to_ndarray::<i64>().expect("realizes").iter().copied().collect()
}

#[test]
fn integer_arithmetic_comparisons_and_reductions() {
    let a = Tensor::from_vec(vec![3i32, -1, 7, 0, 5, -8], &[2, 3]);
    let b = Tensor::from_vec(vec![2i32, 2, -3], &[3]);
    assert_eq!(a.dtype(), DType::I32);
    assert_eq!(i32s(&(&a + &b)), [5, 1, 4, 2, 7, -11]);
    assert_eq!(i32s(&(&a - &b)), [1, -3, 10, -2, 3, -5]);
    assert_eq!(i32s(&(&a * &b)), [6, -2, -21, 0, 10, 24]);
    assert_eq!(i32s(&a.maximum(&b)), [3, 2, 7, 2, 5, -3]);
    assert_eq!(i32s(&a.minimum(&b)), [2, -1, -3, 0, 2, -8]);
    assert_eq!(i32s(&-&a), [-3, 1, -7, 0, -5, 8]);
    assert_eq!(i32s(&a.relu()), [3, 0, 7, 0, 5, 0]);
    assert_eq!(i32s(&a.abs()), [3, 1, 7, 0, 5, 8]);
    let two = Tensor::from_vec(vec![2i32], &[1]);
    assert_eq!(i32s(&(&a * &two)), [6, -2, 14, 0, 10, -16]);
    // With an f32 scalar an integer tensor computes in f32 (torch's promotion): no truncation.
    let scaled = &a * 2.5 + 1.0;
    assert_eq!(scaled.dtype(), DType::F32);
    assert_eq!(
        scaled.to_ndarray::<f32>().unwrap().iter().copied().collect::<Vec<_>>(),
        [8.5, -1.5, 18.5, 1.0, 13.5, -19.0]
    );
    // Integer matmul (loops, exact).
    let m = a.matmul(&Tensor::from_vec(vec![1i32, 0, 2, 1, -1, 3], &[3, 2]));
    assert_eq!(i32s(&m), [-6, 20, 18, -19]);
    assert_eq!(i32s(&a.sum(1, false)), [9, -3]);
    assert_eq!(i32s(&a.max(0, false)), [3, 5, 7]);
    assert_eq!(i32s(&a.min(1, false)), [-1, -8]);
    let lt = a.lt(&b);
    assert_eq!(lt.dtype(), DType::Bool);
    assert_eq!(
        lt.to_ndarray::<bool>().unwrap().iter().copied().collect::<Vec<_>>(),
        [false, true, false, true, false, true]
    );
    // i32 wraps; i64 holds the same sum.
    let big = Tensor::from_vec(vec![i32::MAX, 1], &[2]);
    assert_eq!(i32s(&big.sum(0, false)), [i32::MIN]);
    assert_eq!(i64s(&big.cast(DType::I64).sum(0, false)), [i32::MAX as i64 + 1]);
    // Mixed with floats, and true division, give floats (as torch promotes).
    let f = &a.cast(DType::F32) / 2.0;
    assert_eq!(
        f.to_ndarray::<f32>().unwrap().iter().copied().collect::<Vec<_>>(),
        [1.5, -0.5, 3.5, 0.0, 2.5, -4.0]
    );
    assert_eq!(a.try_div(&b).unwrap().dtype(), DType::F32);
    assert_eq!(a.try_add(&Tensor::scalar(0.5)).unwrap().dtype(), DType::F32);
    // i64 tensors and where over them.
    let c = Tensor::from_vec(vec![10i64, -20, 30], &[3]);
    let picked = c
        .gt(&Tensor::from_vec(vec![0i64, 0, 0], &[3]))
        .where_(&c, &(&c * &Tensor::from_vec(vec![2i64], &[1])));
    assert_eq!(i64s(&picked), [10, -40, 30]);
    assert!(a.gradient(&[&a]).is_err(), "integers have no gradient");
}
