//! matmul with a 1-D operand (dot products, matrix x vector, vector x matrix, vectors against
//! batched operands) and 16-bit products with one output row, against an f64 loop reference,
//! under every optimizer a caller can pick.

use crate::common::*;
use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};
use uopc_ir::DType;
use uopc_tensor::*;

/// The lengths of the contracted (and vector) axes: 1, odd sizes that no upcast or unroll
/// divides, and a multiple of every tile.
const NS: [usize; 6] = [1, 2, 3, 5, 7, 64];

/// numpy's matmul in f64 loops for operands of any rank >= 1: a 1-D left operand is a row
/// (1, n) and a 1-D right operand a column (n, 1), whose axes are dropped from the result;
/// batch axes broadcast. Returns the product and, per element, the sum of the magnitudes of
/// its terms (what the rounding error of an f32 sum of them scales with).
fn reference(a: &ArrayD<f64>, b: &ArrayD<f64>) -> (ArrayD<f64>, ArrayD<f64>) {
    let (sa, sb) = (a.shape().to_vec(), b.shape().to_vec());
    let xa = if sa.len() == 1 { vec![1, sa[0]] } else { sa.clone() };
    let xb = if sb.len() == 1 { vec![sb[0], 1] } else { sb.clone() };
    let (ra, rb) = (xa.len(), xb.len());
    let (n, k, m) = (xa[ra - 2], xa[ra - 1], xb[rb - 1]);
    assert_eq!(xb[rb - 2], k, "reference: inner sizes differ");
    let rank = ra.max(rb) - 2;
    let pad = |s: &[usize]| -> Vec<usize> {
        std::iter::repeat_n(1, rank + 2 - s.len()).chain(s[..s.len() - 2].iter().copied()).collect()
    };
    let (ba, bb) = (pad(&xa), pad(&xb));
    let batch: Vec<usize> = ba.iter().zip(&bb).map(|(&x, &y)| x.max(y)).collect();
    let items: usize = batch.iter().product();
    let (a, b) = (a.as_standard_layout().to_owned(), b.as_standard_layout().to_owned());
    let (av, bv) = (a.as_slice().unwrap(), b.as_slice().unwrap());
    let (mut out, mut mag) = (vec![0.0f64; items * n * m], vec![0.0f64; items * n * m]);
    for item in 0..items {
        // The item's coordinates, then each operand's own item (broadcast axes at 0).
        let (mut rest, mut oa, mut ob, mut sta, mut stb) = (item, 0, 0, 1, 1);
        for ax in (0..rank).rev() {
            let c = rest % batch[ax];
            rest /= batch[ax];
            oa += if ba[ax] == 1 { 0 } else { c * sta };
            ob += if bb[ax] == 1 { 0 } else { c * stb };
            sta *= ba[ax];
            stb *= bb[ax];
        }
        for i in 0..n {
            for j in 0..m {
                let terms = (0..k).map(|p| av[(oa * n + i) * k + p] * bv[(ob * k + p) * m + j]);
                let (s, g) = terms.fold((0.0, 0.0), |(s, g), t| (s + t, g + f64::abs(t)));
                out[(item * n + i) * m + j] = s;
                mag[(item * n + i) * m + j] = g;
            }
        }
    }
    let mut shape: Vec<usize> = batch.iter().copied().chain([n, m]).collect();
    if sb.len() == 1 {
        shape.pop();
    }
    if sa.len() == 1 {
        let at = shape.len() - if sb.len() == 1 { 1 } else { 2 };
        shape.remove(at);
    }
    let arr = |v| ArrayD::from_shape_vec(IxDyn(&shape), v).unwrap();
    (arr(out), arr(mag))
}

