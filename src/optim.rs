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

/// The new values of `params`: each parameter's values and its gradient's, as f32s, handed to
/// `update` with the parameter's position. The values are computed together (gradients of one
/// loss share most of their graph: realized one by one, each would compute it again).
fn updated(
    params: &[Tensor],
    grads: &[Tensor],
    mut update: impl FnMut(usize, &mut [f32], &[f32]),
) -> Result<Vec<Tensor>, TensorError> {
    let all: Vec<Tensor> = params.iter().chain(grads).map(|t| t.cast(uopc_ir::DType::F32)).collect();
    let refs: Vec<&Tensor> = all.iter().collect();
    let (done, _) = uopc_tensor::realize(&refs, &uopc_tensor::RealizeOptions::default())?;
    let values =
        |t: &Tensor| -> Result<Vec<f32>, TensorError> { Ok(t.to_ndarray::<f32>()?.into_iter().collect()) };
    let (weights, gradients) = done.split_at(params.len());
    let mut out = Vec::with_capacity(params.len());
    for (i, ((p, w), g)) in params.iter().zip(weights).zip(gradients).enumerate() {
        let mut w = values(w)?;
        update(i, &mut w, &values(g)?);
        out.push(Tensor::try_from_vec(w, p.shape())?);
    }
    Ok(out)
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
    moments: Vec<(Vec<f32>, Vec<f32>)>,
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
            self.moments = params.iter().map(|p| (vec![0.0; p.numel()], vec![0.0; p.numel()])).collect();
        }
        self.steps += 1;
        let (b1, b2) = self.betas;
        let t = self.steps as i32;
        let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
        let (lr, weight_decay, eps, moments) = (self.lr, self.weight_decay, self.eps, &mut self.moments);
        updated(params, grads, |i, w, g| {
            let (m, v) = &mut moments[i];
            for (((w, g), m), v) in w.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
                *w -= lr * weight_decay * *w;
                *m = b1 * *m + (1.0 - b1) * g;
                *v = b2 * *v + (1.0 - b2) * g * g;
                *w -= lr * (*m / c1) / ((*v / c2).sqrt() + eps);
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
    buffers: Vec<Vec<f32>>,
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
            self.buffers = params.iter().map(|p| vec![0.0; p.numel()]).collect();
        }
        let (lr, momentum, weight_decay, buffers) =
            (self.lr, self.momentum, self.weight_decay, &mut self.buffers);
        updated(params, grads, |i, w, g| {
            for ((w, g), b) in w.iter_mut().zip(g).zip(buffers[i].iter_mut()) {
                let g = g + weight_decay * *w;
                *b = if first { g } else { momentum * *b + g };
                *w -= lr * if momentum == 0.0 { g } else { *b };
            }
        })
    }
}
