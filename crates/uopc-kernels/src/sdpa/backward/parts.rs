//! What the backward's runner and its flex part share: the gradients a run writes besides dq,
//! dk and dv, and what a backward of attention with mods holds.

use crate::sdpa::flex::CaptureReads;
use crate::sdpa::{AttentionMods, Sdpa};
use uopc_jit::Program;

/// The gradients a backward run writes besides dq, dk and dv.
pub(super) enum ExtraGrads<'a, 'b> {
    /// None.
    None,
    /// The additive bias's.
    Bias(&'a mut [f32]),
    /// The captures' of attention mods, one slice per capture (empty for an I32 one).
    Captures(&'a mut [&'b mut [f32]]),
}

/// What a backward of attention with mods holds besides the plain one's.
#[derive(Debug)]
pub(crate) struct FlexParts {
    /// The mods (after the causal rewrite).
    pub(crate) mods: AttentionMods,
    /// The flex forward that saves the lse, run in place of the plain forward.
    pub(crate) forward: Box<Sdpa>,
    /// The counting kernel of a mask without exact key bounds, run once per backward run.
    pub(crate) plan: Option<Program>,
    /// Which captures the kernels read.
    pub(crate) reads: CaptureReads,
}
