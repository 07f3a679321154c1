//! CPU tile micro-kernels for uopc: the host's stand-in for a tensor core.
//!
//! JIT-compiled loop programs hand whole tiles to these kernels instead of emitting scalar
//! loops for them. The first two operations below run in three instruction sets ([`Isa`]),
//! as do the row logsumexp steps, the elementwise steps of the backward pass and the softmax
//! step of 16-bit attention (its AVX2 f16 rounding also needs F16C):
//!
//! * [`gemm`]: `C (+)= A · B` on f32 tiles with arbitrary leading dimensions and either operand
//!   transposed, built around a register-blocked micro-kernel (12 x 32 on AVX-512, 6 x 16 on
//!   AVX2+FMA); on AVX-512, products of at most eight rows (decode's scores and `P · V`) skip
//!   the packing and stream B in storage order instead. A B that many GEMMs read can be packed
//!   once by [`pack_panels`] and read in place from then on ([`GemmShape::b_panel_width`]).
//! * [`softmax_update`]: one online-softmax step of FlashAttention-2 over a score tile in the
//!   log2 domain, rescaling the running output rows.
//! * [`softmax_update_rounded`]: the same step for 16-bit attention, scaling the scores first
//!   and writing the probabilities rounded to bf16 or f16 into their own tile; [`softmax_update_rounded_in_place`] writes the rounded values over the f32
//!   scores instead, for a `P · V` GEMM that reads an f32 P in place.
//! * [`max_sum_exp`]: the online step of a row logsumexp (running maximum and sum of
//!   exponentials over a block of rows read in place), one vector exponential per element.
//! * [`exp_rows`]: `Y = exp2(c (X - b))` per row with X read in place, the second pass of a
//!   softmax whose row state [`max_sum_exp`] found.
//! * [`softmax_recompute`] and [`softmax_grad`]: the elementwise steps of the backward pass,
//!   the probabilities from the saved log-sum-exp and `dS = P * (dP - Delta)`.
//! * [`activate`]: GELU (exact or its tanh form) or SiLU in place over a block, the tail of a
//!   linear layer; [`activate_grad`] scales a gradient block by its derivative.
//!
//! * [`gemm_bf16`]: `C (+)= A · B` with bf16 operands and an f32 result, on AMX tiles
//!   (`tdpbf16ps`), AVX512_BF16 (`vdpbf16ps`), the f32 AVX2+FMA micro-kernel on operands
//!   widened while packed, or portable Rust ([`Bf16Path`]), with the
//!   bf16 and f16 conversions in [`convert`] (per value, per slice, and per block:
//!   [`convert::convert_block`]).
//! * [`gemm_f16`]: the same with f16 operands, widened exactly to f32 by the f32 GEMM's own
//!   packing for the f32 micro-kernels of an [`Isa`]; [`gemm_f32_f16`] takes an f32 A (read
//!   as it is) with an f16 B, for a caller that keeps A widened across calls, and
//!   [`gemm_f16_f32`] and [`gemm_bf16_f32`] a 16-bit A with an f32 B, panels included (16-bit
//!   attention's queries read in place against f32 K/V panels). All of them
//!   stream B without packing it when A has at most eight rows (decode), widening it in
//!   registers on AVX-512 and on AVX2 (with F16C). [`gemm_f16_rounded`] and
//!   [`gemm_bf16_rounded`] write the product rounded to the operands' type instead.
//!
//! Each operation has a checked safe entry point, an `unsafe` raw-pointer twin for callers that
//! have already validated their shapes, and a flat `extern "C"` entry point for JIT-compiled code
//! ([`uopc_tile_gemm_f32`], [`uopc_tile_gemm_bf16`], [`uopc_tile_gemm_f16`],
//! [`uopc_tile_gemm_f32_f16`], [`uopc_tile_gemm_f16_f32`], [`uopc_tile_gemm_bf16_f32`],
//! [`uopc_tile_gemm_f16_rounded`], [`uopc_tile_gemm_bf16_rounded`],
//! [`uopc_tile_softmax_update_f32`], [`uopc_tile_softmax_update_rounded`],
//! [`uopc_tile_softmax_update_rounded_in_place`], [`convert::uopc_tile_convert_block`],
//! [`uopc_tile_max_sum_exp_f32`], [`uopc_tile_exp_rows_f32`], [`uopc_tile_activation_f32`],
//! [`uopc_tile_activation_grad_f32`]). Kernels
//! are single-threaded, so the caller owns parallelism; [`gemm_bf16_parallel`] is the one
//! convenience that splits a GEMM across the caller's rayon pool.

