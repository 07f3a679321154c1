//! What `bench attention` measures: the forms of attention it times, one result per form and
//! size with its kernels, and how errors are judged and printed (shared by the run, its report
//! and the plot).

use serde::Serialize;
use std::error::Error;
use uopc::RealizeOptions;
use uopc::tensor::{DefaultOpt, Experiments, FlashOpt};

/// The bench's fallible steps: any error, printed with its form and size.
pub(super) type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// Largest accepted `|out - reference|`. Outputs are convex combinations of values in [-1, 1),
/// so this is an absolute bound on numbers of size <= 1. f32 rounding (2^-24 relative) summed
/// over N keys and D products, plus the inline exp2's ~1e-7 relative error, stays near 1e-6
/// at the default sizes; a real bug (a missing rescale, a wrong max, a race) is off by 1e-2 or
/// more. 1e-4 sits between the two with margin on both sides.
pub const TOLERANCE: f64 = 1e-4;

/// One way of computing attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// The Tensor expression with default realize options: scores materialized.
    Unfused,
    /// The unfused Tensor expression with every kernel a loop nest (no tile GEMMs): the JIT's
    /// own code generation.
    #[value(name = "unfused_loops")]
    #[serde(rename = "unfused_loops")]
    UnfusedLoops,
    /// The Tensor expression with `fuse_reduce` and the flash optimizer: the softmax sums
    /// become online sums, one pass over the keys.
    Fused,
    /// `fused` with the sums left as written (`Experiments::no_online_reductions`): a pass
    /// for the maximum, one for the normalizer, one per 16 output columns.
    #[value(name = "fused_written")]
    #[serde(rename = "fused_written")]
    FusedWritten,
    /// The hand-written online-softmax loop program.
    Online,
    /// Online softmax with a block of query rows per THREAD iteration.
    #[value(name = "online_qb")]
    #[serde(rename = "online_qb")]
    OnlineQb,
    /// Fused with the whole head upcast: three passes over the keys instead of six.
    #[value(name = "fused_upcast64")]
    #[serde(rename = "fused_upcast64")]
    FusedUpcast64,
    /// FlashAttention-2 tiling in loop IR: query blocks against key blocks, register-tiled
    /// score GEMM.
    #[value(name = "flash_tiled")]
    #[serde(rename = "flash_tiled")]
    FlashTiled,
    /// FlashAttention-2 on tile ops: the score and output GEMMs and the softmax update are
    /// calls into the AVX-512 / AVX2 micro-kernels.
    #[value(name = "flash_tile_ops")]
    #[serde(rename = "flash_tile_ops")]
    FlashTileOps,
    /// Causal `flash_tile_ops`: blocks above the diagonal skipped, diagonal blocks masked
    /// (checked against a causal reference).
    #[value(name = "flash_tile_ops_causal")]
    #[serde(rename = "flash_tile_ops_causal")]
    FlashTileOpsCausal,
    /// `flash_tile_ops` with second-level blocking: two query blocks per task share key
    /// super-blocks that stay in L2 (`--flash-tile` sets the first-level blocks).
    #[value(name = "flash_tile_ops_l2")]
    #[serde(rename = "flash_tile_ops_l2")]
    FlashTileOpsL2,
    /// Fused but with broadcast staging, so P is stored (`Experiments::stage_broadcasts_when_fused`).
    #[value(name = "fused_staged")]
    #[serde(rename = "fused_staged")]
    FusedStaged,
}

