//! `bench peak`: this machine's FMA peaks, its bf16 dot-product peaks (AMX tiles and
//! AVX512_BF16), and the 1024^3 bf16 tile GEMM measured against them in the same run.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use rand::{RngExt, SeedableRng, rngs::StdRng};
use serde::Serialize;
use uopc_tile::{Bf16Path, GemmShape, gemm_bf16_parallel, peak};

/// Size of the square bf16 GEMM.
const GEMM_N: usize = 1024;
/// Threads (and tasks) of the GEMM and of the multi-threaded peaks.
const THREADS: usize = 2;
/// Timed GEMM runs per path (after one untimed warm-up).
const GEMM_REPS: usize = 15;

#[derive(Serialize)]
struct GemmRow {
    path: &'static str,
    median_gflops: f64,
    best_gflops: f64,
    /// Median against the AMX peak on [`THREADS`] threads (absent without AMX).
    percent_of_amx_peak: Option<f64>,
    /// Median against the peak of the path's own instruction on [`THREADS`] threads.
    percent_of_path_peak: Option<f64>,
    /// Largest error of 256 sampled entries against f64, relative to the sum of |products|.
    max_rel_err: f64,
}

#[derive(Serialize)]
struct Report {
    threads: usize,
    f32x4_peak_gflops: f64,
    avx2_fma_peak_gflops: Option<f64>,
    avx512_peak_gflops: Option<f64>,
    /// `tdpbf16ps` chains on four accumulator tiles, [`THREADS`] threads.
    amx_bf16_peak_gflops: Option<f64>,
    amx_bf16_peak_1t_gflops: Option<f64>,
    /// `vdpbf16ps` chains on 16 accumulators, [`THREADS`] threads.
    avx512_bf16_peak_gflops: Option<f64>,
    avx512_bf16_peak_1t_gflops: Option<f64>,
    /// Median GFLOP/s of the 1024^3 bf16 GEMM on the AMX path, [`THREADS`] tasks.
    amx_gemm_1024_gflops: Option<f64>,
    gemm_bf16_1024: Vec<GemmRow>,
}

