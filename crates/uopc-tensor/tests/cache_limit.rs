//! Clearing and bounding the plan cache. Its own test binary, with the tests run one at a time:
//! both change process-wide cache state that other tests would observe.

use std::sync::Mutex;
use uopc_tensor::attention::attention;
use uopc_tensor::*;

static SERIAL: Mutex<()> = Mutex::new(());

fn attention_of(n: usize, d: usize) -> Tensor {
    let t = |s: usize| {
        Tensor::from_vec((0..n * d).map(|x| ((x * s) % 11) as f32 / 11.0).collect::<Vec<f32>>(), &[n, d])
    };
    attention(&t(3), &t(5), &t(7))
}

#[test]
fn a_cleared_cache_recompiles() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let x = Tensor::from_vec((0..64).map(|i| i as f32).collect::<Vec<f32>>(), &[8, 8]).softmax(-1);
    let opts = RealizeOptions::default();
    let (first, _) = x.realize_with(&opts).unwrap();
    let (_, again) = x.realize_with(&opts).unwrap();
    assert!(again.cache_hit);
    clear_plan_cache();
    let before = plan_cache_stats();
    assert_eq!(before.entries, 0);
    assert_eq!(before.pooled_temp_bytes, 0);
    let (after_clear, report) = x.realize_with(&opts).unwrap();
    let after = plan_cache_stats();
    assert!(!report.cache_hit, "a cleared cache has no plan to reuse");
    assert_eq!(after.misses, before.misses + 1);
    assert_eq!(after.kernels_compiled, before.kernels_compiled + report.kernels.len() as u64);
    assert_eq!(after.entries, 1);
    assert_eq!(first.to_ndarray::<f32>().unwrap(), after_clear.to_ndarray::<f32>().unwrap());
}

#[test]
fn pooled_temporaries_beyond_the_limit_are_evicted_least_recently_used_first() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    clear_plan_cache();
    assert_eq!(plan_cache_limit(), DEFAULT_PLAN_CACHE_LIMIT);
    let opts = RealizeOptions::default();
    let (a, b) = (attention_of(32, 8), attention_of(40, 8));
    let plan_a = make_plan(&[a.uop().clone()], &opts).unwrap();
    let plan_b = make_plan(&[b.uop().clone()], &opts).unwrap();
    let (bytes_a, bytes_b) = (plan_a.temp_bytes(), plan_b.temp_bytes());
    assert!(bytes_a > 0 && bytes_b > bytes_a, "{bytes_a} {bytes_b}");
    // room for either plan's temporaries, not for both
    set_plan_cache_limit(bytes_b + bytes_a - 1);
    let evictions = plan_cache_stats().temp_evictions;
    let _ = a.realize().unwrap();
    assert_eq!(plan_cache_stats().pooled_temp_bytes, bytes_a);
    let _ = b.realize().unwrap();
    // a was used least recently: its temporaries go, b's stay
    let stats = plan_cache_stats();
    assert_eq!(stats.temp_evictions, evictions + 1);
    assert_eq!(stats.pooled_temp_bytes, bytes_b);
    assert_eq!((plan_a.pooled_temp_bytes(), plan_b.pooled_temp_bytes()), (0, bytes_b));
    // a's compiled kernels stay cached; its next run allocates temporaries again and evicts b's
    let (_, report) = a.realize_with(&opts).unwrap();
    assert!(report.cache_hit);
    assert_eq!(plan_a.temp_allocations(), 2);
    assert_eq!((plan_a.pooled_temp_bytes(), plan_b.pooled_temp_bytes()), (bytes_a, 0));
    // a limit of 0 keeps nothing, at once
    set_plan_cache_limit(0);
    assert_eq!(plan_cache_stats().pooled_temp_bytes, 0);
    set_plan_cache_limit(DEFAULT_PLAN_CACHE_LIMIT);
}
