//! Concurrency and resource bounds: many threads realizing at once, realize from inside a
//! rayon pool, a bounded plan cache, and huge shapes refused before anything is allocated.

use uopc_tensor::*;

fn small_graph(seed: usize, kind: usize) -> (Tensor, Vec<f32>) {
    let a: Vec<f32> = (0..12).map(|x| ((x * 7 + seed) % 11) as f32 - 5.0).collect();
    let b: Vec<f32> = (0..12).map(|x| ((x * 3 + seed) % 5) as f32).collect();
    let (ta, tb) = (Tensor::from_vec(a.clone(), &[3, 4]), Tensor::from_vec(b.clone(), &[3, 4]));
    // small integers: every evaluation order is exact, so results compare with ==
    match kind {
        0 => (&ta + &tb, a.iter().zip(&b).map(|(x, y)| x + y).collect()),
        1 => (ta.sum(1, false), (0..3).map(|r| a[r * 4..r * 4 + 4].iter().sum()).collect()),
        _ => {
            let m = ta.maximum(&tb) * 2.0;
            (m, a.iter().zip(&b).map(|(x, y)| x.max(*y) * 2.0).collect())
        }
    }
}

#[test]
fn eight_threads_realize_concurrently() {
    let per_thread: usize =
        std::env::var("UOPC_STRESS_REALIZES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    std::thread::scope(|s| {
        for t in 0..8 {
            s.spawn(move || {
                for k in 0..per_thread {
                    let (out, want) = small_graph(t * 1000 + k, (t + k) % 3);
                    let got = out.to_ndarray::<f32>().expect("realizes");
                    assert_eq!(got.iter().cloned().collect::<Vec<f32>>(), want, "thread {t} iteration {k}");
                }
            });
        }
    });
    assert!(plan_cache_stats().hits >= 8 * per_thread as u64 - 100, "the three plans are reused");
}

#[test]
fn realize_inside_a_rayon_pool_does_not_deadlock() {
    use rayon::prelude::*;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let sums: Vec<f32> = pool.install(|| {
        (0..64)
            .into_par_iter()
            .map(|k| {
                let t = Tensor::from_vec(vec![k as f32; 4096], &[64, 64]);
                t.sum(1, false).sum(0, false).to_ndarray::<f32>().unwrap()[[]]
            })
            .collect()
    });
    for (k, s) in sums.iter().enumerate() {
        assert_eq!(*s, k as f32 * 4096.0);
    }
}

#[test]
fn plan_cache_is_bounded() {
    // 200 structurally different graphs (different shapes): the cache keeps at most 128.
    for n in 1..=200 {
        let t = Tensor::from_vec(vec![1.0f32; n], &[n]);
        let _ = (t * 2.0).to_ndarray::<f32>().unwrap();
    }
    assert!(plan_cache_stats().entries <= 128, "{:?}", plan_cache_stats());
}

#[test]
fn huge_shapes_fail_with_a_clear_error_before_allocating() {
    let one = Tensor::from_vec(vec![1.0f32], &[1, 1]);
    let e = one.try_expand(&[1 << 30, 1 << 30]).unwrap_err();
    assert!(e.to_string().contains("more than 2^40 elements"), "{e}");
    // Within the element limit but far beyond this machine's memory (2^39 f32 = 2 TB).
    let big = one.try_expand(&[1 << 20, 1 << 19]).unwrap();
    let e = (big * 2.0).realize().unwrap_err();
    assert!(e.to_string().contains("GB of buffers"), "{e}");
}
