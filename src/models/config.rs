//! A checkpoint's `config.json`: the fields each architecture reads, with the Hugging Face
//! names and defaults, and the one shape every model here is built from ([`ModelConfig`]).

use super::ModelError;
use serde::Deserialize;
use std::path::Path;

/// The architectures this module runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// `GPT2LMHeadModel`: learned positions, LayerNorm, GELU (tanh) MLP, fused QKV stored
    /// `(in, out)`, tied embeddings.
    Gpt2,
    /// `LlamaForCausalLM` (and configurations with its fields: SmolLM, TinyLlama, Qwen2-style
    /// biases on the projections; `MistralForCausalLM`, with [`ModelConfig::sliding_window`]):
    /// rotary positions, RMSNorm, SwiGLU MLP, grouped-query heads.
    Llama,
}

/// The sizes and choices of a decoder-only model, read from `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Which family the tensor names and layers follow.
    pub architecture: Architecture,
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP's hidden layer.
    pub intermediate_size: usize,
    /// Decoder blocks.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `heads`).
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Longest sequence the positions cover (GPT-2's learned table; a bound for Llama).
    pub max_positions: usize,
    /// The norms' epsilon.
    pub norm_eps: f32,
    /// Rotary base (Llama).
    pub rope_theta: f32,
    /// Whether the output projection is the token embedding.
    pub tie_word_embeddings: bool,
    /// Whether q, k, v (and o, with `o_bias`) projections have biases (Llama family).
    pub qkv_bias: bool,
    /// Whether the attention's output projection has a bias.
    pub o_bias: bool,
    /// Tokens that end a generation, when the config names them.
    pub eos_token_ids: Vec<u32>,
    /// Keys each query sees at most, itself included (Mistral's `sliding_window`): query `p`
    /// attends to keys `p - w + 1 ..= p`. `None`: every earlier key.
    pub sliding_window: Option<usize>,
}

#[derive(Deserialize)]
struct Raw {
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    model_type: Option<String>,
    vocab_size: Option<usize>,
    // GPT-2 names
    n_embd: Option<usize>,
    n_layer: Option<usize>,
    n_head: Option<usize>,
    n_inner: Option<usize>,
    n_positions: Option<usize>,
    layer_norm_epsilon: Option<f32>,
    activation_function: Option<String>,
    // Llama names
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    max_position_embeddings: Option<usize>,
    rms_norm_eps: Option<f32>,
    rope_theta: Option<f32>,
    rope_scaling: Option<serde_json::Value>,
    /// Newer configs: `{"rope_theta": .., "rope_type": "default"}`.
    rope_parameters: Option<serde_json::Value>,
    scale_attn_by_inverse_layer_idx: Option<bool>,
    hidden_act: Option<String>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    eos_token_id: Option<serde_json::Value>,
    /// Mistral: an integer, or null for none.
    sliding_window: Option<serde_json::Value>,
}

