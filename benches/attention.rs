//! Compile time and run time of the three attention forms at N = 1024, D = 64, measured
//! separately: `cargo bench --bench attention`.
//!
//! - compile: scheduling and compiling a new plan for the Tensor forms (the plan cache is
//!   bypassed with a fresh optimizer key per iteration), `Program::compile` for the online IR;
//! - run: `realize` of an already planned graph for the Tensor forms (cache hit, reused
//!   temporaries), one `run_f32` for the online program.

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use uopc::attention::{attention, online_attention_ir};
use uopc::ir::UOp;
use uopc::jit::Program;
use uopc::tensor::{Optimizer, OptimizerKey, Opts, SharedOptimizer};
use uopc::{RealizeOptions, Tensor, make_plan, realize};

const N: usize = 1024;
const D: usize = 64;

fn inputs() -> [Vec<f32>; 3] {
    let mut rng = StdRng::seed_from_u64(0x5eed ^ ((N as u64) << 32) ^ D as u64);
    [2.0, 2.0, 1.0].map(|s: f32| (0..N * D).map(|_| rng.random_range(-s..s)).collect())
}

/// Chooses exactly what `inner` chooses under a key no other plan has, so `make_plan` must
/// schedule and compile from scratch instead of answering from the plan cache.
#[derive(Debug)]
struct Fresh {
    inner: SharedOptimizer,
    id: u64,
}

impl Optimizer for Fresh {
    fn opts(&self, body: &UOp) -> Opts {
        self.inner.opts(body)
    }
    fn layout(&self) -> uopc::tensor::Layout {
        self.inner.layout()
    }
    fn cache_key(&self) -> OptimizerKey {
        OptimizerKey::Custom { kind: "uncached", params: vec![self.id] }
    }
}

fn uncached(base: &RealizeOptions) -> RealizeOptions {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut o = base.clone();
    o.opt = SharedOptimizer::new(Fresh { inner: base.opt.clone(), id: NEXT.fetch_add(1, Ordering::Relaxed) });
    o
}

fn forms() -> [(&'static str, RealizeOptions); 2] {
    [("unfused", RealizeOptions::default()), ("fused", RealizeOptions::fused())]
}

fn compile(c: &mut Criterion) {
    let [q, k, v] = inputs().map(|x| Tensor::from_vec(x, &[N, D]));
    let root = attention(&q, &k, &v).uop().clone();
    let mut g = c.benchmark_group(format!("compile N={N} D={D}"));
    for (name, opts) in forms() {
        g.bench_function(name, |b| {
            b.iter(|| make_plan(std::slice::from_ref(&root), &uncached(&opts)).expect("attention plans"))
        });
    }
    let ir = online_attention_ir(N, D);
    g.bench_function("online", |b| b.iter(|| Program::compile(&ir, "online").expect("online compiles")));
    g.finish();
}

fn run(c: &mut Criterion) {
    let x = inputs();
    let [q, k, v] = x.clone().map(|x| Tensor::from_vec(x, &[N, D]));
    let graph = attention(&q, &k, &v);
    let mut g = c.benchmark_group(format!("run N={N} D={D}"));
    // one call per iteration at these sizes: calls are long enough to time one by one
    g.sampling_mode(SamplingMode::Flat).measurement_time(Duration::from_secs(5));
    for (name, opts) in forms() {
        realize(&[&graph], &opts).expect("attention realizes"); // plan and temporaries, once
        g.bench_function(name, |b| b.iter(|| realize(&[&graph], &opts).expect("attention realizes")));
    }
    let prg = Program::compile(&online_attention_ir(N, D), "online").expect("online compiles");
    let mut out = vec![0.0f32; N * D];
    g.bench_function("online", |b| {
        b.iter(|| prg.run_f32(&[&x[0], &x[1], &x[2]], &mut [&mut out]).expect("online runs"));
        black_box(&out);
    });
    g.finish();
}

fn config() -> Criterion {
    // few, short samples: the fused run takes ~0.2 s per call on two cores
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = compile, run
}
criterion_main!(benches);