/// The options every product is realized with: the default optimizer (loop nests and tile
/// GEMMs), the default without tile GEMMs, fully fused, and plain loops.
fn all_options() -> [(&'static str, RealizeOptions); 4] {
    [
        ("default", RealizeOptions::default()),
        ("loops", RealizeOptions::default().with_opt(DefaultOpt::loops())),
        ("fused", RealizeOptions::fused()),
        ("no opt", RealizeOptions::default().with_opt(NoOpt)),
    ]
}

/// Realizes `a @ b` for f32 operands of the given shapes under every option and checks the
/// result's shape and values against [`reference`]: each element is an f32 sum of k exact-ish
/// products, so it is within k ulps of the sum of the terms' magnitudes (plus one rounding of
/// each product).
#[track_caller]
fn check_f32(sa: &[usize], sb: &[usize], seed: u64) {
    let (a, b) = (normal(sa, seed), normal(sb, seed + 1000));
    let (want, mag) = reference(&f64s(&a), &f64s(&b));
    let k = *sa.last().unwrap();
    let product = Tensor::from_array(&a).matmul(&Tensor::from_array(&b));
    assert_eq!(product.shape(), want.shape(), "{sa:?} @ {sb:?}: shape");
    for (name, opts) in all_options() {
        let got =
            product.to_ndarray_with::<f32>(&opts).unwrap_or_else(|e| panic!("{sa:?} @ {sb:?} ({name}): {e}"));
        assert_eq!(got.shape(), want.shape(), "{sa:?} @ {sb:?} ({name}): shape");
        for ((g, w), m) in got.iter().zip(&want).zip(&mag) {
            let tol = (k as f64 + 1.0) * f64::from(f32::EPSILON) * m + 1e-30;
            assert!((f64::from(*g) - w).abs() <= tol, "{sa:?} @ {sb:?} ({name}): {g} vs {w} (tol {tol:e})");
        }
    }
}

#[test]
fn dot_products_of_vectors() {
    for (seed, n) in NS.into_iter().enumerate() {
        check_f32(&[n], &[n], seed as u64);
    }
}

#[test]
fn matrix_times_vector() {
    for (seed, n) in NS.into_iter().enumerate() {
        for m in [1, 3, 8, n] {
            check_f32(&[m, n], &[n], 10 + seed as u64);
        }
    }
}

#[test]
fn vector_times_matrix() {
    for (seed, n) in NS.into_iter().enumerate() {
        for p in [1, 5, 8, n] {
            check_f32(&[n], &[n, p], 20 + seed as u64);
        }
    }
}

#[test]
fn vectors_against_batched_operands() {
    for (seed, n) in NS.into_iter().enumerate() {
        let s = 30 + seed as u64;
        check_f32(&[2, 3, n], &[n], s);
        check_f32(&[n], &[3, n, 2], s);
        check_f32(&[2, 1, 4, n], &[n], s);
        check_f32(&[n], &[1, 2, n, 5], s);
        // A batch of one row and of one column: the vector's axis and a batch axis of 1.
        check_f32(&[1, 1, n], &[n], s);
        check_f32(&[n], &[1, n, 1], s);
    }
}

/// Unit roundoff of bf16 (8 significant bits), f16 (11) and f32, in which 16-bit products are
/// summed.
const BF16_U: f64 = 1.0 / 256.0;
const F16_U: f64 = 1.0 / 2048.0;
const F32_U: f64 = f32::EPSILON as f64 / 2.0;

/// `a @ b` for 16-bit operands of the given shapes under every option: exact 16-bit products,
/// f32 sums, one rounding to the 16-bit type at the end.
#[track_caller]
fn check_half(dtype: DType, sa: &[usize], sb: &[usize], seed: u64) {
    let (a32, b32) = (uniform(sa, -1.0, 1.0, seed), uniform(sb, -1.0, 1.0, seed + 1000));
    let (ta, tb, a, b) = match dtype {
        DType::BF16 => {
            let (a, b) = (a32.mapv(bf16::from_f32), b32.mapv(bf16::from_f32));
            (Tensor::from_array(&a), Tensor::from_array(&b), a.mapv(bf16::to_f64), b.mapv(bf16::to_f64))
        }
        _ => {
            let (a, b) = (a32.mapv(f16::from_f32), b32.mapv(f16::from_f32));
            (Tensor::from_array(&a), Tensor::from_array(&b), a.mapv(f16::to_f64), b.mapv(f16::to_f64))
        }
    };
    let (want, mag) = reference(&a, &b);
    let k = *sa.last().unwrap();
    let product = ta.matmul(&tb);
    assert_eq!(product.dtype(), dtype);
    assert_eq!(product.shape(), want.shape(), "{dtype} {sa:?} @ {sb:?}: shape");
    let unit = if dtype == DType::BF16 { BF16_U } else { F16_U };
    for (name, opts) in all_options() {
        let got: Vec<f64> = match dtype {
            DType::BF16 => {
                product.to_ndarray_with::<bf16>(&opts).map(|g| g.iter().map(|v| v.to_f64()).collect())
            }
            _ => product.to_ndarray_with::<f16>(&opts).map(|g| g.iter().map(|v| v.to_f64()).collect()),
        }
        .unwrap_or_else(|e| panic!("{dtype} {sa:?} @ {sb:?} ({name}): {e}"));
        assert_eq!(got.len(), want.len());
        for ((g, w), m) in got.iter().zip(&want).zip(&mag) {
            // One 16-bit rounding (relative, or half of f16's subnormal spacing) after an f32
            // sum of k terms.
            let tol = unit * w.abs() + k as f64 * F32_U * m * 1.01 + 2f64.powi(-25);
            assert!((g - w).abs() <= tol, "{dtype} {sa:?} @ {sb:?} ({name}): {g} vs {w} (tol {tol:e})");
        }
    }
}

#[test]
fn one_token_through_a_16_bit_linear_layer() {
    for dtype in [DType::BF16, DType::F16] {
        check_half(dtype, &[1, 768], &[768, 3072], 40);
    }
}

#[test]
fn sixteen_bit_products_with_one_output_row() {
    for dtype in [DType::BF16, DType::F16] {
        for (seed, k) in NS.into_iter().enumerate() {
            for n in [1, 3, 7, 33] {
                check_half(dtype, &[1, k], &[k, n], 50 + seed as u64);
            }
        }
        // The same as vectors, and a one-row batch.
        check_half(dtype, &[5], &[5, 3], 60);
        check_half(dtype, &[7], &[7], 61);
        check_half(dtype, &[2, 1, 7], &[7, 5], 62);
    }
}
