//! Plan caching and temporary reuse, observed through counters and reports.

mod common;
use common::*;
use uopc_tensor::attention::attention;
use uopc_tensor::*;

fn attn_ref(
    q: &ndarray::ArrayD<f32>,
    k: &ndarray::ArrayD<f32>,
    v: &ndarray::ArrayD<f32>,
) -> ndarray::ArrayD<f64> {
    let (n, d) = (q.shape()[0], q.shape()[1]);
    let mut out = ndarray::ArrayD::<f64>::zeros(ndarray::IxDyn(&[n, v.shape()[1]]));
    for i in 0..n {
        let s: Vec<f64> = (0..n)
            .map(|j| (0..d).map(|e| q[[i, e]] as f64 * k[[j, e]] as f64).sum::<f64>() / (d as f64).sqrt())
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let l: f64 = p.iter().sum();
        for c in 0..v.shape()[1] {
            out[[i, c]] = (0..n).map(|j| p[j] * v[[j, c]] as f64).sum::<f64>() / l;
        }
    }
    out
}

#[test]
fn second_realize_of_a_same_shaped_graph_hits_the_plan_cache() {
    let (n, d) = (48, 8);
    let inputs = |seed: u64| (normal(&[n, d], seed), normal(&[n, d], seed + 1), normal(&[n, d], seed + 2));
    let (q, k, v) = inputs(100);
    let build = |q: &ndarray::ArrayD<f32>, k: &ndarray::ArrayD<f32>, v: &ndarray::ArrayD<f32>| {
        attention(&Tensor::from_array(q), &Tensor::from_array(k), &Tensor::from_array(v))
    };
    let opts = RealizeOptions::default();
    let (out1, r1) = build(&q, &k, &v).realize_with(&opts).unwrap();
    let before = plan_cache_stats();
    let (q2, k2, v2) = inputs(200);
    let (out2, r2) = build(&q2, &k2, &v2).realize_with(&opts).unwrap();
    let after = plan_cache_stats();
    assert!(r2.cache_hit, "same shapes, new data: the plan is reused");
    assert_eq!((r2.schedule_seconds, r2.compile_seconds), (0.0, 0.0));
    assert!(after.hits > before.hits);
    // other tests in this process may compile concurrently, but this realize compiled nothing
    assert_eq!(r2.kernels.len(), r1.kernels.len());
    // new data really flowed through the cached plan (f32 vs f64: see tests/suite/attention.rs)
    assert!(abs_err(&out1.to_ndarray::<f32>().unwrap(), &attn_ref(&q, &k, &v)) < 1e-5);
    assert!(abs_err(&out2.to_ndarray::<f32>().unwrap(), &attn_ref(&q2, &k2, &v2)) < 1e-5);
    // temporaries were allocated once and reused
    let plan = make_plan(&[build(&q, &k, &v).uop().clone()], &opts).unwrap();
    assert_eq!(plan.temp_allocations(), 1);
}

#[test]
fn options_are_part_of_the_cache_key() {
    let x = Tensor::from_array(&uniform(&[16, 16], -1.0, 1.0, 5));
    let y = x.softmax(-1);
    let a = make_plan(&[y.uop().clone()], &RealizeOptions::default()).unwrap();
    let b = make_plan(&[y.uop().clone()], &RealizeOptions::fused()).unwrap();
    assert_ne!(a.kernel_names(), b.kernel_names());
    let a2 = make_plan(&[y.uop().clone()], &RealizeOptions::default()).unwrap();
    assert!(std::sync::Arc::ptr_eq(&a, &a2));
    // optimizers are keyed by value: a separately built equal optimizer finds the same plan
    let same = RealizeOptions::default().with_opt(DefaultOpt::default());
    assert!(std::sync::Arc::ptr_eq(&a, &make_plan(&[y.uop().clone()], &same).unwrap()));
    // experiment switches are part of the key too
    let staged = RealizeOptions::fused()
        .with_experiments(Experiments { stage_broadcasts_when_fused: true, ..Experiments::default() });
    let s1 = make_plan(&[y.uop().clone()], &staged).unwrap();
    assert!(!std::sync::Arc::ptr_eq(&b, &s1));
    assert!(std::sync::Arc::ptr_eq(&s1, &make_plan(&[y.uop().clone()], &staged.clone()).unwrap()));
    assert_ne!(RealizeOptions::fused(), staged);
}

#[test]
fn concurrent_realizes_of_one_plan_stay_correct() {
    let x = uniform(&[64, 32], -1.0, 1.0, 7);
    let w = uniform(&[32, 32], -1.0, 1.0, 8);
    let want = {
        let t = Tensor::from_array(&x).matmul(&Tensor::from_array(&w)).softmax(-1);
        t.to_ndarray::<f32>().unwrap()
    };
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..5 {
                    let t = Tensor::from_array(&x).matmul(&Tensor::from_array(&w)).softmax(-1);
                    let got = t.to_ndarray::<f32>().unwrap();
                    assert_eq!(got, want, "a run shared temporaries with another");
                }
            });
        }
    });
}