impl Variant {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Unfused => "unfused",
            Variant::UnfusedLoops => "unfused_loops",
            Variant::Fused => "fused",
            Variant::FusedWritten => "fused_written",
            Variant::Online => "online",
            Variant::OnlineQb => "online_qb",
            Variant::FusedUpcast64 => "fused_upcast64",
            Variant::FusedStaged => "fused_staged",
            Variant::FlashTiled => "flash_tiled",
            Variant::FlashTileOps => "flash_tile_ops",
            Variant::FlashTileOpsCausal => "flash_tile_ops_causal",
            Variant::FlashTileOpsL2 => "flash_tile_ops_l2",
        }
    }

    pub(super) fn realize_options(self) -> Option<RealizeOptions> {
        match self {
            Variant::Unfused => Some(RealizeOptions::default()),
            Variant::UnfusedLoops => Some(RealizeOptions::default().with_opt(DefaultOpt::loops())),
            Variant::Fused => Some(RealizeOptions::fused()),
            Variant::FusedWritten => Some(
                RealizeOptions::fused()
                    .with_experiments(Experiments { no_online_reductions: true, ..Experiments::default() }),
            ),
            Variant::FusedUpcast64 => Some(
                RealizeOptions::fused()
                    .with_opt(FlashOpt { max_upcast: 64 })
                    .with_experiments(Experiments { no_online_reductions: true, ..Experiments::default() }),
            ),
            Variant::FusedStaged => Some(RealizeOptions::fused().with_experiments(Experiments {
                stage_broadcasts_when_fused: true,
                no_online_reductions: true,
                ..Experiments::default()
            })),
            Variant::Online
            | Variant::OnlineQb
            | Variant::FlashTiled
            | Variant::FlashTileOps
            | Variant::FlashTileOpsCausal
            | Variant::FlashTileOpsL2 => None,
        }
    }
}

/// One measured form at one size.
#[derive(Clone, Debug, Serialize)]
pub struct Measurement {
    pub variant: Variant,
    pub n: usize,
    pub d: usize,
    pub median_ms: f64,
    pub best_ms: f64,
    /// `4 N^2 D` (`2 N^2 D` for a causal form) divided by the best time.
    pub gflops: f64,
    /// Largest error over the warm-up and every timed repetition.
    pub max_abs_err: f64,
    pub reps: usize,
    /// The warm-up call: includes scheduling and compiling for the Tensor forms.
    pub first_ms: f64,
    /// Kernel names of the plan (the program's name for the online form).
    pub kernels: Vec<String>,
    /// Bytes of temporaries the plan allocates.
    pub temp_bytes: usize,
    /// The FMA unit whose peak `percent_of_peak` is relative to: the widest one any of the
    /// form's kernels uses (`"f32x4"` for JIT loops, `"512-bit"`/`"256-bit"` with tile ops).
    pub peak_unit: &'static str,
    /// GFLOP/s as a percentage of the peak of `peak_unit`, measured in the same run (at most
    /// 100 by construction, up to timing noise).
    pub percent_of_peak: Option<f64>,
    /// GFLOP/s as a percentage of the widest FMA peak (512- or 256-bit) of the same run.
    pub percent_of_widest_peak: Option<f64>,
    /// Whether some kernel calls tile ops (the 512/256-bit micro-kernels).
    #[serde(skip)]
    pub tile_ops: bool,
    /// Per kernel of a Tensor form: its best time over the repetitions.
    pub kernel_times: Vec<KernelTime>,
    /// Kernels compiled as scalar code (`--scalar`).
    pub scalar: bool,
}

/// One kernel's best time in a Tensor form.
#[derive(Clone, Debug, Serialize)]
pub struct KernelTime {
    pub name: String,
    pub best_ms: f64,
    /// Static FLOPs of the kernel over its best time.
    pub gflops: f64,
    /// Of the F32X4 peak for loop kernels, of the widest peak for kernels that call tile ops.
    pub percent_of_peak: Option<f64>,
    /// The kernel calls tile ops.
    pub tile_ops: bool,
}

/// `3.3e-07`: one decimal and a two-digit exponent, like C's `%.1e`.
pub fn fmt_err(x: f64) -> String {
    if !x.is_finite() {
        return format!("{x}");
    }
    let s = format!("{x:.1e}");
    match s.split_once('e') {
        Some((m, e)) => {
            let (sign, digits) = e.strip_prefix('-').map_or(("+", e), |d| ("-", d));
            format!("{m}e{sign}{digits:0>2}")
        }
        None => s,
    }
}
