//! `bench attention`: times the three attention forms and checks each against f64.

pub mod measurement;
mod report;

use crate::AttentionArgs;
use crate::reference::{self, Inputs};
use indicatif::{ProgressBar, ProgressStyle};
use measurement::Result;
pub use measurement::{KernelTime, Measurement, TOLERANCE, Variant, fmt_err};
use report::{machine, print_kernels, print_table, write_outputs};
use std::process::ExitCode;
use std::time::Instant;
use uopc::attention::{attention, online_attention_ir, online_attention_qb_ir};
use uopc::flash_tiled::{
    CAUSAL_TILE_OPS_TILING, FlashTileOps, FlashTiled, FlashTiling, TILE_OPS_L2, TILE_OPS_L2_TILING,
    TILE_OPS_TILING,
};
use uopc::jit::{JitOptions, Program};
use uopc::tensor::DefaultOpt;
use uopc::{RealizeOptions, Tensor, make_plan};

/// Query rows per THREAD iteration of the `online_qb` variant.
pub const QUERY_BLOCK: usize = 4;

/// Something that computes attention for fixed inputs, once per call.
enum Runner<'a> {
    Tensor {
        opts: RealizeOptions,
        /// q, k and v, built once like the other forms' inputs: each call builds the graph
        /// and realizes it.
        inputs: [Tensor; 3],
        out: Vec<f32>,
        /// Per kernel: name, best seconds, static FLOPs, whether it calls tile ops.
        kernels: Vec<(String, f64, u64, bool)>,
    },
    Online {
        prg: Box<Program>,
        x: &'a Inputs,
        out: Vec<f32>,
    },
    Tiled {
        prg: Box<FlashTiled>,
        x: &'a Inputs,
        out: Vec<f32>,
    },
    TileOps {
        prg: Box<FlashTileOps>,
        x: &'a Inputs,
        out: Vec<f32>,
    },
}

impl<'a> Runner<'a> {
    /// Compiles the online program (outside any timing); the Tensor forms compile on first run.
    fn new(
        variant: Variant,
        x: &'a Inputs,
        n: usize,
        d: usize,
        scalar: bool,
        tiling: Option<FlashTiling>,
    ) -> Result<Self> {
        Ok(match variant.realize_options() {
            Some(opts) => Runner::Tensor {
                // scalar code means the JIT's own code: no tile GEMMs either
                opts: if scalar && variant == Variant::Unfused {
                    RealizeOptions { scalar_codegen: true, ..opts.with_opt(DefaultOpt::loops()) }
                } else {
                    RealizeOptions { scalar_codegen: scalar, ..opts }
                },
                inputs: [
                    Tensor::try_from_vec(x.q.clone(), &[n, d])?,
                    Tensor::try_from_vec(x.k.clone(), &[n, d])?,
                    Tensor::try_from_vec(x.v.clone(), &[n, d])?,
                ],
                out: vec![0.0; n * d],
                kernels: Vec::new(),
            },
            None if matches!(variant, Variant::FlashTileOps | Variant::FlashTileOpsCausal) => {
                let causal = variant == Variant::FlashTileOpsCausal;
                let default = if causal { CAUSAL_TILE_OPS_TILING } else { TILE_OPS_TILING };
                let prg = Box::new(FlashTileOps::compile_with(n, d, tiling.unwrap_or(default), causal)?);
                Runner::TileOps { prg, x, out: vec![0.0; n * d] }
            }
            None if variant == Variant::FlashTileOpsL2 => {
                let tiling = tiling.unwrap_or(TILE_OPS_L2_TILING);
                let prg = Box::new(FlashTileOps::compile_l2(n, d, tiling, TILE_OPS_L2)?);
                Runner::TileOps { prg, x, out: vec![0.0; n * d] }
            }
            None if variant == Variant::FlashTiled => {
                let prg = Box::new(FlashTiled::compile(n, d, tiling.unwrap_or_default())?);
                Runner::Tiled { prg, x, out: vec![0.0; n * d] }
            }
            None => {
                let (program, name) = match variant {
                    Variant::OnlineQb => (online_attention_qb_ir(n, d, QUERY_BLOCK), "online_qb"),
                    _ => (online_attention_ir(n, d), "online"),
                };
                let options = if scalar { JitOptions::scalar() } else { JitOptions::default() };
                let prg = Box::new(Program::compile_with(&program, name, &options)?);
                Runner::Online { prg, x, out: vec![0.0; n * d] }
            }
        })
    }

