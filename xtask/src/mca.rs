//! `cargo xtask mca`: a static check of the GEMM micro-kernels for CPUs not at hand.
//!
//! Compiles `uopc-tile` to assembly (in its own target directory, with v0 symbol names so the
//! monomorphized kernels can be told apart), takes each micro-kernel's innermost loop (the
//! backward branch whose body holds the most multiply-adds), and runs `llvm-mca` on it for a
//! CPU model: `sapphirerapids` (two 512-bit FMA ports) for the AVX-512 kernels, `znver3` for
//! the AVX2 ones. It prints the predicted cycles per iteration against the FMA bound: the
//! cycles the same model gives the loop's multiply-adds alone, as independent instructions
//! (so a model's own FMA throughput, e.g. LLVM 14's znver3 at one 256-bit FMA per cycle, is the
//! ceiling rather than an assumed port count). These are predictions of a model of the core,
//! not measurements.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use serde::Serialize;

/// A micro-kernel to check: how its demangled name reads, and the CPU model to check it on.
struct Target {
    /// A substring of the demangled symbol.
    symbol: &'static str,
    /// What the kernel is.
    what: &'static str,
    /// `llvm-mca -mcpu` values.
    cpus: &'static [&'static str],
}

const AVX512_CPUS: &[&str] = &["sapphirerapids", "icelake-server"];
const AVX2_CPUS: &[&str] = &["znver3", "sapphirerapids"];

const TARGETS: &[Target] = &[
    Target {
        symbol: "avx512::tile_n::<12, 2, true>",
        what: "f32 12x32, A packed k-major",
        cpus: AVX512_CPUS,
    },
    Target {
        symbol: "avx512::tile_n::<12, 2, false>",
        what: "f32 12x32, A read in place",
        cpus: AVX512_CPUS,
    },
    Target { symbol: "avx2::tile_n::<6, 2, true>", what: "f32 6x16, A packed k-major", cpus: AVX2_CPUS },
    Target { symbol: "avx2::tile_n::<6, 2, false>", what: "f32 6x16, A read in place", cpus: AVX2_CPUS },
    Target {
        symbol: "bf16::rows_block::<0, 12, 2>",
        what: "bf16 12x32 vdpbf16ps rows 0-11",
        cpus: BF16_CPUS,
    },
    Target {
        symbol: "bf16::rows_block::<12, 10, 2>",
        what: "bf16 10x32 vdpbf16ps rows 12-21",
        cpus: BF16_CPUS,
    },
    Target {
        symbol: "bf16::rows_block::<22, 10, 2>",
        what: "bf16 10x32 vdpbf16ps rows 22-31",
        cpus: BF16_CPUS,
    },
];

/// The CPU model of the `vdpbf16ps` kernels (LLVM 14 knows AVX512_BF16 on it).
const BF16_CPUS: &[&str] = &["sapphirerapids"];

/// One kernel on one CPU model.
#[derive(Serialize)]
struct Row {
    kernel: String,
    symbol: String,
    mcpu: String,
    fmas_per_iteration: usize,
    instructions_per_iteration: usize,
    predicted_cycles_per_iteration: f64,
    /// The model's cycles for the loop's multiply-adds alone.
    fma_bound_cycles: f64,
    /// Multiply-adds per cycle the model gives them alone.
    model_fmas_per_cycle: f64,
    percent_of_fma_bound: f64,
}

/// Runs the check, printing a table and writing JSON to `json` when given.
pub fn run(json: Option<&Path>) -> ExitCode {
    if Command::new("llvm-mca").arg("--version").output().is_err() {
        eprintln!("error: llvm-mca not found (Debian: apt-get install llvm)");
        return ExitCode::FAILURE;
    }
    let asm = match compile_asm() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let text = match std::fs::read_to_string(&asm) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: reading {}: {e}", asm.display());
            return ExitCode::FAILURE;
        }
    };
    let functions = split_functions(&text);
    let mut rows = Vec::new();
    println!(
        "llvm-mca predictions (a model of each core, not a measurement); bound = the model's cycles for the multiply-adds alone"
    );
    println!(
        "{:<30} {:<16} {:>5} {:>6} {:>9} {:>8} {:>7}",
        "kernel", "mcpu", "fmas", "insts", "cycles/it", "bound", "% bound"
    );
    for t in TARGETS {
        let Some((name, body)) = functions.iter().find(|(n, _)| n.contains(t.symbol)) else {
            println!("{:<30} not found in the assembly (inlined or renamed?): {}", t.what, t.symbol);
            continue;
        };
        let Some(lp) = innermost_fma_loop(body) else {
            println!("{:<30} no loop with multiply-adds in {name}", t.what);
            continue;
        };
        for cpu in t.cpus {
            let fmas = lp.iter().filter(|l| is_fma(l)).count();
            match predict(&lp, cpu).and_then(|cycles| Ok((cycles, predict(&fma_stream(&lp), cpu)?))) {
                Ok((cycles, bound)) => {
                    let row = Row {
                        kernel: t.what.to_string(),
                        symbol: name.clone(),
                        mcpu: cpu.to_string(),
                        fmas_per_iteration: fmas,
                        instructions_per_iteration: lp.len(),
                        predicted_cycles_per_iteration: cycles,
                        fma_bound_cycles: bound,
                        model_fmas_per_cycle: fmas as f64 / bound,
                        percent_of_fma_bound: 100.0 * bound / cycles,
                    };
                    println!(
                        "{:<30} {:<16} {:>5} {:>6} {:>9.2} {:>8.2} {:>6.1}%",
                        row.kernel,
                        cpu,
                        fmas,
                        row.instructions_per_iteration,
                        cycles,
                        bound,
                        row.percent_of_fma_bound
                    );
                    rows.push(row);
                }
                Err(e) => println!("{:<30} {:<16} llvm-mca failed: {e}", t.what, cpu),
            }
        }
    }
    if let Some(path) = json {
        let record = serde_json::json!({
            "command": "cargo xtask mca",
            "machine_running_the_check": uopc::machine::Machine::get().to_string(),
            "kind": "prediction (llvm-mca), not a measurement",
            "rows": rows,
        });
        if let Err(e) = std::fs::write(path, serde_json::to_string_pretty(&record).unwrap_or_default()) {
            eprintln!("error: writing {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// Builds `uopc-tile` to assembly in `target/mca` and returns the `.s` file.
fn compile_asm() -> Result<PathBuf, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().ok_or("no workspace root")?.to_path_buf();
    let target_dir = root.join("target").join("mca");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| String::from("cargo")))
        .current_dir(&root)
        .args(["rustc", "--release", "-p", "uopc-tile", "--lib", "--target-dir"])
        .arg(&target_dir)
        .args(["--", "--emit", "asm", "-C", "symbol-mangling-version=v0", "-C", "codegen-units=1"])
        .status()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !status.success() {
        return Err(String::from("compiling uopc-tile to assembly failed"));
    }
    let deps = target_dir.join("release").join("deps");
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&deps)
        .map_err(|e| format!("{}: {e}", deps.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "s")
                && p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("uopc_tile-"))
        })
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p).ok_or_else(|| format!("no uopc_tile-*.s in {}", deps.display()))
}

