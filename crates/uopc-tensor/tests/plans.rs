//! Structural tests: plans, loop nests and static costs, read from the plan and the lowered
//! loop programs (nothing here needs the kernels to run).

use std::sync::Arc;
use uopc_ir::{Op, Stmt, UOp, linearize};
use uopc_tensor::attention::attention;
use uopc_tensor::*;

fn qkv(n: usize, d: usize) -> (Tensor, Tensor, Tensor) {
    let mk = |s: usize| {
        let data: Vec<f32> = (0..n * d).map(|i| ((i * 7 + s * 3) % 13) as f32 / 13.0 - 0.5).collect();
        Tensor::from_vec(data, &[n, d])
    };
    (mk(1), mk(2), mk(3))
}

fn attention_plan(n: usize, d: usize, opts: &RealizeOptions) -> Arc<Plan> {
    let (q, k, v) = qkv(n, d);
    make_plan(&[attention(&q, &k, &v).uop().clone()], opts).expect("attention plans")
}

fn unsimplified(o: RealizeOptions) -> RealizeOptions {
    o.with_experiments(Experiments {
        reshape_without_divmod_folding: true,
        no_online_reductions: true,
        ..Experiments::default()
    })
}

/// Fully fused, with the softmax sums left as written: each waits for the row maximum, the
/// chapter's fused form.
fn written_fused() -> RealizeOptions {
    RealizeOptions::fused()
        .with_experiments(Experiments { no_online_reductions: true, ..Experiments::default() })
}

/// Every statement with the product of the trip counts of the loops around it (the THREAD
/// loop included) and its loop depth.
fn weighted(program: &UOp) -> Vec<(UOp, u64, usize)> {
    fn go(body: &[Stmt], mult: u64, depth: usize, out: &mut Vec<(UOp, u64, usize)>) {
        for s in body {
            match s {
                Stmt::Loop { range, body } => {
                    let trip =
                        range.as_range().and_then(|r| r.end.const_int()).expect("constant trip count") as u64;
                    go(body, mult * trip, depth + 1, out);
                }
                Stmt::Op(u) => out.push((u.clone(), mult, depth)),
            }
        }
    }
    let lin = linearize(program).expect("program linearizes");
    let mut out = Vec::new();
    go(&lin.root, 1, 0, &mut out);
    out
}

/// `(init value, loop depth)` of every accumulator initialisation: a STORE of a constant into
/// an ALLOC.
fn acc_inits(program: &UOp) -> Vec<(f64, usize)> {
    weighted(program)
        .into_iter()
        .filter_map(|(u, _, depth)| {
            let store = u.as_store()?;
            let base = store.index.indexed_base()?;
            let c = store.value.const_value()?;
            matches!(base.op(), Op::Alloc { .. }).then(|| (c.as_f64(), depth))
        })
        .collect()
}

/// How many q.k products the plan executes in total (q and k are inputs 0 and 1).
fn qk_products(plan: &Plan) -> u64 {
    input_products(plan, 0, 1).expect("programs linearize")
}

fn plan_flops(plan: &Plan) -> u64 {
    plan.kernels.iter().map(|k| static_flops(&k.program).expect("linearizes")).sum()
}

#[test]
fn unfused_attention_plan_with_the_4x4_tile_transposes_v() {
    let tile_4x4 = RealizeOptions::default().with_opt(Experiments::tile_4x4_opt());
    let plan = attention_plan(1024, 64, &tile_4x4);
    assert_eq!(
        plan.kernel_names(),
        ["r_1024_1024", "r_1024", "r_1024", "e_1024_1024", "e_1_64_1024", "r_1024_64"]
    );
    assert_eq!(plan.temp_sizes(), [1048576, 1024, 1024, 1048576, 65536]);
    assert_eq!(plan.outputs, [(uopc_ir::DType::F32, 65536)]);
    assert_eq!(plan.outs, [OutSpec::Output(0)]);
}

