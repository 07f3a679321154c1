//! Fine-tunes a small Llama checkpoint on a synthetic task (each token followed by the next
//! one, mod 32) with AdamW, printing the loss as it falls, and saves the result:
//!
//! `cargo run --release --example train -- --model tests/fixtures/models/llama_tiny_gqa --steps 30 --out /tmp/tuned`

use clap::Parser;
use std::path::PathBuf;
use uopc::models::CausalLm;
use uopc::optim::AdamW;

#[derive(Parser)]
struct Args {
    /// A checkpoint directory (config.json and .safetensors).
    #[arg(long)]
    model: PathBuf,
    /// Optimizer steps.
    #[arg(long, default_value_t = 30)]
    steps: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 3e-3)]
    lr: f32,
    /// Where to save the tuned checkpoint.
    #[arg(long)]
    out: Option<PathBuf>,
}

fn main() -> uopc::Result<()> {
    let args = Args::parse();
    let mut model = CausalLm::load(&args.model)?;
    let vocab = model.config().vocab_size.min(32) as u32;
    let batch: Vec<Vec<u32>> = (0..4u32).map(|s| (0..16).map(|i| (s * 7 + i) % vocab).collect()).collect();
    let mut opt = AdamW::new(args.lr);
    for step in 0..args.steps {
        let start = std::time::Instant::now();
        let sequences: Vec<&[u32]> = batch.iter().map(Vec::as_slice).collect();
        let (next, value) = model.train_step(&sequences, &mut opt)?;
        model = next;
        println!("step {step:>3}  loss {value:.4}  ({:.0} ms)", start.elapsed().as_secs_f64() * 1e3);
    }
    if let Some(out) = &args.out {
        model.save(out)?;
        println!("saved to {}", out.display());
    }
    Ok(())
}
