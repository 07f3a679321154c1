//! This CPU's FMA peak at each vector width the micro-kernels use, and its AMX bf16 peak: the
//! ceilings their GEMMs (and the attention built on them) are measured against.

use crate::Isa;

/// Flops one call of [`fma_chains`] performs per iteration, by width in bits.
fn flops_per_iter(bits: usize) -> f64 {
    let chains = if bits == 512 { 16.0 } else { 12.0 };
    chains * (bits / 32) as f64 * 2.0
}

/// `iters` rounds of independent FMA chains at the widest vector width of `isa` (16 chains of
/// 512 bits, or 12 of 256 bits, 4 lanes of scalar code for [`Isa::Portable`]); returns the
/// flops done. `None` when the CPU lacks the ISA.
pub fn fma_chains(isa: Isa, iters: u64) -> Option<f64> {
    if !isa.available() {
        return None;
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            // SAFETY: AVX-512F was detected just above.
            std::hint::black_box(unsafe { x86::fma512::<16>(iters) });
            Some(iters as f64 * flops_per_iter(512))
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => {
            // SAFETY: AVX2 and FMA were detected just above.
            std::hint::black_box(unsafe { x86::fma256::<12>(iters) });
            Some(iters as f64 * flops_per_iter(256))
        }
        _ => {
            let mut acc = [1.0f32; 4];
            for _ in 0..iters {
                for a in acc.iter_mut() {
                    *a = a.mul_add(0.999_999, 1e-7);
                }
            }
            std::hint::black_box(acc);
            Some(iters as f64 * 8.0)
        }
    }
}

/// Best GFLOP/s over `reps` runs of [`fma_chains`] on `threads` threads at once.
pub fn fma_peak_gflops(isa: Isa, iters: u64, reps: usize, threads: usize) -> Option<f64> {
    if !isa.available() {
        return None;
    }
    let threads = threads.max(1);
    let mut best = f64::INFINITY;
    let mut flops = 0.0;
    for _ in 0..reps.max(1) {
        let t = std::time::Instant::now();
        flops = std::thread::scope(|s| {
            let runs: Vec<_> = (0..threads).map(|_| s.spawn(|| fma_chains(isa, iters))).collect();
            runs.into_iter().filter_map(|r| r.join().ok().flatten()).sum::<f64>()
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    Some(flops / best / 1e9)
}

/// `iters` rounds of 16 independent `vdpbf16ps` chains (each instruction 16 lanes x 2 pairs of
/// bf16 products); returns the flops done, or `None` without AVX512_BF16. This is the ceiling
/// of [`crate::Bf16Path::Avx512Bf16`].
pub fn avx512_bf16_chains(iters: u64) -> Option<f64> {
    if !crate::Bf16Path::Avx512Bf16.available() {
        return None;
    }
    // SAFETY: AVX-512F and AVX512_BF16 were detected just above.
    std::hint::black_box(unsafe { x86::dpbf16::<16>(iters) });
    Some(iters as f64 * 16.0 * 64.0)
}

/// Best GFLOP/s over `reps` runs of [`avx512_bf16_chains`] on `threads` threads at once;
/// `None` without AVX512_BF16.
pub fn avx512_bf16_peak_gflops(iters: u64, reps: usize, threads: usize) -> Option<f64> {
    best_gflops(reps, threads, || avx512_bf16_chains(iters))
}

/// Best GFLOP/s over `reps` runs of `work` (which returns the flops it did) on `threads`
/// threads at once; `None` if `work` does.
fn best_gflops(reps: usize, threads: usize, work: impl Fn() -> Option<f64> + Sync) -> Option<f64> {
    work()?;
    let threads = threads.max(1);
    let mut best = f64::INFINITY;
    let mut flops = 0.0;
    for _ in 0..reps.max(1) {
        let t = std::time::Instant::now();
        flops = std::thread::scope(|s| {
            let runs: Vec<_> = (0..threads).map(|_| s.spawn(&work)).collect();
            runs.into_iter().filter_map(|r| r.join().ok().flatten()).sum::<f64>()
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    Some(flops / best / 1e9)
}

/// The timed chains of independent multiply-adds, shared with the machine model's probes.
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    /// `iters` rounds of `N` independent `vdpbf16ps` chains; returns a value so nothing folds.
    ///
    /// # Safety
    ///
    /// AVX-512F and AVX512_BF16 are available.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn dpbf16<const N: usize>(iters: u64) -> f32 {
        // Opaque operands: constant ones let the compiler fold the whole chain away.
        // 1/64 in every bf16, so the sums stay finite.
        // SAFETY: `__m512i` and `__m512bh` are both 64 plain bytes.
        let x = std::hint::black_box(unsafe {
            std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi16(0x3C80))
        });
        let mut acc = [_mm512_setzero_ps(); N];
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm512_dpbf16_ps(*a, x, x);
            }
        }
        _mm512_reduce_add_ps(acc.iter().fold(_mm512_setzero_ps(), |s, &a| _mm512_add_ps(s, a)))
    }

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

    /// `iters` rounds of `N` independent 256-bit FMA chains (at most 16, the ymm registers).
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
        let mut lanes = [0.0f32; 8];
        // SAFETY: `lanes` has room for 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), s) };
        lanes.iter().sum()
    }
}

/// `iters` rounds of four independent `tdpbf16ps` chains (each a 16 x 16 x 32 bf16 multiply
/// into f32 tiles); returns the flops done, or `None` when AMX is not usable here.
pub fn amx_bf16_chains(iters: u64) -> Option<f64> {
    if !crate::Bf16Path::Amx.available() {
        return None;
    }
    // SAFETY: AMX is usable (permission granted), checked just above.
    Some(unsafe { crate::x86::amx::peak_chains(iters) })
}

/// Best GFLOP/s over `reps` runs of [`amx_bf16_chains`] on `threads` threads at once (each
/// thread loads its own tile configuration); `None` without AMX.
pub fn amx_bf16_peak_gflops(iters: u64, reps: usize, threads: usize) -> Option<f64> {
    best_gflops(reps, threads, || amx_bf16_chains(iters))
}