#[test]
fn register_tiled_unfused_plan_transposes_k_instead_of_v() {
    // Register tiles pack neighbouring output columns: Q K^T wants K^T contiguous along the
    // keys (a copy), P V reads V as it is.
    let plan = attention_plan(1024, 64, &RealizeOptions::default().with_opt(DefaultOpt::loops()));
    assert_eq!(
        plan.kernel_names(),
        ["e_1_64_1024", "r_1024_1024", "r_1024", "r_1024", "e_1024_1024", "r_1024_64"]
    );
    assert_eq!(plan.temp_sizes(), [65536, 1048576, 1024, 1024, 1048576]);
    // the copy of K feeds the score kernel, the original V the last one
    assert_eq!(plan.kernels[1].args, [ArgSource::Input(0), ArgSource::Temp(0), ArgSource::Temp(1)]);
    assert!(plan.kernels[5].args.contains(&ArgSource::Input(2)), "{plan}");
}

#[test]
fn default_unfused_plan_reads_k_and_v_in_place() {
    // Both products are tile GEMMs, which read a transposed operand themselves: no copies.
    let plan = attention_plan(1024, 64, &RealizeOptions::default());
    assert_eq!(plan.kernel_names(), ["r_1024_1024", "r_1024", "r_1024", "e_1024_1024", "r_1024_64"]);
    assert_eq!(plan.temp_sizes(), [1048576, 1024, 1024, 1048576]);
    assert_eq!(plan.kernels[0].args, [ArgSource::Input(0), ArgSource::Input(1), ArgSource::Temp(0)]);
    let tile_kernels: Vec<usize> = (0..5).filter(|&i| plan.kernels[i].uses_tile_ops()).collect();
    assert_eq!(tile_kernels, [0, 4], "{plan}");
}

#[test]
fn fused_attention_plan_is_one_kernel_reading_its_inputs_in_place() {
    let plan = attention_plan(1024, 64, &RealizeOptions::fused());
    assert_eq!(plan.kernel_names(), ["r_1024_64"]);
    assert!(plan.temp_sizes().is_empty(), "{plan}");
    let args = [ArgSource::Input(0), ArgSource::Input(1), ArgSource::Input(2), ArgSource::Output(0)];
    assert_eq!(plan.kernels[0].args, args);
}

#[test]
fn written_fused_attention_plan_is_a_copy_of_v_and_one_kernel() {
    let plan = attention_plan(1024, 64, &written_fused());
    assert_eq!(plan.kernel_names(), ["e_1_64_1024", "r_1024_64"]);
    assert_eq!(plan.temp_sizes(), [65536]);
    // the only temporary is the transposed copy of V, read by the fused kernel
    assert_eq!(
        plan.kernels[1].args,
        [ArgSource::Input(0), ArgSource::Input(1), ArgSource::Temp(0), ArgSource::Output(0)]
    );
}

#[test]
fn fuse_reduce_skips_broadcast_staging() {
    // without the skip, P (broadcast 64x into P V) would be staged: an N x N temporary
    let plan = attention_plan(256, 64, &RealizeOptions::fused());
    assert!(plan.temp_sizes().iter().all(|&n| n < 256 * 256), "{plan}");
}

/// The row max (init -inf) and the row sum (init 0) of the fused kernel are initialised once
/// per query row: at depth 1, directly inside the THREAD loop. The 16 P V accumulators of an
/// output group sit one loop deeper.
fn assert_row_accumulators_once_per_row(plan: &Plan) -> std::result::Result<(), String> {
    let kernel = plan.kernels.last().expect("fused kernel");
    let lin = linearize(&kernel.program).expect("linearizes");
    let thread = lin.thread.as_ref().ok_or("no THREAD range")?;
    let top: Vec<&UOp> = lin
        .root
        .iter()
        .filter_map(|s| if let Stmt::Loop { range, .. } = s { Some(range) } else { None })
        .collect();
    if top != [thread] {
        return Err("the THREAD loop is not the only top-level loop".into());
    }
    let inits = acc_inits(&kernel.program);
    let max_inits: Vec<usize> = inits.iter().filter(|(v, _)| *v == f64::NEG_INFINITY).map(|i| i.1).collect();
    let row_inits: Vec<f64> = inits.iter().filter(|(_, d)| *d == 1).map(|i| i.0).collect();
    if max_inits != [1] || row_inits.len() != 2 || !row_inits.contains(&0.0) {
        return Err(format!("max inits at depths {max_inits:?}, inits at depth 1: {row_inits:?}"));
    }
    Ok(())
}

#[test]
fn fused_row_max_and_sum_are_initialised_once_per_row() {
    let plan = attention_plan(512, 64, &written_fused());
    assert_row_accumulators_once_per_row(&plan).unwrap();
}

