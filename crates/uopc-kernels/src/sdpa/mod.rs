//! Scaled dot-product attention for the shapes models run, through one entry point:
//! [`Sdpa::compile`] for a [`SdpaConfig`], then [`Sdpa::run`] any number of times from any
//! thread, or [`attention`], which compiles each configuration once per process.
//!
//! q is `(B, H, n_q, D)`, k and v are `(B, H_kv, n_k, D)` with `H % H_kv == 0`: query head `h`
//! reads key/value head `h / (H / H_kv)` (multi-head, grouped-query and multi-query attention
//! by index arithmetic, never by copying K or V). The output has q's shape and layout.
//!
//! **Causal convention**: queries are aligned to the end of the keys, so query `i` sees keys
//! `j <= i + n_k - n_q` (the KV-cache convention; with `n_q = n_k` this is `j <= i`). A query
//! row that sees no key at all (under any combination of masks) gives zeros, never NaN. A NaN in
//! a key or value that a row sees makes that row NaN, as in an exact softmax.
//!
//! The kernel is FlashAttention-2 on tile ops (see [`sdpa_ir`]); [`reference_f64`] is the f64
//! attention it is checked against.
//!
//! **16-bit inputs**: with [`SdpaConfig::dtype`] `BF16` or `F16`, q, k, v and the output are
//! `half::bf16` or `half::f16` ([`Sdpa::run`] is generic over the element type, and
//! [`Sdpa::run_values`] checks each argument's); both GEMMs run on the 16-bit tile GEMMs with
//! f32 sums, the softmax in f32, the probabilities rounded once to bf16 for `P · V` where the
//! bf16 GEMM takes bf16 operands (kept in f32 where it widens, and for f16) and the output once
//! at the end (see [`SdpaDType`] for the error this costs). Masks, bias
//! and key lengths are as for f32. Their backward, [`SdpaBackwardHalf`], runs the f32 one on
//! the widened inputs and rounds the gradients to the input type.
//!
//! [`SdpaBackward`] is its FlashAttention-2 backward (a forward that also saves the per-row
//! log-sum-exp, then dQ, dK and dV, and the bias's gradient when asked for, on tile ops),
//! checked against [`reference_backward_f64`].

mod attend;
mod backward;
mod backward_half;
mod backward_reference;
mod blocking;
mod cache;
mod config;
mod dtype;
mod error;
mod extras;
mod flex;
mod flex_reference;
mod flex_tensor;
pub(crate) mod forward;
mod graph_backward;
mod in_place;
mod kernel;
mod merge;
mod panels;
mod reference;
mod score_forms;
mod tensor;
mod views;

pub use attend::{Attention, AttentionOp};
pub use backward::{
    BackwardBlocking, ForwardSaved, SdpaBackward, compiled_backward, sdpa_backward_ir,
    sdpa_backward_ir_with_bias_grad, sdpa_flex_backward_ir,
};
pub use backward_half::SdpaBackwardHalf;
pub use backward_reference::reference_backward_f64;
pub use blocking::Blocking;
use cache::{ConfigCache, cached};
pub use cache::{
    DEFAULT_CACHE_CAPACITY, attention, cache_capacity, cached_count, clear_caches, compile_count, compiled,
    set_cache_capacity,
};
pub use config::{Layout, MaskKind, SdpaConfig};
pub use dtype::{SdpaDType, SdpaElement, Values, ValuesMut};
pub use error::SdpaError;
pub use extras::{CaptureValues, Extras};
use extras::{check, push_captures, push_extras};
pub use flex::{AttentionMods, Capture, CaptureSpec, MaskFn, ScoreArgs, ScoreFn, and, eq, or};
pub use flex_reference::{FlexReference, MaskRef, ScoreRef, reference_flex_f64, reference_flex_row};
pub use flex_tensor::flex_attention;
pub use forward::Sdpa;
use kernel::sdpa_flex_ir_with_lse;
pub use kernel::{flex_block_plan, sdpa_flex_ir, sdpa_flex_plan_ir, sdpa_ir, sdpa_ir_with_lse};
pub use merge::sdpa_merge_ir;
pub use reference::reference_f64;
pub use score_forms::tanh;
pub use tensor::scaled_dot_product_attention;
