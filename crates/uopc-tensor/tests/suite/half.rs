//! 16-bit tensors: ndarray round trips of `half::bf16` and `half::f16`, casts against the
//! `half` crate, and small bf16 / f16 computations against f64 with tolerances from the types'
//! precision (a rounding to bf16 is within 2^-8 relative, to f16 within 2^-11).

use half::{bf16, f16};
use uopc_ir::DType;
use uopc_tensor::{Tensor, ndarray};

/// Unit roundoff of bf16 (8 significant bits) and f16 (11).
const BF16_U: f64 = 1.0 / 256.0;
const F16_U: f64 = 1.0 / 2048.0;
/// Unit roundoff of f32, in which 16-bit tensors compute.
const F32_U: f64 = f32::EPSILON as f64 / 2.0;

/// Deterministic values in [-scale, scale).
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * scale
        })
        .collect()
}

fn bf16s(n: usize, seed: u64, scale: f32) -> Vec<bf16> {
    values(n, seed, scale).into_iter().map(bf16::from_f32).collect()
}

#[test]
fn bf16_and_f16_arrays_round_trip() -> Result<(), uopc_tensor::TensorError> {
    let every_bf16: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).filter(|x| !x.is_nan()).collect();
    let n = every_bf16.len();
    let a = ndarray::Array1::from(every_bf16.clone());
    let t = Tensor::try_from_array(&a)?;
    assert_eq!(t.dtype(), DType::BF16);
    assert_eq!(t.to_ndarray::<bf16>()?.as_slice(), Some(&every_bf16[..]));
    // Through a kernel: widened to f32 and narrowed back, each exactly.
    let back = t.cast(DType::F32).cast(DType::BF16).to_ndarray::<bf16>()?;
    assert_eq!(back.as_slice(), Some(&every_bf16[..]));
    let wide = t.to_ndarray::<f32>()?;
    assert!(wide.iter().zip(&every_bf16).all(|(w, h)| w.to_bits() == h.to_f32().to_bits()));

    let every_f16: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).filter(|x| !x.is_nan()).collect();
    let t = Tensor::try_from(ndarray::Array1::from(every_f16.clone()))?;
    assert_eq!(t.dtype(), DType::F16);
    assert_eq!(t.to_ndarray::<f16>()?.as_slice(), Some(&every_f16[..]));
    let wide = t.to_ndarray::<f64>()?;
    assert!(wide.iter().zip(&every_f16).all(|(w, h)| *w == h.to_f64()));
    assert!(n > 60_000);
    Ok(())
}

#[test]
fn casts_to_16_bit_round_like_half() -> Result<(), uopc_tensor::TensorError> {
    let x = values(4096, 7, 70_000.0);
    let t = Tensor::from_vec(x.clone(), &[64, 64]);
    let b = t.cast(DType::BF16).to_ndarray::<bf16>()?;
    let h = t.cast(DType::F16).to_ndarray::<f16>()?;
    for (k, &v) in x.iter().enumerate() {
        assert_eq!(b.as_slice().unwrap()[k], bf16::from_f32(v), "{v}");
        assert_eq!(h.as_slice().unwrap()[k].to_bits(), f16::from_f32(v).to_bits(), "{v}");
    }
    // Integers reach 16-bit floats through f32; 16-bit floats reach integers the same way.
    let ints = Tensor::from_vec(vec![3.0f32, -7.0, 1000.0, 257.0], &[4]).cast(DType::I32);
    let as_bf16 = ints.cast(DType::BF16).to_ndarray::<bf16>()?;
    assert_eq!(as_bf16.iter().map(|x| x.to_f32()).collect::<Vec<_>>(), [3.0, -7.0, 1000.0, 256.0]);
    let back = ints.cast(DType::BF16).cast(DType::I32).cast(DType::F64).to_ndarray::<f64>()?;
    assert_eq!(back.as_slice(), Some(&[3.0, -7.0, 1000.0, 256.0][..]));
    Ok(())
}

