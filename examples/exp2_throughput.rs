//! Throughput of the JIT's vector exp2 in a streaming loop: `cargo run --release --example exp2_throughput -- N`.
use std::time::Instant;
use uopc::ir::*;
use uopc::jit::Program;

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|x| x.parse().ok()).unwrap_or(1 << 20);
    let rows = 1024;
    let cols = n / rows;
    let (a, out) = (buffer(0, DType::F32, n), buffer(1, DType::F32, n));
    let i = range(rows, 0, AxisType::Thread);
    let j = range(cols, 1, AxisType::Loop);
    let x = a.index(&i * cols + &j).load();
    let p = sink(&[out.index(&i * cols + &j).store((x * std::f32::consts::LOG2_E).exp2()).end(&[j, i])]);
    let prg = Program::compile(&p, "exp2").unwrap();
    let input: Vec<f32> = (0..n).map(|k| -((k % 1000) as f32) / 100.0).collect();
    let mut o = vec![0.0f32; n];
    let mut best = f64::MAX;
    for _ in 0..20 {
        let t = Instant::now();
        prg.run_f32(&[&input], &mut [&mut o]).unwrap();
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!("{n} exp2: best {:.3} ms, {:.3} ns/element over all threads", best * 1e3, best * 1e9 / n as f64);
}
