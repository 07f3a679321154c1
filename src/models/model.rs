//! [`CausalLm`]: a GPT-2 or Llama decoder loaded from a checkpoint directory, and its forward
//! pass over new tokens against a [`KvCache`].

use super::checkpoint::Checkpoint;
use super::layers::{Activations, Linear, Mlp, Norm, rotate, widened};
use super::{Architecture, KvCache, ModelConfig, ModelError};
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use uopc_ir::DType;
use uopc_tensor::{Captured, RealizeOptions, Tensor, realize};

/// One decoder block.
#[derive(Clone, Debug)]
pub(super) struct Block {
    pub(super) attn_norm: Norm,
    /// q, k and v in one product: `(d, (heads + 2 kv_heads) head_dim)`.
    pub(super) qkv: Linear,
    pub(super) out: Linear,
    pub(super) mlp_norm: Norm,
    pub(super) mlp: Mlp,
}

/// A weight of the checkpoint as the model holds it: the leaf tensor it lives in (gradients
/// are taken with respect to leaves) and, where several checkpoint tensors were stacked into
/// one product (q, k and v; gate and up), the rows of that leaf that are this one's.
#[derive(Clone, Debug)]
pub struct Parameter {
    /// The checkpoint's name (`model.layers.0.self_attn.k_proj.weight`).
    pub name: String,
    /// The leaf tensor holding it.
    pub leaf: Tensor,
    /// Its rows of `leaf` (axis 0), when it shares the leaf with others.
    pub rows: Option<std::ops::Range<usize>>,
}

impl Parameter {
    /// This parameter's part of `leaf_grad`, the gradient of its leaf.
    ///
    /// # Errors
    ///
    /// A shape error when `leaf_grad` is not the leaf's shape.
    pub fn part(&self, leaf_grad: &Tensor) -> Result<Tensor, ModelError> {
        Ok(match &self.rows {
            Some(r) => leaf_grad.try_slice(0, r.start, r.end)?,
            None => leaf_grad.clone(),
        })
    }
}

/// Which logits a forward pass computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Every new token's (a fixture's check, a training step).
    All,
    /// The last new token's only (generation: the next token's distribution).
    Last,
}

/// A decoder-only language model: token (and for GPT-2 position) embeddings, the blocks, a
/// final norm and the output projection, with weights in f32.
#[derive(Clone, Debug)]
pub struct CausalLm {
    pub(super) config: ModelConfig,
    pub(super) embed: Tensor,
    pub(super) positions: Option<Tensor>,
    pub(super) blocks: Vec<Block>,
    pub(super) final_norm: Norm,
    /// `(d, vocab)` (a view of the embedding when tied).
    pub(super) head: Tensor,
    /// Every checkpoint weight, in load order.
    pub(super) params: Vec<Parameter>,
    /// The checkpoint's `config.json`, as read (written back by [`CausalLm::save`]).
    pub(super) config_json: String,
    /// Decode steps' layer graphs, captured on first use (shared by clones, which hold the
    /// same weights; a model with new weights starts without).
    pub(super) steps: Steps,
    /// How activations meet 16-bit weights in products.
    pub(super) activations: Activations,
}

impl CausalLm {
    /// Loads `config.json` and the `.safetensors` weights of a checkpoint directory, every
    /// tensor named by the architecture's table and checked against its shape.
    ///
    /// # Errors
    ///
    /// [`ModelError::Config`] for a configuration this module does not run,
    /// [`ModelError::Checkpoint`] naming a tensor that is missing, of another shape or dtype,
    /// or present but not part of the model; [`ModelError::Io`] when a file cannot be read.
    pub fn load(dir: &Path) -> Result<CausalLm, ModelError> {
        CausalLm::load_as(dir, DType::F32)
    }

