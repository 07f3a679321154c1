//! `bench block`: the GPT-2-small block of [`uopc::gpt`] through the Tensor API, forward and
//! forward plus backward (the gradient of every parameter and of the input).

use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::Serialize;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use crate::peak::process_cpu_seconds;
use crate::stats::median;
use uopc::gpt::{GptBlock, GptConfig};
use uopc::tensor::{Experiments, RealizeOptions, Tensor, gradient, realize};

/// One tile-GEMM kernel the compiler cut (not an attention node) of a pass: its median time
/// over the timed realizes and its share of the widest FMA peak measured in the same run.
#[derive(Serialize)]
struct GemmKernel {
    name: String,
    median_ms: f64,
    gflops: f64,
    percent_of_widest_peak: f64,
}

#[derive(Serialize)]
struct Row {
    pass: String,
    batch: usize,
    n: usize,
    d_model: usize,
    heads: usize,
    median_ms: f64,
    best_ms: f64,
    /// Median CPU milliseconds of the process (all threads) per realize.
    cpu_median_ms: f64,
    kernels: usize,
    tile_gemm_kernels: usize,
    compile_ms: f64,
    gemm_kernels: Vec<GemmKernel>,
}

fn random(shape: &[usize], rng: &mut StdRng) -> Tensor {
    Tensor::from_vec(crate::matmul::random(shape.iter().product(), rng), shape)
}

/// Wall and CPU milliseconds of each timed realize of each pass, and per pass the seconds
/// of each tile-GEMM kernel (by position in the plan) with its name and static FLOPs.
pub(crate) struct Timings {
    pub(crate) samples: Vec<Vec<f64>>,
    cpu_samples: Vec<Vec<f64>>,
    gemm_samples: Vec<Vec<(String, u64, Vec<f64>)>>,
}

/// `rounds` interleaved rounds of `reps` timed realizes of each pass.
pub(crate) fn time_passes(
    passes: &[(String, Vec<&Tensor>, &RealizeOptions)],
    rounds: usize,
    reps: usize,
) -> Timings {
    let mut samples = vec![Vec::new(); passes.len()];
    let mut cpu_samples = vec![Vec::new(); passes.len()];
    let mut gemm_samples: Vec<Vec<(String, u64, Vec<f64>)>> = vec![Vec::new(); passes.len()];
    for _ in 0..rounds {
        for (k, (_, outs, opts)) in passes.iter().enumerate() {
            for _ in 0..reps {
                let (start, cpu_start) = (Instant::now(), process_cpu_seconds());
                let report = realize(outs, opts).map(|(_, r)| r);
                samples[k].push(start.elapsed().as_secs_f64() * 1e3);
                if let (Some(a), Some(b)) = (cpu_start, process_cpu_seconds()) {
                    cpu_samples[k].push((b - a) * 1e3);
                }
                let Ok(report) = report else { continue };
                // The compiler's GEMM kernels (reduces, `r_...`); the attention nodes' static
                // FLOPs count the causal blocks they skip, so they are timed by `bench sdpa`.
                let gemms = report.kernels.iter().filter(|t| t.tile_ops && t.name.starts_with("r_"));
                for (j, t) in gemms.enumerate() {
                    if gemm_samples[k].len() <= j {
                        gemm_samples[k].push((t.name.clone(), t.flops, Vec::new()));
                    }
                    gemm_samples[k][j].2.push(t.seconds);
                }
            }
        }
    }
    Timings { samples, cpu_samples, gemm_samples }
}

