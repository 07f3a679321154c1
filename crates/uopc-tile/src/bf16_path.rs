//! The bf16 GEMM paths ([`Bf16Path`]) and whether each can run here. A leaf below the bf16
//! drivers and the machine model, which both name a path; which one a process takes is
//! [`Bf16Path::detect`]'s, next to the GEMM.

/// A code path of the crate's `gemm_bf16`.
///
/// Every entry point takes the path explicitly so tests and benchmarks can force any one the
/// CPU has; [`Bf16Path::detect`] picks the fastest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bf16Path {
    /// AMX tiles (`tdpbf16ps` on 16 x 32 x 16 blocks); needs AMX-TILE, AMX-BF16, OS support
    /// for tile state and the Linux permission to use it.
    Amx,
    /// AVX-512 `vdpbf16ps` (AVX512_BF16 with AVX-512F and BW).
    Avx512Bf16,
    /// The f32 AVX-512 micro-kernel on operands widened to f32 while they are packed, for
    /// AVX-512 CPUs whose `vdpbf16ps` is no faster than f32 FMAs: exact products, subnormals
    /// kept.
    Avx512Widen,
    /// The f32 AVX2+FMA micro-kernel on operands widened to f32 while they are packed (a bf16
    /// widens exactly), for CPUs without bf16 instructions: exact products, subnormals kept.
    Avx2Fma,
    /// Plain Rust; available everywhere.
    Portable,
}

impl Bf16Path {
    /// All paths, widest instructions first.
    pub const ALL: [Bf16Path; 5] =
        [Bf16Path::Amx, Bf16Path::Avx512Bf16, Bf16Path::Avx512Widen, Bf16Path::Avx2Fma, Bf16Path::Portable];

    /// Whether this path can run here. For [`Bf16Path::Amx`] the first call asks the OS for
    /// the tile-state permission (once per process); a refusal makes it unavailable.
    pub fn available(self) -> bool {
        match self {
            Bf16Path::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Bf16Path::Amx => crate::x86::amx::usable(),
            #[cfg(target_arch = "x86_64")]
            Bf16Path::Avx512Bf16 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512bf16")
            }
            #[cfg(target_arch = "x86_64")]
            Bf16Path::Avx512Widen => crate::Isa::Avx512.available(),
            #[cfg(target_arch = "x86_64")]
            Bf16Path::Avx2Fma => crate::Isa::Avx2Fma.available(),
            #[cfg(not(target_arch = "x86_64"))]
            Bf16Path::Amx | Bf16Path::Avx512Bf16 | Bf16Path::Avx512Widen | Bf16Path::Avx2Fma => false,
        }
    }

    /// Whether the path multiplies bf16 by widening it exactly to f32 for an f32 kernel
    /// (every path but AMX and `vdpbf16ps`): then a bf16 product is the f32 product of the
    /// widened operands, which f32 panels packed once can serve as well.
    pub fn widens(self) -> bool {
        matches!(self, Bf16Path::Avx512Widen | Bf16Path::Avx2Fma | Bf16Path::Portable)
    }

    /// Whether the path's kernels multiply B in the pair-panel layout its driver packs
    /// ([`crate::GemmShape::b_pair_panels`]): AMX, `vdpbf16ps` and the portable path, so a B packed
    /// that way once is read in place. The widening paths pack B into f32 panels instead.
    pub fn reads_pair_panels(self) -> bool {
        matches!(self, Bf16Path::Amx | Bf16Path::Avx512Bf16 | Bf16Path::Portable)
    }

    /// Whether [`crate::gemm_bf16_rounded`] on this path rounds its sums while they are in
    /// cache (AMX each finished block, a widening vector path each finished strip of the f32
    /// driver), so a caller needs no small blocks of its own to round them in cache: every path
    /// but `vdpbf16ps` and the portable one, which round the call's whole f32 result at the end.
    pub fn rounds_in_cache(self) -> bool {
        matches!(self, Bf16Path::Amx | Bf16Path::Avx512Widen | Bf16Path::Avx2Fma)
    }

    /// A short lowercase name (`"amx"`, `"avx512bf16"`, `"avx2fma"`, `"portable"`).
    pub fn name(self) -> &'static str {
        match self {
            Bf16Path::Amx => "amx",
            Bf16Path::Avx512Bf16 => "avx512bf16",
            Bf16Path::Avx512Widen => "avx512widen",
            Bf16Path::Avx2Fma => "avx2fma",
            Bf16Path::Portable => "portable",
        }
    }
}

impl std::fmt::Display for Bf16Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}
