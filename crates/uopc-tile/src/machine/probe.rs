//! Short timed probes for the throughputs CPUID cannot tell: FMA ports, `vdpbf16ps` against
//! f32 FMAs, the cost of widening 16-bit floats, and one core's streaming read.
//!
//! Each probe takes the best of a few repetitions (the host is shared; the best is the
//! hardware's rate, a median would be the neighbours'), and all of them together run in a few
//! milliseconds.

use std::time::Instant;

use super::{Features, Throughput};

/// Repetitions of each timed loop; the fastest counts.
const REPS: usize = 5;

/// Seconds of the fastest of [`REPS`] runs of `work`.
fn best_seconds(mut work: impl FnMut()) -> f64 {
    work(); // warm up: clocks, caches, page faults
    (0..REPS)
        .map(|_| {
            let t = Instant::now();
            work();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Runs every probe the features allow.
pub(super) fn measure(features: &Features) -> Throughput {
    let t0 = Instant::now();
    let mut out = Throughput {
        fma_ports: 1,
        bf16_dot_over_fma: None,
        widen_per_ns: None,
        stream_read_gbps: 0.0,
        probe_ms: 0.0,
    };
    #[cfg(target_arch = "x86_64")]
    {
        use crate::peak::x86 as chains;
        const ITERS: u64 = 40_000;
        let wide = if features.avx512f {
            Some((
                chains::fma512::<4> as unsafe fn(u64) -> f32,
                chains::fma512::<16> as unsafe fn(u64) -> f32,
                16.0,
            ))
        } else if features.avx2 && features.fma {
            Some((
                chains::fma256::<4> as unsafe fn(u64) -> f32,
                chains::fma256::<12> as unsafe fn(u64) -> f32,
                12.0,
            ))
        } else {
            None
        };
        if let Some((few, many, many_chains)) = wide {
            let t_few = best_seconds(|| {
                // SAFETY: the ISA of the chosen function was detected above.
                std::hint::black_box(unsafe { few(ITERS) });
            });
            let t_many = best_seconds(|| {
                // SAFETY: as above.
                std::hint::black_box(unsafe { many(ITERS) });
            });
            // Four chains keep one port with a 4-cycle latency busy; a second port shows as
            // the many-chain loop doing more FMAs per second than the four-chain one.
            let ratio = (many_chains / t_many) / (4.0 / t_few);
            out.fma_ports = if ratio >= 1.45 { 2 } else { 1 };
            if features.avx512f && features.avx512bf16 {
                let t_dot = best_seconds(|| {
                    // SAFETY: AVX-512F and AVX512_BF16 were detected.
                    std::hint::black_box(unsafe { chains::dpbf16::<16>(ITERS) });
                });
                // One `vdpbf16ps` does twice the flops of one 512-bit FMA.
                out.bf16_dot_over_fma = Some(2.0 * t_many / t_dot);
            }
        }
        if features.avx2 && features.f16c {
            let src = vec![half::f16::ONE; 4096];
            let mut dst = vec![0f32; 4096];
            let t = best_seconds(|| {
                for _ in 0..8 {
                    // The kernels' own widening (their f16 packing and conversions use it).
                    // SAFETY: AVX2 and F16C were detected; both slices hold 4096 elements.
                    unsafe { crate::x86::half_pack::widen_f16(dst.as_mut_ptr(), src.as_ptr(), src.len()) };
                    std::hint::black_box(&mut dst);
                }
            });
            out.widen_per_ns = Some(8.0 * 4096.0 / t / 1e9);
        }
    }
    let _ = features;
    out.stream_read_gbps = stream_read_gbps();
    out.probe_ms = t0.elapsed().as_secs_f64() * 1e3;
    out
}

/// One core's read bandwidth over a buffer larger than any per-core cache, in GB/s.
fn stream_read_gbps() -> f64 {
    const FLOATS: usize = 2 << 20; // 8 MiB
    let data = vec![1.0f32; FLOATS];
    let t = best_seconds(|| {
        let mut acc = [0f32; 16];
        for chunk in data.chunks_exact(16) {
            for (a, x) in acc.iter_mut().zip(chunk) {
                *a += x;
            }
        }
        std::hint::black_box(acc);
    });
    (FLOATS * 4) as f64 / t / 1e9
}
