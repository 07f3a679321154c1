//! Generates text with a Hugging Face checkpoint (GPT-2 or Llama family, safetensors):
//!
//! `cargo run --release --example generate -- --model DIR --prompt-ids 1,415,2936 --max-tokens 32`
//!
//! The prompt is given as token ids (the tokenizer is the caller's); the new token ids are
//! printed as they are produced, then the prompt and decode speeds. `--temperature`,
//! `--top-k`, `--top-p` and `--seed` sample instead of decoding greedily; `--dtype bf16` holds
//! the weight matrices in bf16.

use clap::Parser;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;
use uopc::DType;
use uopc::models::{CausalLm, GenerateOptions, Sampling};

#[derive(Parser)]
struct Args {
    /// A checkpoint directory: config.json and .safetensors files.
    #[arg(long)]
    model: PathBuf,
    /// The prompt's token ids, comma separated.
    #[arg(long, value_delimiter = ',', required = true)]
    prompt_ids: Vec<u32>,
    /// Most new tokens.
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// 0 decodes greedily.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Draw from the k most likely tokens only.
    #[arg(long)]
    top_k: Option<usize>,
    /// Draw from the smallest set of tokens whose probability reaches p.
    #[arg(long)]
    top_p: Option<f32>,
    /// Seed of the draws.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The dtype the weight matrices are held in: f32, bf16 or f16 (activations stay f32).
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16", "f16"])]
    dtype: String,
}

fn main() -> uopc::Result<()> {
    let args = Args::parse();
    let start = Instant::now();
    let weights = match args.dtype.as_str() {
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        _ => DType::F32,
    };
    let model = CausalLm::load_as(&args.model, weights)?;
    let load = start.elapsed().as_secs_f64();
    let sampling =
        Sampling { temperature: args.temperature, top_k: args.top_k, top_p: args.top_p, seed: args.seed };
    let options = GenerateOptions {
        max_new_tokens: args.max_tokens,
        sampling,
        stop_tokens: model.config().eos_token_ids.clone(),
    };
    let out = model.generate(&args.prompt_ids, &options, |token| {
        print!("{token} ");
        let _ = std::io::stdout().flush();
        true
    })?;
    println!();
    println!(
        "loaded in {load:.2} s; prompt of {} tokens and first token in {:.1} ms ({:.0} prompt tokens/s); {} tokens at {:.2} ms per token",
        args.prompt_ids.len(),
        out.first_token_seconds * 1e3,
        args.prompt_ids.len() as f64 / out.first_token_seconds,
        out.tokens.len(),
        out.decode_ms_per_token()
    );
    Ok(())
}
