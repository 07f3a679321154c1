//! The attention backward pass: the recompute loop programs against autograd of the unfused
//! Tensor graph (run in f64 as the reference, and in f32 as the bench's `backward_unfused`),
//! against plain f64 loops, and structurally (buffer sizes, parallelism) at N = 4096.

use uopc_ir::{AxisType, Op, Stmt, verify};
use uopc_jit::Program;
use uopc_kernels::backward::*;
use uopc_tensor::{RealizeOptions, Tensor, realize};
use uopc_testgen::rng::uniform_values as pseudo_random;

struct Case {
    n: usize,
    d: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    dout: Vec<f32>,
}

/// Random inputs; `sharp` scales Q and K so the softmax rows are peaked, not near uniform.
fn case(n: usize, d: usize, sharp: f32, seed: u64) -> Case {
    let scaled = |s| pseudo_random(n * d, s).iter().map(|x| x * sharp).collect::<Vec<f32>>();
    Case {
        n,
        d,
        q: scaled(seed),
        k: scaled(seed + 1),
        v: pseudo_random(n * d, seed + 2),
        dout: pseudo_random(n * d, seed + 3),
    }
}

/// Softmax attention's forward and backward in f64 with plain loops:
/// `(O, natural log-sum-exp, dQ, dK, dV)`.
#[allow(clippy::type_complexity)]
fn reference_f64(c: &Case) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let (n, d) = (c.n, c.d);
    let f = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
    let (q, k, v, g) = (f(&c.q), f(&c.k), f(&c.v), f(&c.dout));
    let scale = 1.0 / (d as f64).sqrt();
    let dot =
        |a: &[f64], i: usize, b: &[f64], j: usize| (0..d).map(|e| a[i * d + e] * b[j * d + e]).sum::<f64>();
    let (mut o, mut lse) = (vec![0.0; n * d], vec![0.0; n]);
    let (mut dq, mut dk, mut dv) = (vec![0.0; n * d], vec![0.0; n * d], vec![0.0; n * d]);
    for i in 0..n {
        let s: Vec<f64> = (0..n).map(|j| dot(&q, i, &k, j) * scale).collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let l: f64 = s.iter().map(|x| (x - m).exp()).sum();
        lse[i] = m + l.ln();
        let p: Vec<f64> = s.iter().map(|x| (x - lse[i]).exp()).collect();
        for j in 0..n {
            for e in 0..d {
                o[i * d + e] += p[j] * v[j * d + e];
            }
        }
        let dp: Vec<f64> = (0..n).map(|j| dot(&g, i, &v, j)).collect();
        let delta: f64 = (0..n).map(|j| p[j] * dp[j]).sum();
        for j in 0..n {
            let ds = p[j] * (dp[j] - delta);
            for e in 0..d {
                dq[i * d + e] += ds * k[j * d + e] * scale;
                dk[j * d + e] += ds * q[i * d + e] * scale;
                dv[j * d + e] += p[j] * g[i * d + e];
            }
        }
    }
    (o, lse, dq, dk, dv)
}

/// Autograd of the unfused Tensor one-liner, run in f64: `[dQ, dK, dV]`.
fn autograd_f64(c: &Case) -> Vec<Vec<f64>> {
    let t = |x: &[f32]| Tensor::from_vec(x.iter().map(|&v| v as f64).collect::<Vec<f64>>(), &[c.n, c.d]);
    let grads = unfused_gradients(&t(&c.q), &t(&c.k), &t(&c.v), &t(&c.dout)).expect("gradients build");
    let (got, _) = realize(&grads.iter().collect::<Vec<_>>(), &RealizeOptions::default()).expect("realizes");
    got.iter().map(|g| g.to_ndarray::<f64>().expect("f64").into_raw_vec_and_offset().0).collect()
}

fn max_abs(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (*x as f64 - y).abs()).fold(0.0, f64::max)
}

