//! Optimizers: the update of a list of parameters from their gradients, as PyTorch's
//! `torch.optim.SGD` (with momentum) and `torch.optim.AdamW` compute it, on the host.
//!
//! An optimizer keeps its state per parameter position; [`AdamW::step`] (and
//! [`Sgd::step`]) take the parameters and their gradients in the same order every step and
//! return the new parameters as fresh tensors (the old ones, and graphs built on them, are
//! unchanged: tensors are values).
//!
//! ```rust
//! use uopc::optim::AdamW;
//! use uopc::prelude::*;
//!
//! // Minimize |w - 3|^2 from w = 0.
//! let mut w = Tensor::from_vec(vec![0.0f32, 0.0], &[2]);
//! let mut opt = AdamW::new(0.1);
//! for _ in 0..200 {
//!     let diff = &w - 3.0;
//!     let loss = (&diff * &diff).sum(0, false);
//!     let grads = uopc::tensor::gradient(&loss, &[&w])?;
//!     w = opt.step(&[w.clone()], &grads)?.remove(0);
//! }
//! assert!(w.to_ndarray::<f32>()?.iter().all(|v| (v - 3.0).abs() < 0.1));
//! # Ok::<(), uopc::Error>(())
//! ```

use uopc_tensor::{Tensor, TensorError};
use uopc_tile::memory::{overwritten_f32, zeroed_f32};

/// The new values of `params`: `update(old, gradient, new, state)` over pieces of each
/// parameter's f32 values, its gradient's, the new values' and its `S` state buffers' (the
/// same range of each), with the pieces of every parameter spread over the threads. The
/// tensors are computed together (gradients of one loss share most of their graph: realized
/// one by one, each would compute it again), then read where they are.
fn updated<const S: usize>(
    params: &[Tensor],
    grads: &[Tensor],
    state: &mut [[Vec<f32>; S]],
    update: impl Fn(&[f32], &[f32], &mut [f32], [&mut [f32]; S]) + Sync,
) -> Result<Vec<Tensor>, TensorError> {
    use rayon::prelude::*;
    // Pieces big enough to amortize a task, small enough to spread one large matrix.
    const PIECE: usize = 1 << 16;
    let all: Vec<Tensor> = params.iter().chain(grads).map(|t| t.cast(uopc_ir::DType::F32)).collect();
    let refs: Vec<&Tensor> = all.iter().collect();
    let (done, _) = uopc_tensor::realize(&refs, &uopc_tensor::RealizeOptions::default())?;
    let slices = done.iter().map(values).collect::<Result<Vec<_>, _>>()?;
    let (weights, gradients) = slices.split_at(params.len());
    // Every element is written below, so the last step's dropped weights can serve.
    let mut fresh: Vec<Vec<f32>> = params.iter().map(|p| overwritten_f32(p.numel())).collect();
    let mut pieces = Vec::new();
    for (i, (new, own)) in fresh.iter_mut().zip(state.iter_mut()).enumerate() {
        let mut own = own.each_mut().map(|v| v.chunks_mut(PIECE));
        for (j, new) in new.chunks_mut(PIECE).enumerate() {
            let own = own.each_mut().map(|c| c.next().expect("state as long as the parameter"));
            pieces.push((i, j * PIECE, new, own));
        }
    }
    pieces.into_par_iter().for_each(|(i, start, new, own)| {
        let range = start..start + new.len();
        update(&weights[i][range.clone()], &gradients[i][range], new, own);
    });
    params.iter().zip(fresh).map(|(p, w)| Tensor::try_from_vec(w, p.shape())).collect()
}

/// The f32 values of a realized tensor, read where they are when it is backed by f32 data.
fn values(t: &Tensor) -> Result<std::borrow::Cow<'_, [f32]>, TensorError> {
    if let Some(s) = t.as_slice::<f32>() {
        return Ok(s.into());
    }
    let mut v = vec![0.0f32; t.numel()];
    t.realize_into(&mut v)?;
    Ok(v.into())
}

/// Checks that `params` and `grads` pair up and match the state's count.
fn check(params: &[Tensor], grads: &[Tensor], state_len: usize) -> Result<(), TensorError> {
    let fault = |msg: String| TensorError::Shape { op: "optimizer step", msg };
    if params.len() != grads.len() {
        return Err(fault(format!("{} parameters but {} gradients", params.len(), grads.len())));
    }
    if state_len != 0 && state_len != params.len() {
        return Err(fault(format!("{} parameters, but the optimizer has stepped {state_len}", params.len())));
    }
    for (i, (p, g)) in params.iter().zip(grads).enumerate() {
        if p.shape() != g.shape() {
            return Err(fault(format!(
                "parameter {i} has shape {:?} and its gradient {:?}",
                p.shape(),
                g.shape()
            )));
        }
    }
    Ok(())
}