    /// [`CausalLm::load`] with the weight matrices (the projections, the embedding and the
    /// output projection) held in `weights`: F32, or BF16 or F16 to read half the bytes per
    /// token. A 16-bit weight is read in place by the products and widened in registers; the
    /// sums and the norms (whose weights stay f32) are f32 whatever `weights` is. The values
    /// are the checkpoint's, rounded to `weights` to nearest even when the file holds a wider
    /// dtype.
    ///
    /// With BF16 weights the model starts with [`Activations::Bf16`]: long products (a
    /// prompt's) round their activations to bf16 where the machine multiplies bf16 itself,
    /// and its caches hold bf16 keys and values.
    /// [`CausalLm::with_activations`]`(Activations::F32)` keeps every activation and the
    /// cache f32, so the model computes as the f32 model of its rounded weights.
    ///
    /// # Errors
    ///
    /// As [`CausalLm::load`], and [`ModelError::Config`] for a `weights` dtype other than
    /// F32, BF16 and F16.
    pub fn load_as(dir: &Path, weights: DType) -> Result<CausalLm, ModelError> {
        if !matches!(weights, DType::F32 | DType::BF16 | DType::F16) {
            return Err(ModelError::Config(format!(
                "weights cannot be held in {weights}; use F32, BF16 or F16"
            )));
        }
        let path = dir.join("config.json");
        let config_json = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        let config = ModelConfig::from_json(&config_json)?;
        let mut ckpt = Checkpoint::open(dir)?;
        let mut model = match config.architecture {
            Architecture::Gpt2 => load_gpt2(&config, &mut ckpt, weights)?,
            Architecture::Llama => load_llama(&config, &mut ckpt, weights)?,
        };
        // GPT-2 checkpoints carry the attention's causal mask buffers beside the weights.
        let unused = ckpt.unused(|n| {
            n.ends_with(".attn.bias")
                || n.ends_with(".attn.masked_bias")
                || n.ends_with("rotary_emb.inv_freq")
        });
        if let Some(extra) = unused.first() {
            return Err(ModelError::Checkpoint(format!(
                "tensor `{extra}` is not part of a {:?} model ({} unused in all)",
                config.architecture,
                unused.len()
            )));
        }
        model.config_json = config_json;
        if weights == DType::BF16 {
            model.activations = Activations::Bf16;
        }
        Ok(model)
    }

    /// This model with the activations of its products (and the dtype of the caches
    /// [`CausalLm::new_cache`] makes) as `activations` says ([`CausalLm::forward`] and what
    /// runs on it; the training graph's products stay f32).
    pub fn with_activations(mut self, activations: Activations) -> CausalLm {
        self.activations = activations;
        // The captured decode graphs were built with the old choice.
        self.steps = Steps::default();
        self
    }

    /// How the activations of its products are held: [`Activations::Bf16`] for a model
    /// loaded with bf16 weights, unless changed by [`CausalLm::with_activations`];
    /// [`Activations::F32`] otherwise.
    pub fn activations(&self) -> Activations {
        self.activations
    }

    /// Its configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// An empty cache for up to `capacity` tokens of this model: its keys and values in bf16
    /// with [`Activations::Bf16`] (as a bf16 model's are in PyTorch, and decode reads half
    /// the bytes), else in f32.
    pub fn new_cache(&self, capacity: usize) -> KvCache {
        let dtype = if self.activations == Activations::Bf16 { DType::BF16 } else { DType::F32 };
        KvCache::empty(&self.config, capacity, dtype)
    }