/// The functions of an assembly file: demangled name and body lines.
fn split_functions(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for line in text.lines() {
        if let Some(label) = line.strip_suffix(':')
            && (label.starts_with("_R") || label.starts_with("_ZN"))
            && !label.contains(' ')
        {
            out.push((format!("{:#}", rustc_demangle::demangle(label)), Vec::new()));
        } else if let Some((_, body)) = out.last_mut() {
            body.push(line.to_string());
        }
    }
    out
}

/// The loop's multiply-adds alone, each into its own accumulator (cycling through as many as
/// the register file allows beside two sources), so only the FMA units bound them.
fn fma_stream(lp: &[String]) -> Vec<String> {
    let fmas: Vec<&String> = lp.iter().filter(|l| is_fma(l)).collect();
    let Some(first) = fmas.first() else { return Vec::new() };
    let op = first.split_whitespace().next().unwrap_or("vfmadd231ps");
    let (reg, count) = if first.contains("zmm") {
        ("zmm", 30)
    } else if first.contains("ymm") {
        ("ymm", 14)
    } else {
        ("xmm", 14)
    };
    (0..fmas.len())
        .map(|i| format!("{op} %{reg}{}, %{reg}{}, %{reg}{}", count, count + 1, i % count))
        .collect()
}

fn is_fma(line: &str) -> bool {
    let op = line.split_whitespace().next().unwrap_or("");
    op.starts_with("vfmadd") || op.starts_with("vfnmadd") || op.starts_with("vdpbf16ps")
}

/// The loop (label to backward branch) with the most multiply-adds, as instructions only.
fn innermost_fma_loop(body: &[String]) -> Option<Vec<String>> {
    let mut best: Option<Vec<String>> = None;
    for (start, line) in body.iter().enumerate() {
        let Some(label) = line.strip_suffix(':').filter(|l| l.starts_with(".L")) else { continue };
        let Some(end) = body[start..].iter().position(|l| {
            let mut w = l.split_whitespace();
            w.next().is_some_and(|op| op.starts_with('j')) && w.next() == Some(label)
        }) else {
            continue;
        };
        let insts: Vec<String> = body[start + 1..=start + end]
            .iter()
            .map(|l| l.split('#').next().unwrap_or("").trim().to_string())
            .filter(|l| !l.is_empty() && !l.starts_with('.') && !l.ends_with(':'))
            .collect();
        let fmas = insts.iter().filter(|l| is_fma(l)).count();
        // The most multiply-adds; of loops with as many, the shortest (an outer loop holds its
        // inner loop's multiply-adds too).
        let better = best.as_ref().is_none_or(|b| {
            let best_fmas = b.iter().filter(|l| is_fma(l)).count();
            fmas > best_fmas || (fmas == best_fmas && insts.len() < b.len())
        });
        if fmas > 0 && better {
            best = Some(insts);
        }
    }
    best
}

/// Predicted cycles per iteration of `lp` on `mcpu`.
fn predict(lp: &[String], mcpu: &str) -> Result<f64, String> {
    let iterations = 200;
    let file = std::env::temp_dir().join(format!("uopc-mca-{}-{mcpu}.s", std::process::id()));
    std::fs::write(&file, lp.join("\n") + "\n").map_err(|e| e.to_string())?;
    let out = Command::new("llvm-mca")
        .args([format!("-mcpu={mcpu}"), format!("-iterations={iterations}")])
        .arg(&file)
        .output()
        .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&file);
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).lines().next().unwrap_or("error").to_string());
    }
    let total = text
        .lines()
        .find_map(|l| l.strip_prefix("Total Cycles:"))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .ok_or("no Total Cycles in llvm-mca's output")?;
    Ok(total / f64::from(iterations))
}