/// Runs `bench block` on `(batch, tokens)` inputs: each pass once to compile, then `rounds`
/// interleaved rounds of `reps` timed realizes of each; with `compare_unfused_epilogues`, each
/// pass also with its GEMM epilogues unfused, in the same rounds.
pub fn run(
    batch: usize,
    tokens: usize,
    reps: usize,
    rounds: usize,
    compare_unfused_epilogues: bool,
    json: Option<&Path>,
) -> ExitCode {
    let config = GptConfig::gpt2_small();
    let mut rng = StdRng::seed_from_u64(2);
    let shape = [batch, tokens, config.d_model];
    let x = random(&shape, &mut rng);
    let weights = random(&shape, &mut rng);
    let (block, y) = match GptBlock::random(config, 1).and_then(|b| b.forward(&x).map(|y| (b, y))) {
        Ok(built) => built,
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
    let fused = RealizeOptions::default();
    let unfused = RealizeOptions::default()
        .with_experiments(Experiments { unfused_gemm_epilogues: true, ..Experiments::default() });
    let mut variants = vec![("", &fused)];
    if compare_unfused_epilogues {
        variants.push(("_unfused_epilogues", &unfused));
    }
    let mut passes: Vec<(String, Vec<&Tensor>, &RealizeOptions)> = Vec::new();
    for (suffix, opts) in variants {
        passes.push((format!("forward{suffix}"), vec![&y], opts));
        passes.push((format!("forward_backward{suffix}"), grads.iter().collect(), opts));
    }
    let mut rows = Vec::new();
    for (pass, outs, opts) in &passes {
        match realize(outs, opts) {
            Ok((_, report)) => rows.push(Row {
                pass: pass.clone(),
                batch,
                n: tokens,
                d_model: config.d_model,
                heads: config.heads,
                median_ms: 0.0,
                best_ms: 0.0,
                cpu_median_ms: 0.0,
                kernels: report.kernels.len(),
                tile_gemm_kernels: report.kernels.iter().filter(|k| k.tile_ops).count(),
                compile_ms: (report.schedule_seconds + report.compile_seconds) * 1e3,
                gemm_kernels: Vec::new(),
            }),
            Err(e) => {
                eprintln!("error: {pass}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let Timings { samples, cpu_samples, gemm_samples } = time_passes(&passes, rounds, reps);
    let peak = crate::attention::measure_widest_peak();
    println!(
        "GPT-2-small block, batch {batch} x {tokens} tokens, d_model {}, {} heads",
        config.d_model, config.heads
    );
    println!(
        "{:<34} {:>10} {:>10} {:>10} {:>14} {:>11}",
        "pass", "median ms", "best ms", "cpu ms", "kernels", "compile ms"
    );
    for (((row, s), cpu), gemms) in rows.iter_mut().zip(&samples).zip(&cpu_samples).zip(&gemm_samples) {
        row.median_ms = median(s);
        row.best_ms = s.iter().copied().fold(f64::INFINITY, f64::min);
        row.cpu_median_ms = if cpu.is_empty() { f64::NAN } else { median(cpu) };
        println!(
            "{:<34} {:>10.1} {:>10.1} {:>10.1} {:>5} ({:>2} tile) {:>11.1}",
            row.pass,
            row.median_ms,
            row.best_ms,
            row.cpu_median_ms,
            row.kernels,
            row.tile_gemm_kernels,
            row.compile_ms
        );
        row.gemm_kernels = gemms
            .iter()
            .map(|(name, flops, secs)| {
                let seconds = median(secs);
                let gflops = *flops as f64 / seconds / 1e9;
                GemmKernel {
                    name: name.clone(),
                    median_ms: seconds * 1e3,
                    gflops,
                    percent_of_widest_peak: peak.map_or(f64::NAN, |(_, p)| 100.0 * gflops / p),
                }
            })
            .collect();
    }
    if let Some((name, p)) = peak {
        println!("\nGEMM kernels (median of the timed realizes; widest FMA peak, {name}: {p:.1} GFLOP/s)");
    }
    for row in &rows {
        for g in &row.gemm_kernels {
            println!(
                "  {:<34} {:<26} {:>9.2} ms {:>8.1} GFLOP/s {:>6.1}%",
                row.pass, g.name, g.median_ms, g.gflops, g.percent_of_widest_peak
            );
        }
    }
    crate::write_results(json, &rows)
}
