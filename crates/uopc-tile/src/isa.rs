//! Instruction-set selection.

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

/// An instruction set a kernel can be compiled for.
///
/// Every entry point takes the ISA explicitly so tests and benchmarks can force any one the CPU
/// supports; [`Isa::detect`] picks the one the machine model allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// 512-bit vectors (`avx512f` and `avx512dq`, with `avx2` and `fma`).
    Avx512,
    /// 256-bit vectors (`avx2` and `fma`).
    Avx2Fma,
    /// Plain Rust; available everywhere.
    Portable,
}

/// 0 = not probed yet, otherwise `Isa` code + 1. A race only repeats the (idempotent) probe.
static DETECTED: AtomicU8 = AtomicU8::new(0);

/// The `opt-level` this crate was compiled at (`"0"`, `"1"`, `"2"`, `"3"`, `"s"`, `"z"`), as
/// recorded by its build script.
pub const OPT_LEVEL: &str = env!("UOPC_TILE_OPT_LEVEL");

/// Whether the micro-kernels were compiled with optimizations. At `opt-level = 0` their SIMD
/// intrinsics are not inlined, and every tile op runs 100 or more times slower.
pub fn built_optimized() -> bool {
    OPT_LEVEL != "0"
}

/// The advice printed once per process when the micro-kernels were compiled unoptimized.
pub const UNOPTIMIZED_WARNING: &str = concat!(
    "uopc: warning: uopc-tile was compiled without optimizations (opt-level 0), so every matmul\n",
    "and tile op runs 100 or more times slower. Add to your Cargo.toml:\n",
    "    [profile.dev.package.uopc-tile]\n",
    "    opt-level = 3\n",
    "    debug-assertions = false\n",
    "    overflow-checks = false\n",
    "(see \"Use uopc in your crate\" in uopc's README)."
);

impl Isa {
    /// All instruction sets, fastest first.
    pub const ALL: [Isa; 3] = [Isa::Avx512, Isa::Avx2Fma, Isa::Portable];

    /// The widest instruction set the machine model allows ([`crate::machine::Machine::isa`]:
    /// what the CPU supports, capped by `UOPC_ISA`); decided once, then cached.
    pub fn detect() -> Isa {
        match DETECTED.load(Ordering::Relaxed) {
            1 => Isa::Avx512,
            2 => Isa::Avx2Fma,
            3 => Isa::Portable,
            _ => {
                if !built_optimized() {
                    static WARNED: std::sync::Once = std::sync::Once::new();
                    WARNED.call_once(|| eprintln!("{UNOPTIMIZED_WARNING}"));
                }
                let isa = crate::machine::Machine::get().isa();
                let code = match isa {
                    Isa::Avx512 => 1,
                    Isa::Avx2Fma => 2,
                    Isa::Portable => 3,
                };
                DETECTED.store(code, Ordering::Relaxed);
                isa
            }
        }
    }

    /// Whether kernels for this instruction set can run on this CPU.
    pub fn available(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512dq")
                    && std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Fma => {
                std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx512 | Isa::Avx2Fma => false,
        }
    }

    /// A short lowercase name (`"avx512"`, `"avx2+fma"`, `"portable"`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2Fma => "avx2+fma",
            Isa::Portable => "portable",
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad` so width and alignment flags apply.
        f.pad(self.name())
    }
}
