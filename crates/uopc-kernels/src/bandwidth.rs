//! A streaming-read probe: the memory bandwidth that bounds kernels which read each byte
//! once, such as flash-decoding over a long key cache.

/// Streaming read bandwidth in GB/s: the best of `reps` sums of an `mb`-MiB f32 array split
/// over `threads` threads. The yardstick for memory-bound kernels such as flash-decoding.
///
/// # Panics
///
/// If `mb` is 0 (there is nothing to split over the threads).
pub fn streaming_read_gbs(mb: usize, threads: usize, reps: usize) -> f64 {
    let data = vec![1.0f32; mb * (1 << 20) / 4];
    let threads = threads.max(1);
    let part = data.len().div_ceil(threads);
    let mut best = f64::INFINITY;
    let mut check = 0.0f32;
    for _ in 0..reps.max(1) {
        let t0 = std::time::Instant::now();
        let total: f32 = std::thread::scope(|sc| {
            let hs: Vec<_> = data.chunks(part).map(|c| sc.spawn(move || sum_f32(c))).collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
        });
        best = best.min(t0.elapsed().as_secs_f64());
        check += total;
    }
    // keeps the sums observable so they are not optimized away
    std::hint::black_box(check);
    (data.len() * 4) as f64 / best / 1e9
}

/// A sum with 16 independent partial sums, so the loop is bound by loads, not add latency.
fn sum_f32(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}
