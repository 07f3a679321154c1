//! Language models from Hugging Face checkpoints: GPT-2 (`GPT2LMHeadModel`) and Llama
//! (`LlamaForCausalLM`, grouped-query heads; SmolLM, TinyLlama and Qwen2-style configurations
//! with its fields; `MistralForCausalLM` with its sliding window) loaded from a directory's `config.json` and `.safetensors` files, run on
//! the Tensor API, with a KV cache and the runtime-length attention kernel for generation.
//!
//! ```no_run
//! use uopc::models::{CausalLm, GenerateOptions};
//!
//! let model = CausalLm::load("path/to/checkpoint".as_ref())?;
//! let out = model.generate(&[1, 415, 2936], &GenerateOptions::greedy(32), |token| {
//!     println!("{token}");
//!     true // keep going
//! })?;
//! println!("{} tokens, {:.1} ms per token", out.tokens.len(), out.decode_ms_per_token());
//! # Ok::<(), uopc::Error>(())
//! ```

mod cache;
mod checkpoint;
mod config;
mod error;
mod generate;
mod layers;
mod model;
#[cfg(feature = "tokenizers")]
mod tokenizer;
mod train;
mod update;

pub use cache::KvCache;
pub use checkpoint::{Checkpoint, write_f32_safetensors};
pub use config::{Architecture, ModelConfig};
pub use error::ModelError;
pub use generate::{GenerateOptions, Generation, Sampling};
pub use layers::{Activations, Linear, Mlp, Norm};
pub use model::{CausalLm, Logits, Parameter, Segment};
#[cfg(feature = "tokenizers")]
pub use tokenizer::Tokenizer;