    /// The logits `(tokens, vocab)` (or `(1, vocab)` with [`Logits::Last`]) of `tokens` that
    /// follow the ones in `cache`, whose keys and values are appended to it. A prompt is one
    /// call; each generated token another.
    ///
    /// # Errors
    ///
    /// [`ModelError::Cache`] when the tokens do not fit the cache or the positions,
    /// [`ModelError::Input`] for an empty input or a token outside the vocabulary; the errors
    /// of the kernels.
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache, logits: Logits) -> Result<Tensor, ModelError> {
        self.forward_batch(&mut [Segment { tokens, cache }], logits)
    }

    /// [`CausalLm::forward`] for several sequences at once, each with its own new tokens and
    /// cache (of any lengths): the projections and MLPs run on every sequence's rows in one
    /// product (so a decode step reads each weight once for the whole batch), the attention of
    /// each sequence against its own cache. The logits are every new token's in segment order
    /// `(tokens in all, vocab)`, or with [`Logits::Last`] each segment's last `(segments,
    /// vocab)`.
    ///
    /// # Errors
    ///
    /// As [`CausalLm::forward`], for any segment; [`ModelError::Input`] when `segments` is
    /// empty. Nothing is counted as cached unless every segment succeeds.
    pub fn forward_batch(&self, segments: &mut [Segment<'_>], logits: Logits) -> Result<Tensor, ModelError> {
        let c = &self.config;
        if segments.is_empty() {
            return Err(ModelError::Input("no sequences given".into()));
        }
        for seg in segments.iter() {
            self.check_segment(seg)?;
        }
        let runs: Vec<(&[u32], usize)> = segments.iter().map(|s| (s.tokens, s.cache.len())).collect();
        let mut x = self.embedded(&runs)?;
        let total: usize = segments.iter().map(|s| s.tokens.len()).sum();
        let qkv_width = (c.heads + 2 * c.kv_heads) * c.head_dim;
        let mut qkv_rows = vec![0.0f32; total * qkv_width];
        // A decode step (one token per sequence) runs each layer's graph as captured the first
        // time: the same graph every step, on the new token's values.
        let step = segments.iter().all(|s| s.tokens.len() == 1);
        // The realized residual stream and attention output the previous layer left, which the
        // graph of this layer's realize starts from (after the first layer).
        let mut carried: Option<(Tensor, Tensor)> = None;
        for (layer, block) in self.blocks.iter().enumerate() {
            let done = match &carried {
                Some((x_in, attended)) if step => self.captured_layer(layer, total, x_in, attended)?,
                _ => {
                    if let Some((x_in, attended)) = &carried {
                        x = self.blocks[layer - 1].tail(x_in, attended, self.activations)?;
                    }
                    // The residual stream and the projection in one realize: both leave the
                    // graph here.
                    realize(&[&x, &block.projection(&x, self.activations)?], &RealizeOptions::default())?.0
                }
            };
            x = done[0].clone();
            done[1].realize_into(&mut qkv_rows)?;
            // Each segment's rows (the next of the flat rows) against its own cache; the
            // segments at once, since one decode row's attention is too small to fill the cores.
            let mut rows: Vec<&mut [f32]> = Vec::with_capacity(segments.len());
            let mut rest = &mut qkv_rows[..];
            for seg in segments.iter() {
                let (own, after) = rest.split_at_mut(seg.tokens.len() * qkv_width);
                rows.push(own);
                rest = after;
            }
            let outputs: Vec<Vec<f32>> = segments
                .par_iter_mut()
                .zip(rows)
                .map(|(seg, own)| {
                    let (n, first) = (seg.tokens.len(), seg.cache.len());
                    if c.architecture == Architecture::Llama {
                        // The q heads and then the k heads lead each row: one rotation covers both.
                        rotate(own, qkv_width, (c.heads + c.kv_heads, c.head_dim), first, c.rope_theta);
                    }
                    seg.cache.attend(c, layer, own, n)
                })
                .collect::<Result<_, _>>()?;
            let attended: Vec<f32> = outputs.concat();
            let attended = Tensor::from_vec(attended, &[total, c.heads * c.head_dim]);
            carried = Some((x.clone(), attended));
        }
        // Every layer ran, so there is a last one whose tail is still to add.
        let (x_in, attended) = carried.expect("a model has at least one layer");
        let x = self.blocks.last().expect("a model has at least one layer").tail(
            &x_in,
            &attended,
            self.activations,
        )?;
        let mut last = Vec::with_capacity(segments.len());
        let mut end = 0;
        for seg in segments.iter_mut() {
            seg.cache.advance(seg.tokens.len());
            end += seg.tokens.len();
            last.push(end - 1);
        }
        let x = match logits {
            Logits::All => x,
            Logits::Last if total == 1 => x,
            Logits::Last => x.try_index_select_rows(&last)?,
        };
        let normed = self.activations.held(&self.final_norm.forward(&x)?, &self.head);
        Ok(normed.try_matmul(&widened(&self.head))?)
    }
}

