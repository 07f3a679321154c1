//! The tensor-graph arm of `cargo xtask bench flex`: the same cell as
//! `q.sdpa(&k, &v).mods(..)` on lazy tensors, its graph built and realized on every run (the
//! forward, or the forward and the gradients of q, k, v and the float captures), as a user's
//! training step runs it.

use std::time::Instant;
use uopc::attention::sdpa::{AttentionMods, AttentionOp, CaptureValues};
use uopc::ir::DType;
use uopc::tensor::{RealizeOptions, Tensor, gradient, realize};

/// The inputs of one cell as tensors, built once.
pub struct GraphArm {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    d_o: Tensor,
    captures: Vec<Tensor>,
    mods: AttentionMods,
    backward: bool,
}

impl GraphArm {
    /// The arm of a cell with these inputs (q `(B, H, N, D)`, k and v `(B, H_kv, N, D)`, flat)
    /// and captures.
    pub fn new(
        mods: AttentionMods,
        [q, k, v, d_o]: [&[f32]; 4],
        [batch, heads, kv_heads, n, d]: [usize; 5],
        captures: &[CaptureValues<'_>],
        backward: bool,
    ) -> GraphArm {
        let tensors: Vec<Tensor> = mods
            .captures()
            .iter()
            .zip(captures)
            .map(|(spec, values)| match values {
                CaptureValues::F32(x) => Tensor::from_vec(x.to_vec(), &spec.shape),
                CaptureValues::I32(x) => Tensor::from_vec(x.to_vec(), &spec.shape),
            })
            .collect();
        let (qs, ks) = ([batch, heads, n, d], [batch, kv_heads, n, d]);
        GraphArm {
            q: Tensor::from_vec(q.to_vec(), &qs),
            k: Tensor::from_vec(k.to_vec(), &ks),
            v: Tensor::from_vec(v.to_vec(), &ks),
            d_o: Tensor::from_vec(d_o.to_vec(), &qs),
            captures: tensors,
            mods,
            backward,
        }
    }

    /// One run, in milliseconds: the graph built and realized.
    pub fn run(&self) -> Result<f64, uopc::Error> {
        let start = Instant::now();
        let refs: Vec<&Tensor> = self.captures.iter().collect();
        let out = self.q.sdpa(&self.k, &self.v).mods(&self.mods, &refs).run()?;
        if self.backward {
            let numel = out.numel();
            let loss = out.try_mul(&self.d_o)?.try_reshape(&[numel])?.try_sum(0, false)?;
            let mut params = vec![&self.q, &self.k, &self.v];
            params.extend(self.captures.iter().filter(|c| c.dtype() == DType::F32));
            let grads = gradient(&loss, &params)?;
            let mut roots = vec![&out];
            roots.extend(grads.iter());
            realize(&roots, &RealizeOptions::default())?;
        } else {
            drop(out.realize()?);
        }
        Ok(start.elapsed().as_secs_f64() * 1e3)
    }
}
