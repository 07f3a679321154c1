//! `cargo xtask bench train`: training steps of checkpoints with `uopc::models` (the batch's
//! loss, its gradients and an AdamW step), cold and warm, in tokens per second.

use crate::stats::median;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;
use uopc::models::{CausalLm, ModelError};
use uopc::optim::AdamW;

/// What `bench train` runs on each model.
pub struct Steps {
    /// Sequences per step.
    pub batch: usize,
    /// Tokens per sequence.
    pub tokens: usize,
    /// Steps per model; the first is cold (the process's first, compiles included).
    pub steps: usize,
}

/// Runs `steps.steps` AdamW steps (learning rate 1e-4) on each model over seeded token ids;
/// prints a line per model and writes `json` when given.
pub fn run(models: Vec<PathBuf>, steps: &Steps, json: Option<&Path>) -> ExitCode {
    let &Steps { batch, tokens, steps: count } = steps;
    let models = match crate::generate::models(models) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: cannot write the random checkpoints: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "{:<24} {:>6} {:>7} {:>14} {:>14} {:>10} {:>12}",
        "model", "batch", "tokens", "first step ms", "step ms", "tokens/s", "loss"
    );
    let mut rows = Vec::new();
    for dir in &models {
        let go = || -> Result<(Vec<f64>, Vec<f32>), ModelError> {
            let mut model = CausalLm::load(dir)?;
            let seqs = crate::generate::random_sequences(model.config().vocab_size, batch, tokens, 7);
            let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
            let mut opt = AdamW::new(1e-4);
            let (mut times, mut losses) = (Vec::new(), Vec::new());
            for _ in 0..count {
                let start = Instant::now();
                let (next, loss) = model.train_step(&refs, &mut opt)?;
                times.push(start.elapsed().as_secs_f64() * 1e3);
                losses.push(loss);
                model = next;
            }
            Ok((times, losses))
        };
        let (times, losses) = match go() {
            Ok(r) => r,
            Err(e) => {
                eprintln!("error: {}: {e}", dir.display());
                return ExitCode::FAILURE;
            }
        };
        let warm = median(if times.len() > 1 { &times[1..] } else { &times });
        let rate = (batch * tokens) as f64 / (warm / 1e3);
        let name = dir.file_name().map_or(String::new(), |n| n.to_string_lossy().to_string());
        println!(
            "{name:<24} {batch:>6} {tokens:>7} {:>14.1} {warm:>14.1} {rate:>10.1} {:>5.3}->{:<5.3}",
            times[0],
            losses[0],
            losses[losses.len() - 1]
        );
        rows.push(serde_json::json!({
            "model": name, "batch": batch, "tokens": tokens, "optimizer": "AdamW",
            "first_step_ms": times[0], "step_ms": warm, "step_ms_runs": times,
            "tokens_per_s": rate, "losses": losses,
        }));
    }
    crate::write_results(json, &rows)
}
