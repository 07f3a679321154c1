//! Debug output: what the compiler did, printed to stderr from the plan and the run itself.
//!
//! The level comes from the [`DEBUG_ENV`] (`UOPC_DEBUG`) environment variable, read once, or
//! from [`set_debug_level`]; the name is prefixed so that a shell's unrelated `DEBUG` does
//! not turn on timings or re-runs. Each level adds to the one below:
//! 1. one line per realize (kernel count, schedule, compile and run time);
//! 2. a line per kernel: time, GFLOP/s and GB/s from the kernel's static estimates;
//! 3. an "again" column: each kernel re-run at once on the same memory (page-fault diagnosis);
//! 4. on a plan-cache miss, the plan, how often each rewrite rule fired while building it
//!    (per pass) and each kernel's loop IR;
//! 5. each kernel's Cranelift IR;
//! 6. each kernel's machine code (disassembled with `objdump` when it is installed).

use crate::plan::Plan;
use crate::report::{KernelTiming, RealizeReport};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU8, Ordering};

/// The environment variable holding the debug level (`UOPC_DEBUG=2`).
pub const DEBUG_ENV: &str = "UOPC_DEBUG";

const UNSET: u8 = u8::MAX;
static LEVEL: AtomicU8 = AtomicU8::new(UNSET);

/// The current debug level (0 = silent): [`set_debug_level`]'s, or else `UOPC_DEBUG`'s as
/// an integer (unset or unparsable means 0).
pub fn debug_level() -> u8 {
    match LEVEL.load(Ordering::Relaxed) {
        UNSET => {
            let level = std::env::var(DEBUG_ENV).ok().and_then(|v| v.trim().parse::<u8>().ok()).unwrap_or(0);
            let level = level.min(UNSET - 1);
            // Whoever stores first wins; a concurrent set_debug_level is kept.
            let _ = LEVEL.compare_exchange(UNSET, level, Ordering::Relaxed, Ordering::Relaxed);
            LEVEL.load(Ordering::Relaxed)
        }
        level => level,
    }
}

/// Sets the debug level for the rest of the process (overrides the environment).
pub fn set_debug_level(level: u8) {
    LEVEL.store(level.min(UNSET - 1), Ordering::Relaxed);
}

/// The per-kernel line of level 2 (and 3, with the re-run time).
pub fn kernel_line(k: &KernelTiming) -> String {
    let gflops = k.flops as f64 / k.seconds.max(1e-9) / 1e9;
    let gbs = k.bytes as f64 / k.seconds.max(1e-9) / 1e9;
    let mut line =
        format!("  {:<28} {:9.3} ms {:9.2} GFLOP/s {:8.2} GB/s", k.name, k.seconds * 1e3, gflops, gbs);
    if let Some(again) = k.again_seconds {
        let _ = write!(line, "   again {:8.3} ms", again * 1e3);
    }
    if !k.kind.is_empty() {
        let _ = write!(line, "   {}", k.kind);
    }
    line
}

/// The level-1 summary line of one realize.
pub fn summary_line(r: &RealizeReport) -> String {
    format!(
        "realize: {} kernels, schedule {:.1} ms, compile {:.1} ms, run {:.1} ms{}",
        r.kernels.len(),
        r.schedule_seconds * 1e3,
        r.compile_seconds * 1e3,
        r.run_seconds() * 1e3,
        if r.cache_hit { " (cached plan)" } else { "" }
    )
}

/// Level 4 and above: the plan and, per kernel, its loop IR, CLIF (5) and machine code (6).
pub(crate) fn print_plan(plan: &Plan, level: u8) {
    let mut out = format!("{plan}\n");
    for stats in &plan.rewrites {
        let _ = writeln!(out, "{stats}");
    }
    for k in &plan.kernels {
        let _ = writeln!(out, "--- {} (loop IR) ---\n{}", k.name, k.exe.loop_ir());
        if level >= 5
            && let Some(clif) = k.exe.clif()
        {
            let _ = writeln!(out, "--- {} (Cranelift IR) ---\n{clif}", k.name);
        }
        if level >= 6 {
            let _ = writeln!(out, "--- {} (machine code) ---\n{}", k.name, disassemble(k.exe.machine_code()));
        }
    }
    eprint!("{out}");
}

/// The code as `objdump` disassembles it, or as hex bytes when objdump is not installed.
fn disassemble(code: &[u8]) -> String {
    if code.is_empty() {
        return "(no machine code: interpreted)".into();
    }
    let path =
        std::env::temp_dir().join(format!("uopc-kernel-{}-{:p}.bin", std::process::id(), code.as_ptr()));
    if std::fs::write(&path, code).is_ok() {
        let out = std::process::Command::new("objdump")
            .args(["-D", "-b", "binary", "-m", "i386:x86-64"])
            .arg(&path)
            .output();
        let _ = std::fs::remove_file(&path);
        if let Ok(o) = out
            && o.status.success()
        {
            return String::from_utf8_lossy(&o.stdout).into_owned();
        }
    }
    code.chunks(16)
        .map(|c| c.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}
