//! Generates text with a Hugging Face checkpoint (GPT-2 or Llama family, safetensors):
//!
//! `cargo run --release --features tokenizers --example generate -- --model DIR --prompt "Once upon" --max-tokens 32`
//!
//! `--prompt` takes text, encoded and the new tokens decoded by the checkpoint's
//! `tokenizer.json` (the `tokenizers` feature); `--prompt-ids 1,415,2936` takes token ids
//! instead and prints the new ids. Either way the output is printed as it is produced, then
//! the prompt and decode speeds. `--temperature`,
//! `--top-k`, `--top-p` and `--seed` sample instead of decoding greedily; `--dtype bf16` holds
//! the weight matrices in bf16.

use clap::Parser;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;
use uopc::DType;
use uopc::models::{CausalLm, GenerateOptions, Generation, Sampling};

#[derive(Parser)]
struct Args {
    /// A checkpoint directory: config.json and .safetensors files.
    #[arg(long)]
    model: PathBuf,
    /// The prompt as text (needs the `tokenizers` feature and the checkpoint's tokenizer.json).
    #[arg(long, required_unless_present = "prompt_ids", conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    /// The prompt's token ids, comma separated.
    #[arg(long, value_delimiter = ',')]
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
    /// The dtype the weight matrices are held in: f32, bf16 or f16 (with bf16, a prompt's
    /// products round their activations to bf16 where the CPU multiplies bf16 itself).
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
    let (out, prompt_tokens) = match &args.prompt {
        Some(text) => from_text(&model, &args.model, text, &options)?,
        None => {
            let out = model.generate(&args.prompt_ids, &options, |token| {
                print!("{token} ");
                let _ = std::io::stdout().flush();
                true
            })?;
            (out, args.prompt_ids.len())
        }
    };
    println!();
    println!(
        "loaded in {load:.2} s; prompt of {prompt_tokens} tokens and first token in {:.1} ms ({:.0} prompt tokens/s); {} tokens at {:.2} ms per token",
        out.first_token_seconds * 1e3,
        prompt_tokens as f64 / out.first_token_seconds,
        out.tokens.len(),
        out.decode_ms_per_token()
    );
    Ok(())
}

/// Generates after the text `prompt`, printing the prompt and then each new piece of text as it
/// is produced; returns the generation and the prompt's token count.
#[cfg(feature = "tokenizers")]
fn from_text(
    model: &CausalLm,
    dir: &std::path::Path,
    prompt: &str,
    options: &GenerateOptions,
) -> uopc::Result<(Generation, usize)> {
    let tokenizer = uopc::models::Tokenizer::load(dir)?;
    let prompt_tokens = tokenizer.encode(prompt)?.len();
    print!("{prompt}");
    let (out, _) = model.generate_text(&tokenizer, prompt, options, |piece| {
        print!("{piece}");
        let _ = std::io::stdout().flush();
        true
    })?;
    Ok((out, prompt_tokens))
}

/// Text needs the tokenizer, which this build left out.
#[cfg(not(feature = "tokenizers"))]
fn from_text(
    _: &CausalLm,
    _: &std::path::Path,
    _: &str,
    _: &GenerateOptions,
) -> uopc::Result<(Generation, usize)> {
    Err(uopc::models::ModelError::Input(
        "--prompt takes text through the checkpoint's tokenizer: build with `--features tokenizers`, or give --prompt-ids"
            .into(),
    )
    .into())
}