impl CausalLm {
    /// The realized residual stream entering layer `layer` (> 0) and its q, k and v rows, for
    /// `rows` rows whose previous layer left `x_in` and `attended`: that layer's tail and this
    /// layer's projection, as captured on the first step with this many rows.
    fn captured_layer(
        &self,
        layer: usize,
        rows: usize,
        x_in: &Tensor,
        attended: &Tensor,
    ) -> Result<Vec<Tensor>, ModelError> {
        let key = (layer, rows);
        let known = self.steps.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
        let captured = match known {
            Some(c) => c,
            None => {
                let x = self.blocks[layer - 1].tail(x_in, attended, self.activations)?;
                let qkv = self.blocks[layer].projection(&x, self.activations)?;
                let c = Arc::new(Captured::new(&[&x, &qkv], &[x_in, attended], &RealizeOptions::default())?);
                self.steps.lock().unwrap_or_else(|e| e.into_inner()).insert(key, c.clone());
                c
            }
        };
        Ok(captured.run(&[x_in, attended])?)
    }
}

impl Block {
    /// q, k and v of the residual stream `x`, side by side: the norm before attention, then
    /// the fused projection.
    fn projection(&self, x: &Tensor, activations: Activations) -> Result<Tensor, ModelError> {
        self.qkv.forward_as(&self.attn_norm.forward(x)?, activations)
    }

    /// The rest of the block after attention: `x + out(attended)`, then the MLP's residual.
    fn tail(&self, x: &Tensor, attended: &Tensor, activations: Activations) -> Result<Tensor, ModelError> {
        let x = x.try_add(&self.out.forward_as(attended, activations)?)?;
        Ok(x.try_add(&self.mlp.forward_as(&self.mlp_norm.forward(&x)?, activations)?)?)
    }
}

/// The captured graphs of decode steps: per (layer, rows), the tail of the layer before and
/// the projection of this one, planned once.
pub(super) type Steps = Arc<Mutex<HashMap<(usize, usize), Arc<Captured>>>>;

/// One sequence's part of [`CausalLm::forward_batch`]: its new tokens and its cache.
#[derive(Debug)]
pub struct Segment<'a> {
    /// The tokens that follow the ones cached.
    pub tokens: &'a [u32],
    /// The sequence's cache, to which the tokens' keys and values are appended.
    pub cache: &'a mut KvCache,
}

impl CausalLm {
    /// `Ok` when a segment's tokens are valid and fit its cache and the positions.
    fn check_segment(&self, seg: &Segment<'_>) -> Result<(), ModelError> {
        let c = &self.config;
        let (n, first) = (seg.tokens.len(), seg.cache.len());
        self.check_tokens(seg.tokens)?;
        seg.cache.check_room(n)?;
        if c.architecture == Architecture::Gpt2 && first + n > c.max_positions {
            return Err(ModelError::Cache(format!(
                "positions {first}..{} pass the model's {} learned positions",
                first + n,
                c.max_positions
            )));
        }
        Ok(())
    }

    /// `Ok` when `tokens` is not empty and every token is in the vocabulary.
    pub(super) fn check_tokens(&self, tokens: &[u32]) -> Result<(), ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::Input("no tokens given".into()));
        }
        match tokens.iter().find(|&&t| t as usize >= self.config.vocab_size) {
            Some(t) => Err(ModelError::Input(format!(
                "token {t} is outside the vocabulary of {}",
                self.config.vocab_size
            ))),
            None => Ok(()),
        }
    }

    /// The embeddings of runs of tokens, each `(tokens, first)` at positions `first ..`, their
    /// rows one after another: the token embedding by one gather of every token (one
    /// scatter-add in a gradient), plus GPT-2's learned position embedding of each run.
    pub(super) fn embedded(&self, runs: &[(&[u32], usize)]) -> Result<Tensor, ModelError> {
        let ids: Vec<i64> =
            runs.iter().flat_map(|(tokens, _)| tokens.iter().map(|&t| i64::from(t))).collect();
        let rows = ids.len();
        let x = widened(&self.embed.try_index_select(0, &Tensor::from_vec(ids, &[rows]))?);
        let Some(p) = &self.positions else { return Ok(x) };
        let mut parts = Vec::with_capacity(runs.len());
        for &(tokens, first) in runs {
            parts.push(p.try_slice(0, first, first + tokens.len())?);
        }
        let positions = match &parts[..] {
            [one] => one.clone(),
            _ => Tensor::try_cat(&parts.iter().collect::<Vec<_>>(), 0)?,
        };
        Ok(x.try_add(&positions)?)
    }
}

