//! `bench derived`: attention written as a Tensor expression and realized fully fused (the
//! compiler derives the online softmax and maps it onto tile ops) against the attention API's
//! hand-written FlashAttention-2 kernel, on batched multi-head and causal shapes.

use std::process::ExitCode;
use std::time::Instant;

use crate::stats::median;
use uopc::attention::sdpa::{Extras, Sdpa, SdpaConfig};
use uopc::tensor::masked::attention_masked;
use uopc::tensor::{RealizeOptions, Tensor};

/// One shape: `(batch, heads, n, d, causal)`.
type Cell = (usize, usize, usize, usize, bool);

/// The default shapes: the attention issue's batched multi-head cells, each also causal.
pub const CELLS: [Cell; 6] = [
    (4, 12, 512, 64, false),
    (4, 12, 512, 64, true),
    (1, 32, 1024, 128, false),
    (1, 32, 1024, 128, true),
    (2, 8, 1000, 80, false),
    (1, 1, 4096, 64, true),
];

/// Runs the bench: per cell, the fused Tensor form and the API kernel, compiled once, then
/// `rounds` interleaved rounds of `reps` timed runs each.
pub fn run(reps: usize, rounds: usize) -> ExitCode {
    println!(
        "{:<24} {:>12} {:>12} {:>8} {:>10} {:>8}",
        "shape (B,H,N,D)", "fused ms", "API ms", "ratio", "max diff", "kernels"
    );
    for &(b, h, n, d, causal) in &CELLS {
        let len = b * h * n * d;
        let data: Vec<Vec<f32>> = (0..3).map(|i| crate::masked::inputs(len, 11 + i, 1.0)).collect();
        let tensors: Vec<Tensor> = data.iter().map(|x| Tensor::from_vec(x.clone(), &[b, h, n, d])).collect();
        let out = attention_masked(&tensors[0], &tensors[1], &tensors[2], None, causal);
        let opts = RealizeOptions::fused();
        let config = SdpaConfig { causal, ..SdpaConfig::new(b, h, n, n, d) };
        let api = match Sdpa::compile(&config) {
            Ok(a) => a,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        };
        let (mut fused_out, mut api_out) = (vec![0.0f32; len], vec![0.0f32; len]);
        let mut fused_ms = Vec::new();
        let mut api_ms = Vec::new();
        let mut kernels = 0;
        for round in 0..=rounds {
            let times = if round == 0 { 1 } else { reps };
            for _ in 0..times {
                let t = Instant::now();
                match out.realize_into_with(&mut fused_out, &opts) {
                    Ok(report) => kernels = report.kernels.len(),
                    Err(e) => {
                        eprintln!("error: {e}");
                        return ExitCode::FAILURE;
                    }
                }
                let f = t.elapsed().as_secs_f64() * 1e3;
                let t = Instant::now();
                if let Err(e) = api.run(&data[0], &data[1], &data[2], Extras::default(), &mut api_out) {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
                let a = t.elapsed().as_secs_f64() * 1e3;
                if round > 0 {
                    fused_ms.push(f);
                    api_ms.push(a);
                }
            }
        }
        let diff = fused_out.iter().zip(&api_out).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        let (f, a) = (median(&fused_ms), median(&api_ms));
        let shape = format!("({b},{h},{n},{d}){}", if causal { " causal" } else { "" });
        println!("{shape:<24} {f:>12.3} {a:>12.3} {:>8.2} {diff:>10.1e} {kernels:>8}", f / a);
    }
    ExitCode::SUCCESS
}
