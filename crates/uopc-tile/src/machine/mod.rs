//! The machine model: what the CPU is, read once per process, and the kernel choices derived
//! from it.
//!
//! Every kernel family asks [`Machine::get`] (or the [`Choices`] derived from it) instead of
//! probing the CPU itself, so one value decides the vector ISA, the 16-bit GEMM path and the
//! GEMM blocking. [`Choices::for_machine`] is a pure function of a [`Machine`], so tests can
//! hand it a model of a CPU they do not run on ([`Machine::preset`]) and check what it would
//! choose.
//!
//! `UOPC_ISA` caps the instruction sets the process uses: `native` (the default), `avx512`
//! (no AMX), `avx2` (no AVX-512, no AMX) or `portable` (plain Rust everywhere). A cap above
//! what the CPU has changes nothing: a path the hardware lacks is never run.

mod cpuid;
mod l1;
mod probe;

use std::fmt;
use std::sync::OnceLock;

use crate::{Bf16Path, Isa};
pub(crate) use l1::{L1Geometry, MAX_L1_SETS};

/// The CPU's vendor, from CPUID leaf 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Vendor {
    /// `GenuineIntel`.
    Intel,
    /// `AuthenticAMD`.
    Amd,
    /// Any other vendor string (or architecture, off x86-64).
    Other(String),
}

/// One data (or unified) cache level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLevel {
    /// 1, 2 or 3.
    pub level: u8,
    /// Capacity of one instance, in bytes.
    pub size_bytes: usize,
    /// Line size in bytes.
    pub line_bytes: usize,
    /// Associativity.
    pub ways: usize,
    /// Hardware threads sharing one instance (as CPUID reports it; in a VM often the host's).
    pub shared_by_threads: usize,
}

/// The instruction-set extensions the kernels can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Features {
    /// AVX2.
    pub avx2: bool,
    /// FMA3.
    pub fma: bool,
    /// F16C (half-precision conversions).
    pub f16c: bool,
    /// AVX-512 Foundation.
    pub avx512f: bool,
    /// AVX-512 doubleword and quadword instructions (`vreduceps`, which the softmax
    /// exponential takes its fraction with).
    pub avx512dq: bool,
    /// AVX-512 byte and word instructions.
    pub avx512bw: bool,
    /// AVX512_BF16 (`vdpbf16ps`).
    pub avx512bf16: bool,
    /// AVX512_FP16.
    pub avx512fp16: bool,
    /// AMX tiles with bf16, enabled by the OS and permitted for this process.
    pub amx_bf16: bool,
}

/// Throughputs that decide a choice and that CPUID cannot tell, measured by short probes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throughput {
    /// Vector FMAs the core issues per cycle at its widest width (1 or 2): a 512-bit op on
    /// 256-bit units counts as one port.
    pub fma_ports: u32,
    /// Flops per second of `vdpbf16ps` over those of f32 FMAs at the same width; `None`
    /// without AVX512_BF16.
    pub bf16_dot_over_fma: Option<f64>,
    /// f16 values widened to f32 per nanosecond on one core (L1-resident); `None` without F16C.
    pub widen_per_ns: Option<f64>,
    /// One core's read bandwidth from beyond its private caches, GB/s.
    pub stream_read_gbps: f64,
    /// How long the probes took, in milliseconds.
    pub probe_ms: f64,
}

/// Latency of a vector FMA in cycles on every x86 core this crate targets (Intel since
/// Skylake, AMD since Zen 2): with `ports` FMAs issued per cycle, `4 * ports` independent
/// accumulators keep them busy.
pub const FMA_LATENCY_CYCLES: u32 = 4;

/// A CPU as the kernels see it.
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    /// Vendor from CPUID.
    pub vendor: Vendor,
    /// The brand string (what `lscpu` prints as "Model name").
    pub model_name: String,
    /// Display family (base plus extended).
    pub family: u32,
    /// Display model (base plus extended).
    pub model: u32,
    /// Extensions the kernels may use, after the `UOPC_ISA` cap.
    pub features: Features,
    /// Data caches, L1 first.
    pub caches: Vec<CacheLevel>,
    /// Hardware threads available to this process.
    pub cores: usize,
    /// Probed throughputs.
    pub throughput: Throughput,
    /// Where the model came from: `"detected"`, `"detected, UOPC_ISA=avx2"`, or a preset name.
    pub source: String,
}