    /// One timed call: for the Tensor forms, the graph over the input tensors and its realize
    /// into the caller's output (what a user of the front end pays per call, with the inputs
    /// and the output handled as the hand-written forms handle theirs); for the others one run
    /// of the compiled program.
    fn call(&mut self) -> Result<()> {
        match self {
            Runner::Tensor { opts, inputs: [q, k, v], out, kernels } => {
                let report = attention(q, k, v).realize_into_with(&mut out[..], opts)?;
                if kernels.is_empty() {
                    *kernels = report
                        .kernels
                        .iter()
                        .map(|t| (t.name.clone(), t.seconds, t.flops, t.tile_ops))
                        .collect();
                }
                for (best, t) in kernels.iter_mut().zip(&report.kernels) {
                    best.1 = best.1.min(t.seconds);
                }
            }
            Runner::Online { prg, x, out } => prg.run_f32(&[&x.q, &x.k, &x.v], &mut [out])?,
            Runner::Tiled { prg, x, out } => prg.run(&x.q, &x.k, &x.v, out)?,
            Runner::TileOps { prg, x, out } => prg.run(&x.q, &x.k, &x.v, out)?,
        }
        Ok(())
    }

    /// Whether the form calls tile ops: the plan's kernels for a Tensor form (known after the
    /// first call), by construction for the hand-written ones.
    fn uses_tile_ops(&self) -> bool {
        match self {
            Runner::Tensor { kernels, .. } => kernels.iter().any(|k| k.3),
            Runner::TileOps { .. } => true,
            Runner::Online { .. } | Runner::Tiled { .. } => false,
        }
    }

    fn output(&self) -> &[f32] {
        match self {
            Runner::Tensor { out, .. }
            | Runner::Online { out, .. }
            | Runner::Tiled { out, .. }
            | Runner::TileOps { out, .. } => out,
        }
    }

    fn kernel_times(&self) -> Vec<KernelTime> {
        match self {
            Runner::Tensor { kernels, .. } => kernels
                .iter()
                .map(|(name, s, flops, tile_ops)| KernelTime {
                    name: name.clone(),
                    best_ms: s * 1e3,
                    gflops: *flops as f64 / s.max(1e-12) / 1e9,
                    percent_of_peak: None,
                    tile_ops: *tile_ops,
                })
                .collect(),
            Runner::Online { .. } | Runner::Tiled { .. } | Runner::TileOps { .. } => Vec::new(),
        }
    }

    /// Kernel names and temporary bytes, read from the (cached) plan.
    fn plan_summary(&self) -> Result<(Vec<String>, usize)> {
        match self {
            Runner::Tensor { opts, inputs: [q, k, v], .. } => {
                let graph = attention(q, k, v);
                let plan = make_plan(&[graph.uop().clone()], opts)?;
                let bytes = plan.temps.iter().map(|(dt, len)| dt.size() * len).sum();
                Ok((plan.kernel_names().iter().map(|s| s.to_string()).collect(), bytes))
            }
            Runner::Online { prg, .. } => Ok((vec![prg.name().to_string()], 0)),
            Runner::TileOps { prg, .. } => {
                // the scaled copy of Q (the score and output tiles live on the stack)
                let (n, d) = prg.shape();
                Ok((vec!["flash_scale_q".into(), prg.kernel().name().to_string()], n * d * 4))
            }
            Runner::Tiled { prg, .. } => {
                let (_, d) = prg.shape();
                let np = prg.padded_keys();
                Ok((vec!["flash_tiled_prep".into(), "flash_tiled".into()], 2 * np * d * 4))
            }
        }
    }
}

/// Timed repetitions when `--reps` is not given. The default sizes take about 10 s in all on
/// two cores (fused at N = 2048, the slowest, under a second per call).
pub const DEFAULT_REPS: usize = 5;

fn reps_for(args: &AttentionArgs) -> usize {
    args.reps.unwrap_or(DEFAULT_REPS).max(1)
}

/// A form at one size, compiled and checked once, collecting timed calls round by round.
struct Pending<'a> {
    variant: Variant,
    n: usize,
    runner: Runner<'a>,
    want: &'a [f64],
    first_ms: f64,
    err: f64,
    times: Vec<f64>,
}

