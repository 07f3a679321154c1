//! Times compiling and running the online attention kernel: `cargo run --release --example online_timing -- N D`.
use std::time::Instant;
use uopc::attention::online_attention_ir;
use uopc::jit::Program;

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (n, d) = (args.first().copied().unwrap_or(1024), args.get(1).copied().unwrap_or(64));
    let qb: usize = std::env::var("QB").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let prog =
        if qb > 1 { uopc::attention::online_attention_qb_ir(n, d, qb) } else { online_attention_ir(n, d) };
    let mut best_compile = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        let p = Program::compile(&prog, "online").unwrap();
        best_compile = best_compile.min(t.elapsed().as_secs_f64());
        drop(p);
    }
    let p = Program::compile(&prog, "online").unwrap();
    let q: Vec<f32> = (0..n * d).map(|x| ((x * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
    let mut out = vec![0.0f32; n * d];
    p.run_f32(&[&q, &q, &q], &mut [&mut out]).unwrap();
    let mut times = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        p.run_f32(&[&q, &q, &q], &mut [&mut out]).unwrap();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let flops = 4.0 * (n * n * d) as f64;
    println!(
        "online n={n} d={d}: compile {:.2} ms, run best {:.2} ms median {:.2} ms, {:.1} GFLOP/s",
        best_compile * 1e3,
        times[0] * 1e3,
        times[times.len() / 2] * 1e3,
        flops / times[0] / 1e9
    );
    if std::env::var("SHOW_CLIF").is_ok() {
        println!("{}", p.clif());
    }
}