#[test]
fn bf16_elementwise_ops_compute_in_f32_and_round_once_each() -> Result<(), uopc_tensor::TensorError> {
    let n = 2048;
    let (a, b, c) = (bf16s(n, 1, 4.0), bf16s(n, 2, 4.0), bf16s(n, 3, 4.0));
    let t = |v: &[bf16]| Tensor::from_vec(v.to_vec(), &[n]);
    let y = (t(&a) * t(&b) + t(&c)).relu();
    assert_eq!(y.dtype(), DType::BF16);
    let got = y.to_ndarray::<bf16>()?;
    for k in 0..n {
        let (x, w, z) = (a[k].to_f64(), b[k].to_f64(), c[k].to_f64());
        let want = (x * w + z).max(0.0);
        // Two roundings to bf16 (the product, the sum), each within u of its result.
        let tol = BF16_U * (2.0 * (x * w).abs() + z.abs()) * (1.0 + 2.0 * BF16_U);
        let g = got[k].to_f64();
        assert!((g - want).abs() <= tol, "element {k}: {g} vs {want} (tol {tol})");
    }
    // With an f32 operand the result is f32, with no 16-bit rounding at all.
    let mixed = (t(&a) + Tensor::from_vec(vec![0.25f32; n], &[n])).to_ndarray::<f32>()?;
    assert!(mixed.iter().zip(&a).all(|(m, x)| *m == x.to_f32() + 0.25));
    Ok(())
}

#[test]
fn bf16_sum_and_matmul_accumulate_in_f32() -> Result<(), uopc_tensor::TensorError> {
    let (rows, cols) = (16, 512);
    let x = bf16s(rows * cols, 4, 1.0);
    let sums = Tensor::from_vec(x.clone(), &[rows, cols]).sum(1, false);
    assert_eq!(sums.dtype(), DType::BF16);
    let sums = sums.to_ndarray::<bf16>()?;
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let want: f64 = row.iter().map(|v| v.to_f64()).sum();
        let magnitude: f64 = row.iter().map(|v| v.to_f64().abs()).sum();
        // f32 sums (cols of them) and one rounding to bf16 at the end.
        let tol = BF16_U * want.abs() + cols as f64 * F32_U * magnitude * 1.01;
        let g = sums[r].to_f64();
        assert!((g - want).abs() <= tol, "row {r}: {g} vs {want} (tol {tol})");
    }

    let (n, k, m) = (24, 96, 40);
    let (a, b) = (bf16s(n * k, 5, 1.0), bf16s(k * m, 6, 1.0));
    let product = Tensor::from_vec(a.clone(), &[n, k]).matmul(&Tensor::from_vec(b.clone(), &[k, m]));
    assert_eq!(product.dtype(), DType::BF16);
    let got = product.to_ndarray::<bf16>()?;
    for i in 0..n {
        for j in 0..m {
            let terms = (0..k).map(|p| a[i * k + p].to_f64() * b[p * m + j].to_f64());
            let (want, magnitude) = terms.fold((0.0, 0.0), |(s, g), t| (s + t, g + t.abs()));
            let tol = BF16_U * want.abs() + k as f64 * F32_U * magnitude * 1.01;
            let g = got[[i, j]].to_f64();
            assert!((g - want).abs() <= tol, "({i},{j}): {g} vs {want} (tol {tol})");
        }
    }
    Ok(())
}

#[test]
fn f16_softmax_matches_f64() -> Result<(), uopc_tensor::TensorError> {
    let (rows, cols) = (8, 100);
    let x: Vec<f16> = values(rows * cols, 9, 6.0).into_iter().map(f16::from_f32).collect();
    let p = Tensor::from_vec(x.clone(), &[rows, cols]).softmax(-1);
    assert_eq!(p.dtype(), DType::F16);
    let got = p.to_ndarray::<f16>()?;
    for r in 0..rows {
        let row: Vec<f64> = x[r * cols..(r + 1) * cols].iter().map(|v| v.to_f64()).collect();
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let total: f64 = row.iter().map(|v| (v - max).exp()).sum();
        for (j, v) in row.iter().enumerate() {
            let want = (v - max).exp() / total;
            // The f32 softmax (its exp2 within a few f32 ulps) rounded once to f16: within u
            // relative, or half the subnormal spacing (2^-25) below f16's normal range.
            let tol = F16_U * want + 64.0 * F32_U * want + 2f64.powi(-25);
            let g = got[[r, j]].to_f64();
            assert!((g - want).abs() <= tol, "({r},{j}): {g} vs {want}");
        }
    }
    Ok(())
}

