//! Realizing a decoded graph under several options and comparing each result with the f64
//! reference and with the others ([`check`]), and the checked `try_*` API on hostile shapes
//! ([`check_try_api`]).

use crate::{Bytes, decode, numel};
use ndarray::ArrayD;
use uopc_tensor::{NoOpt, RealizeOptions, Tensor};

/// The options [`check`] realizes each graph with: the default optimizer (loop nests and
/// tile GEMMs), fully fused, and plain loops.
pub fn options() -> Vec<(&'static str, RealizeOptions)> {
    vec![
        ("default", RealizeOptions::default()),
        ("fused", RealizeOptions::fused()),
        ("no opt", RealizeOptions::default().with_opt(NoOpt)),
    ]
}

/// Decodes `bytes` and realizes the graph under each of [`options`]: every realization must
/// succeed, have the root's shape, be within `1e-5 * (1 + magnitude)` of the f64 reference
/// (f32 roundings relative to the largest intermediate; the graphs are a dozen ops deep at
/// most), and the realizations must agree with each other within twice that.
///
/// # Errors
///
/// A description of the graph and of the first failure.
pub fn check(bytes: &[u8]) -> Result<(), String> {
    let graph = decode(bytes);
    let root = graph.root();
    let tensor = graph.tensor();
    let tol = 1e-5 * (1.0 + graph.magnitude);
    let describe =
        || format!("graph {:?}", graph.nodes.iter().map(|n| (&n.op, &n.shape)).collect::<Vec<_>>());
    let mut first: Option<ArrayD<f32>> = None;
    for (name, opts) in options() {
        let got = tensor.to_ndarray_with::<f32>(&opts).map_err(|e| format!("{name}: {e}\n{}", describe()))?;
        if got.shape() != root.value.shape() {
            return Err(format!("{name}: shape {:?}, want {:?}\n{}", got.shape(), root.shape, describe()));
        }
        // The reference is finite (the decoder refuses anything else), so a NaN or infinity
        // is wrong, and the maxima below may skip NaN.
        if got.iter().any(|g| !g.is_finite()) {
            return Err(format!("{name}: a non-finite result {got:?}\n{}", describe()));
        }
        let err = got.iter().zip(&root.value).map(|(g, w)| (f64::from(*g) - w).abs()).fold(0.0, f64::max);
        if err > tol {
            return Err(format!("{name}: error {err:e} > {tol:e}\n{}", describe()));
        }
        match &first {
            None => first = Some(got),
            Some(f) => {
                let diff = got.iter().zip(f).map(|(g, h)| f64::from((g - h).abs())).fold(0.0, f64::max);
                if diff > 2.0 * tol {
                    return Err(format!("{name} and default differ by {diff:e}\n{}", describe()));
                }
            }
        }
    }
    Ok(())
}

/// Decodes `bytes` into a graph built through the fallible `try_` API from operands of any
/// shape, where most ops may be refused (a shape error is a fine outcome and leaves the
/// operand as it was), and realizes the result with the default optimizer, fused and without
/// opts. No reference: the three must agree, and every graph the API accepted must realize.
///
/// # Errors
///
/// A description of the first failure: a realize error, or realizations that differ.
pub fn check_try_api(bytes: &[u8]) -> Result<(), String> {
    let mut b = Bytes(bytes);
    let mut stack: Vec<Tensor> = Vec::new();
    fn leaf(b: &mut Bytes<'_>) -> Tensor {
        let shape: Vec<usize> = (0..1 + b.below(3)).map(|_| 1 + b.below(5)).collect();
        let data: Vec<f32> = (0..numel(&shape)).map(|_| (f32::from(b.next()) - 128.0) / 32.0).collect();
        Tensor::from_vec(data, &shape)
    }
    for _ in 0..1 + b.below(12) {
        let x = stack.pop().unwrap_or_else(|| leaf(&mut b));
        let axis = b.below(4) as isize - 2;
        let other = |b: &mut Bytes<'_>, stack: &mut Vec<Tensor>| stack.pop().unwrap_or_else(|| leaf(b));
        let result = match b.below(16) {
            0 => Ok(leaf(&mut b)),
            1 => x.try_add(&other(&mut b, &mut stack)),
            2 => x.try_mul(&other(&mut b, &mut stack)),
            3 => x.try_sub(&other(&mut b, &mut stack)),
            4 => x.try_maximum(&other(&mut b, &mut stack)),
            5 => x.try_sum(axis, b.flag()),
            6 => x.try_max(axis, b.flag()),
            7 => x.try_softmax(axis),
            8 => x.try_matmul(&other(&mut b, &mut stack)),
            9 => x.try_transpose(axis, b.below(4) as isize - 2),
            10 => {
                let n = x.numel();
                x.try_reshape(&if n.is_multiple_of(2) { vec![2, n / 2] } else { vec![n] })
            }
            11 => {
                let len = x.shape().first().copied().unwrap_or(1);
                let begin = b.below(len);
                x.try_slice(0, begin, begin + 1 + b.below(len - begin))
            }
            12 => Tensor::try_cat(&[&x, &other(&mut b, &mut stack)], axis),
            13 => Ok((&x * 0.25f32).exp()),
            14 => Ok(x.recip()),
            _ => {
                let mut shape = x.shape().to_vec();
                shape.insert(0, 1 + b.below(3));
                x.try_reshape(&[&[1], x.shape()].concat()).and_then(|t| t.try_expand(&shape))
            }
        };
        stack.push(result.unwrap_or(x));
    }
    let Some(root) = stack.pop() else { return Ok(()) };
    if root.numel() > 1 << 16 {
        return Ok(());
    }
    let mut results: Vec<Vec<f32>> = Vec::new();
    for (name, opts) in options() {
        let got = root.to_ndarray_with::<f32>(&opts).map_err(|e| format!("{name}: {e}"))?;
        results.push(got.iter().copied().collect());
    }
    let same = |a: &[f32], b: &[f32]| {
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| {
                (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= 1e-3 * (1.0 + x.abs().max(y.abs()))
            })
    };
    for (k, (name, _)) in options().iter().enumerate().skip(1) {
        if !same(&results[0], &results[k]) {
            return Err(format!("{name} differs from default"));
        }
    }
    Ok(())
}
