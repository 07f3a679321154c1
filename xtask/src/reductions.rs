//! `bench reductions`: max-subtracted sums over long rows (logsumexp, cross-entropy and its
//! gradient), fused with online sums, fused as written and unfused, against the streaming read
//! bandwidth measured in the same run.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::process::ExitCode;
use std::time::Instant;

use crate::stats::median;
use uopc::masked_attention::streaming_read_gbs;
use uopc::tensor::{Experiments, RealizeOptions, Tensor, gradient, realize};

/// The plans compared: online sums (one pass over each row for the maximum and its sums, one
/// kernel for every output reading those sums), the same with a kernel per output, the written
/// sums (the maximum's pass, then the sums'), and default options (each reduce its own kernel).
fn forms() -> [(&'static str, RealizeOptions); 4] {
    let written = RealizeOptions::fused()
        .with_experiments(Experiments { no_online_reductions: true, ..Experiments::default() });
    let apart = RealizeOptions::fused()
        .with_experiments(Experiments { separate_row_siblings: true, ..Experiments::default() });
    [
        ("fused online", RealizeOptions::fused()),
        ("online apart", apart),
        ("fused written", written),
        ("unfused", RealizeOptions::default()),
    ]
}

/// Runs the bench on `(rows, cols)` logits: each cell once to compile, then `rounds`
/// interleaved rounds of `reps` timed realizes per cell.
pub fn run(rows: usize, cols: usize, reps: usize, rounds: usize) -> ExitCode {
    let mut rng = StdRng::seed_from_u64(7);
    let x: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(-8.0f32..8.0)).collect();
    let targets: Vec<usize> = (0..rows).map(|_| rng.random_range(0..cols)).collect();
    let logits = Tensor::from_vec(x, &[rows, cols]);
    let lse = logits.logsumexp(-1, false);
    let loss = logits.cross_entropy(&targets);
    let grad = match gradient(&loss, &[&logits]) {
        Ok(mut g) => g.remove(0),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Each case with the logits-sized transfers it cannot do without: the read of the logits,
    // and for the gradient its write, which an ordinary (cached) store makes two: the read of
    // each line for ownership, then its write-back.
    let cases: [(&str, Vec<&Tensor>, usize); 3] = [
        ("logsumexp", vec![&lse], 1),
        ("cross_entropy", vec![&loss], 1),
        ("cross_entropy + grad", vec![&loss, &grad], 3),
    ];
    let forms = forms();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); cases.len() * forms.len()];
    let mut kernels = vec![0; times.len()];
    // The streaming read measured after every timed round, so that its median sees the same
    // host as the cases' medians.
    let mut streams = Vec::new();
    for round in 0..=rounds {
        for (c, (_, outs, _)) in cases.iter().enumerate() {
            for (f, (_, opts)) in forms.iter().enumerate() {
                for _ in 0..if round == 0 { 1 } else { reps } {
                    let t = Instant::now();
                    match realize(outs, opts) {
                        Ok((_, report)) => kernels[c * forms.len() + f] = report.kernels.len(),
                        Err(e) => {
                            eprintln!("error: {e}");
                            return ExitCode::FAILURE;
                        }
                    }
                    if round > 0 {
                        times[c * forms.len() + f].push(t.elapsed().as_secs_f64() * 1e3);
                    }
                }
            }
        }
        if round > 0 {
            streams.push(streaming_read_gbs(256, rayon::current_num_threads(), 5));
        }
    }
    let stream = median(&streams);
    let (lo, hi) = streams.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &s| (lo.min(s), hi.max(s)));
    let bytes = (rows * cols * 4) as f64;
    println!(
        "{rows} x {cols} f32 logits ({:.1} MB), {} threads; streaming read {stream:.1} GB/s (median of \
         {} rounds, {lo:.1}-{hi:.1})",
        bytes / 1e6,
        rayon::current_num_threads(),
        streams.len()
    );
    println!(
        "{:<22} {:<14} {:>7} {:>10} {:>7} {:>10} {:>9}",
        "case", "plan", "kernels", "median ms", "passes", "moved GB/s", "% stream"
    );
    for (c, (name, _, passes)) in cases.iter().enumerate() {
        for (f, (form, _)) in forms.iter().enumerate() {
            let k = c * forms.len() + f;
            let ms = median(&times[k]);
            let gbs = *passes as f64 * bytes / (ms * 1e-3) / 1e9;
            println!(
                "{name:<22} {form:<14} {:>7} {ms:>10.3} {passes:>7} {gbs:>10.1} {:>8.0}%",
                kernels[k],
                100.0 * gbs / stream
            );
        }
    }
    println!(
        "passes: logits-sized memory transfers the case needs at least (the read of the logits; for \
         the gradient also its write, a read for ownership and a write-back with cached stores); \
         moved GB/s counts those, times include allocating the outputs"
    );
    ExitCode::SUCCESS
}
