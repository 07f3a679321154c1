//! Throughput of the bf16 tile GEMM on each available path, 1 thread and 2 tasks, against the
//! peak of the path's own instruction measured in the same run.
//!
//! Run: `cargo run --release -p uopc-tile --example bf16_bench [-- M N K [AT BT]]`, where `AT`
//! and `BT` are `t` (stored transposed) or `n`.
//!
//! Figures are medians of 11 timed calls, in rounds that alternate between the paths and
//! thread counts so a burst of other work spoils some samples of each rather than all of one.

use std::time::Instant;

use half::bf16;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use uopc_tile::{Bf16Path, GemmShape, gemm_bf16_parallel, peak};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dims: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let (m, n, k) = match dims[..] {
        [m, n, k] => (m, n, k),
        _ => (1024, 1024, 1024),
    };
    let trans = |i: usize| args.get(i).is_some_and(|a| a == "t");
    let s = GemmShape::dense(m, n, k, trans(3), trans(4), false);
    let mut rng = StdRng::seed_from_u64(1);
    let mut v =
        |len| -> Vec<bf16> { (0..len).map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0))).collect() };
    let (a, b) = (v(m * k), v(k * n));
    let mut c = vec![0.0f32; m * n];
    let paths: Vec<Bf16Path> =
        [Bf16Path::Amx, Bf16Path::Avx512Bf16].into_iter().filter(|p| p.available()).collect();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("two threads");
    let mut samples = vec![Vec::new(); paths.len() * 2];
    for _round in 0..11 {
        for (pi, &path) in paths.iter().enumerate() {
            for (ti, tasks) in [1, 2].into_iter().enumerate() {
                pool.install(|| {
                    gemm_bf16_parallel(path, &s, &a, &b, &mut c, tasks).expect("valid");
                    let t = Instant::now();
                    gemm_bf16_parallel(path, &s, &a, &b, &mut c, tasks).expect("valid");
                    samples[pi * 2 + ti].push(t.elapsed().as_secs_f64());
                });
            }
        }
    }
    for (pi, &path) in paths.iter().enumerate() {
        for (ti, threads) in [1usize, 2].into_iter().enumerate() {
            let x = &mut samples[pi * 2 + ti];
            x.sort_by(f64::total_cmp);
            let g = |t: f64| s.flops() / t / 1e9;
            let peak = match path {
                Bf16Path::Amx => peak::amx_bf16_peak_gflops(200_000, 3, threads),
                _ => peak::avx512_bf16_peak_gflops(2_000_000, 3, threads),
            };
            let pct =
                peak.map_or("n/a".into(), |p| format!("{:.1}% of {p:.1}", 100.0 * g(x[x.len() / 2]) / p));
            println!(
                "{path:>10} {m}x{n}x{k} a_trans={} b_trans={} {threads} thread(s): median {:.1} GFLOP/s (spread {:.1}..{:.1}), {pct}",
                s.a_trans,
                s.b_trans,
                g(x[x.len() / 2]),
                g(x[x.len() - 1]),
                g(x[0])
            );
        }
    }
}