#[test]
fn fused_flops_grow_as_n_squared() {
    let f256 = plan_flops(&attention_plan(256, 64, &RealizeOptions::fused()));
    let f512 = plan_flops(&attention_plan(512, 64, &RealizeOptions::fused()));
    let ratio = f512 as f64 / f256 as f64;
    assert!((3.8..4.2).contains(&ratio), "N 256 -> 512 multiplies FLOPs by {ratio}, expected ~4");
}

#[test]
fn flash_opt_computes_each_qk_six_times_per_row() {
    let (n, d) = (256, 64);
    let plan = attention_plan(n, d, &written_fused());
    let per_pair = qk_products(&plan) as f64 / (n * n * d) as f64;
    // two softmax passes (max, sum) plus 64/16 = 4 output passes
    assert_eq!(per_pair, 6.0);
}

#[test]
fn online_sums_compute_each_qk_once() {
    for (n, d) in [(256, 64), (64, 128), (64, 256), (100, 24), (1024, 128)] {
        // on tile ops: per block of keys, one score tile GEMM
        let plan = attention_plan(n, d, &RealizeOptions::fused());
        assert!(plan.kernels[0].uses_tile_ops(), "{plan}");
        let per_pair = qk_products(&plan) as f64 / (n * n * d) as f64;
        assert_eq!(per_pair, 1.0, "n {n}, d {d}");
        // as loops: the maximum, the normalizer and every output column share one pass
        let whole_head = Opts { upcast: vec![(1, d)], thread: Some(0), ..Opts::default() };
        let loops = attention_plan(n, d, &RealizeOptions::fused().with_opt(FixedOpts(whole_head)));
        assert!(!loops.kernels[0].uses_tile_ops(), "{loops}");
        let per_pair = qk_products(&loops) as f64 / (n * n * d) as f64;
        assert_eq!(per_pair, 1.0, "n {n}, d {d}, loops");
    }
}

#[test]
fn without_reshape_simplification_the_fused_kernel_is_cubic() {
    // The same checks fail when RESHAPE indices are not simplified: they can catch the bug.
    let bad512 = attention_plan(512, 64, &unsimplified(RealizeOptions::fused()));
    assert!(assert_row_accumulators_once_per_row(&bad512).is_err());
    let bad256 = attention_plan(256, 64, &unsimplified(RealizeOptions::fused()));
    let ratio = plan_flops(&bad512) as f64 / plan_flops(&bad256) as f64;
    assert!(ratio > 7.0, "the unsimplified plan should be cubic, ratio {ratio}");
    let per_pair = qk_products(&bad256) as f64 / (256.0 * 256.0 * 64.0);
    assert!(per_pair > 6.0 * 100.0, "q.k computed {per_pair} times per pair");
}

#[test]
fn gemm_register_tile_shares_one_reduce_loop() {
    let a = Tensor::from_vec(vec![1.0f32; 64 * 32], &[64, 32]);
    let b = Tensor::from_vec(vec![1.0f32; 32 * 48], &[32, 48]);
    let tile_4x4 = RealizeOptions::default().with_opt(Experiments::tile_4x4_opt());
    let plan = make_plan(&[a.matmul(&b).uop().clone()], &tile_4x4).unwrap();
    // b is read down its columns: the layout pass copies it transposed first
    assert_eq!(plan.kernel_names(), ["e_1_48_32", "r_64_48"]);
    let lin = linearize(&plan.kernels[1].program).unwrap();
    let loops: Vec<usize> =
        lin.walk().iter().filter_map(|(d, s)| matches!(s, Stmt::Loop { .. }).then_some(*d)).collect();
    // thread (64/4), loop (48/4), and ONE reduce loop shared by the 16 accumulators
    assert_eq!(loops, [0, 1, 2]);
    assert_eq!(lin.allocs.len(), 16);
    assert_eq!(acc_inits(&plan.kernels[1].program).iter().filter(|i| i.1 == 2).count(), 16);
    // the default loop tile is 4x8 and reads b in place (contiguous along the output
    // columns): 32 accumulators, still one shared reduce loop
    let loops = RealizeOptions::default().with_opt(DefaultOpt::loops());
    let plan = make_plan(&[a.matmul(&b).uop().clone()], &loops).unwrap();
    assert_eq!(plan.kernel_names(), ["r_64_48"]);
    assert!(!plan.kernels[0].uses_tile_ops());
    let lin = linearize(&plan.kernels[0].program).unwrap();
    assert_eq!(lin.allocs.len(), 32);
    assert_eq!(lin.walk().iter().filter(|(_, s)| matches!(s, Stmt::Loop { .. })).count(), 3);
}

