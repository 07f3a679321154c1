//! `bench peak`: this machine's FMA peaks, its bf16 dot-product peaks (AMX tiles and
//! AVX512_BF16), the 1024^3 bf16 tile GEMM measured against them in the same run, and the
//! 1024^3 f16 GEMM beside the f32 one against the f32 FMA peak.

use crate::stats::median;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use rand::{RngExt, SeedableRng, rngs::StdRng};
use serde::Serialize;
use uopc_tile::{Bf16Path, GemmShape, Isa, gemm_bf16_parallel, gemm_f16_unchecked, gemm_unchecked, peak};

/// Size of the square bf16 GEMM.
const GEMM_N: usize = 1024;
/// Threads (and tasks) of the GEMM and of the multi-threaded peaks.
const THREADS: usize = 2;

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
    /// Medians over the rounds. `tdpbf16ps` chains on four accumulator tiles, [`THREADS`] threads.
    amx_bf16_peak_gflops: Option<f64>,
    amx_bf16_peak_1t_gflops: Option<f64>,
    /// `vdpbf16ps` chains on 16 accumulators, [`THREADS`] threads.
    avx512_bf16_peak_gflops: Option<f64>,
    avx512_bf16_peak_1t_gflops: Option<f64>,
    /// Median GFLOP/s of the 1024^3 bf16 GEMM on the AMX path, [`THREADS`] tasks.
    amx_gemm_1024_gflops: Option<f64>,
    gemm_bf16_1024: Vec<GemmRow>,
    /// The 1024^3 f16 GEMM (widened to f32 on the fastest ISA's f32 kernels) and the f32 GEMM
    /// of the same values, [`THREADS`] row-block tasks each, in interleaved rounds.
    gemm_f16_1024: WideGemmRow,
    gemm_f32_1024: WideGemmRow,
}

/// A GEMM on the f32 FMA kernels, against the widest f32 FMA peak measured in the same run.
#[derive(Serialize)]
struct WideGemmRow {
    isa: &'static str,
    median_gflops: f64,
    best_gflops: f64,
    percent_of_f32_fma_peak: Option<f64>,
    /// Largest error of 256 sampled entries against f64, relative to the sum of |products|.
    max_rel_err: f64,
}