#[test]
fn gradients_flow_through_16_bit_tensors() -> Result<(), uopc_tensor::TensorError> {
    let v = [0.5f32, -1.25, 3.0, 7.5];
    // A bf16 parameter: d/dx sum(x * x) = 2x, exact in bf16 for these values.
    let x = Tensor::from_vec(v.iter().map(|&a| bf16::from_f32(a)).collect(), &[4]);
    let g = uopc_tensor::gradient(&(&x * &x).sum(0, false), &[&x])?;
    assert_eq!(g[0].dtype(), DType::BF16);
    let got: Vec<f32> = g[0].to_ndarray::<bf16>()?.iter().map(|h| h.to_f32()).collect();
    assert_eq!(got, v.iter().map(|a| 2.0 * a).collect::<Vec<_>>());
    // An f32 parameter through a rounding to f16 and back: the casts pass the gradient on.
    let y = Tensor::from_vec(v.to_vec(), &[4]);
    let loss = (y.cast(DType::F16).cast(DType::F32) * 3.0).sum(0, false);
    let g = uopc_tensor::gradient(&loss, &[&y])?;
    assert_eq!(g[0].to_ndarray::<f32>()?.as_slice(), Some(&[3.0f32; 4][..]));
    Ok(())
}

/// A 16-bit value of `dtype` as f64, from the tensor's own storage.
fn stored(dtype: DType, bits: u16) -> f64 {
    if dtype == DType::BF16 { bf16::from_bits(bits).to_f64() } else { f16::from_bits(bits).to_f64() }
}

/// `count` random values of `dtype` in [-1, 1) as a tensor of `shape`, and their bit patterns.
fn half_tensor(dtype: DType, shape: &[usize], seed: u64) -> (Tensor, Vec<u16>) {
    let n = shape.iter().product();
    let x = values(n, seed, 1.0);
    if dtype == DType::BF16 {
        let h: Vec<bf16> = x.into_iter().map(bf16::from_f32).collect();
        (Tensor::from_vec(h.clone(), shape), h.iter().map(|v| v.to_bits()).collect())
    } else {
        let h: Vec<f16> = x.into_iter().map(f16::from_f32).collect();
        (Tensor::from_vec(h.clone(), shape), h.iter().map(|v| v.to_bits()).collect())
    }
}