#[test]
fn gemm_shaped_kernels_become_tile_gemms() {
    let a = Tensor::from_vec((0..64 * 32).map(|i| (i % 7) as f32).collect::<Vec<f32>>(), &[64, 32]);
    let b = Tensor::from_vec((0..32 * 48).map(|i| (i % 5) as f32).collect::<Vec<f32>>(), &[32, 48]);
    let plan = make_plan(&[a.matmul(&b).uop().clone()], &RealizeOptions::default()).unwrap();
    assert_eq!(plan.kernel_names(), ["r_64_48"]);
    assert!(plan.kernels[0].uses_tile_ops(), "{}", plan.kernels[0].program.short());
    // one tile GEMM inside the THREAD loop, no reduce loop at all
    let lin = linearize(&plan.kernels[0].program).unwrap();
    assert_eq!(lin.walk().iter().filter(|(_, s)| matches!(s, Stmt::Loop { .. })).count(), 1);
    // the same numbers as the loop nest (small integers: exact in any order)
    let tiles = a.matmul(&b).realize().unwrap().to_ndarray::<f32>().unwrap();
    let loops = RealizeOptions::default().with_opt(DefaultOpt::loops());
    let (looped, _) = a.matmul(&b).realize_with(&loops).unwrap();
    assert_eq!(tiles, looped.to_ndarray::<f32>().unwrap());
    // both unfused attention GEMMs map; the softmax kernels stay loops
    let plan = attention_plan(1024, 64, &RealizeOptions::default());
    let mapped: Vec<&str> =
        plan.kernels.iter().filter(|k| k.uses_tile_ops()).map(|k| k.name.as_str()).collect();
    assert_eq!(mapped, ["r_1024_1024", "r_1024_64"]);
    // a transposed operand maps too (A read down its columns)
    let at = Tensor::from_vec((0..32 * 64).map(|i| (i % 3) as f32).collect::<Vec<f32>>(), &[32, 64]);
    let plan = make_plan(&[at.t().matmul(&b).uop().clone()], &RealizeOptions::default()).unwrap();
    assert!(plan.kernels.iter().any(|k| k.uses_tile_ops()), "{plan}");
}

#[test]
fn unroll_combines_copies_in_one_loop() {
    let a = Tensor::from_vec((0..8 * 32).map(|i| i as f32).collect::<Vec<f32>>(), &[8, 32]);
    let opts = RealizeOptions::default().with_opt(FixedOpts(Opts { unroll: 4, ..Opts::default() }));
    let plan = make_plan(&[a.sum(1, false).uop().clone()], &opts).unwrap();
    let lin = linearize(&plan.kernels[0].program).unwrap();
    let trips: Vec<i64> = lin
        .walk()
        .iter()
        .filter_map(|(_, s)| match s {
            Stmt::Loop { range, .. } => range.as_range().and_then(|r| r.end.const_int()),
            _ => None,
        })
        .collect();
    assert_eq!(trips, [8, 8], "row loop and a 32/4 reduce loop");
    assert_eq!(lin.allocs.len(), 1, "one accumulator for the unrolled copies");
}

