//! What `bench attention` reports: the table, the per-kernel lines, and the `--svg` and
//! `--json` files with the machine they were measured on.

use super::measurement::{Measurement, Result, TOLERANCE, fmt_err};
use crate::AttentionArgs;
use serde::Serialize;

/// The machine a run measured, as the JSON report records it.
#[derive(Serialize)]
pub(super) struct Machine {
    cpu: String,
    logical_cpus: usize,
    threads: usize,
    os: &'static str,
    arch: &'static str,
}

/// The JSON report of `--json`: the measurements and where they were taken.
#[derive(Serialize)]
struct Report<'a> {
    results: &'a [Measurement],
    peak_gflops: Option<f64>,
    machine: Machine,
    version: String,
    git: Option<String>,
    tolerance: f64,
}

/// The CPU's model name from `/proc/cpuinfo`, or "unknown" where there is none.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// This machine and the size of the pool the kernels run on.
pub(super) fn machine() -> Machine {
    let logical_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    // the pool the kernels run on: the one `--threads` installed, else rayon's global pool
    let threads = rayon::current_num_threads();
    Machine {
        cpu: cpu_model(),
        logical_cpus,
        threads,
        os: std::env::consts::OS,
        arch: std::env::consts::ARCH,
    }
}

/// The short hash of the checked-out commit, if this runs inside a git checkout.
fn git_commit() -> Option<String> {
    let out = std::process::Command::new("git").args(["rev-parse", "--short", "HEAD"]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// One row per measurement; `WRONG` marks a result outside [`TOLERANCE`].
pub(super) fn print_table(results: &[Measurement]) {
    println!(
        "{:<22} {:>6} {:>5} {:>11} {:>11} {:>9} {:>7} {:>8} {:>7} {:>12}",
        "variant", "n", "d", "median ms", "best ms", "GFLOP/s", "% peak", "of unit", "% wide", "max abs err"
    );
    for m in results {
        let flag = if m.max_abs_err <= TOLERANCE { "" } else { "  WRONG" };
        let peak = m.percent_of_peak.map_or("-".to_string(), |p| format!("{p:.1}"));
        let wide = m.percent_of_widest_peak.map_or("-".to_string(), |p| format!("{p:.1}"));
        println!(
            "{:<22} {:>6} {:>5} {:>11.3} {:>11.3} {:>9.2} {:>7} {:>8} {:>7} {:>12}{flag}",
            m.variant.name(),
            m.n,
            m.d,
            m.median_ms,
            m.best_ms,
            m.gflops,
            peak,
            m.peak_unit,
            wide,
            fmt_err(m.max_abs_err)
        );
    }
}

/// Each Tensor form's kernels: best time, GFLOP/s and percent of the peak that applies.
pub(super) fn print_kernels(results: &[Measurement]) {
    for m in results.iter().filter(|m| !m.kernel_times.is_empty()) {
        println!("{} n={} d={}:", m.variant.name(), m.n, m.d);
        for k in &m.kernel_times {
            let peak = k.percent_of_peak.map_or("-".to_string(), |p| format!("{p:.1}"));
            let unit = if k.tile_ops { "of the widest peak (tile ops)" } else { "of the F32X4 peak" };
            println!(
                "  {:<16} {:>10.3} ms {:>9.2} GFLOP/s {:>6} % {unit}",
                k.name, k.best_ms, k.gflops, peak
            );
        }
    }
}

/// Writes the `--svg` plot and the `--json` report, if asked for.
pub(super) fn write_outputs(args: &AttentionArgs, results: &[Measurement], machine: Machine) -> Result<()> {
    if let Some(path) = &args.svg {
        let subtitle = format!("{}, {} threads", machine.cpu, machine.threads);
        std::fs::write(path, crate::svg::plot(results, &subtitle))
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.json {
        let report = Report {
            results,
            peak_gflops: results
                .iter()
                .filter(|m| m.peak_unit == "f32x4")
                .find_map(|m| m.percent_of_peak.map(|p| 100.0 * m.gflops / p.max(1e-9))),
            machine,
            version: env!("CARGO_PKG_VERSION").to_string(),
            git: git_commit(),
            tolerance: TOLERANCE,
        };
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text + "\n").map_err(|e| format!("writing {}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