/// Compiles `variant` (outside any timing) and runs it once, checked against `want`.
fn start<'a>(
    variant: Variant,
    x: &'a Inputs,
    want: &'a [f64],
    n: usize,
    args: &AttentionArgs,
) -> Result<Pending<'a>> {
    let tiling = args.flash_tile.map(|(query_block, key_block)| FlashTiling { query_block, key_block });
    let mut runner = Runner::new(variant, x, n, args.d, args.scalar, tiling)?;
    let t = Instant::now();
    runner.call()?;
    let first_ms = t.elapsed().as_secs_f64() * 1e3;
    let err = reference::max_abs_err(runner.output(), want);
    Ok(Pending { variant, n, runner, want, first_ms, err, times: Vec::new() })
}

impl Pending<'_> {
    /// `reps` timed calls, each result checked outside the timing: a race shows up as a
    /// run-to-run difference.
    fn sample(&mut self, reps: usize, bar: &ProgressBar) -> Result<()> {
        for _ in 0..reps {
            let t = Instant::now();
            self.runner.call()?;
            self.times.push(t.elapsed().as_secs_f64() * 1e3);
            self.err = self.err.max(reference::max_abs_err(self.runner.output(), self.want));
            bar.inc(1);
        }
        Ok(())
    }

    fn finish(mut self, d: usize, scalar: bool) -> Result<Measurement> {
        self.times.sort_by(f64::total_cmp);
        let (kernels, temp_bytes) = self.runner.plan_summary()?;
        let (variant, n) = (self.variant, self.n);
        let best_ms = self.times[0];
        Ok(Measurement {
            variant,
            n,
            d,
            median_ms: crate::stats::median(&self.times),
            best_ms,
            // a causal form does (a little over) half the work: counted as half
            gflops: if variant == Variant::FlashTileOpsCausal { 2.0 } else { 4.0 } * (n * n * d) as f64
                / (best_ms * 1e-3)
                / 1e9,
            max_abs_err: self.err,
            reps: self.times.len(),
            first_ms: self.first_ms,
            kernels,
            temp_bytes,
            peak_unit: "f32x4",
            percent_of_peak: None,
            percent_of_widest_peak: None,
            tile_ops: self.runner.uses_tile_ops(),
            kernel_times: self.runner.kernel_times(),
            scalar,
        })
    }
}

/// Best-of-5 FMA peak of `isa`'s widest vectors on as many threads as the kernels' pool.
pub fn measure_wide_peak(isa: uopc_tile::Isa) -> Option<f64> {
    uopc_tile::peak::fma_peak_gflops(isa, 2_000_000, 5, rayon::current_num_threads())
}

/// The widest FMA peak this CPU has (512-bit, else 256-bit), with its name.
pub fn measure_widest_peak() -> Option<(&'static str, f64)> {
    [(uopc_tile::Isa::Avx512, "512-bit"), (uopc_tile::Isa::Avx2Fma, "256-bit")]
        .into_iter()
        .find_map(|(isa, name)| measure_wide_peak(isa).map(|p| (name, p)))
}

/// Best-of-5 F32X4 FMA peak of this machine on the kernels' thread pool, in GFLOP/s.
pub fn measure_peak() -> Option<f64> {
    uopc::jit::peak::fma_peak_gflops(5_000_000, 5).ok()
}