/// AdamW (Loshchilov and Hutter), as `torch.optim.AdamW`: `p -= lr * wd * p`, then
/// `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) g^2`, and
/// `p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)`.
#[derive(Clone, Debug)]
pub struct AdamW {
    /// Learning rate.
    pub lr: f32,
    /// `(b1, b2)`, the decay of the first and second moments.
    pub betas: (f32, f32),
    /// Added to the root of the second moment.
    pub eps: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
    steps: u32,
    /// The first and second moments of each parameter.
    moments: Vec<[Vec<f32>; 2]>,
}

impl AdamW {
    /// torch's defaults with learning rate `lr`: betas (0.9, 0.999), eps 1e-8, weight decay 0.01.
    pub fn new(lr: f32) -> AdamW {
        AdamW { lr, betas: (0.9, 0.999), eps: 1e-8, weight_decay: 0.01, steps: 0, moments: Vec::new() }
    }

    /// Steps taken.
    pub fn steps(&self) -> u32 {
        self.steps
    }

    /// One step: the new values of `params` from `grads` (same order, same shapes, every step).
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`] naming `optimizer step` when the counts or shapes do not pair
    /// up; the errors of computing the tensors.
    pub fn step(&mut self, params: &[Tensor], grads: &[Tensor]) -> Result<Vec<Tensor>, TensorError> {
        check(params, grads, self.moments.len())?;
        if self.moments.is_empty() {
            self.moments = params.iter().map(|p| [zeroed_f32(p.numel()), zeroed_f32(p.numel())]).collect();
        }
        self.steps += 1;
        let (b1, b2) = self.betas;
        let t = self.steps as i32;
        let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
        let (lr, weight_decay, eps) = (self.lr, self.weight_decay, self.eps);
        updated(params, grads, &mut self.moments, |old, g, new, [m, v]| {
            for ((((w, new), g), m), v) in old.iter().zip(new).zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
                let w = w - lr * weight_decay * w;
                *m = b1 * *m + (1.0 - b1) * g;
                *v = b2 * *v + (1.0 - b2) * g * g;
                *new = w - lr * (*m / c1) / ((*v / c2).sqrt() + eps);
            }
        })
    }
}

/// Stochastic gradient descent with momentum, as `torch.optim.SGD`: `g += wd * p`,
/// `b = momentum * b + g` (`b = g` on the first step), `p -= lr * b`.
#[derive(Clone, Debug)]
pub struct Sgd {
    /// Learning rate.
    pub lr: f32,
    /// Momentum (0: plain SGD).
    pub momentum: f32,
    /// L2 weight decay added to the gradient.
    pub weight_decay: f32,
    buffers: Vec<[Vec<f32>; 1]>,
}

impl Sgd {
    /// SGD with learning rate `lr` and `momentum`, no weight decay.
    pub fn new(lr: f32, momentum: f32) -> Sgd {
        Sgd { lr, momentum, weight_decay: 0.0, buffers: Vec::new() }
    }

    /// One step, as [`AdamW::step`].
    ///
    /// # Errors
    ///
    /// As [`AdamW::step`].
    pub fn step(&mut self, params: &[Tensor], grads: &[Tensor]) -> Result<Vec<Tensor>, TensorError> {
        check(params, grads, self.buffers.len())?;
        let first = self.buffers.is_empty();
        if first {
            self.buffers = params.iter().map(|p| [zeroed_f32(p.numel())]).collect();
        }
        let (lr, momentum, weight_decay) = (self.lr, self.momentum, self.weight_decay);
        updated(params, grads, &mut self.buffers, |old, g, new, [b]| {
            for (((w, new), g), b) in old.iter().zip(new).zip(g).zip(b.iter_mut()) {
                let g = g + weight_decay * w;
                *b = if first { g } else { momentum * *b + g };
                *new = w - lr * if momentum == 0.0 { g } else { *b };
            }
        })
    }
}

/// An optimizer: the new values of a list of parameters from their gradients, keeping its
/// own state per parameter position. [`AdamW`] and [`Sgd`] are two;
/// [`CausalLm::train_step`](crate::models::CausalLm::train_step) takes any.
pub trait Optimizer {
    /// One step: the new values of `params` from `grads` (same order, same shapes, every
    /// step).
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`] when the counts or shapes do not pair up; the errors of
    /// computing the tensors.
    fn step(&mut self, params: &[Tensor], grads: &[Tensor]) -> Result<Vec<Tensor>, TensorError>;
}

impl Optimizer for AdamW {
    fn step(&mut self, params: &[Tensor], grads: &[Tensor]) -> Result<Vec<Tensor>, TensorError> {
        AdamW::step(self, params, grads)
    }
}

impl Optimizer for Sgd {
    fn step(&mut self, params: &[Tensor], grads: &[Tensor]) -> Result<Vec<Tensor>, TensorError> {
        Sgd::step(self, params, grads)
    }
}
