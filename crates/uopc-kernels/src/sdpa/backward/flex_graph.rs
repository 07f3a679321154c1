//! The programs of a flex backward as kernel nodes of a tensor graph: one chunk per (item,
//! key/value head), so dq, dk and dv are written in place and every host step of
//! [`SdpaBackward`](super::SdpaBackward)'s run becomes a tensor op or a node of its own.

use super::flex_runner::{counting_ir, counts_len, flex_backward_blocking, flex_tiles};
use super::program::{BackwardKernel, Outputs};
use super::score_fn::check_differentiable;
use super::{BackwardBlocking, Geometry};
use crate::sdpa::blocking::cores;
use crate::sdpa::{AttentionMods, SdpaConfig, SdpaError};
use uopc_ir::UOp;
use uopc_jit::JitError;

/// The flex backward of one f32 configuration for a graph: the backward program, the
/// counting program it reads when the mask has no exact key bounds, and the sizes of its
/// capture-gradient regions.
pub(crate) struct FlexGraphBackward {
    /// Slots as [`sdpa_flex_backward_ir`](super::sdpa_flex_backward_ir) with `capture_grads`,
    /// in one chunk (dq, dk and dv are exactly the caller's).
    pub program: UOp,
    /// The counting kernel ([`crate::sdpa::sdpa_flex_plan_ir`]) and the counts it writes.
    pub counts: Option<(UOp, usize)>,
    /// THREAD tasks: each float capture's gradient target holds one region per task.
    pub tasks: usize,
}

/// The flex backward of `config` (f32, fixed `n_k`, the causal rewrite already applied) and
/// `mods` for a tensor graph, writing the float captures' gradient regions when
/// `capture_grads`.
///
/// # Errors
///
/// [`SdpaError::Capture`] for a score function without a derivative;
/// [`JitError::Unsupported`] when no one-chunk blocking fits the stack.
pub(crate) fn flex_backward_for_graph(
    config: &SdpaConfig,
    mods: &AttentionMods,
    capture_grads: bool,
) -> Result<FlexGraphBackward, SdpaError> {
    check_differentiable(mods)?;
    let blocking = BackwardBlocking { chunks: 1, ..flex_backward_blocking(config, mods, cores()) };
    if !blocking.valid(config) || !blocking.fits(config.d, flex_tiles(mods)) {
        return Err(JitError::Unsupported(format!(
            "sdpa flex backward: no one-chunk blocking fits {config:?} ({blocking:?})"
        ))
        .into());
    }
    let counts = counting_ir(config, &blocking, mods).map(|ir| (ir, counts_len(config, &blocking, mods)));
    let outputs = Outputs { captures: capture_grads, ..Outputs::GRADS };
    let program = BackwardKernel::new(config, &blocking, outputs, Some(mods)).program();
    Ok(FlexGraphBackward { program, counts, tasks: Geometry::new(config, &blocking).tasks })
}
