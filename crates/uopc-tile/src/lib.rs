//! CPU tile micro-kernels for uopc: the host's stand-in for a tensor core.
//!
//! JIT-compiled loop programs hand whole tiles to these kernels instead of emitting scalar
//! loops for them. There are four operations, the first two in three instruction sets ([`Isa`]), the backward
//! steps in two (AVX-512 and portable):
//!
//! * [`gemm`]: `C (+)= A · B` on f32 tiles with arbitrary leading dimensions and either operand
//!   transposed, built around a register-blocked micro-kernel (8 x 32 on AVX-512, 6 x 16 on
//!   AVX2+FMA).
//! * [`softmax_update`]: one online-softmax step of FlashAttention-2 over a score tile in the
//!   log2 domain, rescaling the running output rows.
//! * [`softmax_recompute`] and [`softmax_grad`]: the elementwise steps of the backward pass,
//!   the probabilities from the saved log-sum-exp and `dS = P * (dP - Delta)`.
//!
//! Each operation has a checked safe entry point, an `unsafe` raw-pointer twin for callers that
//! have already validated their shapes, and a flat `extern "C"` entry point for JIT-compiled code
//! ([`uopc_tile_gemm_f32`], [`uopc_tile_softmax_update_f32`]). Kernels are single-threaded: the
//! caller owns parallelism.

#![deny(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

#[cfg(target_arch = "x86_64")]
mod blocked;
mod error;
mod gemm;
mod isa;
mod pack;
#[cfg(target_arch = "x86_64")]
pub mod peak;
mod softmax;
mod softmax_grad;

#[cfg(target_arch = "x86_64")]
mod x86;

pub use error::TileError;
pub use gemm::{
    GEMM_A_TRANS, GEMM_ACCUMULATE, GEMM_B_TRANS, GemmDesc, GemmShape, gemm, gemm_unchecked,
    uopc_tile_gemm_f32, uopc_tile_gemm_f32_desc,
};
pub use isa::{Isa, OPT_LEVEL, UNOPTIMIZED_WARNING, built_optimized};
pub use softmax::{
    EXP2_MAX_REL_ERROR, SoftmaxShape, softmax_update, softmax_update_unchecked, uopc_tile_softmax_update_f32,
};
pub use softmax_grad::{
    ScoreTileShape, softmax_grad, softmax_grad_unchecked, softmax_recompute, softmax_recompute_unchecked,
    uopc_tile_softmax_grad_f32, uopc_tile_softmax_recompute_f32,
};
