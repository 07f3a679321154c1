//! Tensors made from nothing but a shape: zeros, ones, the identity, and seeded uniform and
//! normal samples.
//!
//! The constants are lazy (a broadcast constant or a comparison of loop indices, no memory
//! until realized); the samples are drawn on the host once, from a generator seeded by the
//! caller, so a run is reproducible.

use super::{Tensor, check_size};
use crate::error::Result;
use crate::util::numel;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use uopc_ir::DType;

impl Tensor {
    /// An f32 tensor of `shape` filled with 0 ([`Tensor::try_full`] with 0; for another dtype,
    /// [`Tensor::try_full_dtype`]). Lazy: no memory until realized.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let z = Tensor::try_zeros(&[2, 3])?;
    /// assert_eq!(z.to_ndarray::<f32>()?.as_slice(), Some(&[0.0; 6][..]));
    /// assert!(Tensor::try_zeros(&[1 << 30, 1 << 30]).is_err()); // 2^60 elements
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `zeros` when `shape` has more
    /// than 2^40 elements or an axis over 2^40.
    pub fn try_zeros(shape: &[usize]) -> Result<Tensor> {
        Tensor::try_full(shape, 0.0).map_err(|e| e.in_op("zeros"))
    }

    /// [`Tensor::try_zeros`], panicking on an oversized shape.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// assert_eq!(Tensor::zeros(&[4]).sum(0, false).to_ndarray::<f32>()?[[]], 0.0);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// On more than 2^40 elements (the error [`Tensor::try_zeros`] returns).
    #[track_caller]
    pub fn zeros(shape: &[usize]) -> Tensor {
        super::ok(Tensor::try_zeros(shape))
    }

    /// An f32 tensor of `shape` filled with 1 ([`Tensor::try_full`] with 1; for another dtype,
    /// [`Tensor::try_full_dtype`]). Lazy: no memory until realized.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let ones = Tensor::try_ones(&[2, 3])?;
    /// assert_eq!(ones.sum(1, false).to_ndarray::<f32>()?.as_slice(), Some(&[3.0, 3.0][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `ones` when `shape` has more
    /// than 2^40 elements or an axis over 2^40.
    pub fn try_ones(shape: &[usize]) -> Result<Tensor> {
        Tensor::try_full(shape, 1.0).map_err(|e| e.in_op("ones"))
    }

    /// [`Tensor::try_ones`], panicking on an oversized shape.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// assert_eq!(Tensor::ones(&[4]).sum(0, false).to_ndarray::<f32>()?[[]], 4.0);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// On more than 2^40 elements (the error [`Tensor::try_ones`] returns).
    #[track_caller]
    pub fn ones(shape: &[usize]) -> Tensor {
        super::ok(Tensor::try_ones(shape))
    }

    /// The `n x n` f32 identity matrix: 1 on the diagonal, 0 elsewhere. Lazy: each element is
    /// a comparison of its row and column index, computed where it is read.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let i = Tensor::try_eye(3)?;
    /// assert_eq!(i.to_ndarray::<f32>()?.as_slice(), Some(&[1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0][..]));
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    /// assert_eq!(x.matmul(&i).to_ndarray::<f32>()?, x.to_ndarray::<f32>()?);
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `eye` when `n * n` is more than
    /// 2^40.
    pub fn try_eye(n: usize) -> Result<Tensor> {
        let shape = [n, n];
        check_size("eye", &shape)?;
        if n == 0 {
            return Ok(Tensor::empty(&shape, DType::F32));
        }
        let rows = Tensor::arange(n).try_reshape(&[n, 1])?;
        let cols = Tensor::arange(n).try_reshape(&[1, n])?;
        Ok(rows.try_eq(&cols).map_err(|e| e.in_op("eye"))?.cast(DType::F32))
    }

    /// [`Tensor::try_eye`], panicking on an oversized `n`.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// assert_eq!(Tensor::eye(4).sum(0, false).to_ndarray::<f32>()?.as_slice(), Some(&[1.0; 4][..]));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// When `n * n` is more than 2^40 (the error [`Tensor::try_eye`] returns).
    #[track_caller]
    pub fn eye(n: usize) -> Tensor {
        super::ok(Tensor::try_eye(n))
    }

