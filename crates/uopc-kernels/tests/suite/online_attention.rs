//! The hand-written online-softmax kernel against an f64 reference.

use uopc_ir::{Linear, Op, Stmt, verify};
use uopc_jit::Program;
use uopc_kernels::online::online_attention_ir;
use uopc_testgen::rng::uniform_values as pseudo_random;

use uopc_kernels::reference::{attention_f64, max_abs_err};

fn run_online(q: &[f32], k: &[f32], v: &[f32], n: usize, d: usize) -> Vec<f32> {
    let prg = Program::compile(&online_attention_ir(n, d), "online").expect("online kernel compiles");
    let mut out = vec![0.0f32; n * d];
    prg.run_f32(&[q, k, v], &mut [&mut out]).expect("runs");
    out
}

// Outputs are convex combinations of V rows (|v| < 1); f32 accumulation over n keys with
// exp2's ~1e-7 relative error stays far below 1e-5 at these sizes.
const TOL: f64 = 1e-5;

#[test]
fn online_attention_matches_f64_for_many_shapes() {
    let shapes =
        [(1, 1), (1, 64), (3, 1), (7, 5), (17, 13), (33, 64), (64, 3), (100, 128), (257, 4), (1024, 64)];
    for (n, d) in shapes {
        let (q, k, v) = (pseudo_random(n * d, 1), pseudo_random(n * d, 2), pseudo_random(n * d, 3));
        let err = max_abs_err(&run_online(&q, &k, &v, n, d), &attention_f64(&q, &k, &v, n, d));
        assert!(err <= TOL, "n={n} d={d}: max abs err {err:e}");
    }
}

#[test]
fn online_attention_rescales_output_when_the_max_arrives_late() {
    // Scores grow along the keys, so the running max changes at every key and the largest
    // score is on the last key: an o that is not rescaled overweights early keys.
    let (n, d) = (64, 8);
    let q = vec![1.0f32; n * d];
    let k: Vec<f32> = (0..n * d).map(|x| ((x / d) as f32) * 0.25).collect();
    let v = pseudo_random(n * d, 9);
    let err = max_abs_err(&run_online(&q, &k, &v, n, d), &attention_f64(&q, &k, &v, n, d));
    assert!(err <= TOL, "late max: {err:e}");
}

#[test]
fn online_attention_survives_scores_that_overflow_without_max_subtraction() {
    // Scores around 400: exp(400) overflows f32 (and exp2(400*log2 e) too) unless the
    // running max is subtracted first.
    let (n, d) = (32, 16);
    let q: Vec<f32> = pseudo_random(n * d, 4).iter().map(|x| x * 10.0).collect();
    let k: Vec<f32> = pseudo_random(n * d, 5).iter().map(|x| x * 40.0 + 40.0).collect();
    let v = pseudo_random(n * d, 6);
    let out = run_online(&q, &k, &v, n, d);
    assert!(out.iter().all(|x| x.is_finite()));
    let err = max_abs_err(&out, &attention_f64(&q, &k, &v, n, d));
    assert!(err <= TOL, "large scores: {err:e}");
}

#[test]
fn online_running_state_is_declared_inside_the_thread_loop() {
    let lin: Linear = verify(&online_attention_ir(16, 8)).expect("well formed");
    assert_eq!(
        lin.root.iter().filter(|s| matches!(s, Stmt::Loop { .. })).count(),
        1,
        "one THREAD loop at top level"
    );
    let Some(Stmt::Loop { range, body }) = lin.root.iter().find(|s| matches!(s, Stmt::Loop { .. })) else {
        panic!("no loop")
    };
    assert!(matches!(range.op(), Op::Range { axis: uopc_ir::AxisType::Thread, .. }));
    // The inits of m (slot 0) and l (slot 1) are statements directly in the THREAD loop body.
    let init_of = |slot: usize| {
        body.iter().any(|s| match s {
            Stmt::Op(u) => {
                matches!(u.as_store().and_then(|st| st.index.indexed_base()).map(|b| b.op().clone()), Some(Op::Alloc { slot: s2, .. }) if s2.index() == slot)
            }
            _ => false,
        })
    };
    assert!(init_of(0) && init_of(1), "running max and sum are initialised once per query row");
    // No store to any ALLOC happens outside the THREAD loop.
    assert!(lin.root.iter().all(|s| !matches!(s, Stmt::Op(u) if matches!(u.op(), Op::Store))));
    let prg = Program::compile(&online_attention_ir(16, 8), "online").unwrap();
    assert!(prg.is_parallel(), "query rows write disjoint output rows");
}

fn run_program(p: &uopc_ir::UOp, q: &[f32], k: &[f32], v: &[f32], n: usize, d: usize) -> Vec<f32> {
    let prg = Program::compile(p, "variant").expect("compiles");
    assert!(prg.is_parallel(), "query blocks write disjoint rows");
    let mut out = vec![0.0f32; n * d];
    prg.run_f32(&[q, k, v], &mut [&mut out]).expect("runs");
    out
}

#[test]
fn query_blocked_online_attention_matches_f64() {
    use uopc_kernels::online::online_attention_qb_ir;
    use uopc_kernels::query_block;
    assert_eq!(query_block(1024, 4), 4);
    assert_eq!(query_block(6, 4), 3);
    assert_eq!(query_block(7, 4), 1);
    for (n, d, qb) in [(1, 1, 4), (7, 5, 4), (12, 3, 4), (64, 64, 4), (30, 13, 8), (256, 128, 4)] {
        let (q, k, v) = (pseudo_random(n * d, 11), pseudo_random(n * d, 12), pseudo_random(n * d, 13));
        let out = run_program(&online_attention_qb_ir(n, d, qb), &q, &k, &v, n, d);
        let err = max_abs_err(&out, &attention_f64(&q, &k, &v, n, d));
        assert!(err <= TOL, "n={n} d={d} qb={qb}: {err:e}");
    }
}

#[test]
fn online_kernels_vectorize_their_head_dimension_loops() {
    use uopc_kernels::online::online_attention_qb_ir;
    for p in [online_attention_ir(64, 64), online_attention_qb_ir(64, 64, 4)] {
        let prg = Program::compile(&p, "online").unwrap();
        // Vectorization and the inline exp2 are decided while lowering to Cranelift: the loop
        // IR is scalar, so only the CLIF shows them.
        let clif = prg.clif();
        assert!(clif.contains("f32x4") && clif.contains("fma"), "F32X4 FMAs in the generated code");
        assert!(!clif.contains("call"), "exp2 is inline: no calls");
    }
}
