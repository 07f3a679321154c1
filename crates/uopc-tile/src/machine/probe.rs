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
        const ITERS: u64 = 40_000;
        let wide = if features.avx512f {
            Some((
                x86::fma512::<4> as unsafe fn(u64) -> f32,
                x86::fma512::<16> as unsafe fn(u64) -> f32,
                16.0,
            ))
        } else if features.avx2 && features.fma {
            Some((
                x86::fma256::<4> as unsafe fn(u64) -> f32,
                x86::fma256::<12> as unsafe fn(u64) -> f32,
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
                    std::hint::black_box(unsafe { x86::dpbf16_16(ITERS) });
                });
                // One `vdpbf16ps` does twice the flops of one 512-bit FMA.
                out.bf16_dot_over_fma = Some(2.0 * t_many / t_dot);
            }
        }
        if features.avx2 && features.f16c {
            let src = vec![0x3c00u16; 4096];
            let mut dst = vec![0f32; 4096];
            let t = best_seconds(|| {
                for _ in 0..8 {
                    // SAFETY: AVX2 and F16C were detected; both slices hold 4096 elements.
                    unsafe { x86::widen_f16(&src, &mut dst) };
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

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// `iters` rounds of `N` independent 512-bit FMA chains; returns a value so nothing folds.
    ///
    /// # Safety
    ///
    /// AVX-512F is available.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fma512<const N: usize>(iters: u64) -> f32 {
        let (x, y) = std::hint::black_box((_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7)));
        let mut acc = [_mm512_set1_ps(1.0); N];
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm512_fmadd_ps(*a, x, y);
            }
        }
        _mm512_reduce_add_ps(acc.iter().fold(_mm512_setzero_ps(), |s, &a| _mm512_add_ps(s, a)))
    }

    /// `iters` rounds of `N` independent 256-bit FMA chains.
    ///
    /// # Safety
    ///
    /// AVX2 and FMA are available.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn fma256<const N: usize>(iters: u64) -> f32 {
        let (x, y) = std::hint::black_box((_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7)));
        let mut acc = [_mm256_set1_ps(1.0); N];
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm256_fmadd_ps(*a, x, y);
            }
        }
        let s = acc.iter().fold(_mm256_setzero_ps(), |s, &a| _mm256_add_ps(s, a));
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` holds 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), s) };
        lanes.iter().sum()
    }

    /// `iters` rounds of 16 independent `vdpbf16ps` chains.
    ///
    /// # Safety
    ///
    /// AVX-512F and AVX512_BF16 are available.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn dpbf16_16(iters: u64) -> f32 {
        // SAFETY: `__m512i` and `__m512bh` are both 64 plain bytes.
        // Opaque operands: constant ones let the compiler fold the whole chain away.
        let x: __m512bh = std::hint::black_box(unsafe {
            std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi16(0x3C80))
        });
        let mut acc = [_mm512_setzero_ps(); 16];
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm512_dpbf16_ps(*a, x, x);
            }
        }
        _mm512_reduce_add_ps(acc.iter().fold(_mm512_setzero_ps(), |s, &a| _mm512_add_ps(s, a)))
    }

    /// Widens `src` (IEEE half bits) into `dst`, 8 at a time.
    ///
    /// # Safety
    ///
    /// AVX2 and F16C are available; `src` and `dst` have the same length, a multiple of 8.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn widen_f16(src: &[u16], dst: &mut [f32]) {
        for (s, d) in src.chunks_exact(8).zip(dst.chunks_exact_mut(8)) {
            // SAFETY: each chunk holds 8 elements: 16 bytes read, 32 written.
            unsafe {
                let h = _mm_loadu_si128(s.as_ptr().cast());
                _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(h));
            }
        }
    }
}