#[test]
fn layout_pass_copies_only_strided_reduce_inputs() {
    let (q, k, _) = qkv(64, 16);
    let tile_4x4 = RealizeOptions::default().with_opt(Experiments::tile_4x4_opt());
    // q @ k.T reads k along its contiguous axis: no copy
    let plan = make_plan(&[q.matmul(&k.t()).uop().clone()], &tile_4x4).unwrap();
    assert_eq!(plan.kernel_names(), ["r_64_64"]);
    // q @ k reads k down a column: a transposed copy first
    let k2 = Tensor::from_vec(vec![0.5f32; 16 * 64], &[16, 64]);
    let plan = make_plan(&[q.matmul(&k2).uop().clone()], &tile_4x4).unwrap();
    assert_eq!(plan.kernel_names(), ["e_1_64_16", "r_64_64"]);
    // the output-contiguous layout of register tiles is the other way round
    let loops = RealizeOptions::default().with_opt(DefaultOpt::loops());
    let plan = make_plan(&[q.matmul(&k.t()).uop().clone()], &loops).unwrap();
    assert_eq!(plan.kernel_names(), ["e_1_16_64", "r_64_64"]);
    let plan = make_plan(&[q.matmul(&k2).uop().clone()], &loops).unwrap();
    assert_eq!(plan.kernel_names(), ["r_64_64"]);
    // tile GEMMs (the default) read either orientation in place
    for b in [k.t(), k2.clone()] {
        let plan = make_plan(&[q.matmul(&b).uop().clone()], &RealizeOptions::default()).unwrap();
        assert_eq!(plan.kernel_names(), ["r_64_64"]);
        assert!(plan.kernels[0].uses_tile_ops());
    }
    // NoOpt runs no layout pass
    let plan = make_plan(&[q.matmul(&k2).uop().clone()], &RealizeOptions::default().with_opt(NoOpt)).unwrap();
    assert_eq!(plan.kernel_names(), ["r_64_64"]);
}

#[test]
fn kernel_names_follow_output_shape_and_reduce() {
    let x = Tensor::from_vec(vec![1.0f32; 6], &[2, 3]);
    let plan =
        make_plan(&[(&x + 1.0).uop().clone(), x.sum(0, false).uop().clone()], &RealizeOptions::default())
            .unwrap();
    assert_eq!(plan.kernel_names(), ["e_2_3", "r_3"]);
    assert!(plan.temps.is_empty());
    // Display lists the kernels with their arguments, then the buffers
    let text = plan.to_string();
    assert!(text.starts_with("plan: 2 kernels\n  e_2_3 "), "{text}");
    assert!(
        text.contains("args [Input(0), Output(0)]") && text.ends_with("outs [Output(0), Output(1)]"),
        "{text}"
    );
    assert_eq!(plan.outs, [OutSpec::Output(0), OutSpec::Output(1)]);
    // a root that is an input is returned as is, with no kernel
    let plan = make_plan(&[x.uop().clone()], &RealizeOptions::default()).unwrap();
    assert!(plan.kernels.is_empty());
    assert_eq!(plan.outs, [OutSpec::Input(0)]);
}

#[test]
fn canonical_graph_is_independent_of_data() {
    let (q, k, v) = qkv(16, 4);
    let (q2, k2, v2) = qkv(16, 4);
    let (a, la) = canonicalize(&[attention(&q, &k, &v).uop().clone()]);
    let (b, lb) = canonicalize(&[attention(&q2, &k2, &v2).uop().clone()]);
    assert_eq!(a, b, "same shapes, new data: one canonical graph");
    assert_ne!(la, lb);
    // the same tensor used twice is one input
    let (_, l) = canonicalize(&[(&q * &q).uop().clone()]);
    assert_eq!(l.len(), 1);
}

#[cfg(feature = "jit")]
#[test]
fn static_flops_agree_with_the_backend_estimate() {
    for opts in [RealizeOptions::default(), RealizeOptions::fused()] {
        let plan = attention_plan(256, 64, &opts);
        for k in &plan.kernels {
            assert_eq!(static_flops(&k.program).unwrap(), k.flops, "{}", k.name);
        }
    }
}

#[test]
fn fused_upcast_variants_trade_passes_over_the_keys_for_accumulators() {
    let (n, d) = (256, 64);
    // FlashOpt's upcast of 16: six computations of each q.k (2 softmax + 64/16 output passes)
    let u16 = attention_plan(n, d, &written_fused());
    // upcast the whole head: 2 + 64/64 = three passes
    let u64_opts = written_fused().with_opt(FlashOpt { max_upcast: 64 });
    let u64 = attention_plan(n, d, &u64_opts);
    let per_pair = |p: &Plan| qk_products(p) as f64 / (n * n * d) as f64;
    assert_eq!(per_pair(&u16), 6.0);
    assert_eq!(per_pair(&u64), 3.0);
    assert_eq!(u64.temp_sizes(), [d * n], "still no N x N buffer");
    // fuse_reduce but with broadcast staging, as the first version did: P is stored
    let staged = RealizeOptions::fused()
        .with_experiments(Experiments { stage_broadcasts_when_fused: true, ..Experiments::default() });
    let p = attention_plan(n, d, &staged);
    assert!(p.temp_sizes().contains(&(n * n)), "P is materialized: {:?}", p.temp_sizes());
}

