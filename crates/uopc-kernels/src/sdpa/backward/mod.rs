//! The FlashAttention-2 backward pass of [`super`] on tile ops: [`SdpaBackward`].
//!
//! Notation per head: base-2 scores `s2 = scale * log2(e) * q k^T (+ log2(e) * bias)`, masked
//! entries `-inf`; the forward saved `lse2_i = log2(sum_j 2^(s2_ij))`, so `P = exp2(s2 - lse2)`.
//! With `dO` the gradient at the output, `dP = dO V^T`, `Delta_i = dO_i · O_i`,
//! `dS = P * (dP - Delta)` (the gradient at the scaled scores), and
//! `dV = P^T dO`, `dK = scale * dS^T Q`, `dQ = scale * dS K`. The scale is folded in once:
//! the task's copy of `V^T` and `Delta` are multiplied by it, so `dP` and `dS` come out scaled
//! and the dK and dQ GEMMs need no further pass. An additive bias's gradient is `dS` itself
//! (summed over the bias's broadcast axes); a second program writes it when asked for
//! ([`sdpa_backward_ir_with_bias_grad`]), so the plain backward never pays for its writes.
//!
//! **Work split.** One THREAD task per (batch item, key/value head, chunk). A task loops over
//! its key blocks; for each it copies `K^T` (times `scale * log2(e)`) and `V^T` (times `scale`)
//! to the stack once and then visits every query head of the group and every query block that
//! can see the block, so dK and dV of the block are summed on the stack without races (GQA
//! included) and written once. **dQ** is accumulated in place by the same tasks: a task owns
//! every query row of its group's heads, so `dQ += dS K` needs no second pass over the query
//! blocks (which would recompute S, P, dP and dS: 7 GEMMs per block pair instead of 5). When
//! there are fewer (item, head) pairs than cores, each head's key blocks are dealt round-robin
//! to `chunks` tasks (round-robin balances the causal mask, where early key blocks are seen
//! by more queries); each chunk then accumulates its own dQ partial, and the host adds the
//! `chunks` partials (a temporary of `chunks` times dQ, which only small problems get).
//!
//! **No N x N buffer**: the score and gradient tiles are `queries x keys` on the stack; the
//! temporaries are `Delta` (`B * H * n_q`), and, when the program cannot write the caller's
//! buffers in place (chunks > 1, or the BNHD layout), the chunked dQ partials and a task-major
//! copy of dK and dV, all O(N * D).

mod blocking;
mod flex;
mod flex_graph;
mod flex_runner;
mod host;
mod pair;
mod parts;
mod program;
mod runner;
mod score_fn;

pub use blocking::BackwardBlocking;
use blocking::Geometry;
pub use flex::sdpa_flex_backward_ir;
pub(crate) use flex_graph::flex_backward_for_graph;
pub use program::{sdpa_backward_ir, sdpa_backward_ir_with_bias_grad};
pub(crate) use program::{sdpa_backward_ir_for_graph, sdpa_bias_grad_ir_for_graph};
pub use runner::{ForwardSaved, SdpaBackward, compiled_backward};