#[test]
fn half_matmuls_run_on_the_16_bit_tile_gemm_and_round_once() -> Result<(), uopc_tensor::TensorError> {
    use uopc_tensor::{RealizeOptions, make_plan};
    // (batch of A, batch of B, B stored transposed): batched, broadcast and transposed forms.
    let (m, k, n) = (40, 96, 50);
    for dtype in [DType::BF16, DType::F16] {
        for (batch_a, batch_b, b_trans) in
            [(vec![], vec![], false), (vec![2, 3], vec![2, 3], false), (vec![2, 1], vec![3], true)]
        {
            let (a, av) = half_tensor(dtype, &[batch_a.clone(), vec![m, k]].concat(), 11);
            let b_shape = [batch_b.clone(), if b_trans { vec![n, k] } else { vec![k, n] }].concat();
            let (b, bv) = half_tensor(dtype, &b_shape, 12);
            let b = if b_trans { b.t() } else { b };
            let c = a.matmul(&b);
            assert_eq!(c.dtype(), dtype);
            let plan = make_plan(&[c.uop().clone()], &RealizeOptions::default()).unwrap();
            let names = plan.kernel_names();
            // The GEMM reads both 16-bit inputs where they are (no widening copies), and its
            // epilogue rounds each f32 block to the 16-bit output in the same kernel.
            let gemms: Vec<_> = plan.kernels.iter().filter(|k| k.uses_tile_ops()).collect();
            assert_eq!(gemms.len(), 1, "{dtype}: {names:?}");
            assert_eq!(plan.kernels.len(), 1, "{dtype}: {names:?}");
            assert!(gemms[0].has_epilogue(), "{dtype}: {plan}");
            let reads: Vec<DType> = uopc_ir::UOp::toposort(std::slice::from_ref(&gemms[0].program))
                .iter()
                .filter(|u| matches!(u.op(), uopc_ir::Op::Buffer { .. }))
                .map(|u| u.dtype())
                .collect();
            // The two inputs and the output.
            assert_eq!(reads.iter().filter(|d| **d == dtype).count(), 3, "{dtype}: buffers {reads:?}");

            let got: Vec<f64> = match dtype {
                DType::BF16 => c.to_ndarray::<bf16>()?.iter().map(|v| v.to_f64()).collect(),
                _ => c.to_ndarray::<f16>()?.iter().map(|v| v.to_f64()).collect(),
            };
            let items: usize = c.shape()[..c.shape().len() - 2].iter().product();
            let (items_a, items_b) = (batch_a.iter().product::<usize>(), batch_b.iter().product::<usize>());
            let unit = if dtype == DType::BF16 { BF16_U } else { F16_U };
            for item in 0..items {
                // Batch broadcasting: (2, 1) against (3) gives (2, 3); A's item is the row,
                // B's the column; equal batches pair items one to one.
                let (ia, ib) = if items_a == items_b { (item, item) } else { (item / 3, item % 3) };
                for i in 0..m {
                    for j in 0..n {
                        let terms = (0..k).map(|p| {
                            let x = stored(dtype, av[ia * m * k + i * k + p]);
                            let y =
                                stored(dtype, bv[ib * k * n + if b_trans { j * k + p } else { p * n + j }]);
                            x * y
                        });
                        let (want, magnitude) = terms.fold((0.0, 0.0), |(s, g), t| (s + t, g + t.abs()));
                        // Exact 16-bit products, f32 sums (k of them), one rounding to 16 bits
                        // at the end (u relative, or half f16's subnormal spacing, 2^-25).
                        let tol = unit * want.abs() + k as f64 * F32_U * magnitude * 1.01 + 2f64.powi(-25);
                        let g = got[item * m * n + i * n + j];
                        assert!((g - want).abs() <= tol, "{dtype} item {item} ({i},{j}): {g} vs {want}");
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn f32_times_widened_16_bit_weights_reads_the_weights_in_place() -> Result<(), uopc_tensor::TensorError> {
    use uopc_tensor::{RealizeOptions, make_plan};
    // A linear layer with 16-bit weights: f32 rows (1 = decode, 3, 40 = a prompt) times a
    // `(out, in)` weight read transposed and widened; and the weight on the left.
    let (k, n) = (72, 37);
    for dtype in [DType::BF16, DType::F16] {
        let (w, wv) = half_tensor(dtype, &[n, k], 21);
        for m in [1, 3, 40] {
            let xv = values(m * k, 22, 1.0);
            let x = Tensor::from_vec(xv.clone(), &[m, k]);
            // Computed rows (a norm's output) beside the stored weight, as in a model.
            let x = &x * 2.0;
            for weight_left in [false, true] {
                let c = if weight_left {
                    w.cast(DType::F32).matmul(&x.t())
                } else {
                    x.matmul(&w.cast(DType::F32).t())
                };
                assert_eq!(c.dtype(), DType::F32);
                let plan = make_plan(&[c.uop().clone()], &RealizeOptions::default()).unwrap();
                let reads_weight = |k: &&uopc_tensor::Kernel| {
                    uopc_ir::UOp::toposort(std::slice::from_ref(&k.program))
                        .iter()
                        .any(|u| matches!(u.op(), uopc_ir::Op::Buffer { .. }) && u.dtype() == dtype)
                };
                // The weight is read as stored, by the GEMM alone: no kernel widens a copy of it.
                let readers: Vec<_> = plan.kernels.iter().filter(reads_weight).collect();
                assert_eq!(readers.len(), 1, "{dtype} m {m}: {plan}");
                assert!(readers[0].uses_tile_ops(), "{dtype} m {m}: {plan}");
                let got = c.to_ndarray::<f32>()?;
                for i in 0..m {
                    for j in 0..n {
                        let terms: Vec<f64> = (0..k)
                            .map(|p| 2.0 * f64::from(xv[i * k + p]) * stored(dtype, wv[j * k + p]))
                            .collect();
                        let want: f64 = terms.iter().sum();
                        let magnitude: f64 = terms.iter().map(|t| t.abs()).sum();
                        // Exact products of the widened weight, f32 sums of k terms.
                        let tol = k as f64 * F32_U * magnitude * 1.01 + 1e-30;
                        let g = f64::from(if weight_left { got[[j, i]] } else { got[[i, j]] });
                        assert!((g - want).abs() <= tol, "{dtype} m {m} ({i},{j}): {g} vs {want}");
                    }
                }
            }
        }
    }
    Ok(())
}
