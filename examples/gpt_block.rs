//! A GPT-2 block through the Tensor API: checked against its f64 reference on a small
//! configuration, then a two-block model trained with SGD on a synthetic next-token task
//! (each token is followed by its successor modulo the vocabulary), printing the loss.
//!
//! `cargo run --release --example gpt_block`; `cargo xtask bench block` times the
//! GPT-2-small block.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use uopc::Tensor;
use uopc::gpt::{GptBlock, GptConfig, GptError, normal, reference_forward_f64};
use uopc::tensor::{RealizeOptions, gradient, realize};

const VOCAB: usize = 16;
const BATCH: usize = 8;
const TOKENS: usize = 32;
const CONFIG: GptConfig = GptConfig { d_model: 64, heads: 4, hidden: 256, eps: 1e-5 };

/// Embedding, two blocks, a final LayerNorm and an output projection.
struct Model {
    embed: Tensor,
    blocks: [GptBlock; 2],
    final_norm: (Tensor, Tensor),
    unembed: Tensor,
}

impl Model {
    fn new(seed: u64) -> Result<Model, GptError> {
        let mut rng = StdRng::seed_from_u64(seed);
        let c = CONFIG.d_model;
        Ok(Model {
            embed: normal(&[VOCAB, c], 0.5, &mut rng),
            blocks: [GptBlock::random(CONFIG, seed + 1)?, GptBlock::random(CONFIG, seed + 2)?],
            final_norm: (Tensor::full(&[c], 1.0), Tensor::full(&[c], 0.0)),
            unembed: normal(&[c, VOCAB], 0.1, &mut rng),
        })
    }

    /// Every parameter, in the order [`Model::with_params`] takes them back.
    fn params(&self) -> Vec<&Tensor> {
        let mut p = vec![&self.embed, &self.final_norm.0, &self.final_norm.1, &self.unembed];
        for b in &self.blocks {
            p.extend(b.params());
        }
        p
    }

    fn with_params(&self, new: &[Tensor]) -> Model {
        let per_block = self.blocks[0].params().len();
        let block = |k: usize| self.blocks[k].map_params(|_, i| new[4 + k * per_block + i].clone());
        Model {
            embed: new[0].clone(),
            blocks: [block(0), block(1)],
            final_norm: (new[1].clone(), new[2].clone()),
            unembed: new[3].clone(),
        }
    }

    /// The mean cross-entropy of predicting `targets` from `tokens` (each `BATCH x TOKENS`).
    fn loss(&self, tokens: &[usize], targets: &[usize]) -> Result<Tensor, GptError> {
        // The embedding lookup: a gather kernel, whose gradient is a scatter-add.
        let x = self.embed.try_index_select_rows(tokens)?;
        let mut h = x.try_reshape(&[BATCH, TOKENS, CONFIG.d_model])?;
        for b in &self.blocks {
            h = b.forward(&h)?;
        }
        let rows = h.try_reshape(&[BATCH * TOKENS, CONFIG.d_model])?;
        let normed = rows.try_layer_norm(Some(&self.final_norm.0), Some(&self.final_norm.1), 1e-5)?;
        Ok(normed.try_matmul(&self.unembed)?.try_cross_entropy(targets)?)
    }
}

fn main() -> Result<(), GptError> {
    // 1. The block against its f64 reference.
    let block = GptBlock::random(CONFIG, 7)?;
    let mut rng = StdRng::seed_from_u64(8);
    let x = ndarray::ArrayD::from_shape_simple_fn(vec![2, TOKENS, CONFIG.d_model], || {
        rng.random_range(-1.0f32..1.0)
    });
    let got = block.forward(&Tensor::from_array(&x))?.to_ndarray::<f32>()?;
    let want = reference_forward_f64(&block, &x)?;
    let err = got.iter().zip(want.iter()).map(|(&g, &w)| (f64::from(g) - w).abs()).fold(0.0, f64::max);
    println!("block (d_model 64, 4 heads, 32 tokens) against f64: max abs error {err:.1e}");

    // 2. Two blocks trained with SGD: each target is its token's successor.
    let mut model = Model::new(11)?;
    let lr = 0.3f32;
    let opts = RealizeOptions::default();
    for step in 0..=40 {
        let tokens: Vec<usize> = (0..BATCH * TOKENS).map(|_| rng.random_range(0..VOCAB)).collect();
        let targets: Vec<usize> = tokens.iter().map(|&t| (t + 1) % VOCAB).collect();
        let loss = model.loss(&tokens, &targets)?;
        let params = model.params();
        let grads = gradient(&loss, &params)?;
        // One realize for the loss and every updated parameter: shared work runs once.
        let updated: Vec<Tensor> = params.iter().zip(&grads).map(|(p, g)| *p - &(g * lr)).collect();
        let mut outs: Vec<&Tensor> = vec![&loss];
        outs.extend(updated.iter());
        let (values, _) = realize(&outs, &opts)?;
        if step % 5 == 0 {
            println!("step {step:>2}: loss {:.4}", values[0].to_ndarray::<f32>()?.sum());
        }
        model = model.with_params(&values[1..]);
    }
    println!("(a uniform guess over {VOCAB} tokens scores ln {VOCAB} = {:.4})", (VOCAB as f32).ln());
    Ok(())
}
