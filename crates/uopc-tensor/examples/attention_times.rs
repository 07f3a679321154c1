//! Times unfused and fused attention: first realize (schedule + compile) and cached realizes.
//!
//! `cargo run -p uopc-tensor --example attention_times -- 1024 64`

use std::time::Instant;
use uopc_tensor::attention::attention;
use uopc_tensor::{RealizeOptions, RealizeReport, Tensor};

fn inputs(n: usize, d: usize, seed: usize) -> [Tensor; 3] {
    [0, 1, 2].map(|k| {
        let v: Vec<f32> =
            (0..n * d).map(|i| (((i + seed + k) * 2654435761) % 1000) as f32 / 500.0 - 1.0).collect();
        Tensor::from_vec(v, &[n, d])
    })
}

fn run(n: usize, d: usize, seed: usize, opts: &RealizeOptions) -> (f64, RealizeReport) {
    let [q, k, v] = inputs(n, d, seed);
    let t0 = Instant::now();
    let (_, report) = attention(&q, &k, &v).realize_with(opts).expect("realizes");
    (t0.elapsed().as_secs_f64(), report)
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (n, d) = (args.first().copied().unwrap_or(1024), args.get(1).copied().unwrap_or(64));
    for (label, opts) in [("unfused", RealizeOptions::default()), ("fused", RealizeOptions::fused())] {
        let (first, r) = run(n, d, 0, &opts);
        println!(
            "{label:8} first realize {:8.2} ms (schedule {:.2} ms, compile {:.2} ms, run {:.2} ms)",
            first * 1e3,
            r.schedule_seconds * 1e3,
            r.compile_seconds * 1e3,
            r.run_seconds() * 1e3
        );
        let mut best = (f64::INFINITY, 0.0, RealizeReport::default());
        for seed in 1..6 {
            let (t, r) = run(n, d, seed, &opts);
            if t < best.0 {
                best = (t, r.total_seconds - r.run_seconds(), r);
            }
        }
        println!(
            "{label:8} cached realize {:8.2} ms (kernels {:.2} ms, outside kernels {:.3} ms)",
            best.0 * 1e3,
            best.2.run_seconds() * 1e3,
            best.1 * 1e3
        );
        for k in &best.2.kernels {
            println!(
                "  {:<16} {:8.3} ms {:8.2} GFLOP/s",
                k.name,
                k.seconds * 1e3,
                k.flops as f64 / k.seconds / 1e9
            );
        }
    }
}
