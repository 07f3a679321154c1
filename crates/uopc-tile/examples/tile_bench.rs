//! Single-thread throughput of the tile kernels against the measured FMA peak.
//!
//! Run: `cargo run --release -p uopc-tile --example tile_bench`.
//!
//! Every figure is a minimum over many short timed batches, taken in several rounds that cycle
//! through all measurements, so a burst of other work on the machine spoils only some samples
//! of each figure rather than all samples of one.

use std::hint::black_box;
use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng, rngs::StdRng};
use uopc_tile::{GemmShape, Isa, SoftmaxShape, gemm, softmax_update};

/// Rounds over all measurements.
const ROUNDS: usize = 6;
/// Timed batches per measurement and round.
const BATCHES: usize = 8;

/// Seconds per call of `f`: the best of [`BATCHES`] batches of at least 2 ms each.
fn best_secs(f: &mut dyn FnMut()) -> f64 {
    f();
    let mut iters = 1u32;
    loop {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        if t.elapsed() >= Duration::from_millis(2) {
            break;
        }
        iters *= 2;
    }
    (0..BATCHES)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_secs_f64() / f64::from(iters)
        })
        .fold(f64::INFINITY, f64::min)
}

/// What a measurement reports.
enum Unit {
    /// FMA peak: GFLOP/s for this many flops per call.
    Peak(f64),
    /// A GEMM: GFLOP/s and percent of the peak of this ISA.
    Gemm(f64, Isa),
    /// Softmax: nanoseconds per score, for this many scores per call.
    Softmax(f64),
}

struct Bench {
    label: String,
    unit: Unit,
    run: Box<dyn FnMut()>,
}

fn random(rng: &mut StdRng, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn peak_benches() -> Vec<Bench> {
    const ITERS: u64 = 20_000;
    let mut v = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        if Isa::Avx512.available() {
            v.push(Bench {
                label: "512-bit FMA peak".into(),
                unit: Unit::Peak(ITERS as f64 * 16.0 * 16.0 * 2.0),
                run: Box::new(|| {
                    black_box(uopc_tile::peak::fma_chains(Isa::Avx512, black_box(ITERS)));
                }),
            });
        }
        if Isa::Avx2Fma.available() {
            v.push(Bench {
                label: "256-bit FMA peak".into(),
                unit: Unit::Peak(ITERS as f64 * 12.0 * 8.0 * 2.0),
                run: Box::new(|| {
                    black_box(uopc_tile::peak::fma_chains(Isa::Avx2Fma, black_box(ITERS)));
                }),
            });
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ITERS;
    v
}

fn main() {
    let mut rng = StdRng::seed_from_u64(7);
    let shapes = [
        ("1024x1024x64 b_trans (S = Q K^T)", GemmShape::dense(1024, 1024, 64, false, true, false)),
        ("1024x64x1024 (O += P V)", GemmShape::dense(1024, 64, 1024, false, false, true)),
        ("64x64x64 b_trans (score tile)", GemmShape::dense(64, 64, 64, false, true, false)),
        ("128x256x64 b_trans (score tile)", GemmShape::dense(128, 256, 64, false, true, false)),
        ("128x64x128 (PV tile)", GemmShape::dense(128, 64, 128, false, false, true)),
        ("128x64x256 (PV tile)", GemmShape::dense(128, 64, 256, false, false, true)),
    ];
    let mut benches = peak_benches();
    for isa in Isa::ALL {
        if !isa.available() {
            println!("{isa}: not available on this CPU");
            continue;
        }
        for (name, s) in shapes {
            let [na, nb, nc] = s.extents().expect("benchmark shapes are valid");
            let (a, b, mut c) = (random(&mut rng, na), random(&mut rng, nb), vec![0.0f32; nc]);
            benches.push(Bench {
                label: format!("{isa:<9} {name}"),
                unit: Unit::Gemm(s.flops(), isa),
                run: Box::new(move || {
                    gemm(isa, &s, black_box(&a), black_box(&b), black_box(&mut c)).expect("valid shape");
                    // Keep accumulating shapes from growing without bound.
                    c[0] = 0.0;
                }),
            });
        }
        let sh = SoftmaxShape::dense(128, 128, 64);
        let mut s = random(&mut rng, 128 * 128);
        let mut o = vec![0.0f32; 128 * 64];
        let (mut mx, mut sum) = (vec![0.0f32; 128], vec![0.0f32; 128]);
        benches.push(Bench {
            label: format!("{isa:<9} softmax_update 128x128, d = 64"),
            unit: Unit::Softmax(128.0 * 128.0),
            // Repeated updates of the same tile stay in range: P lies in [0, 1] and becomes the
            // next call's scores. Resetting the running max below them makes every call
            // rescale O too, as when a new key block raises the maximum.
            run: Box::new(move || {
                mx.fill(-1.0);
                sum.fill(0.0);
                softmax_update(isa, &sh, black_box(&mut s), &mut mx, &mut sum, &mut o).expect("valid shape");
            }),
        });
    }
    let mut best = vec![f64::INFINITY; benches.len()];
    for _ in 0..ROUNDS {
        for (b, t) in benches.iter_mut().zip(best.iter_mut()) {
            *t = t.min(best_secs(&mut b.run));
        }
    }
    let gflops = |flops: f64, secs: f64| flops / secs / 1e9;
    let mut p512 = 0.0;
    let mut p256 = 0.0;
    for (b, &t) in benches.iter().zip(&best) {
        if let Unit::Peak(f) = b.unit {
            if b.label.starts_with("512") {
                p512 = gflops(f, t);
            } else {
                p256 = gflops(f, t);
            }
        }
    }
    println!("single-thread GFLOP/s; % of the measured FMA peak of the ISA's vector width");
    for (b, &t) in benches.iter().zip(&best) {
        match b.unit {
            Unit::Peak(f) => println!("{:<48} {:7.1} GFLOP/s", b.label, gflops(f, t)),
            Unit::Gemm(f, isa) => {
                let (peak, width) = if isa == Isa::Avx512 { (p512, "512") } else { (p256, "256") };
                let g = gflops(f, t);
                let pct = if peak > 0.0 { 100.0 * g / peak } else { 0.0 };
                println!("{:<48} {g:7.1} GFLOP/s {pct:6.1}% of {width}-bit peak", b.label);
            }
            Unit::Softmax(n) => println!("{:<48} {:7.2} ns/score", b.label, t * 1e9 / n),
        }
    }
}