    /// An f32 tensor of `shape` with elements drawn independently and uniformly from
    /// `[0, 1)`, by a generator seeded with `seed`: the same seed gives the same tensor (with
    /// this version of uopc; the generator's stream may change between versions). The
    /// elements are drawn on the host when this is called and held in memory.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let u = Tensor::try_rand(&[1000], 7)?.to_ndarray::<f32>()?;
    /// assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
    /// assert!((u.mean().unwrap() - 0.5).abs() < 0.05);
    /// assert_eq!(u, Tensor::try_rand(&[1000], 7)?.to_ndarray::<f32>()?); // same seed, same values
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `rand` when `shape` has more
    /// than 2^40 elements or an axis over 2^40 (checked before anything is drawn).
    pub fn try_rand(shape: &[usize], seed: u64) -> Result<Tensor> {
        check_size("rand", shape)?;
        let mut rng = StdRng::seed_from_u64(seed);
        let data: Vec<f32> = (0..numel(shape)).map(|_| rng.random::<f32>()).collect();
        Tensor::try_from_vec(data, shape).map_err(|e| e.in_op("rand"))
    }

    /// [`Tensor::try_rand`], panicking on an oversized shape.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let u = Tensor::rand(&[2, 2], 1);
    /// assert_eq!(u.shape(), &[2, 2]);
    /// assert!(u.to_ndarray::<f32>()?.iter().all(|&x| (0.0..1.0).contains(&x)));
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// On more than 2^40 elements (the error [`Tensor::try_rand`] returns).
    #[track_caller]
    pub fn rand(shape: &[usize], seed: u64) -> Tensor {
        super::ok(Tensor::try_rand(shape, seed))
    }

    /// An f32 tensor of `shape` with elements drawn independently from the standard normal
    /// distribution N(0, 1) (scale and shift it for another: `Tensor::randn(s, seed) * 0.02`),
    /// by a generator seeded with `seed`, as [`Tensor::try_rand`]. Each sample is drawn in f64
    /// (`rand_distr::StandardNormal`) and rounded once to f32.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let z = Tensor::try_randn(&[10_000], 3)?.to_ndarray::<f32>()?;
    /// let mean = z.mean().unwrap();
    /// let var = z.mapv(|x| (x - mean) * (x - mean)).mean().unwrap();
    /// assert!(mean.abs() < 0.05 && (var - 1.0).abs() < 0.05, "mean {mean} var {var}");
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`](crate::TensorError::Shape) naming `randn` when `shape` has more
    /// than 2^40 elements or an axis over 2^40 (checked before anything is drawn).
    pub fn try_randn(shape: &[usize], seed: u64) -> Result<Tensor> {
        check_size("randn", shape)?;
        let data = standard_normals(numel(shape), &mut StdRng::seed_from_u64(seed));
        Tensor::try_from_vec(data, shape).map_err(|e| e.in_op("randn"))
    }

    /// [`Tensor::try_randn`], panicking on an oversized shape.
    ///
    /// ```rust
    /// use uopc_tensor::Tensor;
    /// let w = Tensor::randn(&[3, 4], 0) * 0.02;
    /// assert_eq!(w.shape(), &[3, 4]);
    /// assert!(w.to_ndarray::<f32>()?.iter().all(|x| x.abs() < 0.2)); // 10 standard deviations
    /// # Ok::<(), uopc_tensor::TensorError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// On more than 2^40 elements (the error [`Tensor::try_randn`] returns).
    #[track_caller]
    pub fn randn(shape: &[usize], seed: u64) -> Tensor {
        super::ok(Tensor::try_randn(shape, seed))
    }
}

/// `n` independent samples of the standard normal distribution drawn from `rng`
/// (`rand_distr`'s ziggurat), each drawn in f64 and rounded once to f32, so the tails are as
/// accurate as f32 holds them.
pub(crate) fn standard_normals(n: usize, rng: &mut StdRng) -> Vec<f32> {
    rng.sample_iter(rand_distr::StandardNormal).take(n).map(|z: f64| z as f32).collect()
}