/// An instruction-set cap, as `UOPC_ISA` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum IsaCap {
    /// Plain Rust only.
    Portable,
    /// AVX2 and FMA at most.
    Avx2,
    /// AVX-512 (with its bf16 instructions), no AMX.
    Avx512,
    /// Everything the CPU has.
    Native,
}

impl IsaCap {
    /// Parses `native`, `amx` (the same), `avx512`, `avx2` or `portable`.
    pub fn parse(s: &str) -> Option<IsaCap> {
        match s.trim().to_ascii_lowercase().as_str() {
            "native" | "amx" | "" => Some(IsaCap::Native),
            "avx512" | "avx-512" => Some(IsaCap::Avx512),
            "avx2" | "avx2+fma" => Some(IsaCap::Avx2),
            "portable" | "none" => Some(IsaCap::Portable),
            _ => None,
        }
    }

    /// The cap `UOPC_ISA` asks for (`Native` when unset); an unknown value is reported once on
    /// stderr and ignored.
    pub fn from_env() -> IsaCap {
        match std::env::var("UOPC_ISA") {
            Err(_) => IsaCap::Native,
            Ok(v) => IsaCap::parse(&v).unwrap_or_else(|| {
                eprintln!("uopc: UOPC_ISA={v:?} is not one of native, avx512, avx2, portable; ignored");
                IsaCap::Native
            }),
        }
    }

    /// `features` with everything above this cap turned off.
    pub fn apply(self, mut f: Features) -> Features {
        if self < IsaCap::Native {
            f.amx_bf16 = false;
        }
        if self < IsaCap::Avx512 {
            f.avx512f = false;
            f.avx512dq = false;
            f.avx512bw = false;
            f.avx512bf16 = false;
            f.avx512fp16 = false;
        }
        if self < IsaCap::Avx2 {
            f = Features::default();
        }
        f
    }
}

