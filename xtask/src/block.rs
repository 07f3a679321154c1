//! `bench block`: the GPT-2-small block of [`uopc::gpt`] through the Tensor API, forward and
//! forward plus backward (the gradient of every parameter and of the input).

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use crate::peak::median;
use uopc::gpt::{GptBlock, GptConfig};
use uopc::tensor::{RealizeOptions, Tensor, gradient, realize};

#[derive(Serialize)]
struct Row {
    pass: &'static str,
    batch: usize,
    n: usize,
    d_model: usize,
    heads: usize,
    median_ms: f64,
    best_ms: f64,
    kernels: usize,
    tile_gemm_kernels: usize,
    compile_ms: f64,
}

fn random(shape: &[usize], rng: &mut StdRng) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec((0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect::<Vec<f32>>(), shape)
}

/// Runs `bench block` on `(batch, tokens)` inputs: each pass once to compile, then `rounds`
/// interleaved rounds of `reps` timed realizes of each.
pub fn run(batch: usize, tokens: usize, reps: usize, rounds: usize, json: Option<&Path>) -> ExitCode {
    let config = GptConfig::gpt2_small();
    let block = GptBlock::random(config, 1);
    let mut rng = StdRng::seed_from_u64(2);
    let shape = [batch, tokens, config.d_model];
    let x = random(&shape, &mut rng);
    let weights = random(&shape, &mut rng);
    let y = match block.forward(&x) {
        Ok(y) => y,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let loss = (&y * &weights).reshape(&[shape.iter().product()]).sum(0, false);
    let mut params = block.params();
    params.push(&x);
    let grads = match gradient(&loss, &params) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("error: gradient: {e}");
            return ExitCode::FAILURE;
        }
    };
    let passes: [(&'static str, Vec<&Tensor>); 2] =
        [("forward", vec![&y]), ("forward_backward", grads.iter().collect())];
    let opts = RealizeOptions::default();
    let mut rows = Vec::new();
    let mut samples = vec![Vec::new(); passes.len()];
    for (pass, outs) in &passes {
        match realize(outs, &opts) {
            Ok((_, report)) => rows.push(Row {
                pass,
                batch,
                n: tokens,
                d_model: config.d_model,
                heads: config.heads,
                median_ms: 0.0,
                best_ms: 0.0,
                kernels: report.kernels.len(),
                tile_gemm_kernels: report.kernels.iter().filter(|k| k.tile_ops).count(),
                compile_ms: (report.schedule_seconds + report.compile_seconds) * 1e3,
            }),
            Err(e) => {
                eprintln!("error: {pass}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    for _ in 0..rounds {
        for (k, (_, outs)) in passes.iter().enumerate() {
            for _ in 0..reps {
                let start = Instant::now();
                let _ = realize(outs, &opts);
                samples[k].push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    println!(
        "GPT-2-small block, batch {batch} x {tokens} tokens, d_model {}, {} heads",
        config.d_model, config.heads
    );
    println!("{:<17} {:>10} {:>10} {:>14} {:>11}", "pass", "median ms", "best ms", "kernels", "compile ms");
    for (row, s) in rows.iter_mut().zip(&samples) {
        row.median_ms = median(s);
        row.best_ms = s.iter().copied().fold(f64::INFINITY, f64::min);
        println!(
            "{:<17} {:>10.1} {:>10.1} {:>5} ({:>2} tile) {:>11.1}",
            row.pass, row.median_ms, row.best_ms, row.kernels, row.tile_gemm_kernels, row.compile_ms
        );
    }
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(&serde_json::json!({ "results": rows }))
            .expect("rows serialize to JSON");
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("error: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
