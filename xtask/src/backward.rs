//! `bench backward`: the attention backward pass two ways, timed, cross-checked and with the
//! memory each holds (read from the plan and the programs, not measured).

use crate::reference;
use std::process::ExitCode;
use std::time::Instant;
use uopc::attention_backward::{RecomputeBackward, backward_unfused, recompute_memory, unfused_memory};

/// Largest accepted difference between the two gradients: both are f32 computations of the same
/// quantities (about 1e-7 apart at N = 512 in the tests); a wrong rule is off by 1e-2 or more.
const TOLERANCE: f64 = 1e-4;

fn best_of(reps: usize, mut f: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    f()?; // warm-up: plans and programs compiled, pages touched
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best * 1e3)
}

/// Runs `bench backward` for each `n` at head size `d`.
pub fn run(ns: &[usize], d: usize, reps: usize) -> ExitCode {
    println!(
        "{:<20} {:>6} {:>5} {:>10} {:>14} {:>16} {:>12}",
        "variant", "n", "d", "best ms", "temp MB", "largest temp", "max diff"
    );
    let mut failed = false;
    for &n in ns {
        let x = reference::inputs(n, d);
        let dout: Vec<f32> = x.v.iter().rev().cloned().collect();
        let mut unfused = None;
        let t_unfused = best_of(reps, || {
            unfused = Some(backward_unfused(&x.q, &x.k, &x.v, &dout, n, d).map_err(|e| e.to_string())?);
            Ok(())
        });
        let prg = match RecomputeBackward::compile(n, d) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("error: backward_recompute n={n}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let mut recompute = None;
        let t_recompute = best_of(reps, || {
            let (o, lse) = prg.forward(&x.q, &x.k, &x.v).map_err(|e| e.to_string())?;
            recompute = Some(prg.backward(&x.q, &x.k, &x.v, &o, &dout, &lse).map_err(|e| e.to_string())?);
            Ok(())
        });
        let (Ok(tu), Ok(tr), Some(a), Some(b)) = (t_unfused, t_recompute, unfused, recompute) else {
            eprintln!("error: a backward pass failed at n={n}");
            return ExitCode::FAILURE;
        };
        let diff = [(&a.dq, &b.dq), (&a.dk, &b.dk), (&a.dv, &b.dv)]
            .iter()
            .flat_map(|(u, r)| u.iter().zip(r.iter()).map(|(p, q)| (*p as f64 - *q as f64).abs()))
            .fold(0.0, f64::max);
        let mem_u = unfused_memory(n, d).ok();
        let mem_r = recompute_memory(n, d);
        for (name, t, mem) in [("backward_unfused", tu, mem_u), ("backward_recompute", tr, Some(mem_r))] {
            let (mb, largest) = mem.map_or((f64::NAN, 0), |m| (m.temp_bytes as f64 / 1e6, m.largest_temp));
            println!("{name:<20} {n:>6} {d:>5} {t:>10.2} {mb:>14.2} {largest:>16} {diff:>12.1e}");
        }
        if diff > TOLERANCE {
            eprintln!("error: n={n}: the two backward passes differ by {diff:.1e}");
            failed = true;
        }
    }
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