/// Takes the checkpoint's tensors and records each as a [`Parameter`].
struct Loader<'a> {
    ckpt: &'a mut Checkpoint,
    params: Vec<Parameter>,
    /// The dtype the weight matrices are held in (norms, biases and positions stay f32).
    weights: DType,
}

impl Loader<'_> {
    /// Tensor `name` of `shape` in f32, a leaf of its own.
    fn take(&mut self, name: &str, shape: &[usize]) -> Result<Tensor, ModelError> {
        let t = self.ckpt.take(name, shape)?;
        self.params.push(Parameter { name: name.to_string(), leaf: t.clone(), rows: None });
        Ok(t)
    }

    /// Weight matrix `name` of `shape` in the weights' dtype, a leaf of its own.
    fn take_weight(&mut self, name: &str, shape: &[usize]) -> Result<Tensor, ModelError> {
        let t = self.ckpt.take_as(name, shape, self.weights)?;
        self.params.push(Parameter { name: name.to_string(), leaf: t.clone(), rows: None });
        Ok(t)
    }

    /// The tensors `parts` (name and shape, all of one shape but the first axis) stacked along
    /// their first axis into one leaf: one product for several projections of the same input
    /// (their weights, in the weights' dtype, or their biases, in f32).
    fn stack(&mut self, parts: &[(String, Vec<usize>)], weights: bool) -> Result<Tensor, ModelError> {
        let total = parts.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
        let mut values = Vec::with_capacity(total);
        for (n, shape) in parts {
            values.extend(self.ckpt.take_values(n, shape)?);
        }
        // Every caller stacks at least one tensor.
        let mut shape = parts[0].1.clone();
        shape[0] = parts.iter().map(|(_, s)| s[0]).sum();
        let leaf = if weights && self.weights != DType::F32 {
            super::checkpoint::narrowed(&values, &shape, self.weights)?
        } else {
            Tensor::try_from_vec(values, &shape)?
        };
        let mut row = 0;
        for (n, s) in parts {
            self.params.push(Parameter { name: n.clone(), leaf: leaf.clone(), rows: Some(row..row + s[0]) });
            row += s[0];
        }
        Ok(leaf)
    }
}

fn load_llama(c: &ModelConfig, ckpt: &mut Checkpoint, weights: DType) -> Result<CausalLm, ModelError> {
    let (d, hd, f) = (c.hidden_size, c.head_dim, c.intermediate_size);
    let (q_out, kv_out) = (c.heads * hd, c.kv_heads * hd);
    let mut ld = Loader { ckpt, params: Vec::new(), weights };
    let embed = ld.take_weight("model.embed_tokens.weight", &[c.vocab_size, d])?;
    let rms = |ld: &mut Loader<'_>, name: &str| -> Result<Norm, ModelError> {
        Ok(Norm::Rms { weight: ld.take(name, &[d])?, eps: c.norm_eps })
    };
    let mut blocks = Vec::with_capacity(c.layers);
    for i in 0..c.layers {
        let p = format!("model.layers.{i}");
        let attn_norm = rms(&mut ld, &format!("{p}.input_layernorm.weight"))?;
        let proj = |n: &str, rows: usize, cols: usize| (format!("{p}.{n}.weight"), vec![rows, cols]);
        let qkv_w = ld.stack(
            &[
                proj("self_attn.q_proj", q_out, d),
                proj("self_attn.k_proj", kv_out, d),
                proj("self_attn.v_proj", kv_out, d),
            ],
            true,
        )?;
        let qkv_b = if c.qkv_bias {
            let b = |n: &str, len: usize| (format!("{p}.self_attn.{n}.bias"), vec![len]);
            Some(ld.stack(&[b("q_proj", q_out), b("k_proj", kv_out), b("v_proj", kv_out)], false)?)
        } else {
            None
        };
        let o_w = ld.take_weight(&format!("{p}.self_attn.o_proj.weight"), &[d, q_out])?;
        let o_bias =
            if c.o_bias { Some(ld.take(&format!("{p}.self_attn.o_proj.bias"), &[d])?) } else { None };
        let mlp_norm = rms(&mut ld, &format!("{p}.post_attention_layernorm.weight"))?;
        let gate_up = ld.stack(&[proj("mlp.gate_proj", f, d), proj("mlp.up_proj", f, d)], true)?;
        let down = ld.take_weight(&format!("{p}.mlp.down_proj.weight"), &[d, f])?;
        blocks.push(Block {
            attn_norm,
            qkv: Linear { weight: qkv_w.t(), bias: qkv_b },
            out: Linear { weight: o_w.t(), bias: o_bias },
            mlp_norm,
            mlp: Mlp::SwiGlu {
                gate_up: Linear { weight: gate_up.t(), bias: None },
                down: Linear { weight: down.t(), bias: None },
                width: f,
            },
        });
    }
    let final_norm = rms(&mut ld, "model.norm.weight")?;
    let head = if c.tie_word_embeddings && !ld.ckpt.contains("lm_head.weight") {
        embed.t()
    } else {
        ld.take_weight("lm_head.weight", &[c.vocab_size, d])?.t()
    };
    Ok(CausalLm {
        config: c.clone(),
        embed,
        positions: None,
        blocks,
        final_norm,
        head,
        params: ld.params,
        config_json: String::new(),
        steps: Steps::default(),
        activations: Activations::default(),
    })
}