fn max_abs64(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

/// Max abs errors of (dQ, dK, dV).
fn errs(g: &AttentionGrads, want: &[Vec<f64>]) -> [f64; 3] {
    [max_abs(&g.dq, &want[0]), max_abs(&g.dk, &want[1]), max_abs(&g.dv, &want[2])]
}

// Gradients here are O(1) sums of n products of O(1) f32 values; f32 accumulation over a few
// hundred terms plus exp2's ~1e-7 relative error stays around 1e-6, so 1e-4 (the bar)
// has a wide margin while any wrong term (a missing Delta, an unscaled dK) is O(0.1).
const TOL: f64 = 1e-4;

#[test]
fn forward_writes_output_and_base2_log_sum_exp() {
    for (n, d) in [(1, 1), (7, 5), (33, 16), (64, 3)] {
        let c = case(n, d, 2.0, 10 + n as u64);
        let r = RecomputeBackward::compile(n, d).expect("compiles");
        let (o, lse) = r.forward(&c.q, &c.k, &c.v).expect("runs");
        let (o_ref, lse_ref, ..) = reference_f64(&c);
        assert!(max_abs(&o, &o_ref) <= 1e-5, "n={n} d={d}: O err {}", max_abs(&o, &o_ref));
        let lse2: Vec<f64> = lse_ref.iter().map(|x| x * std::f64::consts::LOG2_E).collect();
        assert!(max_abs(&lse, &lse2) <= 1e-5, "n={n} d={d}: LSE err {}", max_abs(&lse, &lse2));
    }
}

#[test]
fn autograd_of_the_unfused_graph_matches_plain_f64_loops() {
    for (n, d) in [(1, 1), (7, 5), (33, 16)] {
        let c = case(n, d, 2.0, 20);
        let (.., dq, dk, dv) = reference_f64(&c);
        let got = autograd_f64(&c);
        for (g, w) in got.iter().zip([&dq, &dk, &dv]) {
            // both f64; only the f32-rounded scale constants of the Tensor graph differ
            assert!(max_abs64(g, w) <= 1e-6, "n={n} d={d}: autograd vs loops {}", max_abs64(g, w));
        }
    }
}

#[test]
fn recompute_matches_autograd_for_odd_shapes() {
    for n in [1, 7, 33] {
        for d in [1, 5, 16] {
            for sharp in [1.0, 3.0] {
                let c = case(n, d, sharp, 100 + (n * d) as u64);
                let g = backward_recompute(&c.q, &c.k, &c.v, &c.dout, n, d).expect("recompute runs");
                let e = errs(&g, &autograd_f64(&c));
                assert!(e.iter().all(|&x| x <= TOL), "n={n} d={d} sharp={sharp}: dQ, dK, dV errors {e:?}");
                // the bench's f32 unfused variant agrees too
                let u = backward_unfused(&c.q, &c.k, &c.v, &c.dout, n, d).expect("unfused runs");
                let (.., dq, dk, dv) = reference_f64(&c);
                let eu = errs(&u, &[dq, dk, dv]);
                assert!(eu.iter().all(|&x| x <= TOL), "n={n} d={d}: unfused f32 errors {eu:?}");
            }
        }
    }
}

#[test]
fn recompute_matches_autograd_at_512_by_64() {
    let (n, d) = (512, 64);
    let c = case(n, d, 2.0, 7);
    let g = backward_recompute(&c.q, &c.k, &c.v, &c.dout, n, d).expect("recompute runs");
    let want = autograd_f64(&c);
    let e = errs(&g, &want);
    let u = backward_unfused(&c.q, &c.k, &c.v, &c.dout, n, d).expect("unfused runs");
    let eu = errs(&u, &want);
    eprintln!("N=512 D=64 recompute vs f64 autograd: dQ {:.2e} dK {:.2e} dV {:.2e}", e[0], e[1], e[2]);
    eprintln!(
        "N=512 D=64 unfused f32 autograd vs f64 autograd: dQ {:.2e} dK {:.2e} dV {:.2e}",
        eu[0], eu[1], eu[2]
    );
    assert!(e.iter().all(|&x| x <= TOL), "recompute errors {e:?}");
    assert!(eu.iter().all(|&x| x <= TOL), "unfused f32 errors {eu:?}");
    // the gradients are not trivially small: the errors above are meaningful
    let biggest = want.iter().flatten().fold(0.0f64, |m, x| m.max(x.abs()));
    assert!(biggest > 0.1, "largest gradient {biggest}");

    // informational timings (compiled programs and a cached plan; nothing asserted)
    let r = RecomputeBackward::compile(n, d).expect("compiles");
    let (o, lse) = r.forward(&c.q, &c.k, &c.v).expect("forward runs");
    let t = std::time::Instant::now();
    r.backward(&c.q, &c.k, &c.v, &o, &c.dout, &lse).expect("backward runs");
    let rec = t.elapsed().as_secs_f64();
    let t = std::time::Instant::now();
    backward_unfused(&c.q, &c.k, &c.v, &c.dout, n, d).expect("unfused runs");
    let unf = t.elapsed().as_secs_f64();
    eprintln!(
        "N=512 D=64 backward: recompute {:.2} ms, unfused (cached plan) {:.2} ms",
        rec * 1e3,
        unf * 1e3
    );
}

#[test]
fn recompute_programs_are_parallel_and_keep_scratch_per_thread() {
    let names = ["forward", "dq", "dkdv"];
    for (prog, name) in recompute_programs(64, 16).iter().zip(names) {
        let lin = verify(prog).expect("well formed");
        // one THREAD loop at top level holds everything; every store to an ALLOC is inside it
        let loops: Vec<&Stmt> = lin.root.iter().filter(|s| matches!(s, Stmt::Loop { .. })).collect();
        assert_eq!(loops.len(), 1, "{name}");
        let Stmt::Loop { range, .. } = loops[0] else { unreachable!() };
        assert!(matches!(range.op(), Op::Range { axis: AxisType::Thread, .. }), "{name}");
        assert!(lin.root.iter().all(|s| !matches!(s, Stmt::Op(u) if matches!(u.op(), Op::Store))), "{name}");
        let prg = Program::compile(prog, name).expect("compiles");
        assert!(prg.is_parallel(), "{name}: THREAD iterations must provably write disjoint rows");
    }
    // the dQ program writes dQ and Delta; dK/dV reads Delta
    let [_, dq, dkdv] = recompute_programs(8, 4);
    let written = |p: &uopc_ir::UOp| -> Vec<usize> {
        let mut v: Vec<usize> = uopc_ir::UOp::toposort(std::slice::from_ref(p))
            .iter()
            .filter_map(|st| match st.as_store()?.index.indexed_base()?.op() {
                Op::Buffer { slot, .. } => Some(slot.index()),
                _ => None,
            })
            .collect();
        v.sort();
        v.dedup();
        v
    };
    assert_eq!(written(&dq), [6, 7]);
    assert_eq!(written(&dkdv), [6, 7]);
}

#[test]
fn at_4096_recompute_holds_only_n_by_d_while_unfused_holds_n_by_n() {
    let (n, d) = (4096, 64);
    // recompute: every BUFFER and ALLOC of its programs, read from the programs
    for p in recompute_programs(n, d) {
        for (u, len) in program_storage(&p) {
            assert!(len <= n * d, "{} holds {len} elements", u.short());
        }
    }
    let r = recompute_memory(n, d);
    assert!(r.largest_any <= n * d && r.largest_temp <= n * d, "{r:?}");
    // O (n*d) + LSE (n) + Delta (n) + per-thread scratch: a few d-vectors
    assert_eq!(r.largest_temp, n * d);
    assert!(r.temp_bytes <= 4 * (n * d + 2 * n + 8 * d), "{r:?}");
    // unfused: the plan of autograd of the one-liner, built but not run
    let plan = unfused_backward_plan(n, d).expect("plans");
    let u = plan_memory(&plan);
    assert!(plan.temps.iter().any(|&(_, len)| len >= n * n), "no N x N temporary in {plan}");
    assert!(u.largest_temp >= n * n);
    eprintln!(
        "N=4096 D=64 recompute: temporaries {} bytes, largest {} elements",
        r.temp_bytes, r.largest_temp
    );
    eprintln!(
        "N=4096 D=64 unfused: {} temporaries, {} bytes, largest {} elements, {} temps of N*N or more",
        plan.temps.len(),
        u.temp_bytes,
        u.largest_temp,
        plan.temps.iter().filter(|t| t.1 >= n * n).count()
    );
}