#[test]
fn softmax_reduces_are_upcast_only_where_inputs_are_reused() {
    // A row max or row sum of exp reads a different score for every row: upcasting rows
    // shares no load, so the default keeps one accumulator per row (the backend vectorizes
    // the reduce loop instead); the GEMMs, whose operands are broadcast, are still tiled.
    let loops = RealizeOptions::default().with_opt(DefaultOpt::loops());
    let plan = attention_plan(256, 64, &loops);
    assert_eq!(plan.kernel_names(), ["e_1_64_256", "r_256_256", "r_256", "r_256", "e_256_256", "r_256_64"]);
    let accumulators: Vec<usize> = plan.kernels.iter().map(|k| acc_inits(&k.program).len()).collect();
    assert_eq!(accumulators, [0, 32, 1, 1, 0, 32]);
    // the 4x4 tile upcasts every reduce kernel, reuse or not
    let tile_4x4 = attention_plan(256, 64, &RealizeOptions::default().with_opt(Experiments::tile_4x4_opt()));
    let accumulators: Vec<usize> = tile_4x4.kernels.iter().map(|k| acc_inits(&k.program).len()).collect();
    assert!(accumulators.iter().filter(|&&a| a == 4).count() >= 2, "{accumulators:?}");
}

/// The plan records which named rewrite rules fired while it was built: unfused attention's
/// index arithmetic needs the div/mod folds, and its staged copy of K goes through the staging
/// pass. A second plan with different options
/// records its own counts, not the first one's again.
#[test]
fn plan_records_the_rewrite_rules_that_fired() {
    let plan = attention_plan(64, 16, &RealizeOptions::default());
    for s in &plan.rewrites {
        eprintln!("{s}");
    }
    let hits = |rule: &str| plan.rewrites.iter().map(|s| s.count(rule)).sum::<u64>();
    assert!(hits("idiv_by_one") + hits("mod_of_small_operand") >= 1, "{:?}", plan.rewrites);
    assert!(hits("stage_marked") >= 1, "the transposed copy of K is staged: {:?}", plan.rewrites);
    assert!(plan.rewrites.iter().any(|s| s.pass == "stage"), "{:?}", plan.rewrites);
    let again = attention_plan(64, 16, &RealizeOptions::default());
    assert!(Arc::ptr_eq(&plan, &again), "the second call hits the cache");
}

/// Each kernel records the lowering that made it, the first of the named table that applies,
/// and the plan prints it: a GEMM on tile GEMMs, softmax rows on row tile ops, fused attention
/// on the online tile ops, anything else by rangeify, and each by rangeify without tile ops.
#[test]
fn each_kernel_names_the_lowering_that_made_it() {
    let a = Tensor::from_vec((0..64 * 48).map(|i| (i % 7) as f32).collect(), &[64, 48]);
    let b = Tensor::from_vec((0..48 * 32).map(|i| (i % 5) as f32).collect(), &[48, 32]);
    let lowerings = |t: &Tensor, opts: &RealizeOptions| -> Vec<&'static str> {
        make_plan(&[t.uop().clone()], opts).unwrap().kernels.iter().map(|k| k.lowering).collect()
    };
    let default = RealizeOptions::default();
    assert_eq!(lowerings(&a.matmul(&b), &default), ["tile_gemm"]);
    assert_eq!(lowerings(&(&a + 1.0), &default), ["rangeify"]);
    let fused = RealizeOptions::fused();
    assert_eq!(lowerings(&a.softmax(-1), &fused), ["online_rows"]);
    let loops = RealizeOptions::default().with_opt(DefaultOpt::loops());
    assert_eq!(lowerings(&a.matmul(&b), &loops), ["rangeify"]);
    let plan = attention_plan(64, 16, &RealizeOptions::fused());
    let names: Vec<&str> = plan.kernels.iter().map(|k| k.lowering).collect();
    assert!(names.contains(&"online_attention"), "{plan}");
    assert!(plan.to_string().contains("by online_attention"), "{plan}");
}