impl ModelConfig {
    /// Reads `config.json` from a checkpoint directory.
    ///
    /// # Errors
    ///
    /// [`ModelError::Io`] when the file cannot be read, [`ModelError::Config`] naming the
    /// field that is missing, malformed or not supported (an unknown architecture, rotary
    /// scaling, a bias on the MLP).
    pub fn from_dir(dir: &Path) -> Result<ModelConfig, ModelError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        ModelConfig::from_json(&text)
    }

    /// Parses the text of a `config.json`.
    ///
    /// # Errors
    ///
    /// As [`ModelConfig::from_dir`].
    pub fn from_json(text: &str) -> Result<ModelConfig, ModelError> {
        let raw: Raw =
            serde_json::from_str(text).map_err(|e| ModelError::Config(format!("config.json: {e}")))?;
        let arch = raw.architectures.first().map(String::as_str).or(raw.model_type.as_deref());
        let architecture = match arch {
            Some("GPT2LMHeadModel" | "gpt2") => Architecture::Gpt2,
            Some("LlamaForCausalLM" | "llama" | "MistralForCausalLM" | "mistral") => Architecture::Llama,
            Some(other) => {
                return Err(ModelError::Config(format!(
                    "architecture `{other}` is not supported (GPT2LMHeadModel, LlamaForCausalLM or MistralForCausalLM)"
                )));
            }
            None => return Err(ModelError::Config("config.json names no architecture or model_type".into())),
        };
        let need = |v: Option<usize>, name: &str| {
            v.filter(|&n| n > 0)
                .ok_or_else(|| ModelError::Config(format!("config.json: `{name}` is missing or 0")))
        };
        let eos_token_ids = match &raw.eos_token_id {
            Some(serde_json::Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
            Some(serde_json::Value::Array(a)) => {
                a.iter().filter_map(|n| n.as_u64()).map(|n| n as u32).collect()
            }
            _ => Vec::new(),
        };
        let config = match architecture {
            Architecture::Gpt2 => {
                if let Some(act) = raw
                    .activation_function
                    .as_deref()
                    .filter(|a| !matches!(*a, "gelu_new" | "gelu_pytorch_tanh"))
                {
                    return Err(ModelError::Config(format!(
                        "config.json: activation_function `{act}` is not supported (gelu_new)"
                    )));
                }
                if raw.scale_attn_by_inverse_layer_idx == Some(true) {
                    return Err(ModelError::Config(
                        "config.json: `scale_attn_by_inverse_layer_idx` true is not supported".into(),
                    ));
                }
                let hidden = need(raw.n_embd, "n_embd")?;
                let heads = need(raw.n_head, "n_head")?;
                ModelConfig {
                    architecture,
                    vocab_size: need(raw.vocab_size, "vocab_size")?,
                    hidden_size: hidden,
                    intermediate_size: raw.n_inner.unwrap_or(4 * hidden),
                    layers: need(raw.n_layer, "n_layer")?,
                    heads,
                    kv_heads: heads,
                    head_dim: hidden / heads,
                    max_positions: need(raw.n_positions, "n_positions")?,
                    norm_eps: raw.layer_norm_epsilon.unwrap_or(1e-5),
                    rope_theta: 0.0,
                    tie_word_embeddings: true,
                    qkv_bias: true,
                    o_bias: true,
                    eos_token_ids,
                    sliding_window: None,
                }
            }
            Architecture::Llama => {
                if raw.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
                    return Err(ModelError::Config("config.json: `rope_scaling` is not supported".into()));
                }
                let mut rope_theta = raw.rope_theta.unwrap_or(10000.0);
                if let Some(p) = raw.rope_parameters.as_ref().filter(|v| !v.is_null()) {
                    match p.get("rope_type").and_then(|t| t.as_str()) {
                        None | Some("default") => {}
                        Some(other) => {
                            return Err(ModelError::Config(format!(
                                "config.json: rope_parameters.rope_type `{other}` is not supported (default)"
                            )));
                        }
                    }
                    if let Some(theta) = p.get("rope_theta").and_then(|t| t.as_f64()) {
                        rope_theta = theta as f32;
                    }
                }
                if raw.mlp_bias == Some(true) {
                    return Err(ModelError::Config("config.json: `mlp_bias` true is not supported".into()));
                }
                if let Some(act) = raw.hidden_act.as_deref().filter(|a| *a != "silu") {
                    return Err(ModelError::Config(format!(
                        "config.json: hidden_act `{act}` is not supported (silu)"
                    )));
                }
                let hidden = need(raw.hidden_size, "hidden_size")?;
                let heads = need(raw.num_attention_heads, "num_attention_heads")?;
                let bias = raw.attention_bias.unwrap_or(false);
                let sliding_window = sliding_window(raw.sliding_window.as_ref())?;
                ModelConfig {
                    architecture,
                    vocab_size: need(raw.vocab_size, "vocab_size")?,
                    hidden_size: hidden,
                    intermediate_size: need(raw.intermediate_size, "intermediate_size")?,
                    layers: need(raw.num_hidden_layers, "num_hidden_layers")?,
                    heads,
                    kv_heads: raw.num_key_value_heads.unwrap_or(heads),
                    head_dim: raw.head_dim.unwrap_or(hidden / heads),
                    max_positions: raw.max_position_embeddings.unwrap_or(2048),
                    norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
                    rope_theta,
                    tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
                    qkv_bias: bias,
                    o_bias: bias,
                    eos_token_ids,
                    sliding_window,
                }
            }
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the sizes fit together: heads a multiple of key/value heads, an even head width
    /// for the rotary halves, every size positive.
    ///
    /// # Errors
    ///
    /// [`ModelError::Config`] naming the sizes at fault.
    pub fn validate(&self) -> Result<(), ModelError> {
        let c = self;
        if c.kv_heads == 0 || !c.heads.is_multiple_of(c.kv_heads) {
            return Err(ModelError::Config(format!(
                "{} query heads are not a multiple of {} key/value heads",
                c.heads, c.kv_heads
            )));
        }
        if c.head_dim == 0 || (c.architecture == Architecture::Llama && !c.head_dim.is_multiple_of(2)) {
            return Err(ModelError::Config(format!(
                "head_dim {} must be positive (and even for rotary positions)",
                c.head_dim
            )));
        }
        if c.architecture == Architecture::Gpt2 && c.heads * c.head_dim != c.hidden_size {
            return Err(ModelError::Config(format!(
                "n_embd {} is not a multiple of n_head {}",
                c.hidden_size, c.heads
            )));
        }
        Ok(())
    }
}

/// `config.json`'s `sliding_window`: a positive integer, or null (or absent) for none.
fn sliding_window(value: Option<&serde_json::Value>) -> Result<Option<usize>, ModelError> {
    match value.filter(|w| !w.is_null()) {
        None => Ok(None),
        Some(w) => match w.as_u64() {
            Some(w) if w > 0 => Ok(Some(w as usize)),
            _ => Err(ModelError::Config(format!(
                "config.json: sliding_window `{w}` is not a positive integer or null"
            ))),
        },
    }
}
