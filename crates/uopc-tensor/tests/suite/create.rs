//! zeros, ones, eye, rand, randn, argmax, argmin and item against direct host computations.

use ndarray::{Array2, ArrayD, Axis};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use uopc_ir::DType;
use uopc_tensor::*;

#[test]
fn constants_hold_their_value_and_reject_oversized_shapes() {
    assert_eq!(Tensor::zeros(&[3, 2]).to_ndarray::<f32>().unwrap(), ArrayD::zeros(vec![3, 2]));
    assert_eq!(Tensor::ones(&[2, 1, 3]).to_ndarray::<f32>().unwrap(), ArrayD::ones(vec![2, 1, 3]));
    assert_eq!(Tensor::ones(&[]).item().unwrap(), 1.0);
    assert_eq!(Tensor::zeros(&[0, 4]).shape(), &[0, 4]);
    let err = Tensor::try_ones(&[1 << 41]).unwrap_err().to_string();
    assert!(err.starts_with("ones: "), "{err}");
    let err = Tensor::try_zeros(&[1 << 21, 1 << 21]).unwrap_err().to_string();
    assert!(err.starts_with("zeros: "), "{err}");
}

#[test]
fn eye_is_ndarrays_identity() {
    for n in [1, 2, 5, 17] {
        let got = Tensor::eye(n).to_ndarray::<f32>().unwrap();
        assert_eq!(got, Array2::<f32>::eye(n).into_dyn(), "n = {n}");
    }
    assert_eq!(Tensor::eye(0).shape(), &[0, 0]);
    assert!(Tensor::try_eye(1 << 21).unwrap_err().to_string().starts_with("eye: "));
}

#[test]
fn rand_is_seeded_uniform() {
    let a = Tensor::rand(&[64, 64], 11).to_ndarray::<f32>().unwrap();
    assert_eq!(a, Tensor::rand(&[64, 64], 11).to_ndarray::<f32>().unwrap());
    assert_ne!(a, Tensor::rand(&[64, 64], 12).to_ndarray::<f32>().unwrap());
    assert!(a.iter().all(|&x| (0.0..1.0).contains(&x)));
    // Each of 10 bins of [0, 1) holds about a tenth of 4096 samples (binomial sd ~19).
    let mut bins = [0usize; 10];
    for &x in &a {
        bins[(x * 10.0) as usize] += 1;
    }
    assert!(bins.iter().all(|&b| (310..510).contains(&b)), "{bins:?}");
    assert!(Tensor::try_rand(&[1 << 41], 0).unwrap_err().to_string().starts_with("rand: "));
}

#[test]
fn randn_is_seeded_standard_normal() {
    let n = 20_000;
    let z = Tensor::randn(&[n], 5).to_ndarray::<f32>().unwrap();
    assert_eq!(z, Tensor::randn(&[n], 5).to_ndarray::<f32>().unwrap());
    assert!(z.iter().all(|x| x.is_finite()));
    let z: Vec<f64> = z.iter().map(|&x| f64::from(x)).collect();
    let mean = z.iter().sum::<f64>() / n as f64;
    let var = z.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
    // Standard errors: mean 0.007, variance 0.01.
    assert!(mean.abs() < 0.03 && (var - 1.0).abs() < 0.05, "mean {mean} var {var}");
    // The share within one standard deviation is erf(1/sqrt 2) = 0.6827 (sd of the share 0.003).
    let within = z.iter().filter(|x| x.abs() < 1.0).count() as f64 / n as f64;
    assert!((within - 0.6827).abs() < 0.015, "{within}");
    // An odd count uses half of the last pair.
    assert_eq!(Tensor::randn(&[3, 3], 1).shape(), &[3, 3]);
}

/// The first index of the largest (or smallest) value along `axis`, a NaN counting as the
/// extremum, as torch defines argmax.
fn host_arg(x: &ArrayD<f64>, axis: usize, smallest: bool) -> ArrayD<i64> {
    x.map_axis(Axis(axis), |lane| {
        let mut best = 0;
        for (i, &v) in lane.iter().enumerate() {
            let b = lane[best];
            if b.is_nan() {
                break;
            }
            if v.is_nan() || (if smallest { v < b } else { v > b }) {
                best = i;
            }
        }
        best as i64
    })
}

#[test]
fn argmax_and_argmin_match_the_host_on_ties_and_nans() {
    let mut rng = StdRng::seed_from_u64(9);
    let shape = [3, 5, 7];
    // Few distinct values, so ties are common; a few NaNs.
    let data: Vec<f64> = (0..105)
        .map(|_| if rng.random_range(0..40) == 0 { f64::NAN } else { f64::from(rng.random_range(-3i32..4)) })
        .collect();
    assert!(data.iter().any(|v| v.is_nan()));
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::I32] {
        let t = Tensor::from_vec(data.clone(), &shape).cast(dtype);
        // An integer cast of NaN is not a NaN: compare against what the tensor holds.
        let held = t.cast(DType::F64).to_ndarray::<f64>().unwrap();
        for axis in 0..3 {
            for smallest in [false, true] {
                let got =
                    if smallest { t.argmin(axis as isize, false) } else { t.argmax(axis as isize, false) };
                assert_eq!(got.dtype(), DType::I64);
                let got = got.to_ndarray::<i64>().unwrap();
                assert_eq!(got, host_arg(&held, axis, smallest), "{dtype:?} axis {axis} smallest {smallest}");
            }
        }
    }
    let t = Tensor::from_vec(data, &shape);
    assert_eq!(t.argmax(-1, true).shape(), &[3, 5, 1]);
    assert_eq!(t.argmin(1, true).shape(), &[3, 1, 7]);
}

#[test]
fn argmax_of_bools_and_bad_axes() {
    let b = Tensor::from_vec(vec![false, true, true, false, false, false], &[2, 3]);
    assert_eq!(b.argmax(1, false).to_ndarray::<i64>().unwrap().as_slice(), Some(&[1, 0][..]));
    assert_eq!(b.argmin(1, false).to_ndarray::<i64>().unwrap().as_slice(), Some(&[0, 0][..]));
    let x = Tensor::ones(&[2, 0]);
    let err = x.try_argmax(1, false).unwrap_err().to_string();
    assert!(err.starts_with("argmax: ") && err.contains("size 0"), "{err}");
    let err = x.try_argmin(2, false).unwrap_err().to_string();
    assert!(err.starts_with("argmin: ") && err.contains("axis 2"), "{err}");
    // Only the reduced axis may be empty for an error: an empty other axis gives no indices.
    assert_eq!(x.argmax(0, false).shape(), &[0]);
}

#[test]
fn item_reads_one_element_of_any_dtype() {
    assert_eq!(Tensor::from_vec(vec![7i64], &[1, 1]).item().unwrap(), 7.0);
    assert_eq!(Tensor::from_vec(vec![true], &[]).item().unwrap(), 1.0);
    assert_eq!(Tensor::from_vec(vec![0.1f64], &[1]).item().unwrap(), 0.1f32);
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]);
    assert_eq!((&x * &x).sum(0, false).item().unwrap(), 14.0);
    for bad in [Tensor::ones(&[2]), Tensor::ones(&[0]), Tensor::ones(&[1, 2])] {
        let err = bad.item().unwrap_err();
        assert!(matches!(err, TensorError::Shape { op: "item", .. }), "{err:?}");
        assert!(err.to_string().contains(&format!("{:?}", bad.shape())), "{err}");
    }
}