/// Sets each result's share of the peak of the unit its code runs on (F32X4 for JIT loops, the
/// widest vectors for tile ops, named by `widest`) and of the widest peak, for the whole form
/// and each of its kernels.
fn set_peak_shares(results: &mut [Measurement], peak: Option<f64>, widest: Option<(&'static str, f64)>) {
    let unit_peak = |tile_ops: bool| match (tile_ops, widest) {
        (true, Some((name, p))) => Some((name, p)),
        (true, None) => None,
        (false, _) => peak.map(|p| ("f32x4", p)),
    };
    for m in results {
        if let Some((name, p)) = unit_peak(m.tile_ops) {
            m.peak_unit = name;
            m.percent_of_peak = Some(100.0 * m.gflops / p);
        }
        m.percent_of_widest_peak = widest.map(|(_, p)| 100.0 * m.gflops / p);
        for k in &mut m.kernel_times {
            k.percent_of_peak = unit_peak(k.tile_ops).map(|(_, p)| 100.0 * k.gflops / p);
        }
    }
}

/// Runs `bench attention`; the exit code is non-zero when any result is wrong or fails.
pub fn run(args: &AttentionArgs) -> ExitCode {
    if args.n.is_empty() || args.n.contains(&0) || args.d == 0 || args.variants.is_empty() {
        eprintln!("error: --n and --d must be positive and --variants non-empty");
        return ExitCode::from(2);
    }
    let mut variants: Vec<Variant> = Vec::new();
    for &v in &args.variants {
        if !variants.contains(&v) {
            variants.push(v);
        }
    }
    let rounds = args.rounds.max(1);
    let per_round = reps_for(args).div_ceil(rounds);
    let total: usize = args.n.len() * variants.len() * (1 + rounds * per_round);
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed:>4} [{bar:32}] {pos}/{len} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let started = Instant::now();
    let mut failures = Vec::new();
    // Inputs and f64 references of every size first, so the forms can be timed in rounds.
    let mut cases = Vec::new();
    for &n in &args.n {
        bar.set_message(format!("f64 reference n={n}"));
        let x = reference::inputs(n, args.d);
        let want = reference::attention_f64(&x, n, args.d);
        let causal = variants
            .contains(&Variant::FlashTileOpsCausal)
            .then(|| reference::attention_f64_with(&x, n, args.d, true));
        cases.push((n, x, want, causal));
    }
    let mut pending = Vec::new();
    for (n, x, want, causal) in &cases {
        let n = *n;
        for &v in &variants {
            bar.set_message(format!("{} n={n} d={}", v.name(), args.d));
            let want =
                if v == Variant::FlashTileOpsCausal { causal.as_deref().unwrap_or(want) } else { want };
            match start(v, x, want, n, args) {
                Ok(p) => pending.push(p),
                Err(e) => failures.push(format!("{} n={n} d={}: {e}", v.name(), args.d)),
            }
            bar.inc(1);
        }
    }
    // Every round times every form and measures the peaks again: a burst of other work on a
    // shared machine then spoils some samples of each figure rather than all of one. Best times
    // and the best peaks are kept.
    let (mut peak, mut widest): (Option<f64>, Option<(&str, f64)>) = (None, None);
    for round in 0..rounds {
        let mut kept = Vec::new();
        for mut p in pending {
            bar.set_message(format!(
                "round {} of {rounds}: {} n={} d={}",
                round + 1,
                p.variant.name(),
                p.n,
                args.d
            ));
            match p.sample(per_round, &bar) {
                Ok(()) => kept.push(p),
                Err(e) => failures.push(format!("{} n={} d={}: {e}", p.variant.name(), p.n, args.d)),
            }
        }
        pending = kept;
        if let Some(p) = measure_peak() {
            peak = Some(peak.map_or(p, |q| q.max(p)));
        }
        if let Some((name, p)) = measure_widest_peak() {
            widest = Some((name, widest.map_or(p, |(_, q)| q.max(p))));
        }
    }
    let mut results = Vec::new();
    for p in pending {
        let (name, n) = (p.variant.name(), p.n);
        match p.finish(args.d, args.scalar) {
            Ok(m) => {
                if m.max_abs_err > TOLERANCE {
                    failures.push(format!(
                        "{name} n={n} d={}: wrong result, max abs error {} exceeds the tolerance {}",
                        args.d,
                        fmt_err(m.max_abs_err),
                        fmt_err(TOLERANCE)
                    ));
                }
                results.push(m);
            }
            Err(e) => failures.push(format!("{name} n={n} d={}: {e}", args.d)),
        }
    }
    bar.finish_and_clear();
    set_peak_shares(&mut results, peak, widest);
    if args.scalar {
        println!("(every kernel compiled as scalar code)");
    }
    print_table(&results);
    if args.kernels {
        print_kernels(&results);
    }
    if let Some(p) = peak {
        println!("F32X4 FMA peak measured in this run: {p:.1} GFLOP/s");
    }
    if let Some((name, p)) = widest {
        println!("{name} FMA peak measured in this run: {p:.1} GFLOP/s (% wide)");
    }
    eprintln!("bench attention: {} results in {:.1} s", results.len(), started.elapsed().as_secs_f64());
    if let Err(e) = write_outputs(args, &results, machine()) {
        failures.push(e.to_string());
    }
    if failures.is_empty() {
        return ExitCode::SUCCESS;
    }
    for f in &failures {
        eprintln!("error: {f}");
    }
    eprintln!("error: {} of the checks failed", failures.len());
    ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_print_like_c() {
        assert_eq!(fmt_err(3.3e-7), "3.3e-07");
        assert_eq!(fmt_err(0.0), "0.0e+00");
        assert_eq!(fmt_err(12.0), "1.2e+01");
        assert_eq!(fmt_err(f64::INFINITY), "inf");
    }
}