fn load_gpt2(c: &ModelConfig, ckpt: &mut Checkpoint, weights: DType) -> Result<CausalLm, ModelError> {
    // Hub checkpoints of GPT-2 name their tensors without the `transformer.` prefix.
    let prefix = if ckpt.contains("transformer.wte.weight") { "transformer." } else { "" };
    let (d, f) = (c.hidden_size, c.intermediate_size);
    let mut ld = Loader { ckpt, params: Vec::new(), weights };
    // Weight matrices in the weights' dtype, the rest in f32.
    let mut take = |name: &str, shape: &[usize], matrix: bool| {
        let name = format!("{prefix}{name}");
        if matrix { ld.take_weight(&name, shape) } else { ld.take(&name, shape) }
    };
    let embed = take("wte.weight", &[c.vocab_size, d], true)?;
    let positions = take("wpe.weight", &[c.max_positions, d], false)?;
    let mut blocks = Vec::with_capacity(c.layers);
    for i in 0..c.layers {
        let mut norm = |n: &str| -> Result<Norm, ModelError> {
            Ok(Norm::Layer {
                weight: take(&format!("h.{i}.{n}.weight"), &[d], false)?,
                bias: take(&format!("h.{i}.{n}.bias"), &[d], false)?,
                eps: c.norm_eps,
            })
        };
        let (attn_norm, mlp_norm) = (norm("ln_1")?, norm("ln_2")?);
        // Conv1D weights are stored `(in, out)` already.
        let mut conv = |n: &str, inp: usize, out: usize| -> Result<Linear, ModelError> {
            Ok(Linear {
                weight: take(&format!("h.{i}.{n}.weight"), &[inp, out], true)?,
                bias: Some(take(&format!("h.{i}.{n}.bias"), &[out], false)?),
            })
        };
        blocks.push(Block {
            attn_norm,
            qkv: conv("attn.c_attn", d, 3 * d)?,
            out: conv("attn.c_proj", d, d)?,
            mlp_norm,
            mlp: Mlp::Gelu { fc: conv("mlp.c_fc", d, f)?, proj: conv("mlp.c_proj", f, d)? },
        });
    }
    let final_norm = Norm::Layer {
        weight: take("ln_f.weight", &[d], false)?,
        bias: take("ln_f.bias", &[d], false)?,
        eps: c.norm_eps,
    };
    // GPT-2's output projection is the token embedding; a saved copy of it is read and checked.
    if ld.ckpt.contains("lm_head.weight") {
        let _tied_copy = ld.ckpt.take("lm_head.weight", &[c.vocab_size, d])?;
    }
    let head = embed.t();
    Ok(CausalLm {
        config: c.clone(),
        head,
        embed,
        positions: Some(positions),
        blocks,
        final_norm,
        params: ld.params,
        config_json: String::new(),
        steps: Steps::default(),
        activations: Activations::default(),
    })
}
