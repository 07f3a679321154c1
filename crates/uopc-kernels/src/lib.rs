//! uopc's hand-written loop programs, one module per kernel family, and the f64 reference
//! they are checked against.
//!
//! Every program is built with a [`uopc_ir::ProgramBuilder`], so range ids and alloc slots are
//! handed out in creation order rather than numbered by hand; buffer slots are each kernel's
//! argument positions and are documented on it.
//!
//! - [`online`]: online-softmax attention for one head, one query row or a block of rows per
//!   THREAD iteration.
//! - [`masked`]: batched multi-head attention with causal and padding masks.
//! - [`decode`]: flash-decoding (one query against a long key cache, in chunks).
//! - [`flash_tiled`]: FlashAttention-2 tiling in plain loop IR, with its prologues.
//! - [`flash_tile_ops`]: FlashAttention-2 on tile ops (plain, causal, L2-blocked).
//! - [`backward`]: the attention backward, unfused (autograd) and with recompute.
//! - [`reference`](mod@reference): the f64 reference attention and the error measure.
//! - [`sdpa`](mod@sdpa): one attention entry point for every shape (batched, GQA, masks,
//!   strided layouts), FlashAttention-2 on tile ops, with a process-wide compile cache.
//! - [`bandwidth`]: a streaming-read probe, the bound of memory-bound kernels.

#![warn(missing_docs)]

pub mod backward;
pub mod bandwidth;
pub mod decode;
pub mod flash_tile_ops;
pub mod flash_tiled;
pub mod masked;
pub mod online;
pub mod reference;
pub mod sdpa;

/// `log2(e)`: every kernel here computes `exp(x)` as `2^(x log2(e))`, so scores are scaled by
/// it (the vocabulary every kernel family shares, kept at the root so none imports another).
pub const LOG2E: f64 = std::f64::consts::LOG2_E;

/// Query rows per block for `n` rows and a wanted block of `want`: the largest divisor of `n`
/// at most `want` (re-export of the tensor front end's rule, so both agree on the blocking).
pub use uopc_tensor::attention::query_block;