/// Runs `bench peak`, printing every figure and writing them to `json` when given.
pub fn run(json: Option<&Path>) -> ExitCode {
    println!("{}", uopc::machine::Machine::get());
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

    let pool = match rayon::ThreadPoolBuilder::new().num_threads(THREADS).build() {
        Ok(pool) => pool,
        Err(e) => {
            eprintln!("error: cannot start {THREADS} threads: {e}");
            return ExitCode::FAILURE;
        }
    };
    let m = pool.install(measure_bf16);
    let med = |x: &[f64]| (!x.is_empty()).then(|| median(x));
    let amx = [med(&m.amx[0]), med(&m.amx[1])];
    let dp = [med(&m.dp[0]), med(&m.dp[1])];
    match amx {
        [Some(one), Some(two)] => println!(
            "AMX bf16 peak: {one:.1} GFLOP/s on 1 thread, {two:.1} on {THREADS} (tdpbf16ps chains, four accumulator tiles; {})",
            spread(&m.amx[1])
        ),
        _ => println!(
            "AMX bf16 peak: not available here (no AMX-TILE/AMX-BF16, no OS tile state, or no permission)"
        ),
    }
    match dp {
        [Some(one), Some(two)] => println!(
            "AVX512_BF16 peak: {one:.1} GFLOP/s on 1 thread, {two:.1} on {THREADS} (vdpbf16ps chains, 16 accumulators; {})",
            spread(&m.dp[1])
        ),
        _ => println!("AVX512_BF16 peak: not available on this CPU"),
    }
    let rows = gemm_rows(&m, amx[1], dp[1]);
    let fma_peak = wide[1].or(wide[0]);
    let [f16_row, f32_row] = pool.install(|| measure_f16_and_f32(fma_peak));
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
        gemm_f16_1024: f16_row,
        gemm_f32_1024: f32_row,
    };
    // f32 sums of n exact products are within (n + 1) u of the sum of |products| (u = 2^-24);
    // twice that is the bound the tests use.
    let bound = (GEMM_N + 2) as f64 * 2.0 * 2f64.powi(-24);
    let wrong = |e: f64| e.is_nan() || e > bound;
    if report.gemm_bf16_1024.iter().any(|r| wrong(r.max_rel_err))
        || wrong(report.gemm_f16_1024.max_rel_err)
        || wrong(report.gemm_f32_1024.max_rel_err)
    {
        eprintln!("error: a 16-bit or f32 GEMM result is wrong (see max_rel_err above)");
        return ExitCode::FAILURE;
    }
    if let Some(path) = json {
        let written = serde_json::to_string_pretty(
            &serde_json::json!({ "machine": crate::machine_record(), "report": report }),
        )
        .map_err(|e| e.to_string())
        .and_then(|s| std::fs::write(path, s).map_err(|e| format!("writing {}: {e}", path.display())));
        if let Err(e) = written {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// Samples of the bf16 figures, one per round for the peaks and [`GEMM_REPS`] per round for the
/// GEMMs, in GFLOP/s.
struct Bf16Samples {
    /// AMX peak on 1 and [`THREADS`] threads (empty without AMX).
    amx: [Vec<f64>; 2],
    /// `vdpbf16ps` peak on 1 and [`THREADS`] threads (empty without AVX512_BF16).
    dp: [Vec<f64>; 2],
    /// The GEMM on each available vector path, with its sampled error.
    gemm: Vec<(Bf16Path, Vec<f64>, f64)>,
}

/// Rounds over all bf16 measurements: each round measures every peak and then every GEMM, so
/// load from other work on the machine moves a GEMM and the peak it is compared with alike.
const ROUNDS: usize = 7;
/// Timed GEMM runs per path and round.
const GEMM_REPS: usize = 3;

/// CPU seconds this process has used so far, all threads together (`None` where the clock
/// is unavailable). On a machine other jobs load, a realize's wall time includes waiting for
/// a core; its CPU time is what its kernels cost.
pub(crate) fn process_cpu_seconds() -> Option<f64> {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid, writable timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    (rc == 0).then_some(t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9)
}

fn spread(x: &[f64]) -> String {
    let lo = x.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = x.iter().copied().fold(0.0, f64::max);
    format!("spread {lo:.1}..{hi:.1} over {} samples", x.len())
}

/// Measures the bf16 peaks and the 1024^3 bf16 GEMM (row-major A and B, C overwritten) on
/// every available vector path with [`THREADS`] tasks on the current pool, in [`ROUNDS`]
/// interleaved rounds, and checks sampled GEMM entries against f64. The portable path is left
/// out: it exists for correctness, and would take minutes here.
fn measure_bf16() -> Bf16Samples {
    let n = GEMM_N;
    let s = GemmShape::dense(n, n, n, false, false, false);
    let mut rng = StdRng::seed_from_u64(7);
    let mut values = |len: usize| -> Vec<half::bf16> {
        (0..len).map(|_| half::bf16::from_f32(rng.random_range(-1.0f32..1.0))).collect()
    };
    let (a, b) = (values(n * n), values(n * n));
    let mut c = vec![0.0f32; n * n];
    let paths: Vec<Bf16Path> =
        [Bf16Path::Amx, Bf16Path::Avx512Bf16].into_iter().filter(|p| p.available()).collect();
    for path in [Bf16Path::Amx, Bf16Path::Avx512Bf16] {
        if !paths.contains(&path) {
            println!("bf16 GEMM {n}^3 on {path}: skipped, not available here");
        }
    }
    let run = |path, c: &mut [f32]| gemm_bf16_parallel(path, &s, &a, &b, c, THREADS).expect("valid operands");
    let mut out = Bf16Samples {
        amx: [Vec::new(), Vec::new()],
        dp: [Vec::new(), Vec::new()],
        gemm: paths.iter().map(|&p| (p, Vec::new(), 0.0)).collect(),
    };
    for &path in &paths {
        run(path, &mut c); // warm-up: page faults, packing buffers, the AMX permission
    }
    for _ in 0..ROUNDS {
        for (i, threads) in [1, THREADS].into_iter().enumerate() {
            out.amx[i].extend(peak::amx_bf16_peak_gflops(100_000, 2, threads));
            out.dp[i].extend(peak::avx512_bf16_peak_gflops(1_000_000, 2, threads));
        }
        for (path, samples, _) in &mut out.gemm {
            for _ in 0..GEMM_REPS {
                let t = Instant::now();
                run(*path, &mut c);
                samples.push(s.flops() / t.elapsed().as_secs_f64() / 1e9);
            }
        }
    }
    for (path, _, err) in &mut out.gemm {
        run(*path, &mut c);
        let mut sample = StdRng::seed_from_u64(8);
        *err = (0..256)
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
    }
    out
}

/// One row per measured GEMM path, printed and kept for the JSON report.
fn gemm_rows(m: &Bf16Samples, amx_peak: Option<f64>, dp_peak: Option<f64>) -> Vec<GemmRow> {
    let n = GEMM_N;
    let mut rows = Vec::new();
    for (path, samples, max_rel_err) in &m.gemm {
        let (median, best) = (median(samples), samples.iter().copied().fold(0.0, f64::max));
        let path_peak = if *path == Bf16Path::Amx { amx_peak } else { dp_peak };
        let pct = |p: Option<f64>| p.map(|p| 100.0 * median / p);
        let show = |p: Option<f64>| p.map_or("n/a".to_string(), |p| format!("{p:.1}%"));
        println!(
            "bf16 GEMM {n}^3 on {path}, {THREADS} threads: median {median:.1} GFLOP/s ({}), \
             {} of the AMX peak, {} of its own instruction's peak; max rel err {max_rel_err:.1e}",
            spread(samples),
            show(pct(amx_peak)),
            show(pct(path_peak)),
        );
        rows.push(GemmRow {
            path: path.name(),
            median_gflops: median,
            best_gflops: best,
            percent_of_amx_peak: pct(amx_peak),
            percent_of_path_peak: pct(path_peak),
            max_rel_err: *max_rel_err,
        });
    }
    rows
}

/// Measures the 1024^3 f16 GEMM and the f32 GEMM of the same (f16-exact) values on
/// [`Isa::detect`], each as [`THREADS`] row-block tasks on the current pool, in [`ROUNDS`]
/// rounds alternating the two, and checks sampled entries of each against f64.
fn measure_f16_and_f32(fma_peak: Option<f64>) -> [WideGemmRow; 2] {
    let n = GEMM_N;
    let isa = Isa::detect();
    let mut rng = StdRng::seed_from_u64(9);
    let mut values = |len: usize| -> Vec<half::f16> {
        (0..len).map(|_| half::f16::from_f32(rng.random_range(-1.0f32..1.0))).collect()
    };
    let (a16, b16) = (values(n * n), values(n * n));
    let (a32, b32): (Vec<f32>, Vec<f32>) =
        (a16.iter().map(|x| x.to_f32()).collect(), b16.iter().map(|x| x.to_f32()).collect());
    let rows = n.div_ceil(THREADS);
    let s = GemmShape::dense(n, n, n, false, false, false);
    // Each task multiplies its block of A's rows by all of B into the same rows of C.
    let run = |wide: bool, c: &mut [f32]| {
        rayon::scope(|scope| {
            for (t, block) in c.chunks_mut(rows * n).enumerate() {
                let sub = GemmShape { m: block.len() / n, ..s };
                let (a16, a32, b16, b32) = (&a16, &a32, &b16, &b32);
                scope.spawn(move |_| {
                    let at = t * rows * n;
                    // SAFETY: the ISA was detected; A's rows `t * rows ..` (sub.m of them), all
                    // of B and this task's own block of C cover the sub-shape's extents.
                    unsafe {
                        if wide {
                            gemm_unchecked(isa, &sub, a32[at..].as_ptr(), b32.as_ptr(), block.as_mut_ptr());
                        } else {
                            gemm_f16_unchecked(
                                isa,
                                &sub,
                                a16[at..].as_ptr(),
                                b16.as_ptr(),
                                block.as_mut_ptr(),
                            );
                        }
                    }
                });
            }
        });
    };
    let mut c = vec![0.0f32; n * n];
    let mut samples = [Vec::new(), Vec::new()];
    run(false, &mut c);
    run(true, &mut c);
    for _ in 0..ROUNDS {
        for (k, wide) in [false, true].into_iter().enumerate() {
            for _ in 0..GEMM_REPS {
                let t = Instant::now();
                run(wide, &mut c);
                samples[k].push(s.flops() / t.elapsed().as_secs_f64() / 1e9);
            }
        }
    }
    let mut out = Vec::new();
    for (k, wide) in [false, true].into_iter().enumerate() {
        run(wide, &mut c);
        let mut sample = StdRng::seed_from_u64(10);
        let max_rel_err = (0..256)
            .map(|_| {
                let (i, j) = (sample.random_range(0..n), sample.random_range(0..n));
                let (mut exact, mut mag) = (0.0f64, 0.0f64);
                for p in 0..n {
                    let t = f64::from(a32[i * n + p]) * f64::from(b32[p * n + j]);
                    exact += t;
                    mag += t.abs();
                }
                (f64::from(c[i * n + j]) - exact).abs() / mag.max(f64::MIN_POSITIVE)
            })
            .fold(0.0, f64::max);
        let x = &samples[k];
        let (median, best) = (median(x), x.iter().copied().fold(0.0, f64::max));
        let pct = fma_peak.map(|p| 100.0 * median / p);
        println!(
            "{} GEMM {n}^3 on {isa}, {THREADS} threads: median {median:.1} GFLOP/s ({}), {} of the f32 FMA \
             peak; max rel err {max_rel_err:.1e}",
            if wide { "f32" } else { "f16" },
            spread(x),
            pct.map_or("n/a".to_string(), |p| format!("{p:.1}%")),
        );
        out.push(WideGemmRow {
            isa: isa.name(),
            median_gflops: median,
            best_gflops: best,
            percent_of_f32_fma_peak: pct,
            max_rel_err,
        });
    }
    out.try_into().unwrap_or_else(|_| unreachable!("two rows"))
}