/// Runs `bench peak`, printing every figure and writing them to `json` when given.
pub fn run(json: Option<&Path>) -> ExitCode {
    let Some(f32x4) = crate::attention::measure_peak() else {
        eprintln!("error: could not compile or run the FMA loop on this machine");
        return ExitCode::FAILURE;
    };
    println!(
        "F32X4 FMA peak: {f32x4:.1} GFLOP/s on all cores (128-bit vectors: Cranelift's widest on x86-64)"
    );
    let mut wide = Vec::new();
    for (isa, what) in [(uopc_tile::Isa::Avx2Fma, "256-bit"), (uopc_tile::Isa::Avx512, "512-bit")] {
        let p = crate::attention::measure_wide_peak(isa);
        match p {
            Some(p) => println!("{what} FMA peak: {p:.1} GFLOP/s on all cores ({isa} micro-kernels)"),
            None => println!("{what} FMA peak: not available on this CPU"),
        }
        wide.push(p);
    }

    let amx = [1, THREADS].map(|t| peak::amx_bf16_peak_gflops(200_000, 5, t));
    match amx {
        [Some(one), Some(two)] => println!(
            "AMX bf16 peak: {one:.1} GFLOP/s on 1 thread, {two:.1} on {THREADS} (tdpbf16ps chains, four accumulator tiles)"
        ),
        _ => println!(
            "AMX bf16 peak: not available here (no AMX-TILE/AMX-BF16, no OS tile state, or no permission)"
        ),
    }
    let dp = [1, THREADS].map(|t| peak::avx512_bf16_peak_gflops(2_000_000, 5, t));
    match dp {
        [Some(one), Some(two)] => println!(
            "AVX512_BF16 peak: {one:.1} GFLOP/s on 1 thread, {two:.1} on {THREADS} (vdpbf16ps chains, 16 accumulators)"
        ),
        _ => println!("AVX512_BF16 peak: not available on this CPU"),
    }

    let rows = match rayon::ThreadPoolBuilder::new().num_threads(THREADS).build() {
        Ok(pool) => pool.install(|| gemm_rows(amx[1], dp[1])),
        Err(e) => {
            eprintln!("error: cannot start {THREADS} threads: {e}");
            return ExitCode::FAILURE;
        }
    };
    let report = Report {
        threads: THREADS,
        f32x4_peak_gflops: f32x4,
        avx2_fma_peak_gflops: wide[0],
        avx512_peak_gflops: wide[1],
        amx_bf16_peak_gflops: amx[1],
        amx_bf16_peak_1t_gflops: amx[0],
        avx512_bf16_peak_gflops: dp[1],
        avx512_bf16_peak_1t_gflops: dp[0],
        amx_gemm_1024_gflops: rows.iter().find(|r| r.path == Bf16Path::Amx.name()).map(|r| r.median_gflops),
        gemm_bf16_1024: rows,
    };
    // f32 sums of n exact products are within (n + 1) u of the sum of |products| (u = 2^-24);
    // twice that is the bound the tests use.
    let bound = (GEMM_N + 2) as f64 * 2.0 * 2f64.powi(-24);
    if report.gemm_bf16_1024.iter().any(|r| r.max_rel_err.is_nan() || r.max_rel_err > bound) {
        eprintln!("error: a bf16 GEMM result is wrong (see max_rel_err above)");
        return ExitCode::FAILURE;
    }
    if let Some(path) = json {
        let written = serde_json::to_string_pretty(&report)
            .map_err(|e| e.to_string())
            .and_then(|s| std::fs::write(path, s).map_err(|e| format!("writing {}: {e}", path.display())));
        if let Err(e) = written {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// Times the 1024^3 bf16 GEMM (row-major A and B, C overwritten) on every available vector
/// path with [`THREADS`] tasks on the current pool, and checks sampled entries against f64.
/// The portable path is left out: it exists for correctness, and would take minutes here.
fn gemm_rows(amx_peak: Option<f64>, dp_peak: Option<f64>) -> Vec<GemmRow> {
    let n = GEMM_N;
    let s = GemmShape::dense(n, n, n, false, false, false);
    let mut rng = StdRng::seed_from_u64(7);
    let mut values = |len: usize| -> Vec<half::bf16> {
        (0..len).map(|_| half::bf16::from_f32(rng.random_range(-1.0f32..1.0))).collect()
    };
    let (a, b) = (values(n * n), values(n * n));
    let mut c = vec![0.0f32; n * n];
    let mut rows = Vec::new();
    for path in [Bf16Path::Amx, Bf16Path::Avx512Bf16] {
        if !path.available() {
            println!("bf16 GEMM {n}^3 on {path}: skipped, not available here");
            continue;
        }
        let run = |c: &mut [f32]| gemm_bf16_parallel(path, &s, &a, &b, c, THREADS).expect("valid operands");
        run(&mut c);
        let mut times: Vec<f64> = (0..GEMM_REPS)
            .map(|_| {
                let t = Instant::now();
                run(&mut c);
                t.elapsed().as_secs_f64()
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let gflops = |t: f64| s.flops() / t / 1e9;
        let (median, best) = (gflops(times[times.len() / 2]), gflops(times[0]));
        let mut sample = StdRng::seed_from_u64(8);
        let max_rel_err = (0..256)
            .map(|_| {
                let (i, j) = (sample.random_range(0..n), sample.random_range(0..n));
                let (mut exact, mut mag) = (0.0f64, 0.0f64);
                for p in 0..n {
                    let t = f64::from(a[i * n + p].to_f32()) * f64::from(b[p * n + j].to_f32());
                    exact += t;
                    mag += t.abs();
                }
                (f64::from(c[i * n + j]) - exact).abs() / mag.max(f64::MIN_POSITIVE)
            })
            .fold(0.0, f64::max);
        let path_peak = if path == Bf16Path::Amx { amx_peak } else { dp_peak };
        let pct = |p: Option<f64>| p.map(|p| 100.0 * median / p);
        let show = |p: Option<f64>| p.map_or("n/a".to_string(), |p| format!("{p:.1}%"));
        println!(
            "bf16 GEMM {n}^3 on {path}, {THREADS} threads: median {median:.1} GFLOP/s (best {best:.1}), \
             {} of the AMX peak, {} of its own instruction's peak; max rel err {max_rel_err:.1e}",
            show(pct(amx_peak)),
            show(pct(path_peak)),
        );
        rows.push(GemmRow {
            path: path.name(),
            median_gflops: median,
            best_gflops: best,
            percent_of_amx_peak: pct(amx_peak),
            percent_of_path_peak: pct(path_peak),
            max_rel_err,
        });
    }
    rows
}