/// The extensions this CPU and OS support (before any cap).
fn detect_features() -> Features {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        Features {
            avx2: has!("avx2"),
            fma: has!("fma"),
            f16c: has!("f16c"),
            avx512f: has!("avx512f"),
            avx512dq: has!("avx512dq"),
            avx512bw: has!("avx512bw"),
            avx512bf16: has!("avx512bf16"),
            avx512fp16: has!("avx512fp16"),
            amx_bf16: crate::x86::amx::usable(),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    Features::default()
}

impl Machine {
    /// The model of this machine under this process's `UOPC_ISA` cap: detected, probed and
    /// cached on first use (the probes take a few milliseconds).
    pub fn get() -> &'static Machine {
        static MACHINE: OnceLock<Machine> = OnceLock::new();
        MACHINE.get_or_init(|| Machine::detect(IsaCap::from_env()))
    }

    /// Detects and probes this machine with `cap` applied (uncached; [`Machine::get`] caches).
    pub fn detect(cap: IsaCap) -> Machine {
        let id = cpuid::read();
        let features = cap.apply(detect_features());
        let throughput = probe::measure(&features);
        let source = if cap == IsaCap::Native {
            String::from("detected")
        } else {
            format!("detected, UOPC_ISA={}", cap.name())
        };
        Machine {
            vendor: id.vendor,
            model_name: id.model_name,
            family: id.family,
            model: id.model,
            features,
            caches: id.caches,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            throughput,
            source,
        }
    }

    /// A model of a CPU class this crate targets, with typical caches and throughputs, for
    /// tests and for reasoning about machines not at hand. Names: `"avx512-2port"` (Intel
    /// Sapphire/Emerald Rapids without AMX exposed), `"avx512-amx"` (the same with AMX),
    /// `"avx512-1port"` (AMD Zen 4), `"avx2"` (AMD Zen 3) and `"portable"`.
    pub fn preset(name: &str) -> Option<Machine> {
        let cache = |level, kib: usize, ways| CacheLevel {
            level,
            size_bytes: kib << 10,
            line_bytes: 64,
            ways,
            shared_by_threads: if level == 3 { 16 } else { 1 },
        };
        let avx2 = Features { avx2: true, fma: true, f16c: true, ..Features::default() };
        let avx512 = Features { avx512f: true, avx512dq: true, avx512bw: true, avx512bf16: true, ..avx2 };
        let (vendor, model_name, features, caches, fma_ports, dot) = match name {
            "avx512-2port" | "avx512-amx" => (
                Vendor::Intel,
                "Intel Xeon (two 512-bit FMA ports)",
                Features { avx512fp16: true, amx_bf16: name == "avx512-amx", ..avx512 },
                vec![cache(1, 48, 12), cache(2, 2048, 16), cache(3, 105 << 10, 15)],
                2,
                Some(0.47),
            ),
            "avx512-1port" => (
                Vendor::Amd,
                "AMD EPYC (512-bit ops on 256-bit units)",
                avx512,
                vec![cache(1, 32, 8), cache(2, 1024, 8), cache(3, 32 << 10, 16)],
                1,
                Some(2.0),
            ),
            "avx2" => (
                Vendor::Amd,
                "AMD EPYC (AVX2)",
                avx2,
                vec![cache(1, 32, 8), cache(2, 512, 8), cache(3, 32 << 10, 16)],
                2,
                None,
            ),
            "portable" => (
                Vendor::Other(String::from("generic")),
                "a CPU without the vector extensions",
                Features::default(),
                cpuid::fallback_caches(),
                1,
                None,
            ),
            _ => return None,
        };
        Some(Machine {
            vendor,
            model_name: model_name.to_string(),
            family: 0,
            model: 0,
            features,
            caches,
            cores: 2,
            throughput: Throughput {
                fma_ports,
                bf16_dot_over_fma: dot,
                widen_per_ns: features.f16c.then_some(8.0),
                stream_read_gbps: 20.0,
                probe_ms: 0.0,
            },
            source: format!("preset {name}"),
        })
    }

    /// The preset names [`Machine::preset`] knows.
    pub const PRESETS: [&'static str; 5] = ["avx512-2port", "avx512-amx", "avx512-1port", "avx2", "portable"];

    /// The cache of `level`, if the model has one.
    pub fn cache(&self, level: u8) -> Option<&CacheLevel> {
        self.caches.iter().find(|c| c.level == level)
    }

    /// The widest vector ISA the model allows.
    pub fn isa(&self) -> Isa {
        let f = &self.features;
        if f.avx512f && f.avx512dq && f.avx2 && f.fma {
            Isa::Avx512
        } else if f.avx2 && f.fma {
            Isa::Avx2Fma
        } else {
            Isa::Portable
        }
    }

    /// Vector width in bits of [`Machine::isa`] (32 for portable code: one f32 lane).
    pub fn vector_bits(&self) -> u32 {
        match self.isa() {
            Isa::Avx512 => 512,
            Isa::Avx2Fma => 256,
            Isa::Portable => 32,
        }
    }

    /// Architectural vector registers at that width.
    pub fn vector_registers(&self) -> u32 {
        match self.isa() {
            Isa::Avx512 => 32,
            Isa::Avx2Fma => 16,
            Isa::Portable => 16,
        }
    }

    /// The kernel choices this model implies ([`Choices::for_machine`]).
    pub fn choices(&self) -> Choices {
        Choices::for_machine(self)
    }
}

impl IsaCap {
    /// The spelling [`IsaCap::parse`] reads.
    pub fn name(self) -> &'static str {
        match self {
            IsaCap::Portable => "portable",
            IsaCap::Avx2 => "avx2",
            IsaCap::Avx512 => "avx512",
            IsaCap::Native => "native",
        }
    }
}

/// A GEMM's cache blocking for a register tile of `mr x nr`: the k slab (`kc`), the rows of
/// the packed A block (`mc`) and the columns of the packed B block (`nc`).
///
/// The driver sweeps, per k slab, each A block (kept in L3) against each B block (kept in
/// L2), and within them each `mr`-row strip of A against every `nr`-column panel of B: a
/// strip stays in L1 while the panels stream past it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmBlocking {
    /// Rows of the register tile.
    pub mr: usize,
    /// Columns of the register tile.
    pub nr: usize,
    /// Depth of a k slab.
    pub kc: usize,
    /// Rows of A per packed block, kept in L3.
    pub mc: usize,
    /// Columns of B per packed block, kept in L2.
    pub nc: usize,
}

