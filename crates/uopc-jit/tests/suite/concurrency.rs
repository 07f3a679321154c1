//! `Program` is Send + Sync: one program run from many threads at once, many programs compiled
//! at once, and runs from inside rayon pools (which must not deadlock on the JIT's own pool).

use rayon::prelude::*;
use std::sync::Arc;
use uopc_ir::*;
use uopc_jit::{Arg, Program};

/// out[i] = sum_j m[i*n + j] * x[j] + i: threaded rows, a reduction per row.
fn matvec(rows: usize, n: usize) -> UOp {
    let m = buffer(0, DType::F32, rows * n);
    let x = buffer(1, DType::F32, n);
    let out = buffer(2, DType::F32, rows);
    let acc = alloc(0, DType::F32, 1);
    let i = range(rows, 0, AxisType::Thread);
    let j = range(n, 1, AxisType::Reduce);
    let acc_i = acc.after(std::slice::from_ref(&i));
    let init = acc_i.index(0).store(i.cast(DType::F32));
    let acc_j = acc_i.after(&[init, j.clone()]);
    let upd = acc_j.index(0).store(acc_j.index(0).load() + m.index(&i * n + &j).load() * x.index(&j).load());
    let st = out.index(&i).store(acc_i.after(&[upd.end(&[j])]).index(0).load());
    sink(&[st.end(&[i])])
}

/// Small integers: every sum is exact, so results can be compared with `==`.
fn data(rows: usize, n: usize, salt: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let m: Vec<f32> = (0..rows * n).map(|k| ((k * 7 + salt) % 5) as f32 - 2.0).collect();
    let x: Vec<f32> = (0..n).map(|k| ((k + salt) % 3) as f32).collect();
    let want: Vec<f32> =
        (0..rows).map(|i| i as f32 + (0..n).map(|j| m[i * n + j] * x[j]).sum::<f32>()).collect();
    (m, x, want)
}

fn run_matvec(prg: &Program, m: &[f32], x: &[f32], rows: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; rows];
    prg.run(&mut [Arg::from(m), Arg::from(x), Arg::from(&mut out[..])]).unwrap();
    out
}

#[test]
fn one_program_runs_from_eight_threads_at_once() {
    let (rows, n) = (64, 37);
    let prg = Arc::new(Program::compile(&matvec(rows, n), "matvec").unwrap());
    assert!(prg.is_parallel());
    // Too little work to wake the pool: each run takes its rows on its own thread.
    assert!(!prg.spreads_over_pool());
    std::thread::scope(|s| {
        for t in 0..8 {
            let prg = prg.clone();
            s.spawn(move || {
                for k in 0..1000 {
                    let (m, x, want) = data(rows, n, t * 1000 + k % 7);
                    assert_eq!(run_matvec(&prg, &m, &x, rows), want, "thread {t} run {k}");
                }
            });
        }
    });
}

/// A THREAD range whose iterations may run at once spreads over the pool only with work enough
/// to pay for waking it; either way it computes the same values.
#[test]
fn small_kernels_run_on_the_calling_thread() {
    for (rows, n, spreads) in [(8, 8, false), (64, 37, false), (1024, 64, true)] {
        let prg = Program::compile(&matvec(rows, n), "matvec").unwrap();
        let e = prg.estimates();
        assert!(prg.is_parallel());
        let worth =
            e.flops >= uopc_jit::PARALLEL_MIN_FLOPS || e.access_bytes >= uopc_jit::PARALLEL_MIN_ACCESS_BYTES;
        assert_eq!(prg.spreads_over_pool(), spreads, "{rows} x {n}: {e:?}");
        assert_eq!(worth, spreads);
        let (m, x, want) = data(rows, n, 1);
        assert_eq!(run_matvec(&prg, &m, &x, rows), want);
    }
}

#[test]
fn different_programs_compile_concurrently() {
    std::thread::scope(|s| {
        for t in 0..8usize {
            s.spawn(move || {
                for k in 0..12 {
                    let (rows, n) = (3 + (t + k) % 9, 4 + (t * 5 + k) % 11);
                    let prg = Program::compile(&matvec(rows, n), "matvec").unwrap();
                    let (m, x, want) = data(rows, n, t + k);
                    assert_eq!(run_matvec(&prg, &m, &x, rows), want, "thread {t} program {k}");
                }
            });
        }
    });
}

#[test]
fn runs_inside_a_rayon_pool_do_not_deadlock() {
    // Large enough that each run spreads over the pool it is called from.
    let (rows, n) = (256, 256);
    let prg = Program::compile(&matvec(rows, n), "matvec").unwrap();
    assert!(prg.spreads_over_pool());
    let (m, x, want) = data(rows, n, 3);
    // A small pool whose every worker blocks in `run`, which itself fans out over rayon.
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    pool.install(|| assert_eq!(run_matvec(&prg, &m, &x, rows), want));
    let results: Vec<Vec<f32>> =
        pool.install(|| (0..64).into_par_iter().map(|_| run_matvec(&prg, &m, &x, rows)).collect());
    assert!(results.iter().all(|r| *r == want));
    // And from the global pool, nested in par_iter.
    let ok = (0..64).into_par_iter().all(|_| run_matvec(&prg, &m, &x, rows) == want);
    assert!(ok);
    // Compiling inside pool tasks too.
    let compiled: Vec<bool> = pool.install(|| {
        (0..8)
            .into_par_iter()
            .map(|k| {
                let prg = Program::compile(&matvec(5 + k, 7), "inner").unwrap();
                let (m, x, want) = data(5 + k, 7, k);
                run_matvec(&prg, &m, &x, 5 + k) == want
            })
            .collect()
    });
    assert!(compiled.iter().all(|&b| b));
}
