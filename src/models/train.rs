//! The forward pass as one differentiable graph (no cache): what a training step runs, with
//! the loss of next-token prediction, the checkpoint's parameters to differentiate and the
//! step itself.

use super::layers::rotary_frequencies;
use super::model::Parameter;
use super::{Architecture, CausalLm, ModelError};
use crate::optim::Optimizer;
use uopc_kernels::sdpa::{AttentionMods, flex_attention, scaled_dot_product_attention};
use uopc_tensor::Tensor;

impl CausalLm {
    /// Every checkpoint weight, in load order, with the leaf tensor it lives in.
    pub fn parameters(&self) -> &[Parameter] {
        &self.params
    }

    /// The logits `(tokens, vocab)` of one sequence as one lazy graph: the same layers as
    /// [`CausalLm::forward`], with causal attention by the tensor graph's attention node
    /// (which has a gradient) and the rotary positions as elementwise ops, so
    /// [`uopc::tensor::gradient`](uopc_tensor::gradient) reaches every weight.
    ///
    /// # Errors
    ///
    /// [`ModelError::Input`] for no tokens, a token outside the vocabulary or more tokens
    /// than the model's positions; shape errors of the layers.
    pub fn forward_graph(&self, tokens: &[u32]) -> Result<Tensor, ModelError> {
        self.forward_graph_batch(&[tokens])
    }

    /// [`CausalLm::forward_graph`] of several sequences of one length at once, the logits
    /// `(sequences * tokens, vocab)` in sequence order: the products run over every
    /// sequence's rows together (each weight read, and its gradient summed, once per step
    /// rather than once per sequence), the attention over each sequence's own tokens.
    ///
    /// # Errors
    ///
    /// As [`CausalLm::forward_graph`] for any sequence; [`ModelError::Input`] when there are
    /// none or their lengths differ.
    pub fn forward_graph_batch(&self, sequences: &[&[u32]]) -> Result<Tensor, ModelError> {
        let c = &self.config;
        let n = sequences.first().map_or(0, |s| s.len());
        if let Some(other) = sequences.iter().find(|s| s.len() != n) {
            return Err(ModelError::Input(format!(
                "sequences of {n} and {} tokens: a training batch needs one length",
                other.len()
            )));
        }
        if n == 0 || n > c.max_positions {
            return Err(ModelError::Input(format!("{n} tokens: give 1 to {}", c.max_positions)));
        }
        let b = sequences.len();
        for tokens in sequences {
            self.check_tokens(tokens)?;
        }
        let runs: Vec<(&[u32], usize)> = sequences.iter().map(|&s| (s, 0)).collect();
        let x = self.embedded(&runs)?;
        // The residual stream is staged after every block: each later kernel reads it, and
        // fused it would be the sum of every earlier block's outputs, recomputed per reader.
        let mut x = x.staged();
        let (h, hkv, hd) = (c.heads, c.kv_heads, c.head_dim);
        let rope = (c.architecture == Architecture::Llama).then(|| rotary_tables(n, hd, c.rope_theta));
        // (b n, heads * hd) columns `from..` as (b, heads, n, hd), rotated when the model is.
        let heads_of =
            |qkv: &Tensor, from: usize, heads: usize, rotated: bool| -> Result<Tensor, ModelError> {
                let t = qkv.try_slice(-1, from, from + heads * hd)?.try_reshape(&[b, n, heads, hd])?;
                let t = match (&rope, rotated) {
                    (Some((cos, sin)), true) => rotate_graph(&t, cos, sin, hd)?,
                    _ => t,
                };
                Ok(t.try_permute(&[0, 2, 1, 3])?)
            };
        let window =
            c.sliding_window.map(|w| AttentionMods::new().mask(move |x| (&x.q - &x.kv).lt(w as i64)));
        for block in &self.blocks {
            let qkv = block.qkv.forward(&block.attn_norm.forward(&x)?)?;
            let q = heads_of(&qkv, 0, h, true)?;
            let k = heads_of(&qkv, h * hd, hkv, true)?;
            let v = heads_of(&qkv, (h + hkv) * hd, hkv, false)?;
            let o = match &window {
                // Each query sees its last `w` keys (itself included): the flex kernel.
                Some(mods) => flex_attention(&q, &k, &v, mods, &[], true, None)?,
                None => scaled_dot_product_attention(&q, &k, &v, None, true, None)?,
            };
            let o = o.try_permute(&[0, 2, 1, 3])?.try_reshape(&[b * n, h * hd])?;
            x = x.try_add(&block.out.forward(&o)?)?.staged();
            x = x.try_add(&block.mlp.forward(&block.mlp_norm.forward(&x)?)?)?.staged();
        }
        Ok(self.final_norm.forward(&x)?.try_matmul(&self.head)?)
    }