impl GemmBlocking {
    /// [`GemmBlocking::for_tile`] on [`Machine::get`], computed once per process for the
    /// register tiles of the vector ISAs (every blocked GEMM call asks; the division chain of
    /// the model stays off that path), and on demand for any other tile.
    pub fn of_this_machine(mr: usize, nr: usize) -> GemmBlocking {
        static TILES: OnceLock<[GemmBlocking; 2]> = OnceLock::new();
        let tiles = TILES.get_or_init(|| {
            [Isa::Avx512, Isa::Avx2Fma].map(|isa| {
                let (mr, nr) = register_tile(isa);
                GemmBlocking::for_tile(Machine::get(), mr, nr)
            })
        });
        tiles
            .iter()
            .find(|g| (g.mr, g.nr) == (mr, nr))
            .copied()
            .unwrap_or_else(|| GemmBlocking::for_tile(Machine::get(), mr, nr))
    }

    /// The analytical blocking of Low et al. ("Analytical Modeling Is Enough for
    /// High-Performance BLIS", TOMS 2016) for an `mr x nr` f32 register tile on `m`. The
    /// tile broadcasts A and loads B as vectors, so A's `mr x kc` strip is the micro-panel
    /// that stays in L1 and B's `kc x nr` panels are the ones that stream (BLIS's roles for
    /// its broadcast and vector operands, with A and B exchanged):
    ///
    /// - `kc`: of L1's `W` ways one is left to C and the stack, and the rest is shared in
    ///   proportion to what a k step reads: `floor((W - 1) / (1 + mr / nr))` ways for the
    ///   streaming B panel, the rest for the A strip; `kc` fills the panel's ways;
    /// - `nc`: the `kc x nc` B block takes half of L2, the rest holds A strips passing
    ///   through and C's tiles;
    /// - `mc`: the `mc x kc` A block takes half of this core's share of L3 (it is read once
    ///   per B block, a strip at a time, so it need not fit closer).
    pub fn for_tile(m: &Machine, mr: usize, nr: usize) -> GemmBlocking {
        let fallback = cpuid::fallback_caches();
        let level = |l: u8| *m.cache(l).unwrap_or(&fallback[usize::from(l) - 1]);
        let (l1, l2, l3) = (level(1), level(2), level(3));
        let f = std::mem::size_of::<f32>();
        let l1_ways = l1.ways.max(2);
        let panel_ways = ((l1_ways - 1) * nr / (nr + mr)).max(1);
        let kc = (l1.size_bytes / l1_ways * panel_ways / (nr * f)).clamp(64, 512) / 8 * 8;
        let nc = (l2.size_bytes / 2 / (kc * f)).clamp(nr, 8192) / nr * nr;
        let l3_share = l3.size_bytes / l3.shared_by_threads.clamp(1, m.cores.max(1) * 4).max(1);
        let mc = (l3_share / 2 / (kc * f)).clamp(mr, 8192) / mr * mr;
        GemmBlocking { mr, nr, kc, mc, nc }
    }
}

/// What a model decides for each kernel family.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choices {
    /// The vector ISA of the f32 kernels (and of f16, widened into them).
    pub f32_isa: Isa,
    /// The bf16 GEMM path: AMX where usable (guarded by a known-answer check at first use),
    /// `vdpbf16ps` only where the probe says it outruns f32 FMAs, else widening into the f32
    /// kernel of `f32_isa`.
    pub bf16: Bf16Path,
    /// The f32 GEMM blocking for the register tile of `f32_isa`.
    pub gemm: GemmBlocking,
    /// Independent accumulators the FMA ports need in flight (`ports x latency`).
    pub accumulators_needed: u32,
}

/// `vdpbf16ps` must beat f32 FMAs by this factor to be chosen: widening in the packing costs
/// little, and the f32 path keeps subnormals and exact f32 sums of products.
const BF16_DOT_MARGIN: f64 = 1.15;

impl Choices {
    /// The choices for `m` (pure: depends on nothing but the model).
    pub fn for_machine(m: &Machine) -> Choices {
        let isa = m.isa();
        let f = &m.features;
        let dot_wins = m.throughput.bf16_dot_over_fma.is_some_and(|r| r >= BF16_DOT_MARGIN);
        let bf16 = if f.amx_bf16 {
            Bf16Path::Amx
        } else if f.avx512f && f.avx512bw && f.avx512bf16 && dot_wins {
            Bf16Path::Avx512Bf16
        } else {
            match isa {
                Isa::Avx512 => Bf16Path::Avx512Widen,
                Isa::Avx2Fma => Bf16Path::Avx2Fma,
                Isa::Portable => Bf16Path::Portable,
            }
        };
        let (mr, nr) = register_tile(isa);
        Choices {
            f32_isa: isa,
            bf16,
            gemm: GemmBlocking::for_tile(m, mr, nr),
            accumulators_needed: m.throughput.fma_ports * FMA_LATENCY_CYCLES,
        }
    }
}

