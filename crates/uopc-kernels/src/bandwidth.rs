//! A streaming-read probe: the memory bandwidth that bounds kernels which read each byte
//! once, such as flash-decoding over a long key cache.

/// Streaming read bandwidth in GB/s: the best of `reps` sums of an `mb`-MiB f32 array split
/// over `threads` threads. The yardstick for memory-bound kernels such as flash-decoding.
///
/// Each sum reads as fast as this crate's kernels know how to: with AVX-512 it requests the
/// memory ahead of its loads with software prefetches, as the streaming tile kernels do (on
/// some machines the hardware prefetcher alone leaves a plain loop well short of what the
/// memory delivers, and a yardstick slower than the kernels it measures would flatter them).
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

/// The sum of `x`: [`sum_prefetched`] where AVX-512 is available, else [`sum_plain`].
fn sum_f32(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F was detected at run time.
        return unsafe { sum_prefetched(x) };
    }
    sum_plain(x)
}

/// Floats requested ahead of the loads in [`sum_prefetched`] (4 KiB).
#[cfg(target_arch = "x86_64")]
const AHEAD: usize = 1024;

/// Four vector partial sums over 64 floats a step, each step requesting its four cache lines
/// [`AHEAD`] floats further on.
///
/// # Safety
///
/// AVX-512F is available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_prefetched(x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut steps = x.chunks_exact(64);
    for step in &mut steps {
        let at = step.as_ptr();
        for (l, acc) in acc.iter_mut().enumerate() {
            // a prefetch never faults, so it may point past the slice
            _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(AHEAD + 16 * l).cast::<i8>());
            // SAFETY: `step` holds 64 floats, so lanes `16 l .. 16 l + 16` are inside it.
            *acc = _mm512_add_ps(*acc, unsafe { _mm512_loadu_ps(at.add(16 * l)) });
        }
    }
    let total = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    _mm512_reduce_add_ps(total) + steps.remainder().iter().sum::<f32>()
}

/// A sum with 16 independent partial sums, so the loop is bound by loads, not add latency.
fn sum_plain(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}