    /// The mean cross-entropy of predicting each token of `tokens` from those before it (the
    /// loss transformers computes with `labels = input_ids`), as a 0-d tensor.
    ///
    /// # Errors
    ///
    /// As [`CausalLm::forward_graph`]; [`ModelError::Input`] for fewer than two tokens.
    pub fn loss(&self, tokens: &[u32]) -> Result<Tensor, ModelError> {
        self.loss_batch(&[tokens])
    }

    /// The mean cross-entropy over every predicted token of several sequences of one length
    /// (transformers' loss of the batch with `labels = input_ids`), from one graph of the
    /// whole batch ([`CausalLm::forward_graph_batch`]).
    ///
    /// # Errors
    ///
    /// As [`CausalLm::forward_graph_batch`]; [`ModelError::Input`] for fewer than two tokens
    /// per sequence.
    pub fn loss_batch(&self, sequences: &[&[u32]]) -> Result<Tensor, ModelError> {
        if sequences.iter().any(|s| s.len() < 2) {
            return Err(ModelError::Input("a loss needs at least two tokens per sequence".into()));
        }
        let logits = self.forward_graph_batch(sequences)?;
        let (b, n, vocab) = (sequences.len(), sequences[0].len(), self.config.vocab_size);
        let targets: Vec<usize> = sequences.iter().flat_map(|s| s[1..].iter().map(|&t| t as usize)).collect();
        let predicted = logits.try_reshape(&[b, n, vocab])?.try_slice(1, 0, n - 1)?;
        Ok(predicted.try_reshape(&[b * (n - 1), vocab])?.try_cross_entropy(&targets)?)
    }

    /// One training step on a batch of equal-length sequences: the loss
    /// ([`CausalLm::loss_batch`]) and its gradients with respect to every leaf, computed
    /// together in one realize (they share the forward pass), then `optimizer`'s update.
    /// Returns the updated model ([`CausalLm::with_leaves`]) and the loss before the step.
    ///
    /// ```rust,no_run
    /// use uopc::models::CausalLm;
    /// use uopc::optim::AdamW;
    ///
    /// let mut model = CausalLm::load(std::path::Path::new("checkpoint"))?;
    /// let mut opt = AdamW::new(1e-4);
    /// let batch: [&[u32]; 2] = [&[1, 2, 3, 4], &[5, 6, 7, 8]];
    /// for _ in 0..10 {
    ///     let (next, loss) = model.train_step(&batch, &mut opt)?;
    ///     println!("loss {loss}");
    ///     model = next;
    /// }
    /// # Ok::<(), uopc::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`CausalLm::loss_batch`]; the errors of the optimizer's step and of
    /// [`CausalLm::with_leaves`].
    pub fn train_step(
        &self,
        sequences: &[&[u32]],
        optimizer: &mut impl Optimizer,
    ) -> Result<(CausalLm, f32), ModelError> {
        let loss = self.loss_batch(sequences)?;
        let leaves = self.leaves();
        let grads = uopc_tensor::gradient(&loss, &leaves.iter().collect::<Vec<_>>())?;
        let mut wanted = vec![&loss];
        wanted.extend(&grads);
        let (done, _) = uopc_tensor::realize(&wanted, &uopc_tensor::RealizeOptions::default())?;
        let value = done[0].item()?;
        Ok((self.with_leaves(&optimizer.step(&leaves, &done[1..])?)?, value))
    }
}

/// `cos` and `sin` of the rotary angles, `(n, 1, hd / 2)` each (broadcast over a batch's
/// leading axis), computed in f32 as the
/// reference does (see [`super::layers::rotate`]).
fn rotary_tables(n: usize, hd: usize, theta: f32) -> (Tensor, Tensor) {
    let half = hd / 2;
    let inv_freq = rotary_frequencies(hd, theta);
    let (mut cos, mut sin) = (Vec::with_capacity(n * half), Vec::with_capacity(n * half));
    for p in 0..n {
        for f in &inv_freq {
            let (s, c) = (p as f32 * f).sin_cos();
            cos.push(c);
            sin.push(s);
        }
    }
    (Tensor::from_vec(cos, &[n, 1, half]), Tensor::from_vec(sin, &[n, 1, half]))
}

/// `x` `(.., n, heads, hd)` rotated: halves `x1 cos - x2 sin` and `x2 cos + x1 sin`.
fn rotate_graph(x: &Tensor, cos: &Tensor, sin: &Tensor, hd: usize) -> Result<Tensor, ModelError> {
    let half = hd / 2;
    let (x1, x2) = (x.try_slice(-1, 0, half)?, x.try_slice(-1, half, hd)?);
    let r1 = x1.try_mul(cos)?.try_sub(&x2.try_mul(sin)?)?;
    let r2 = x2.try_mul(cos)?.try_add(&x1.try_mul(sin)?)?;
    Ok(Tensor::try_cat(&[&r1, &r2], -1)?)
}