impl fmt::Display for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = match &self.vendor {
            Vendor::Intel => "Intel",
            Vendor::Amd => "AMD",
            Vendor::Other(s) => s.as_str(),
        };
        writeln!(
            f,
            "machine: {} ({v}, family {} model {}; {})",
            self.model_name, self.family, self.model, self.source
        )?;
        let x = &self.features;
        let names = [
            (x.avx2, "avx2"),
            (x.fma, "fma"),
            (x.f16c, "f16c"),
            (x.avx512f, "avx512f"),
            (x.avx512dq, "avx512dq"),
            (x.avx512bw, "avx512bw"),
            (x.avx512bf16, "avx512_bf16"),
            (x.avx512fp16, "avx512_fp16"),
            (x.amx_bf16, "amx_bf16"),
        ];
        let on: Vec<&str> = names.iter().filter(|(b, _)| *b).map(|(_, n)| *n).collect();
        writeln!(
            f,
            "  isa: {} ({} bits, {} registers); extensions: {}",
            self.isa(),
            self.vector_bits(),
            self.vector_registers(),
            if on.is_empty() { String::from("none") } else { on.join(" ") }
        )?;
        let caches: Vec<String> = self
            .caches
            .iter()
            .map(|c| {
                format!(
                    "L{} {} KiB {}-way (shared by {})",
                    c.level,
                    c.size_bytes >> 10,
                    c.ways,
                    c.shared_by_threads
                )
            })
            .collect();
        writeln!(f, "  caches: {}; {} hardware threads", caches.join(", "), self.cores)?;
        let t = &self.throughput;
        writeln!(
            f,
            "  probes ({:.1} ms): {} FMA port(s) at {} bits; vdpbf16ps/FMA flops {}; f16 widen {}; stream read {:.1} GB/s",
            t.probe_ms,
            t.fma_ports,
            self.vector_bits(),
            t.bf16_dot_over_fma.map_or(String::from("n/a"), |r| format!("{r:.2}")),
            t.widen_per_ns.map_or(String::from("n/a"), |r| format!("{r:.1}/ns")),
            t.stream_read_gbps
        )?;
        let c = self.choices();
        write!(
            f,
            "  choices: f32 {} (register tile {}x{}, kc {} mc {} nc {}, {} accumulators needed); bf16 {}; f16 widened into f32 {}",
            c.f32_isa,
            c.gemm.mr,
            c.gemm.nr,
            c.gemm.kc,
            c.gemm.mc,
            c.gemm.nc,
            c.accumulators_needed,
            c.bf16,
            c.f32_isa
        )
    }
}

/// For test harnesses: whether a test of `path` (a name such as `"amx"`, `"avx512"`,
/// `"avx512bf16"`, `"avx2"`) can run, given whether it is `available` here.
///
/// When it is not, the test is skipped, and this says so on stdout (`SKIPPED: ...`), unless
/// `UOPC_REQUIRE_ISA` (a comma-separated list of names, or `all`) names the path: on a machine
/// that is meant to have it, a missing path then fails the test instead of passing unseen.
///
/// # Panics
///
/// When `path` is required by `UOPC_REQUIRE_ISA` and not available.
pub fn require_or_skip(path: &str, available: bool) -> bool {
    if available {
        return true;
    }
    let required = std::env::var("UOPC_REQUIRE_ISA").unwrap_or_default();
    let listed = required.split(',').map(str::trim).any(|r| r.eq_ignore_ascii_case(path) || r == "all");
    assert!(!listed, "UOPC_REQUIRE_ISA={required} requires the {path} path, which this machine cannot run");
    println!("SKIPPED: the {path} path is not available on this machine; NOT tested");
    false
}

/// The register tile (`MR` rows x `NR` columns) of the blocked f32 kernel of `isa`; the
/// portable loops have none, and report one row of one vector.
pub fn register_tile(isa: Isa) -> (usize, usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::tile::TileKernel;
        match isa {
            Isa::Avx512 => return (crate::x86::avx512::Kernel::MR, crate::x86::avx512::Kernel::NR),
            Isa::Avx2Fma => return (crate::x86::avx2::Kernel::MR, crate::x86::avx2::Kernel::NR),
            Isa::Portable => {}
        }
    }
    let _ = isa;
    (1, 8)
}