#![deny(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod activation;
mod activation_grad;
mod activation_kind;
mod amx_guard;
mod bf16_blocked;
mod bf16_c_out;
mod bf16_gemm;
mod bf16_pack;
mod bf16_path;
mod bf16_rounded;
#[cfg(target_arch = "x86_64")]
mod blocked;
pub mod convert;
mod entries;
mod error;
mod exp_rows;
mod f16_gemm;
mod f16_rounded;
mod gemm;
mod half_a_gemm;
mod half_operand;
mod isa;
pub mod machine;
mod max_sum_exp;
pub mod memory;
pub mod ops;
mod pack;
mod pair_panels;
mod panels;
#[cfg(target_arch = "x86_64")]
pub mod peak;
mod score_ramp;
mod shapes;
mod softcap;
mod softmax;
mod softmax_grad;
mod softmax_rounded;
mod split;
mod tile;

#[cfg(target_arch = "x86_64")]
mod x86;

pub use activation::{
    Activation, ERF_LOG_ERFC_FIT, ERF_NEAR_ZERO_FIT, ERF_POLYNOMIAL_BOUND, ERF_SATURATION, GELU_CUBIC,
    GELU_DENSITY, GELU_LOG2_TAIL, GELU_NEAR_ZERO, GELU_TWICE_SQRT_2_OVER_PI, activate, activate_unchecked,
    uopc_tile_activation_f32,
};
pub use activation_grad::{activate_grad, activate_grad_unchecked, uopc_tile_activation_grad_f32};
pub use amx_guard::amx_known_answer_check;
pub use bf16_gemm::{
    Bf16Path, gemm_bf16, gemm_bf16_parallel, gemm_bf16_unchecked, uopc_tile_gemm_bf16,
    uopc_tile_gemm_bf16_desc,
};
pub use bf16_rounded::{gemm_bf16_rounded, gemm_bf16_rounded_unchecked, uopc_tile_gemm_bf16_rounded};
pub use error::TileError;
pub use exp_rows::{ExpRowsShape, exp_rows, exp_rows_unchecked, uopc_tile_exp_rows_f32};
pub use f16_gemm::{
    gemm_f16, gemm_f16_unchecked, gemm_f32_bf16, gemm_f32_bf16_unchecked, gemm_f32_f16,
    gemm_f32_f16_unchecked, uopc_tile_gemm_f16, uopc_tile_gemm_f16_desc, uopc_tile_gemm_f32_bf16,
    uopc_tile_gemm_f32_f16,
};
pub use f16_rounded::{gemm_f16_rounded, gemm_f16_rounded_unchecked, uopc_tile_gemm_f16_rounded};
pub use gemm::{
    GEMM_A_TRANS, GEMM_ACCUMULATE, GEMM_B_PAIR_PANELS, GEMM_B_TRANS, GEMM_MAX_PANEL_WIDTH, GEMM_PANEL_SHIFT,
    GEMM_PARALLEL, GemmDesc, GemmShape, gemm, gemm_unchecked, register_tile, uopc_tile_gemm_f32,
    uopc_tile_gemm_f32_desc,
};
pub use half_a_gemm::{
    gemm_bf16_f32, gemm_bf16_f32_unchecked, gemm_f16_f32, gemm_f16_f32_unchecked, uopc_tile_gemm_bf16_f32,
    uopc_tile_gemm_f16_f32,
};
pub use isa::{Isa, OPT_LEVEL, UNOPTIMIZED_WARNING, built_optimized};
pub use max_sum_exp::{max_sum_exp, max_sum_exp_unchecked, uopc_tile_max_sum_exp_f32};
pub use pair_panels::pack_pair_panels_bf16;
pub use panels::{
    PanelPacking, pack_panels, pack_panels_bf16, pack_panels_f16, pack_panels_unchecked, panel_width,
};
pub use score_ramp::{score_ramp, score_ramp_unchecked, uopc_tile_score_ramp_f32};
pub use shapes::{PAIR_PANEL_WIDTH, SOFTCAP_TWO_LOG2_E};
pub use softcap::{SOFTCAP_MAX_ABS_ERROR, softcap, softcap_unchecked, uopc_tile_softcap_f32};
pub use softmax::{
    EXP2_MAX_REL_ERROR, SoftmaxShape, softmax_update, softmax_update_scaled, softmax_update_unchecked,
    uopc_tile_softmax_update_f32,
};
pub use softmax_grad::{
    ScoreTileShape, softmax_grad, softmax_grad_unchecked, softmax_recompute, softmax_recompute_unchecked,
    uopc_tile_softmax_grad_f32, uopc_tile_softmax_recompute_f32,
};
pub use softmax_rounded::{
    RoundedProb, softmax_update_rounded, softmax_update_rounded_in_place,
    softmax_update_rounded_in_place_unchecked, softmax_update_rounded_unchecked,
    uopc_tile_softmax_update_rounded, uopc_tile_softmax_update_rounded_in_place,
};
pub use split::{DEPTH_SPLIT_MAX_ROWS, depth_split, parallel_block};
